//! The graph walker: one match arm per [`Op`], each calling a reference kernel from
//! `lagoon_core::ops` on arena slices. No allocation happens here.

use alloc::vec;
use alloc::vec::Vec;
use std::sync::Mutex;

use lagoon_core::config::ModelConfig;
use lagoon_core::graph::{Graph, LayerWeight as L, Op, Value, Weight};
use lagoon_core::laguna::weights::{Ffn, ModelWeights};
use lagoon_core::ops;
use lagoon_core::weights::MatRef;

use crate::kernels::{ActFormat, Kernels};
use crate::pool::{Dynamic, SharedOut, ThreadPool};
use crate::session::State;

/// Work items are handed out in about this many claims per thread (see [`Dynamic`]).
const CLAIMS_PER_THREAD: usize = 8;

/// Rows a thread computes per kernel call: a tile of `ROW_TILE` weight rows is read once
/// and dotted with every token of the step while it sits in L1/L2.
const ROW_TILE: usize = 16;

/// Per-thread scratch: one decoded weight row, one head's attention scores, one output tile.
#[derive(Debug)]
pub struct ThreadScratch {
    row: Vec<f32>,
    scores: Vec<f32>,
    tile: Vec<f32>,
}

/// Scratch buffers sized at session creation.
#[derive(Debug)]
pub struct Scratch {
    /// One per pool thread, each locked only by its own thread (never contended).
    threads: Vec<Mutex<ThreadScratch>>,
    /// Router selection scores, one token's router logits, its chosen ids and weights.
    sel: Vec<f32>,
    zrow: Vec<f32>,
    ids_k: Vec<u32>,
    ws_k: Vec<f32>,
    /// (token, slot) pairs sorted by expert, and each active expert's (id, first pair, count).
    pairs: Vec<(u32, u32)>,
    groups: Vec<(u32, u32, u32)>,
    /// Gate (then activation) and up rows of every pair: `[ubatch·K, I]` each.
    eg: Vec<f32>,
    eu: Vec<f32>,
    /// Quantised activation rows of the step's tokens, and of the expert pairs.
    act: Vec<u8>,
    act_pairs: Vec<u8>,
}

impl Scratch {
    pub fn new(
        c: &ModelConfig,
        w: &ModelWeights<'_>,
        ubatch: usize,
        max_cap: usize,
        n_threads: usize,
    ) -> Scratch {
        let pairs = ubatch * c.n_experts_used.max(1);
        Scratch {
            threads: (0..n_threads)
                .map(|_| {
                    Mutex::new(ThreadScratch {
                        row: vec![0.0; w.max_cols()],
                        scores: vec![0.0; max_cap.max(1)],
                        tile: vec![0.0; ubatch * ROW_TILE],
                    })
                })
                .collect(),
            sel: vec![0.0; c.n_experts],
            zrow: vec![0.0; c.n_experts],
            ids_k: vec![0; c.n_experts_used],
            ws_k: vec![0.0; c.n_experts_used],
            pairs: Vec::with_capacity(pairs),
            groups: Vec::with_capacity(c.n_experts),
            eg: vec![0.0; pairs * c.expert_ffn],
            eu: vec![0.0; pairs * c.expert_ffn],
            // f32 activations are the widest format: 4 bytes per element.
            act: vec![0; ubatch * 4 * w.max_cols()],
            act_pairs: vec![0; pairs * 4 * c.expert_ffn],
        }
    }
}

