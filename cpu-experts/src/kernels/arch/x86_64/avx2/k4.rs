//! Q4_K and Q5_K (8 sub-blocks of 32, 6-bit scales and mins) × Q8_K activations.
//!
//! Scalar, per super-block:
//! `sumf += (d_a·d) · Σ_j sc_j · Σ_{l<32} q·q_a  −  (d_a·dmin) · Σ_j m_j · (bsums[2j] + bsums[2j+1])`
//!
//! Bit layout: chunk c (0..4) of 64 elements reads 32 bytes `qs[32c..]`: the low nibbles are
//! elements 64c..64c+32 (sub-block 2c), the high nibbles 64c+32.. (sub-block 2c+1). Q5_K adds
//! bit 4 of element 32s + l from `qh[l]` bit s. Quants are unsigned (≤ 31), so `maddubs`
//! takes them directly: a pair sum is at most 2·31·127, no saturation.

use core::arch::x86_64::*;

use super::{at, f16_at, hsum_ps, ld128, ld256, wrap};
use crate::kernels::act::Q8KAct;
use crate::kernels::scalar::blocks;

/// The 8 scales and 8 mins (6-bit) from the 12 packed bytes, four at a time:
/// bytes 0-3 → scales 0-3 (low 6 bits), bytes 4-7 → mins 0-3; scales 4-7 are the low
/// nibbles of bytes 8-11 with the top 2 bits of bytes 0-3 above them; mins 4-7 the high
/// nibbles of bytes 8-11 with the top 2 bits of bytes 4-7.
#[inline(always)]
pub(crate) fn scales_mins(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let u = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (u0, u1, u2) = (u(0), u(1), u(2));
    let sc_lo = u0 & 0x3F3F_3F3F;
    let m_lo = u1 & 0x3F3F_3F3F;
    let sc_hi = (u2 & 0x0F0F_0F0F) | ((u0 >> 6) & 0x0303_0303) << 4;
    let m_hi = ((u2 >> 4) & 0x0F0F_0F0F) | ((u1 >> 6) & 0x0303_0303) << 4;
    let join = |a: u32, b: u32| (u64::from(b) << 32 | u64::from(a)).to_le_bytes();
    (join(sc_lo, sc_hi), join(m_lo, m_hi))
}

/// `Σ_j m_j · (bsums[2j] + bsums[2j+1])` as 4 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn mins_dot(mins: &[u8; 8], bsums: &[[u8; 2]; 16]) -> __m128i {
    let bs = bsums.as_flattened().as_chunks::<16>().0;
    // 8 × (bsums[2j] + bsums[2j+1]); |.| ≤ 32·127, no i16 overflow.
    let pairs = _mm_hadd_epi16(ld128(&bs[0]), ld128(&bs[1]));
    let m = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(*mins)));
    _mm_madd_epi16(m, pairs)
}

wrap!(vec_dot_q4k_q8k => q4k_q8k(w: &[u8], a: &[u8], n: usize) -> f32);
wrap!(vec_dot_q5k_q8k => q5k_q8k(w: &[u8], a: &[u8], n: usize) -> f32);

