//! Q5_K × Q8_K for eight repacked rows (`kernels::x8_q5k`'s layout) on 512 bits with
//! AVX512-VNNI: `k4x8z`'s kernel with the fifth bits added to the nibbles.
//!
//! Per super-block the four 64-byte `qh` loads (steps 2kp and 2kp + 1 of the eight rows,
//! interleaved by `iq4x8z::ld_steps` as the codes are) are made once and serve the four
//! chunks; per chunk c and load, one `vptestmb` per half picks the bytes whose bit 2c (low
//! nibbles) or 2c + 1 (high nibbles) is set and a masked byte add puts 16 on them: four
//! operations per 64 code bytes over `k4x8z`'s. The rest is `k4x8z`'s: per token two
//! `vpdpbusd` against 8-byte activation broadcasts, the rows' scales by one `vpdpwssd` per
//! sub-block (a lane's sum is 16 products of at most 31·128 = 3,968: 63,488, which does not fit
//! i16, so here the sums are scaled by `vpmulld` after the pairs instead), the pairs folded
//! once per super-block, then the mins and the scalar reference's f32 steps (`q4k_finish`):
//! the same bits.

use core::arch::x86_64::*;

use crate::kernels::act::Q8KAct;
use crate::kernels::arch::x86_64::avx2::k4x8 as x8b;
use crate::kernels::x8::Q4K_X8_BLOCK;
use crate::kernels::x8_q5k::Q5K_X8_BLOCK;

use super::iq4x8z::{bcast8, fold_pairs, ld_steps};

crate::kernels::arch::x86_64::avx2::k4x8::x8_driver!(
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    q5k_x8z,
    q5k_x8z_multi,
    tokens,
    Q5K_X8_BLOCK
);

/// The eight rows' scales of sub-block `j`, each in both lanes of its pair (i32).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn scales2(o: &[u8; Q5K_X8_BLOCK], j: usize) -> __m512i {
    let s8 = x8b::lo8(o, 32 + 8 * j);
    _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(s8, s8))
}

/// One pass over the group's super-blocks for T tokens; returns T.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tokens<const T: usize>(p: &[u8], a: [Q8KAct<'_>; T], out: &mut [[f32; 8]; T]) -> usize {
    let m4 = _mm512_set1_epi8(0x0F);
    let sixteen = _mm512_set1_epi8(16);
    let mut acc = [_mm256_setzero_ps(); T];
    let pd = x8b::prefetch_ahead();
    for (b, o) in p.as_chunks::<Q5K_X8_BLOCK>().0.iter().enumerate() {
        if T > 1 {
            x8b::prefetch(o, pd);
        }
        let mut qa: [&[i8]; T] = [&[]; T];
        for (q, at) in qa.iter_mut().zip(&a) {
            *q = &at.qs[256 * b..][..256];
        }
        let h: [__m512i; 4] = core::array::from_fn(|kp| ld_steps(o, Q4K_X8_BLOCK + 64 * kp));
        let mut sumi = [_mm512_setzero_si512(); T];
        for c in 0..4 {
            if T == 1 {
                x8b::prefetch_share(o, pd, c, 4);
            }
            let (bl, bh) = (
                _mm512_set1_epi8(1 << (2 * c)),
                _mm512_set1_epi8(2 << (2 * c)),
            );
            let mut lo = [_mm512_setzero_si512(); T];
            let mut hi = [_mm512_setzero_si512(); T];
            for (kp, &hk) in h.iter().enumerate() {
                let w = ld_steps(o, 160 + 256 * c + 64 * kp);
                let wl = _mm512_and_si512(w, m4);
                let wh = _mm512_and_si512(_mm512_srli_epi16::<4>(w), m4);
                let wl = _mm512_mask_add_epi8(wl, _mm512_test_epi8_mask(hk, bl), wl, sixteen);
                let wh = _mm512_mask_add_epi8(wh, _mm512_test_epi8_mask(hk, bh), wh, sixteen);
                for t in 0..T {
                    let al = bcast8(&qa[t][64 * c + 8 * kp..]);
                    let ah = bcast8(&qa[t][64 * c + 32 + 8 * kp..]);
                    lo[t] = _mm512_dpbusd_epi32(lo[t], wl, al);
                    hi[t] = _mm512_dpbusd_epi32(hi[t], wh, ah);
                }
            }
            let (sl, sh) = (scales2(o, 2 * c), scales2(o, 2 * c + 1));
            for t in 0..T {
                let s =
                    _mm512_add_epi32(_mm512_mullo_epi32(lo[t], sl), _mm512_mullo_epi32(hi[t], sh));
                sumi[t] = _mm512_add_epi32(sumi[t], s);
            }
        }
        // The lane pairs folded to the rows, then the Q4_K forms' end.
        let mut rows = [_mm256_setzero_si256(); T];
        for (r, s) in rows.iter_mut().zip(sumi) {
            *r = fold_pairs(s);
        }
        crate::kernels::arch::x86_64::avx2::k4x8::q4k_finish!(o, a, b, rows, acc);
    }
    x8b::store_rows(out, acc);
    T
}

fn dot_q5k_x8z(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
    // SAFETY: `q5k_x8z` only needs the features `Avx512Vnni::detect` checks; this is
    // reachable only through `q5k_x8z_fn`, which requires an `Avx512Vnni` token.
    unsafe { q5k_x8z(p, a, cols, out) }
}

fn dot_q5k_x8z_multi(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
    // SAFETY: as for `dot_q5k_x8z` (reachable only through `q5k_x8z_multi_fn`).
    unsafe { q5k_x8z_multi(p, acts, cols, out) }
}

/// The one-token kernel, for a CPU with AVX512-VNNI.
pub(crate) fn q5k_x8z_fn(_proof: super::Avx512Vnni) -> crate::kernels::x8::DotX8 {
    dot_q5k_x8z
}

/// The several-token kernel, for a CPU with AVX512-VNNI.
pub(crate) fn q5k_x8z_multi_fn(_proof: super::Avx512Vnni) -> crate::kernels::x8::DotX8Multi {
    dot_q5k_x8z_multi
}
