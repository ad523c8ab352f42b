//! Q6_K × Q8_K on 512 bits.
//!
//! Scalar, per super-block: `sumf += (d_a·d)·Σ_j sc_j·Σ_{16} (u − 32)·q_a`, u in 0..63.
//!
//! Half h (128 elements): `ql[64h..64h+64]` is [Q0 | Q1], so its low nibbles are planes
//! 0 and 1 (elements 128h..128h+64) and its high nibbles planes 2 and 3 (the next 64), each
//! in element order; `qh[32h..]` broadcast to both halves supplies bits 4-5 (plane 0: bits
//! 0-1, plane 1: 2-3, plane 2: 4-5, plane 3: 6-7, moved with per-half variable shifts).
//! `maddubs` (u ≤ 63) then `vpdpwssd` with the four sub-block scales of the 64 elements.
//! The −32 offset comes back as `32·Σ_j sc_j·bsums_j` (AVX2's helper).

use core::arch::x86_64::*;

use super::super::avx2::k16::scaled_bsums;
use super::super::avx2::{at, f16_at, hsum_ps, ld128, ld256};
use super::{fold256, join256, ld512, rows_ok, wrap_n};
use crate::kernels::act::Q8KAct;
use crate::kernels::scalar::blocks;

wrap_n!(vec_dot_q6k_q8k, vec_dot_q6k_q8k_multi => q6k_n);

/// `vpermw` indices: words 8i..8i+8 take scale `k + i` (i < 4).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn pick4(k: i16) -> __m512i {
    join256(
        _mm256_set_m128i(_mm_set1_epi16(k + 1), _mm_set1_epi16(k)),
        _mm256_set_m128i(_mm_set1_epi16(k + 3), _mm_set1_epi16(k + 2)),
    )
}

/// See the module comment. Every token's f32 operations are those of N = 1.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q6k_n<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
    let (Some(wb), Some(a)) = (
        blocks::<210>(w, n / 256),
        rows_ok(acts, |a| Q8KAct::new(a, n)),
    ) else {
        return core::array::from_fn(|t| {
            if N == 1 {
                f32::NAN
            } else {
                q6k_n(w, [acts[t]], n)[0]
            }
        });
    };
    let qa = a.map(|a| a.qs.as_chunks::<256>().0);
    let bsums = a.map(|a| a.bsums.as_chunks::<16>().0);
    let m4 = _mm512_set1_epi8(0x0F);
    let m2 = _mm512_set1_epi8(0x30);
    let shl01 = join256(_mm256_set1_epi16(4), _mm256_set1_epi16(2));
    let shr23 = join256(_mm256_setzero_si256(), _mm256_set1_epi16(2));
    let pick: [__m512i; 4] = core::array::from_fn(|i| pick4(4 * i as i16));
    let mut acc = [_mm256_setzero_ps(); N];
    for (b, blk) in wb.iter().enumerate() {
        let sc8 = ld128(at::<u8, 192, 16, 210>(blk));
        let sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc8));
        let ql = at::<u8, 0, 128, 210>(blk).as_chunks::<64>().0;
        let qh = at::<u8, 128, 64, 210>(blk).as_chunks::<32>().0;
        let mut sumi = [_mm512_setzero_si512(); N];
        for h in 0..2 {
            let l = ld512(&ql[h]);
            let hb = _mm512_broadcast_i64x4(ld256(&qh[h]));
            let u01 = _mm512_or_si512(
                _mm512_and_si512(l, m4),
                _mm512_and_si512(_mm512_sllv_epi16(hb, shl01), m2),
            );
            let u23 = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<4>(l), m4),
                _mm512_and_si512(_mm512_srlv_epi16(hb, shr23), m2),
            );
            let s01 = _mm512_permutexvar_epi16(pick[2 * h], sc16);
            let s23 = _mm512_permutexvar_epi16(pick[2 * h + 1], sc16);
            for t in 0..N {
                let y = qa[t][b].as_chunks::<64>().0;
                let p01 = _mm512_maddubs_epi16(u01, ld512(&y[2 * h]));
                let p23 = _mm512_maddubs_epi16(u23, ld512(&y[2 * h + 1]));
                sumi[t] = _mm512_dpwssd_epi32(sumi[t], p01, s01);
                sumi[t] = _mm512_dpwssd_epi32(sumi[t], p23, s23);
            }
        }
        let dw = f16_at::<208, 210>(blk);
        for t in 0..N {
            let corr = _mm256_slli_epi32::<5>(scaled_bsums(sc8, &bsums[t][b]));
            let s = _mm256_sub_epi32(fold256(sumi[t]), corr);
            let d = _mm256_set1_ps(a[t].d(b) * dw);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[t]);
        }
    }
    core::array::from_fn(|t| hsum_ps(acc[t]))
}
