//! Q2_K and Q3_K × Q8_K for eight repacked rows (`kernels::x8_k23`'s layouts) on 512 bits
//! with AVX512-VNNI.
//!
//! Per 64-byte load (row r's eight `qs` bytes of one (half n, 16-element half h, step k) in
//! lane r, no permute): plane g is a 16-bit shift and a mask (`u = q` for Q2_K; Q3_K adds 4
//! where the row's `hmask` bit `4n + g` is set, one `vptestmb` and a masked add, so `u = q +
//! 4` in 0..7), and per token one `vpdpbusd` against the 8-byte broadcast of the activation's
//! elements `128n + 32g + 16h + 8k ..`. Each lane pair (2r, 2r + 1) is row r; after the two
//! steps of a 16-element sub-block each lane holds at most 8·7·128 in magnitude, an i16, so
//! one `vpdpwssd` by the rows' scales (each i16 in the low half of both lanes of its pair,
//! zero above) adds `sc·Σ u·a` exactly. Lane pairs are folded to rows once per super-block.
//! Then per token and row: Q2_K's `Σ_j m_j·bsum_j` (eight `madd`s of the rows' min pairs),
//! or Q3_K's offset `4·Σ_j sc_j·bsum_j` taken off `sumi`, and the scalar reference's f32
//! steps (`avx2::k4x8::q4k_finish`'s), so every output is its bits.

use core::arch::x86_64::*;

use crate::kernels::act::Q8KAct;
use crate::kernels::arch::x86_64::avx2::k4x8 as x8b;
use crate::kernels::arch::x86_64::avx2::ld128;
use crate::kernels::x8_k23::{Q2K_X8_BLOCK, Q3K_X8_BLOCK, offsets};

use super::iq4x8z::{bcast8, fold_pairs};
use super::ld512;

crate::kernels::arch::x86_64::avx2::k4x8::x8_driver!(
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    q2k_x8z,
    q2k_x8z_multi,
    tokens_q2,
    Q2K_X8_BLOCK
);

crate::kernels::arch::x86_64::avx2::k4x8::x8_driver!(
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    q3k_x8z,
    q3k_x8z_multi,
    tokens_q3,
    Q3K_X8_BLOCK
);

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tokens_q2<const T: usize>(p: &[u8], a: [Q8KAct<'_>; T], out: &mut [[f32; 8]; T]) -> usize {
    tokens::<T, Q2K_X8_BLOCK, false>(p, a, out)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tokens_q3<const T: usize>(p: &[u8], a: [Q8KAct<'_>; T], out: &mut [[f32; 8]; T]) -> usize {
    tokens::<T, Q3K_X8_BLOCK, true>(p, a, out)
}

/// The rows' i16 pairs `(x_2p, x_2p+1)` for p < 8 (one `madd` per pair and token): Q2_K's
/// mins (the scale bytes' high nibbles), Q3_K's signed scales.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn pairs<const Q3: bool>(o: &[u8], sc_at: usize) -> [__m256i; 8] {
    core::array::from_fn(|p| {
        let (x0, x1) = (x8b::lo8(o, sc_at + 16 * p), x8b::lo8(o, sc_at + 16 * p + 8));
        let x = _mm_unpacklo_epi8(x0, x1);
        if Q3 {
            _mm256_cvtepi8_epi16(x)
        } else {
            _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(x), _mm_set1_epi8(0x0F)))
        }
    })
}

/// Each row's `Σ_p (x_2p·bsum_2p + x_2p+1·bsum_2p+1)` for token `a`'s super-block `b`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn pairs_dot(pairs: &[__m256i; 8], a: &Q8KAct<'_>, b: usize) -> __m256i {
    let bs = a.bsums.as_flattened()[32 * b..][..32].as_chunks::<4>().0;
    let mut m = _mm256_setzero_si256();
    for (x, pair) in pairs.iter().zip(bs) {
        let pair = _mm256_set1_epi32(i32::from_le_bytes(*pair));
        m = _mm256_add_epi32(m, _mm256_madd_epi16(*x, pair));
    }
    m
}

