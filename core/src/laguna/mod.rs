//! The Laguna model: weight names and the graph builder. The forward pass reads top to
//! bottom in [`build`]; spec/laguna.md §2–§5 describes each step.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::config::{MlpKind, ModelConfig};
use crate::graph::{Builder, Graph, LayerWeight as L, Op, ValueId, Weight};

pub mod weights;
pub use weights::ModelWeights;

/// How a layer's attention output is gated (decided from the `attn_gate` shape, spec §3.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateMode {
    None,
    PerHead,
    PerElement,
}

/// The normalised (GGUF) name of a weight.
pub fn weight_name(w: Weight) -> String {
    match w {
        Weight::TokenEmbd => "token_embd.weight".into(),
        Weight::OutputNorm => "output_norm.weight".into(),
        Weight::Output => "output.weight".into(),
        Weight::Layer(l, lw) => {
            let s = match lw {
                L::AttnNorm => "attn_norm.weight",
                L::Q => "attn_q.weight",
                L::K => "attn_k.weight",
                L::V => "attn_v.weight",
                L::QNorm => "attn_q_norm.weight",
                L::KNorm => "attn_k_norm.weight",
                L::Gate => "attn_gate.weight",
                L::O => "attn_output.weight",
                L::FfnNorm => "ffn_norm.weight",
                L::FfnGate => "ffn_gate.weight",
                L::FfnUp => "ffn_up.weight",
                L::FfnDown => "ffn_down.weight",
                L::Router => "ffn_gate_inp.weight",
                L::RouterBias => "exp_probs_b.bias",
                L::GateExps => "ffn_gate_exps.weight",
                L::UpExps => "ffn_up_exps.weight",
                L::DownExps => "ffn_down_exps.weight",
                L::GateShexp => "ffn_gate_shexp.weight",
                L::UpShexp => "ffn_up_shexp.weight",
                L::DownShexp => "ffn_down_shexp.weight",
            };
            format!("blk.{l}.{s}")
        }
    }
}

/// Every weight a Laguna model with this config and these gates reads.
pub fn weights(c: &ModelConfig, gates: &[GateMode]) -> Vec<Weight> {
    let mut v = Vec::from([Weight::TokenEmbd, Weight::OutputNorm, Weight::Output]);
    for l in 0..c.n_layers {
        let w = |lw| Weight::Layer(l, lw);
        v.extend(
            [
                L::AttnNorm,
                L::Q,
                L::K,
                L::V,
                L::QNorm,
                L::KNorm,
                L::O,
                L::FfnNorm,
            ]
            .map(w),
        );
        if gates[l] != GateMode::None {
            v.push(w(L::Gate));
        }
        match c.mlp_types[l] {
            MlpKind::Dense => v.extend([L::FfnGate, L::FfnUp, L::FfnDown].map(w)),
            MlpKind::Sparse => {
                v.extend(
                    [
                        L::Router,
                        L::RouterBias,
                        L::GateExps,
                        L::UpExps,
                        L::DownExps,
                    ]
                    .map(w),
                );
                if c.shared_ffn > 0 {
                    v.extend([L::GateShexp, L::UpShexp, L::DownShexp].map(w));
                }
            }
        }
    }
    v
}

