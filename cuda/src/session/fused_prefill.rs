//! The prefill step's fusions (tensor-core path): node patterns of the many-token graph that
//! one kernel computes, each giving the bits of the unfused kernels it replaces (a device
//! test compares whole prefill steps with fusions on and off). See
//! [`CudaSession::fused_prefill`]. A child module of `session`, so it reads the session's
//! fields directly.

use lagoon_core::graph::{Graph, Op};

use super::CudaSession;
use crate::error::CudaError;

impl CudaSession {
    /// Prefill fusions on the tensor-core path (`n` tokens): recognises, at node `i`, a run
    /// of nodes one fused kernel does, launches it and returns how many nodes it covered; 0 =
    /// none, the node runs on its own. Each pattern checks that the values it skips are read
    /// by nobody else.
    ///
    /// - QK-norm, RoPE and the KV store (five nodes) in one `qk_norm_rope_store` launch
    ///   over every (head, token).
    /// - A whole-row RMSNorm whose output a tensor-core product reads next also writes the
    ///   product's f16 input (`rms_norm_h`), so the products of that value (Q/K/V/gate, or
    ///   the router, the experts and the shared expert) convert nothing.
    /// - Prefill attention followed by the softplus output gate and the output projection:
    ///   the gate and the f16 rounding in the attention kernel's epilogue, straight into the
    ///   projection's f16 input (neither the f32 output nor the gated one is written).
    ///
    /// Measured and not kept: the residual add after a `gemm_h16` product in that kernel's
    /// epilogue (pp4096 unchanged, pp512 1% slower; not profiled further).
    pub(super) fn fused_prefill(
        &self,
        graph: &Graph,
        i: usize,
        n: usize,
    ) -> Result<usize, CudaError> {
        let nodes = &graph.nodes;
        let vals = &graph.values;
        let at = |v: usize| self.arena + 4 * vals[v].offset as u64;
        let once = |v: usize| self.prefill_readers[v] == 1;
        let next = |k: usize| nodes.get(i + k).copied();
        // Whether node k is a product of value v on the tensor cores.
        let tc_reads = |k: usize, v: usize| match next(k) {
            Some(Op::MatMul { x, w, .. }) => {
                x == v && self.tc_product(self.w.mat(w).cols, vals[x].rows(n))
            }
            _ => false,
        };
        match nodes[i] {
            Op::RmsNorm {
                x: q,
                w: qw,
                out: qn,
            } => {
                let used = self.fused_qk(graph, i, n, &self.prefill_readers)?;
                if used > 0 {
                    return Ok(used);
                }
                // A whole-row norm read next by a tensor-core product.
                let g = self.w.vector(qw);
                let cols = vals[q].cols;
                if g.len != cols || !tc_reads(1, qn) {
                    return Ok(0);
                }
                self.rms_norm(at(q), g, at(qn), Some(self.xh), vals[q].rows(n))?;
                self.xh_holds.set(Some(qn));
                Ok(1)
            }
            Op::Attention { layer, q, out } => {
                if !self.prefill_attention(n, 1) || !once(out) {
                    return Ok(0);
                }
                // The gate, when the layer has one, then the product reading the result.
                let (gate, last, used) = match next(1) {
                    Some(Op::GateMul { o, g, out: og }) if o == out => {
                        (Some((at(g), vals[g].cols)), og, 2)
                    }
                    _ => (None, out, 1),
                };
                if !once(last) || !tc_reads(used, last) {
                    return Ok(0);
                }
                self.attention(layer, at(q), at(out), n, 1, gate, self.xh)?;
                self.xh_holds.set(Some(last));
                Ok(used)
            }
            _ => Ok(0),
        }
    }
}
