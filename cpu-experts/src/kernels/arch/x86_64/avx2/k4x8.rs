//! Q4_K × Q8_K for eight repacked rows at once (`kernels::x8`'s layout): lanes are rows.
//!
//! Per super-block and chunk c (sub-blocks 2c and 2c + 1): eight steps k, each one 32-byte
//! load (four quant bytes of every row), two nibble masks, two broadcasts of four activation
//! bytes, two `maddubs` and two i16 adds. The i16 sums stay exact over the eight steps
//! (`|u·a + u·a| ≤ 2·15·128 = 3840` per step, ≤ 30,720 after eight). Then per sub-block one
//! `madd` by ones (i32 per row) and one `mullo` by the eight rows' scales. The mins term is
//! four `madd`s of the rows' (m_2p, m_2p+1) pairs by the token's paired block sums. The f32
//! steps are the scalar reference's, one row per lane, so the results are its bits.

use core::arch::x86_64::*;

use super::{ld128, ld256, wrap};
use crate::kernels::act::Q8KAct;
use crate::kernels::x8::Q4K_X8_BLOCK;

wrap!(dot_q4k_x8 => q4k_x8(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) -> ());

/// Four bytes of `v` from `o` as one little-endian i32.
#[inline(always)]
fn i32_at(v: &[i8], o: usize) -> i32 {
    i32::from_le_bytes([v[o] as u8, v[o + 1] as u8, v[o + 2] as u8, v[o + 3] as u8])
}

/// `&v[o..o + N]` as an array (bounds-checked).
#[inline(always)]
fn arr<const N: usize>(v: &[u8], o: usize) -> &[u8; N] {
    v[o..o + N].try_into().unwrap()
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q4k_x8(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
    let nb = cols / 256;
    let Some(a) = Q8KAct::new(a, cols).filter(|_| p.len() == nb * Q4K_X8_BLOCK) else {
        *out = [f32::NAN; 8];
        return;
    };
    let m4 = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    let bsums = a.bsums.as_flattened().as_chunks::<16>().0;
    for (b, o) in p.as_chunks::<Q4K_X8_BLOCK>().0.iter().enumerate() {
        let qa = &a.qs[256 * b..][..256];
        let mut sumi = _mm256_setzero_si256();
        for c in 0..4 {
            let (mut lo, mut hi) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            for k in 0..8 {
                let w = ld256(arr::<32>(o, 160 + 256 * c + 32 * k));
                let wl = _mm256_and_si256(w, m4);
                let wh = _mm256_and_si256(_mm256_srli_epi16::<4>(w), m4);
                let al = _mm256_set1_epi32(i32_at(qa, 64 * c + 4 * k));
                let ah = _mm256_set1_epi32(i32_at(qa, 64 * c + 32 + 4 * k));
                lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(wl, al));
                hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(wh, ah));
            }
            // The eight rows' scales of sub-block j as i32 lanes.
            let sc = |j: usize| {
                _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(*arr::<8>(
                    o,
                    32 + 8 * j,
                ))))
            };
            let plo = _mm256_mullo_epi32(_mm256_madd_epi16(lo, ones), sc(2 * c));
            let phi = _mm256_mullo_epi32(_mm256_madd_epi16(hi, ones), sc(2 * c + 1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(plo, phi));
        }
        // bs_j = bsum[2j] + bsum[2j + 1] as i16, the pair (bs_2p, bs_2p+1) in i32 lane p.
        let bsp = _mm_hadd_epi16(ld128(&bsums[2 * b]), ld128(&bsums[2 * b + 1]));
        let pairs = [
            _mm_extract_epi32::<0>(bsp),
            _mm_extract_epi32::<1>(bsp),
            _mm_extract_epi32::<2>(bsp),
            _mm_extract_epi32::<3>(bsp),
        ];
        let mut summ = _mm256_setzero_si256();
        for (pi, &pair) in pairs.iter().enumerate() {
            // Rows' (m_2p, m_2p+1) as i16 pairs.
            let m = _mm256_cvtepu8_epi16(ld128(arr::<16>(o, 96 + 16 * pi)));
            summ = _mm256_add_epi32(summ, _mm256_madd_epi16(m, _mm256_set1_epi32(pair)));
        }
        let da = _mm256_set1_ps(a.d(b));
        let d = _mm256_cvtph_ps(ld128(arr::<16>(o, 0)));
        let dmin = _mm256_cvtph_ps(ld128(arr::<16>(o, 16)));
        acc = _mm256_add_ps(
            acc,
            _mm256_mul_ps(_mm256_mul_ps(da, d), _mm256_cvtepi32_ps(sumi)),
        );
        acc = _mm256_sub_ps(
            acc,
            _mm256_mul_ps(_mm256_mul_ps(da, dmin), _mm256_cvtepi32_ps(summ)),
        );
    }
    // SAFETY: `out` is 8 writable f32 (32 bytes); `storeu` accepts any alignment.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), acc) };
}