/// Shared super-block loop. `$quants(c, lo_or_hi)` is evaluated with `blk: &[u8; $B]` and
/// gives the two 32-element unsigned quant registers of chunk c. The optional last closure
/// `|sumi, pl, ph, sl, sh|` adds chunk c's two `maddubs` products times their sub-block
/// scales to `sumi` (default: `madd` and adds; AVX-512's `vnni256` fuses them with
/// `vpdpwssd`); any form gives the same exact i32 lanes.
macro_rules! k4_loop {
    ($w:expr, $a:expr, $n:expr, $B:literal, $SC:literal, |$blk:ident, $pre:ident| $prep:expr, |$c:ident, $q:ident| $quants:expr) => {
        k4_loop!(
            $w,
            $a,
            $n,
            $B,
            $SC,
            |$blk, $pre| $prep,
            |$c, $q| $quants,
            |s, pl, ph, sl, sh| {
                _mm256_add_epi32(
                    s,
                    _mm256_add_epi32(_mm256_madd_epi16(pl, sl), _mm256_madd_epi16(ph, sh)),
                )
            }
        )
    };
    ($w:expr, $a:expr, $n:expr, $B:literal, $SC:literal, |$blk:ident, $pre:ident| $prep:expr, |$c:ident, $q:ident| $quants:expr, |$s:ident, $pl:ident, $ph:ident, $sl:ident, $sh:ident| $accum:expr) => {{
        let (Some(a), Some(wb)) = (Q8KAct::new($a, $n), blocks::<$B>($w, $n / 256)) else {
            return f32::NAN;
        };
        let mut acc = _mm256_setzero_ps();
        let mut accm = _mm_setzero_ps();
        let bsums = a.bsums.as_chunks::<16>().0;
        for (b, (($blk, qa), bs)) in wb
            .iter()
            .zip(a.qs.as_chunks::<256>().0)
            .zip(bsums)
            .enumerate()
        {
            let da = a.d(b);
            let d = _mm256_set1_ps(da * f16_at::<0, $B>($blk));
            let dmin = _mm_set1_ps(da * f16_at::<2, $B>($blk));
            let (sc, m) = scales_mins(at::<u8, 4, 12, $B>($blk));
            accm = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(mins_dot(&m, bs)), accm);
            // The 8 scales as i16 in both lanes; `vpshufb` broadcasts one per sub-block.
            let sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(
                i64::from_le_bytes(sc),
            )));
            let scale = |j: usize| {
                _mm256_shuffle_epi8(sc16, _mm256_set1_epi16(((2 * j + 1) << 8 | 2 * j) as i16))
            };
            let $pre = $prep;
            let qa = qa.as_chunks::<32>().0;
            let mut sumi = [_mm256_setzero_si256(); 2];
            for $c in 0..4 {
                let $q = &at::<u8, $SC, 128, $B>($blk).as_chunks::<32>().0[$c];
                let (lo, hi): (__m256i, __m256i) = $quants;
                let $pl = _mm256_maddubs_epi16(lo, ld256(&qa[2 * $c]));
                let $ph = _mm256_maddubs_epi16(hi, ld256(&qa[2 * $c + 1]));
                let ($s, $sl, $sh) = (sumi[$c & 1], scale(2 * $c), scale(2 * $c + 1));
                sumi[$c & 1] = $accum;
            }
            acc = _mm256_fmadd_ps(
                d,
                _mm256_cvtepi32_ps(_mm256_add_epi32(sumi[0], sumi[1])),
                acc,
            );
        }
        let m = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
        let m = _mm_add_ss(m, _mm_movehdup_ps(m));
        hsum_ps(acc) - _mm_cvtss_f32(m)
    }};
}
pub(crate) use k4_loop;

/// Q4_K × Q8_K. Block (144 B): `[0..2) d | [2..4) dmin | [4..16) scales | [16..144) qs`.
#[target_feature(enable = "avx2,fma,f16c")]
fn q4k_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    k4_loop!(w, a, n, 144, 16, |blk, _unused| (), |c, q| {
        let x = ld256(q);
        (
            _mm256_and_si256(x, m4),
            _mm256_and_si256(_mm256_srli_epi16::<4>(x), m4),
        )
    })
}

/// Q5_K × Q8_K. Block (176 B): `[0..2) d | [2..4) dmin | [4..16) scales | [16..48) qh |
/// [48..176) qs`. Chunk c takes bit 4 of its low half from qh bit 2c, of its high half from
/// qh bit 2c+1.
#[target_feature(enable = "avx2,fma,f16c")]
fn q5k_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let m4 = _mm256_set1_epi8(0x0F);
    let m16 = _mm256_set1_epi8(0x10);
    k4_loop!(
        w,
        a,
        n,
        176,
        48,
        |blk, qh| ld256(at::<u8, 16, 32, 176>(blk)),
        |c, q| {
            let x = ld256(q);
            // Bit 2c of qh moved to bit 4: shift left by 4 − 2c (or right by 2c − 4).
            let (hl, hh) = match c {
                0 => (_mm256_slli_epi16::<4>(qh), _mm256_slli_epi16::<3>(qh)),
                1 => (_mm256_slli_epi16::<2>(qh), _mm256_slli_epi16::<1>(qh)),
                2 => (qh, _mm256_srli_epi16::<1>(qh)),
                _ => (_mm256_srli_epi16::<2>(qh), _mm256_srli_epi16::<3>(qh)),
            };
            (
                _mm256_or_si256(_mm256_and_si256(x, m4), _mm256_and_si256(hl, m16)),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(x), m4),
                    _mm256_and_si256(hh, m16),
                ),
            )
        }
    )
}

