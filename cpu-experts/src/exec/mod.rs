//! The graph walker: one match arm per [`Op`], each running on arena slices, the large
//! ones split across the thread pool. No allocation happens here.
//!
//! The routed experts live in [`experts`].

pub mod experts;
pub mod profile;

use alloc::vec;
use alloc::vec::Vec;
use std::sync::Mutex;

use lagoon_core::config::ModelConfig;
use lagoon_core::graph::{Graph, LayerWeight as L, Op, Value, Weight};
use lagoon_core::laguna::weights::{Ffn, ModelWeights};
use lagoon_core::ops;
use lagoon_core::weights::MatRef;

use self::experts::{Ctx, ExpertMats, ExpertScratch, LayerShapes, SharedMats};
use crate::kernels::{ActFormat, AttnGroup, AttnTokens, Kernels, act};
use crate::pool::{Dynamic, SharedOut, ThreadPool};
use crate::session::State;

/// Work items are handed out in about this many claims per thread (see [`Dynamic`]).
const CLAIMS_PER_THREAD: usize = 8;

/// Rows a thread computes per kernel call: a tile of `ROW_TILE` weight rows is read once
/// and dotted with every token of the step while it sits in L1/L2.
const ROW_TILE: usize = 16;

/// Rows per kernel call in a one-token step (decode), where no token reuses a tile and a
/// call's fixed costs (the repacked kernels' per-call activation preparation, the store's
/// lookup, the claim) are better spread over more rows: at most this many, halved (to 16 at
/// least) until a dispatch has [`DECODE_ITEMS_PER_THREAD`] items per thread. Multiples of 8
/// (the repacked kernels take whole groups of 8 rows). `LAGOON_CPU_DECODE_TILE=N` fixes it
/// at N (a multiple of 8 from 8 to [`MAX_DECODE_TILE`]), for measuring. On the 2-core Zen 5
/// VM, 64 against 16: XS.2 8 layers UD-Q3_K_M tg64 +10-15% (the IQ3_XXS experts' node time
/// -30%); on the 16-core host level (XS 2.1 UD-Q3_K_M-like), BENCHMARKS.md "Session 22".
const DECODE_ROW_TILE: usize = 64;

/// Work items per thread a decode dispatch keeps (for balance) before tiles grow.
const DECODE_ITEMS_PER_THREAD: usize = 4;

/// The largest decode tile the scratch holds.
const MAX_DECODE_TILE: usize = 256;

/// Rows per kernel call for a step of `n` tokens over `rows` rows in all on `nt` threads:
/// [`ROW_TILE`] for several tokens, else as [`DECODE_ROW_TILE`] says.
fn row_tile(n: usize, rows: usize, nt: usize) -> usize {
    static FIXED: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    if n != 1 {
        return ROW_TILE;
    }
    let fixed = FIXED.get_or_init(|| {
        std::env::var("LAGOON_CPU_DECODE_TILE")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&t| (8..=MAX_DECODE_TILE).contains(&t) && t.is_multiple_of(8))
    });
    if let Some(t) = *fixed {
        return t;
    }
    let mut t = DECODE_ROW_TILE;
    while t > ROW_TILE && rows / t < DECODE_ITEMS_PER_THREAD * nt {
        t /= 2;
    }
    t
}

/// Per-thread scratch: one decoded weight row, one head's attention scores, one output tile
/// (`ROW_TILE` rows for every token of a step, at least a decode tile's `MAX_DECODE_TILE`),
/// and the router's per-token buffers.
#[derive(Debug)]
pub struct ThreadScratch {
    row: Vec<f32>,
    scores: Vec<f32>,
    tile: Vec<f32>,
    /// Router selection scores (`E`), one token's chosen ids and weights (`k`).
    sel: Vec<f32>,
    ids_k: Vec<u32>,
    ws_k: Vec<f32>,
}

impl ThreadScratch {
    fn new(row: usize, scores: usize, tokens: usize) -> ThreadScratch {
        ThreadScratch {
            row: vec![0.0; row],
            scores: vec![0.0; scores.max(1)],
            tile: vec![0.0; (tokens * ROW_TILE).max(MAX_DECODE_TILE)],
            sel: Vec::new(),
            ids_k: Vec::new(),
            ws_k: Vec::new(),
        }
    }
}

/// Scratch buffers sized at session creation.
#[derive(Debug)]
pub struct Scratch {
    /// One per pool thread, each locked only by its own thread (never contended).
    threads: Vec<Mutex<ThreadScratch>>,
    /// Quantised activation rows of the step's tokens.
    act: Vec<u8>,
    /// The routed experts' buffers.
    experts: ExpertScratch,
}

impl Scratch {
    pub fn new(
        c: &ModelConfig,
        w: &ModelWeights<'_>,
        ubatch: usize,
        max_cap: usize,
        n_threads: usize,
        kernels: Option<&Kernels>,
    ) -> Scratch {
        let moe = w.layers.iter().filter_map(|l| match &l.ffn {
            Ffn::Moe {
                gate,
                up,
                down,
                shared,
                ..
            } => Some(LayerShapes {
                gate: gate.first()?,
                up: up.first()?,
                down: down.first()?,
                shared: shared.as_ref().map(|s| [&s.gate, &s.up, &s.down]),
            }),
            Ffn::Dense(_) => None,
        });
        Scratch {
            threads: (0..n_threads)
                .map(|_| {
                    // Scores of up to ATTEND_MAX_HEADS heads at once (`Kernels::attend_group`).
                    let scores = max_cap * Kernels::ATTEND_MAX_HEADS;
                    let mut t = ThreadScratch::new(w.max_cols(), scores, ubatch);
                    t.sel = vec![0.0; c.n_experts];
                    t.ids_k = vec![0; c.n_experts_used];
                    t.ws_k = vec![0.0; c.n_experts_used];
                    Mutex::new(t)
                })
                .collect(),
            // f32 activations are the widest format: 4 bytes per element.
            act: vec![0; ubatch * 4 * w.max_cols()],
            experts: ExpertScratch::new(
                kernels,
                ubatch,
                c.n_experts_used,
                c.n_experts,
                c.expert_ffn,
                moe,
            ),
        }
    }
}

/// Splits the arena into the read-only inputs and the outputs of a node. The planner never
/// overlaps two values that are live at once; this checks it rather than trusting it.
fn io_n<const N: usize, const M: usize>(
    arena: &mut [f32],
    ins: [(Value, usize); N],
    outs: [(Value, usize); M],
) -> ([&[f32]; N], [&mut [f32]; M]) {
    let range = |(v, n): (Value, usize)| v.offset..v.offset + v.rows(n) * v.cols;
    let ranges = ins.map(range);
    let oranges = outs.map(range);
    let len = arena.len();
    for (a, o) in oranges.iter().enumerate() {
        assert!(o.end <= len, "a node's output lies outside the arena");
        assert!(
            ranges
                .iter()
                .chain(&oranges[a + 1..])
                .all(|r| r.end <= o.start || o.end <= r.start),
            "planner overlapped a node's input and output"
        );
    }
    assert!(ranges.iter().all(|r| r.end <= len));
    let base = arena.as_mut_ptr();
    // SAFETY: every range lies inside `arena` and each output range is disjoint from every
    // input range and every other output range (checked above), so no mutable slice aliases
    // another slice; inputs may alias each other, which is fine for shared borrows.
    let outs =
        oranges.map(|o| unsafe { core::slice::from_raw_parts_mut(base.add(o.start), o.len()) });
    // SAFETY: as above; shared slices of in-bounds ranges disjoint from the outputs.
    let ins = ranges
        .map(|r| unsafe { core::slice::from_raw_parts(base.add(r.start) as *const f32, r.len()) });
    (ins, outs)
}

