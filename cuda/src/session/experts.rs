//! The routed experts on the unfused paths (decode without fusions, the f32 kernels, and
//! prefill): the grouping of (token, slot) pairs by expert, the gate/up and down products,
//! and the weighted combine. A child module of `session`, so it reads the session's fields
//! directly.

use super::{CudaSession, GEMM_MIN_TOKENS, GROUP_PAIRS, RfUse, max_tiles};
use crate::device::{Arg, blocks};
use crate::error::CudaError;
use crate::manifest::{GEMM_THREADS, GEMM_TILE_ROWS, GEMM_TILE_TOKENS, K};
use crate::weights::DFfn;

impl CudaSession {
    /// The routed experts of `layer` for `n` tokens on the unfused paths: gate/up (+SwiGLU)
    /// and down per (token, slot) pair into `ys`, then the weighted sum into `out`.
    pub(super) fn experts(
        &self,
        layer: usize,
        xv: usize,
        x: u64,
        ids: u64,
        weights: u64,
        out: u64,
        n: usize,
    ) -> Result<(), CudaError> {
        use Arg::{F, I, P};
        let c = &self.cfg;
        let DFfn::Moe { gate, down, .. } = &self.w.layers[layer].ffn else {
            unreachable!("experts on a dense layer")
        };
        let (h, i, k) = (c.hidden_size, c.expert_ffn, c.n_experts_used);
        if n == 1 {
            // Decode: one warp per (row, pair); the K experts run in parallel.
            let grids = ((blocks(i, 4), k as u32), (blocks(h, 4), k as u32));
            self.expert_products(
                layer,
                (gate.ty.gate_up(), down.ty.down()),
                grids,
                128,
                x,
                &[P(ids)],
            )?;
        } else {
            // Prefill: pairs grouped by expert, each expert row decoded once per tile of pairs:
            // on the tensor cores tiles of 32 pairs while experts average at most 32 (a
            // 64-pair tile would be mostly padding), else 64; the f32 kernels take 8.
            let tc = self.opts.quantized_activations
                && n >= GEMM_MIN_TOKENS
                && h.is_multiple_of(32)
                && i.is_multiple_of(32);
            // gemm_rf.cu takes both products: tiles of 64 pairs, or of 128 where experts
            // average more than 64 (each expert's weights then decoded once per tile instead
            // of once per 64 pairs).
            let rf = self.rf(gate.ty, h, GEMM_TILE_TOKENS).is_some()
                && self.rf(down.ty, i, GEMM_TILE_TOKENS).is_some();
            let group = match tc {
                false => GROUP_PAIRS,
                true if rf => {
                    if self.gemm_rf == RfUse::All && n * k > GEMM_TILE_TOKENS * c.n_experts {
                        2 * GEMM_TILE_TOKENS
                    } else {
                        GEMM_TILE_TOKENS
                    }
                }
                true if n * k <= (GEMM_TILE_TOKENS / 2) * c.n_experts => GEMM_TILE_TOKENS / 2,
                true => GEMM_TILE_TOKENS,
            };
            let tiles = max_tiles(n * k, c.n_experts, group);
            self.dev.launch(
                K::MoeGroup,
                (1, 1),
                1024,
                &[
                    P(ids),
                    P(self.sorted),
                    P(self.tiles),
                    I((n * k) as i32),
                    I(c.n_experts as i32),
                    I(tiles as i32),
                    I(group as i32),
                ],
            )?;
            let route = [P(self.sorted), P(self.tiles)];
            if tc {
                // x in f16 for gate/up, which writes the SwiGLU activations in f16 (into the
                // expert scratch) for down.
                self.to_f16(xv, x, n * h)?;
                let kernels = (
                    self.gemm(gate.ty, h, group).gate_up,
                    self.gemm(down.ty, i, group).down,
                );
                let grids = (
                    (blocks(i, GEMM_TILE_ROWS / 2), tiles as u32),
                    (blocks(h, GEMM_TILE_ROWS), tiles as u32),
                );
                self.expert_products(layer, kernels, grids, GEMM_THREADS, self.xh, &route)?;
            } else {
                let kernels = (gate.ty.gate_up_grouped(), down.ty.down_grouped());
                let grids = ((blocks(i, 4), tiles as u32), (blocks(h, 4), tiles as u32));
                self.expert_products(layer, kernels, grids, 128, x, &route)?;
            }
        }
        self.dev.launch(
            K::MoeCombine,
            (n as u32, 1),
            256,
            &[
                P(self.ys),
                P(ids),
                P(weights),
                P(out),
                I(h as i32),
                I(k as i32),
                I(n as i32),
                F(c.routed_scaling),
            ],
        )
    }

    /// One gate/up (+SwiGLU) kernel into the expert scratch and its down kernel into `ys`,
    /// with the argument lists every variant shares: `route` (the pairs' expert ids, or the
    /// grouping's sorted pairs and tiles) follows each kernel's input.
    fn expert_products(
        &self,
        layer: usize,
        (gate_up, down_k): (K, K),
        (grid_gu, grid_d): ((u32, u32), (u32, u32)),
        block: u32,
        x: u64,
        route: &[Arg],
    ) -> Result<(), CudaError> {
        use Arg::{I, P};
        let c = &self.cfg;
        let DFfn::Moe { gate, up, down, .. } = &self.w.layers[layer].ffn else {
            unreachable!("experts on a dense layer")
        };
        let (h, i, k) = (c.hidden_size, c.expert_ffn, c.n_experts_used);
        let mut a = [P(0); 12];
        let head = [
            P(gate.ptr),
            P(up.ptr),
            P(gate.expert_bytes),
            P(gate.row_bytes),
            P(x),
        ];
        let tail = [P(self.act), I(i as i32), I(h as i32), I(k as i32)];
        let n = head.len() + route.len() + tail.len();
        for (d, s) in a.iter_mut().zip(head.iter().chain(route).chain(&tail)) {
            *d = *s;
        }
        self.dev.launch(gate_up, grid_gu, block, &a[..n])?;
        let head = [
            P(down.ptr),
            P(down.expert_bytes),
            P(down.row_bytes),
            P(self.act),
        ];
        let tail = [P(self.ys), I(h as i32), I(i as i32)];
        let n = head.len() + route.len() + tail.len();
        for (d, s) in a.iter_mut().zip(head.iter().chain(route).chain(&tail)) {
            *d = *s;
        }
        self.dev.launch(down_k, grid_d, block, &a[..n])
    }
}
