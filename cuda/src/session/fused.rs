//! The decode step's fusions (quantised-activation path): node patterns of the one-token
//! graph that one kernel, or a short chain, computes; see [`CudaSession::fused_decode`].
//! A child module of `session`, so it reads the session's fields directly.

use lagoon_core::graph::{Graph, Op};

use super::{CudaSession, NORM_QUANT_MAX, NORM_QUANT_THREADS};
use crate::device::{Arg, MV_MATS, MvMat, blocks};
use crate::error::CudaError;
use crate::manifest::{ActQ, GATE_UP_CLUSTER, K, MERGE_QUANT_THREADS, WType, gate_up_blocks};
use crate::weights::{DFfn, DMat};

/// One product of a run of mat-vecs: the matrix, its output and its residual (0: none).
type Product = (DMat, u64, u64);

/// Lab switch `MV_STAGE` (`LAGOON_CUDA_DEFINES`): 1 (the default) puts a float product with a
/// residual add (the O projection of a W4A16 checkpoint) on `mv_stage_*`, which requests
/// more of each row before its wait and streams the rest through a ring in shared memory; 2
/// also the float products of one input (Q/K/V/gate); 0: neither. Measured on the H200 (S
/// 2.1 W4A16 tg64, session 30): 1 259.9 t/s, 0 248.9; 2 226.4 (with the first, 16-piece
/// stage; not re-measured with the ring. Likely cause, not measured: that launch is several
/// waves of blocks, and the stage's shared memory and registers fit fewer blocks per SM).
fn mv_stage() -> u32 {
    static ON: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        crate::compile::lab_define("MV_STAGE")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1)
    })
}

/// Warps (output rows) of an expert down block (`MV_WARPS` in mmvq.cu): one partial sum of
/// x² per block for `mv_rinv_*`.
const MV_WARPS_ROWS: usize = 4;

/// Rows no wider than this are requested whole before the wait by the plain float mat-vec
/// (`H_BATCH` pieces of 8 a lane, 32 lanes): only wider ones gain from `mv_stage_*`.
const MV_STAGE_MIN_COLS: usize = 8 * 32 * 8;

/// The launch descriptions of up to [`MV_MATS`] products, and how many there are (no
/// allocation: decode steps walk this).
fn mv_mats(mats: &[Product]) -> ([MvMat; MV_MATS], usize) {
    let mut mv = [MvMat {
        w: 0,
        row_bytes: 0,
        rows: 0,
        out: 0,
        res: 0,
    }; MV_MATS];
    for (d, &(m, out, res)) in mv.iter_mut().zip(mats) {
        *d = MvMat {
            w: m.ptr,
            row_bytes: m.row_bytes,
            rows: m.rows,
            out,
            res,
        };
    }
    (mv, mats.len().min(MV_MATS))
}

/// Whether two values of a one-token graph occupy disjoint arena space. The planner lets a
/// value reuse the space of values that died before it was made; in a fused kernel those
/// may still be being read, so a fused output must not overlap a fused input.
fn apart(graph: &Graph, a: usize, b: usize) -> bool {
    let (ra, rb) = (&graph.values[a], &graph.values[b]);
    ra.offset + ra.capacity(1) <= rb.offset || rb.offset + rb.capacity(1) <= ra.offset
}

impl CudaSession {
    /// The arena address of value `v` of `graph`.
    fn at(&self, graph: &Graph, v: usize) -> u64 {
        self.arena + 4 * graph.values[v].offset as u64
    }

    /// Node `i + k` of `graph` for a fusion starting at node `i`: with fusions off only node
    /// `i` itself (the one-node quantised products still run here).
    fn next(&self, graph: &Graph, i: usize, k: usize) -> Option<Op> {
        if k == 0 || self.fuse {
            graph.nodes.get(i + k).copied()
        } else {
            None
        }
    }

