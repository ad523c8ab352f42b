//! One view over every checkpoint format: a validated [`ModelConfig`] and a tensor directory
//! with GGUF-style names (`blk.N.ffn_gate_exps.weight`, ...), whatever the file called them.
//!
//! Tensors are stored as records of byte spans into the mapped files and resolved to borrowed
//! [`MatRef`]s on demand, so the checkpoint owns its maps and hands out views tied to itself.

use std::path::{Path, PathBuf};

use lagoon_core::config::ModelConfig;
use lagoon_core::dtype::GgmlType;
use lagoon_core::weights::{Encoding, MatRef};
use memmap2::Mmap;

use crate::error::Error;

/// A byte range inside one of the checkpoint's mapped files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub file: u32,
    pub start: usize,
    pub len: usize,
}

/// How one 2-D part of a tensor is encoded, by spans.
#[derive(Clone, Debug)]
pub enum PartRecord {
    Ggml { ty: GgmlType, span: Span },
    Ct(crate::compressed::CtRecord),
}

/// One logical tensor: its normalised name, its shape in PyTorch order (outermost first,
/// e.g. `[E, out, in]` for stacked experts) and its 2-D parts (one, or one per expert).
#[derive(Clone, Debug)]
pub struct TensorRecord {
    pub name: String,
    /// Name in the source file (HF name, or first expert's name for stacked experts).
    pub source_name: String,
    pub shape: Vec<usize>,
    /// Rows and columns of every part.
    pub rows: usize,
    pub cols: usize,
    pub parts: Vec<PartRecord>,
}

/// A resolved tensor: borrowed views of its parts.
#[derive(Clone, Debug)]
pub struct Tensor<'a> {
    pub name: &'a str,
    pub shape: &'a [usize],
    pub parts: Vec<MatRef<'a>>,
}

impl Tensor<'_> {
    /// Number of elements.
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Which format a checkpoint was read from, with its raw metadata for `inspect`.
#[derive(Debug)]
pub enum Source {
    Gguf {
        files: Vec<PathBuf>,
        metadata: Vec<(String, crate::gguf::Value)>,
    },
    Hf {
        dir: PathBuf,
        config: serde_json::Value,
    },
}

/// An opened checkpoint.
#[derive(Debug)]
pub struct Checkpoint {
    pub config: ModelConfig,
    pub source: Source,
    maps: Vec<Mmap>,
    tensors: Vec<TensorRecord>,
}

impl Checkpoint {
    /// Opens a `.gguf` file (the first of a split set is enough) or a HF checkpoint directory
    /// (`config.json` + safetensors, with or without a compressed-tensors
    /// `quantization_config`), validates its config and tensor directory.
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint, Error> {
        let path = path.as_ref();
        let (config, source, maps, tensors) = if path.is_dir() {
            crate::hf::load(path)?
        } else {
            crate::gguf::load_checkpoint(path)?
        };
        let ckpt = Checkpoint::from_parts(config, source, maps, tensors)?;
        crate::validate::check_laguna(&ckpt)?;
        Ok(ckpt)
    }

    /// Assembles a checkpoint and checks that every span lies inside its file.
    pub fn from_parts(
        config: ModelConfig,
        source: Source,
        maps: Vec<Mmap>,
        tensors: Vec<TensorRecord>,
    ) -> Result<Checkpoint, Error> {
        config.validate().map_err(Error::Config)?;
        for t in &tensors {
            for p in &t.parts {
                for s in p.spans() {
                    let ok = maps
                        .get(s.file as usize)
                        .is_some_and(|m| s.start.checked_add(s.len).is_some_and(|e| e <= m.len()));
                    if !ok {
                        return Err(Error::TensorOutOfBounds {
                            tensor: t.name.clone(),
                            start: s.start,
                            len: s.len,
                        });
                    }
                }
            }
        }
        Ok(Checkpoint {
            config,
            source,
            maps,
            tensors,
        })
    }

    /// All tensor records, in file order.
    pub fn records(&self) -> &[TensorRecord] {
        &self.tensors
    }

    /// The record of a tensor, by normalised name.
    pub fn record(&self, name: &str) -> Option<&TensorRecord> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// A tensor by normalised name, or `Error::MissingTensor`.
    pub fn tensor(&self, name: &str) -> Result<Tensor<'_>, Error> {
        let t = self.record(name).ok_or_else(|| Error::MissingTensor {
            tensor: name.to_string(),
        })?;
        Ok(self.resolve(t))
    }

    /// Resolves a record against the mapped files.
    pub fn resolve<'a>(&'a self, t: &'a TensorRecord) -> Tensor<'a> {
        let parts = t
            .parts
            .iter()
            .map(|p| MatRef {
                rows: t.rows,
                cols: t.cols,
                enc: self.encoding(p),
            })
            .collect();
        Tensor {
            name: &t.name,
            shape: &t.shape,
            parts,
        }
    }

    fn bytes(&self, s: Span) -> &[u8] {
        &self.maps[s.file as usize][s.start..s.start + s.len]
    }

    fn encoding<'a>(&'a self, p: &PartRecord) -> Encoding<'a> {
        match p {
            PartRecord::Ggml { ty, span } => Encoding::Ggml {
                ty: *ty,
                data: self.bytes(*span),
            },
            PartRecord::Ct(r) => Encoding::Ct(r.resolve(|s| self.bytes(s))),
        }
    }
}

impl PartRecord {
    /// Every byte range this part reads.
    pub fn spans(&self) -> Vec<Span> {
        match self {
            PartRecord::Ggml { span, .. } => vec![*span],
            PartRecord::Ct(r) => r.spans(),
        }
    }
}
