//! Codebook ("i-quant") weights × Q8_K activations, and IQ4_NL / MXFP4 × Q8_0.
//!
//! Learned from ggml's AVX2 `ggml_vec_dot_iq*_q8_K` / `ggml_vec_dot_iq4_nl_q8_0` /
//! `ggml_vec_dot_mxfp4_q8_0` (`ggml-cpu/arch/x86/quants.c`), restated:
//!
//! * IQ4_XS / IQ4_NL / MXFP4: the 16-entry codebook sits in one register and `vpshufb`
//!   maps nibbles to signed values; `Σ w·q_a` with the sign trick (`|w|` unsigned, w's sign
//!   moved onto q_a), exact since |w| ≤ 127.
//! * IQ2_* / IQ3_*: the grid magnitudes (≤ 62, unsigned) are gathered with scalar loads,
//!   the weights' signs are applied to the activations (`vpsignb` with ±1 bytes), then
//!   `maddubs` (pair sums ≤ 2·62·127, no saturation) and `madd` with the odd integer
//!   sub-block scale. Sign indices (IQ2_XXS, IQ2_XS, IQ3_XXS) go through [`KEVEN_SIGNS`], a
//!   ±1-byte expansion of ggml's `ksigns_iq2xs`; explicit sign bytes (IQ2_S, IQ3_S) are
//!   expanded with `vpshufb` + compare.
//!
//! * IQ1_S / IQ1_M: grid bytes are signed (−1, 0, 1), so the sign trick again; the i32
//!   sums are reduced to one per super-block and finished in the scalar's f32 order.
//!
//! Scalar oracle: [`crate::kernels::scalar`]'s `vec_dot_iq*`: per super-block an exact i32
//! sum, `sumf += (d_w·d_a)·sumi`, the constant 1/8 or 1/4 applied at the end. Here the i32
//! sum is spread over 8 lanes, so only the f32 accumulation order differs.

use core::arch::x86_64::*;

use lagoon_core::quant::mxfp4::e8m0_to_fp32_half;
use lagoon_core::quant::tables::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KVALUES_FP4,
    KVALUES_IQ4NL,
};

use super::legacy::bits_to_bytes;
use super::{at, dot_i8, f16_at, hsum_ps, ld128, ld256, multi_n, q8k_rows, wrap};
use crate::kernels::act::{Q8_0Act, Q8KAct};
use crate::kernels::scalar::{blocks, f16_to_f32};

/// ggml's `IQ1S_DELTA` / `IQ1M_DELTA`.
const IQ1_DELTA: f32 = 0.125;

/// ggml's `keven_signs_q2xs`: for each 7-bit sign index i, the 8 sign bytes (+1 or −1) of
/// `ksigns_iq2xs[i] = i | parity(i) << 7` (bit j set: weight j negative). Built at compile
/// time; a unit test checks it against core's `KSIGNS_IQ2XS`.
pub(crate) static KEVEN_SIGNS: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        let s = i as u32 | (((i as u32).count_ones() % 2) << 7);
        let mut v = 0u64;
        let mut j = 0;
        while j < 8 {
            let byte: u64 = if (s >> j) & 1 != 0 { 0xFF } else { 0x01 };
            v |= byte << (8 * j);
            j += 1;
        }
        t[i] = v;
        i += 1;
    }
    t
};

/// The four ±1 sign quads of one 32-element sub-block from the 7-bit indices in bits
/// 0-27 of `a`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn even_signs(a: u32) -> __m256i {
    let s = |l: u32| KEVEN_SIGNS[((a >> (7 * l)) & 127) as usize] as i64;
    _mm256_set_epi64x(s(3), s(2), s(1), s(0))
}

/// `Σ g·(s·q_a)` weighted by the 16-bit scales in `sc` (per 128-bit lane or uniform):
/// 8 i32 lanes. `g` unsigned grid magnitudes, `s` ±1 bytes (or 0xFF/0x01).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn signed_grid_dot(g: __m256i, s: __m256i, qa: &[i8; 32], sc: __m256i) -> __m256i {
    let q = _mm256_sign_epi8(ld256(qa), s);
    _mm256_madd_epi16(_mm256_maddubs_epi16(g, q), sc)
}

