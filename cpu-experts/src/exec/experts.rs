//! The routed experts of one MoE layer (`Op::Experts`), for one token (decode) or a ubatch
//! (prefill), on the reference path (weights decoded to f32) and the fast path (quantised
//! activations, the kernel table's several-token kernels).
//!
//! Both paths share one shape (learned from ggml's `ggml_compute_forward_mul_mat_id` in
//! `ggml/src/ggml-cpu/ggml-cpu.c`, which also groups a batch's rows by expert first):
//!
//! 1. **Group** (single-threaded, O(n·k + E)): the (token, slot) pairs are counting-sorted by
//!    expert id, ascending, tokens ascending within an expert; each pair keeps its routing
//!    weight, so the router's output is not read again.
//! 2. **Gather** (fast path, prefill only, on the pool): each token's row is quantised once
//!    and copied to the positions of its pairs, so that an expert's tokens are contiguous.
//! 3. **Gate/up** (one dispatch): work items are (expert, tile of rows: 16, up to 64 at one
//!    token, `super::row_tile`); an item dots its tile of `gate` and `up` with all of the
//!    expert's tokens at once (the
//!    four-token kernels read each weight block once per four tokens). The thread that
//!    finishes an expert's last tile applies SwiGLU to the expert's rows and quantises them
//!    for `down`, inside the same dispatch.
//! 4. **Down** (one dispatch): work items are tiles of output rows; an item zeroes its rows,
//!    adds every expert's weighted contribution in ascending expert order, then scales by
//!    `routed_scaling`. At one token the items are (pair or shared expert, tile of rows)
//!    instead, each streaming one matrix (`down_one_token`), and the calling thread forms the
//!    same weighted sum, in the same order, after the dispatch.
//!
//! The layer's shared expert, where the graph follows the routed experts with it (see
//! `shared_tail` in the walker), runs in the same two dispatches: its gate/up tiles are the
//! first items of step 3 and its `down` rows are computed by step-4 items,
//! so one MoE block costs two dispatches instead of four.
//!
//! Every output element is computed by one fixed sequence of operations whatever the thread
//! count and the batch size: a token's result in a prefill step is bit-identical to the same
//! token alone (the several-token kernels are bit-identical per token to the one-token ones),
//! and the summation order over experts is transformers' `LagunaExperts.forward` order.

use core::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use alloc::vec;
use alloc::vec::Vec;

use lagoon_core::ops;
use lagoon_core::weights::MatRef;

use super::{CLAIMS_PER_THREAD, ThreadScratch, aligned_rows, aligned_rows_bytes, row_tile};
use crate::kernels::{ActFormat, Kernels, act};
use crate::pool::{Dynamic, SharedOut, ThreadPool};

/// Claims per thread in the gate/up dispatch, whose items vary in cost.
const FINE_CLAIMS_PER_THREAD: usize = 64;

/// One routed (token, slot) pair: the token and its routing weight.
#[derive(Clone, Copy, Debug, Default)]
struct Pair {
    t: u32,
    w: f32,
}

/// The pairs of one active expert: `pairs[j0..j0 + m]`.
#[derive(Clone, Copy, Debug)]
struct Group {
    e: u32,
    j0: u32,
    m: u32,
}

/// Buffers of the expert layer, sized once for `ubatch · k` pairs.
#[derive(Debug)]
pub struct ExpertScratch {
    /// Per expert: pair counts, then start offsets, then insertion cursors (`E + 1`).
    counts: Vec<u32>,
    pairs: Vec<Pair>,
    /// Position in `pairs` of (token t, slot s) at `t·k + s`; `u32::MAX` for an invalid id.
    slot_pos: Vec<u32>,
    groups: Vec<Group>,
    /// Gate/up tiles finished per group, then for the shared expert (the last finisher
    /// runs SwiGLU).
    done: Vec<AtomicU32>,
    /// Gate (then the SwiGLU activation) and up rows of every pair: `[pairs, I]` each.
    eg: Vec<f32>,
    eu: Vec<f32>,
    /// One token's `down` rows per pair, `[k, H]`, before their weighted sum (decode).
    ey: Vec<f32>,
    /// The tokens' quantised rows (gate's format), the same rows gathered by pair, the
    /// pairs' rows for `up` when it wants another format, and the pairs' quantised
    /// activation rows for `down`.
    act_t: Vec<u8>,
    act_g: Vec<u8>,
    act_u: Vec<u8>,
    act_d: Vec<u8>,
    /// Shared expert run with the routed ones: gate (then activation) and up rows
    /// `[tokens, I_shared]`, the activation quantised for its `down`, and its output
    /// `[tokens, H]`.
    sg: Vec<f32>,
    su: Vec<f32>,
    act_sd: Vec<u8>,
    sd: Vec<f32>,
    /// The tokens' rows quantised for the shared expert's gate/up where they want another
    /// format than the routed experts' gate (e.g. Q8_0 shared rows beside IQ3_XXS experts,
    /// which take Q8_K), `[tokens, row bytes]`.
    act_ts: Vec<u8>,
    /// Tokens the shared expert's buffers hold.
    tokens: usize,
}