/// [`io_n`] for a node with one output.
fn io<const N: usize>(
    arena: &mut [f32],
    ins: [(Value, usize); N],
    out: (Value, usize),
) -> ([&[f32]; N], &mut [f32]) {
    let (ins, [o]) = io_n(arena, ins, [out]);
    (ins, o)
}

fn mat<'w>(w: &'w ModelWeights<'w>, id: Weight) -> &'w MatRef<'w> {
    match id {
        Weight::TokenEmbd => &w.token_embd,
        Weight::Output => &w.output,
        Weight::Layer(l, lw) => {
            let layer = &w.layers[l];
            match (lw, &layer.ffn) {
                (L::Q, _) => &layer.q,
                (L::K, _) => &layer.k,
                (L::V, _) => &layer.v,
                (L::O, _) => &layer.o,
                (L::Gate, _) => layer
                    .gate
                    .as_ref()
                    .expect("graph uses a gate only when the layer has one"),
                (L::FfnGate, Ffn::Dense(m)) => &m.gate,
                (L::FfnUp, Ffn::Dense(m)) => &m.up,
                (L::FfnDown, Ffn::Dense(m)) => &m.down,
                (L::Router, Ffn::Moe { router, .. }) => router,
                (
                    L::GateShexp | L::UpShexp | L::DownShexp,
                    Ffn::Moe {
                        shared: Some(s), ..
                    },
                ) => match lw {
                    L::GateShexp => &s.gate,
                    L::UpShexp => &s.up,
                    _ => &s.down,
                },
                _ => unreachable!("graph asked for {id:?} as a matrix"),
            }
        }
        Weight::OutputNorm => unreachable!("output norm is a vector"),
    }
}

fn vector<'w>(w: &'w ModelWeights<'w>, id: Weight) -> &'w [f32] {
    match id {
        Weight::OutputNorm => &w.output_norm,
        Weight::Layer(l, L::AttnNorm) => &w.layers[l].attn_norm,
        Weight::Layer(l, L::FfnNorm) => &w.layers[l].ffn_norm,
        Weight::Layer(l, L::QNorm) => &w.layers[l].q_norm,
        Weight::Layer(l, L::KNorm) => &w.layers[l].k_norm,
        _ => unreachable!("graph asked for {id:?} as a vector"),
    }
}