/// One pass over the group's super-blocks for T tokens; returns T.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tokens<const T: usize, const BLOCK: usize, const Q3: bool>(
    p: &[u8],
    a: [Q8KAct<'_>; T],
    out: &mut [[f32; 8]; T],
) -> usize {
    let (sc_at, qs_at, hm_at) = offsets(Q3);
    let m3 = _mm512_set1_epi8(3);
    let four = _mm512_set1_epi8(4);
    let m4 = _mm_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); T];
    let pd = x8b::prefetch_ahead();
    for (b, o) in p.as_chunks::<BLOCK>().0.iter().enumerate() {
        x8b::prefetch(o, pd);
        let mut qa: [&[i8]; T] = [&[]; T];
        for (q, at) in qa.iter_mut().zip(&a) {
            *q = &at.qs[256 * b..][..256];
        }
        let mut sumi = [_mm512_setzero_si512(); T];
        for n in 0..2 {
            for h in 0..2 {
                let mut y = [[_mm512_setzero_si512(); 4]; T];
                for k in 0..2 {
                    let w = ld512(x8b::arr::<64>(o, qs_at + 64 * (4 * n + 2 * h + k)));
                    let hm = if Q3 {
                        ld512(x8b::arr::<64>(o, hm_at + 64 * (2 * h + k)))
                    } else {
                        _mm512_setzero_si512()
                    };
                    for g in 0..4 {
                        let mut u = match g {
                            0 => _mm512_and_si512(w, m3),
                            1 => _mm512_and_si512(_mm512_srli_epi16::<2>(w), m3),
                            2 => _mm512_and_si512(_mm512_srli_epi16::<4>(w), m3),
                            _ => _mm512_and_si512(_mm512_srli_epi16::<6>(w), m3),
                        };
                        if Q3 {
                            let set = _mm512_test_epi8_mask(hm, _mm512_set1_epi8(1 << (4 * n + g)));
                            u = _mm512_mask_add_epi8(u, set, u, four);
                        }
                        for t in 0..T {
                            let x = bcast8(&qa[t][128 * n + 32 * g + 16 * h + 8 * k..]);
                            y[t][g] = _mm512_dpbusd_epi32(y[t][g], u, x);
                        }
                    }
                }
                for g in 0..4 {
                    // Sub-block 8n + 2g + h's scales, each the low i16 of both lanes of its
                    // row's pair (zero above, signed for Q3_K).
                    let s8 = x8b::lo8(o, sc_at + 8 * (8 * n + 2 * g + h));
                    let s8 = _mm_unpacklo_epi8(s8, s8);
                    let s = if Q3 {
                        _mm512_cvtepu16_epi32(_mm256_cvtepi8_epi16(s8))
                    } else {
                        _mm512_cvtepu8_epi32(_mm_and_si128(s8, m4))
                    };
                    for t in 0..T {
                        sumi[t] = _mm512_dpwssd_epi32(sumi[t], y[t][g], s);
                    }
                }
            }
        }
        let pr = pairs::<Q3>(o, sc_at);
        let d = _mm256_cvtph_ps(ld128(x8b::arr::<16>(o, 0)));
        let dmin = if Q3 {
            _mm256_setzero_ps()
        } else {
            _mm256_cvtph_ps(ld128(x8b::arr::<16>(o, 16)))
        };
        for t in 0..T {
            let mut rows = fold_pairs(sumi[t]);
            let mut summ = _mm256_setzero_si256();
            if Q3 {
                // u = q + 4: take 4·Σ_j sc_j·bsum_j off.
                rows = _mm256_sub_epi32(rows, _mm256_slli_epi32::<2>(pairs_dot(&pr, &a[t], b)));
            } else {
                summ = pairs_dot(&pr, &a[t], b);
            }
            // The scalar reference's f32 steps: acc += (d_a·d)·sumi; acc −= (d_a·dmin)·summ.
            let da = _mm256_set1_ps(a[t].d(b));
            acc[t] = _mm256_add_ps(
                acc[t],
                _mm256_mul_ps(_mm256_mul_ps(da, d), _mm256_cvtepi32_ps(rows)),
            );
            acc[t] = _mm256_sub_ps(
                acc[t],
                _mm256_mul_ps(_mm256_mul_ps(da, dmin), _mm256_cvtepi32_ps(summ)),
            );
        }
    }
    x8b::store_rows(out, acc);
    T
}

fn dot_q2k_x8z(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
    // SAFETY: `q2k_x8z` only needs the features `Avx512Vnni::detect` checks; this is
    // reachable only through `q2k_x8z_fn`, which requires an `Avx512Vnni` token.
    unsafe { q2k_x8z(p, a, cols, out) }
}

fn dot_q2k_x8z_multi(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
    // SAFETY: as for `dot_q2k_x8z` (reachable only through `q2k_x8z_multi_fn`).
    unsafe { q2k_x8z_multi(p, acts, cols, out) }
}

fn dot_q3k_x8z(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
    // SAFETY: as for `dot_q2k_x8z` (reachable only through `q3k_x8z_fn`).
    unsafe { q3k_x8z(p, a, cols, out) }
}

fn dot_q3k_x8z_multi(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
    // SAFETY: as for `dot_q2k_x8z` (reachable only through `q3k_x8z_multi_fn`).
    unsafe { q3k_x8z_multi(p, acts, cols, out) }
}

/// The one-token Q2_K kernel, for a CPU with AVX512-VNNI.
pub(crate) fn q2k_x8z_fn(_proof: super::Avx512Vnni) -> crate::kernels::x8::DotX8 {
    dot_q2k_x8z
}

/// The several-token Q2_K kernel, for a CPU with AVX512-VNNI.
pub(crate) fn q2k_x8z_multi_fn(_proof: super::Avx512Vnni) -> crate::kernels::x8::DotX8Multi {
    dot_q2k_x8z_multi
}

/// The one-token Q3_K kernel, for a CPU with AVX512-VNNI.
pub(crate) fn q3k_x8z_fn(_proof: super::Avx512Vnni) -> crate::kernels::x8::DotX8 {
    dot_q3k_x8z
}

/// The several-token Q3_K kernel, for a CPU with AVX512-VNNI.
pub(crate) fn q3k_x8z_multi_fn(_proof: super::Avx512Vnni) -> crate::kernels::x8::DotX8Multi {
    dot_q3k_x8z_multi
}