/// Q4_K × Q8_K for several tokens, up to 4 at once (`out[t] = w · acts[t]`, `out.len() ==
/// acts.len()`); see [`q4k_q8k_n`].
pub(super) fn vec_dot_q4k_q8k_multi(w: &[u8], acts: &[&[u8]], n: usize, out: &mut [f32]) {
    // SAFETY: `q4k_multi` only needs AVX2, FMA and F16C. This wrapper is reachable only
    // through the table built by `avx2::table`, which requires an `Avx2Fma` token, and
    // `Avx2Fma::detect` builds one only after detecting all three features.
    unsafe { q4k_multi(w, acts, n, out) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q4k_multi(w: &[u8], acts: &[&[u8]], n: usize, out: &mut [f32]) {
    // Runs of four (a call may hold eight: `Kernels::dot_rows_multi`), each a call of its
    // own, as `iq::iq4_xs_multi` (inlined there, that kernel lost 13%).
    for (acts, out) in acts.chunks(4).zip(out.chunks_mut(4)) {
        q4k_4(w, acts, n, out);
    }
}

#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4k_4(w: &[u8], acts: &[&[u8]], n: usize, out: &mut [f32]) {
    match *acts {
        [a0, a1, a2, a3] => out.copy_from_slice(&q4k_q8k_n(w, [a0, a1, a2, a3], n)),
        [a0, a1, a2] => out.copy_from_slice(&q4k_q8k_n(w, [a0, a1, a2], n)),
        [a0, a1] => out.copy_from_slice(&q4k_q8k_n(w, [a0, a1], n)),
        _ => {
            for (o, a) in out.iter_mut().zip(acts) {
                *o = q4k_q8k(w, a, n);
            }
        }
    }
}

/// Q4_K × Q8_K against N activation rows: each super-block's nibbles and scales are
/// unpacked once and dotted with every token. Per token, every f32 operation is the one
/// [`q4k_q8k`] performs, in the same order (only the exact i32 sums are grouped
/// differently), so each result is bit-identical to the one-row kernel.
#[target_feature(enable = "avx2,fma,f16c")]
fn q4k_q8k_n<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
    let acts_q = acts.map(|a| Q8KAct::new(a, n));
    let (Some(wb), true) = (
        blocks::<144>(w, n / 256),
        acts_q.iter().all(Option::is_some),
    ) else {
        return acts.map(|a| q4k_q8k(w, a, n));
    };
    let a = acts_q.map(|a| a.unwrap_or_else(|| unreachable!()));
    let nb = wb.len();
    // Per token: its super-blocks' quants, scales and sums, each exactly nb long.
    let mut qa: [&[[i8; 256]]; N] = [&[]; N];
    let mut da: [&[[u8; 4]]; N] = [&[]; N];
    let mut bsums: [&[[[u8; 2]; 16]]; N] = [&[]; N];
    for t in 0..N {
        qa[t] = &a[t].qs.as_chunks::<256>().0[..nb];
        da[t] = &a[t].d[..nb];
        bsums[t] = &a[t].bsums.as_chunks::<16>().0[..nb];
    }
    // The mins' sums first, in a pass of their own: per token the same operations in the
    // same order as the one-row kernel's, and the quant loop below then keeps only its
    // N f32 and N i32 accumulators in registers (with them, N = 4 spilled to the stack).
    let mut accm = [_mm_setzero_ps(); N];
    for (b, blk) in wb.iter().enumerate() {
        let dminw = f16_at::<2, 144>(blk);
        let (_, m) = scales_mins(at::<u8, 4, 12, 144>(blk));
        for t in 0..N {
            let dmin = _mm_set1_ps(f32::from_le_bytes(da[t][b]) * dminw);
            accm[t] = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(mins_dot(&m, &bsums[t][b])), accm[t]);
        }
    }
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); N];
    for (b, blk) in wb.iter().enumerate() {
        let dw = f16_at::<0, 144>(blk);
        let (sc, _) = scales_mins(at::<u8, 4, 12, 144>(blk));
        let dat: [f32; N] = core::array::from_fn(|t| f32::from_le_bytes(da[t][b]));
        let sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(
            i64::from_le_bytes(sc),
        )));
        let scale = |j: usize| {
            _mm256_shuffle_epi8(
                sc16,
                _mm256_set1_epi16((((2 * j + 1) << 8) | (2 * j)) as i16),
            )
        };
        let qs = at::<u8, 16, 128, 144>(blk).as_chunks::<32>().0;
        let mut sumi = [_mm256_setzero_si256(); N];
        for c in 0..4 {
            let x = ld256(&qs[c]);
            let lo = _mm256_and_si256(x, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(x), m4);
            let (sl, sh) = (scale(2 * c), scale(2 * c + 1));
            for t in 0..N {
                let q = qa[t][b].as_chunks::<32>().0;
                let pl = _mm256_maddubs_epi16(lo, ld256(&q[2 * c]));
                let ph = _mm256_maddubs_epi16(hi, ld256(&q[2 * c + 1]));
                let pl = _mm256_madd_epi16(pl, sl);
                let ph = _mm256_madd_epi16(ph, sh);
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(pl, ph));
            }
        }
        for t in 0..N {
            let d = _mm256_set1_ps(dat[t] * dw);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    core::array::from_fn(|t| {
        let m = _mm_add_ps(accm[t], _mm_movehl_ps(accm[t], accm[t]));
        let m = _mm_add_ss(m, _mm_movehdup_ps(m));
        hsum_ps(acc[t]) - _mm_cvtss_f32(m)
    })
}