/// Runs `graph` for `n` tokens (already in `st.tokens`) at positions `pos0..pos0 + n`.
pub(crate) fn run(
    st: &mut State,
    graph: &Graph,
    c: &ModelConfig,
    w: &ModelWeights<'_>,
    n: usize,
    pos0: usize,
) {
    let vals = &graph.values;
    let d = c.head_dim;
    let mut skip = 0;
    for (i, op) in graph.nodes.iter().enumerate() {
        if skip > 0 {
            skip -= 1;
            continue;
        }
        // Whether this node's timing has started (a run of products tried as one dispatch).
        let mut timed = false;
        if let (Some(k), Op::MatMul { x, .. }) = (st.kernels.clone(), op) {
            let batch = same_input_matmuls(&graph.nodes[i..], *x);
            if batch > 1 {
                if let Some(p) = &mut st.profile {
                    let (key, bytes) = profile_key(c, w, &graph.nodes[i..], batch, n);
                    p.start(key, bytes);
                    timed = true;
                }
                if matmuls_fused(&k, st, graph, w, &graph.nodes[i..i + batch], n) {
                    skip = batch - 1;
                    continue;
                }
                // Not fused (nothing ran): this node alone, timed from the same start.
                if let Some(p) = &mut st.profile {
                    let (key, bytes) = profile_key(c, w, &graph.nodes[i..], 1, n);
                    p.retag(key, bytes);
                }
            }
        }
        if let Some(p) = st.profile.as_mut().filter(|_| !timed) {
            let (key, bytes) = profile_key(c, w, &graph.nodes[i..], 1, n);
            p.start(key, bytes);
        }
        match *op {
            Op::Embed { out } => {
                let (_, o) = io::<0>(&mut st.arena, [], (vals[out], n));
                let (e, tokens) = (&w.token_embd, &st.tokens[..n]);
                let os = SharedOut::new(&mut o[..n * e.cols]);
                for_rows(&st.pool, n, &|t0, t1| {
                    for (t, &tok) in (t0..t1).zip(&tokens[t0..t1]) {
                        // SAFETY: token t's row of the output belongs to this call only.
                        e.dequant_row(tok as usize, unsafe {
                            os.slice(t * e.cols..(t + 1) * e.cols)
                        });
                    }
                });
            }
            Op::RmsNorm { x, w: wid, out } => {
                let (rows, cols) = (vals[x].rows(n), vals[x].cols);
                let ([xs], o) = io(&mut st.arena, [(vals[x], n)], (vals[out], n));
                debug_assert_eq!(xs.len(), rows * cols);
                let (wv, os) = (vector(w, wid), SharedOut::new(o));
                let fast = st.kernels.is_some();
                for_rows(&st.pool, rows, &|r0, r1| {
                    // SAFETY: rows r0..r1 of the output belong to this call only.
                    let o = unsafe { os.slice(r0 * cols..r1 * cols) };
                    let x = &xs[r0 * cols..r1 * cols];
                    if fast {
                        act::rms_norm_lanes(x, wv, c.rms_eps, o);
                    } else {
                        ops::norm::rms_norm(x, wv, c.rms_eps, o);
                    }
                });
            }
            Op::MatMul { x, w: wid, out } => {
                let rows = vals[x].rows(n);
                let ([xs], o) = io(&mut st.arena, [(vals[x], n)], (vals[out], n));
                match &st.kernels {
                    None => matmul(&st.pool, &st.scratch.threads, mat(w, wid), xs, rows, o),
                    Some(k) => matmul_fast(
                        k,
                        &st.pool,
                        &st.scratch.threads,
                        &mut st.scratch.act,
                        mat(w, wid),
                        xs,
                        rows,
                        o,
                    ),
                }
            }
            Op::Rope { x, sliding, out } => {
                let ([xs], o) = io(&mut st.arena, [(vals[x], n)], (vals[out], n));
                let table = &st.ropes[sliding as usize];
                let cols = vals[x].cols;
                let os = SharedOut::new(o);
                let threads = &st.scratch.threads;
                for_rows_scratch(&st.pool, threads, n, &|sc, t0, t1| {
                    // SAFETY: tokens t0..t1 of the output belong to this call only.
                    let o = unsafe { os.slice(t0 * cols..t1 * cols) };
                    o.copy_from_slice(&xs[t0 * cols..t1 * cols]);
                    for (t, row) in (t0..t1).zip(o.chunks_exact_mut(cols)) {
                        rope_token(table, row, d, pos0 + t, &mut sc.row);
                    }
                });
            }
            Op::KvStore { layer, k, v } => {
                let (kv, vv) = (vals[k], vals[v]);
                let cache = &mut st.kv.layers[layer];
                let arena = &st.arena;
                let (row, cap, d) = (kv.cols, cache.cap, st.kv.d);
                let ks = &arena[kv.offset..kv.offset + n * row];
                let vs = &arena[vv.offset..vv.offset + n * vv.cols];
                assert!(vv.cols == row && cache.k.len() >= cap * row && cache.v.len() >= cap * row);
                assert!(row.is_multiple_of(d));
                if n > cap {
                    // More tokens than ring rows (never planned): later tokens overwrite
                    // earlier ones, so keep the order.
                    for t in 0..n {
                        let r = t * row..(t + 1) * row;
                        cache.store(pos0 + t, &ks[r.clone()], &vs[r], d);
                    }
                    continue;
                }
                let (kc, vc) = (SharedOut::new(&mut cache.k), SharedOut::new(&mut cache.v));
                for_rows(&st.pool, n, &|t0, t1| {
                    for t in t0..t1 {
                        let p = (pos0 + t) % cap;
                        // Head h of the token to its head-major place (kv.rs).
                        for h in 0..row / d {
                            let s = (h * cap + p) * d;
                            let r = t * row + h * d..t * row + (h + 1) * d;
                            // SAFETY: n ≤ cap, so the tokens' ring positions are distinct and
                            // position p's place in every head belongs to token t only.
                            unsafe { kc.slice(s..s + d) }.copy_from_slice(&ks[r.clone()]);
                            // SAFETY: as above.
                            unsafe { vc.slice(s..s + d) }.copy_from_slice(&vs[r]);
                        }
                    }
                });
            }
            Op::Attention { layer, q, out } => {
                let ([qs], o) = io(&mut st.arena, [(vals[q], n)], (vals[out], n));
                let hq = c.n_heads[layer];
                let group = hq / c.n_kv_heads;
                let cache = &st.kv.layers[layer];
                let sliding = c.is_sliding(layer);
                let window = c.sliding_window;
                let out = SharedOut::new(o);
                let threads = &st.scratch.threads;
                let nt = st.pool.n_threads();
                let fast = st.kernels.is_some();
                // Fast path: one item per (token, KV head, block of up to ATTEND_MAX_HEADS of
                // its query heads), each K/V row read once per block; the kernel may decline
                // a shape, then the block's heads run one by one as on the reference path.
                if let Some(k) = st.kernels.clone().filter(|_| group > 0 && n > 1) {
                    // Several tokens: items of (block of ATTEND_MAX_TOKENS tokens, KV head,
                    // block of heads), each K/V row read once per item.
                    const TB: usize = Kernels::ATTEND_MAX_TOKENS;
                    let blocks = group.div_ceil(Kernels::ATTEND_MAX_HEADS);
                    let per_tb = c.n_kv_heads * blocks;
                    let n_tb = n.div_ceil(TB);
                    let work = Dynamic::balanced(n_tb * per_tb, nt, CLAIMS_PER_THREAD);
                    st.pool.run(&|ti| {
                        let mut sc = threads[ti].lock().unwrap_or_else(|e| e.into_inner());
                        for job in work.items() {
                            // A token block's cost grows with its position (it attends every
                            // earlier position): the last blocks are handed out first, so the
                            // claims that end the dispatch are the cheap ones.
                            let (tb, rest) = (n_tb - 1 - job / per_tb, job % per_tb);
                            let (g, b) = (rest / blocks, rest % blocks);
                            let h0 = g * group + b * Kernels::ATTEND_MAX_HEADS;
                            let gb = Kernels::ATTEND_MAX_HEADS.min((g + 1) * group - h0);
                            let (t0, tn) = (tb * TB, TB.min(n - tb * TB));
                            let rows = |t: usize| {
                                let base = (t * hq + h0) * d;
                                base..base + gb * d
                            };
                            let mut outs: [&mut [f32]; TB] = Default::default();
                            for (i, o) in outs[..tn].iter_mut().enumerate() {
                                // SAFETY: each (token, head) pair, hence each output range,
                                // belongs to exactly one job.
                                *o = unsafe { out.slice(rows(t0 + i)) };
                            }
                            let a = AttnTokens {
                                q: &qs[rows(t0).start..rows(t0 + tn - 1).end],
                                q_stride: hq * d,
                                n_tokens: tn,
                                kc: &cache.k,
                                vc: &cache.v,
                                row: d,
                                cap: cache.cap,
                                off: cache.head_off(g, d),
                                d,
                                n_heads: gb,
                                pos0: pos0 + t0,
                                window: if sliding { window } else { usize::MAX },
                            };
                            if k.attend_tokens(&a, &mut outs[..tn]) {
                                continue;
                            }
                            // KV head g's rows (kv.rs), so the head index below is 0.
                            let kv = |j| cache.head(j, g, d);
                            for (i, o) in outs[..tn].iter_mut().enumerate() {
                                let pos = pos0 + t0 + i;
                                let first = if sliding {
                                    (pos + 1).saturating_sub(window)
                                } else {
                                    0
                                };
                                for (hh, oh) in o.chunks_exact_mut(d).enumerate() {
                                    let qh = &qs[rows(t0 + i).start + hh * d..][..d];
                                    let sc = &mut sc.scores;
                                    attend_head_lanes(qh, 0, d, first, pos, &kv, sc, oh);
                                }
                            }
                        }
                    });
                    continue;
                }
                if let Some(k) = st.kernels.clone().filter(|_| group > 0) {
                    let blocks = group.div_ceil(Kernels::ATTEND_MAX_HEADS);
                    let per_token = c.n_kv_heads * blocks;
                    let work = Dynamic::balanced(n * per_token, nt, CLAIMS_PER_THREAD);
                    st.pool.run(&|ti| {
                        let mut sc = threads[ti].lock().unwrap_or_else(|e| e.into_inner());
                        for job in work.items() {
                            let (t, rest) = (job / per_token, job % per_token);
                            let (g, b) = (rest / blocks, rest % blocks);
                            let h0 = g * group + b * Kernels::ATTEND_MAX_HEADS;
                            let gb = Kernels::ATTEND_MAX_HEADS.min((g + 1) * group - h0);
                            let pos = pos0 + t;
                            let first = if sliding {
                                (pos + 1).saturating_sub(window)
                            } else {
                                0
                            };
                            let base = (t * hq + h0) * d;
                            // SAFETY: each (token, head) pair, hence each output range,
                            // belongs to exactly one job.
                            let oh = unsafe { out.slice(base..base + gb * d) };
                            let a = AttnGroup {
                                q: &qs[base..base + gb * d],
                                kc: &cache.k,
                                vc: &cache.v,
                                row: d,
                                cap: cache.cap,
                                off: cache.head_off(g, d),
                                d,
                                n_heads: gb,
                                first,
                                pos,
                            };
                            if k.attend_group(&a, &mut sc.scores, oh) {
                                continue;
                            }
                            let kv = |j| cache.head(j, g, d);
                            for (i, oh) in oh.chunks_exact_mut(d).enumerate() {
                                let qh = &a.q[i * d..(i + 1) * d];
                                attend_head_lanes(qh, 0, d, first, pos, &kv, &mut sc.scores, oh);
                            }
                        }
                    });
                    continue;
                }
                let work = Dynamic::balanced(n * hq, nt, CLAIMS_PER_THREAD);
                st.pool.run(&|ti| {
                    let mut sc = threads[ti].lock().unwrap_or_else(|e| e.into_inner());
                    for job in work.items() {
                        let (t, h) = (job / hq, job % hq);
                        let pos = pos0 + t;
                        let first = if sliding {
                            (pos + 1).saturating_sub(window)
                        } else {
                            0
                        };
                        let base = (t * hq + h) * d;
                        // SAFETY: each (token, head) pair, hence each output range, belongs to
                        // exactly one job.
                        let oh = unsafe { out.slice(base..base + d) };
                        // KV head h / group's rows (kv.rs), so the head index below is 0.
                        let kv = |j| cache.head(j, h / group, d);
                        let qh = &qs[base..base + d];
                        let scores = &mut sc.scores;
                        if fast {
                            attend_head_lanes(qh, 0, d, first, pos, &kv, scores, oh);
                        } else {
                            ops::attention::attend_head(qh, 0, d, first, pos, &kv, scores, oh);
                        }
                    }
                });
            }
            Op::GateMul { o: ov, g, out } => {
                let ([os, gs], o) =
                    io(&mut st.arena, [(vals[ov], n), (vals[g], n)], (vals[out], n));
                let (ocols, gcols) = (vals[ov].cols, vals[g].cols);
                let per = ocols / gcols; // head_dim (per-head) or 1 (per-element)
                let out = SharedOut::new(&mut o[..n * ocols]);
                for_rows(&st.pool, n, &|t0, t1| {
                    // SAFETY: tokens t0..t1 of the output belong to this call only.
                    let o = unsafe { out.slice(t0 * ocols..t1 * ocols) };
                    // softplus once per gate value, not once per element it scales.
                    for ((dst, src), &gv) in o
                        .chunks_exact_mut(per)
                        .zip(os[t0 * ocols..t1 * ocols].chunks_exact(per))
                        .zip(&gs[t0 * gcols..t1 * gcols])
                    {
                        let s = ops::softplus(gv);
                        for (d, &x) in dst.iter_mut().zip(src) {
                            *d = x * s;
                        }
                    }
                });
            }
            Op::SwiGlu { gate, up, out } => {
                let ([gs, us], o) = io(
                    &mut st.arena,
                    [(vals[gate], n), (vals[up], n)],
                    (vals[out], n),
                );
                let (rows, cols) = (vals[out].rows(n), vals[out].cols);
                let os = SharedOut::new(o);
                let fast = st.kernels.is_some();
                for_rows(&st.pool, rows, &|r0, r1| {
                    let r = r0 * cols..r1 * cols;
                    // SAFETY: rows r0..r1 of the output belong to this call only.
                    let o = unsafe { os.slice(r.clone()) };
                    if fast {
                        o.copy_from_slice(&gs[r.clone()]);
                        act::swiglu_in_place(o, &us[r]);
                    } else {
                        ops::swiglu(&gs[r.clone()], &us[r], o);
                    }
                });
            }
            Op::Add { a, b, out } => {
                let ([as_, bs], o) =
                    io(&mut st.arena, [(vals[a], n), (vals[b], n)], (vals[out], n));
                add_rows(&st.pool, as_, bs, o, n);
            }
            Op::Route {
                layer,
                z,
                ids,
                weights,
            } => {
                let Ffn::Moe { bias, .. } = &w.layers[layer].ffn else {
                    unreachable!("route on a dense layer")
                };
                let k = c.n_experts_used;
                let ([zs], [iv, wv]) = io_n(
                    &mut st.arena,
                    [(vals[z], n)],
                    [(vals[ids], n), (vals[weights], n)],
                );
                route(
                    &st.pool,
                    &st.scratch.threads,
                    zs,
                    bias,
                    c.norm_topk_prob,
                    k,
                    n,
                    iv,
                    wv,
                );
            }
            Op::Experts {
                layer,
                x,
                ids,
                weights,
                out,
            } => {
                let Ffn::Moe {
                    gate,
                    up,
                    down,
                    shared,
                    ..
                } = &w.layers[layer].ffn
                else {
                    unreachable!("experts on a dense layer")
                };
                let mats = ExpertMats { gate, up, down };
                let k = c.n_experts_used;
                let ins = [(vals[x], n), (vals[ids], n), (vals[weights], n)];
                // The shared expert and the sum run inside the routed experts' dispatches
                // when the graph has the usual shape (and the formats allow it).
                let sh = shared_tail(&graph.nodes, i, x, out)
                    .zip(shared.as_ref())
                    .map(|(sum, s)| {
                        let m = SharedMats {
                            gate: &s.gate,
                            up: &s.up,
                            down: &s.down,
                        };
                        (m, sum)
                    })
                    .filter(|(m, _)| {
                        gate.first()
                            .is_some_and(|g0| m.fits(st.kernels.as_ref(), g0, &st.scratch.experts))
                    });
                let cx = Ctx {
                    kernels: st.kernels.as_ref(),
                    pool: &st.pool,
                    threads: &st.scratch.threads,
                    es: &mut st.scratch.experts,
                };
                let Some((m, sum)) = sh else {
                    let ([xs, is, ws], o) = io(&mut st.arena, ins, (vals[out], n));
                    experts::run(cx, mats, None, xs, is, ws, k, c.routed_scaling, n, o);
                    continue;
                };
                skip = SHARED_TAIL;
                if let Some(p) = st.profile.as_mut().filter(|_| n == 1) {
                    p.add_bytes(m.gate.n_bytes() + m.up.n_bytes() + m.down.n_bytes());
                }
                let ([xs, is, ws], o) = io(&mut st.arena, ins, (vals[out], n));
                experts::run(cx, mats, Some(m), xs, is, ws, k, c.routed_scaling, n, o);
                // The sum may reuse an input's space, so it is formed after the dispatches.
                let ([r], f) = io(&mut st.arena, [(vals[out], n)], (vals[sum], n));
                let sd = st.scratch.experts.shared_out(n, vals[out].cols);
                add_rows(&st.pool, r, sd, f, n);
            }
            Op::LastRow { x, out } => {
                let xv = vals[x];
                let ([xs], o) = io(&mut st.arena, [(xv, n)], (vals[out], n));
                o.copy_from_slice(&xs[(n - 1) * xv.cols..n * xv.cols]);
            }
        }
    }
    if let Some(p) = &mut st.profile {
        p.stop();
    }
}

