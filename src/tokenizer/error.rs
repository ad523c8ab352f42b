//! Errors from loading a tokenizer. Encoding and decoding never fail.

use std::fmt;
use std::path::PathBuf;

#[derive(Debug)]
pub enum TokenizerError {
    /// A file could not be read.
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A JSON file is malformed or a field has the wrong shape.
    Json { file: String, detail: String },
    /// A required GGUF key or JSON field is absent (or has another type).
    Missing { key: String, expected: &'static str },
    /// A configuration this tokenizer does not implement.
    Unsupported { what: &'static str, found: String },
    /// A merge, unk or special token names a token that is not in the vocabulary.
    NotInVocab {
        context: &'static str,
        token: String,
    },
    /// A merge line that is not two space-separated tokens.
    BadMerge { index: usize, merge: String },
    /// The checkpoint carries no tokenizer (an HF directory without tokenizer.json).
    NoTokenizer { path: PathBuf },
}

impl fmt::Display for TokenizerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenizerError::Io { path, source } => {
                write!(f, "cannot read {}: {source}", path.display())
            }
            TokenizerError::Json { file, detail } => write!(f, "{file}: {detail}"),
            TokenizerError::Missing { key, expected } => {
                write!(
                    f,
                    "tokenizer: `{key}` is missing or not {expected}; the file was not written by a supported converter"
                )
            }
            TokenizerError::Unsupported { what, found } => write!(
                f,
                "tokenizer: unsupported {what}: {found} (only GPT-2 byte-level BPE with the Laguna or Qwen2 pre-tokenizer is implemented)"
            ),
            TokenizerError::NotInVocab { context, token } => {
                write!(
                    f,
                    "tokenizer: {context} `{token}` is not in the vocabulary; the tokenizer file is inconsistent"
                )
            }
            TokenizerError::BadMerge { index, merge } => {
                write!(
                    f,
                    "tokenizer: merge #{index} `{merge}` is not two space-separated tokens"
                )
            }
            TokenizerError::NoTokenizer { path } => write!(
                f,
                "{} has no tokenizer.json; pass a directory (or GGUF) that contains the tokenizer",
                path.display()
            ),
        }
    }
}

impl std::error::Error for TokenizerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TokenizerError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