    /// Decode-step fusions on the quantised-activation path: recognises, at node `i` of the
    /// one-token graph, a run of nodes that one fused kernel (or a short chain) does, launches
    /// it and returns how many nodes it covered; 0 = none, the node runs on its own. Each
    /// pattern checks that the values it skips are read by nobody else.
    pub(super) fn fused_decode(&self, graph: &Graph, i: usize) -> Result<usize, CudaError> {
        use Arg::{F, I, P};
        let c = &self.cfg;
        let nodes = &graph.nodes;
        let vals = &graph.values;
        let at = |v: usize| self.at(graph, v);
        let once = |v: usize| self.readers[v] == 1;
        let apart = |a: usize, b: usize| apart(graph, a, b);
        let dev = &self.dev;
        let next = |k: usize| self.next(graph, i, k);
        match nodes[i] {
            // QK-norm, RoPE and the KV store.
            Op::RmsNorm {
                x: q,
                w: qw,
                out: qn,
            } => {
                if self.norm_epi.get() == Some(i) {
                    // The expert down kernel before wrote g ∘ x into qn and its partial sums.
                    self.norm_epi.set(None);
                    let (kernel, run, len) = self
                        .norm_epi_run(graph, i)
                        .expect("the experts' fusion checked this norm");
                    let (mv, n) = mv_mats(&run[..len]);
                    dev.mv_rinv(
                        kernel,
                        at(qn),
                        vals[q].cols,
                        &mv[..n],
                        self.norm_part,
                        vals[q].cols / MV_WARPS_ROWS,
                        c.rms_eps,
                    )?;
                    return Ok(1 + len);
                }
                if self.fuse {
                    let used = self.fused_qk_attention(graph, i)?;
                    if used > 0 {
                        return Ok(used);
                    }
                    let used = self.fused_qk(graph, i, 1, &self.readers)?;
                    if used > 0 {
                        return Ok(used);
                    }
                }
                // A whole-row norm whose output feeds quantised products: quantise in the
                // same kernel.
                let g = self.w.vector(qw);
                let cols = vals[q].cols;
                if !self.fuse || g.len != cols || cols > NORM_QUANT_MAX {
                    return Ok(0);
                }
                let fmt = nodes[i + 1..].iter().find_map(|op| match *op {
                    Op::MatMul { x, w, .. } if x == qn => self.act(self.w.mat(w).ty),
                    Op::Experts { layer, x, .. } if x == qn => match &self.w.layers[layer].ffn {
                        DFfn::Moe { gate, .. } => self.act(gate.ty),
                        DFfn::Dense { .. } => None,
                    },
                    _ => None,
                });
                let Some(fmt) = fmt.filter(|f| cols.is_multiple_of(f.block())) else {
                    // Only float products read it (a W4A16 checkpoint's bf16 attention): the
                    // same one-block norm, no quantised copy.
                    let float = nodes[i + 1..].iter().any(|op| {
                        matches!(*op, Op::MatMul { x, w, .. }
                            if x == qn && self.w.mat(w).ty.mvh().is_some())
                    });
                    if !float || !cols.is_multiple_of(4) {
                        return Ok(0);
                    }
                    let used = self.norm_into_products(graph, i)?;
                    if used > 0 {
                        return Ok(used);
                    }
                    dev.launch(
                        K::RmsNormRow,
                        (1, 1),
                        NORM_QUANT_THREADS,
                        &[
                            P(at(q)),
                            P(g.ptr),
                            P(at(qn)),
                            P(0),
                            I(cols as i32),
                            F(c.rms_eps),
                        ],
                    )?;
                    return Ok(1);
                };
                dev.launch(
                    fmt.norm_kernel(),
                    (1, 1),
                    NORM_QUANT_THREADS,
                    &[
                        P(at(q)),
                        P(g.ptr),
                        P(at(qn)),
                        P(self.xq),
                        I(cols as i32),
                        F(c.rms_eps),
                    ],
                )?;
                self.xq_holds.set(Some((qn, fmt)));
                Ok(1)
            }
            Op::MatMul { x, w, out } => {
                let m = self.w.mat(w);
                if m.ty == WType::F32 && m.cols.is_multiple_of(4) {
                    // f32 weights (the router) at batch 1.
                    self.mv_rows(K::MvF32, &m, at(x), at(out))?;
                    return Ok(1);
                }
                // Where the products read their input: quantised into `xq`, or (float
                // weights) the f32 value itself; `same` says which other products can share
                // it, `kernel` gives their mat-vec kernel.
                let quant = self.act(m.ty).zip(self.mvq(m.ty));
                let (mv_k, swiglu_k) = match (quant, m.ty.mvh()) {
                    (Some((_, k)), _) => (k.mv, k.swiglu),
                    (None, Some(k)) if m.cols.is_multiple_of(8) => k,
                    _ => return Ok(0),
                };
                let fmt = quant.map(|(f, _)| f);
                let same = |ty: WType| match fmt {
                    Some(f) => self.act(ty) == Some(f),
                    None => ty.mvh().is_some(),
                };
                let kernel = |ty: WType| match fmt {
                    Some(_) => self.mvq(ty).map_or(mv_k, |kk| kk.mv),
                    None => ty.mvh().map_or(mv_k, |kk| kk.0),
                };
                let input = || -> Result<u64, CudaError> {
                    match fmt {
                        Some(f) => {
                            self.quantize_input(x, at(x), m.cols, f)?;
                            Ok(self.xq)
                        }
                        None => Ok(at(x)),
                    }
                };
                // A float kernel reads x itself while it writes: a fused output made after
                // x's last reader may have been given x's space (the quantised kernels read
                // the copy in xq instead).
                let clear = |v: usize| fmt.is_some() || apart(v, x);
                // Gate and up of a SwiGLU MLP.
                if let (
                    Some(Op::MatMul {
                        x: x2,
                        w: w2,
                        out: o2,
                    }),
                    Some(Op::SwiGlu { gate, up, out: a }),
                ) = (next(1), next(2))
                    && x2 == x
                    && gate == out
                    && up == o2
                    && once(out)
                    && once(o2)
                    && clear(a)
                {
                    let m2 = self.w.mat(w2);
                    if m2.ty == m.ty && m2.rows == m.rows && m2.row_bytes == m.row_bytes {
                        let src = input()?;
                        // The float kernel takes a block per row (its row split over warps).
                        let grid = match fmt {
                            Some(_) => blocks(m.rows, 4),
                            None => m.rows as u32,
                        };
                        dev.launch(
                            swiglu_k,
                            (grid, 1),
                            128,
                            &[
                                P(m.ptr),
                                P(m2.ptr),
                                P(m.row_bytes),
                                P(src),
                                P(at(a)),
                                I(m.rows as i32),
                                I(m.cols as i32),
                            ],
                        )?;
                        return Ok(3);
                    }
                }
                // One product with the residual add after it.
                if let Some(Op::Add { a, b, out: sum }) = next(1)
                    && b == out
                    && once(out)
                    && clear(sum)
                {
                    let src = input()?;
                    let k = match (fmt, m.ty.mvh_stage()) {
                        (None, Some(k)) if mv_stage() >= 1 && m.cols > MV_STAGE_MIN_COLS => k,
                        _ => mv_k,
                    };
                    self.mv(k, src, &[(m, at(sum), at(a))])?;
                    return Ok(2);
                }
                // A run of products of the same input (Q, K, V, gate): one launch per weight
                // type, up to MV_MATS matrices each. (Their outputs are all made while x is
                // still to be read, so none overlaps it.)
                let mut run = [(m, 0u64, 0u64); 8];
                let mut len = 0;
                while len < run.len()
                    && let Some(Op::MatMul {
                        x: xj,
                        w: wj,
                        out: oj,
                    }) = next(len)
                    && xj == x
                    && same(self.w.mat(wj).ty)
                    && self.w.mat(wj).cols.is_multiple_of(8)
                {
                    run[len] = (self.w.mat(wj), at(oj), 0);
                    len += 1;
                }
                // A lone float product too short to fill the device one warp per row (S 2.1's
                // router): a block per row.
                if len == 1
                    && fmt.is_none()
                    && m.rows < 4 * self.sm_count
                    && let Some(split) = m.ty.mvh_split()
                {
                    self.mv_rows(split, &m, at(x), at(out))?;
                    return Ok(1);
                }
                let src = input()?;
                // Two types with a two-type kernel, all in one launch: the first type's
                // products, then the other's.
                if fmt.is_some()
                    && let Some((k2, n_first, group)) = self.mv_pair_run(&run[..len])
                {
                    let (mv, n) = mv_mats(&group[..len]);
                    dev.mv2(k2, src, m.cols, &mv[..n], n_first)?;
                    return Ok(len);
                }
                let mut done = [false; 8];
                for s in 0..len {
                    if done[s] {
                        continue;
                    }
                    let ty = run[s].0.ty;
                    let mut group = [(m, 0u64, 0u64); MV_MATS];
                    let mut g = 0;
                    for t in s..len {
                        if !done[t] && run[t].0.ty == ty && g < MV_MATS {
                            group[g] = run[t];
                            done[t] = true;
                            g += 1;
                        }
                    }
                    let k = match (fmt, ty.mvh_stage()) {
                        (None, Some(k)) if mv_stage() >= 2 && m.cols > MV_STAGE_MIN_COLS => k,
                        _ => kernel(ty),
                    };
                    self.mv(k, src, &group[..g])?;
                }
                Ok(len)
            }
            // Attention with the output gate fused (QK-norm and RoPE ran before it): into the
            // decode kernel's write when there is one split, else into the merge of the splits.
            Op::Attention { .. } => self.fused_attention(graph, i, None),
            Op::Experts {
                layer,
                x,
                ids,
                weights,
                out,
            } => {
                let DFfn::Moe { gate, up, down, .. } = &self.w.layers[layer].ffn else {
                    return Ok(0);
                };
                let (Some(fg), Some(kg), Some(fd), Some(kd)) = (
                    self.act(gate.ty),
                    self.mvq(gate.ty),
                    self.act(down.ty),
                    self.mvq(down.ty),
                ) else {
                    return Ok(0);
                };
                if gate.ty != up.ty {
                    return Ok(0);
                }
                let (h, ffn, k) = (c.hidden_size, c.expert_ffn, c.n_experts_used);
                // The shared expert's MLP and the two adds after the experts, when their
                // types and widths let the expert kernels take them as slot K: of the
                // experts' type, or float matrices beside CT4 experts (`mixed`: the mixed
                // kernels and the shared gate's and down's row bytes).
                let (mut used, mut shared, mut res, mut dst) = (1, None, 0u64, out);
                let (mut mixed, mut mixed_q8) = (None, None);
                if let (
                    Some(Op::MatMul {
                        x: x1,
                        w: w1,
                        out: sg,
                    }),
                    Some(Op::MatMul {
                        x: x2,
                        w: w2,
                        out: su,
                    }),
                    Some(Op::SwiGlu {
                        gate: g3,
                        up: u3,
                        out: sa,
                    }),
                    Some(Op::MatMul {
                        x: x4,
                        w: w4,
                        out: sd,
                    }),
                    Some(Op::Add {
                        a: a5,
                        b: b5,
                        out: f,
                    }),
                ) = (next(1), next(2), next(3), next(4), next(5))
                {
                    let (m1, m2, m4) = (self.w.mat(w1), self.w.mat(w2), self.w.mat(w4));
                    let linked = x1 == x
                        && x2 == x
                        && g3 == sg
                        && u3 == su
                        && x4 == sa
                        && a5 == out
                        && b5 == sd
                        && [out, sg, su, sa, sd].iter().all(|&v| once(v));
                    let same = m1.ty == gate.ty
                        && m2.ty == gate.ty
                        && m4.ty == down.ty
                        && m1.rows == ffn
                        && m1.row_bytes == gate.row_bytes
                        && m4.row_bytes == down.row_bytes;
                    // (The shared activations follow the routed ones in the expert scratch,
                    // which holds 2·k·ffn values at least.)
                    let si = m1.rows;
                    let float_shared = m2.ty == m1.ty
                        && m4.ty == m1.ty
                        && down.ty == gate.ty
                        && (m1.cols, m2.rows, m2.cols) == (h, si, h)
                        && (m4.rows, m4.cols) == (h, si)
                        && m1.row_bytes == m2.row_bytes
                        && si <= k * ffn
                        && h.is_multiple_of(8)
                        && si.is_multiple_of(8);
                    let mixed_k = gate
                        .ty
                        .moe_mixed(m1.ty)
                        .filter(|_| float_shared)
                        .map(|kk| (kk, m1.row_bytes, m4.row_bytes, si));
                    if linked && (same || mixed_k.is_some()) {
                        mixed = mixed_k;
                        mixed_q8 = mixed.and_then(|_| gate.ty.moe_mixed_q8(m1.ty));
                        shared = Some((m1.ptr, m2.ptr, m4.ptr));
                        used = 6;
                        dst = f;
                        if let Some(Op::Add { a, b, out: x2 }) = next(6)
                            && b == f
                            && once(f)
                        {
                            res = at(a);
                            dst = x2;
                            used = 7;
                        }
                    }
                }
                let slots = k + shared.is_some() as usize;
                let (sg, su, sd) = shared.unwrap_or((0, 0, 0));
                self.quantize_input(x, at(x), h, fg)?;
                // The mixed kernels' extra arguments: the shared matrix's row bytes and its
                // f32 input (x for gate/up; the shared expert's SwiGLU row, slot k of act,
                // for down).
                let (gate_up_k, down_k, gu_extra, d_extra, rows) = match mixed {
                    Some(((gu, dk), srow_gu, srow_d, si)) => (
                        gu,
                        dk,
                        [P(srow_gu), P(at(x)), I(si as i32)],
                        [
                            P(srow_d),
                            P(self.act + 4 * (k * ffn) as u64),
                            I(si as i32),
                            P(0),
                            P(0),
                            P(0),
                        ],
                        ffn.max(si),
                    ),
                    None => (
                        kg.gate_up,
                        kd.down,
                        [P(0), P(0), I(0)],
                        [P(0), P(0), I(0), P(0), P(0), P(0)],
                        ffn,
                    ),
                };
                let n_extra = if mixed.is_some() { 3 } else { 0 };
                // The shared expert's gate/up before the kernel's wait (moe_gate_up_q's
                // `early`) when route_block, which waits before it triggers, was the launch
                // before: x's norm has then finished. (Not after a quantiser of x: the shared
                // expert reads what that one writes.)
                let early = I((dev.last_launch() == Some(K::RouteBlock)) as i32);
                let stride = fd.row_stride(ffn);
                // The down kernel: one block per output row, its warps taking `down_rows`
                // experts each and one the shared expert (`moe_down_rows`), where the block
                // fits its 12 warps; else moe_down_q's warp per output row.
                let routed_warps = k.div_ceil(self.down_rows.max(1));
                let warps = routed_warps + (shared.is_some() as usize);
                let down_rows_k = down_k
                    .down_rows()
                    .filter(|_| self.down_rows > 0 && warps <= 12);
                // gate_up_q8: the routed rows quantised in the gate/up kernel's clusters (one
                // Q8_0 group of one slot each, so I a multiple of 32 and whole clusters along
                // x), the down kernel then its `late` form (nothing of the gate/up's read
                // before its wait); no quantiser launch between them.
                let gu_blocks = gate_up_blocks(gate_up_k, rows, h);
                let q8 = mixed_q8.filter(|_| {
                    self.gate_up_q8
                        && fd == ActQ::Q8_0
                        && ffn.is_multiple_of(32)
                        && gu_blocks.is_multiple_of(GATE_UP_CLUSTER)
                        && down_rows_k.is_none()
                });
                let gu_args = [
                    P(gate.ptr),
                    P(up.ptr),
                    P(gate.expert_bytes),
                    P(gate.row_bytes),
                    P(sg),
                    P(su),
                    P(self.xq),
                    P(at(ids)),
                    P(at(weights)),
                    P(self.route_copy),
                    P(self.act),
                    I(ffn as i32),
                    I(h as i32),
                    I(k as i32),
                    early,
                    gu_extra[0],
                    gu_extra[1],
                    gu_extra[2],
                    P(self.actq),
                    P(stride as u64),
                ];
                let (gu_k, n_gu) = match q8 {
                    Some((gq, _)) => (gq, gu_args.len()),
                    None => (gate_up_k, gu_args.len() - 5 + n_extra),
                };
                dev.launch(gu_k, (gu_blocks, slots as u32), 128, &gu_args[..n_gu])?;
                // (A float shared expert's activations stay f32: only the routed rows are
                // quantised.)
                if q8.is_none() {
                    let qrows = if mixed.is_some() { k } else { slots };
                    self.dev
                        .quantize_act(fd, self.act, self.actq, ffn, stride, qrows)?;
                }
                let d_args = [
                    P(down.ptr),
                    P(down.expert_bytes),
                    P(down.row_bytes),
                    P(sd),
                    P(self.actq),
                    P(stride as u64),
                    P(self.route_copy),
                    P(self.route_copy + 4 * k as u64),
                    P(res),
                    P(at(dst)),
                    I(h as i32),
                    I(ffn as i32),
                    I(k as i32),
                    F(c.routed_scaling),
                    d_extra[0],
                    d_extra[1],
                    d_extra[2],
                    d_extra[3],
                    d_extra[4],
                    d_extra[5],
                ];
                // The mixed down kernel adds its float shared expert's term before its wait:
                // the launch before it must wait before it triggers (the quantiser does), or
                // it is the late form.
                debug_assert!(
                    q8.is_some() || dev.last_launch().is_some_and(K::waits_then_triggers)
                );
                match down_rows_k {
                    Some(rk) => dev.launch(
                        rk,
                        (h as u32, 1),
                        32 * warps as u32,
                        &d_args[..d_args.len() - 6 + n_extra],
                    )?,
                    None => {
                        // NORM_EPI: the mixed kernel also writes g ∘ x and its blocks' sums
                        // of x² for the products after the next norm, which then needs no
                        // launch of its own (`mv_rinv_multi`).
                        // (used == 7: the residual add was taken, next(6) is it.)
                        let mut d_args = d_args;
                        let n = d_args.len();
                        if mixed.is_some()
                            && used == 7
                            && h.is_multiple_of(MV_WARPS_ROWS)
                            && let Some(&Op::RmsNorm {
                                x: nx,
                                w: nw,
                                out: qn,
                            }) = nodes.get(i + used)
                            && nx == dst
                            && apart(qn, dst)
                            && let Some(Op::Add { a, .. }) = next(6)
                            && apart(qn, a)
                            && self.norm_epi_run(graph, i + used).is_some()
                        {
                            d_args[n - 3] = P(self.w.vector(nw).ptr);
                            d_args[n - 2] = P(at(qn));
                            d_args[n - 1] = P(self.norm_part);
                            self.norm_epi.set(Some(i + used));
                        }
                        // The mixed kernel takes all six extra arguments (NORM_EPI's three
                        // null when unused), the single-type one none.
                        let n = if mixed.is_some() { n } else { n - 6 };
                        let dk = q8.map_or(down_k, |(_, late)| late);
                        dev.launch(dk, (blocks(h, 4), 1), 128, &d_args[..n])?
                    }
                }
                Ok(used)
            }
            _ => Ok(0),
        }
    }