/// The profile's kind of `nodes[0]` (run as `fused` products of one input, `n` tokens) and
/// the weight bytes it reads.
fn profile_key(
    c: &ModelConfig,
    w: &ModelWeights<'_>,
    nodes: &[Op],
    fused: usize,
    n: usize,
) -> (profile::Key, usize) {
    let op = &nodes[0];
    let (sliding, ty, bytes) = match *op {
        Op::MatMul { w: wid, .. } => {
            let bytes = nodes[..fused]
                .iter()
                .map(|o| match *o {
                    Op::MatMul { w: wi, .. } => mat(w, wi).n_bytes(),
                    _ => 0,
                })
                .sum();
            (false, Some(mat(w, wid).type_name()), bytes)
        }
        Op::Attention { layer, .. } => (c.is_sliding(layer), None, 0),
        Op::Experts { layer, .. } => match &w.layers[layer].ffn {
            Ffn::Moe { gate, up, down, .. } => {
                // One token reads k experts (the shared one is added where it runs inside).
                let one = |m: &[MatRef<'_>]| m.first().map_or(0, MatRef::n_bytes);
                let routed = c.n_experts_used * (one(gate) + one(up) + one(down));
                let bytes = if n == 1 { routed } else { 0 };
                (false, gate.first().map(MatRef::type_name), bytes)
            }
            Ffn::Dense(_) => (false, None, 0),
        },
        _ => (false, None, 0),
    };
    (profile::Key::of(op, fused, sliding, ty), bytes)
}

/// Rows (tokens) from which the row-wise nodes (norms, RoPE, gating, SwiGLU) split across
/// the pool: below it a dispatch costs more than the work (decode stays on the caller).
const PARALLEL_ROWS: usize = 4;

/// `f(r0, r1)` over row ranges covering `0..rows` exactly once: on the calling thread below
/// [`PARALLEL_ROWS`], else one row per work item across the pool. Each row's result does not
/// depend on how the rows are split.
fn for_rows(pool: &ThreadPool, rows: usize, f: &(dyn Fn(usize, usize) + Sync)) {
    if rows < PARALLEL_ROWS || pool.n_threads() == 1 {
        f(0, rows);
        return;
    }
    let work = Dynamic::balanced(rows, pool.n_threads(), CLAIMS_PER_THREAD);
    pool.run(&|_| {
        for r in work.items() {
            f(r, r + 1);
        }
    });
}

/// [`for_rows`] with the calling thread's scratch.
fn for_rows_scratch(
    pool: &ThreadPool,
    threads: &[Mutex<ThreadScratch>],
    rows: usize,
    f: &(dyn Fn(&mut ThreadScratch, usize, usize) + Sync),
) {
    if rows < PARALLEL_ROWS || pool.n_threads() == 1 {
        let mut sc = threads[0].lock().unwrap_or_else(|e| e.into_inner());
        f(&mut sc, 0, rows);
        return;
    }
    let work = Dynamic::balanced(rows, pool.n_threads(), CLAIMS_PER_THREAD);
    pool.run(&|ti| {
        let mut sc = threads[ti].lock().unwrap_or_else(|e| e.into_inner());
        for r in work.items() {
            f(&mut sc, r, r + 1);
        }
    });
}

/// `o = a + b` elementwise over `n` rows (all three the same length), rows split across the
/// pool as in [`for_rows`].
fn add_rows(pool: &ThreadPool, a: &[f32], b: &[f32], o: &mut [f32], n: usize) {
    let len = o.len().min(a.len()).min(b.len());
    let cols = len / n.max(1);
    let os = SharedOut::new(&mut o[..len]);
    for_rows(pool, n, &|r0, r1| {
        let r = r0 * cols..r1 * cols;
        // SAFETY: rows r0..r1 of the output belong to this call only.
        let o = unsafe { os.slice(r.clone()) };
        for ((o, &x), &y) in o.iter_mut().zip(&a[r.clone()]).zip(&b[r]) {
            *o = x + y;
        }
    });
    // Elements past the last full row (none when the lengths are n · cols).
    for i in n * cols..len {
        // SAFETY: the pool has returned; this thread alone touches the output.
        unsafe { os.set(i, a[i] + b[i]) };
    }
}

/// [`lagoon_core::rope::RopeTable::apply`] on every head of one token's row: the same
/// cos/sin values, computed once for the token (into `cs`) instead of once per head, and
/// the same rotation arithmetic, so the result is bit-identical.
fn rope_token(
    table: &lagoon_core::rope::RopeTable,
    row: &mut [f32],
    d: usize,
    pos: usize,
    cs: &mut [f32],
) {
    let half = table.rotary_dim / 2;
    if cs.len() < 2 * half {
        for head in row.chunks_exact_mut(d) {
            table.apply(head, pos);
        }
        return;
    }
    // Rotating (1, 0) pairs leaves exactly (cos, sin) · scale: `1·c − 0·s = c` and
    // `0·c + 1·s = s` in f32 for finite c, s.
    let (cos, sin) = cs[..2 * half].split_at_mut(half);
    cos.fill(1.0);
    sin.fill(0.0);
    table.apply(&mut cs[..2 * half], pos);
    let (cos, sin) = cs[..2 * half].split_at(half);
    for head in row.chunks_exact_mut(d) {
        let (x0s, x1s) = head[..2 * half].split_at_mut(half);
        for (((x0, x1), &c), &s) in x0s.iter_mut().zip(x1s.iter_mut()).zip(cos).zip(sin) {
            let (a, b) = (*x0, *x1);
            *x0 = a * c - b * s;
            *x1 = b * c + a * s;
        }
    }
}

/// `lagoon_core::ops::attention::attend_head` (same arguments and semantics) with the
/// query·key products in [`act::dot_lanes`] order and std's `exp`: the fast path's attention.
/// It differs from the reference by rounding only; the reference path keeps core's.
#[allow(clippy::too_many_arguments)]
fn attend_head_lanes<'a>(
    qh: &[f32],
    kvh: usize,
    d: usize,
    first: usize,
    pos: usize,
    kv: &impl Fn(usize) -> (&'a [f32], &'a [f32]),
    scores: &mut [f32],
    oh: &mut [f32],
) {
    let scale = 1.0 / (d as f32).sqrt();
    let n = pos + 1 - first;
    let mut max = f32::NEG_INFINITY;
    for (i, s) in scores[..n].iter_mut().enumerate() {
        let (k, _) = kv(first + i);
        *s = act::dot_lanes(qh, &k[kvh * d..(kvh + 1) * d]) * scale;
        max = max.max(*s);
    }
    let mut sum = 0.0f32;
    for s in scores[..n].iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    oh.fill(0.0);
    for (i, &s) in scores[..n].iter().enumerate() {
        let (_, v) = kv(first + i);
        let p = s / sum;
        for (o, &vv) in oh.iter_mut().zip(&v[kvh * d..(kvh + 1) * d]) {
            *o += p * vv;
        }
    }
}