/// Shared super-block loop: `$body(blk, qa)` gives the block's 8-lane i32 sum; then
/// `acc += (d_w·d_a)·lanes`, two accumulators (even/odd super-blocks); `factor ·` the sum.
macro_rules! iq_loop {
    ($w:expr, $a:expr, $n:expr, $B:literal, $factor:expr, |$blk:ident, $qa:ident| $body:expr) => {{
        let (Some(a), Some(wb)) = (Q8KAct::new($a, $n), blocks::<$B>($w, $n / 256)) else {
            return f32::NAN;
        };
        let mut acc = [_mm256_setzero_ps(); 2];
        for (b, ($blk, qa)) in wb.iter().zip(a.qs.as_chunks::<256>().0).enumerate() {
            let $qa = qa.as_chunks::<32>().0;
            let sumi: __m256i = $body;
            let d = _mm256_set1_ps(f16_at::<0, $B>($blk) * a.d(b));
            acc[b & 1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[b & 1]);
        }
        $factor * hsum_ps(_mm256_add_ps(acc[0], acc[1]))
    }};
}

wrap!(vec_dot_iq3_xxs_q8k => iq3_xxs_q8k(w: &[u8], a: &[u8], n: usize) -> f32);
wrap!(vec_dot_iq3_s_q8k => iq3_s_q8k(w: &[u8], a: &[u8], n: usize) -> f32);
wrap!(vec_dot_iq2_xxs_q8k => iq2_xxs_q8k(w: &[u8], a: &[u8], n: usize) -> f32);
wrap!(vec_dot_iq2_xs_q8k => iq2_xs_q8k(w: &[u8], a: &[u8], n: usize) -> f32);
wrap!(vec_dot_iq2_s_q8k => iq2_s_q8k(w: &[u8], a: &[u8], n: usize) -> f32);
wrap!(vec_dot_iq4_nl_q8_0 => iq4_nl_q8_0(w: &[u8], a: &[u8], n: usize) -> f32);
wrap!(vec_dot_mxfp4_q8_0 => mxfp4_q8_0(w: &[u8], a: &[u8], n: usize) -> f32);

/// IQ3_XXS × Q8_K (× 1/4). Block (98 B): `[0..2) d | [2..66) qs | [66..98) u32[8]`.
/// Sub-block ib: eight 4-byte grid points `IQ3XXS_GRID[qs[8ib + k]]` in element order;
/// `a = u32[ib]`: sign indices in bits 0-27, scale `2(a >> 28) + 1`.
#[target_feature(enable = "avx2,fma,f16c")]
fn iq3_xxs_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    iq_loop!(w, a, n, 98, 0.25, |blk, qa| {
        let qs = at::<u8, 2, 64, 98>(blk).as_chunks::<8>().0;
        let sa = at::<u8, 66, 32, 98>(blk).as_chunks::<4>().0;
        let mut sumi = [_mm256_setzero_si256(); 2];
        for ib in 0..8 {
            let q = &qs[ib];
            let g = |k: usize| IQ3XXS_GRID[usize::from(q[k])] as i32;
            let grid = _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7));
            let aw = u32::from_le_bytes(sa[ib]);
            let sc = _mm256_set1_epi16((2 * (aw >> 28) + 1) as i16);
            let p = signed_grid_dot(grid, even_signs(aw), &qa[ib], sc);
            sumi[ib & 1] = _mm256_add_epi32(sumi[ib & 1], p);
        }
        _mm256_add_epi32(sumi[0], sumi[1])
    })
}

/// Byte j of the 32 sign bits `s` (LE): −1 where set, +1 where clear.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn explicit_signs(s: &[u8; 4]) -> __m256i {
    _mm256_or_si256(bits_to_bytes(s), _mm256_set1_epi8(1))
}