/// Expert 0's matrices of one MoE layer and its shared expert's, for sizing buffers.
pub struct LayerShapes<'a> {
    pub gate: &'a MatRef<'a>,
    pub up: &'a MatRef<'a>,
    pub down: &'a MatRef<'a>,
    pub shared: Option<[&'a MatRef<'a>; 3]>,
}

/// Activation row bytes one layer's experts need (fast path): gate, up (0 when equal to
/// gate's format), down.
fn row_bytes(k: &Kernels, gate: &MatRef<'_>, up: &MatRef<'_>, down: &MatRef<'_>) -> [usize; 3] {
    let (fg, fu, fd) = (k.act_format(gate), k.act_format(up), k.act_format(down));
    [
        Kernels::act_row_bytes(fg, gate.cols),
        if fu == fg {
            0
        } else {
            Kernels::act_row_bytes(fu, up.cols)
        },
        Kernels::act_row_bytes(fd, down.cols),
    ]
}

impl ExpertScratch {
    /// For up to `max_tokens` tokens routed to `k` of `n_experts` experts of width
    /// `expert_ffn`; `layers` describes every MoE layer, to size the quantised rows and the
    /// shared expert's buffers (`kernels`: the fast path's table, `None` for the reference).
    pub fn new<'a>(
        kernels: Option<&Kernels>,
        max_tokens: usize,
        k: usize,
        n_experts: usize,
        expert_ffn: usize,
        layers: impl Iterator<Item = LayerShapes<'a>>,
    ) -> ExpertScratch {
        let pairs = if n_experts > 0 && k > 0 {
            max_tokens * k
        } else {
            0
        };
        let (mut rb, mut h, mut sh_ffn, mut rb_sd, mut rb_ts) = ([0usize; 3], 0, 0, 0, 0);
        for l in layers {
            h = h.max(l.gate.cols);
            if let Some([sg, _, sd]) = l.shared {
                sh_ffn = sh_ffn.max(sg.rows);
                rb_sd = rb_sd.max(kernels.map_or(0, |kern| {
                    Kernels::act_row_bytes(kern.act_format(sd), sd.cols)
                }));
                rb_ts = rb_ts.max(kernels.map_or(0, |kern| {
                    let f = kern.act_format(sg);
                    if f == kern.act_format(l.gate) {
                        0
                    } else {
                        Kernels::act_row_bytes(f, sg.cols)
                    }
                }));
            }
            if let Some(kern) = kernels {
                let r = row_bytes(kern, l.gate, l.up, l.down);
                for (a, b) in rb.iter_mut().zip(r) {
                    *a = (*a).max(b);
                }
            }
        }
        let tokens = if sh_ffn > 0 { max_tokens } else { 0 };
        ExpertScratch {
            counts: vec![0; n_experts + 1],
            pairs: Vec::with_capacity(pairs),
            slot_pos: vec![0; pairs],
            groups: Vec::with_capacity(n_experts),
            done: (0..n_experts + 1).map(|_| AtomicU32::new(0)).collect(),
            eg: vec![0.0; pairs * expert_ffn],
            eu: vec![0.0; pairs * expert_ffn],
            ey: vec![0.0; if pairs > 0 { k * h } else { 0 }],
            act_t: vec![0; aligned_rows_bytes(max_tokens, rb[0])],
            act_g: vec![0; aligned_rows_bytes(pairs, rb[0])],
            act_u: vec![0; aligned_rows_bytes(pairs, rb[1])],
            act_d: vec![0; aligned_rows_bytes(pairs, rb[2])],
            sg: vec![0.0; tokens * sh_ffn],
            su: vec![0.0; tokens * sh_ffn],
            act_sd: vec![0; aligned_rows_bytes(tokens, rb_sd)],
            sd: vec![0.0; tokens * h],
            act_ts: vec![0; aligned_rows_bytes(tokens, rb_ts)],
            tokens,
        }
    }

    /// Counting-sorts the pairs of `n` tokens by expert (ascending id, then token, then
    /// slot). Ids outside `0..E` are dropped (the router never produces them).
    fn group(&mut self, ids: &[f32], ws: &[f32], n: usize, k: usize) {
        let n_experts = self.counts.len() - 1;
        self.counts.fill(0);
        for id in &ids[..n * k] {
            let e = id.to_bits() as usize;
            if e < n_experts {
                self.counts[e + 1] += 1;
            }
        }
        for e in 0..n_experts {
            self.counts[e + 1] += self.counts[e];
        }
        self.groups.clear();
        for e in 0..n_experts {
            let (j0, j1) = (self.counts[e], self.counts[e + 1]);
            if j1 > j0 {
                self.groups.push(Group {
                    e: e as u32,
                    j0,
                    m: j1 - j0,
                });
            }
        }
        self.pairs.clear();
        self.pairs
            .resize(self.counts[n_experts] as usize, Pair::default());
        for (p, (id, &w)) in ids[..n * k].iter().zip(&ws[..n * k]).enumerate() {
            let e = id.to_bits() as usize;
            if e < n_experts {
                let j = self.counts[e];
                self.counts[e] += 1;
                self.pairs[j as usize] = Pair {
                    t: (p / k) as u32,
                    w,
                };
                self.slot_pos[p] = j;
            } else {
                self.slot_pos[p] = u32::MAX;
            }
        }
    }
}