/// Nodes after `Op::Experts` that [`shared_tail`] folds into it.
const SHARED_TAIL: usize = 5;

/// Whether node `i` (`Op::Experts` reading `x`, writing `routed`) is followed by the shared
/// expert of the same input and the sum `routed + shared`, as `laguna::build` emits them:
/// `g = x·Gᵀ, u = x·Uᵀ, a = swiglu(g, u), d = a·Dᵀ, sum = routed + d`, with none of
/// `g, u, a, d` read by a later node. Returns the sum's value.
fn shared_tail(nodes: &[Op], i: usize, x: usize, routed: usize) -> Option<usize> {
    use Weight::Layer as W;
    let [
        Op::MatMul {
            x: x1,
            w: W(l1, L::GateShexp),
            out: g,
        },
        Op::MatMul {
            x: x2,
            w: W(l2, L::UpShexp),
            out: u,
        },
        Op::SwiGlu {
            gate: g2,
            up: u2,
            out: a,
        },
        Op::MatMul {
            x: a2,
            w: W(l3, L::DownShexp),
            out: d,
        },
        Op::Add {
            a: r,
            b: d2,
            out: sum,
        },
    ] = nodes.get(i + 1..i + 1 + SHARED_TAIL)?
    else {
        return None;
    };
    let Op::Experts { layer, .. } = nodes[i] else {
        return None;
    };
    let shape = [*x1, *x2] == [x, x]
        && [*l1, *l2, *l3] == [layer; 3]
        && [*g2, *u2, *a2, *d2, *r] == [*g, *u, *a, *d, routed];
    let private = |v: usize| {
        nodes[i + 1 + SHARED_TAIL..]
            .iter()
            .all(|op| op.inputs().all(|y| y != v))
    };
    (shape && [*g, *u, *a, *d].into_iter().all(private)).then_some(*sum)
}

