//! lagoon-gguf: checkpoint readers. GGUF v3 (single and split files), safetensors (single and
//! sharded) with HF `config.json`, and compressed-tensors quantised checkpoints, all behind
//! one [`Checkpoint`] view with GGUF-style tensor names.

pub mod checkpoint;
pub mod compressed;
pub mod error;
pub mod gguf;
pub mod hf;
pub mod synth;
pub mod validate;

pub use checkpoint::{Checkpoint, Source, Tensor, TensorRecord};
pub use error::Error;