/// The matrices of one layer's routed experts.
#[derive(Clone, Copy)]
pub struct ExpertMats<'a> {
    pub gate: &'a [MatRef<'a>],
    pub up: &'a [MatRef<'a>],
    pub down: &'a [MatRef<'a>],
}

/// Where a projection's input rows come from.
#[derive(Clone, Copy)]
enum Src<'a> {
    /// f32 rows of `cols`: the pair's token's row of `x` (`by_token`) or the pair's own row.
    F32 {
        x: &'a [f32],
        cols: usize,
        by_token: bool,
    },
    /// Quantised rows of `ab` bytes, one per pair (`stride = ab`) or one shared by all
    /// (`stride = 0`, decode).
    Act {
        k: &'a Kernels,
        act: &'a [u8],
        ab: usize,
        stride: usize,
    },
}

/// `y[jj][i] = mat[r0 + i] · input(pair j0 + jj)` for `i < nr`, `jj < m`, handed to `emit`
/// one pair at a time (in pair order), computed in chunks that fit the thread's tile.
#[allow(clippy::too_many_arguments)]
fn project(
    src: Src<'_>,
    pairs: &[Pair],
    mat: &MatRef<'_>,
    r0: usize,
    nr: usize,
    j0: usize,
    m: usize,
    sc: &mut ThreadScratch,
    mut emit: impl FnMut(usize, &[f32]),
) {
    let ThreadScratch { row, tile, .. } = sc;
    let cap = (tile.len() / nr).max(1);
    let mut c0 = 0;
    while c0 < m {
        let mc = (m - c0).min(cap);
        let y = &mut tile[..mc * nr];
        let j = j0 + c0;
        match src {
            Src::Act { k, act, ab, stride } => {
                let a = &act[j * stride..j * stride + (mc - 1) * stride + ab];
                k.dot_rows_multi(mat, r0, nr, a, stride, mc, y, nr);
            }
            Src::F32 { x, cols, by_token } => {
                let row = &mut row[..cols];
                for i in 0..nr {
                    mat.dequant_row(r0 + i, row);
                    for jj in 0..mc {
                        let xr = if by_token {
                            pairs[j + jj].t as usize
                        } else {
                            j + jj
                        };
                        y[jj * nr + i] = ops::dot(&x[xr * cols..(xr + 1) * cols], row);
                    }
                }
            }
        }
        for jj in 0..mc {
            emit(c0 + jj, &y[jj * nr..(jj + 1) * nr]);
        }
        c0 += mc;
    }
}

/// Everything one call of [`run`] works with besides the inputs.
pub(crate) struct Ctx<'a> {
    pub kernels: Option<&'a Kernels>,
    pub pool: &'a ThreadPool,
    pub threads: &'a [Mutex<ThreadScratch>],
    pub es: &'a mut ExpertScratch,
}

