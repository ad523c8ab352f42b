//! Q4_K rows repacked eight at a time: the layout and kernels that apply each sub-block's
//! scale to eight rows per instruction instead of unpacking the 6-bit scales and mins row by
//! row. Sessions use them by default where the copy fits in memory ([`X8Store`], which also
//! holds IQ4_XS, Q5_K, Q6_K, IQ3_XXS, Q8_0, Q4_0, IQ4_NL, MXFP4 and int4 compressed-tensors rows in
//! [`super::x8_iq4xs`]'s, [`super::x8_q5k`]'s, [`super::x8_q6k`]'s, [`super::x8_iq3xxs`]'s,
//! [`super::x8_q8_0`]'s and [`super::x8_ct4`]'s layouts;
//! `SessionOptions::repack` or `LAGOON_CPU_X8=0|1` overrides). Kernels: AVX2
//! (`avx2::k4x8`), and AVX512-VNNI on 256 bits (`avx512::x8`, the same body with `vpdpbusd`)
//! where the CPU has it.
//!
//! Why: the one-row AVX2 Q4_K kernel spends about 86 instructions per super-block, ~30 of
//! them on the scale and min unpacking (BENCHMARKS.md, "CPU on a new development VM"), and at
//! one token it is compute-bound on a core. llama.cpp repacks Q4_K into 8-row interleaved
//! blocks at load for the same reason (`ggml-cpu/repack.cpp`, `block_q4_Kx8`); this is our
//! own layout and kernel, restated from that idea.
//!
//! Layout of one group of 8 rows, per super-block ([`Q4K_X8_BLOCK`] = 1184 bytes, 148 per row
//! against Q4_K's 144):
//!
//! | bytes | what |
//! |---|---|
//! | `[0, 16)` | `d` of rows 0..8 (f16) |
//! | `[16, 32)` | `dmin` of rows 0..8 (f16) |
//! | `[32, 96)` | scale of sub-block j, row r at `32 + 8j + r` (u8, 6 bits) |
//! | `[96, 160)` | mins of sub-blocks 2p and 2p + 1, row r at `96 + 16p + 2r` and `+ 1` |
//! | `[160, 1184)` | quants: bytes `32c + 4k .. + 4` of row r's `qs` at `160 + 256c + 32k + 4r` |
//!
//! so one 32-byte load holds four bytes of each of the eight rows: their low nibbles are
//! elements `64c + 4k ..` (sub-block 2c), the high nibbles `64c + 32 + 4k ..` (sub-block
//! 2c + 1), and a broadcast of four activation bytes meets all eight rows at once.
//!
//! Numerics: lanes are rows, so each lane runs the scalar reference's per-super-block steps
//! in its order (`scalar::vec_dot_q4k_q8k`: exact `sumi` and `summ`, then `acc += (d_a·d)·sumi;
//! acc −= (d_a·dmin)·summ`, no FMA): every kernel here gives the scalar reference's bits. (The
//! one-row AVX2 kernel adds eight f32 lanes per row instead, so its results differ from these
//! by the f32 rounding of that order. A session with the store sends decode and prefill of
//! a held matrix here alike, so its steps stay consistent with each other.)
//!
//! Measured (BENCHMARKS.md, "Q4_K rows repacked eight at a time"): on a 2-core AVX2 VM,
//! 2.6–3x the one-row kernel's rate at one token, 2x the several-token kernel's in prefill.

use std::collections::HashMap;

use lagoon_core::dtype::GgmlType;
use lagoon_core::quant::QK_K;
use lagoon_core::quant::ct::CtMatrix;
use lagoon_core::weights::{Encoding, MatRef};

use super::act::{Q8_0Act, Q8KAct};
use super::ct;
use super::x8_ct4::{
    BlockSums, Ct4Act, Ct4Geom, DotCt4X8, block_sums_fn, dot_ct4_x8, repack_ct4_x8,
};
use super::x8_iq2xxs::{IQ2XXS_BLOCK, IQ2XXS_X8_BLOCK, dot_iq2xxs_x8_multi, repack_iq2xxs_x8};
use super::x8_iq3xxs::{IQ3XXS_BLOCK, IQ3XXS_X8_BLOCK, dot_iq3xxs_x8_multi, repack_iq3xxs_x8};
use super::x8_iq4xs::{IQ4XS_BLOCK, IQ4XS_X8_BLOCK, dot_iq4xs_x8_multi, repack_iq4xs_x8};
use super::x8_k23::{
    Q2K_BLOCK, Q2K_X8_BLOCK, Q3K_BLOCK, Q3K_X8_BLOCK, dot_q2k_x8_multi, dot_q3k_x8_multi,
    repack_q2k_x8, repack_q3k_x8,
};
use super::x8_q5k::{Q5K_BLOCK, Q5K_X8_BLOCK, dot_q5k_x8_multi, repack_q5k_x8};
use super::x8_q6k::{Q6K_BLOCK, Q6K_X8_BLOCK, dot_q6k_x8_multi, repack_q6k_x8};
use super::x8_q8_0::{DotQ80X8, PrepQ80, Q80Geom, repack_x8};

/// Bytes of one group of 8 rows per super-block.
pub const Q4K_X8_BLOCK: usize = 8 * 148;
const Q4K_BLOCK: usize = 144;

/// One 8-row group's dot with one Q8_K activation row: `out[r] = row r · a`.
pub type DotX8 = fn(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]);
/// One 8-row group's dots with several tokens: `out[t][r] = row r · acts[t]`, each the
/// [`DotX8`] result for that token alone (prefill: a weight load serves every token).
pub type DotX8Multi = fn(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]);

/// Repacks `rows` Q4_K rows of `cols` columns (`w`: the rows' 144-byte super-blocks, row after
/// row) into groups of 8 rows ([`Q4K_X8_BLOCK`] bytes per group and super-block, groups in row
/// order). `None` unless `rows` is a multiple of 8, `cols` of 256 and `w` exactly that size.
pub fn repack_q4k_x8(w: &[u8], rows: usize, cols: usize) -> Option<Vec<u8>> {
    let nb = cols / QK_K;
    if rows == 0 || !rows.is_multiple_of(8) || nb == 0 || !cols.is_multiple_of(QK_K) {
        return None;
    }
    if w.len() != rows * nb * Q4K_BLOCK {
        return None;
    }
    let rb = nb * Q4K_BLOCK;
    let mut out = vec![0u8; rows / 8 * nb * Q4K_X8_BLOCK];
    for (g, dst) in out.chunks_exact_mut(nb * Q4K_X8_BLOCK).enumerate() {
        for (b, o) in dst.as_chunks_mut::<Q4K_X8_BLOCK>().0.iter_mut().enumerate() {
            for r in 0..8 {
                let blk: &[u8; Q4K_BLOCK] = w[(8 * g + r) * rb + b * Q4K_BLOCK..][..Q4K_BLOCK]
                    .try_into()
                    .unwrap();
                pack_q4k_row(o, r, &blk[..16], &blk[16..]);
            }
        }
    }
    Some(out)
}

/// Writes row `r` of a group's super-block `o` in the Q4_K 8-row layout (bytes `[0, 1184)`):
/// its `d | dmin | scales[12]` head (16 bytes, the unpacked scales and mins) and its 128
/// bytes of 4-bit `qs`, each four-byte piece i (= 8c + k) to bytes 4r.. of 32-byte row i.
/// (Q5_K's layout, `x8_q5k`, starts with the same.)
pub(crate) fn pack_q4k_row(o: &mut [u8], r: usize, head: &[u8], qs: &[u8]) {
    o[2 * r..2 * r + 2].copy_from_slice(&head[0..2]);
    o[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&head[2..4]);
    for j in 0..8 {
        let (sc, m) = super::scalar::scale_min_k4(j, &head[4..16]);
        o[32 + 8 * j + r] = sc;
        o[96 + 16 * (j / 2) + 2 * r + j % 2] = m;
    }
    let (rows32, _) = o[160..Q4K_X8_BLOCK].as_chunks_mut::<32>();
    for (d, q) in rows32.iter_mut().zip(qs.as_chunks::<4>().0) {
        d[4 * r..4 * r + 4].copy_from_slice(q);
    }
}

