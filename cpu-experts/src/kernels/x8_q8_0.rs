//! Q8_0 rows (and Q4_0, IQ4_NL, MXFP4 rows: below) repacked eight at a time: [`super::x8`]'s layout
//! idea for the 8-bit type, whose prefill ran on a 4-row × 4-token GEMM (`avx512::q8_0`) at ~94
//! GFLOP/s a thread on the Zen 4 VM, spending about eight vector operations per block, row and
//! token pair: the product (`vpdpbusd`), its f32 conversion, scale product and FMA, and the rows'
//! and tokens' scales widened and spread (BENCHMARKS.md, session 37). Here one register holds one
//! 4-byte step of **two blocks** of eight rows, so each `vpdpbusd` serves 16 (row, block) dot
//! products, and the f32 step per block pair is shared by the eight rows: about 14 vector
//! operations per token, pair of blocks and eight rows, ~0.9 per (row, block, token).
//!
//! Layout of one group of 8 rows ([`Q80Geom::group_bytes`]), blocks taken in pairs
//! (2p, 2p + 1) (an odd last block is paired with an empty one: zero codes and scale), pairs
//! in units of two (2u, 2u + 1; a last odd pair alone in its unit), each unit one run of
//! 1,088 bytes (576 for a lone pair):
//!
//! | bytes of unit u | what |
//! |---|---|
//! | `[0, 64)` | f16 `d` of pair 2u + h's block 2p + s, row r, at `32h + 2(2r + s)` (a lone pair's second half zero) |
//! | `[64 + 512h + 64k, + 64)` | step k (0..8) of pair 2u + h: row r's bytes `4k .. 4k + 4` of block 2p at `8r`, of block 2p + 1 at `8r + 4`, each `q + 128` (unsigned) |
//!
//! so a 64-byte load puts row r's two blocks in dword lanes 2r and 2r + 1, and one 16-scale
//! load (one `vcvtph2ps`) puts their scales in the same lanes. The scales lie in the stream
//! just before their codes (one 64-byte line per 1,024 bytes of codes), so a thread reads one
//! run front to back.
//!
//! Activations are prepared once per token and call ([`prepare`], `PAIR_ACT` bytes a pair):
//! the pair's quants with the blocks' 4-byte steps interleaved (`dword 2k` = block 2p's step
//! k, `2k + 1` = block 2p + 1's), so that one 8-byte broadcast meets both blocks' step k in
//! every row; then the two blocks' `−128·Σ q` (the unsigned codes' offset, where each lane's
//! accumulation starts) and their f32 scales.
//!
//! Numerics: lane 2r ends at row r's exact `sumi` of block 2p and lane 2r + 1 at block
//! 2p + 1's; each lane then takes the scalar reference's step (`scalar::vec_dot_q8_0_q8_0`:
//! `acc += sumi·(d·d_a)`, no FMA), block 2p's term before 2p + 1's, so every output is the
//! scalar reference's bits (the one-row kernels add eight f32 lanes per row instead; a session
//! with the store sends decode and prefill of a held matrix here alike).
//!
//! **Q4_0 rows** take the same frame with half the code bytes ([`Codes::Q4_0`]): a
//! pair's codes are 256 bytes, load L (0..4) holding row r's bytes `4L .. 4L + 4` of block 2p
//! at `8r` and of block 2p + 1 at `8r + 4`, as stored (no offset flip): their low nibbles are
//! step L of the blocks (elements `4L ..`), their high nibbles step L + 4 (elements
//! `16 + 4L ..`), so one load and two masks meet two of the prepared activation's steps. The
//! activation is the Q8_0 rows' own preparation; the kernel starts each lane at
//! `(−128·Σq) >> 4 = −8·Σq`, the unsigned nibbles' offset (Q4_0's weights are `nibble − 8`).
//! The f32 steps are the Q8_0 ones, which are also the scalar Q4_0 reference's
//! (`scalar::vec_dot_q4_0_q8_0`: `acc += sumi·(d·d_a)`), so again every output is its bits.
//!
//! **IQ4_NL rows** are laid out as Q4_0's; their nibbles index the 16-value codebook
//! (`KVALUES_IQ4NL`), which the kernel looks up per 16-byte lane (`vpshufb`) with every value
//! stored `+ 128`, so the accumulation starts at the prepared `−128·Σq` as Q8_0's does; the f32
//! steps are again the reference's (`vec_dot_iq4_nl_q8_0`, `acc += sumi·(d·d_a)`).
//!
//! **MXFP4 rows** likewise, with the doubled FP4 codebook (`KVALUES_FP4`, ggml's) and their
//! E8M0 scale byte stored as a u16 in the f16 slot; the kernel widens it to
//! `e8m0_to_fp32_half`'s f32 bits (`(e − 1) << 23`, or `0x200000 << e` below 2), so the f32
//! step is again `vec_dot_mxfp4_q8_0`'s (`acc += sumi·(d·d_a)`). (18 bytes a row and block
//! held against the file's 17.)
//!
//! Why: llama.cpp's x86 build repacks Q4_0 (and IQ4_NL) eight rows at a time
//! (`ggml-cpu/repack.cpp`, `block_q4_0x8`, `ggml_gemm_q4_0_8x8_q8_0`) and its Q4_0 prefill was 1.6x
//! ours (one-row kernels, four tokens a call; BENCHMARKS.md, session 42); this is our own layout,
//! this module's Q8_0 frame with the codes as nibbles.