/// Splits the arena into the read-only inputs and the output of a node. The planner never
/// overlaps two values that are live at once; this checks it rather than trusting it.
fn io<const N: usize>(
    arena: &mut [f32],
    ins: [(Value, usize); N],
    out: (Value, usize),
) -> ([&[f32]; N], &mut [f32]) {
    let (ov, on) = out;
    let o = ov.offset..ov.offset + ov.rows(on) * ov.cols;
    let ranges = ins.map(|(v, n)| v.offset..v.offset + v.rows(n) * v.cols);
    for r in &ranges {
        assert!(
            r.end <= o.start || o.end <= r.start,
            "planner overlapped a node's input and output"
        );
    }
    let base = arena.as_mut_ptr();
    let len = arena.len();
    assert!(o.end <= len && ranges.iter().all(|r| r.end <= len));
    // SAFETY: every range lies inside `arena` (checked above) and the output range is
    // disjoint from every input range (checked above), so the one mutable slice aliases no
    // shared slice; inputs may alias each other, which is fine for shared borrows.
    let out = unsafe { core::slice::from_raw_parts_mut(base.add(o.start), o.len()) };
    // SAFETY: as above; shared slices of in-bounds ranges disjoint from `out`.
    let ins = ranges
        .map(|r| unsafe { core::slice::from_raw_parts(base.add(r.start) as *const f32, r.len()) });
    (ins, out)
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
        if let (Some(k), Op::MatMul { x, .. }) = (st.kernels, op) {
            let batch = same_input_matmuls(&graph.nodes[i..], *x);
            if batch > 1 && matmuls_fused(&k, st, graph, w, &graph.nodes[i..i + batch], n) {
                skip = batch - 1;
                continue;
            }
        }
        match *op {
            Op::Embed { out } => {
                let (_, o) = io::<0>(&mut st.arena, [], (vals[out], n));
                let e = &w.token_embd;
                for (t, &tok) in st.tokens.iter().enumerate() {
                    e.dequant_row(tok as usize, &mut o[t * e.cols..(t + 1) * e.cols]);
                }
            }
            Op::RmsNorm { x, w: wid, out } => {
                let rows = vals[x].rows(n);
                let ([xs], o) = io(&mut st.arena, [(vals[x], n)], (vals[out], n));
                ops::norm::rms_norm(xs, vector(w, wid), c.rms_eps, o);
                debug_assert_eq!(xs.len(), rows * vals[x].cols);
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
                o.copy_from_slice(xs);
                let table = &st.ropes[sliding as usize];
                let cols = vals[x].cols;
                for t in 0..n {
                    for head in o[t * cols..(t + 1) * cols].chunks_exact_mut(d) {
                        table.apply(head, pos0 + t);
                    }
                }
            }
            Op::KvStore { layer, k, v } => {
                let (kv, vv) = (vals[k], vals[v]);
                let cache = &mut st.kv.layers[layer];
                for t in 0..n {
                    let ks = &st.arena[kv.offset + t * kv.cols..kv.offset + (t + 1) * kv.cols];
                    let vs = &st.arena[vv.offset + t * vv.cols..vv.offset + (t + 1) * vv.cols];
                    cache.store(pos0 + t, ks, vs);
                }
            }
            Op::Attention { layer, q, out } => {
                let ([qs], o) = io(&mut st.arena, [(vals[q], n)], (vals[out], n));
                let hq = c.n_heads[layer];
                let group = hq / c.n_kv_heads;
                let cache = &st.kv.layers[layer];
                let row = st.kv.row;
                let sliding = c.is_sliding(layer);
                let window = c.sliding_window;
                let out = SharedOut::new(o);
                let threads = &st.scratch.threads;
                let nt = st.pool.n_threads();
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
                        let kv = |j| cache.get(j, row);
                        ops::attention::attend_head(
                            &qs[base..base + d],
                            h / group,
                            d,
                            first,
                            pos,
                            &kv,
                            &mut sc.scores,
                            oh,
                        );
                    }
                });
            }
            Op::GateMul { o: ov, g, out } => {
                let ([os, gs], o) =
                    io(&mut st.arena, [(vals[ov], n), (vals[g], n)], (vals[out], n));
                let (ocols, gcols) = (vals[ov].cols, vals[g].cols);
                let per = ocols / gcols; // head_dim (per-head) or 1 (per-element)
                for t in 0..n {
                    for (i, (dst, &src)) in o[t * ocols..(t + 1) * ocols]
                        .iter_mut()
                        .zip(&os[t * ocols..])
                        .enumerate()
                    {
                        *dst = src * ops::softplus(gs[t * gcols + i / per]);
                    }
                }
            }
            Op::SwiGlu { gate, up, out } => {
                let ([gs, us], o) = io(
                    &mut st.arena,
                    [(vals[gate], n), (vals[up], n)],
                    (vals[out], n),
                );
                ops::swiglu(gs, us, o);
            }
            Op::Add { a, b, out } => {
                let ([as_, bs], o) =
                    io(&mut st.arena, [(vals[a], n), (vals[b], n)], (vals[out], n));
                for ((o, &x), &y) in o.iter_mut().zip(as_).zip(bs) {
                    *o = x + y;
                }
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
                let (k, e) = (c.n_experts_used, c.n_experts);
                let (zv, iv, wv) = (vals[z], vals[ids], vals[weights]);
                let sc = &mut st.scratch;
                for t in 0..n {
                    sc.zrow
                        .copy_from_slice(&st.arena[zv.offset + t * e..zv.offset + (t + 1) * e]);
                    ops::router::route(
                        &sc.zrow,
                        bias,
                        c.norm_topk_prob,
                        &mut sc.ids_k,
                        &mut sc.ws_k,
                        &mut sc.sel,
                    );
                    for (dst, &id) in st.arena[iv.offset + t * k..][..k].iter_mut().zip(&sc.ids_k) {
                        *dst = f32::from_bits(id);
                    }
                    st.arena[wv.offset + t * k..][..k].copy_from_slice(&sc.ws_k);
                }
            }
            Op::Experts {
                layer,
                x,
                ids,
                weights,
                out,
            } => {
                let v = [vals[x], vals[ids], vals[weights], vals[out]];
                match st.kernels {
                    None => experts(st, c, w, layer, v, n),
                    Some(k) => experts_fast(&k, st, c, w, layer, v, n),
                }
            }
            Op::LastRow { x, out } => {
                let xv = vals[x];
                let ([xs], o) = io(&mut st.arena, [(xv, n)], (vals[out], n));
                o.copy_from_slice(&xs[(n - 1) * xv.cols..n * xv.cols]);
            }
        }
    }
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

