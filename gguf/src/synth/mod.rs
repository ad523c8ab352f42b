//! Synthetic Laguna checkpoints: random weights with real shapes, types and metadata, for
//! measuring speed without downloading a model (speed depends on types, shapes and the
//! routing spread, not on what the weights say).
//!
//! - [`preset`]: the S 2.1 / XS 2.1 / XS.2 / M.1 shapes and scale-down overrides.
//! - [`mix`]: tensor roles and the `--types` mixes (Q4_K_M-like, Q8_0, UD-Q3_K_M-like,
//!   IQ2_M-like, BF16, INT4 g32).
//! - [`plan`]: the tensor list and the weight statistics that keep activations at unit
//!   scale and spread tokens over experts.
//! - [`blocks`]: random quant blocks with realistic scales, per type.
//! - [`stream`]: the parallel generate / in-order write pipeline (bounded memory).
//! - [`gguf_out`], [`ct`]: the GGUF file and compressed-tensors directory writers.
//! - [`tokenizer`]: a small valid byte-level BPE vocabulary.
//!
//! Output is a function of the options alone (the seed included): not of the thread
//! count, nor of the machine.

pub mod blocks;
pub mod ct;
pub mod gguf_out;
pub mod mix;
pub mod plan;
pub mod preset;
pub mod rng;
pub mod stream;
pub mod tokenizer;

use std::path::{Path, PathBuf};

pub use mix::{Role, TypeMix};
pub use preset::{Preset, Shape};

use crate::gguf::GgufError;

/// What to write.
#[derive(Clone, Debug)]
pub struct SynthOptions {
    pub shape: Shape,
    pub mix: TypeMix,
    pub seed: u64,
    /// Selection-bias shift of a hot set of `top-k` experts per layer, in units of the
    /// router score's spread (0 = uniform routing).
    pub router_skew: f32,
    /// Worker threads generating data (0 = all cores).
    pub n_threads: usize,
    /// fsync the output before returning (so the reported time includes the disk).
    pub sync: bool,
    /// Largest safetensors shard of the compressed-tensors output.
    pub shard_bytes: u64,
    /// Preset name recorded in the metadata.
    pub label: String,
}

impl SynthOptions {
    /// Options for `shape` with defaults: seed 0, no skew, all cores, no fsync, 5 GB shards.
    pub fn new(shape: Shape, mix: TypeMix, label: &str) -> SynthOptions {
        SynthOptions {
            shape,
            mix,
            seed: 0,
            router_skew: 0.0,
            n_threads: 0,
            sync: false,
            shard_bytes: 5_000_000_000,
            label: label.to_string(),
        }
    }

    fn threads(&self) -> usize {
        if self.n_threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            self.n_threads
        }
    }
}

/// What was written.
#[derive(Clone, Debug)]
pub struct Summary {
    pub files: Vec<PathBuf>,
    pub n_tensors: usize,
    /// Bytes written, all files.
    pub bytes: u64,
    pub n_params: u64,
    pub seconds: f64,
}

/// Why a checkpoint could not be written.
#[derive(Debug)]
pub enum SynthError {
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The shape cannot make a valid Laguna model.
    BadShape { detail: String },
    /// A tensor would get a type this writer has no generator for.
    UnsupportedType { tensor: String, ty: &'static str },
    /// The GGUF metadata or a tensor info broke a container rule.
    Gguf(GgufError),
}

impl std::fmt::Display for SynthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SynthError::Io { path, source } => {
                write!(
                    f,
                    "cannot write {}: {source}; check the path and the free disk space",
                    path.display()
                )
            }
            SynthError::BadShape { detail } => {
                write!(f, "invalid synthetic model shape: {detail}")
            }
            SynthError::UnsupportedType { tensor, ty } => write!(
                f,
                "tensor `{tensor}` would be {ty}, which synth cannot generate; pick another --types"
            ),
            SynthError::Gguf(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for SynthError {}

impl From<GgufError> for SynthError {
    fn from(e: GgufError) -> Self {
        SynthError::Gguf(e)
    }
}

/// Writes the checkpoint: a GGUF file at `path`, or for [`TypeMix::Int4G32`] and
/// [`TypeMix::Int8`] a compressed-tensors directory.
pub fn write(path: &Path, o: &SynthOptions) -> Result<Summary, SynthError> {
    let o = SynthOptions {
        n_threads: o.threads(),
        ..o.clone()
    };
    match o.mix {
        TypeMix::Int4G32 | TypeMix::Int8 => ct::write(path, &o),
        _ => gguf_out::write(path, &o),
    }
}

/// Bytes the checkpoint will take (GGUF: tensor data; INT4: safetensors data), for a
/// free-space check before writing.
pub fn estimated_bytes(o: &SynthOptions) -> u64 {
    plan::plan(&o.shape, o.seed, 0.0)
        .iter()
        .map(|p| {
            let n = p.n_elements();
            match o.mix {
                TypeMix::Int4G32 if p.role.is_routed_expert() => n / 2 + n / ct::GROUP * 2 + 16,
                // I8 codes and one bf16 scale per output row of each expert.
                TypeMix::Int8 if p.role.is_routed_expert() => n + n / p.ne[0] * 2,
                TypeMix::Int4G32 | TypeMix::Int8 if p.role == Role::RouterBias => n * 4,
                TypeMix::Int4G32 | TypeMix::Int8 => n * 2,
                mix => {
                    let ty = gguf_out::tensor_type(p, mix, o.shape.n_layers);
                    let (be, bb) = ty.block();
                    n / be as u64 * bb as u64
                }
            }
        })
        .sum()
}
