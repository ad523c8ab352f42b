//! lagoon-cpu: the CPU backend. Executes a planned Laguna graph over weights in their stored
//! encoding, with the KV cache and every scratch buffer allocated once at session creation.
//!
//! Today every op runs the scalar reference kernels of `lagoon_core::ops` on one thread;
//! the AVX2 kernels and the thread pool come with issue #5.

extern crate alloc;

pub mod exec;
pub mod kernels;
pub mod kv;
pub mod pool;
pub mod session;

pub use session::{Session, SessionOptions, StepError};