/// A layer's shared expert, run inside the routed experts' two dispatches:
/// `sd = down(silu(gate · x) ⊙ (up · x))` for every token.
#[derive(Clone, Copy)]
pub(crate) struct SharedMats<'a> {
    pub gate: &'a MatRef<'a>,
    pub up: &'a MatRef<'a>,
    pub down: &'a MatRef<'a>,
}

impl SharedMats<'_> {
    /// Whether this shared expert can run with `gate0`'s routed experts: the same input
    /// width and, on the fast path, one activation format for its gate and up (the routed
    /// gate's, whose quantised tokens then serve it, or another one that the scratch has
    /// room for, `act_ts`).
    pub(crate) fn fits(
        &self,
        kernels: Option<&Kernels>,
        gate0: &MatRef<'_>,
        es: &ExpertScratch,
    ) -> bool {
        let g = self.gate;
        let shape = g.cols == gate0.cols
            && self.up.cols == g.cols
            && self.up.rows == g.rows
            && self.down.cols == g.rows
            && self.down.rows == g.cols
            && es.sg.len() >= es.act_t_rows() * g.rows
            && es.sd.len() >= es.act_t_rows() * g.cols
            && es.act_t_rows() > 0;
        let fmt = kernels.is_none_or(|k| {
            let f = k.act_format(g);
            let own = Kernels::act_row_bytes(f, g.cols);
            k.act_format(self.up) == f
                && (f == k.act_format(gate0) || es.act_ts.len() >= es.act_t_rows() * own)
                && es.act_sd.len()
                    >= es.act_t_rows() * Kernels::act_row_bytes(k.act_format(self.down), g.rows)
        });
        shape && fmt
    }
}

impl ExpertScratch {
    /// Tokens the shared-expert buffers hold (0 when no layer has a shared expert).
    fn act_t_rows(&self) -> usize {
        self.tokens
    }

    /// The shared expert's output of the last [`run`], `[n, H]`.
    pub(crate) fn shared_out(&self, n: usize, h: usize) -> &[f32] {
        &self.sd[..n * h]
    }
}