/// `out[t, r] = x[t] · W[r]` with the output rows split across the pool; each thread decodes
/// its rows once and dots them with every token.
fn matmul(
    pool: &ThreadPool,
    threads: &[Mutex<ThreadScratch>],
    wm: &MatRef<'_>,
    xs: &[f32],
    n: usize,
    o: &mut [f32],
) {
    let (rows, cols) = (wm.rows, wm.cols);
    let out = SharedOut::new(o);
    let nt = pool.n_threads();
    let work = Dynamic::balanced(rows, nt, CLAIMS_PER_THREAD);
    pool.run(&|ti| {
        let mut sc = threads[ti].lock().unwrap_or_else(|e| e.into_inner());
        let row = &mut sc.row[..cols];
        for r in work.items() {
            wm.dequant_row(r, row);
            for t in 0..n {
                let v = ops::dot(&xs[t * cols..(t + 1) * cols], row);
                // SAFETY: row `r` belongs to this thread only.
                unsafe { out.set(t * rows + r, v) };
            }
        }
    });
}

/// Routes `n` tokens: top-k ids (u32 bits) and weights from router logits `zs`, one token
/// per work item (on the calling thread alone for one token).
#[allow(clippy::too_many_arguments)]
fn route(
    pool: &ThreadPool,
    threads: &[Mutex<ThreadScratch>],
    zs: &[f32],
    bias: &[f32],
    norm: bool,
    k: usize,
    n: usize,
    ids: &mut [f32],
    ws: &mut [f32],
) {
    let e = bias.len();
    let (iv, wv) = (SharedOut::new(ids), SharedOut::new(ws));
    let one = |sc: &mut ThreadScratch, t: usize| {
        let ThreadScratch {
            sel, ids_k, ws_k, ..
        } = sc;
        ops::router::route(&zs[t * e..(t + 1) * e], bias, norm, ids_k, ws_k, sel);
        // SAFETY: token t's rows of ids and weights are written by this item only.
        let (di, dw) = unsafe { (iv.slice(t * k..(t + 1) * k), wv.slice(t * k..(t + 1) * k)) };
        for (d, &id) in di.iter_mut().zip(ids_k.iter()) {
            *d = f32::from_bits(id);
        }
        dw.copy_from_slice(ws_k);
    };
    if n == 1 {
        let mut sc = threads[0].lock().unwrap_or_else(|e| e.into_inner());
        one(&mut sc, 0);
        return;
    }
    let work = Dynamic::balanced(n, pool.n_threads(), CLAIMS_PER_THREAD);
    pool.run(&|ti| {
        let mut sc = threads[ti].lock().unwrap_or_else(|e| e.into_inner());
        for t in work.items() {
            one(&mut sc, t);
        }
    });
}

/// Rows below which activations are quantised on the calling thread (a dispatch costs more).
const PARALLEL_QUANT_ROWS: usize = 4;

/// Where `n` rows of `ab` bytes go in `buf`: `(offset, stride)`, the rows 64 bytes apart from
/// a 64-byte boundary (`ab` rounded up) where `buf` has the room, else `(0, ab)`. Aligned rows
/// keep every 64-byte activation load (the tile kernel's A rows, the 512-bit kernels'
/// operands) on one cache line: the AMX Q4_K kernel measured +10% with them (session 31),
/// XS.2 pp512 +7% on the 2-core AMX VM (session 32).
pub(crate) fn aligned_rows(buf: &[u8], ab: usize, n: usize) -> (usize, usize) {
    let stride = ab.next_multiple_of(64);
    let off = buf.as_ptr().align_offset(64);
    if n > 1
        && off
            .checked_add(n * stride)
            .is_some_and(|end| end <= buf.len())
    {
        (off, stride)
    } else {
        (0, ab)
    }
}

/// Bytes for `n` rows of `ab` that [`aligned_rows`] can always align.
pub(crate) fn aligned_rows_bytes(n: usize, ab: usize) -> usize {
    n * ab.next_multiple_of(64) + 64
}

/// Quantises `n` activation rows of `cols` into `act` at [`aligned_rows`]' places, rows split
/// across the pool when there are several; returns the rows' bytes from the first (`n`
/// strides) and the stride.
fn quantize_rows<'a>(
    k: &Kernels,
    pool: &ThreadPool,
    fmt: ActFormat,
    xs: &[f32],
    n: usize,
    cols: usize,
    act: &'a mut [u8],
) -> (&'a [u8], usize) {
    let ab = Kernels::act_row_bytes(fmt, cols);
    let (off, stride) = aligned_rows(act, ab, n);
    let act = &mut act[off..off + n * stride];
    let one = |t: usize, dst: &mut [u8]| k.quantize_act(fmt, &xs[t * cols..(t + 1) * cols], dst);
    if n < PARALLEL_QUANT_ROWS {
        for t in 0..n {
            one(t, &mut act[t * stride..t * stride + ab]);
        }
        return (act, stride);
    }
    let out = SharedOut::new(act);
    let work = Dynamic::balanced(n, pool.n_threads(), CLAIMS_PER_THREAD);
    pool.run(&|_| {
        for t in work.items() {
            // SAFETY: row t is written by this item only.
            one(t, unsafe { out.slice(t * stride..t * stride + ab) });
        }
    });
    (act, stride)
}

/// Most matmuls fused into one dispatch (Q, K, V and the gate read the same normed input).
const MAX_FUSED: usize = 4;

/// How many nodes from the start of `nodes` are matmuls of the value `x` (at most
/// [`MAX_FUSED`]).
fn same_input_matmuls(nodes: &[Op], x: usize) -> usize {
    nodes
        .iter()
        .take(MAX_FUSED)
        .take_while(|op| matches!(op, Op::MatMul { x: x2, .. } if *x2 == x))
        .count()
}

