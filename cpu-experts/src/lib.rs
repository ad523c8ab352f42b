//! lagoon-cpu: the CPU backend. Executes a planned Laguna graph over weights in their stored
//! encoding, with the KV cache and every scratch buffer allocated once at session creation.
//!
//! - `exec/`: the graph walker (`mod.rs`) and the expert layer (`experts.rs`: tokens grouped
//!   by expert, gate/up and down as two dispatches, shared expert included; `profile.rs`:
//!   the node timer behind `Session::set_profiling`).
//! - `kernels/`: activation quantisers and integer dot kernels (scalar, AVX2, AVX-512 VNNI),
//!   resolved once into a table; `SessionOptions::reference` runs `lagoon_core::ops` instead.
//! - `pool.rs`: the persistent, allocation-free thread pool; `kv.rs`: the (ring) KV cache;
//!   `session.rs`: `Session` (prefill / step).

extern crate alloc;

pub mod exec;
pub mod kernels;
pub mod kv;
pub mod pool;
pub mod session;

pub use exec::profile::OpTime;
pub use session::{Session, SessionOptions, StepError};