/// `o[t] = scaling · Σ_slots w[t, s] · expert_{ids[t, s]}(xs[t])` for `n` tokens of `h`
/// (`ids` hold u32 bits, `k` per token). With `shared`, the shared expert runs in the same
/// two dispatches; its output is left in the scratch ([`ExpertScratch::shared_out`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    cx: Ctx<'_>,
    mats: ExpertMats<'_>,
    shared: Option<SharedMats<'_>>,
    xs: &[f32],
    ids: &[f32],
    ws: &[f32],
    k: usize,
    scaling: f32,
    n: usize,
    o: &mut [f32],
) {
    let Ctx {
        kernels,
        pool,
        threads,
        es,
    } = cx;
    let ExpertMats { gate, up, down } = mats;
    let (Some(g0), Some(u0), Some(d0)) = (gate.first(), up.first(), down.first()) else {
        o.fill(0.0);
        return;
    };
    let (h, i) = (g0.cols, g0.rows);
    es.group(ids, ws, n, k);
    let ExpertScratch {
        pairs,
        slot_pos,
        groups,
        done,
        eg,
        eu,
        ey,
        act_t,
        act_g,
        act_u,
        act_d,
        sg,
        su,
        act_sd,
        sd,
        act_ts,
        ..
    } = es;
    let sh = shared;
    let nt = pool.n_threads();

    // Inputs of gate/up: quantised (and gathered by pair, for more than one token), or f32.
    let (src_g, src_u, src_sh) = match kernels {
        None => {
            let x = Src::F32 {
                x: xs,
                cols: h,
                by_token: true,
            };
            let tok = Src::F32 {
                x: xs,
                cols: h,
                by_token: false,
            };
            (x, x, tok)
        }
        Some(kern) => {
            let [ab_g, ab_u, _] = row_bytes(kern, g0, u0, d0);
            let (fg, fu) = (kern.act_format(g0), kern.act_format(u0));
            // Where the rows go (`aligned_rows`): token rows in act_t, pair rows in act_g and
            // act_u; one token: every pair reads the token's row (stride 0).
            let np = pairs.len();
            let (ot, st_t) = aligned_rows(act_t, ab_g, n);
            let (og, st_g) = aligned_rows(act_g, ab_g, np);
            let (ou, st_u) = aligned_rows(act_u, ab_u, np);
            if n == 1 {
                kern.quantize_act(fg, &xs[..h], &mut act_t[..ab_g]);
                if ab_u > 0 {
                    kern.quantize_act(fu, &xs[..h], &mut act_u[..ab_u]);
                }
            } else {
                let g = (fg, ab_g, &mut act_t[ot..], st_t, &mut act_g[og..], st_g);
                let u = (fu, ab_u, &mut act_u[ou..], st_u);
                gather(kern, pool, g, u, slot_pos, xs, h, k, n);
            }
            let (pair_rows, st_g, pair_u, st_u) = if n == 1 {
                (&act_t[..], 0, &act_u[..], 0)
            } else {
                (&act_g[og..], st_g, &act_u[ou..], st_u)
            };
            let src_g = Src::Act {
                k: kern,
                act: pair_rows,
                ab: ab_g,
                stride: st_g,
            };
            let src_u = if ab_u == 0 {
                src_g
            } else {
                Src::Act {
                    k: kern,
                    act: pair_u,
                    ab: ab_u,
                    stride: st_u,
                }
            };
            // The shared expert reads the tokens' rows in the routed gate's format, or its own
            // (quantised here, once per token).
            let fs = sh.map_or(fg, |m| kern.act_format(m.gate));
            let src_sh = if fs == fg {
                Src::Act {
                    k: kern,
                    act: &act_t[ot..],
                    ab: ab_g,
                    stride: st_t,
                }
            } else {
                let (rows, stride) = super::quantize_rows(kern, pool, fs, xs, n, h, act_ts);
                Src::Act {
                    k: kern,
                    act: rows,
                    ab: Kernels::act_row_bytes(fs, h),
                    stride,
                }
            };
            (src_g, src_u, src_sh)
        }
    };

    // Gate/up of the shared expert (items 0..sh_tiles) and of every (expert, row tile);
    // the last finisher of a group (or of the shared expert) runs SwiGLU on its rows and
    // quantises them for `down`.
    let n_pairs = pairs.len();
    let (pairs, groups) = (&pairs[..], &groups[..]);
    let i_sh = sh.map_or(0, |m| m.gate.rows);
    let rt = row_tile(n, groups.len() * i + i_sh, nt);
    let tiles = i.div_ceil(rt);
    let sh_tiles = i_sh.div_ceil(rt);
    let sh_done = done.len() - 1;
    for d in &done[..groups.len()] {
        d.store(0, Ordering::Relaxed);
    }
    done[sh_done].store(0, Ordering::Relaxed);
    let fd = kernels.map(|kern| kern.act_format(d0));
    let ab_d = fd.map_or(0, |f| Kernels::act_row_bytes(f, i));
    let (od, st_d) = aligned_rows(act_d, ab_d, n_pairs);
    let fsd = kernels.zip(sh).map(|(kern, m)| kern.act_format(m.down));
    let ab_sd = fsd.map_or(0, |f| Kernels::act_row_bytes(f, i_sh));
    let (osd, st_sd) = aligned_rows(act_sd, ab_sd, n);
    {
        let (egs, eus) = (
            SharedOut::new(&mut eg[..n_pairs * i]),
            SharedOut::new(&mut eu[..n_pairs * i]),
        );
        let acts_d = SharedOut::new(&mut act_d[od..od + n_pairs * st_d]);
        let (sgs, sus) = (
            SharedOut::new(&mut sg[..n * i_sh]),
            SharedOut::new(&mut su[..n * i_sh]),
        );
        let acts_sd = SharedOut::new(&mut act_sd[osd..osd + n * st_sd]);
        // SwiGLU of rows j0..j0+m of width `w`, quantised into `act` (`ab` bytes a row,
        // `stride` apart).
        let finish = |g: SharedOut,
                      u: SharedOut,
                      w: usize,
                      j0: usize,
                      m: usize,
                      fmt: Option<ActFormat>,
                      (act, ab, stride): (SharedOut<u8>, usize, usize)| {
            for j in j0..j0 + m {
                // SAFETY: every item writing these rows has finished (the caller acquired
                // their increments of the group's counter), and only this thread touches
                // them until the dispatch ends.
                let (g, u) = unsafe { (g.slice(j * w..(j + 1) * w), u.slice(j * w..(j + 1) * w)) };
                if kernels.is_some() {
                    act::swiglu_in_place(g, u);
                } else {
                    for (g, &u) in g.iter_mut().zip(u.iter()) {
                        *g = ops::silu(*g) * u;
                    }
                }
                if let (Some(kern), Some(fmt)) = (kernels, fmt) {
                    // SAFETY: row j's activation bytes are written by this thread only.
                    let dst = unsafe { act.slice(j * stride..j * stride + ab) };
                    kern.quantize_act(fmt, g, dst);
                }
            }
        };
        // Items differ in cost (a shared tile covers every token, an expert's tile only its
        // own): claims are kept small so that the last ones even out; the costly shared
        // tiles come first.
        let items = sh_tiles + groups.len() * tiles;
        let work = Dynamic::new(items, items.div_ceil(nt * FINE_CLAIMS_PER_THREAD));
        pool.run(&|ti| {
            let mut sc = threads[ti].lock().unwrap_or_else(|e| e.into_inner());
            for f in work.items() {
                if f < sh_tiles {
                    let m = sh.expect("shared tiles only with a shared expert");
                    let r0 = f * rt;
                    let nr = rt.min(i_sh - r0);
                    for (mat, dst) in [(m.gate, sgs), (m.up, sus)] {
                        project(src_sh, pairs, mat, r0, nr, 0, n, &mut sc, |t, y| {
                            // SAFETY: (token t, rows r0..r0+nr) is written by this item only.
                            unsafe { dst.slice(t * i_sh + r0..t * i_sh + r0 + nr) }
                                .copy_from_slice(y);
                        });
                    }
                    if done[sh_done].fetch_add(1, Ordering::AcqRel) + 1 == sh_tiles as u32 {
                        finish(sgs, sus, i_sh, 0, n, fsd, (acts_sd, ab_sd, st_sd));
                    }
                    continue;
                }
                let f = f - sh_tiles;
                let gi = f / tiles;
                let Group { e, j0, m } = groups[gi];
                let (e, j0, m) = (e as usize, j0 as usize, m as usize);
                let r0 = (f % tiles) * rt;
                let nr = rt.min(i - r0);
                for (mat, src, dst) in [(&gate[e], src_g, egs), (&up[e], src_u, eus)] {
                    project(src, pairs, mat, r0, nr, j0, m, &mut sc, |jj, y| {
                        let j = j0 + jj;
                        // SAFETY: (pair j, rows r0..r0+nr) is written by this item only.
                        unsafe { dst.slice(j * i + r0..j * i + r0 + nr) }.copy_from_slice(y);
                    });
                }
                // The last of the group's tiles: every row of its pairs is written (each
                // finisher's writes happen before its increment, which this one acquires).
                if done[gi].fetch_add(1, Ordering::AcqRel) + 1 == tiles as u32 {
                    finish(egs, eus, i, j0, m, fd, (acts_d, ab_d, st_d));
                }
            }
        });
    }
    let (src_d, src_sd) = match kernels {
        Some(kern) => (
            Src::Act {
                k: kern,
                act: &act_d[od..od + n_pairs * st_d],
                ab: ab_d,
                stride: st_d,
            },
            Src::Act {
                k: kern,
                act: &act_sd[osd..osd + n * st_sd],
                ab: ab_sd,
                stride: st_sd,
            },
        ),
        None => (
            Src::F32 {
                x: &eg[..n_pairs * i],
                cols: i,
                by_token: false,
            },
            Src::F32 {
                x: &sg[..n * i_sh],
                cols: i_sh,
                by_token: false,
            },
        ),
    };

    if n == 1 && ey.len() >= pairs.len() * h && !down_by_rows() {
        down_one_token(
            pool,
            threads,
            (src_d, src_sd),
            pairs,
            groups,
            down,
            sh,
            (ey, sd),
            h,
        );
        // The routed experts' weighted sum in the several-token path's order (ascending
        // expert, its pairs in order; each `+= y·w` from 0), then the scaling.
        let o = &mut o[..h];
        o.fill(0.0);
        for &Group { j0, m, .. } in groups {
            for j in j0 as usize..(j0 + m) as usize {
                let w = pairs[j].w;
                for (d, &y) in o.iter_mut().zip(&ey[j * h..(j + 1) * h]) {
                    *d += y * w;
                }
            }
        }
        for x in o.iter_mut() {
            *x *= scaling;
        }
        return;
    }

    // Down: each item owns a tile of output rows for every token: the routed experts'
    // weighted sum, scaled, then the shared expert's rows.
    let out = SharedOut::new(&mut o[..n * h]);
    let sds = SharedOut::new(&mut sd[..if sh.is_some() { n * h } else { 0 }]);
    let rt = row_tile(n, h, nt);
    let tiles = h.div_ceil(rt);
    let work = Dynamic::balanced(tiles, nt, CLAIMS_PER_THREAD);
    pool.run(&|ti| {
        let mut sc = threads[ti].lock().unwrap_or_else(|e| e.into_inner());
        for tile in work.items() {
            let r0 = tile * rt;
            let nr = rt.min(h - r0);
            let rows = |t: usize| t * h + r0..t * h + r0 + nr;
            for t in 0..n {
                // SAFETY: output rows r0..r0+nr of every token belong to this item only.
                unsafe { out.slice(rows(t)) }.fill(0.0);
            }
            for &Group { e, j0, m } in groups {
                let j0 = j0 as usize;
                let mat = &down[e as usize];
                project(
                    src_d,
                    pairs,
                    mat,
                    r0,
                    nr,
                    j0,
                    m as usize,
                    &mut sc,
                    |jj, y| {
                        let p = pairs[j0 + jj];
                        // SAFETY: as above.
                        let dst = unsafe { out.slice(rows(p.t as usize)) };
                        for (d, &yv) in dst.iter_mut().zip(y) {
                            *d += yv * p.w;
                        }
                    },
                );
            }
            for t in 0..n {
                // SAFETY: as above.
                for x in unsafe { out.slice(rows(t)) } {
                    *x *= scaling;
                }
            }
            if let Some(m) = sh {
                project(src_sd, pairs, m.down, r0, nr, 0, n, &mut sc, |t, y| {
                    // SAFETY: as above, for the shared output.
                    unsafe { sds.slice(rows(t)) }.copy_from_slice(y);
                });
            }
        }
    });
}

