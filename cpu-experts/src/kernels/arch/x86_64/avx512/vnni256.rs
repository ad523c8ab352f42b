//! One-row (decode) kernels on 256 bits with AVX512-VNNI's VL forms: AVX2's kernels with
//! integer steps fused, the lanes' i32 sums the same exact integers and the f32 operations
//! the same, so the results are bit-identical to AVX2's (and so to the several-token
//! kernels and the GEMMs, which match AVX2's). Q4_K (`avx2::k4::q4k_q8k`): each
//! sub-block's `madd` by its scale and the add into the running sum become one `vpdpwssd`
//! (in-cache, one thread, AMD EPYC VM: 14.3-14.8 → 15.3-16.2 GiB/s over three interleaved
//! runs). The same fusion for Q8_0 (`maddubs` + `madd` by ones → `vpdpbusd`) measured
//! within noise (10.9-12.3 vs 11.9-12.2 GiB/s) and was not kept: its per-block f32 steps,
//! not the integer dot, bound it.
//!
//! Why 256 bits: at one token these kernels are compute-bound on the development VM (AMD
//! EPYC, AVX-512 executed as two 256-bit halves; in-cache and from-DRAM throughput equal),
//! where the 512-bit forms tried earlier gave nothing; fusing removes operations at the
//! same width.

use core::arch::x86_64::*;

use super::super::avx2::k4::{mins_dot, scales_mins};
use super::super::avx2::{at, f16_at, hsum_ps, ld256};
use crate::kernels::act::Q8KAct;
use crate::kernels::scalar::blocks;

pub(super) fn vec_dot_q4k_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: `q4k_q8k` only needs the features `Avx512Vnni::detect` checks. This wrapper
    // is reachable only through the table built by `avx512::table`, which requires an
    // `Avx512Vnni` token.
    unsafe { q4k_q8k(w, a, n) }
}

/// Q4_K × Q8_K. Block (144 B): `[0..2) d | [2..4) dmin | [4..16) scales | [16..144) qs`;
/// the same sums and f32 steps as `avx2::k4::q4k_q8k` (see that module).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q4k_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (Some(a), Some(wb)) = (Q8KAct::new(a, n), blocks::<144>(w, n / 256)) else {
        return f32::NAN;
    };
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    let mut accm = _mm_setzero_ps();
    let bsums = a.bsums.as_chunks::<16>().0;
    for (b, ((blk, qa), bs)) in wb
        .iter()
        .zip(a.qs.as_chunks::<256>().0)
        .zip(bsums)
        .enumerate()
    {
        let da = a.d(b);
        let d = _mm256_set1_ps(da * f16_at::<0, 144>(blk));
        let dmin = _mm_set1_ps(da * f16_at::<2, 144>(blk));
        let (sc, m) = scales_mins(at::<u8, 4, 12, 144>(blk));
        accm = _mm_fmadd_ps(dmin, _mm_cvtepi32_ps(mins_dot(&m, bs)), accm);
        let sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(
            i64::from_le_bytes(sc),
        )));
        let scale = |j: usize| {
            _mm256_shuffle_epi8(
                sc16,
                _mm256_set1_epi16((((2 * j + 1) << 8) | (2 * j)) as i16),
            )
        };
        let qa = qa.as_chunks::<32>().0;
        let qs = at::<u8, 16, 128, 144>(blk).as_chunks::<32>().0;
        let mut sumi = [_mm256_setzero_si256(); 2];
        for c in 0..4 {
            let x = ld256(&qs[c]);
            let lo = _mm256_and_si256(x, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(x), m4);
            let pl = _mm256_maddubs_epi16(lo, ld256(&qa[2 * c]));
            let ph = _mm256_maddubs_epi16(hi, ld256(&qa[2 * c + 1]));
            let s = _mm256_dpwssd_epi32(sumi[c & 1], pl, scale(2 * c));
            sumi[c & 1] = _mm256_dpwssd_epi32(s, ph, scale(2 * c + 1));
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
}