use lagoon_core::dtype::GgmlType;
use lagoon_core::quant::QK;
use lagoon_core::quant::mxfp4::e8m0_to_fp32_half;
use lagoon_core::quant::tables::{KVALUES_FP4, KVALUES_IQ4NL};

use super::act::Q8_0Act;

/// Which 32-element block type the repacked rows hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codes {
    /// Q8_0: `d | i8[32]`, the codes stored `+ 128`.
    Q8_0,
    /// Q4_0: `d | nibbles[16]`, weights `nibble − 8`.
    Q4_0,
    /// IQ4_NL: `d | nibbles[16]`, weights `KVALUES_IQ4NL[nibble]`.
    Iq4Nl,
    /// MXFP4: `e: E8M0 | nibbles[16]`, weights `KVALUES_FP4[nibble]` (doubled FP4) scaled by
    /// `e8m0_to_fp32_half(e)`; the scale slot holds `e` as a u16.
    Mxfp4,
}

/// Shape of a repacked Q8_0, Q4_0 or IQ4_NL matrix's rows: its 32-column blocks and codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q80Geom {
    pub blocks: usize,
    pub codes: Codes,
}

/// Bytes of one pair's prepared activation: 64 interleaved quants, two `−128·Σq` (i32), two
/// scales (f32).
pub const PAIR_ACT: usize = 80;

/// Bytes of a Q8_0 block (`d: f16 | qs: i8[32]`).
pub(crate) const Q8_0_BLOCK: usize = 34;

/// Bytes of a Q4_0 block (`d: f16 | qs: u8[16]`, element j the low nibble of byte j, j + 16
/// the high one, each `nibble − 8`).
pub(crate) const Q4_0_BLOCK: usize = 18;

impl Q80Geom {
    /// Q8_0 rows of `cols` columns; `None` unless `cols` is a non-zero multiple of 32.
    pub fn new(cols: usize) -> Option<Self> {
        Self::of(Codes::Q8_0, cols)
    }

    /// Rows of `codes` and `cols` columns; `None` unless `cols` is a non-zero multiple of 32.
    pub fn of(codes: Codes, cols: usize) -> Option<Self> {
        (cols > 0 && cols.is_multiple_of(QK)).then_some(Q80Geom {
            blocks: cols / QK,
            codes,
        })
    }

