//! One-row (decode) kernels on 256 bits with AVX512-VNNI's VL forms: AVX2's kernels with
//! integer steps fused, the lanes' i32 sums the same exact integers and the f32 operations
//! the same, so the results are bit-identical to AVX2's (and so to the several-token
//! kernels and the GEMMs, which match AVX2's). Q4_K (`avx2::k4::q4k_q8k`): each
//! sub-block's `madd` by its scale and the add into the running sum become one `vpdpwssd`
//! (in-cache, one thread, AMD EPYC VM: 14.3-14.8 → 15.3-16.2 GiB/s over three interleaved
//! runs). Q8_0 (`avx2::legacy::q8_0_q8_0`): the fusion alone (`maddubs` + `madd` by ones →
//! `vpdpbusd`) measured within noise, its per-block f32 steps binding it; with those
//! vectorised too (eight `dw·d_a` per multiply, see [`q8_0_q8_0`]) 10.8-11.7 → 12.8-13.4
//! GiB/s (thread CPU time, three interleaved runs). IQ4_XS: the one-row kernel of the
//! 512-bit several-token kernel's lanes on 256 bits (see [`iq4_xs_q8k`]): 9.7-9.9 →
//! 11.3-11.7 GiB/s (AVX2's 9.5-10.2), same measurement.
//!
//! Why 256 bits: at one token these kernels are compute-bound on the development VM (AMD
//! EPYC, AVX-512 executed as two 256-bit halves; in-cache and from-DRAM throughput equal),
//! where the 512-bit forms tried earlier gave nothing; fusing removes operations at the
//! same width.

use core::arch::x86_64::*;

use super::super::avx2::k4::{k4_loop, mins_dot, scales_mins};
use super::super::avx2::{at, f16_at, hsum_ps, ld_ps, ld256};
use crate::kernels::act::{Q8_0Act, Q8KAct};
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
    let m4 = _mm256_set1_epi8(0x0F);
    k4_loop!(
        w,
        a,
        n,
        144,
        16,
        |blk, _unused| (),
        |c, q| {
            let x = ld256(q);
            (
                _mm256_and_si256(x, m4),
                _mm256_and_si256(_mm256_srli_epi16::<4>(x), m4),
            )
        },
        |s, pl, ph, sl, sh| _mm256_dpwssd_epi32(_mm256_dpwssd_epi32(s, pl, sl), ph, sh)
    )
}

pub(super) fn vec_dot_q8_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: as for `vec_dot_q4k_q8k`.
    unsafe { q8_0_q8_0(w, a, n) }
}

