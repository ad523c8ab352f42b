//! GGUF v3 reader and writer (spec/formats.md §1). Placeholder until the reader lands.

use std::path::Path;

use crate::checkpoint::{Source, TensorRecord};
use crate::error::Error;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U64(u64),
    I64(i64),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

/// A malformed GGUF container.
#[derive(Debug)]
pub enum GgufError {
    BadMagic,
}

impl std::fmt::Display for GgufError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

/// Opens a GGUF file (or split set) as checkpoint parts.
pub fn load_checkpoint(
    _path: &Path,
) -> Result<
    (
        lagoon_core::config::ModelConfig,
        Source,
        Vec<memmap2::Mmap>,
        Vec<TensorRecord>,
    ),
    Error,
> {
    Err(Error::Gguf(GgufError::BadMagic))
}