    /// The frame's codes for a ggml type, if it takes that type.
    pub fn codes_of(ty: GgmlType) -> Option<Codes> {
        match ty {
            GgmlType::Q8_0 => Some(Codes::Q8_0),
            GgmlType::Q4_0 => Some(Codes::Q4_0),
            GgmlType::IQ4NL => Some(Codes::Iq4Nl),
            GgmlType::MXFP4 => Some(Codes::Mxfp4),
            _ => None,
        }
    }

    /// The ggml type the rows came from.
    pub fn ty(&self) -> GgmlType {
        match self.codes {
            Codes::Q8_0 => GgmlType::Q8_0,
            Codes::Q4_0 => GgmlType::Q4_0,
            Codes::Iq4Nl => GgmlType::IQ4NL,
            Codes::Mxfp4 => GgmlType::MXFP4,
        }
    }

    /// Whether the codes are nibbles (Q4_0, IQ4_NL).
    pub fn nibbles(&self) -> bool {
        self.codes != Codes::Q8_0
    }

    /// Bytes of a pair's codes in a group (512 for Q8_0, 256 for nibbles).
    pub fn code(&self) -> usize {
        if self.nibbles() { 256 } else { 512 }
    }

    /// The stored type's bytes per block (34, 18 or MXFP4's 17).
    pub fn block_bytes(&self) -> usize {
        match self.codes {
            Codes::Q8_0 => Q8_0_BLOCK,
            Codes::Q4_0 | Codes::Iq4Nl => Q4_0_BLOCK,
            Codes::Mxfp4 => Q4_0_BLOCK - 1,
        }
    }

    /// Bytes of a block's scale (f16, or MXFP4's E8M0 byte), before its codes.
    fn head(&self) -> usize {
        if self.codes == Codes::Mxfp4 { 1 } else { 2 }
    }

    /// Row `r`'s scale of block `b` as the scalar reference takes it (f32).
    fn scale(&self, p: &[u8], b: usize, r: usize) -> f32 {
        let at = self.scale_at(b / 2) + 2 * (2 * r + b % 2);
        match self.codes {
            Codes::Mxfp4 => e8m0_to_fp32_half(p[at]),
            _ => super::scalar::f16_at(p, at),
        }
    }

    /// Bytes of a unit of two pairs in a group: their 32 scales, then their codes.
    fn unit(&self) -> usize {
        64 + 2 * self.code()
    }

    /// Block pairs (the last one half empty when `blocks` is odd).
    pub fn pairs(&self) -> usize {
        self.blocks.div_ceil(2)
    }

    /// Offset of pair `p`'s 16 scales (f16) in a group.
    pub fn scale_at(&self, p: usize) -> usize {
        self.unit() * (p / 2) + 32 * (p % 2)
    }

    /// Offset of pair `p`'s codes (`code` bytes) in a group.
    pub fn code_at(&self, p: usize) -> usize {
        self.unit() * (p / 2) + 64 + self.code() * (p % 2)
    }

    /// Bytes of one group of 8 rows.
    pub fn group_bytes(&self) -> usize {
        let n = self.pairs();
        self.unit() * (n / 2) + (64 + self.code()) * (n % 2)
    }

    /// Bytes of one token's prepared activation.
    pub fn act_bytes(&self) -> usize {
        PAIR_ACT * self.pairs()
    }
}

/// Where byte i of block b's quants (0..32 for Q8_0, 0..16 for Q4_0), row r, lies in its
/// pair's codes.
const fn code_byte(b: usize, r: usize, i: usize) -> usize {
    64 * (i / 4) + 8 * r + 4 * (b % 2) + i % 4
}

/// Repacks `rows` Q8_0 rows of `cols` columns (`w`: the rows' 34-byte blocks, row after row)
/// into groups of 8 rows. `None` unless `rows` is a non-zero multiple of 8, `cols` of 32 and
/// `w` exactly that size.
pub fn repack_q8_0_x8(w: &[u8], rows: usize, cols: usize) -> Option<Vec<u8>> {
    repack_x8(w, rows, &Q80Geom::new(cols)?)
}