/// Q8_0 × Q8_0 (block: `[0..2) d:f16 | [2..34) qs:i8[32]`): the sign-trick lanes by one
/// `vpdpbusd` (exact: four products per i32, where `maddubs` + `madd` could saturate only
/// for |w| = |a| = 128, which no quantiser here produces), and the f32 step vectorised:
/// the eight products `dw·d_a` of blocks b..b+8 are formed in one multiply (the fp16 `d`s
/// read from the eight block heads as scalars into one vector, the `d_a` loaded as one
/// vector) and each block then takes its lane by `vpermps`, in place of a scalar convert,
/// multiply and broadcast per block. Lanes and f32 steps as `avx2::legacy::q8_0_q8_0`
/// (bit-identical): even blocks into one accumulator, odd into the other, an odd last block
/// into the even one. (Until session 35 the eight `d`s were a `vpgatherdd` of the block
/// heads and the loop indexed the activations with bounds checks: the scalar reads took this
/// kernel 17.4 → 21.5 GiB/s from cache on one Zen 4 core, the zipped loop 21.7 → 23.0;
/// BENCHMARKS.md. Not yet measured on an Intel core.)
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q8_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (Some(a), Some(wb)) = (Q8_0Act::new(a, n), blocks::<34>(w, n / 32)) else {
        return f32::NAN;
    };
    let qa = a.qs.as_chunks::<32>().0;
    let zero = _mm256_setzero_si256();
    let lanes_of = |blk: &[u8; 34], q: &[i8; 32]| {
        let x = ld256(at::<u8, 2, 32, 34>(blk));
        _mm256_dpbusd_epi32(zero, _mm256_sign_epi8(x, x), _mm256_sign_epi8(ld256(q), x))
    };
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let (w8, wt) = wb.as_chunks::<8>();
    let pd = super::super::avx2::k4x8::row_prefetch_ahead();
    // Zipped with the activations' eight-block groups (and their eight d's), so the loop
    // indexes nothing it has to bounds-check.
    let (qa8, da8) = (qa.as_chunks::<8>().0, a.d.as_chunks::<8>().0);
    for (b8, (q8, d8)) in w8.iter().zip(qa8.iter().zip(da8)) {
        // The bytes `pd` on (past the row's end: the next rows of the caller's tile).
        super::super::avx2::k4x8::prefetch(b8.as_flattened(), pd);
        // Block k's d: the f16 bits at its head.
        let dh = |k: usize| u16::from_le_bytes([b8[k][0], b8[k][1]]) as i16;
        let dw = _mm256_cvtph_ps(_mm_setr_epi16(
            dh(0),
            dh(1),
            dh(2),
            dh(3),
            dh(4),
            dh(5),
            dh(6),
            dh(7),
        ));
        let da = ld_ps(&d8.as_flattened().as_chunks::<32>().0[0]);
        let dd8 = _mm256_mul_ps(dw, da);
        for k in 0..8 {
            let dd = _mm256_permutevar8x32_ps(dd8, _mm256_set1_epi32(k as i32));
            let l = _mm256_cvtepi32_ps(lanes_of(&b8[k], &q8[k]));
            if k % 2 == 0 {
                acc0 = _mm256_fmadd_ps(dd, l, acc0);
            } else {
                acc1 = _mm256_fmadd_ps(dd, l, acc1);
            }
        }
    }
    let base = 8 * w8.len();
    for (k, blk) in wt.iter().enumerate() {
        let b = base + k;
        let dd = _mm256_set1_ps(f16_at::<0, 34>(blk) * a.d(b));
        let l = _mm256_cvtepi32_ps(lanes_of(blk, &qa[b]));
        // The remainder starts at an even index: pairs alternate, an odd last one is even.
        if k % 2 == 0 {
            acc0 = _mm256_fmadd_ps(dd, l, acc0);
        } else {
            acc1 = _mm256_fmadd_ps(dd, l, acc1);
        }
    }
    hsum_ps(_mm256_add_ps(acc0, acc1))
}

pub(super) fn vec_dot_iq4_xs_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: as for `vec_dot_q4k_q8k`.
    unsafe { iq4_xs_q8k(w, a, n) }
}

/// IQ4_XS × Q8_K (block 136 B: `[0..2) d | [2..4) scales_h | [4..8) scales_l | [8..136)
/// qs`), the one-row kernel of the AVX-512 table: the same i32 lanes as its 512-bit
/// several-token kernel (`iq::iq4_xs_n`, whose `fold256` leaves lane i = Σ over sub-blocks of
/// `(ls − 32)·Σ` of elements 4i..4i+4), here one sub-block per register — codebook lookup,
/// sign trick, `maddubs`, and `vpdpwssd` by the sub-block scale — and the same f32 steps
/// (one accumulator, `d·d_a` per super-block), so results are bit-identical to it.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn iq4_xs_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    use super::super::avx2::iq::{iq4nl_lut, iq4xs_scales, lut_nibbles};
    let (Some(a), Some(wb)) = (Q8KAct::new(a, n), blocks::<136>(w, n / 256)) else {
        return f32::NAN;
    };
    let lut = iq4nl_lut();
    let mut acc = _mm256_setzero_ps();
    for (b, (blk, qa)) in wb.iter().zip(a.qs.as_chunks::<256>().0).enumerate() {
        let sc = iq4xs_scales(at::<u8, 2, 6, 136>(blk));
        let qs = at::<u8, 8, 128, 136>(blk).as_chunks::<16>().0;
        let qa = qa.as_chunks::<32>().0;
        let mut sumi = [_mm256_setzero_si256(); 2];
        for ib in 0..8 {
            let x = lut_nibbles(&qs[ib], lut);
            let p =
                _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(ld256(&qa[ib]), x));
            sumi[ib & 1] = _mm256_dpwssd_epi32(sumi[ib & 1], p, _mm256_set1_epi16(sc[ib]));
        }
        let d = _mm256_set1_ps(f16_at::<0, 136>(blk) * a.d(b));
        acc = _mm256_fmadd_ps(
            d,
            _mm256_cvtepi32_ps(_mm256_add_epi32(sumi[0], sumi[1])),
            acc,
        );
    }
    hsum_ps(acc)
}
