//! The weights of a Laguna model, resolved once at load from any checkpoint: matrices stay
//! borrowed in their stored encoding, small vectors (norm gains, router bias) are decoded to
//! f32.

use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use super::{GateMode, weight_name};
use crate::config::{MlpKind, ModelConfig};
use crate::graph::{LayerWeight as L, Weight};
use crate::weights::MatRef;

/// Dense SwiGLU weights (`gate`, `up`: `[width, H]`, `down`: `[H, width]`).
#[derive(Clone, Debug)]
pub struct Mlp<'a> {
    pub gate: MatRef<'a>,
    pub up: MatRef<'a>,
    pub down: MatRef<'a>,
}

/// The feed-forward half of a layer.
#[derive(Clone, Debug)]
pub enum Ffn<'a> {
    Dense(Mlp<'a>),
    Moe {
        router: MatRef<'a>,
        bias: Vec<f32>,
        /// One matrix per expert.
        gate: Vec<MatRef<'a>>,
        up: Vec<MatRef<'a>>,
        down: Vec<MatRef<'a>>,
        shared: Option<Mlp<'a>>,
    },
}

/// One decoder layer.
#[derive(Clone, Debug)]
pub struct Layer<'a> {
    pub attn_norm: Vec<f32>,
    pub q: MatRef<'a>,
    pub k: MatRef<'a>,
    pub v: MatRef<'a>,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub gate: Option<MatRef<'a>>,
    pub o: MatRef<'a>,
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn<'a>,
}

/// All weights of a model.
#[derive(Clone, Debug)]
pub struct ModelWeights<'a> {
    pub token_embd: MatRef<'a>,
    pub output_norm: Vec<f32>,
    pub output: MatRef<'a>,
    pub layers: Vec<Layer<'a>>,
    pub gates: Vec<GateMode>,
}

/// Why weights could not be resolved.
#[derive(Clone, Debug, PartialEq)]
pub enum WeightError {
    Missing {
        tensor: String,
    },
    Shape {
        tensor: String,
        expected: (usize, usize),
        got: (usize, usize),
    },
    Parts {
        tensor: String,
        expected: usize,
        got: usize,
    },
}

impl core::fmt::Display for WeightError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            WeightError::Missing { tensor } => write!(f, "tensor `{tensor}` is missing"),
            WeightError::Shape {
                tensor,
                expected,
                got,
            } => {
                write!(
                    f,
                    "tensor `{tensor}` is {}x{}, expected {}x{}",
                    got.0, got.1, expected.0, expected.1
                )
            }
            WeightError::Parts {
                tensor,
                expected,
                got,
            } => {
                write!(
                    f,
                    "tensor `{tensor}` has {got} expert slices, expected {expected}"
                )
            }
        }
    }
}