/// Repacks `rows` Q4_0 rows of `cols` columns (18-byte blocks, row after row) into groups of
/// 8 rows ([`Codes::Q4_0`]'s layout); `None` as for [`repack_q8_0_x8`].
pub fn repack_q4_0_x8(w: &[u8], rows: usize, cols: usize) -> Option<Vec<u8>> {
    repack_x8(w, rows, &Q80Geom::of(Codes::Q4_0, cols)?)
}

/// Repacks `rows` rows of `g`'s type (its blocks, row after row) into groups of 8 rows;
/// `None` unless `rows` is a non-zero multiple of 8 and `w` exactly that size.
pub fn repack_x8(w: &[u8], rows: usize, g: &Q80Geom) -> Option<Vec<u8>> {
    let (bb, rb) = (g.block_bytes(), g.blocks * g.block_bytes());
    if rows == 0 || !rows.is_multiple_of(8) || w.len() != rows * rb {
        return None;
    }
    // Q8_0's codes flipped to unsigned; nibbles are unsigned as stored.
    let flip = if g.nibbles() { 0 } else { 0x80 };
    let mut out = vec![0u8; rows / 8 * g.group_bytes()];
    for (gr, dst) in out.chunks_exact_mut(g.group_bytes()).enumerate() {
        for r in 0..8 {
            let row = &w[(8 * gr + r) * rb..][..rb];
            for (b, blk) in row.chunks_exact(bb).enumerate() {
                let (sc, h) = (g.scale_at(b / 2) + 2 * (2 * r + b % 2), g.head());
                // (MXFP4's E8M0 byte as a u16: its high byte stays 0.)
                dst[sc..sc + h].copy_from_slice(&blk[..h]);
                let pair = &mut dst[g.code_at(b / 2)..][..g.code()];
                for (i, &q) in blk[h..].iter().enumerate() {
                    pair[code_byte(b, r, i)] = q ^ flip;
                }
            }
        }
    }
    Some(out)
}

/// One token's prepared activation for a group of `g` (`out`: [`Q80Geom::act_bytes`] bytes):
/// per pair, the quants with the blocks' 4-byte steps interleaved, `−128·Σq` of each block
/// (i32) and their scales (f32), an absent odd block's all zero. `false` when `a` or `out` is
/// not of `g`'s size.
pub fn prepare(a: &Q8_0Act<'_>, g: &Q80Geom, out: &mut [u8]) -> bool {
    if a.qs.len() != QK * g.blocks || out.len() != g.act_bytes() {
        return false;
    }
    for (p, o) in out.chunks_exact_mut(PAIR_ACT).enumerate() {
        o.fill(0);
        for s in 0..2 {
            let b = 2 * p + s;
            if b >= g.blocks {
                continue;
            }
            let q = &a.qs[QK * b..][..QK];
            for (k, step) in q.as_chunks::<4>().0.iter().enumerate() {
                for (i, &x) in step.iter().enumerate() {
                    o[8 * k + 4 * s + i] = x as u8;
                }
            }
            let sum: i32 = q.iter().map(|&x| i32::from(x)).sum();
            o[64 + 4 * s..][..4].copy_from_slice(&(-128 * sum).to_le_bytes());
            o[72 + 4 * s..][..4].copy_from_slice(&a.d[b]);
        }
    }
    true
}