/// Quantises `n` activation rows of `cols` into `act` (row stride = the format's row bytes).
fn quantize_rows(
    k: &Kernels,
    fmt: ActFormat,
    xs: &[f32],
    n: usize,
    cols: usize,
    act: &mut [u8],
) -> usize {
    let ab = Kernels::act_row_bytes(fmt, cols);
    for t in 0..n {
        k.quantize_act(
            fmt,
            &xs[t * cols..(t + 1) * cols],
            &mut act[t * ab..(t + 1) * ab],
        );
    }
    ab
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
    let ab = quantize_rows(k, fmt, &st.arena[range(xv)], n, cols, &mut st.scratch.act);
    let act = &st.scratch.act[..n * ab];
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
    let ab = quantize_rows(k, fmt, xs, n, cols, act);
    let act = &act[..n * ab];
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
    let mut first = [0usize; MAX_FUSED + 1];
    for j in 0..MAX_FUSED {
        first[j + 1] = first[j]
            + jobs[j]
                .as_ref()
                .map_or(0, |(m, _)| m.rows.div_ceil(ROW_TILE));
    }
    let work = Dynamic::balanced(first[MAX_FUSED], pool.n_threads(), CLAIMS_PER_THREAD);
    pool.run(&|ti| {
        let mut sc = threads[ti].lock().unwrap_or_else(|e| e.into_inner());
        for f in work.items() {
            let j = first.partition_point(|&s| s <= f) - 1;
            let Some((wm, out)) = &jobs[j] else { continue };
            let rows = wm.rows;
            let r0 = (f - first[j]) * ROW_TILE;
            let m = ROW_TILE.min(rows - r0);
            k.dot_rows_multi(wm, r0, m, act, ab, n, &mut sc.tile[..n * m], m);
            for t in 0..n {
                // SAFETY: tile (j, r0) is claimed by exactly one thread, and the outputs of
                // different matrices are disjoint (the callers' contract).
                let dst = unsafe { out.slice(t * rows + r0..t * rows + r0 + m) };
                dst.copy_from_slice(&sc.tile[t * m..(t + 1) * m]);
            }
        }
    });
}