/// Repacked copies of a model's Q4_K, IQ4_XS, Q6_K, IQ3_XXS, IQ2_XXS, Q2_K, Q3_K, Q5_K, Q8_0, Q4_0,
/// IQ4_NL and MXFP4 (all but the first three only where their vector kernels run) and symmetric
/// int4 compressed-tensors matrices (this module's layout, [`super::x8_iq4xs`]'s,
/// [`super::x8_q6k`]'s, [`super::x8_iq3xxs`]'s, [`super::x8_iq2xxs`]'s, [`super::x8_k23`]'s,
/// [`super::x8_q5k`]'s, [`super::x8_q8_0`]'s and [`super::x8_ct4`]'s), found by the address of
/// their stored bytes (int4: of their codes, served only with the scales they were made from), and
/// the kernels that read them: what [`super::Kernels::with_x8`] hands the products of those
/// matrices to. `Session::new` makes one where it fits in memory (`LAGOON_CPU_X8`): a second copy
/// of those weights (148 bytes per 144, 138 per 136, 210 per 210, 98 per 98, 66 per 66, 84 per 84,
/// 114 per 110, 180 per 176, 34 per 34, 18 per 18, 18 per 17 (MXFP4), int4 g32 144 per 144), whose
/// results are the scalar reference's (int4: `kernels::ct`'s scalar row kernel's), not the table's
/// one-row kernels'.
pub struct X8Store {
    map: HashMap<usize, Packed, AddrHash>,
    dot: DotX8Multi,
    /// Q4_K's kernel for calls of one token.
    dot_one: DotX8Multi,
    dot_iq4xs: DotX8Multi,
    dot_q6k: DotX8Multi,
    dot_q5k: DotX8Multi,
    dot_iq3xxs: DotX8Multi,
    dot_iq2xxs: DotX8Multi,
    dot_q2k: DotX8Multi,
    dot_q3k: DotX8Multi,
    dot_ct4: DotCt4X8,
    sums_ct4: BlockSums,
    dot_q8_0: DotQ80X8,
    prep_q8_0: PrepQ80,
}

/// The store's map hashes addresses, looked up once per kernel call (thousands per decode
/// step, e.g. per expert and tile of 32 rows): a multiply and a rotate instead of SipHash,
/// whose DoS resistance buys nothing for keys that are our own pointers.
type AddrHash = std::hash::BuildHasherDefault<AddrHasher>;

/// [`AddrHash`]'s hasher: Fibonacci hashing of the one `usize` key (the high bits of the
/// product, where a pointer's varying bits are mixed).
#[derive(Default)]
struct AddrHasher(u64);