/// Runs consecutive matmuls of one input as a single pool dispatch: the input is quantised
/// once and the row tiles of every matrix are handed out together. Returns `false` (and does
/// nothing) when the matrices want different activation formats or the outputs are not
/// disjoint; the caller then runs them one by one.
fn matmuls_fused(
    k: &Kernels,
    st: &mut State,
    graph: &Graph,
    w: &ModelWeights<'_>,
    nodes: &[Op],
    n: usize,
) -> bool {
    let vals = &graph.values;
    let mut mats: [Option<(&MatRef<'_>, Value)>; MAX_FUSED] = [None; MAX_FUSED];
    let mut xv = None;
    for (slot, op) in mats.iter_mut().zip(nodes) {
        let Op::MatMul { x, w: wid, out } = *op else {
            return false;
        };
        xv = Some(vals[x]);
        *slot = Some((mat(w, wid), vals[out]));
    }
    let Some(xv) = xv else { return false };
    let fmt = k.act_format(mats[0].as_ref().map(|m| m.0).expect("at least one matmul"));
    if mats
        .iter()
        .flatten()
        .any(|(m, _)| k.act_format(m) != fmt || m.cols != xv.cols)
    {
        return false;
    }
    // Every output must be disjoint from the input and from each other (no allocation here:
    // this runs on every decode step).
    let range = |v: Value| v.offset..v.offset + v.rows(n) * v.cols;
    let ranges: [core::ops::Range<usize>; MAX_FUSED + 1] = core::array::from_fn(|j| match j {
        0 => range(xv),
        _ => mats[j - 1].map_or(0..0, |(_, o)| range(o)),
    });
    let used = &ranges[..1 + nodes.len().min(MAX_FUSED)];
    for (a, ra) in used.iter().enumerate() {
        if ra.end > st.arena.len()
            || used[a + 1..]
                .iter()
                .any(|rb| ra.start < rb.end && rb.start < ra.end)
        {
            return false;
        }
    }
    let cols = xv.cols;
    let (act, ab) = quantize_rows(
        k,
        &st.pool,
        fmt,
        &st.arena[range(xv)],
        n,
        cols,
        &mut st.scratch.act,
    );
    let base = st.arena.as_mut_ptr();
    let outs: [Option<SharedOut>; MAX_FUSED] = core::array::from_fn(|j| {
        // SAFETY: each output range lies inside the arena and overlaps neither the input nor
        // another output (checked above); the arena is not touched otherwise until the
        // dispatch below returns.
        mats[j].map(|(_, o)| unsafe { SharedOut::from_raw(base.add(o.offset), o.rows(n) * o.cols) })
    });
    let jobs: [Option<(&MatRef<'_>, SharedOut)>; MAX_FUSED] =
        core::array::from_fn(|j| mats[j].map(|(m, _)| m).zip(outs[j]));
    dot_tiles(k, &st.pool, &st.scratch.threads, &jobs, act, ab, n);
    true
}

/// The fast matmul: activations quantised once per token (as the weight type asks), output
/// rows split across threads in tiles of [`ROW_TILE`], each tile dotted with every token.
fn matmul_fast(
    k: &Kernels,
    pool: &ThreadPool,
    threads: &[Mutex<ThreadScratch>],
    act: &mut [u8],
    wm: &MatRef<'_>,
    xs: &[f32],
    n: usize,
    o: &mut [f32],
) {
    let cols = wm.cols;
    let fmt = k.act_format(wm);
    let (act, ab) = quantize_rows(k, pool, fmt, xs, n, cols, act);
    let jobs = [Some((wm, SharedOut::new(o))), None, None, None];
    dot_tiles(k, pool, threads, &jobs, act, ab, n);
}

/// `out_j[t, r] = W_j[r] · act_t` for every matrix `j` of `jobs` and token `t < n`: the row
/// tiles of all matrices form one index space handed out on demand, each tile dotted with
/// every token by [`Kernels::dot_rows_multi`] (`act`: `n` rows of `ab` bytes).
fn dot_tiles(
    k: &Kernels,
    pool: &ThreadPool,
    threads: &[Mutex<ThreadScratch>],
    jobs: &[Option<(&MatRef<'_>, SharedOut)>; MAX_FUSED],
    act: &[u8],
    ab: usize,
    n: usize,
) {
    // Matrix j owns tiles first[j]..first[j + 1].
    let all_rows = jobs.iter().flatten().map(|(m, _)| m.rows).sum();
    let tile = row_tile(n, all_rows, pool.n_threads());
    let mut first = [0usize; MAX_FUSED + 1];
    for j in 0..MAX_FUSED {
        first[j + 1] = first[j] + jobs[j].as_ref().map_or(0, |(m, _)| m.rows.div_ceil(tile));
    }
    let work = Dynamic::balanced(first[MAX_FUSED], pool.n_threads(), CLAIMS_PER_THREAD);
    pool.run(&|ti| {
        let mut sc = threads[ti].lock().unwrap_or_else(|e| e.into_inner());
        for f in work.items() {
            let j = first.partition_point(|&s| s <= f) - 1;
            let Some((wm, out)) = &jobs[j] else { continue };
            let rows = wm.rows;
            let r0 = (f - first[j]) * tile;
            let m = tile.min(rows - r0);
            k.dot_rows_multi(wm, r0, m, act, ab, n, &mut sc.tile[..n * m], m);
            for t in 0..n {
                // SAFETY: tile (j, r0) is claimed by exactly one thread, and the outputs of
                // different matrices are disjoint (the callers' contract).
                let dst = unsafe { out.slice(t * rows + r0..t * rows + r0 + m) };
                let src = &sc.tile[t * m..(t + 1) * m];
                // A whole tile's row has a length known here, so it is copied inline instead
                // of through a `memcpy` call per token.
                match (
                    <&mut [f32; ROW_TILE]>::try_from(&mut *dst),
                    <&[f32; ROW_TILE]>::try_from(src),
                ) {
                    (Ok(d), Ok(s)) => *d = *s,
                    _ => dst.copy_from_slice(src),
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows go 64-byte aligned and a multiple of 64 bytes apart where the buffer has the
    /// room ([`aligned_rows_bytes`] always gives it), else where they always went.
    #[test]
    fn aligned_rows_align_where_there_is_room() {
        for ab in [292usize, 584, 2336, 3504, 9344] {
            let n = 7;
            let buf = vec![0u8; aligned_rows_bytes(n, ab)];
            for start in [0usize, 1, 17, 63] {
                let b = &buf[start..];
                let (off, stride) = aligned_rows(b, ab, n);
                let room = b.as_ptr().align_offset(64) + n * ab.next_multiple_of(64) <= b.len();
                if room {
                    assert_eq!((b.as_ptr() as usize + off) % 64, 0, "ab {ab} start {start}");
                    assert_eq!(stride, ab.next_multiple_of(64));
                } else {
                    assert_eq!((off, stride), (0, ab), "ab {ab} start {start}");
                }
                assert!(off + (n - 1) * stride + ab <= b.len());
            }
            assert_eq!(aligned_rows(&buf, ab, n).1, ab.next_multiple_of(64));
            // One row, or no room: the plain layout.
            assert_eq!(aligned_rows(&buf, ab, 1), (0, ab));
            assert_eq!(aligned_rows(&buf[..n * ab], ab, n), (0, ab));
        }
    }

    /// Decode tiles: 64 rows while a dispatch keeps four items per thread, halved down to
    /// 16 otherwise, always whole groups of 8; several tokens: 16. (Unless
    /// `LAGOON_CPU_DECODE_TILE` fixes it, which the test runs do not set.)
    #[test]
    fn decode_tiles_grow_only_while_every_thread_keeps_items() {
        if std::env::var_os("LAGOON_CPU_DECODE_TILE").is_some() {
            return;
        }
        assert_eq!(row_tile(1, 4096, 16), 64);
        assert_eq!(row_tile(1, 2048, 16), 32);
        assert_eq!(row_tile(1, 1024, 16), 16);
        assert_eq!(row_tile(1, 256, 16), 16);
        assert_eq!(row_tile(1, 512, 2), 64);
        assert_eq!(row_tile(4, 1 << 20, 1), ROW_TILE);
        for rows in [8, 100, 777, 3072, 1 << 16] {
            for nt in 1..=32 {
                let t = row_tile(1, rows, nt);
                assert!(t.is_multiple_of(8) && (ROW_TILE..=MAX_DECODE_TILE).contains(&t));
            }
        }
    }

    /// xorshift64 floats in [-1, 1).
    /// `got` equals `want` up to rounding (1e-5 relative); `what` names the case.
    fn assert_close(got: &[f32], want: &[f32], what: impl Fn() -> String) {
        for (i, (&x, &y)) in got.iter().zip(want).enumerate() {
            assert!(
                (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                "{} [{i}]: {x} vs {y}",
                what()
            );
        }
    }

    /// Every SIMD table (AVX2, AVX-512) has the attention kernels: each must have taken
    /// shapes (`checked` names the table of every case a kernel took).
    fn every_table_took_shapes(checked: &[&str]) {
        for k in Kernels::simd_tables() {
            let n = checked.iter().filter(|&&name| name == k.name()).count();
            assert!(n > 0, "the {} table declined every shape", k.name());
        }
    }

    fn floats(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Every SIMD table's grouped attention (where it has one) against the per-head loop,
    /// for each group size, head widths 32 and 128, full and sliding spans and a ring
    /// buffer that wrapped: equal up to rounding; a shape it declines writes nothing.
    #[test]
    fn grouped_attention_matches_per_head() {
        let mut checked = Vec::new();
        for k in Kernels::simd_tables() {
            for (d, n_kv, cap, first, pos, seed) in [
                (128, 2, 64, 0, 40, 1u64),
                (128, 3, 50, 47, 120, 2),
                (32, 1, 300, 0, 299, 3),
                (128, 2, 9, 7, 7, 4),
            ] {
                let kc = floats(cap * n_kv * d, seed);
                let vc = floats(cap * n_kv * d, seed + 100);
                let kvh = n_kv - 1;
                // Whole KV rows with the head at its offset, and one head's rows back to
                // back (kv.rs's layout).
                for (row, off) in [(n_kv * d, kvh * d), (d, kvh * cap * d)] {
                    for g in 1..=Kernels::ATTEND_MAX_HEADS {
                        let q: Vec<f32> = floats(g * d, seed + g as u64)
                            .iter()
                            .map(|x| 3.0 * x)
                            .collect();
                        let a = AttnGroup {
                            q: &q,
                            kc: &kc,
                            vc: &vc,
                            row,
                            cap,
                            off,
                            d,
                            n_heads: g,
                            first,
                            pos,
                        };
                        let mut scores = vec![0.0; g * cap];
                        let mut got = vec![f32::NAN; g * d];
                        if !k.attend_group(&a, &mut scores, &mut got) {
                            assert!(got.iter().all(|x| x.is_nan()), "declined but wrote");
                            continue;
                        }
                        let kv = |j: usize| {
                            let s = (j % cap) * row + off;
                            (&kc[s..s + d], &vc[s..s + d])
                        };
                        for h in 0..g {
                            let mut want = vec![0.0; d];
                            let qh = &q[h * d..(h + 1) * d];
                            attend_head_lanes(qh, 0, d, first, pos, &kv, &mut scores, &mut want);
                            let got = &got[h * d..(h + 1) * d];
                            assert_close(got, &want, || {
                                format!("{} d {d} g {g} head {h}", k.name())
                            });
                        }
                        checked.push(k.name());
                    }
                }
            }
        }
        every_table_took_shapes(&checked);
    }

    /// The several-token kernel against the per-head loop token by token: every token
    /// count, several group sizes, full and sliding windows, a wrapped ring buffer, blocks
    /// of positions that start unaligned; equal up to rounding.
    #[test]
    fn several_token_attention_matches_per_head() {
        let mut checked = Vec::new();
        for k in Kernels::simd_tables() {
            // (d, n_kv, cap, pos0, window, seed)
            for (d, n_kv, cap, pos0, window, seed) in [
                (128, 2, 64, 0, usize::MAX, 1u64),
                (128, 2, 64, 37, usize::MAX, 2),
                (32, 3, 80, 150, 20, 3),
                (128, 1, 40, 3, 17, 4),
                (64, 2, 200, 100, 64, 5),
            ] {
                let kc = floats(cap * n_kv * d, seed);
                let vc = floats(cap * n_kv * d, seed + 100);
                let kvh = n_kv - 1;
                // Both cache layouts, as in grouped_attention_matches_per_head.
                for (row, off) in [(n_kv * d, kvh * d), (d, kvh * cap * d)] {
                    for g in [1, 3, 6, 8] {
                        for nt in 1..=Kernels::ATTEND_MAX_TOKENS {
                            let stride = g * d + 3 * d;
                            let q: Vec<f32> = floats(nt * stride, seed + 7 * g as u64)
                                .iter()
                                .map(|x| 3.0 * x)
                                .collect();
                            let a = AttnTokens {
                                q: &q,
                                q_stride: stride,
                                n_tokens: nt,
                                kc: &kc,
                                vc: &vc,
                                row,
                                cap,
                                off,
                                d,
                                n_heads: g,
                                pos0,
                                window,
                            };
                            let mut bufs = vec![vec![f32::NAN; g * d]; nt];
                            let mut outs: Vec<&mut [f32]> =
                                bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
                            if !k.attend_tokens(&a, &mut outs) {
                                assert!(
                                    bufs.iter().flatten().all(|x| x.is_nan()),
                                    "declined but wrote"
                                );
                                continue;
                            }
                            let kv = |j: usize| {
                                let s = (j % cap) * row + off;
                                (&kc[s..s + d], &vc[s..s + d])
                            };
                            let mut scores = vec![0.0; cap];
                            for (t, got) in bufs.iter().enumerate() {
                                let pos = pos0 + t;
                                let first = (pos + 1).saturating_sub(window);
                                for h in 0..g {
                                    let mut want = vec![0.0; d];
                                    let qh = &q[t * stride + h * d..][..d];
                                    attend_head_lanes(
                                        qh,
                                        0,
                                        d,
                                        first,
                                        pos,
                                        &kv,
                                        &mut scores,
                                        &mut want,
                                    );
                                    assert_close(&got[h * d..(h + 1) * d], &want, || {
                                        format!(
                                            "{} d {d} g {g} nt {nt} token {t} head {h}",
                                            k.name()
                                        )
                                    });
                                }
                            }
                            checked.push(k.name());
                        }
                    }
                }
            }
        }
        every_table_took_shapes(&checked);
    }
}