/// Groups the (token, slot) pairs of a step by expert, ascending.
fn group_pairs(s: &mut Scratch, ids: &[f32], n: usize, k: usize, n_experts: usize) {
    s.pairs.clear();
    s.groups.clear();
    for e in 0..n_experts {
        let start = s.pairs.len();
        for t in 0..n {
            for slot in 0..k {
                if ids[t * k + slot].to_bits() as usize == e {
                    s.pairs.push((t as u32, slot as u32));
                }
            }
        }
        if s.pairs.len() > start {
            s.groups
                .push((e as u32, start as u32, (s.pairs.len() - start) as u32));
        }
    }
}

/// The fast expert layer: the same work split and summation order as [`experts`], with
/// quantised activations and tiles of [`ROW_TILE`] rows per kernel call.
fn experts_fast(
    kern: &Kernels,
    st: &mut State,
    c: &ModelConfig,
    w: &ModelWeights<'_>,
    layer: usize,
    v: [Value; 4],
    n: usize,
) {
    let Ffn::Moe { gate, up, down, .. } = &w.layers[layer].ffn else {
        unreachable!("experts on a dense layer")
    };
    let (h, i, k) = (c.hidden_size, c.expert_ffn, c.n_experts_used);
    let [xv, idv, wv, ov] = v;
    let ([xs, ids, ws], o) = io(&mut st.arena, [(xv, n), (idv, n), (wv, n)], (ov, n));
    let s = &mut st.scratch;
    group_pairs(s, ids, n, k, c.n_experts);
    let fmt_in = kern.act_format(&gate[0]);
    let ab = quantize_rows(kern, fmt_in, xs, n, h, &mut s.act);
    let (pairs, groups, threads, act) = (&s.pairs, &s.groups, &s.threads, &s.act[..n * ab]);
    let nt = st.pool.n_threads();
    let tiles = i.div_ceil(ROW_TILE);
    let (eg, eu) = (SharedOut::new(&mut s.eg), SharedOut::new(&mut s.eu));
    let work = Dynamic::balanced(groups.len() * tiles, nt, CLAIMS_PER_THREAD);
    st.pool.run(&|ti| {
        let mut sc = threads[ti].lock().unwrap_or_else(|e| e.into_inner());
        for f in work.items() {
            let (e, start, m) = groups[f / tiles];
            let r0 = (f % tiles) * ROW_TILE;
            let nr = ROW_TILE.min(i - r0);
            for (mat, dst) in [(&gate[e as usize], &eg), (&up[e as usize], &eu)] {
                for j in start..start + m {
                    let t = pairs[j as usize].0 as usize;
                    let tile = &mut sc.tile[..nr];
                    kern.dot_rows(mat, r0, &act[t * ab..(t + 1) * ab], tile);
                    // SAFETY: (pair j, rows r0..r0+nr) is written by this work item only.
                    unsafe { dst.slice(j as usize * i + r0..j as usize * i + r0 + nr) }
                        .copy_from_slice(tile);
                }
            }
        }
    });
    let n_pairs = pairs.len();
    for (g, u) in s.eg[..n_pairs * i].iter_mut().zip(&s.eu[..n_pairs * i]) {
        *g = ops::silu(*g) * u;
    }
    let fmt_down = kern.act_format(&down[0]);
    let ab2 = quantize_rows(kern, fmt_down, &s.eg, n_pairs, i, &mut s.act_pairs);
    let act2 = &s.act_pairs[..n_pairs * ab2];
    o.fill(0.0);
    let out = SharedOut::new(o);
    let tiles = h.div_ceil(ROW_TILE);
    let work = Dynamic::balanced(tiles, nt, CLAIMS_PER_THREAD);
    st.pool.run(&|ti| {
        let mut sc = threads[ti].lock().unwrap_or_else(|e| e.into_inner());
        for tile in work.items() {
            let r0 = tile * ROW_TILE;
            let nr = ROW_TILE.min(h - r0);
            for &(e, start, m) in groups.iter() {
                for j in start..start + m {
                    let (t, slot) = pairs[j as usize];
                    let y = &mut sc.tile[..nr];
                    kern.dot_rows(
                        &down[e as usize],
                        r0,
                        &act2[j as usize * ab2..(j as usize + 1) * ab2],
                        y,
                    );
                    let wt = ws[t as usize * k + slot as usize];
                    // SAFETY: output rows r0..r0+nr belong to this thread only.
                    let dst = unsafe { out.slice(t as usize * h + r0..t as usize * h + r0 + nr) };
                    for (d, &yv) in dst.iter_mut().zip(y.iter()) {
                        *d += yv * wt;
                    }
                }
            }
        }
    });
    for x in o.iter_mut() {
        *x *= c.routed_scaling;
    }
}