/// IQ3_S × Q8_K. Block (110 B): `[0..2) d | [2..66) qs | [66..74) qh | [74..106) signs |
/// [106..110) scales`. Sub-block sb: point k (0..8) is `IQ3S_GRID[qs[8sb + k] | (qh[sb]
/// bit k) << 8]`; signs `signs[4sb..4sb + 4]` (bit j negates element j); scale
/// `2·nibble + 1`.
#[target_feature(enable = "avx2,fma,f16c")]
fn iq3_s_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    iq_loop!(w, a, n, 110, 1.0, |blk, qa| {
        let qs = at::<u8, 2, 64, 110>(blk).as_chunks::<8>().0;
        let qh = at::<u8, 66, 8, 110>(blk);
        let signs = at::<u8, 74, 32, 110>(blk).as_chunks::<4>().0;
        let scales = at::<u8, 106, 4, 110>(blk);
        let mut sumi = [_mm256_setzero_si256(); 2];
        for sb in 0..8 {
            let (q, h) = (&qs[sb], u32::from(qh[sb]));
            let g = |k: usize| IQ3S_GRID[usize::from(q[k]) | (((h >> k) & 1) as usize) << 8] as i32;
            let grid = _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7));
            let ls = (scales[sb / 2] >> (4 * (sb % 2))) & 0xF;
            let sc = _mm256_set1_epi16(2 * i16::from(ls) + 1);
            let p = signed_grid_dot(grid, explicit_signs(&signs[sb]), &qa[sb], sc);
            sumi[sb & 1] = _mm256_add_epi32(sumi[sb & 1], p);
        }
        _mm256_add_epi32(sumi[0], sumi[1])
    })
}

/// IQ2_XXS × Q8_K (× 1/8). Block (66 B): `[0..2) d | [2..66) 8 × (idx[4] | u32 a)`.
/// Run l of sub-block ib is `IQ2XXS_GRID[idx[l]]` (8 bytes); signs and scale from `a` as
/// IQ3_XXS.
#[target_feature(enable = "avx2,fma,f16c")]
fn iq2_xxs_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    iq_loop!(w, a, n, 66, 0.125, |blk, qa| {
        let groups = at::<u8, 2, 64, 66>(blk).as_chunks::<8>().0;
        let mut sumi = [_mm256_setzero_si256(); 2];
        for ib in 0..8 {
            let q = &groups[ib];
            let g = |k: usize| IQ2XXS_GRID[usize::from(q[k])] as i64;
            let grid = _mm256_set_epi64x(g(3), g(2), g(1), g(0));
            let aw = u32::from_le_bytes([q[4], q[5], q[6], q[7]]);
            let sc = _mm256_set1_epi16((2 * (aw >> 28) + 1) as i16);
            let p = signed_grid_dot(grid, even_signs(aw), &qa[ib], sc);
            sumi[ib & 1] = _mm256_add_epi32(sumi[ib & 1], p);
        }
        _mm256_add_epi32(sumi[0], sumi[1])
    })
}

/// The two scales of an IQ2_XS/IQ2_S sub-block, `2·lo + 1` for its first 16 elements (low
/// 128-bit lane) and `2·hi + 1` for the last 16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn half_scales(sc: u8) -> __m256i {
    let lo = 2 * i16::from(sc & 0xF) + 1;
    let hi = 2 * i16::from(sc >> 4) + 1;
    _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo))
}

/// IQ2_XS × Q8_K (× 1/8). Block (74 B): `[0..2) d | [2..66) u16[32] | [66..74) scales`.
/// Run r: `IQ2XS_GRID[u16 & 511]`, signs `KEVEN_SIGNS[u16 >> 9]`.
#[target_feature(enable = "avx2,fma,f16c")]
fn iq2_xs_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    iq_loop!(w, a, n, 74, 0.125, |blk, qa| {
        let qs = at::<u8, 2, 64, 74>(blk).as_chunks::<8>().0;
        let scales = at::<u8, 66, 8, 74>(blk);
        let mut sumi = [_mm256_setzero_si256(); 2];
        for ib in 0..8 {
            let q = &qs[ib];
            let v = |k: usize| u16::from_le_bytes([q[2 * k], q[2 * k + 1]]);
            let g = |k: usize| IQ2XS_GRID[usize::from(v(k) & 511)] as i64;
            let s = |k: usize| KEVEN_SIGNS[usize::from(v(k) >> 9)] as i64;
            let grid = _mm256_set_epi64x(g(3), g(2), g(1), g(0));
            let signs = _mm256_set_epi64x(s(3), s(2), s(1), s(0));
            let p = signed_grid_dot(grid, signs, &qa[ib], half_scales(scales[ib]));
            sumi[ib & 1] = _mm256_add_epi32(sumi[ib & 1], p);
        }
        _mm256_add_epi32(sumi[0], sumi[1])
    })
}