/// A [`prepare`] implementation.
pub type PrepQ80 = fn(a: &Q8_0Act<'_>, g: &Q80Geom, out: &mut [u8]) -> bool;

/// The 8-row kernels: `out[t][r]` = row r of the group `p` dotted with the token whose
/// prepared activation is `acts[t]`.
pub type DotQ80X8 = fn(p: &[u8], g: &Q80Geom, acts: &[&[u8]], out: &mut [[f32; 8]]);

/// Whether `p`, `acts` and `out` fit `g` (the kernels write NaN everywhere otherwise).
pub(crate) fn fits(p: &[u8], g: &Q80Geom, acts: &[&[u8]], out: &[[f32; 8]]) -> bool {
    p.len() == g.group_bytes()
        && acts.len() == out.len()
        && acts.iter().all(|a| a.len() == g.act_bytes())
}

/// The scalar kernel: each row and token in the scalar reference's order, from the repacked
/// codes (Q8_0 or Q4_0, as `g` says) and the prepared activations.
pub fn dot_q8_0_x8_scalar(p: &[u8], g: &Q80Geom, acts: &[&[u8]], out: &mut [[f32; 8]]) {
    if !fits(p, g, acts, out) {
        out.iter_mut().for_each(|o| *o = [f32::NAN; 8]);
        return;
    }
    for (a, o) in acts.iter().zip(out.iter_mut()) {
        for (r, y) in o.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for b in 0..g.blocks {
                let (pr, s) = (b / 2, b % 2);
                let codes = &p[g.code_at(pr)..][..g.code()];
                let pa = &a[PAIR_ACT * pr..][..PAIR_ACT];
                let mut sumi = 0i32;
                for i in 0..QK {
                    let nib = || (codes[code_byte(b, r, i % 16)] >> (4 * (i / 16))) & 15;
                    let w = match g.codes {
                        Codes::Q8_0 => i32::from((codes[code_byte(b, r, i)] ^ 0x80) as i8),
                        Codes::Q4_0 => i32::from(nib()) - 8,
                        Codes::Iq4Nl => i32::from(KVALUES_IQ4NL[usize::from(nib())]),
                        Codes::Mxfp4 => i32::from(KVALUES_FP4[usize::from(nib())]),
                    };
                    sumi += w * i32::from(pa[8 * (i / 4) + 4 * s + i % 4] as i8);
                }
                let d = g.scale(p, b, r);
                let da = f32::from_le_bytes(pa[72 + 4 * s..][..4].try_into().unwrap());
                acc += sumi as f32 * (d * da);
            }
            *y = acc;
        }
    }
}

/// The fastest [`DotQ80X8`] this CPU runs (`x8::x8_pick!`): the 512-bit VNNI kernel
/// (`avx512::q8x8z`, Q8_0 and Q4_0) where there is one, else the scalar kernel (there is no
/// AVX2 form, so the store repacks Q8_0 and Q4_0 only where [`simd`] says there is a vector
/// kernel).
pub fn dot_q8_0_x8() -> DotQ80X8 {
    super::x8::x8_pick!(q8_0_x8, dot_q8_0_x8_scalar)
}

/// The fastest [`PrepQ80`] this CPU runs (the same bytes as [`prepare`]).
pub fn prepare_fn() -> PrepQ80 {
    super::x8::x8_pick!(q8_0_x8_prep, prepare)
}