/// Quantises each token's row once (gate's format) into `act_t` and copies it to the rows
/// of its pairs (`slot_pos`) in `act_g`; likewise into the pair rows of `act_u` when `up`
/// wants another format (`ab_u > 0`). Tokens split across the pool.
#[allow(clippy::too_many_arguments)]
fn gather(
    kern: &Kernels,
    pool: &ThreadPool,
    (fg, ab_g, act_t, st_t, act_g, st_g): (ActFormat, usize, &mut [u8], usize, &mut [u8], usize),
    (fu, ab_u, act_u, st_u): (ActFormat, usize, &mut [u8], usize),
    slot_pos: &[u32],
    xs: &[f32],
    h: usize,
    k: usize,
    n: usize,
) {
    let (tok, pg, pu) = (
        SharedOut::new(act_t),
        SharedOut::new(act_g),
        SharedOut::new(act_u),
    );
    let work = Dynamic::balanced(n, pool.n_threads(), CLAIMS_PER_THREAD);
    pool.run(&|_| {
        for t in work.items() {
            let x = &xs[t * h..(t + 1) * h];
            let pos = slot_pos[t * k..(t + 1) * k]
                .iter()
                .map(|&j| j as usize)
                .filter(|&j| j != u32::MAX as usize);
            // SAFETY: token t's row and the rows of token t's pairs are written by this
            // item only.
            let a = unsafe { tok.slice(t * st_t..t * st_t + ab_g) };
            kern.quantize_act(fg, x, a);
            for j in pos.clone() {
                // SAFETY: as above.
                unsafe { pg.slice(j * st_g..j * st_g + ab_g) }.copy_from_slice(a);
            }
            let mut pos = pos;
            if let (true, Some(first)) = (ab_u > 0, pos.next()) {
                // SAFETY: as above.
                let a = unsafe { pu.slice(first * st_u..first * st_u + ab_u) };
                kern.quantize_act(fu, x, a);
                for j in pos {
                    // SAFETY: as above; row j differs from row `first`.
                    unsafe { pu.slice(j * st_u..j * st_u + ab_u) }.copy_from_slice(a);
                }
            }
        }
    });
}