/// IQ2_S × Q8_K (× 1/8). Block (82 B): `[0..2) d | [2..34) qs | [34..66) signs |
/// [66..74) qh | [74..82) scales`. Run l of sub-block ib: `IQ2S_GRID[qs[4ib + l] |
/// ((qh[ib] >> 2l) & 3) << 8]`; signs `signs[4ib..4ib + 4]`.
#[target_feature(enable = "avx2,fma,f16c")]
fn iq2_s_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    iq_loop!(w, a, n, 82, 0.125, |blk, qa| {
        let qs = at::<u8, 2, 32, 82>(blk).as_chunks::<4>().0;
        let signs = at::<u8, 34, 32, 82>(blk).as_chunks::<4>().0;
        let qh = at::<u8, 66, 8, 82>(blk);
        let scales = at::<u8, 74, 8, 82>(blk);
        let mut sumi = [_mm256_setzero_si256(); 2];
        for ib in 0..8 {
            let (q, h) = (&qs[ib], usize::from(qh[ib]));
            let g = |l: usize| IQ2S_GRID[usize::from(q[l]) | ((h >> (2 * l)) & 3) << 8] as i64;
            let grid = _mm256_set_epi64x(g(3), g(2), g(1), g(0));
            let p = signed_grid_dot(
                grid,
                explicit_signs(&signs[ib]),
                &qa[ib],
                half_scales(scales[ib]),
            );
            sumi[ib & 1] = _mm256_add_epi32(sumi[ib & 1], p);
        }
        _mm256_add_epi32(sumi[0], sumi[1])
    })
}

/// The 32 codebook values of a half-split nibble block (`qs[16]`: low nibbles elements
/// 0..16, high nibbles 16..32), through the 16-byte table `lut`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn lut_nibbles(qs: &[u8; 16], lut: __m128i) -> __m256i {
    let x = ld128(qs);
    let m4 = _mm_set1_epi8(0x0F);
    let lo = _mm_shuffle_epi8(lut, _mm_and_si128(x, m4));
    let hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16::<4>(x), m4));
    _mm256_set_m128i(hi, lo)
}

/// The IQ4_NL codebook as one register.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn iq4nl_lut() -> __m128i {
    // SAFETY: the table is 16 readable bytes; `loadu` accepts any alignment.
    unsafe { _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()) }
}

/// IQ4_XS × Q8_K for several tokens, up to 4 at once (`out[t] = w · acts[t]`); see [`iq4_xs_n`].
pub(super) fn vec_dot_iq4_xs_q8k_multi(w: &[u8], acts: &[&[u8]], n: usize, out: &mut [f32]) {
    // SAFETY: `iq4_xs_multi` only needs AVX2, FMA and F16C. This wrapper is reachable only
    // through the table built by `avx2::table`, which requires an `Avx2Fma` token, and
    // `Avx2Fma::detect` builds one only after detecting all three features.
    unsafe { iq4_xs_multi(w, acts, n, out) }
}

wrap!(vec_dot_iq4_xs_q8k => iq4_xs_q8k(w: &[u8], a: &[u8], n: usize) -> f32);

#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_xs_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    iq4_xs_n(w, [a], n)[0]
}

#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_xs_multi(w: &[u8], acts: &[&[u8]], n: usize, out: &mut [f32]) {
    // Runs of four (a call may hold eight: `Kernels::dot_rows_multi`), each through a call
    // of its own: with the run's match inlined into this loop the kernel ran 13% slower
    // (`prefill_iq4_xs_64tok` under LAGOON_FORCE_AVX2=1 on the Zen 4 VM, session 43).
    for (acts, out) in acts.chunks(4).zip(out.chunks_mut(4)) {
        iq4_xs_4(w, acts, n, out);
    }
}

#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_xs_4(w: &[u8], acts: &[&[u8]], n: usize, out: &mut [f32]) {
    match *acts {
        [a0, a1, a2, a3] => out.copy_from_slice(&iq4_xs_n(w, [a0, a1, a2, a3], n)),
        [a0, a1, a2] => out.copy_from_slice(&iq4_xs_n(w, [a0, a1, a2], n)),
        [a0, a1] => out.copy_from_slice(&iq4_xs_n(w, [a0, a1], n)),
        _ => {
            for (o, a) in out.iter_mut().zip(acts) {
                *o = iq4_xs_q8k(w, a, n);
            }
        }
    }
}

