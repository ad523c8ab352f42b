//! Q4_K × Q8_K for eight repacked rows (`kernels::x8`'s layout, unchanged) on 512 bits with
//! AVX512-VNNI: `iq4x8z`'s construction for the unsigned Q4_K nibbles.
//!
//! Per 64-byte load (steps k and k + 1 of a chunk): one `vpermd` interleaves the two steps'
//! dwords (`iq4x8z::ld_steps`), a mask and a shift-and-mask give the nibbles of sub-blocks 2c
//! and 2c + 1, and per token two `vpdpbusd` against 8-byte broadcasts of the activation (its
//! bytes of step k then k + 1, adjacent in Q8_K order). The 256-bit forms (`avx2::k4x8`'s
//! body) spend three ALU ops per 32 bytes on the nibbles and two `vpdpbusd` per token; here
//! two (the `vpermd`, two masks and a shift per 64 bytes) and one. Each sub-block's lane pairs
//! are multiplied by the rows' scales (duplicated into both lanes of a pair; one `vpdpwssd`,
//! the lane's sum fitting i16) and summed over the super-block, folded to the eight rows once
//! per super-block (exact i32: each lane's sub-block sum is at most 16·15·128 in magnitude,
//! times a 6-bit scale, over eight sub-blocks), then the mins and the scalar reference's f32
//! steps as in the 256-bit forms: the same bits.

use core::arch::x86_64::*;

use crate::kernels::act::Q8KAct;
use crate::kernels::arch::x86_64::avx2::k4x8 as x8b;
use crate::kernels::x8::Q4K_X8_BLOCK;

use super::iq4x8z::{bcast8, fold_pairs, ld_steps};

crate::kernels::arch::x86_64::avx2::k4x8::x8_driver!(
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    q4k_x8z,
    q4k_x8z_multi,
    tokens,
    Q4K_X8_BLOCK
);

/// The eight rows' scales of sub-block `j`, each in both lanes of its pair.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn scales2<const BLOCK: usize>(o: &[u8; BLOCK], j: usize) -> __m512i {
    let s8 = x8b::lo8(o, 32 + 8 * j);
    _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(s8, s8))
}

/// One pass over the group's super-blocks for T tokens; returns T.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tokens<const T: usize>(p: &[u8], a: [Q8KAct<'_>; T], out: &mut [[f32; 8]; T]) -> usize {
    tokens_k::<T, Q4K_X8_BLOCK, false>(p, a, out)
}

/// The Q4_K 8-row kernel's pass, and with `Q5` Q5_K's (`k5x8z`: blocks of `BLOCK` bytes, the
/// fifth bits after the Q4_K layout's bytes); returns T.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn tokens_k<const T: usize, const BLOCK: usize, const Q5: bool>(
    p: &[u8],
    a: [Q8KAct<'_>; T],
    out: &mut [[f32; 8]; T],
) -> usize {
    let m4 = _mm512_set1_epi8(0x0F);
    let sixteen = _mm512_set1_epi8(16);
    let mut acc = [_mm256_setzero_ps(); T];
    let pd = x8b::prefetch_ahead();
    for (b, o) in p.as_chunks::<BLOCK>().0.iter().enumerate() {
        // One token spreads its prefetches over the sub-block pairs (prefetch_share's
        // measurements); several keep them at the top.
        if T > 1 {
            x8b::prefetch(o, pd);
        }
        let mut qa: [&[i8]; T] = [&[]; T];
        for (q, at) in qa.iter_mut().zip(&a) {
            *q = &at.qs[256 * b..][..256];
        }
        // Q5_K: the rows' qh by pair of steps, once for the four chunks.
        let h: [__m512i; 4] = core::array::from_fn(|kp| {
            if Q5 {
                ld_steps(o, Q4K_X8_BLOCK + 64 * kp)
            } else {
                _mm512_setzero_si512()
            }
        });
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
                let mut wl = _mm512_and_si512(w, m4);
                let mut wh = _mm512_and_si512(_mm512_srli_epi16::<4>(w), m4);
                if Q5 {
                    // Bit 2c of qh is the low nibble's fifth bit, 2c + 1 the high one's.
                    wl = _mm512_mask_add_epi8(wl, _mm512_test_epi8_mask(hk, bl), wl, sixteen);
                    wh = _mm512_mask_add_epi8(wh, _mm512_test_epi8_mask(hk, bh), wh, sixteen);
                }
                for t in 0..T {
                    let al = bcast8(&qa[t][64 * c + 8 * kp..]);
                    let ah = bcast8(&qa[t][64 * c + 32 + 8 * kp..]);
                    lo[t] = _mm512_dpbusd_epi32(lo[t], wl, al);
                    hi[t] = _mm512_dpbusd_epi32(hi[t], wh, ah);
                }
            }
            let (sl, sh) = (scales2(o, 2 * c), scales2(o, 2 * c + 1));
            for t in 0..T {
                sumi[t] = if Q5 {
                    // A lane's sum (16 products of at most 31·128) does not fit i16: 32-bit
                    // products.
                    let s = _mm512_add_epi32(
                        _mm512_mullo_epi32(lo[t], sl),
                        _mm512_mullo_epi32(hi[t], sh),
                    );
                    _mm512_add_epi32(sumi[t], s)
                } else {
                    // A lane's sum is 16 products of a nibble and a byte, at most 16·15·128 =
                    // 30,720 in magnitude: an i16 in the lane's low half, its high half the
                    // sign. The scales' high halves are zero, so `vpdpwssd` adds exactly lo·s
                    // (one uop where `mullo` and an add took three).
                    _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(sumi[t], lo[t], sl), hi[t], sh)
                };
            }
        }
        // The lane pairs folded to the rows, then the 256-bit forms' end.
        let mut rows = [_mm256_setzero_si256(); T];
        for (r, s) in rows.iter_mut().zip(sumi) {
            *r = fold_pairs(s);
        }
        crate::kernels::arch::x86_64::avx2::k4x8::q4k_finish!(o, a, b, rows, acc);
    }
    x8b::store_rows(out, acc);
    T
}

fn dot_q4k_x8z(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
    // SAFETY: `q4k_x8z` only needs the features `Avx512Vnni::detect` checks; this is
    // reachable only through `q4k_x8z_fn`, which requires an `Avx512Vnni` token.
    unsafe { q4k_x8z(p, a, cols, out) }
}

fn dot_q4k_x8z_multi(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
    // SAFETY: as for `dot_q4k_x8z` (reachable only through `q4k_x8z_multi_fn`).
    unsafe { q4k_x8z_multi(p, acts, cols, out) }
}

/// The one-token kernel, for a CPU with AVX512-VNNI.
pub(crate) fn q4k_x8z_fn(_proof: super::Avx512Vnni) -> crate::kernels::x8::DotX8 {
    dot_q4k_x8z
}

/// The several-token kernel, for a CPU with AVX512-VNNI.
pub(crate) fn q4k_x8z_multi_fn(_proof: super::Avx512Vnni) -> crate::kernels::x8::DotX8Multi {
    dot_q4k_x8z_multi
}