    /// The decode step's attention at node `i` with the output gate after it fused: into the
    /// attention kernel's write when there is one split, else into the merge of the splits
    /// (and the output projection's quantiser with it). `qk`: the QK-norm, RoPE and KV-store
    /// nodes before node `i`, done by the attention kernel itself (`attention_decode_qk`);
    /// None: they ran already. Returns the nodes covered from `i` (2), or 0 with nothing
    /// launched.
    pub(super) fn fused_attention(
        &self,
        graph: &Graph,
        i: usize,
        qk: Option<super::qk_fusion::QkFusion>,
    ) -> Result<usize, CudaError> {
        use Arg::{I, P};
        let c = &self.cfg;
        let d = c.head_dim;
        let dev = &self.dev;
        let nodes = &graph.nodes;
        let vals = &graph.values;
        let at = |v: usize| self.at(graph, v);
        let once = |v: usize| self.readers[v] == 1;
        let apart = |a: usize, b: usize| apart(graph, a, b);
        let next = |k: usize| self.next(graph, i, k);
        let Op::Attention { layer, q, out } = nodes[i] else {
            return Ok(0);
        };
        let split = self.splits[layer];
        let Some(Op::GateMul { o, g, out: og }) = next(1) else {
            return Ok(0);
        };
        if o != out || !once(out) || !self.decode_attention(1) {
            return Ok(0);
        }
        let hq = c.n_heads[layer];
        let gcols = vals[g].cols;
        // One kernel reads q (and with qk k and v) and writes og: og must not overlap another
        // head's q, nor k or v.
        let (qin, kv_in) = match qk {
            Some(f) => (f.q, Some((f.k, f.v))),
            None => (q, None),
        };
        let qk_ptrs = qk.map(|f| (f, at(f.k), at(f.v)));
        let clear = (apart(og, qin) || vals[og].offset == vals[qin].offset)
            && kv_in.is_none_or(|(k, v)| apart(og, k) && apart(og, v));
        if split < 2 && clear {
            self.decode_attention_qk(layer, qk_ptrs, at(qin), at(og), 1, Some((at(g), gcols)))?;
            return Ok(2);
        }
        if split < 2 {
            return Ok(0);
        }
        self.decode_attention_qk(layer, qk_ptrs, at(qin), at(out), split, None)?;
        // The output projection's quantiser in the merge, when the product after it
        // reads og quantised.
        let quant = match next(2) {
            Some(Op::MatMul { x, w, .. }) if x == og && self.fuse => {
                let m = self.w.mat(w);
                match (self.act(m.ty), self.mvq(m.ty)) {
                    (Some(fmt), Some(_)) if (hq * d).is_multiple_of(fmt.block()) => {
                        fmt.merge_heads(d).map(|g| (fmt, g))
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some((fmt, heads)) = quant {
            dev.launch(
                fmt.merge_gate_kernel(),
                ((hq / heads) as u32, 1),
                MERGE_QUANT_THREADS,
                &[
                    P(self.part),
                    P(at(g)),
                    P(at(og)),
                    P(self.xq),
                    I(hq as i32),
                    I(d as i32),
                    I(split as i32),
                    I(gcols as i32),
                    I(heads as i32),
                ],
            )?;
            self.xq_holds.set(Some((og, fmt)));
            return Ok(2);
        }
        dev.launch(
            K::AttentionMergeGate,
            (hq as u32, 1),
            128,
            &[
                P(self.part),
                P(at(g)),
                P(at(og)),
                I(hq as i32),
                I(d as i32),
                I(split as i32),
                I(gcols as i32),
            ],
        )?;
        Ok(2)
    }

    /// `MV_NORM_FUSE=1` (lab switch, `LAGOON_CUDA_DEFINES`, read here once; off, measured
    /// 8% slower: `mmvq.cu`): the whole-row RMSNorm at node `i` done by the float products
    /// of its output that follow it (`mmvq.cu`'s `mv_norm_*`: a W4A16 checkpoint's bf16
    /// Q/K/V/gate), when they are that output's only readers and fit one launch; the norm's
    /// output is then never made. Returns the nodes covered, 0 with nothing launched.
    fn norm_into_products(&self, graph: &Graph, i: usize) -> Result<usize, CudaError> {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let on = *ON
            .get_or_init(|| crate::compile::lab_define("MV_NORM_FUSE").is_some_and(|v| v != "0"));
        let Op::RmsNorm { x, w, out: qn } = graph.nodes[i] else {
            return Ok(0);
        };
        let g = self.w.vector(w);
        let cols = graph.values[x].cols;
        // (The caller has checked that fusions are on and the gain spans the row.)
        if !on || !cols.is_multiple_of(8) {
            return Ok(0);
        }
        // (The kernel reads x while it writes the products' outputs.)
        let Some((kernel, run, len)) = self.float_run(graph, i, qn, WType::mvh_norm, |m, oj| {
            m.cols == cols && apart(graph, oj, x)
        }) else {
            return Ok(0);
        };
        let (mv, n) = mv_mats(&run[..len]);
        self.dev.mv_norm(
            kernel,
            self.at(graph, x),
            cols,
            &mv[..n],
            g.ptr,
            self.cfg.rms_eps,
        )?;
        Ok(1 + len)
    }

    /// [`super::CudaSessionOptions::norm_epilogue`] (`mmvq.cu`'s `mv_rinv_multi`): the RMSNorm
    /// at node `j` split between the expert down kernel that wrote its input and the float
    /// products after it. Some((kernel, run, len)) when that can be done: the option on, a
    /// gain spanning a row of at most 4,096 (a multiple of 64: the down kernel's blocks of
    /// four rows give the partial sums, `mv_rinv_multi` takes them a quarter a warp in
    /// float4s), and its output read by a run of 2 to [`MV_MATS`] float products of one
    /// `mv_rinv_*` kernel and by nothing else (the attention's Q/K/V/gate; not the lm_head's
    /// lone product).
    fn norm_epi_run(&self, graph: &Graph, j: usize) -> Option<(K, [Product; MV_MATS], usize)> {
        if !self.norm_epilogue || !self.fuse {
            return None;
        }
        let Some(&Op::RmsNorm { x, w, out: qn }) = graph.nodes.get(j) else {
            return None;
        };
        let cols = graph.values[x].cols;
        if self.w.vector(w).len != cols
            || !cols.is_multiple_of(64)
            || cols / MV_WARPS_ROWS > super::NORM_PART_MAX
        {
            return None;
        }
        let (kernel, run, len) = self.float_run(graph, j, qn, WType::mvh_rinv, |m, _| {
            m.cols == cols && m.cols.is_multiple_of(8)
        })?;
        (len >= 2).then_some((kernel, run, len))
    }

    /// The float products that follow node `i` and read `qn`: at most [`MV_MATS`] of one
    /// kernel (`kernel_of` their type), each passing `ok(matrix, output value)`, with that
    /// kernel; None where one fails `ok`, none follows, or `qn` has other readers.
    fn float_run(
        &self,
        graph: &Graph,
        i: usize,
        qn: usize,
        kernel_of: impl Fn(WType) -> Option<K>,
        ok: impl Fn(&DMat, usize) -> bool,
    ) -> Option<(K, [Product; MV_MATS], usize)> {
        let Some(Op::MatMul { w: w0, .. }) = self.next(graph, i, 1) else {
            return None;
        };
        let mut run = [(self.w.mat(w0), 0u64, 0u64); MV_MATS];
        let (mut len, mut kernel) = (0, None);
        while len < MV_MATS
            && let Some(Op::MatMul {
                x: xj,
                w: wj,
                out: oj,
            }) = self.next(graph, i, len + 1)
            && xj == qn
        {
            let m = self.w.mat(wj);
            let Some(k) = kernel_of(m.ty).filter(|&k| kernel.is_none_or(|kk| kk == k)) else {
                break;
            };
            if !ok(&m, oj) {
                return None;
            }
            kernel = Some(k);
            run[len] = (m, self.at(graph, oj), 0);
            len += 1;
        }
        let kernel = kernel?;
        (self.readers[qn] as usize == len).then_some((kernel, run, len))
    }

    /// A run of products of one input (`(matrix, out, residual)`) that one `mv2_*` kernel
    /// takes: at most [`MV_MATS`] products in exactly two weight types with a two-type kernel
    /// ([`WType::mv_pair`], either order), with [`CudaSession::mv_pairs`] on. Returns the
    /// kernel, how many products of its first type lead, and the run in that order.
    fn mv_pair_run(&self, run: &[Product]) -> Option<(K, usize, [Product; MV_MATS])> {
        if !self.mv_pairs || run.len() < 2 || run.len() > MV_MATS {
            return None;
        }
        let a = run[0].0.ty;
        let b = run.iter().map(|r| r.0.ty).find(|&t| t != a)?;
        if run.iter().any(|r| r.0.ty != a && r.0.ty != b) {
            return None;
        }
        let (first, k) = match (a.mv_pair(b), b.mv_pair(a)) {
            (Some(k), _) => (a, k),
            (None, Some(k)) => (b, k),
            (None, None) => return None,
        };
        let mut out = [run[0]; MV_MATS];
        let mut n = 0;
        for r in run.iter().filter(|r| r.0.ty == first) {
            out[n] = *r;
            n += 1;
        }
        let n_first = n;
        for r in run.iter().filter(|r| r.0.ty != first) {
            out[n] = *r;
            n += 1;
        }
        Some((k, n_first, out))
    }

    /// A float mat-vec with one block per row (`mv_f32`, `mv_split_*`): `out = m · x`.
    fn mv_rows(&self, kernel: K, m: &DMat, x: u64, out: u64) -> Result<(), CudaError> {
        use Arg::{I, P};
        self.dev.launch(
            kernel,
            (m.rows as u32, 1),
            128,
            &[
                P(m.ptr),
                P(m.row_bytes),
                P(x),
                P(out),
                I(m.rows as i32),
                I(m.cols as i32),
            ],
        )
    }

    /// Launches `kernel` (an `mv_*`) for up to [`MV_MATS`] products `(matrix, out, residual
    /// or 0)` of the input at `src` (the quantised `xq`, or a float product's f32 input).
    fn mv(&self, kernel: K, src: u64, mats: &[(DMat, u64, u64)]) -> Result<(), CudaError> {
        let (mv, n) = mv_mats(mats);
        self.dev.mv(kernel, src, mats[0].0.cols, &mv[..n])
    }
    /// [`WType::act`] as this session uses it: the grid IQ types take the quantised path
    /// only with [`crate::CudaSessionOptions::grid_iq_mvq`], Q5_K and IQ4_XS only with
    /// [`crate::CudaSessionOptions::q5k_iq4xs_mvq`].
    pub(super) fn act(&self, ty: WType) -> Option<ActQ> {
        if matches!(ty, WType::Iq3Xxs | WType::Iq2Xxs | WType::Iq2S) && !self.grid_iq_mvq {
            return None;
        }
        if matches!(ty, WType::Q5K | WType::Iq4Xs) && !self.q5k_iq4xs_mvq {
            return None;
        }
        ty.act()
    }

    /// [`WType::mvq`] for the types [`CudaSession::act`] quantises for.
    pub(super) fn mvq(&self, ty: WType) -> Option<crate::manifest::MvqKernels> {
        self.act(ty)?;
        ty.mvq()
    }

    /// Quantises the one-token value `v` (at `ptr`, `cols` wide) into the `xq` scratch in
    /// format `fmt`, unless the scratch already holds it (consecutive products of one input).
    pub(super) fn quantize_input(
        &self,
        v: usize,
        ptr: u64,
        cols: usize,
        fmt: ActQ,
    ) -> Result<(), CudaError> {
        if self.xq_holds.get() == Some((v, fmt)) {
            return Ok(());
        }
        self.dev
            .quantize_act(fmt, ptr, self.xq, cols, fmt.row_stride(cols), 1)?;
        self.xq_holds.set(Some((v, fmt)));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_graphs::{each_fixture, overlap, span};
    use lagoon_core::graph::Op;

    /// The decode fusions of float products (`fused.rs`: a product with the residual add
    /// after it, a SwiGLU MLP's gate, up and SwiGLU) read the product's input x itself while
    /// writing the later node's output: on the fixture graphs, decode and prefill, that output
    /// never overlaps x (without the planner's FUSE_SLACK most did).
    #[test]
    fn float_fusion_outputs_never_overlap_their_input() {
        each_fixture(|model, c, build| {
            for max in [1, 40] {
                let g = build(max);
                let overlap = |a, b| overlap(&g, a, b, max);
                let (mut adds, mut swiglus) = (0, 0);
                for i in 0..g.nodes.len() - 2 {
                    if let (Op::MatMul { x, out, .. }, Op::Add { b, out: sum, .. }) =
                        (g.nodes[i], g.nodes[i + 1])
                        && b == out
                    {
                        assert!(!overlap(sum, x), "{model} max {max}: add at node {}", i + 1);
                        adds += 1;
                    }
                    if let (
                        Op::MatMul { x, .. },
                        Op::MatMul { x: x2, .. },
                        Op::SwiGlu { out: a, .. },
                    ) = (g.nodes[i], g.nodes[i + 1], g.nodes[i + 2])
                        && x == x2
                    {
                        assert!(
                            !overlap(a, x),
                            "{model} max {max}: SwiGLU at node {}",
                            i + 2
                        );
                        swiglus += 1;
                    }
                }
                assert!(
                    adds >= c.n_layers && swiglus >= 1,
                    "{model}: {adds} adds, {swiglus} SwiGLUs"
                );
            }
        });
    }

    /// The expert kernels with the shared expert fused (`Op::Experts` arm: same-type or
    /// `moe_*_mixed`) run the shared MLP and both adds in the down kernel, whose warps each
    /// read the residual's element r and write the sum's element r: the sum must be the
    /// residual's own space or lie apart from it (a shifted overlap would let one warp write
    /// an element another has still to read). The gate/up kernel writes only the expert
    /// scratch, so its inputs need no check. On the fixture graphs, decode and prefill.
    #[test]
    fn fused_expert_sums_never_shift_over_the_residual() {
        each_fixture(|model, _c, build| {
            for max in [1, 40] {
                let g = build(max);
                let mut seen = 0;
                for i in 0..g.nodes.len().saturating_sub(6) {
                    let (
                        Op::Experts { out, .. },
                        Op::Add { a, b, out: f },
                        Op::Add {
                            a: r,
                            b: f2,
                            out: x2,
                        },
                    ) = (g.nodes[i], g.nodes[i + 5], g.nodes[i + 6])
                    else {
                        continue;
                    };
                    if a != out || b == out || f2 != f {
                        continue;
                    }
                    let (rs, xs) = (span(&g, r, max), span(&g, x2, max));
                    assert!(
                        rs == xs || !overlap(&g, r, x2, max),
                        "{model} max {max}: node {}: sum {xs:?} over residual {rs:?}",
                        i + 6
                    );
                    seen += 1;
                }
                assert!(seen >= 1, "{model}: no fused-expert pattern found");
            }
        });
    }
}