/// The 8 IQ4_XS sub-block scales `ls − 32` (from `scales_h:u16 | scales_l[4]`).
#[inline(always)]
pub(crate) fn iq4xs_scales(s: &[u8; 6]) -> [i16; 8] {
    let sh = u16::from_le_bytes([s[0], s[1]]);
    core::array::from_fn(|ib| {
        let low4 = u16::from((s[2 + ib / 2] >> (4 * (ib % 2))) & 0xF);
        (low4 | ((sh >> (2 * ib)) & 3) << 4) as i16 - 32
    })
}

/// IQ4_XS × Q8_K against N activation rows. Block (136 B): `[0..2) d | [2..4) scales_h |
/// [4..8) scales_l | [8..136) qs`; sub-block ib: codebook values of `qs[16ib..]`, scale
/// `ls − 32`. Each block's values are looked up once for all N tokens; per token the f32
/// operations are those of N = 1 (the one-token kernel), so results are bit-identical.
#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_xs_n<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
    let acts_q = acts.map(|a| Q8KAct::new(a, n));
    let (Some(wb), true) = (
        blocks::<136>(w, n / 256),
        acts_q.iter().all(Option::is_some),
    ) else {
        // Token by token; a token that is not a valid row (or a bad weight row) gives NaN.
        let one = |t: usize| match (blocks::<136>(w, n / 256), acts_q[t]) {
            (Some(_), Some(_)) => iq4_xs_n(w, [acts[t]], n)[0],
            _ => f32::NAN,
        };
        return core::array::from_fn(one);
    };
    let a = acts_q.map(|a| a.unwrap_or_else(|| unreachable!()));
    let qa = a.map(|a| a.qs.as_chunks::<256>().0);
    let lut = iq4nl_lut();
    let mut acc = [[_mm256_setzero_ps(); 2]; N];
    for (b, blk) in wb.iter().enumerate() {
        let sc = iq4xs_scales(at::<u8, 2, 6, 136>(blk));
        let qs = at::<u8, 8, 128, 136>(blk).as_chunks::<16>().0;
        let mut sumi = [[_mm256_setzero_si256(); 2]; N];
        for ib in 0..8 {
            let x = lut_nibbles(&qs[ib], lut);
            let ax = _mm256_sign_epi8(x, x);
            let s = _mm256_set1_epi16(sc[ib]);
            for t in 0..N {
                let y = ld256(&qa[t][b].as_chunks::<32>().0[ib]);
                let p = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(y, x));
                sumi[t][ib & 1] = _mm256_add_epi32(sumi[t][ib & 1], _mm256_madd_epi16(p, s));
            }
        }
        let dw = f16_at::<0, 136>(blk);
        for t in 0..N {
            let d = _mm256_set1_ps(dw * a[t].d(b));
            let s = _mm256_add_epi32(sumi[t][0], sumi[t][1]);
            acc[t][b & 1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[t][b & 1]);
        }
    }
    core::array::from_fn(|t| hsum_ps(_mm256_add_ps(acc[t][0], acc[t][1])))
}

/// Shared loop of the Q8_0-paired codebook types: per 32-block, `dot_i8(lut(nibbles), q_a)`
/// and `acc += (d_w·d_a)·lanes`, even/odd accumulators.
macro_rules! lut_q8_0_loop {
    ($w:expr, $a:expr, $n:expr, $B:literal, $QS:literal, $lut:expr, |$blk:ident| $dw:expr) => {{
        let (Some(a), Some(wb)) = (Q8_0Act::new($a, $n), blocks::<$B>($w, $n / 32)) else {
            return f32::NAN;
        };
        let lut = $lut;
        let mut acc = [_mm256_setzero_ps(); 2];
        for (b, ($blk, qa)) in wb.iter().zip(a.qs.as_chunks::<32>().0).enumerate() {
            let x = lut_nibbles(at::<u8, $QS, 16, $B>($blk), lut);
            let lanes = dot_i8(x, ld256(qa));
            let d = _mm256_set1_ps($dw * a.d(b));
            acc[b & 1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[b & 1]);
        }
        hsum_ps(_mm256_add_ps(acc[0], acc[1]))
    }};
}

/// IQ4_NL × Q8_0. Block (18 B): `[0..2) d | [2..18) qs`; scalar `sumf += Σ kv·q_a·(d·d_a)`.
#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_nl_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    lut_q8_0_loop!(w, a, n, 18, 2, iq4nl_lut(), |blk| f16_at::<0, 18>(blk))
}

