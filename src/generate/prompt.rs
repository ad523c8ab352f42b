//! Prompts: the tokenizer and chat template of a model path (GGUF file or HF directory)
//! without loading the weights, and chat requests as `apply_chat_template` takes them.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::chat::{ChatError, ChatTemplate};
use crate::tokenizer::{Tokenizer, TokenizerError};

/// Why a prompt could not be prepared.
#[derive(Debug)]
pub enum PromptError {
    /// A file could not be read.
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The path is neither a GGUF file, a directory nor a `tokenizer.json`.
    NotAModel { path: PathBuf },
    /// The GGUF file could not be parsed.
    Gguf {
        path: PathBuf,
        source: lagoon_gguf::Error,
    },
    /// The model has no usable tokenizer.
    Tokenizer {
        path: PathBuf,
        source: TokenizerError,
    },
    /// A chat request is not valid JSON or has fields of the wrong type.
    Request { file: String, detail: String },
    /// The chat template is missing or failed to render.
    Chat(ChatError),
}

impl fmt::Display for PromptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PromptError::Io { path, source } => {
                write!(f, "cannot read {}: {source}", path.display())
            }
            PromptError::NotAModel { path } => write!(
                f,
                "{} is not a model: pass a .gguf file, a HF checkpoint directory with tokenizer.json, or a tokenizer.json",
                path.display()
            ),
            PromptError::Gguf { path, source } => write!(f, "{}: {source}", path.display()),
            PromptError::Tokenizer { path, source } => {
                write!(f, "tokenizer of {}: {source}", path.display())
            }
            PromptError::Request { file, detail } => write!(
                f,
                "{file}: {detail} (expected {{\"messages\": [...], \"tools\": [...], \"enable_thinking\": bool, \"add_generation_prompt\": bool}})"
            ),
            PromptError::Chat(e) => e.fmt(f),
        }
    }
}

/// Each message already includes its cause's text, so no `source` is chained.
impl std::error::Error for PromptError {}

/// A model's text side: its tokenizer and, when it has one, its chat template.
#[derive(Debug)]
pub struct TextModel {
    pub tokenizer: Tokenizer,
    /// The template, or why there is none (kept so that only chat use fails).
    pub template: Result<ChatTemplate, ChatError>,
}

impl TextModel {
    /// From a `.gguf` file (metadata only; tensors are not read), a HF directory
    /// (`tokenizer.json`, `tokenizer_config.json`, `config.json`, `chat_template.jinja`) or
    /// a bare `tokenizer.json` (no template).
    pub fn open(path: impl AsRef<Path>) -> Result<TextModel, PromptError> {
        let path = path.as_ref();
        let tok_err = |source| PromptError::Tokenizer {
            path: path.to_path_buf(),
            source,
        };
        if !path.exists() {
            return Err(PromptError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            });
        }
        if path.is_dir() {
            return Ok(TextModel {
                tokenizer: Tokenizer::from_hf_dir(path).map_err(tok_err)?,
                template: ChatTemplate::from_hf_dir(path),
            });
        }
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.ends_with(".json") {
            return Ok(TextModel {
                tokenizer: Tokenizer::from_tokenizer_json_file(path).map_err(tok_err)?,
                template: Err(ChatError::Missing(format!(
                    "{} is a bare tokenizer.json; pass its directory for the chat template",
                    path.display()
                ))),
            });
        }
        let mut magic = [0u8; 4];
        let read_magic = std::fs::File::open(path)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
            .map_err(|source| PromptError::Io {
                path: path.to_path_buf(),
                source,
            });
        if read_magic.is_err() || &magic != b"GGUF" {
            read_magic?;
            return Err(PromptError::NotAModel {
                path: path.to_path_buf(),
            });
        }
        let set = lagoon_gguf::gguf::GgufSet::open(path).map_err(|source| PromptError::Gguf {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(TextModel {
            tokenizer: Tokenizer::from_gguf_metadata(set.metadata()).map_err(tok_err)?,
            template: ChatTemplate::from_gguf_metadata(set.metadata()),
        })
    }
}

/// A chat request: `{"messages": [...], "tools": [...], "enable_thinking": bool,
/// "add_generation_prompt": bool}`. Absent `tools` / `enable_thinking` are not passed to the
/// template; absent `add_generation_prompt` is false (transformers' default).
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    pub messages: serde_json::Value,
    pub tools: Option<serde_json::Value>,
    pub enable_thinking: Option<bool>,
    pub add_generation_prompt: bool,
}

impl ChatRequest {
    /// A request with one user message (and a system message when given).
    pub fn user(text: &str, system: Option<&str>, enable_thinking: Option<bool>) -> ChatRequest {
        let mut messages = Vec::new();
        if let Some(s) = system {
            messages.push(serde_json::json!({"role": "system", "content": s}));
        }
        messages.push(serde_json::json!({"role": "user", "content": text}));
        ChatRequest {
            messages: serde_json::Value::Array(messages),
            tools: None,
            enable_thinking,
            add_generation_prompt: true,
        }
    }

    /// Parses a request; `file` names it in errors.
    pub fn from_json(bytes: &[u8], file: &str) -> Result<ChatRequest, PromptError> {
        let bad = |detail: String| PromptError::Request {
            file: file.to_string(),
            detail,
        };
        let v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let obj = v
            .as_object()
            .ok_or_else(|| bad("the top level is not an object".into()))?;
        let messages = match obj.get("messages") {
            Some(m @ serde_json::Value::Array(_)) => m.clone(),
            Some(_) => return Err(bad("`messages` is not a list".into())),
            None => return Err(bad("`messages` is missing".into())),
        };
        let tools = match obj.get("tools") {
            None | Some(serde_json::Value::Null) => None,
            Some(t @ serde_json::Value::Array(_)) => Some(t.clone()),
            Some(_) => return Err(bad("`tools` is not a list".into())),
        };
        let flag = |key: &str| match obj.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(bad(format!("`{key}` is not true or false"))),
        };
        Ok(ChatRequest {
            messages,
            tools,
            enable_thinking: flag("enable_thinking")?,
            add_generation_prompt: flag("add_generation_prompt")?.unwrap_or(false),
        })
    }

    /// The rendered prompt, as `apply_chat_template(..., tokenize=False)`.
    pub fn render(&self, template: &ChatTemplate) -> Result<String, PromptError> {
        template
            .render(
                &self.messages,
                self.tools.as_ref(),
                self.enable_thinking,
                self.add_generation_prompt,
            )
            .map_err(PromptError::Chat)
    }
}

/// The ids of a rendered chat prompt: its text already holds the BOS literal, so nothing
/// is added (as `apply_chat_template(tokenize=True)` encodes with `add_special_tokens=False`).
pub fn encode_rendered(tokenizer: &Tokenizer, rendered: &str) -> Vec<u32> {
    tokenizer.encode(rendered.as_bytes(), false)
}

/// The ids of a raw completion prompt: the tokenizer's BOS (when its config adds one) and
/// the text. A text that itself begins with the BOS literal gets no second BOS.
pub fn encode_completion(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    let mut ids = tokenizer.encode(text.as_bytes(), true);
    let prefix = tokenizer.special_prefix().len();
    if prefix > 0 && ids.len() >= 2 * prefix && ids[..prefix] == ids[prefix..2 * prefix] {
        ids.drain(..prefix);
    }
    ids
}
