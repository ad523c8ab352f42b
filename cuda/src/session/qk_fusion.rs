//! QK-norm, RoPE and the KV store in one kernel (`fused.cu`'s `qk_norm_rope_store`), for
//! decode and prefill steps alike: the graph pattern ([`match_qk`], pure, so CI tests it on
//! the model's graphs) and its launch. A child module of `session`.

use lagoon_core::graph::{Graph, Op, ValueId, Weight};

use super::CudaSession;
use crate::device::{Arg, blocks};
use crate::error::CudaError;
use crate::manifest::K;

/// The widest head `attention_decode_qk` takes (`attention.cu`'s ATT_MAX_D).
const QK_ATTN_MAX_D: usize = 256;

/// Nodes i .. i + 5 of a graph: RmsNorm q (gain `qw`), RmsNorm k (`kw`), Rope of each, and
/// the KV store of the rotated k with `v`, the rotated q going to `qr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct QkFusion {
    pub q: ValueId,
    pub k: ValueId,
    pub v: ValueId,
    pub qw: Weight,
    pub kw: Weight,
    pub qr: ValueId,
    pub layer: usize,
    pub sliding: bool,
}

/// The fusion at node `i` of `graph` for steps of `n` tokens, if the nodes there are the
/// pattern, the values it skips (the normed q and k, the rotated k) are read by nobody else
/// (`readers`: how many nodes read each value), both gains are `d` long (`norm_len`), and the
/// kernel's output `qr` does not overlap its inputs (the planner lets a value reuse the space
/// of values that died before it was made), except q itself exactly (each warp reads its head
/// before writing it).
pub(super) fn match_qk(
    graph: &Graph,
    i: usize,
    n: usize,
    readers: &[u32],
    norm_len: impl Fn(Weight) -> usize,
    d: usize,
) -> Option<QkFusion> {
    let vals = &graph.values;
    let once = |v: ValueId| readers[v] == 1;
    let apart = |a: ValueId, b: ValueId| {
        let (ra, rb) = (&vals[a], &vals[b]);
        ra.offset + ra.capacity(n) <= rb.offset || rb.offset + rb.capacity(n) <= ra.offset
    };
    let at = |k: usize| graph.nodes.get(i + k).copied();
    if let (
        Some(Op::RmsNorm {
            x: q,
            w: qw,
            out: qn,
        }),
        Some(Op::RmsNorm {
            x: k,
            w: kw,
            out: kn,
        }),
        Some(Op::Rope {
            x: rq,
            sliding,
            out: qr,
        }),
        Some(Op::Rope { x: rk, out: kr, .. }),
        Some(Op::KvStore { layer, k: sk, v }),
    ) = (at(0), at(1), at(2), at(3), at(4))
        && rq == qn
        && rk == kn
        && sk == kr
        && once(qn)
        && once(kn)
        && once(kr)
        && (apart(qr, q) || vals[qr].offset == vals[q].offset)
        && apart(qr, k)
        && apart(qr, v)
        && norm_len(qw) == d
        && norm_len(kw) == d
    {
        Some(QkFusion {
            q,
            k,
            v,
            qw,
            kw,
            qr,
            layer,
            sliding,
        })
    } else {
        None
    }
}

impl CudaSession {
    /// The QK-norm + RoPE + KV-store nodes at `i` and the attention after them (with its
    /// output gate) as one attention kernel (`attention_decode_qk`), for decode steps when
    /// the session takes that fusion ([`crate::CudaSessionOptions::qk_attention`]): the
    /// number of nodes covered (7), or 0 with nothing launched.
    pub(super) fn fused_qk_attention(&self, graph: &Graph, i: usize) -> Result<usize, CudaError> {
        let d = self.cfg.head_dim;
        // (attention.cu's fused kernel has no q8_0 cache twin.)
        if !self.qk_attention
            || d > QK_ATTN_MAX_D
            || !d.is_multiple_of(8)
            || self.opts.kv == crate::KvCache::Q8_0
        {
            return Ok(0);
        }
        let Some(f) = match_qk(graph, i, 1, &self.readers, |w| self.w.vector(w).len, d) else {
            return Ok(0);
        };
        // The rotated q (not written by the fused kernel) must be the attention's input
        // and read by nothing else.
        match graph.nodes.get(i + 5) {
            Some(&Op::Attention { layer, q, .. })
                if layer == f.layer && q == f.qr && self.readers[f.qr] == 1 => {}
            _ => return Ok(0),
        }
        let used = self.fused_attention(graph, i + 5, Some(f))?;
        Ok(if used > 0 { 5 + used } else { 0 })
    }

    /// The one-token attention of `layer` (`attention_decode`), or with `qk` the kernel that
    /// also does the step's QK-norm, RoPE and KV store (`attention_decode_qk`: `q` is then
    /// the raw query projection, `k` and `v` the raw key and value projections).
    pub(super) fn decode_attention_qk(
        &self,
        layer: usize,
        qk: Option<(QkFusion, u64, u64)>,
        q: u64,
        out: u64,
        split: usize,
        gate: Option<(u64, usize)>,
    ) -> Result<(), CudaError> {
        use Arg::{F, I, P};
        let Some((f, k, v)) = qk else {
            return self.attention(layer, q, out, 1, split, gate, 0);
        };
        let c = &self.cfg;
        let (freq, scale, rd) = self.ropes[f.sliding as usize];
        let mut args = [I(0); 21];
        args[..13].copy_from_slice(&self.attention_args(layer, q, out, gate));
        args[13..].copy_from_slice(&[
            P(k),
            P(v),
            P(self.w.vector(f.qw).ptr),
            P(self.w.vector(f.kw).ptr),
            P(freq),
            F(scale),
            I(rd as i32),
            F(c.rms_eps),
        ]);
        // The tensor-core GQA kernel's fused form (`flash.cu`'s QKF: an f16 cache, head_dim
        // 128), one block per (KV head, split); else the per-query-head kernel.
        if self.gqa_attention && self.opts.kv == crate::KvCache::F16 {
            return self.dev.launch3(
                K::AttentionDecodeGqaQkF16,
                (c.n_kv_heads as u32, 1, split as u32),
                128,
                &args,
            );
        }
        self.dev.launch3(
            self.kv_kernel(
                K::AttentionDecodeQk,
                K::AttentionDecodeQkF16,
                K::AttentionDecodeQkBf16,
                None,
            )?,
            (c.n_heads[layer] as u32, 1, split as u32),
            128,
            &args,
        )
    }

