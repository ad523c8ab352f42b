//! compressed-tensors pack-quantized int4 × Q8_0 activations on 512 bits (symmetric part;
//! the zero-point term is added by `kernels::ct::dot_row`).
//!
//! Scalar: `Σ_g s_g · Σ_{b∈g} d_b · Σ_{l<32} (nib − 8)·q_a`.
//!
//! 64 weight bytes are 128 columns = four 32-blocks, one per 128-bit lane (column c is
//! nibble c, low first). Per lane, `unpacklo/hi_epi8(lo, hi)` restore columns 0..16 and
//! 16..32 of that lane's block; the activations are regrouped to match with two
//! `vshufi64x2`. `vpdpbusd` (unsigned nibbles × signed q_a) gives 4 i32 lanes per block.
//! The f32 step scales each lane by its block's `s·d` (spread with `vpermps`) and
//! subtracts `s·8·ds` per block (`ds = d·Σ q_a`), eight blocks at a time as in AVX2.

use core::arch::x86_64::*;

use lagoon_core::quant::ct::ScaleDtype;

use super::super::avx2::ct::block_scales;
use super::super::avx2::{hsum_ps, ld_ps};
use super::ld512;
use crate::kernels::act::Q8_0Act;
use crate::kernels::ct::load_scale;

pub(super) fn vec_dot_ct_nib4_q8_0(
    row: &[u8],
    scales: &[u8],
    sd: ScaleDtype,
    run: usize,
    a: &[u8],
    n: usize,
) -> f32 {
    // SAFETY: `ct_nib4` only needs the features `Avx512Vnni::detect` checks. This wrapper
    // is reachable only through the table built by `avx512::table`, which requires an
    // `Avx512Vnni` token.
    unsafe { ct_nib4(row, scales, sd, run, a, n) }
}

/// See the module comment. Rows whose block count is not a multiple of 8 finish their last
/// `nb % 8` blocks one by one in scalar code.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn ct_nib4(row: &[u8], scales: &[u8], sd: ScaleDtype, run: usize, a: &[u8], n: usize) -> f32 {
    let Some(act) = Q8_0Act::new(a, n) else {
        return f32::NAN;
    };
    let nb = n / 32;
    let n_groups = n.div_ceil(run.max(1));
    if row.len() < n / 2
        || run == 0
        || !run.is_multiple_of(32)
        || scales.len() < n_groups * sd.size()
    {
        return f32::NAN;
    }
    let n8 = nb / 8;
    let m4 = _mm512_set1_epi8(0x0F);
    let spread = [
        _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
        _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7),
    ];
    let w8 = row.as_chunks::<128>().0;
    let q8 = act.qs.as_chunks::<256>().0;
    let d8 = act.d.as_flattened().as_chunks::<32>().0;
    let ds8 = act.ds.as_flattened().as_chunks::<32>().0;
    let mut acc = _mm512_setzero_ps();
    let mut acc_off = _mm256_setzero_ps();
    let zero = _mm512_setzero_si512();
    for k in 0..n8 {
        let (w, q) = (w8[k].as_chunks::<64>().0, q8[k].as_chunks::<64>().0);
        let s = block_scales(scales, sd, run / 32, k);
        let sdv = _mm512_castps256_ps512(_mm256_mul_ps(s, ld_ps(&d8[k])));
        acc_off = _mm256_fmadd_ps(
            s,
            _mm256_mul_ps(_mm256_set1_ps(8.0), ld_ps(&ds8[k])),
            acc_off,
        );
        for h in 0..2 {
            let x = ld512(&w[h]);
            let lo = _mm512_and_si512(x, m4);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(x), m4);
            let e1 = _mm512_unpacklo_epi8(lo, hi);
            let e2 = _mm512_unpackhi_epi8(lo, hi);
            let (a0, a1) = (ld512(&q[2 * h]), ld512(&q[2 * h + 1]));
            let p1 = _mm512_shuffle_i64x2::<0x88>(a0, a1);
            let p2 = _mm512_shuffle_i64x2::<0xDD>(a0, a1);
            let v = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, e1, p1), e2, p2);
            let f = _mm512_permutexvar_ps(spread[h], sdv);
            acc = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(v), acc);
        }
    }
    let mut sum = _mm512_reduce_add_ps(acc) - hsum_ps(acc_off);
    if n8 * 8 < nb {
        // Tail blocks, one at a time as in the scalar kernel.
        for b in n8 * 8..nb {
            let g = 32 * b / run;
            let s = load_scale(sd, scales, g);
            let qa = &act.qs[32 * b..32 * b + 32];
            let wb = &row[16 * b..16 * b + 16];
            let sumi: i32 = (0..32)
                .map(|c| (i32::from((wb[c / 2] >> (4 * (c % 2))) & 0xF) - 8) * i32::from(qa[c]))
                .sum();
            sum += s * (act.d(b) * sumi as f32);
        }
    }
    sum
}
