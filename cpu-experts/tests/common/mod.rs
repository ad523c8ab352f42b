//! A small random Laguna model held in memory (f32 weights), for backend tests that need no
//! checkpoint file.

use std::collections::HashMap;

use lagoon_core::config::{AttnKind, MlpKind, ModelConfig, Rope, Yarn};
use lagoon_core::dtype::GgmlType;
use lagoon_core::laguna::{self, GateMode, ModelWeights};
use lagoon_core::weights::{Encoding, MatRef};

pub fn config() -> ModelConfig {
    let l = 5;
    ModelConfig {
        vocab_size: 97,
        hidden_size: 32,
        n_layers: l,
        n_heads: vec![4, 6, 6, 4, 6],
        n_kv_heads: 2,
        head_dim: 8,
        layer_types: vec![
            AttnKind::Full,
            AttnKind::Sliding,
            AttnKind::Sliding,
            AttnKind::Full,
            AttnKind::Sliding,
        ],
        mlp_types: vec![
            MlpKind::Dense,
            MlpKind::Sparse,
            MlpKind::Sparse,
            MlpKind::Sparse,
            MlpKind::Sparse,
        ],
        sliding_window: 5,
        dense_ffn: 48,
        n_experts: 6,
        n_experts_used: 2,
        expert_ffn: 16,
        shared_ffn: 24,
        routed_scaling: 2.5,
        norm_topk_prob: true,
        rms_eps: 1e-6,
        rope_full: Rope {
            theta: 10000.0,
            rotary_dim: 4,
            yarn: Some(Yarn {
                factor: 8.0,
                original_context: 64,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: 1.2,
            }),
        },
        rope_sliding: Rope {
            theta: 10000.0,
            rotary_dim: 8,
            yarn: None,
        },
        max_position: 4096,
        bos_token: Some(2),
        eos_tokens: vec![2],
    }
}

/// Deterministic pseudo-random f32 bytes for every weight of `c`, keyed by name, with the
/// shape of each part. Stacked experts are stored as one buffer per expert.
pub struct Store {
    pub bufs: HashMap<String, Vec<(usize, usize, Vec<u8>)>>,
}

impl Store {
    pub fn new(c: &ModelConfig, per_element_gate_layer: Option<usize>) -> Store {
        let mut seed = 0x1234_5678u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 11) as f64 / (1u64 << 53) as f64) as f32 * 2.0 - 1.0
        };
        let mut bufs = HashMap::new();
        let gates: Vec<GateMode> = (0..c.n_layers)
            .map(|l| {
                if Some(l) == per_element_gate_layer {
                    GateMode::PerElement
                } else {
                    GateMode::PerHead
                }
            })
            .collect();
        for w in laguna::weights(c, &gates) {
            let name = laguna::weight_name(w);
            let (parts, rows, cols, scale, offset) = shape_of(c, &gates, &name);
            let mut v = Vec::new();
            for _ in 0..parts {
                let mut b = Vec::with_capacity(rows * cols * 4);
                for _ in 0..rows * cols {
                    let x = offset + scale * rnd();
                    b.extend_from_slice(&x.to_le_bytes());
                }
                v.push((rows, cols, b));
            }
            bufs.insert(name, v);
        }
        Store { bufs }
    }

    pub fn weights<'a>(&'a self, c: &ModelConfig) -> ModelWeights<'a> {
        ModelWeights::resolve(c, |name| {
            self.bufs.get(name).map(|parts| {
                parts
                    .iter()
                    .map(|(r, cc, b)| MatRef {
                        rows: *r,
                        cols: *cc,
                        enc: Encoding::Ggml {
                            ty: GgmlType::F32,
                            data: b,
                        },
                    })
                    .collect()
            })
        })
        .expect("in-memory weights resolve")
    }
}

/// Quantised stand-ins for some of a [`Store`]'s weights: name → (type, bytes per part).
#[allow(dead_code)]
pub type Overrides = HashMap<String, (GgmlType, Vec<Vec<u8>>)>;

impl Store {
    #[allow(dead_code)]
    /// The weights with `q`'s tensors in their quantised form and the rest f32.
    pub fn weights_with<'a>(&'a self, c: &ModelConfig, q: &'a Overrides) -> ModelWeights<'a> {
        ModelWeights::resolve(c, |name| {
            let parts = self.bufs.get(name)?;
            Some(
                parts
                    .iter()
                    .enumerate()
                    .map(|(i, (r, cc, b))| MatRef {
                        rows: *r,
                        cols: *cc,
                        enc: match q.get(name) {
                            Some((ty, qp)) => Encoding::Ggml {
                                ty: *ty,
                                data: &qp[i],
                            },
                            None => Encoding::Ggml {
                                ty: GgmlType::F32,
                                data: b,
                            },
                        },
                    })
                    .collect(),
            )
        })
        .expect("weights resolve")
    }
}