/// The expert layer on its own, for tests: `kernels` (`None`: the reference path) on a pool
/// of `n_threads`, `n` tokens of `xs` routed by `ids`/`ws` (`k` per token). Allocates its
/// pool and buffers.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn routed_experts(
    kernels: Option<Kernels>,
    n_threads: usize,
    mats: ExpertMats<'_>,
    xs: &[f32],
    ids: &[u32],
    ws: &[f32],
    k: usize,
    scaling: f32,
    n: usize,
) -> Vec<f32> {
    let (h, i, e) = (mats.gate[0].cols, mats.gate[0].rows, mats.gate.len());
    assert!(xs.len() >= n * h && ids.len() >= n * k && ws.len() >= n * k);
    let pool = ThreadPool::new(n_threads);
    let threads: Vec<Mutex<ThreadScratch>> = (0..pool.n_threads())
        .map(|_| Mutex::new(ThreadScratch::new(h.max(i), 1, n)))
        .collect();
    let layer = LayerShapes {
        gate: &mats.gate[0],
        up: &mats.up[0],
        down: &mats.down[0],
        shared: None,
    };
    let mut es = ExpertScratch::new(kernels.as_ref(), n, k, e, i, core::iter::once(layer));
    let ids: Vec<f32> = ids.iter().map(|&id| f32::from_bits(id)).collect();
    let mut o = vec![0.0; n * h];
    let cx = Ctx {
        kernels: kernels.as_ref(),
        pool: &pool,
        threads: &threads,
        es: &mut es,
    };
    run(cx, mats, None, xs, &ids, ws, k, scaling, n, &mut o);
    o
}