/// MXFP4 × Q8_0. Block (17 B): `[0] e | [1..17) qs`; doubled FP4 table, halved E8M0 scale.
#[target_feature(enable = "avx2,fma,f16c")]
fn mxfp4_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: the table is 16 readable bytes; `loadu` accepts any alignment.
    let lut = unsafe { _mm_loadu_si128(KVALUES_FP4.as_ptr().cast()) };
    lut_q8_0_loop!(w, a, n, 17, 1, lut, |blk| e8m0_to_fp32_half(blk[0]))
}

/// Sum of 8 i32 lanes (exact while it fits in i32).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

wrap!(vec_dot_iq1_s_q8k => iq1_s_q8k(w: &[u8], a: &[u8], n: usize) -> f32);
wrap!(vec_dot_iq1_m_q8k => iq1_m_q8k(w: &[u8], a: &[u8], n: usize) -> f32);

/// IQ1_S × Q8_K (one token): [`iq1_s_q8k_n`] for N = 1.
#[target_feature(enable = "avx2,fma,f16c")]
fn iq1_s_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    iq1_s_q8k_n(w, [a], n)[0]
}

/// IQ1_M × Q8_K (one token): [`iq1_m_q8k_n`] for N = 1.
#[target_feature(enable = "avx2,fma,f16c")]
fn iq1_m_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    iq1_m_q8k_n(w, [a], n)[0]
}

/// IQ1_S × Q8_K against N activation rows. Block (50 B): `[0..2) d | [2..34) qs |
/// [34..50) qh:u16[8]`; run l of sub-block ib is `IQ1S_GRID[qs[4ib + l] | ((qh[ib] >> 3l) &
/// 7) << 8]` (signed bytes −1, 0, 1: sign trick), scale `2((h >> 12) & 7) + 1`. Each
/// sub-block's grid points are fetched once for every token. The i32 sums are reduced
/// exactly, then the scalar's f32 step: `sumf += (d_w·d_a)·(sumi + 1/8·sumi1)`, so results
/// equal scalar.
#[target_feature(enable = "avx2,fma,f16c")]
fn iq1_s_q8k_n<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
    let Some(wb) = blocks::<50>(w, n / 256) else {
        return [f32::NAN; N];
    };
    let a = match q8k_rows(acts, n, |a| iq1_s_q8k(w, a, n)) {
        Ok(a) => a,
        Err(v) => return v,
    };
    let mut acc = [0.0f32; N];
    for (b, blk) in wb.iter().enumerate() {
        let qs = at::<u8, 2, 32, 50>(blk).as_chunks::<4>().0;
        let qh = at::<u8, 34, 16, 50>(blk).as_chunks::<2>().0;
        let mut sumi = [_mm256_setzero_si256(); N];
        let mut sumi1 = [0i32; N];
        for ib in 0..8 {
            let h = u16::from_le_bytes(qh[ib]);
            let g = |l: usize| {
                let idx = usize::from(qs[ib][l]) | usize::from((h >> (3 * l)) & 7) << 8;
                IQ1S_GRID[idx] as i64
            };
            let grid = _mm256_set_epi64x(g(3), g(2), g(1), g(0));
            let mag = _mm256_sign_epi8(grid, grid);
            let ls = (2 * ((h >> 12) & 7) + 1) as i16;
            let lsv = _mm256_set1_epi16(ls);
            let delta = if h & 0x8000 != 0 { -1 } else { 1 };
            for t in 0..N {
                let y = ld256(&a[t].qs.as_chunks::<32>().0[8 * b + ib]);
                let p = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(y, grid));
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p, lsv));
                let bs = &a[t].bsums.as_chunks::<16>().0[b];
                let q = i32::from(i16::from_le_bytes(bs[2 * ib]))
                    + i32::from(i16::from_le_bytes(bs[2 * ib + 1]));
                sumi1[t] += i32::from(ls) * delta * q;
            }
        }
        let dw = f16_at::<0, 50>(blk);
        for t in 0..N {
            let s = hsum_epi32(sumi[t]) as f32 + IQ1_DELTA * sumi1[t] as f32;
            acc[t] += (dw * a[t].d(b)) * s;
        }
    }
    acc
}