/// Random Q4_K rows (random quants, scales and mins; small f16 `d` and `dmin`).
#[allow(dead_code)]
pub fn q4k(rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
    let mut next = move || {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    };
    let mut w = vec![0u8; rows * cols / 256 * 144];
    for blk in w.chunks_exact_mut(144) {
        for b in blk.iter_mut() {
            *b = next() as u8;
        }
        let d = half::f16::from_f32(4e-5 + (next() % 100) as f32 * 1e-6);
        let m = half::f16::from_f32(2e-4 + (next() % 100) as f32 * 1e-6);
        blk[0..2].copy_from_slice(&d.to_le_bytes());
        blk[2..4].copy_from_slice(&m.to_le_bytes());
    }
    w
}

/// (parts, rows, cols, scale, offset) of a weight by name.
fn shape_of(c: &ModelConfig, gates: &[GateMode], name: &str) -> (usize, usize, usize, f32, f32) {
    let h = c.hidden_size;
    let d = c.head_dim;
    let proj = |fan_in: usize| 1.4 / (fan_in as f32).sqrt();
    if name == "token_embd.weight" {
        return (1, c.vocab_size, h, 1.0, 0.0);
    }
    if name == "output.weight" {
        return (1, c.vocab_size, h, proj(h), 0.0);
    }
    if name == "output_norm.weight" {
        return (1, 1, h, 0.1, 1.0);
    }
    let l: usize = name.split('.').nth(1).unwrap().parse().unwrap();
    let rest = name.splitn(3, '.').nth(2).unwrap();
    let hq = c.n_heads[l];
    let kv = c.n_kv_heads * d;
    match rest {
        "attn_norm.weight" | "ffn_norm.weight" => (1, 1, h, 0.1, 1.0),
        "attn_q_norm.weight" | "attn_k_norm.weight" => (1, 1, d, 0.1, 1.0),
        "attn_q.weight" => (1, hq * d, h, proj(h), 0.0),
        "attn_k.weight" | "attn_v.weight" => (1, kv, h, proj(h), 0.0),
        "attn_gate.weight" => (
            1,
            if gates[l] == GateMode::PerHead {
                hq
            } else {
                hq * d
            },
            h,
            proj(h),
            0.0,
        ),
        "attn_output.weight" => (1, h, hq * d, proj(hq * d), 0.0),
        "ffn_gate.weight" | "ffn_up.weight" => (1, c.dense_ffn, h, proj(h), 0.0),
        "ffn_down.weight" => (1, h, c.dense_ffn, proj(c.dense_ffn), 0.0),
        "ffn_gate_inp.weight" => (1, c.n_experts, h, proj(h), 0.0),
        "exp_probs_b.bias" => (1, 1, c.n_experts, 0.1, 0.0),
        "ffn_gate_exps.weight" | "ffn_up_exps.weight" => {
            (c.n_experts, c.expert_ffn, h, proj(h), 0.0)
        }
        "ffn_down_exps.weight" => (c.n_experts, h, c.expert_ffn, proj(c.expert_ffn), 0.0),
        "ffn_gate_shexp.weight" | "ffn_up_shexp.weight" => (1, c.shared_ffn, h, proj(h), 0.0),
        "ffn_down_shexp.weight" => (1, h, c.shared_ffn, proj(c.shared_ffn), 0.0),
        _ => panic!("unknown weight {name}"),
    }
}

/// Relative L2 distance `||a − b|| / ||b||`.
#[allow(dead_code)]
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        num += (x as f64 - y as f64).powi(2);
        den += (y as f64).powi(2);
    }
    (num / den).sqrt()
}

/// Logits of every token of `toks` from a fresh fast-path session taking steps of `ubatch`
/// tokens on `n_threads` threads (0: all). (Not every test binary that includes this module
/// calls it.)
#[allow(dead_code)]
pub fn session_logits(
    c: &ModelConfig,
    w: &ModelWeights<'_>,
    toks: &[u32],
    ubatch: usize,
    n_threads: usize,
) -> Vec<f32> {
    session_logits_repack(c, w, toks, ubatch, n_threads, None)
}

/// [`session_logits`] with `SessionOptions::repack` set.
#[allow(dead_code)]
pub fn session_logits_repack(
    c: &ModelConfig,
    w: &ModelWeights<'_>,
    toks: &[u32],
    ubatch: usize,
    n_threads: usize,
    repack: Option<bool>,
) -> Vec<f32> {
    let mut s = lagoon_cpu::Session::new(
        c,
        w,
        lagoon_cpu::SessionOptions {
            n_ctx: toks.len(),
            ubatch,
            all_logits: true,
            n_threads,
            reference: false,
            repack,
        },
    );
    let mut out = Vec::new();
    s.prefill(toks, |l| out.extend_from_slice(l)).unwrap();
    out
}