/// Builds the forward graph for up to `max_tokens` tokens per step. With `all_logits` the
/// output holds every token's logits, else only the last token's.
pub fn build(c: &ModelConfig, gates: &[GateMode], max_tokens: usize, all_logits: bool) -> Graph {
    let mut b = Builder::new(max_tokens);
    let h = c.hidden_size;
    let d = c.head_dim;
    let mut x = b.value(h);
    b.push(Op::Embed { out: x });
    for l in 0..c.n_layers {
        let w = |lw| Weight::Layer(l, lw);
        let hq = c.n_heads[l];
        // Attention block (spec §3.2).
        let hn = norm(&mut b, x, w(L::AttnNorm), h);
        let q = matmul(&mut b, hn, w(L::Q), hq * d);
        let k = matmul(&mut b, hn, w(L::K), c.n_kv_heads * d);
        let v = matmul(&mut b, hn, w(L::V), c.n_kv_heads * d);
        // The gate reads the same normed input: emitted next to Q/K/V so that backends can
        // run the four projections as one dispatch.
        let g = match gates[l] {
            GateMode::None => None,
            GateMode::PerHead => Some(matmul(&mut b, hn, w(L::Gate), hq)),
            GateMode::PerElement => Some(matmul(&mut b, hn, w(L::Gate), hq * d)),
        };
        let q = norm(&mut b, q, w(L::QNorm), hq * d);
        let k = norm(&mut b, k, w(L::KNorm), c.n_kv_heads * d);
        let sliding = c.is_sliding(l);
        let q = rope(&mut b, q, sliding);
        let k = rope(&mut b, k, sliding);
        b.push(Op::KvStore { layer: l, k, v });
        let mut o = b.value(hq * d);
        b.push(Op::Attention {
            layer: l,
            q,
            out: o,
        });
        if let Some(g) = g {
            let og = b.value(hq * d);
            b.push(Op::GateMul { o, g, out: og });
            o = og;
        }
        let attn = matmul(&mut b, o, w(L::O), h);
        x = add(&mut b, x, attn, h);
        // Feed-forward block (spec §4, §5).
        let hn = norm(&mut b, x, w(L::FfnNorm), h);
        let ffn = match c.mlp_types[l] {
            MlpKind::Dense => swiglu_mlp(
                &mut b,
                hn,
                l,
                [L::FfnGate, L::FfnUp, L::FfnDown],
                c.dense_ffn,
                h,
            ),
            MlpKind::Sparse => {
                let z = matmul(&mut b, hn, w(L::Router), c.n_experts);
                let ids = b.value(c.n_experts_used);
                let weights = b.value(c.n_experts_used);
                b.push(Op::Route {
                    layer: l,
                    z,
                    ids,
                    weights,
                });
                let routed = b.value(h);
                b.push(Op::Experts {
                    layer: l,
                    x: hn,
                    ids,
                    weights,
                    out: routed,
                });
                if c.shared_ffn > 0 {
                    let sh = swiglu_mlp(
                        &mut b,
                        hn,
                        l,
                        [L::GateShexp, L::UpShexp, L::DownShexp],
                        c.shared_ffn,
                        h,
                    );
                    add(&mut b, routed, sh, h)
                } else {
                    routed
                }
            }
        };
        x = add(&mut b, x, ffn, h);
    }
    if !all_logits {
        let last = b.row_value(h);
        b.push(Op::LastRow { x, out: last });
        x = last;
    }
    let xn = if all_logits {
        b.value(h)
    } else {
        b.row_value(h)
    };
    b.push(Op::RmsNorm {
        x,
        w: Weight::OutputNorm,
        out: xn,
    });
    let logits = if all_logits {
        b.value(c.vocab_size)
    } else {
        b.row_value(c.vocab_size)
    };
    b.push(Op::MatMul {
        x: xn,
        w: Weight::Output,
        out: logits,
    });
    b.finish(logits)
}

fn norm(b: &mut Builder, x: ValueId, w: Weight, cols: usize) -> ValueId {
    let out = b.value(cols);
    b.push(Op::RmsNorm { x, w, out });
    out
}

fn matmul(b: &mut Builder, x: ValueId, w: Weight, cols: usize) -> ValueId {
    let out = b.value(cols);
    b.push(Op::MatMul { x, w, out });
    out
}

fn rope(b: &mut Builder, x: ValueId, sliding: bool) -> ValueId {
    let out = b.value(b.cols(x));
    b.push(Op::Rope { x, sliding, out });
    out
}

fn add(b: &mut Builder, a: ValueId, y: ValueId, cols: usize) -> ValueId {
    let out = b.value(cols);
    b.push(Op::Add { a, b: y, out });
    out
}

/// `down(silu(gate(x)) ⊙ up(x))` — the dense MLP and the shared expert.
fn swiglu_mlp(b: &mut Builder, x: ValueId, l: usize, w: [L; 3], width: usize, h: usize) -> ValueId {
    let g = matmul(b, x, Weight::Layer(l, w[0]), width);
    let u = matmul(b, x, Weight::Layer(l, w[1]), width);
    let a = b.value(width);
    b.push(Op::SwiGlu {
        gate: g,
        up: u,
        out: a,
    });
    matmul(b, a, Weight::Layer(l, w[2]), h)
}