    /// The QK-norm + RoPE + KV-store fusion at node `i`, for `n` tokens, launched if it
    /// matches: the number of nodes it covered (5), or 0.
    pub(super) fn fused_qk(
        &self,
        graph: &Graph,
        i: usize,
        n: usize,
        readers: &[u32],
    ) -> Result<usize, CudaError> {
        use Arg::{F, I, P};
        let c = &self.cfg;
        let d = c.head_dim;
        let Some(f) = match_qk(graph, i, n, readers, |w| self.w.vector(w).len, d) else {
            return Ok(0);
        };
        let at = |v: usize| self.arena + 4 * graph.values[v].offset as u64;
        let kv = self.kv[f.layer];
        let hq = c.n_heads[f.layer];
        let (freq, scale, rd) = self.ropes[f.sliding as usize];
        self.dev.launch(
            self.kv_kernel(
                K::QkNormRopeStore,
                K::QkNormRopeStoreF16,
                K::QkNormRopeStoreBf16,
                Some(K::QkNormRopeStoreQ8_0),
            )?,
            (blocks(hq + c.n_kv_heads, 4), n as u32),
            128,
            &[
                P(at(f.q)),
                P(at(f.k)),
                P(at(f.v)),
                P(self.w.vector(f.qw).ptr),
                P(self.w.vector(f.kw).ptr),
                P(at(f.qr)),
                P(kv.k),
                P(kv.v),
                I(kv.cap as i32),
                P(freq),
                F(scale),
                I(rd as i32),
                I(d as i32),
                I(hq as i32),
                I(c.n_kv_heads as i32),
                F(c.rms_eps),
                P(self.params),
            ],
        )?;
        Ok(5)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_graphs::{each_fixture, overlap, span};
    use super::*;
    use lagoon_core::graph::LayerWeight;

    /// On the tiny fixture models' decode and prefill graphs the pattern is found at the
    /// Q-norm node of every layer whose rotated q's space overlaps none of the kernel's
    /// inputs (the planner's FUSE_SLACK keeps them apart: every layer here; without it layers 0
    /// and 1 of the xs2_style decode graph overlapped and ran unfused), and nowhere else; not
    /// where a skipped value has a second reader or a gain has another length.
    #[test]
    fn qk_fusion_matches_the_model_graphs() {
        each_fixture(|model, c, build| {
            let norm_len = |id: Weight| match id {
                Weight::Layer(_, LayerWeight::QNorm | LayerWeight::KNorm) => c.head_dim,
                _ => c.hidden_size,
            };
            for (max, n) in [(1, 1), (40, 40), (40, 16)] {
                let g = build(max);
                let mut readers = vec![0u32; g.values.len()];
                for op in &g.nodes {
                    for v in op.inputs() {
                        readers[v] += 1;
                    }
                }
                readers[g.output] += 1;
                let overlap = |a: ValueId, b: ValueId| overlap(&g, a, b, n);
                let span = |v: ValueId| span(&g, v, n);
                let mut fused = 0;
                for i in 0..g.nodes.len() {
                    let got = match_qk(&g, i, n, &readers, norm_len, c.head_dim);
                    let Op::RmsNorm {
                        x: q,
                        w: Weight::Layer(l, LayerWeight::QNorm),
                        ..
                    } = g.nodes[i]
                    else {
                        assert!(got.is_none(), "{model}: a match at node {i}");
                        continue;
                    };
                    let (Op::RmsNorm { x: k, .. }, Op::Rope { out: qr, .. }, Op::KvStore { v, .. }) =
                        (g.nodes[i + 1], g.nodes[i + 2], g.nodes[i + 4])
                    else {
                        panic!("{model}: layer {l}'s attention nodes moved")
                    };
                    let free = (!overlap(qr, q) || span(qr) == span(q))
                        && !overlap(qr, k)
                        && !overlap(qr, v);
                    assert_eq!(got.is_some(), free, "{model} max {max} n {n} layer {l}");
                    if let Some(f) = got {
                        assert_eq!((f.layer, f.q, f.k, f.v, f.qr), (l, q, k, v, qr));
                        fused += 1;
                        let Op::RmsNorm { out: qn, .. } = g.nodes[i] else {
                            unreachable!()
                        };
                        let mut more = readers.clone();
                        more[qn] += 1;
                        assert!(match_qk(&g, i, n, &more, norm_len, c.head_dim).is_none());
                        let wrong = |_| c.head_dim + 1;
                        assert!(match_qk(&g, i, n, &readers, wrong, c.head_dim).is_none());
                    }
                }
                println!(
                    "{model} max {max} n {n}: {fused} of {} layers fused",
                    c.n_layers
                );
                assert_eq!(fused, c.n_layers, "{model} max {max} n {n}: {fused} fused");
            }
        });
    }
}
