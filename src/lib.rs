//! lagoon: run poolside's Laguna mixture-of-experts LLMs from GGUF and compressed-tensors
//! checkpoints.
//!
//! ```no_run
//! use lagoon::{Checkpoint, Session, SessionOptions};
//! let ckpt = Checkpoint::open("model.gguf")?;
//! let weights = lagoon::weights(&ckpt)?;
//! let mut s = Session::new(&ckpt.config, &weights, SessionOptions { n_ctx: 4096, ubatch: 64, all_logits: false, n_threads: 0, reference: false, repack: None });
//! let logits = s.step(&[2, 100, 200])?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub use lagoon_core as core;
pub use lagoon_core::laguna::ModelWeights;
pub use lagoon_core::sample;
pub use lagoon_cpu as cpu;
pub use lagoon_cpu::{Session, SessionOptions, StepError};
pub use lagoon_cuda as cuda_backend;
pub use lagoon_gguf as gguf;
pub use lagoon_gguf::{Checkpoint, Error};
pub mod chat;
pub mod generate;
pub mod parse;
pub mod tokenizer;

/// The model's weights as views into the checkpoint (nothing is copied but the small norm
/// and bias vectors).
pub fn weights(ckpt: &Checkpoint) -> Result<ModelWeights<'_>, Error> {
    ModelWeights::resolve(&ckpt.config, |name| ckpt.tensor(name).ok().map(|t| t.parts)).map_err(
        |e| match e {
            lagoon_core::laguna::weights::WeightError::Missing { tensor } => {
                Error::MissingTensor { tensor }
            }
            lagoon_core::laguna::weights::WeightError::Shape {
                tensor,
                expected,
                got,
            } => Error::WrongShape {
                tensor,
                expected: vec![expected.0, expected.1],
                got: vec![got.0, got.1],
            },
            lagoon_core::laguna::weights::WeightError::Parts {
                tensor,
                expected,
                got,
            } => Error::WrongShape {
                tensor,
                expected: vec![expected],
                got: vec![got],
            },
        },
    )
}

/// The model bundled with the repository, used when no `--model` is given: a 2.4 M-parameter
/// Laguna-architecture toy trained on Python's standard library (`models/laguna-tiny/`).
pub const BUNDLED_MODEL: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/models/laguna-tiny/model.gguf");