impl std::hash::Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_usize` is used for the map's keys; any other input still hashes.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_usize(&mut self, x: usize) {
        let h = (x as u64 ^ self.0).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = h.rotate_left(32);
    }
}

/// Tokens per call of the store's kernel (a stack array of activation rows).
const STORE_TOKENS: usize = 16;

/// A repacked matrix: the ggml type it came from, or the int4 rows' shape
/// ([`super::x8_ct4`]), and its 8-row groups.
enum Packed {
    Ggml(GgmlType, Vec<u8>),
    /// With the address of the scales it was made from (a matrix is served only with them).
    Ct4(Ct4Geom, usize, Vec<u8>),
    /// Q8_0 or Q4_0 rows ([`super::x8_q8_0`]; the geometry says which).
    Q80(Q80Geom, Vec<u8>),
}

impl Packed {
    fn bytes(&self) -> &[u8] {
        match self {
            Packed::Ggml(_, p) | Packed::Ct4(_, _, p) | Packed::Q80(_, p) => p,
        }
    }
}

/// The stored bytes per super-block of a type the store repacks, and of its 8-row groups.
fn block_sizes(ty: GgmlType) -> Option<(usize, usize)> {
    match ty {
        GgmlType::Q4K => Some((Q4K_BLOCK, Q4K_X8_BLOCK)),
        GgmlType::IQ4XS => Some((IQ4XS_BLOCK, IQ4XS_X8_BLOCK)),
        GgmlType::Q6K => Some((Q6K_BLOCK, Q6K_X8_BLOCK)),
        // Only where the vector kernel runs: the one-row table kernels beat the scalar one.
        GgmlType::IQ3XXS if super::x8_iq3xxs::simd() => Some((IQ3XXS_BLOCK, IQ3XXS_X8_BLOCK)),
        GgmlType::IQ2XXS if super::x8_iq2xxs::simd() => Some((IQ2XXS_BLOCK, IQ2XXS_X8_BLOCK)),
        GgmlType::Q2K if super::x8_k23::simd() => Some((Q2K_BLOCK, Q2K_X8_BLOCK)),
        GgmlType::Q3K if super::x8_k23::simd() => Some((Q3K_BLOCK, Q3K_X8_BLOCK)),
        // Likewise (no AVX2 form).
        GgmlType::Q5K if super::x8_q5k::simd() => Some((Q5K_BLOCK, Q5K_X8_BLOCK)),
        _ => None,
    }
}

/// A repackable matrix: key (its bytes' address), what it is, rows.
struct Todo<'a> {
    key: usize,
    what: TodoKind<'a>,
    rows: usize,
}

enum TodoKind<'a> {
    /// Type, bytes, columns.
    Ggml(GgmlType, &'a [u8], usize),
    /// Codes, scales, shape.
    Ct4(&'a [u8], &'a [u8], Ct4Geom),
    /// Q8_0 or Q4_0 bytes, shape.
    Q80(&'a [u8], Q80Geom),
}

impl Todo<'_> {
    /// Bytes of the repacked copy.
    fn planned(&self) -> usize {
        match self.what {
            TodoKind::Ggml(ty, _, cols) => {
                self.rows / 8 * cols / QK_K * block_sizes(ty).map_or(0, |b| b.1)
            }
            TodoKind::Ct4(_, _, g) => self.rows / 8 * g.group_bytes(),
            TodoKind::Q80(_, g) => self.rows / 8 * g.group_bytes(),
        }
    }
}

/// The int4 shape of `m` when the store can take it: pack-quantized int4 in column order,
/// symmetric, one scale per row and group of a multiple of 32 columns (group or channel
/// strategy), rows a multiple of 8, and a CPU with the vector kernel.
fn ct4_geom(m: &CtMatrix<'_>, rows: usize) -> Option<Ct4Geom> {
    let p = ct::plan(m)?;
    let ok = p.codes == ct::Codes::Nib4
        && m.layout.zero.is_none()
        && !p.tensor
        && p.rows_per_grid_row == 1
        && rows.is_multiple_of(8)
        && p.grid_cols == m.layout.cols.div_ceil(p.run)
        && super::x8_ct4::simd();
    ok.then(|| Ct4Geom::new(m.layout.cols, p.run, m.layout.scale_dtype))
        .flatten()
}

/// The distinct repackable Q4_K, IQ4_XS, Q5_K, Q6_K, IQ3_XXS, Q8_0, Q4_0, IQ4_NL, MXFP4 and int4
/// matrices of `mats` (by address).
fn repackable<'a>(mats: impl IntoIterator<Item = &'a MatRef<'a>>) -> Vec<Todo<'a>> {
    let mut todo = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for m in mats {
        match m.enc {
            // The 32-element block types `x8_q8_0` takes (`Q80Geom::codes_of`: one list).
            Encoding::Ggml { ty, data } if Q80Geom::codes_of(ty).is_some() => {
                // Only where the vector kernel runs (there is no AVX2 form).
                if let Some(g) = Q80Geom::codes_of(ty).and_then(|c| Q80Geom::of(c, m.cols))
                    && super::x8_q8_0::simd()
                    && m.rows.is_multiple_of(8)
                    && data.len() == m.rows * g.blocks * g.block_bytes()
                    && seen.insert(data.as_ptr() as usize)
                {
                    todo.push(Todo {
                        key: data.as_ptr() as usize,
                        what: TodoKind::Q80(data, g),
                        rows: m.rows,
                    });
                }
            }
            Encoding::Ggml { ty, data } => {
                if let Some((blk, _)) = block_sizes(ty)
                    && m.rows.is_multiple_of(8)
                    && m.cols.is_multiple_of(QK_K)
                    && data.len() == m.rows * m.cols / QK_K * blk
                    && seen.insert(data.as_ptr() as usize)
                {
                    todo.push(Todo {
                        key: data.as_ptr() as usize,
                        what: TodoKind::Ggml(ty, data, m.cols),
                        rows: m.rows,
                    });
                }
            }
            Encoding::Ct(c) => {
                if let Some(g) = ct4_geom(&c, m.rows)
                    && c.weight.len() == m.rows * g.cols / 2
                    && c.scale.len() == m.rows * g.groups() * g.sd.size()
                    && seen.insert(c.weight.as_ptr() as usize)
                {
                    todo.push(Todo {
                        key: c.weight.as_ptr() as usize,
                        what: TodoKind::Ct4(c.weight, c.scale, g),
                        rows: m.rows,
                    });
                }
            }
        }
    }
    todo
}

impl X8Store {
    /// Bytes [`X8Store::build`] would allocate for `mats` (148 per 144 of each repackable Q4_K
    /// matrix, 138 per 136 of IQ4_XS, 210 per 210 of Q6_K, 98 per 98 of IQ3_XXS, 180 per 176 of
    /// Q5_K, 34 per 34 of Q8_0, 18 per 18 of Q4_0 and IQ4_NL, 18 per 17 of MXFP4 (an odd last block padded to a pair and an odd last pair's line of
    /// scales half empty), the codes and scales' size of int4 (each line of scales padded): for
    /// deciding whether the copy fits before making it.
    pub fn planned_bytes<'a>(mats: impl IntoIterator<Item = &'a MatRef<'a>>) -> usize {
        repackable(mats).iter().map(Todo::planned).sum()
    }

    /// Repacks every Q4_K, IQ4_XS, Q6_K and (where their vector kernels run) IQ3_XXS and Q5_K
    /// matrix of `mats` whose rows are a multiple of 8 and columns of 256, every Q8_0, Q4_0, IQ4_NL and MXFP4 one (where
    /// its vector kernel runs) whose rows are a multiple of 8, and every int4 one `ct4_geom` takes
    /// (others are left to the table). Matrices seen twice are repacked once.
    pub fn build<'a>(mats: impl IntoIterator<Item = &'a MatRef<'a>>) -> X8Store {
        // The distinct repackable matrices, then repacked on all cores (a few hundred MB/s per
        // core: a large model's repack is load time).
        let todo = repackable(mats);
        let n = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(todo.len().max(1));
        let next = std::sync::atomic::AtomicUsize::new(0);
        let parts: Vec<Vec<(usize, Packed)>> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..n)
                .map(|_| {
                    s.spawn(|| {
                        let mut done = Vec::new();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(t) = todo.get(i) else {
                                break done;
                            };
                            let rows = t.rows;
                            let p = match t.what {
                                TodoKind::Ggml(ty, data, cols) => match ty {
                                    GgmlType::IQ4XS => repack_iq4xs_x8(data, rows, cols),
                                    GgmlType::Q6K => repack_q6k_x8(data, rows, cols),
                                    GgmlType::IQ3XXS => repack_iq3xxs_x8(data, rows, cols),
                                    GgmlType::IQ2XXS => repack_iq2xxs_x8(data, rows, cols),
                                    GgmlType::Q2K => repack_q2k_x8(data, rows, cols),
                                    GgmlType::Q3K => repack_q3k_x8(data, rows, cols),
                                    GgmlType::Q5K => repack_q5k_x8(data, rows, cols),
                                    _ => repack_q4k_x8(data, rows, cols),
                                }
                                .map(|p| Packed::Ggml(ty, p)),
                                TodoKind::Ct4(w, sc, g) => repack_ct4_x8(w, sc, rows, &g)
                                    .map(|p| Packed::Ct4(g, sc.as_ptr() as usize, p)),
                                TodoKind::Q80(w, g) => {
                                    repack_x8(w, rows, &g).map(|p| Packed::Q80(g, p))
                                }
                            };
                            if let Some(p) = p {
                                done.push((t.key, p));
                            }
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|h| h.join().unwrap_or_default())
                .collect()
        });
        let map: HashMap<usize, Packed, AddrHash> = parts.into_iter().flatten().collect();
        X8Store {
            map,
            dot: dot_q4k_x8_multi(),
            dot_one: dot_q4k_x8_multi_one_token(),
            dot_iq4xs: dot_iq4xs_x8_multi(),
            dot_q6k: dot_q6k_x8_multi(),
            dot_q5k: dot_q5k_x8_multi(),
            dot_iq3xxs: dot_iq3xxs_x8_multi(),
            dot_iq2xxs: dot_iq2xxs_x8_multi(),
            dot_q2k: dot_q2k_x8_multi(),
            dot_q3k: dot_q3k_x8_multi(),
            dot_ct4: dot_ct4_x8(),
            sums_ct4: block_sums_fn(),
            dot_q8_0: super::x8_q8_0::dot_q8_0_x8(),
            prep_q8_0: super::x8_q8_0::prepare_fn(),
        }
    }

    /// Matrices held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Bytes of the repacked copies.
    pub fn bytes(&self) -> usize {
        self.map.values().map(|p| p.bytes().len()).sum()
    }

    /// [`super::Kernels::dot_rows_multi`] for a held matrix and rows `r0 .. r0 + n_rows` in
    /// whole groups of 8; `false` (nothing written) otherwise.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dot_rows_multi(
        &self,
        w: &MatRef<'_>,
        r0: usize,
        n_rows: usize,
        acts: &[u8],
        act_stride: usize,
        n_act: usize,
        out: &mut [f32],
        out_stride: usize,
    ) -> bool {
        let mut call = Call {
            r0,
            n_rows,
            acts,
            act_stride,
            n_act,
            out,
            out_stride,
        };
        let (ty, data) = match w.enc {
            Encoding::Ggml { ty, data } => (ty, data),
            Encoding::Ct(c) => return self.dot_ct4_rows(w, &c, &mut call),
        };
        let (pty, p) = match self.map.get(&(data.as_ptr() as usize)) {
            Some(Packed::Ggml(pty, p)) => (pty, p),
            Some(Packed::Q80(g, p)) if ty == g.ty() => {
                return self.dot_q8_0_rows(w, g, p, &mut call);
            }
            _ => return false,
        };
        let (cols, nb) = (w.cols, w.cols / QK_K);
        let (group, dot) = match (ty, *pty) {
            (GgmlType::Q4K, GgmlType::Q4K) if n_act == 1 => (nb * Q4K_X8_BLOCK, self.dot_one),
            (GgmlType::Q4K, GgmlType::Q4K) => (nb * Q4K_X8_BLOCK, self.dot),
            (GgmlType::IQ4XS, GgmlType::IQ4XS) => (nb * IQ4XS_X8_BLOCK, self.dot_iq4xs),
            (GgmlType::Q6K, GgmlType::Q6K) => (nb * Q6K_X8_BLOCK, self.dot_q6k),
            (GgmlType::Q5K, GgmlType::Q5K) => (nb * Q5K_X8_BLOCK, self.dot_q5k),
            (GgmlType::IQ3XXS, GgmlType::IQ3XXS) => (nb * IQ3XXS_X8_BLOCK, self.dot_iq3xxs),
            (GgmlType::IQ2XXS, GgmlType::IQ2XXS) => (nb * IQ2XXS_X8_BLOCK, self.dot_iq2xxs),
            (GgmlType::Q2K, GgmlType::Q2K) => (nb * Q2K_X8_BLOCK, self.dot_q2k),
            (GgmlType::Q3K, GgmlType::Q3K) => (nb * Q3K_X8_BLOCK, self.dot_q3k),
            _ => return false,
        };
        let ab = super::act::q8k_row_bytes(cols);
        if p.len() != w.rows / 8 * group || !call.fits(w.rows, ab) {
            return false;
        }
        let mut y = [[0.0f32; 8]; STORE_TOKENS];
        for c0 in (0..n_act).step_by(STORE_TOKENS) {
            let nc = STORE_TOKENS.min(n_act - c0);
            let mut refs: [&[u8]; STORE_TOKENS] = [&[]; STORE_TOKENS];
            for (t, r) in refs[..nc].iter_mut().enumerate() {
                *r = call.act(c0 + t, ab);
            }
            for g in call.groups() {
                dot(&p[g * group..][..group], &refs[..nc], cols, &mut y[..nc]);
                call.put(c0, g, &y[..nc]);
            }
        }
        true
    }

    /// [`X8Store::dot_rows_multi`] for an int4 compressed-tensors matrix: each token's
    /// per-block `Σ q` once per call ([`super::x8_ct4::block_sums_fn`]), then the 8-row kernel
    /// over the groups.
    fn dot_ct4_rows(&self, w: &MatRef<'_>, c: &CtMatrix<'_>, call: &mut Call<'_>) -> bool {
        let Some(Packed::Ct4(g, sp, p)) = self.map.get(&(c.weight.as_ptr() as usize)) else {
            return false;
        };
        // The same codes with other scales or zero points are not this copy.
        if *sp != c.scale.as_ptr() as usize
            || c.layout.zero.is_some()
            || c.layout.scale_dtype != g.sd
        {
            return false;
        }
        let ab = super::act::q8_0_row_bytes(g.cols);
        if g.cols != w.cols || p.len() != w.rows / 8 * g.group_bytes() || !call.fits(w.rows, ab) {
            return false;
        }
        // The block sums in a per-thread buffer that grows once (no allocation, and no
        // zeroing of a worst-case stack array, per call).
        thread_local! {
            static SUMS: core::cell::RefCell<Vec<i32>> = const { core::cell::RefCell::new(Vec::new()) };
        }
        SUMS.with_borrow_mut(|sums| {
            if sums.len() < STORE_TOKENS * g.blocks() {
                sums.resize(STORE_TOKENS * g.blocks(), 0);
            }
            self.ct4_chunks(g, p, call, sums)
        })
    }

    /// [`X8Store::dot_rows_multi`] for a Q8_0 or Q4_0 matrix: each token's activation
    /// prepared once per call ([`super::x8_q8_0::prepare`]), then the 8-row kernel over the
    /// groups.
    fn dot_q8_0_rows(&self, w: &MatRef<'_>, g: &Q80Geom, p: &[u8], call: &mut Call<'_>) -> bool {
        let (cols, ab, gb, pb) = (
            32 * g.blocks,
            super::act::q8_0_row_bytes(32 * g.blocks),
            g.group_bytes(),
            g.act_bytes(),
        );
        if cols != w.cols || p.len() != w.rows / 8 * gb || !call.fits(w.rows, ab) {
            return false;
        }
        // The prepared rows in a per-thread buffer that grows once.
        thread_local! {
            static PREP: core::cell::RefCell<Vec<u8>> = const { core::cell::RefCell::new(Vec::new()) };
        }
        PREP.with_borrow_mut(|buf| {
            if buf.len() < STORE_TOKENS * pb {
                buf.resize(STORE_TOKENS * pb, 0);
            }
            let mut y = [[0.0f32; 8]; STORE_TOKENS];
            for c0 in (0..call.n_act).step_by(STORE_TOKENS) {
                let nc = STORE_TOKENS.min(call.n_act - c0);
                for (t, o) in buf.chunks_exact_mut(pb).take(nc).enumerate() {
                    let ok = Q8_0Act::new(call.act(c0 + t, ab), cols)
                        .is_some_and(|a| (self.prep_q8_0)(&a, g, o));
                    if !ok {
                        return false;
                    }
                }
                let mut refs: [&[u8]; STORE_TOKENS] = [&[]; STORE_TOKENS];
                for (r, o) in refs.iter_mut().zip(buf.chunks_exact(pb)).take(nc) {
                    *r = o;
                }
                for gi in call.groups() {
                    (self.dot_q8_0)(&p[gi * gb..][..gb], g, &refs[..nc], &mut y[..nc]);
                    call.put(c0, gi, &y[..nc]);
                }
            }
            true
        })
    }

    /// [`X8Store::dot_ct4_rows`]'s tokens in chunks of [`STORE_TOKENS`] (`sums`: room for
    /// their block sums).
    fn ct4_chunks(&self, g: &Ct4Geom, p: &[u8], call: &mut Call<'_>, sums: &mut [i32]) -> bool {
        let (nb, ab, gb) = (
            g.blocks(),
            super::act::q8_0_row_bytes(g.cols),
            g.group_bytes(),
        );
        let mut y = [[0.0f32; 8]; STORE_TOKENS];
        for c0 in (0..call.n_act).step_by(STORE_TOKENS) {
            let nc = STORE_TOKENS.min(call.n_act - c0);
            // Each token's block sums, then the kernel's activations over them (parsing a
            // row is slicing, so the second pass costs nothing).
            for (t, s) in sums.chunks_exact_mut(nb).take(nc).enumerate() {
                let Some(a) = Q8_0Act::new(call.act(c0 + t, ab), g.cols) else {
                    return false;
                };
                (self.sums_ct4)(&a, s);
            }
            let refs: [Ct4Act<'_>; STORE_TOKENS] = core::array::from_fn(|t| {
                let t = t.min(nc - 1);
                Ct4Act {
                    a: Q8_0Act::new(call.act(c0 + t, ab), g.cols).expect("parsed above"),
                    bsum: &sums[t * nb..][..nb],
                }
            });
            for gi in call.groups() {
                (self.dot_ct4)(&p[gi * gb..][..gb], g, &refs[..nc], &mut y[..nc]);
                call.put(c0, gi, &y[..nc]);
            }
        }
        true
    }
}

/// One [`X8Store::dot_rows_multi`] call: rows `r0 .. r0 + n_rows` of a matrix against
/// `n_act` activation rows (`act_stride` apart), into `out` (`out_stride` per token).
struct Call<'c> {
    r0: usize,
    n_rows: usize,
    acts: &'c [u8],
    act_stride: usize,
    n_act: usize,
    out: &'c mut [f32],
    out_stride: usize,
}

impl<'c> Call<'c> {
    /// Whole groups of 8 of a matrix of `rows` rows, at least one token, and buffers that hold
    /// every activation row (`ab` bytes each) and output.
    fn fits(&self, rows: usize, ab: usize) -> bool {
        self.r0.is_multiple_of(8)
            && self.n_rows.is_multiple_of(8)
            && self.r0 + self.n_rows <= rows
            && self.n_act > 0
            && (self.n_act - 1) * self.act_stride + ab <= self.acts.len()
            && (self.n_act - 1) * self.out_stride + self.n_rows <= self.out.len()
    }

    /// Token t's activation row (`ab` bytes; in bounds once [`Call::fits`]).
    fn act(&self, t: usize, ab: usize) -> &'c [u8] {
        let acts: &'c [u8] = self.acts;
        &acts[t * self.act_stride..][..ab]
    }

    /// The 8-row groups of the call.
    fn groups(&self) -> core::ops::Range<usize> {
        self.r0 / 8..(self.r0 + self.n_rows) / 8
    }

    /// Writes group g's results for tokens `c0 ..` (`y`, one row of 8 per token).
    fn put(&mut self, c0: usize, g: usize, y: &[[f32; 8]]) {
        for (t, yt) in y.iter().enumerate() {
            let at = (c0 + t) * self.out_stride + 8 * g - self.r0;
            self.out[at..at + 8].copy_from_slice(yt);
        }
    }
}

/// The scalar kernel: each row in the scalar reference's order. NaN in every output when `p`
/// or `a` is not one group of `cols` columns.
pub fn dot_q4k_x8_scalar(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
    k_x8_scalar::<Q4K_X8_BLOCK>(p, a, cols, out, false);
}

/// The scalar kernel of the Q4_K 8-row layout and of Q5_K's (`x8_q5k`, `fifth`: each value's
/// bit 4 from the rows' `qh` after the Q4_K bytes), each row in the scalar reference's order
/// (`scalar::vec_dot_q4k_q8k` / `vec_dot_q5k_q8k`). NaN in every output when `p` or `a` is
/// not one group of `cols` columns.
pub(crate) fn k_x8_scalar<const BLOCK: usize>(
    p: &[u8],
    a: &[u8],
    cols: usize,
    out: &mut [f32; 8],
    fifth: bool,
) {
    let nb = cols / QK_K;
    let Some(a) = Q8KAct::new(a, cols).filter(|_| p.len() == nb * BLOCK) else {
        *out = [f32::NAN; 8];
        return;
    };
    let f16 = super::scalar::f16_at;
    for (r, y) in out.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for (b, o) in p.chunks_exact(BLOCK).enumerate() {
            let qa = &a.qs[QK_K * b..][..QK_K];
            let (mut sumi, mut summ) = (0i32, 0i32);
            for j in 0..8 {
                let (c, hi) = (j / 2, j % 2);
                let mut dot = 0i32;
                for l in 0..32 {
                    let at = 32 * (l / 4) + 4 * r + l % 4;
                    let byte = o[160 + 256 * c + at];
                    let mut q = if hi == 0 { byte & 0xF } else { byte >> 4 };
                    if fifth {
                        q |= ((o[Q4K_X8_BLOCK + at] >> j) & 1) << 4;
                    }
                    dot += i32::from(q) * i32::from(qa[32 * j + l]);
                }
                sumi += i32::from(o[32 + 8 * j + r]) * dot;
                let m = i32::from(o[96 + 16 * (j / 2) + 2 * r + j % 2]);
                summ += m * (i32::from(a.bsum(b, 2 * j)) + i32::from(a.bsum(b, 2 * j + 1)));
            }
            let da = a.d(b);
            acc += (da * f16(o, 2 * r)) * sumi as f32;
            acc -= (da * f16(o, 16 + 2 * r)) * summ as f32;
        }
        *y = acc;
    }
}

/// [`DotX8Multi`] on the scalar kernel, token by token (NaN everywhere when the lengths of
/// `acts` and `out` differ).
pub fn dot_q4k_x8_multi_scalar(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
    by_token(dot_q4k_x8_scalar, p, acts, cols, out);
}

/// A [`DotX8Multi`] made of the one-token kernel `one`, token by token (NaN everywhere when
/// the lengths of `acts` and `out` differ): the scalar several-token kernels.
pub(crate) fn by_token(one: DotX8, p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
    if acts.len() != out.len() {
        out.iter_mut().for_each(|o| *o = [f32::NAN; 8]);
        return;
    }
    for (a, o) in acts.iter().zip(out) {
        one(p, a, cols, o);
    }
}

/// What the 8-row layouts' unit tests share: random data, and the check that every kernel of
/// a layout gives the scalar reference's bits.
#[cfg(test)]
pub(crate) mod testing {
    use super::{DotX8Multi, QK_K};
    use crate::kernels::{ActFormat, Kernels};

    pub(crate) fn rng(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    /// A Q8_0 activation row of `cols` random values at `scale` (the int4 and Q8_0 8-row
    /// kernels' format).
    pub(crate) fn act_q8_0(seed: &mut u64, cols: usize, scale: f32) -> Vec<u8> {
        let x: Vec<f32> = (0..cols)
            .map(|_| ((rng(seed) % 2001) as f32 - 1000.0) * scale)
            .collect();
        let mut a = vec![0u8; Kernels::act_row_bytes(ActFormat::Q8_0, cols)];
        Kernels::scalar().quantize_act(ActFormat::Q8_0, &x, &mut a);
        a
    }

    /// A Q8_K activation row of `cols` random values at `scale`.
    pub(crate) fn act(seed: &mut u64, cols: usize, scale: f32) -> Vec<u8> {
        let x: Vec<f32> = (0..cols)
            .map(|_| ((rng(seed) % 2001) as f32 - 1000.0) * scale)
            .collect();
        let mut a = vec![0u8; Kernels::act_row_bytes(ActFormat::Q8K, cols)];
        Kernels::scalar().quantize_act(ActFormat::Q8K, &x, &mut a);
        a
    }

    /// A Q8_K row of `cols` values at full scale: −128 every fifth byte, else 127 and −127
    /// alternating, with its block sums (the vector kernels read them) recomputed.
    pub(crate) fn full_scale(seed: &mut u64, cols: usize) -> Vec<u8> {
        let mut a = act(seed, cols, 1.0);
        for (i, q) in a[..cols].iter_mut().enumerate() {
            *q = if i % 5 == 0 {
                0x80
            } else if i % 2 == 0 {
                127
            } else {
                0x81
            };
        }
        let nb = cols / QK_K;
        for m in 0..16 * nb {
            let s: i16 = a[16 * m..][..16].iter().map(|&q| i16::from(q as i8)).sum();
            a[cols + 4 * nb + 2 * m..][..2].copy_from_slice(&s.to_le_bytes());
        }
        a
    }

    /// A family's several-token kernels to test: the scalar one, and where this CPU runs
    /// them AVX2's (`arch(false)`) and AVX512-VNNI's (`arch(true)`).
    pub(crate) fn kernels(
        scalar: DotX8Multi,
        #[cfg(target_arch = "x86_64")] arch: fn(bool) -> Option<DotX8Multi>,
    ) -> Vec<(&'static str, DotX8Multi)> {
        #[allow(unused_mut)]
        let mut k = vec![("scalar", scalar)];
        #[cfg(target_arch = "x86_64")]
        {
            k.extend(arch(false).map(|f| ("avx2", f)));
            if crate::kernels::arch::x86_64::avx512_table().is_some() {
                k.extend(arch(true).map(|f| ("vnni", f)));
            }
        }
        k
    }

    /// A Q8_K row of `cols` values, all 1.0 but the first of each 256 (`first`): with
    /// `first` 1.0 every byte is −128, with −1.0 the first of each 256 is −128 and the rest
    /// 127.
    pub(crate) fn extreme(cols: usize, first: f32) -> Vec<u8> {
        let x: Vec<f32> = (0..cols)
            .map(|i| if i % QK_K == 0 { first } else { 1.0 })
            .collect();
        let mut a = vec![0u8; Kernels::act_row_bytes(ActFormat::Q8K, cols)];
        Kernels::scalar().quantize_act(ActFormat::Q8K, &x, &mut a);
        a
    }

    /// A layout under test: random rows, the repack, the scalar reference row dot, the
    /// bytes of one super-block of a row and of an 8-row group.
    pub(crate) struct Layout {
        pub rows: fn(&mut u64, usize, usize) -> Vec<u8>,
        pub repack: fn(&[u8], usize, usize) -> Option<Vec<u8>>,
        pub reference: fn(&[u8], &[u8], usize) -> f32,
        pub block: usize,
        pub group_block: usize,
    }

    /// Every kernel of `kernels`, for 1..5 tokens at once over 8–24 rows × 256–3072 columns
    /// (activations at five scales), gives each row and token the reference's bits.
    pub(crate) fn check_reference_bits(l: &Layout, kernels: &[(&str, DotX8Multi)], mut seed: u64) {
        for (n_rows, cols) in [(8usize, 256usize), (16, 1024), (24, 3072)] {
            let w = (l.rows)(&mut seed, n_rows, cols);
            let p = (l.repack)(&w, n_rows, cols).unwrap();
            let rb = cols / QK_K * l.block;
            let group = cols / QK_K * l.group_block;
            let mut acts: Vec<Vec<u8>> = [1e-3f32, 1.0, 1e4, 0.5, 2.0]
                .iter()
                .map(|&s| act(&mut seed, cols, s))
                .collect();
            // The quantised bytes at their extremes: every one −128 (all x equal and
            // positive), and 127 everywhere but one −128 per block.
            acts.extend([extreme(cols, 1.0), extreme(cols, -1.0)]);
            for &(name, f) in kernels {
                for n in 1..=acts.len() {
                    let refs: Vec<&[u8]> = acts[..n].iter().map(Vec::as_slice).collect();
                    for (g, pg) in p.chunks_exact(group).enumerate() {
                        let mut out = vec![[0.0f32; 8]; n];
                        f(pg, &refs, cols, &mut out);
                        for (t, o) in out.iter().enumerate() {
                            for r in 0..8 {
                                let row = &w[(8 * g + r) * rb..][..rb];
                                let want = (l.reference)(row, refs[t], cols);
                                assert_eq!(
                                    o[r].to_bits(),
                                    want.to_bits(),
                                    "{name} {n_rows}x{cols} n={n} t={t} row {}: {} vs {want}",
                                    8 * g + r,
                                    o[r]
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Whether sessions repack by default on this CPU (`SessionOptions::repack` and
/// `LAGOON_CPU_X8` override): yes, except on AMD CPUs with AVX512-VNNI when the 8-row
/// kernels' software prefetch is turned off, where the one-row kernels decode faster
/// (`arch::x86_64::x8_by_default`).
pub fn repack_by_default() -> bool {
    #[cfg(target_arch = "x86_64")]
    return super::arch::x86_64::x8_by_default();
    #[cfg(not(target_arch = "x86_64"))]
    true
}

/// `simd` where this CPU runs it, unless `LAGOON_FORCE_SCALAR=1`; else `scalar`.
pub(crate) fn fastest<F>(simd: Option<F>, scalar: F) -> F {
    match simd {
        Some(f) if std::env::var_os("LAGOON_FORCE_SCALAR").is_none_or(|v| v != "1") => f,
        _ => scalar,
    }
}

/// Whether `LAGOON_FORCE_AVX2=1` keeps AVX-512 kernels out (as the table does).
#[cfg(target_arch = "x86_64")]
pub(crate) fn no_avx512() -> bool {
    std::env::var_os("LAGOON_FORCE_AVX2").is_some_and(|v| v == "1")
}

/// The fastest kernel of an 8-row family this CPU runs: `$arch(vnni)` of
/// `arch::x86_64` (AVX512-VNNI unless `LAGOON_FORCE_AVX2=1`, else AVX2) where detected, else
/// `$scalar`, which `LAGOON_FORCE_SCALAR=1` forces.
macro_rules! x8_pick {
    ($arch:ident, $scalar:expr) => {{
        #[cfg(target_arch = "x86_64")]
        let simd = $crate::kernels::arch::x86_64::$arch(!$crate::kernels::x8::no_avx512());
        #[cfg(not(target_arch = "x86_64"))]
        let simd = None;
        $crate::kernels::x8::fastest(simd, $scalar)
    }};
}
pub(crate) use x8_pick;

/// The fastest [`DotX8Multi`] this CPU runs (`x8_pick!`).
pub fn dot_q4k_x8_multi() -> DotX8Multi {
    x8_pick!(q4k_x8_multi, dot_q4k_x8_multi_scalar)
}

/// The AMX several-token kernel where this CPU and OS run it (`LAGOON_CPU_AMX=0` turns it
/// off): calls of 10–16 tokens at one row stride; others go to the AVX512-VNNI kernel. (Where it
/// exists, [`dot_q4k_x8_multi`] returns it too.)
pub fn dot_q4k_x8_multi_amx() -> Option<DotX8Multi> {
    #[cfg(target_arch = "x86_64")]
    return super::arch::x86_64::q4k_x8_amx_multi();
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// [`dot_q4k_x8_multi`] for calls of one token (decode): 512 bits wherever the CPU has
/// AVX512-VNNI (`arch::x86_64::q4k_x8_multi_one_token`); the same bits as every kernel here.
pub fn dot_q4k_x8_multi_one_token() -> DotX8Multi {
    x8_pick!(q4k_x8_multi_one_token, dot_q4k_x8_multi_scalar)
}

/// The fastest [`DotX8`] this CPU runs (512 bits as [`dot_q4k_x8_multi_one_token`] chooses).
pub fn dot_q4k_x8() -> DotX8 {
    x8_pick!(q4k_x8, dot_q4k_x8_scalar)
}

#[cfg(test)]
mod tests {
    use super::testing::{Layout, act, check_reference_bits, extreme, kernels, rng};
    use super::*;
    use crate::kernels::scalar;
    use crate::kernels::x8_q8_0::{Q4_0_BLOCK, Q8_0_BLOCK};

    /// Random Q4_K rows with finite f16 scales (`dmin` sometimes zero) and random bytes.
    fn rows(seed: &mut u64, rows: usize, cols: usize) -> Vec<u8> {
        let mut w = vec![0u8; rows * cols / QK_K * Q4K_BLOCK];
        for blk in w.chunks_exact_mut(Q4K_BLOCK) {
            for b in blk.iter_mut() {
                *b = rng(seed) as u8;
            }
            let d = half::f16::from_f32((rng(seed) % 1000) as f32 * 1e-5 + 1e-6);
            let m = half::f16::from_f32((rng(seed) % 4) as f32 * 1e-3);
            blk[0..2].copy_from_slice(&d.to_le_bytes());
            blk[2..4].copy_from_slice(&m.to_le_bytes());
        }
        w
    }

    /// The AMX kernel (where the CPU and OS allow it) on 1..=16 tokens whose rows lie at one
    /// stride, as the store passes them: the scalar reference's bits, random and all-15
    /// nibbles, activations at five scales and both extremes. (Rows at other strides take
    /// its 512-bit fallback, checked with the other kernels below.)
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn amx_kernel_gives_the_scalar_reference_bits_for_up_to_16_tokens() {
        let Some(f) = super::super::arch::x86_64::q4k_x8_amx_multi() else {
            eprintln!("no AMX on this CPU (or not granted): skipped");
            return;
        };
        let mut seed = 0x0a3c_5e7f_9b1d_2c4eu64;
        for (n_rows, cols, full) in [
            (8usize, 256usize, false),
            (16, 2048, false),
            (8, 3072, true),
        ] {
            let mut w = rows(&mut seed, n_rows, cols);
            if full {
                for blk in w.chunks_exact_mut(Q4K_BLOCK) {
                    blk[16..].fill(0xFF);
                }
            }
            let p = repack_q4k_x8(&w, n_rows, cols).unwrap();
            let (rb, group) = (cols / QK_K * Q4K_BLOCK, cols / QK_K * Q4K_X8_BLOCK);
            let ab = super::super::act::q8k_row_bytes(cols);
            let stride = ab + 48;
            let mut buf = vec![0u8; 16 * stride];
            for t in 0..16 {
                let a = match t {
                    3 => extreme(cols, 1.0),
                    9 => extreme(cols, -1.0),
                    _ => act(&mut seed, cols, [1e-3f32, 1.0, 1e4, 0.5, 2.0][t % 5]),
                };
                buf[t * stride..][..ab].copy_from_slice(&a);
            }
            for n in 1..=16 {
                let refs: Vec<&[u8]> = (0..n).map(|t| &buf[t * stride..][..ab]).collect();
                for (g, pg) in p.chunks_exact(group).enumerate() {
                    let mut out = vec![[0.0f32; 8]; n];
                    f(pg, &refs, cols, &mut out);
                    for (t, o) in out.iter().enumerate() {
                        for (r, &got) in o.iter().enumerate() {
                            let row = &w[(8 * g + r) * rb..][..rb];
                            let want = scalar::vec_dot_q4k_q8k(row, refs[t], cols);
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "amx {n_rows}x{cols} full={full} n={n} t={t} row {}: {got} vs {want}",
                                8 * g + r
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn x8_kernels_give_the_scalar_reference_bits() {
        #[allow(unused_mut)]
        let mut kernels = kernels(
            dot_q4k_x8_multi_scalar,
            #[cfg(target_arch = "x86_64")]
            super::super::arch::x86_64::q4k_x8_multi,
        );
        // Both AVX-512 forms, whatever LAGOON_CPU_X8_ZMM says.
        #[cfg(target_arch = "x86_64")]
        kernels.extend(super::super::arch::x86_64::q4k_x8_avx512_multi());
        let layout = Layout {
            rows,
            repack: repack_q4k_x8,
            reference: scalar::vec_dot_q4k_q8k,
            block: Q4K_BLOCK,
            group_block: Q4K_X8_BLOCK,
        };
        check_reference_bits(&layout, &kernels, 0x9e37_79b9_7f4a_7c15);
        // Every nibble 15, met by the extreme activations: the largest sums, which the AVX2
        // form holds in i16 lanes (≤ 30,720).
        let full = Layout {
            rows: |seed, n, cols| {
                let mut w = rows(seed, n, cols);
                for blk in w.chunks_exact_mut(Q4K_BLOCK) {
                    blk[16..].fill(0xFF);
                }
                w
            },
            ..layout
        };
        check_reference_bits(&full, &kernels, 0x7f4a_7c15_9e37_79b9);
        // The one-token entry points give the same bits as the several-token ones.
        let mut seed = 0x1234_5678_9abc_def1u64;
        let (n_rows, cols) = (8, 3072);
        let w = rows(&mut seed, n_rows, cols);
        let p = repack_q4k_x8(&w, n_rows, cols).unwrap();
        let a = act(&mut seed, cols, 1.0);
        let mut one = [0.0f32; 8];
        dot_q4k_x8()(&p, &a, cols, &mut one);
        let mut multi = [[0.0f32; 8]];
        dot_q4k_x8_multi()(&p, &[&a], cols, &mut multi);
        assert_eq!(one.map(f32::to_bits), multi[0].map(f32::to_bits));
        let mut out = vec![[0.0f32; 8]; 2];
        dot_q4k_x8_multi()(&p, &[&a], cols, &mut out);
        assert!(out.iter().flatten().all(|v| v.is_nan()), "lengths differ");
    }

    #[test]
    fn repack_refuses_ragged_shapes_and_kernels_flag_bad_input() {
        assert!(repack_q4k_x8(&[0; 144 * 7], 7, 256).is_none());
        assert!(repack_q4k_x8(&[0; 144 * 8], 8, 255).is_none());
        assert!(repack_q4k_x8(&[0; 144 * 8 - 1], 8, 256).is_none());
        let mut out = [0.0f32; 8];
        dot_q4k_x8()(&[0; Q4K_X8_BLOCK - 1], &[0; 256 + 4 + 32], 256, &mut out);
        assert!(out.iter().all(|v| v.is_nan()));
    }

    /// The store repacks what `planned_bytes` counts (every repackable type once, ragged and
    /// other types left out) and answers for those matrices only, with the layout's bits.
    #[test]
    fn store_holds_what_it_planned_and_serves_only_those() {
        use lagoon_core::dtype::GgmlType;
        let mut seed = 0x00dd_ba11_u64;
        let (cols, n) = (512usize, 16usize);
        let q4 = rows(&mut seed, n, cols);
        let iq4 = vec![0x11u8; n * cols / QK_K * IQ4XS_BLOCK];
        let q6 = vec![0x22u8; n * cols / QK_K * Q6K_BLOCK];
        let iq3 = vec![0x33u8; n * cols / QK_K * IQ3XXS_BLOCK];
        let iq2 = vec![0x55u8; n * cols / QK_K * IQ2XXS_BLOCK];
        let q3 = vec![0x66u8; n * cols / QK_K * Q3K_BLOCK];
        let q8 = vec![0x44u8; n * cols / 32 * Q8_0_BLOCK];
        let q40: Vec<u8> = (0..n * cols / 32 * Q4_0_BLOCK)
            .map(|i| {
                if i % Q4_0_BLOCK == 1 {
                    0x2c
                } else {
                    (i * 37) as u8
                }
            })
            .collect();
        let nl: Vec<u8> = q40.iter().map(|b| b ^ 0x5a).collect();
        let mx: Vec<u8> = (0..n * cols / 32 * 17)
            .map(|i| {
                if i % 17 == 0 {
                    118 + (i % 13) as u8
                } else {
                    (i * 29) as u8
                }
            })
            .collect();
        let ragged = rows(&mut seed, 12, cols);
        let f32s = vec![0u8; 4 * n * cols];
        let m = |ty, rows, data| MatRef {
            rows,
            cols,
            enc: Encoding::Ggml { ty, data },
        };
        let mats = [
            m(GgmlType::Q4K, n, &q4[..]),
            m(GgmlType::Q4K, n, &q4[..]), // the same matrix twice: once
            m(GgmlType::IQ4XS, n, &iq4[..]),
            m(GgmlType::Q6K, n, &q6[..]),
            m(GgmlType::IQ3XXS, n, &iq3[..]),
            m(GgmlType::IQ2XXS, n, &iq2[..]),
            m(GgmlType::Q4K, 12, &ragged[..]),
            m(GgmlType::Q8_0, n, &q8[..]),
            m(GgmlType::F32, n, &f32s[..]),
            m(GgmlType::Q3K, n, &q3[..]),
            m(GgmlType::Q4_0, n, &q40[..]),
            m(GgmlType::IQ4NL, n, &nl[..]),
            m(GgmlType::MXFP4, n, &mx[..]),
        ];
        // IQ3_XXS only where its vector kernel runs.
        let iq3_held = super::super::x8_iq3xxs::simd();
        let iq3_bytes = if iq3_held { IQ3XXS_X8_BLOCK } else { 0 };
        // Q8_0 likewise; 34 bytes per 34 (an even number of blocks).
        let q8_held = super::super::x8_q8_0::simd();
        let q8_bytes = if q8_held {
            8 * cols / 32 * (Q8_0_BLOCK + 3 * Q4_0_BLOCK)
        } else {
            0
        };
        // IQ2_XXS likewise.
        let iq2_held = super::super::x8_iq2xxs::simd();
        let iq2_bytes = if iq2_held { IQ2XXS_X8_BLOCK } else { 0 };
        // Q3_K likewise.
        let q3_held = super::super::x8_k23::simd();
        let q3_bytes = if q3_held { Q3K_X8_BLOCK } else { 0 };
        let want = n / 8
            * (cols / QK_K
                * (Q4K_X8_BLOCK
                    + IQ4XS_X8_BLOCK
                    + Q6K_X8_BLOCK
                    + iq3_bytes
                    + iq2_bytes
                    + q3_bytes)
                + q8_bytes);
        assert_eq!(X8Store::planned_bytes(&mats), want);
        let store = X8Store::build(&mats);
        assert_eq!(
            (store.len(), store.bytes()),
            (
                3 + usize::from(iq3_held)
                    + usize::from(iq2_held)
                    + usize::from(q3_held)
                    + 4 * usize::from(q8_held),
                want
            )
        );
        let a8 = {
            let x: Vec<f32> = (0..cols).map(|i| (i % 17) as f32 - 8.0).collect();
            let ab = super::super::act::q8_0_row_bytes(cols);
            let mut a8 = vec![0u8; ab];
            crate::kernels::Kernels::scalar().quantize_act(
                crate::kernels::ActFormat::Q8_0,
                &x,
                &mut a8,
            );
            a8
        };
        // The 32-element block types (Q8_0, Q4_0, IQ4_NL, MXFP4: matrix, its bytes, bytes a
        // block, the scalar reference), each group of rows 0 and 8: served with Q8_0
        // activations where held, with the reference's bits.
        type Dot = fn(&[u8], &[u8], usize) -> f32;
        let legacy: [(usize, &[u8], usize, Dot); 4] = [
            (7, &q8, Q8_0_BLOCK, scalar::vec_dot_q8_0_q8_0),
            (10, &q40, Q4_0_BLOCK, scalar::vec_dot_q4_0_q8_0),
            (11, &nl, Q4_0_BLOCK, scalar::vec_dot_iq4_nl_q8_0),
            (12, &mx, 17, scalar::vec_dot_mxfp4_q8_0),
        ];
        let mut out8 = vec![0.0f32; 8];
        for (mi, bytes, bb, dot) in legacy {
            for r0 in [0, 8] {
                let served = store.dot_rows_multi(&mats[mi], r0, 8, &a8, a8.len(), 1, &mut out8, 8);
                assert_eq!(served, q8_held, "{:?}", mats[mi].enc);
                if !q8_held {
                    continue;
                }
                let rb = cols / 32 * bb;
                for (r, o) in out8.iter().enumerate() {
                    let want = dot(&bytes[(r0 + r) * rb..][..rb], &a8, cols);
                    assert_eq!(o.to_bits(), want.to_bits(), "matrix {mi} row {}", r0 + r);
                }
            }
        }
        assert_eq!(
            store.dot_rows_multi(
                &mats[4],
                0,
                8,
                &act(&mut seed, cols, 1.0),
                super::super::act::q8k_row_bytes(cols),
                1,
                &mut [0.0; 8],
                8
            ),
            iq3_held
        );
        // The Q3_K matrix likewise.
        let a = act(&mut seed, cols, 1.0);
        let mut out = vec![0.0f32; 8];
        assert_eq!(
            store.dot_rows_multi(&mats[9], 0, 8, &a, a.len(), 1, &mut out, 8),
            q3_held
        );
        if q3_held {
            let rb = cols / QK_K * Q3K_BLOCK;
            for (r, o) in out.iter().enumerate() {
                let want = scalar::vec_dot_q3k_q8k(&q3[r * rb..][..rb], &a, cols);
                assert_eq!(o.to_bits(), want.to_bits(), "Q3_K row {r}");
            }
        }
        // The IQ2_XXS matrix: served where held, with the reference's bits.
        let a = act(&mut seed, cols, 1.0);
        let mut out = vec![0.0f32; 8];
        assert_eq!(
            store.dot_rows_multi(&mats[5], 8, 8, &a, a.len(), 1, &mut out, 8),
            iq2_held
        );
        if iq2_held {
            let rb = cols / QK_K * IQ2XXS_BLOCK;
            for (r, o) in out.iter().enumerate() {
                let want = scalar::vec_dot_iq2_xxs_q8k(&iq2[(8 + r) * rb..][..rb], &a, cols);
                assert_eq!(o.to_bits(), want.to_bits(), "IQ2_XXS row {}", 8 + r);
            }
        }
        let a = act(&mut seed, cols, 1.0);
        let mut out = vec![0.0f32; 8];
        assert!(store.dot_rows_multi(&mats[0], 8, 8, &a, a.len(), 1, &mut out, 8));
        let rb = cols / QK_K * Q4K_BLOCK;
        for (r, o) in out.iter().enumerate() {
            let want = scalar::vec_dot_q4k_q8k(&q4[(8 + r) * rb..][..rb], &a, cols);
            assert_eq!(o.to_bits(), want.to_bits(), "row {}", 8 + r);
        }
        // Not held, or not whole groups of 8 rows: left to the table.
        assert!(!store.dot_rows_multi(&mats[6], 0, 8, &a, a.len(), 1, &mut out, 8));
        assert!(!store.dot_rows_multi(&mats[8], 0, 8, &a, a.len(), 1, &mut out, 8));
        assert!(!store.dot_rows_multi(&mats[0], 4, 8, &a, a.len(), 1, &mut out, 8));
    }

    /// Symmetric int4 group-32 compressed-tensors rows: held where the CPU has the vector
    /// kernel, and then every row and token gets `kernels::ct`'s scalar row kernel's bits;
    /// asymmetric ones are left to the table.
    #[test]
    fn store_takes_symmetric_int4_rows_where_the_vector_kernel_runs() {
        use lagoon_core::quant::ct::{
            CtKind, CtLayout, CtStrategy, PackOrder, ScaleDtype, ZeroPoint,
        };
        let mut seed = 0x0c74_1234_u64;
        let (rows_n, cols) = (24usize, 1024usize);
        let layout = |symmetric: bool| CtLayout {
            kind: CtKind::packed_int(4, CtStrategy::Group(32), symmetric, PackOrder::Dense),
            rows: rows_n,
            cols,
            scale_dtype: ScaleDtype::Bf16,
            zero: (!symmetric).then_some(ZeroPoint::Packed),
        };
        let l = layout(true);
        let weight: Vec<u8> = (0..l.weight_bytes())
            .map(|_| rng(&mut seed) as u8)
            .collect();
        let scale: Vec<u8> = (0..rows_n * cols / 32)
            .flat_map(|_| {
                half::bf16::from_f32(((rng(&mut seed) % 200) as f32 + 1.0) * 1e-4).to_le_bytes()
            })
            .collect();
        let la = layout(false);
        let zero = vec![0x88u8; la.zero_bytes()];
        let sym = CtMatrix::new(l, &weight, &scale, &[]).unwrap();
        let asym = CtMatrix::new(la, &weight, &scale, &zero).unwrap();
        let m = |c| MatRef {
            rows: rows_n,
            cols,
            enc: Encoding::Ct(c),
        };
        let mats = [m(sym), m(asym)];
        let store = X8Store::build(&mats);
        if !super::super::x8_ct4::simd() {
            assert!(store.is_empty());
            return;
        }
        assert_eq!(store.len(), 1, "the symmetric matrix only");
        assert_eq!(store.bytes(), rows_n / 8 * (cols / 32) * (128 + 16));
        let k = crate::kernels::Kernels::scalar();
        let ab = crate::kernels::Kernels::act_row_bytes(crate::kernels::ActFormat::Q8_0, cols);
        let acts: Vec<u8> = (0..3)
            .flat_map(|t| {
                let x: Vec<f32> = (0..cols)
                    .map(|_| ((rng(&mut seed) % 2001) as f32 - 1000.0) * (t + 1) as f32)
                    .collect();
                let mut a = vec![0u8; ab];
                k.quantize_act(crate::kernels::ActFormat::Q8_0, &x, &mut a);
                a
            })
            .collect();
        let mut out = vec![0.0f32; 3 * 16];
        assert!(store.dot_rows_multi(&mats[0], 8, 16, &acts, ab, 3, &mut out, 16));
        let rb = cols / 2;
        let sb = cols / 32 * 2;
        for t in 0..3 {
            for r in 0..16 {
                let row = 8 + r;
                let want = crate::kernels::ct::vec_dot_ct_nib4_q8_0(
                    &weight[row * rb..][..rb],
                    &scale[row * sb..][..sb],
                    ScaleDtype::Bf16,
                    32,
                    &acts[t * ab..][..ab],
                    cols,
                );
                assert_eq!(
                    out[16 * t + r].to_bits(),
                    want.to_bits(),
                    "token {t} row {row}"
                );
            }
        }
        assert!(!store.dot_rows_multi(&mats[1], 0, 8, &acts, ab, 1, &mut out, 8));
        assert!(!store.dot_rows_multi(&mats[0], 4, 8, &acts, ab, 1, &mut out, 8));
    }
}