impl<'a> ModelWeights<'a> {
    /// Resolves every weight through `lookup`, which returns a tensor's 2-D parts (one, or
    /// one per expert) by normalised name.
    pub fn resolve(
        c: &ModelConfig,
        lookup: impl Fn(&str) -> Option<Vec<MatRef<'a>>>,
    ) -> Result<ModelWeights<'a>, WeightError> {
        let get = |w: Weight,
                   n_parts: usize,
                   rows: usize,
                   cols: usize|
         -> Result<Vec<MatRef<'a>>, WeightError> {
            let tensor = weight_name(w);
            let parts = lookup(&tensor).ok_or_else(|| WeightError::Missing {
                tensor: tensor.clone(),
            })?;
            if parts.len() != n_parts {
                return Err(WeightError::Parts {
                    tensor,
                    expected: n_parts,
                    got: parts.len(),
                });
            }
            for p in &parts {
                if (p.rows, p.cols) != (rows, cols) && !(rows == 0 && p.cols == cols) {
                    return Err(WeightError::Shape {
                        tensor,
                        expected: (rows, cols),
                        got: (p.rows, p.cols),
                    });
                }
            }
            Ok(parts)
        };
        let h = c.hidden_size;
        let d = c.head_dim;
        let vector = |m: MatRef<'a>| -> Vec<f32> {
            let mut v = vec![0.0; m.rows * m.cols];
            for r in 0..m.rows {
                m.dequant_row(r, &mut v[r * m.cols..(r + 1) * m.cols]);
            }
            v
        };
        let one = |w, rows, cols| get(w, 1, rows, cols).map(|mut v| v.remove(0));
        let token_embd = one(Weight::TokenEmbd, c.vocab_size, h)?;
        let output_norm = vector(one(Weight::OutputNorm, 1, h)?);
        let output = one(Weight::Output, c.vocab_size, h)?;
        let mut layers = Vec::with_capacity(c.n_layers);
        let mut gates = Vec::with_capacity(c.n_layers);
        for l in 0..c.n_layers {
            let w = |lw| Weight::Layer(l, lw);
            let hq = c.n_heads[l];
            // The gate's width decides its mode (spec §3.7): rows 0 = any row count.
            let gate = match one(w(L::Gate), 0, h) {
                Ok(g) if g.rows == hq => Some((g, GateMode::PerHead)),
                Ok(g) if g.rows == hq * d => Some((g, GateMode::PerElement)),
                Ok(g) => {
                    return Err(WeightError::Shape {
                        tensor: weight_name(w(L::Gate)),
                        expected: (hq, h),
                        got: (g.rows, g.cols),
                    });
                }
                Err(WeightError::Missing { .. }) => None,
                Err(e) => return Err(e),
            };
            gates.push(gate.as_ref().map_or(GateMode::None, |g| g.1));
            let mlp = |names: [L; 3], width: usize| -> Result<Mlp<'a>, WeightError> {
                Ok(Mlp {
                    gate: one(w(names[0]), width, h)?,
                    up: one(w(names[1]), width, h)?,
                    down: one(w(names[2]), h, width)?,
                })
            };
            let ffn = match c.mlp_types[l] {
                MlpKind::Dense => Ffn::Dense(mlp([L::FfnGate, L::FfnUp, L::FfnDown], c.dense_ffn)?),
                MlpKind::Sparse => {
                    let shared = if c.shared_ffn > 0 {
                        Some(mlp([L::GateShexp, L::UpShexp, L::DownShexp], c.shared_ffn)?)
                    } else {
                        None
                    };
                    let (e, i) = (c.n_experts, c.expert_ffn);
                    Ffn::Moe {
                        router: one(w(L::Router), e, h)?,
                        bias: vector(one(w(L::RouterBias), 1, e)?),
                        gate: get(w(L::GateExps), e, i, h)?,
                        up: get(w(L::UpExps), e, i, h)?,
                        down: get(w(L::DownExps), e, h, i)?,
                        shared,
                    }
                }
            };
            layers.push(Layer {
                attn_norm: vector(one(w(L::AttnNorm), 1, h)?),
                q: one(w(L::Q), hq * d, h)?,
                k: one(w(L::K), c.n_kv_heads * d, h)?,
                v: one(w(L::V), c.n_kv_heads * d, h)?,
                q_norm: vector(one(w(L::QNorm), 1, d)?),
                k_norm: vector(one(w(L::KNorm), 1, d)?),
                gate: gate.map(|g| g.0),
                o: one(w(L::O), h, hq * d)?,
                ffn_norm: vector(one(w(L::FfnNorm), 1, h)?),
                ffn,
            });
        }
        Ok(ModelWeights {
            token_embd,
            output_norm,
            output,
            layers,
            gates,
        })
    }

    /// The widest row any matrix has (scratch size for row decoding).
    pub fn max_cols(&self) -> usize {
        let mut m = self.token_embd.cols.max(self.output.cols);
        for l in &self.layers {
            m = m.max(l.q.cols).max(l.o.cols);
            match &l.ffn {
                Ffn::Dense(mlp) => m = m.max(mlp.down.cols),
                Ffn::Moe { down, shared, .. } => {
                    m = m.max(down[0].cols);
                    if let Some(s) = shared {
                        m = m.max(s.down.cols);
                    }
                }
            }
        }
        m
    }
}
