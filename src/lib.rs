//! lagoon: run poolside's Laguna mixture-of-experts LLMs from GGUF and compressed-tensors
//! checkpoints. This facade re-exports the pieces most programs need.

pub use lagoon_core as core;
pub use lagoon_cpu as cpu;
pub use lagoon_gguf as gguf;
