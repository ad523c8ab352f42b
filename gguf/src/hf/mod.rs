//! HF checkpoint directories: config.json, safetensors shards, compressed-tensors.
//! Placeholder until the loader lands.

use std::path::Path;

use crate::checkpoint::{Source, TensorRecord};
use crate::error::Error;

/// A malformed HF checkpoint.
#[derive(Debug)]
pub enum HfError {
    NoConfig,
}

impl std::fmt::Display for HfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

/// Opens a HF directory as checkpoint parts.
pub fn load(
    _dir: &Path,
) -> Result<
    (
        lagoon_core::config::ModelConfig,
        Source,
        Vec<memmap2::Mmap>,
        Vec<TensorRecord>,
    ),
    Error,
> {
    Err(Error::Hf(HfError::NoConfig))
}