/// IQ1_M × Q8_K against N activation rows. Block (56 B): `[0..32) qs | [32..48) qh |
/// [48..56) scales:u16[4]` (fp16 `d` in the scale words' top nibbles). Run l of sub-block
/// ib: nibble `qh[2ib + l/2] >> 4(l%2)`: grid index high bits 0-2, delta sign bit 3; runs 0-1
/// scale `2·k₀ + 1`, runs 2-3 `2·k₁ + 1` (bits `6(ib%2)` and `+3` of word ib/2). The delta
/// term `Σ ls·δ·Σ q_a` comes from `maddubs(1, ±q_a)`. Each sub-block's grid points, deltas
/// and scales are unpacked once for every token; exact i32 sums, then the scalar's f32 step
/// (results equal scalar).
#[target_feature(enable = "avx2,fma,f16c")]
fn iq1_m_q8k_n<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
    let Some(wb) = blocks::<56>(w, n / 256) else {
        return [f32::NAN; N];
    };
    let a = match q8k_rows(acts, n, |a| iq1_m_q8k(w, a, n)) {
        Ok(a) => a,
        Err(v) => return v,
    };
    let ones = _mm256_set1_epi8(1);
    let mut acc = [0.0f32; N];
    for (b, blk) in wb.iter().enumerate() {
        let qs = at::<u8, 0, 32, 56>(blk).as_chunks::<4>().0;
        let qh = at::<u8, 32, 16, 56>(blk).as_chunks::<2>().0;
        let sw = at::<u8, 48, 8, 56>(blk).as_chunks::<2>().0;
        let sc: [u16; 4] = core::array::from_fn(|k| u16::from_le_bytes(sw[k]));
        let d =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
        let mut sumi1 = [_mm256_setzero_si256(); N];
        let mut sumi2 = [_mm256_setzero_si256(); N];
        for ib in 0..8 {
            let nib = |l: usize| qh[ib][l / 2] >> (4 * (l % 2));
            let g =
                |l: usize| IQ1S_GRID[usize::from(qs[ib][l]) | usize::from(nib(l) & 7) << 8] as i64;
            let dl = |l: usize| {
                if nib(l) & 8 != 0 {
                    -1i64
                } else {
                    0x0101_0101_0101_0101
                }
            };
            let grid = _mm256_set_epi64x(g(3), g(2), g(1), g(0));
            let mag = _mm256_sign_epi8(grid, grid);
            let delta = _mm256_set_epi64x(dl(3), dl(2), dl(1), dl(0));
            let w6 = sc[ib / 2] >> (6 * (ib % 2));
            let ls = _mm256_set_m128i(
                _mm_set1_epi16((2 * ((w6 >> 3) & 7) + 1) as i16),
                _mm_set1_epi16((2 * (w6 & 7) + 1) as i16),
            );
            for t in 0..N {
                let y = ld256(&a[t].qs.as_chunks::<32>().0[8 * b + ib]);
                let p = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(y, grid));
                sumi1[t] = _mm256_add_epi32(sumi1[t], _mm256_madd_epi16(p, ls));
                let q = _mm256_maddubs_epi16(ones, _mm256_sign_epi8(y, delta));
                sumi2[t] = _mm256_add_epi32(sumi2[t], _mm256_madd_epi16(q, ls));
            }
        }
        let dw = f16_to_f32(d);
        for t in 0..N {
            let s = hsum_epi32(sumi1[t]) as f32 + IQ1_DELTA * hsum_epi32(sumi2[t]) as f32;
            acc[t] += (dw * a[t].d(b)) * s;
        }
    }
    acc
}

// IQ1_S and IQ1_M × Q8_K for up to 4 tokens at once (`out[t] = w · acts[t]`).
multi_n!(8; vec_dot_iq1_s_q8k_multi => iq1_s_q8k_n);
multi_n!(8; vec_dot_iq1_m_q8k_multi => iq1_m_q8k_n);

#[cfg(test)]
mod tests {
    use lagoon_core::quant::tables::KSIGNS_IQ2XS;

    #[test]
    fn keven_signs_is_ksigns_as_bytes() {
        for (i, &s) in KSIGNS_IQ2XS.iter().enumerate() {
            let v = super::KEVEN_SIGNS[i].to_le_bytes();
            for (j, &b) in v.iter().enumerate() {
                assert_eq!(b, if (s >> j) & 1 != 0 { 0xFF } else { 0x01 }, "{i} {j}");
            }
        }
    }
}