/// Whether this CPU runs a vector [`DotQ80X8`] (unless `LAGOON_FORCE_AVX2=1` keeps AVX-512
/// out).
pub fn simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::kernels::arch::x86_64::q8_0_x8(!super::x8::no_avx512()).is_some();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::scalar::{
        vec_dot_iq4_nl_q8_0, vec_dot_mxfp4_q8_0, vec_dot_q4_0_q8_0, vec_dot_q8_0_q8_0,
    };

    /// A row's scalar reference dot (`w`, the Q8_0 activation, columns).
    type Oracle = fn(&[u8], &[u8], usize) -> f32;
    use crate::kernels::x8::testing::{act_q8_0 as act, rng};

    /// An activation row of every quant at `q` with scale 1 (`ds` = 32q): the largest sums.
    fn extreme(cols: usize, q: i8) -> Vec<u8> {
        let nb = cols / QK;
        let mut a = vec![q as u8; cols];
        (0..nb).for_each(|_| a.extend(1.0f32.to_le_bytes()));
        (0..nb).for_each(|_| a.extend((32.0 * f32::from(q)).to_le_bytes()));
        a
    }

    /// Random Q8_0 (`bb` 34) or Q4_0 / IQ4_NL (18) rows: random quants (every byte: -128 and
    /// both nibble ends included; `full`: all -128, or all nibbles 0, i.e. -8 / -127), f16
    /// scales of both signs.
    /// MXFP4 (`bb` 17): E8M0 exponents 0, 1 (the subnormal scales), 2, 254 and 255 on an
    /// eighth of the blocks, any on another eighth, else near 127; `full`: every code −12
    /// and every exponent 0 or 1 (sums of subnormal terms alone).
    fn rows(seed: &mut u64, n: usize, cols: usize, full: bool, bb: usize) -> Vec<u8> {
        let mut w = vec![0u8; n * cols / QK * bb];
        let h = if bb == 17 { 1 } else { 2 };
        for blk in w.chunks_exact_mut(bb) {
            for b in blk[h..].iter_mut() {
                *b = if !full {
                    rng(seed) as u8
                } else if bb == Q8_0_BLOCK {
                    0x80
                } else if h == 1 {
                    0xFF
                } else {
                    0
                };
            }
            if h == 1 {
                let x = rng(seed);
                blk[0] = match x % 8 {
                    _ if full => (x >> 8) as u8 % 2,
                    0 => [0u8, 1, 2, 254, 255][(x >> 8) as usize % 5],
                    1 => (x >> 8) as u8,
                    _ => 120 + (x >> 8) as u8 % 12,
                };
                continue;
            }
            let d = half::f16::from_f32(((rng(seed) % 2000) as f32 - 1000.0) * 1e-5);
            blk[..2].copy_from_slice(&d.to_le_bytes());
        }
        w
    }

    fn kernels() -> Vec<(&'static str, DotQ80X8, PrepQ80)> {
        #[allow(unused_mut)]
        let mut k: Vec<(&'static str, DotQ80X8, PrepQ80)> =
            vec![("scalar", dot_q8_0_x8_scalar, prepare)];
        #[cfg(target_arch = "x86_64")]
        if let (Some(f), Some(pf)) = (
            crate::kernels::arch::x86_64::q8_0_x8(true),
            crate::kernels::arch::x86_64::q8_0_x8_prep(true),
        ) {
            k.push(("avx512", f, pf));
            k.push(("avx512-scalar-prep", f, prepare));
        }
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            k.len() == 3,
            crate::kernels::arch::x86_64::avx512_table().is_some(),
            "the 512-bit kernel is tested wherever the CPU runs it"
        );
        k
    }

    /// Every kernel, 1..=9 tokens at once, even and odd block counts (an empty last block),
    /// random and extreme (-128 codes, Q4_0's -8 or IQ4_NL's -127, against ±127 activations)
    /// data, gives each row and token `vec_dot_q8_0_q8_0`'s (`vec_dot_q4_0_q8_0`'s,
    /// `vec_dot_iq4_nl_q8_0`'s) bits; the vector preparation writes the scalar one's bytes.
    #[test]
    fn x8_legacy_kernels_give_the_scalar_reference_bits() {
        let mut seed = 0x5d1c_37a9_e402_b86fu64;
        let kinds: [(Codes, Oracle); 4] = [
            (Codes::Q8_0, vec_dot_q8_0_q8_0),
            (Codes::Q4_0, vec_dot_q4_0_q8_0),
            (Codes::Iq4Nl, vec_dot_iq4_nl_q8_0),
            (Codes::Mxfp4, vec_dot_mxfp4_q8_0),
        ];
        for ((codes, oracle), (n_rows, cols, full)) in kinds.into_iter().flat_map(|k| {
            [
                (8usize, 32usize, false),
                (8, 64, false),
                (16, 96, false),
                (8, 1024, false),
                (24, 3072, false),
                (8, 160, true),
            ]
            .map(|c| (k, c))
        }) {
            let q4 = codes;
            let g = Q80Geom::of(codes, cols).unwrap();
            let w = rows(&mut seed, n_rows, cols, full, g.block_bytes());
            let p = match codes {
                Codes::Q8_0 => repack_q8_0_x8(&w, n_rows, cols),
                Codes::Q4_0 => repack_q4_0_x8(&w, n_rows, cols),
                Codes::Iq4Nl | Codes::Mxfp4 => repack_x8(&w, n_rows, &g),
            }
            .unwrap();
            assert_eq!(p.len(), n_rows / 8 * g.group_bytes());
            let acts: Vec<Vec<u8>> = [1e-3f32, 1.0, 1e4, 0.5, 2.0, 0.1, 300.0]
                .iter()
                .map(|&x| act(&mut seed, cols, x))
                .chain([extreme(cols, 127), extreme(cols, -127)])
                .collect();
            let rb = cols / QK * g.block_bytes();
            for (name, f, pf) in kernels() {
                let prepped: Vec<Vec<u8>> = acts
                    .iter()
                    .map(|a| {
                        let mut o = vec![0xAAu8; g.act_bytes()];
                        assert!(pf(&Q8_0Act::new(a, cols).unwrap(), &g, &mut o));
                        let mut want = vec![0x55u8; g.act_bytes()];
                        assert!(prepare(&Q8_0Act::new(a, cols).unwrap(), &g, &mut want));
                        assert_eq!(o, want, "{name}: prepared bytes, {cols} columns");
                        o
                    })
                    .collect();
                let refs: Vec<&[u8]> = prepped.iter().map(|v| &v[..]).collect();
                for n in 1..=refs.len() {
                    for (gr, pg) in p.chunks_exact(g.group_bytes()).enumerate() {
                        let mut out = vec![[0.0f32; 8]; n];
                        f(pg, &g, &refs[..n], &mut out);
                        for (t, o) in out.iter().enumerate() {
                            for (r, &y) in o.iter().enumerate() {
                                let row = 8 * gr + r;
                                let want = oracle(&w[row * rb..][..rb], &acts[t], cols);
                                assert_eq!(
                                    y.to_bits(),
                                    want.to_bits(),
                                    "{name} {q4:?} {n_rows}x{cols} n={n} t={t} row {row}: {y} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn q8_0_repack_refuses_ragged_shapes_and_kernels_flag_bad_input() {
        assert!(repack_q8_0_x8(&[0; 34 * 7], 7, 32).is_none());
        assert!(repack_q8_0_x8(&[0; 34 * 8], 8, 31).is_none());
        assert!(repack_q8_0_x8(&[0; 34 * 8 - 1], 8, 32).is_none());
        assert!(repack_q8_0_x8(&[], 0, 32).is_none());
        assert!(repack_q4_0_x8(&[0; 18 * 7], 7, 32).is_none());
        assert!(repack_q4_0_x8(&[0; 34 * 8], 8, 32).is_none());
        assert!(repack_q4_0_x8(&[0; 18 * 8], 8, 32).is_some());
        let g = Q80Geom::new(64).unwrap();
        let a = act(&mut 7, 64, 1.0);
        let a = Q8_0Act::new(&a, 64).unwrap();
        assert!(!prepare(&a, &g, &mut [0; PAIR_ACT - 1]));
        assert!(!prepare(
            &a,
            &Q80Geom::new(96).unwrap(),
            &mut [0; 2 * PAIR_ACT]
        ));
        for (name, f, pf) in kernels() {
            assert!(!pf(&a, &g, &mut [0; 2 * PAIR_ACT]), "{name}");
            let ok = vec![0u8; g.act_bytes()];
            let mut out = vec![[0.0f32; 8]; 1];
            f(&vec![0; g.group_bytes() - 1], &g, &[&ok], &mut out);
            assert!(out[0].iter().all(|v| v.is_nan()), "{name}: short group");
            let mut out = vec![[0.0f32; 8]; 2];
            f(&vec![0; g.group_bytes()], &g, &[&ok], &mut out);
            assert!(
                out.iter().flatten().all(|v| v.is_nan()),
                "{name}: lengths differ"
            );
            let mut out = vec![[0.0f32; 8]; 1];
            f(&vec![0; g.group_bytes()], &g, &[&ok[1..]], &mut out);
            assert!(
                out[0].iter().all(|v| v.is_nan()),
                "{name}: short activation"
            );
        }
    }
}