/// The routed experts of one MoE layer. The (token, slot) pairs are grouped by expert
/// (ascending id); gate/up rows of every active expert are split across threads, then the
/// down projection is split by output row, each thread adding the experts' contributions in
/// ascending expert order — the order transformers' `LagunaExperts.forward` uses, and one
/// that does not depend on the thread count.
fn experts(
    st: &mut State,
    c: &ModelConfig,
    w: &ModelWeights<'_>,
    layer: usize,
    v: [Value; 4],
    n: usize,
) {
    let Ffn::Moe { gate, up, down, .. } = &w.layers[layer].ffn else {
        unreachable!("experts on a dense layer")
    };
    let (h, i, k) = (c.hidden_size, c.expert_ffn, c.n_experts_used);
    let [xv, idv, wv, ov] = v;
    let ([xs, ids, ws], o) = io(&mut st.arena, [(xv, n), (idv, n), (wv, n)], (ov, n));
    let s = &mut st.scratch;
    group_pairs(s, ids, n, k, c.n_experts);
    let (pairs, groups, threads) = (&s.pairs, &s.groups, &s.threads);
    let nt = st.pool.n_threads();
    // Gate and up: work item f = (group f / I, row f % I), for all of the group's tokens.
    let (eg, eu) = (SharedOut::new(&mut s.eg), SharedOut::new(&mut s.eu));
    let work = Dynamic::balanced(groups.len() * i, nt, CLAIMS_PER_THREAD);
    st.pool.run(&|ti| {
        let mut sc = threads[ti].lock().unwrap_or_else(|e| e.into_inner());
        let row = &mut sc.row[..h];
        for f in work.items() {
            let (e, start, m) = groups[f / i];
            let r = f % i;
            for (mat, dst) in [(&gate[e as usize], &eg), (&up[e as usize], &eu)] {
                mat.dequant_row(r, row);
                for j in start..start + m {
                    let t = pairs[j as usize].0 as usize;
                    // SAFETY: element (pair j, row r) is written by this work item only.
                    unsafe { dst.set(j as usize * i + r, ops::dot(&xs[t * h..(t + 1) * h], row)) };
                }
            }
        }
    });
    let n_pairs = pairs.len();
    for (g, u) in s.eg[..n_pairs * i].iter_mut().zip(&s.eu[..n_pairs * i]) {
        *g = ops::silu(*g) * u;
    }
    // Down: each thread owns a range of output rows and sums over experts in order.
    o.fill(0.0);
    let out = SharedOut::new(o);
    let act = &s.eg;
    let work = Dynamic::balanced(h, nt, CLAIMS_PER_THREAD);
    st.pool.run(&|ti| {
        let mut sc = threads[ti].lock().unwrap_or_else(|e| e.into_inner());
        let row = &mut sc.row[..i];
        for r in work.items() {
            for &(e, start, m) in groups.iter() {
                down[e as usize].dequant_row(r, row);
                for j in start..start + m {
                    let (t, slot) = pairs[j as usize];
                    let y = ops::dot(&act[j as usize * i..(j as usize + 1) * i], row);
                    // SAFETY: output row `r` belongs to this thread only.
                    unsafe { out.add(t as usize * h + r, y * ws[t as usize * k + slot as usize]) };
                }
            }
        }
    });
    for x in o.iter_mut() {
        *x *= c.routed_scaling;
    }
}