/// Whether `LAGOON_CPU_DOWN_BY_ROWS=1` sends one token's `down` through the several-token
/// path's items (tiles of output rows over every expert) instead of [`down_one_token`]'s,
/// for measuring.
fn down_by_rows() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var_os("LAGOON_CPU_DOWN_BY_ROWS").is_some_and(|v| v == "1"))
}

/// `down` for one token: work items are (pair or the shared expert, tile of rows), so each
/// item streams one matrix's rows (the several-token path's items hold a tile of output
/// rows for every expert: a few KB of each expert's matrix per call, the x8 kernels' software
/// prefetch running past every one of them). Pair j's rows go to `ey[j·h..]`, the shared
/// expert's to `sd[..h]`; the caller forms the weighted sum.
#[allow(clippy::too_many_arguments)]
fn down_one_token(
    pool: &ThreadPool,
    threads: &[Mutex<ThreadScratch>],
    (src_d, src_sd): (Src<'_>, Src<'_>),
    pairs: &[Pair],
    groups: &[Group],
    down: &[MatRef<'_>],
    sh: Option<SharedMats<'_>>,
    (ey, sd): (&mut [f32], &mut [f32]),
    h: usize,
) {
    let n_pairs = pairs.len();
    let srcs = n_pairs + usize::from(sh.is_some());
    let rt = row_tile(1, srcs * h, pool.n_threads());
    let tiles = h.div_ceil(rt);
    let eys = SharedOut::new(&mut ey[..n_pairs * h]);
    let sds = SharedOut::new(&mut sd[..if sh.is_some() { h } else { 0 }]);
    // Pair j's expert (pairs are sorted by expert: group order).
    let expert = |j: usize| {
        let g = groups.partition_point(|g| (g.j0 + g.m) as usize <= j);
        groups[g].e as usize
    };
    let work = Dynamic::balanced(srcs * tiles, pool.n_threads(), CLAIMS_PER_THREAD);
    pool.run(&|ti| {
        let mut sc = threads[ti].lock().unwrap_or_else(|e| e.into_inner());
        for f in work.items() {
            let (j, tile) = (f / tiles, f % tiles);
            let r0 = tile * rt;
            let nr = rt.min(h - r0);
            if j < n_pairs {
                project(
                    src_d,
                    pairs,
                    &down[expert(j)],
                    r0,
                    nr,
                    j,
                    1,
                    &mut sc,
                    |_, y| {
                        // SAFETY: (pair j, rows r0..r0+nr) is written by this item only.
                        unsafe { eys.slice(j * h + r0..j * h + r0 + nr) }.copy_from_slice(y);
                    },
                );
            } else if let Some(m) = sh {
                project(src_sd, pairs, m.down, r0, nr, 0, 1, &mut sc, |_, y| {
                    // SAFETY: rows r0..r0+nr of the shared output are written by this item only.
                    unsafe { sds.slice(r0..r0 + nr) }.copy_from_slice(y);
                });
            }
        }
    });
}
