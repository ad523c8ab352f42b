//! The error type of checkpoint loading. Every variant names what was wrong and where.

use std::path::PathBuf;

/// Why a checkpoint could not be opened.
#[derive(Debug)]
pub enum Error {
    /// The file or directory could not be read.
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A GGUF container is malformed.
    Gguf(crate::gguf::GgufError),
    /// A HF directory (config.json, safetensors, compressed-tensors) is malformed.
    Hf(crate::hf::HfError),
    /// The model configuration cannot be run.
    Config(lagoon_core::config::ConfigError),
    /// A tensor the Laguna graph needs is absent.
    MissingTensor { tensor: String },
    /// A tensor has a shape other than the config implies.
    WrongShape {
        tensor: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    /// A tensor's type has no decoder yet.
    UnsupportedType { tensor: String, ty: String },
    /// A tensor's bytes lie outside its file.
    TensorOutOfBounds {
        tensor: String,
        start: usize,
        len: usize,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io { path, source } => write!(f, "cannot read {}: {source}", path.display()),
            Error::Gguf(e) => write!(f, "{e}"),
            Error::Hf(e) => write!(f, "{e}"),
            Error::Config(e) => write!(f, "{e}"),
            Error::MissingTensor { tensor } => {
                write!(
                    f,
                    "tensor `{tensor}` is missing; the checkpoint is incomplete or not a Laguna model"
                )
            }
            Error::WrongShape {
                tensor,
                expected,
                got,
            } => write!(
                f,
                "tensor `{tensor}` has shape {got:?} but the model config implies {expected:?}; the config and weights disagree"
            ),
            Error::UnsupportedType { tensor, ty } => {
                write!(
                    f,
                    "tensor `{tensor}` has type {ty}, which lagoon cannot decode yet"
                )
            }
            Error::TensorOutOfBounds { tensor, start, len } => write!(
                f,
                "tensor `{tensor}` claims bytes {start}..{} which lie outside its file; the file is truncated or corrupt",
                start.saturating_add(*len)
            ),
        }
    }
}

impl std::error::Error for Error {}

impl From<crate::gguf::GgufError> for Error {
    fn from(e: crate::gguf::GgufError) -> Self {
        Error::Gguf(e)
    }
}

impl From<crate::hf::HfError> for Error {
    fn from(e: crate::hf::HfError) -> Self {
        Error::Hf(e)
    }
}
