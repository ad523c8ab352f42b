//! Q8_0 × Q8_0 as a small GEMM on 512 bits (prefill): [`R`] weight rows × up to [`T`]
//! tokens per micro-tile, each result bit-identical to AVX2's one-row kernel
//! (`avx2::legacy::q8_0_q8_0`).
//!
//! The one-row kernel, per 32-block b of a row and a token: 8 i32 lanes, lane i the exact
//! `Σ_{l<4} w[4i+l]·a[4i+l]` (`maddubs` + `madd` on sign-adjusted bytes), then
//! `acc[b & 1] = fma(f32(dw·d_a) broadcast, f32(lanes), acc[b & 1])` and finally
//! `hsum(acc[0] + acc[1])`. Any computation of the same exact lanes followed by the same f32
//! operations gives the same bits.
//!
//! How (the `vpdpbusd` offset idea learned from the u8·i8 dot of ggml's
//! `ggml-cpu/llamafile/sgemm.cpp` and the zero-point handling of int8 GEMMs, restated):
//! - a zmm holds **two consecutive blocks** of one row or one token: the token's 64
//!   activation bytes are contiguous (one load); the weight's two 32-byte `qs` sit 34 bytes
//!   apart (two loads), and the low half (block b, even) and high half (b + 1, odd) are
//!   exactly the one-row kernel's two accumulators, so one zmm accumulator per (row, token)
//!   carries both;
//! - `vpdpbusd` wants unsigned × signed: the weights are offset to `w + 128` (a xor with
//!   0x80) and each token's `128·Σ_{l<4} a` per lane (itself one `vpdpbusd` of 0x80 bytes
//!   with the activations, formed once per token and block pair and shared by the tile's
//!   rows) is subtracted up front by starting the accumulation from its negation:
//!   `Σ (w + 128)·a − 128·Σ a = Σ w·a`, exact in i32 (no i16 saturation as with
//!   `maddubs`). The sign-trick kernel computes the same lanes for every activation the
//!   quantiser produces (|a| ≤ 127);
//! - the micro-tile is 4 rows × 4 tokens: 16 accumulators in registers over the whole row,
//!   per block pair 4 weight registers (shared by the tokens) and 3 per token (shared by
//!   the rows).

use crate::kernels::GemmArgs;
use core::arch::x86_64::*;

use super::super::avx2::{f16_at, hsum_ps, ld256};
use super::{join256, ld512};
use crate::kernels::act::{Q8_0Act, q8_0_row_bytes};

/// Rows per micro-tile.
const R: usize = 4;
/// Tokens per micro-tile.
const T: usize = 4;

/// The Q8_0 [`Gemm`](crate::kernels::Gemm): `out[t·out_stride + i] = W[i] · act_t` for
/// `i < n_rows`, `t < n_act`, where `w` holds `n_rows` rows of `rb = 34·cols/32` bytes and
/// `act_t = acts[t·act_stride..][..q8_0_row_bytes(cols)]`. `false` (nothing written) when a
/// shape or an activation row is malformed; the caller then takes the one-row path.
pub(super) fn q8_0_q8_0_gemm(g: GemmArgs<'_>) -> bool {
    let cols = g.cols;
    let nb = cols / 32;
    let ab = q8_0_row_bytes(cols);
    let ok = cols.is_multiple_of(32)
        && nb > 0
        && g.rb == 34 * nb
        && g.act_stride >= ab
        && g.bounds_ok(ab, |a| Q8_0Act::new(a, cols).is_some());
    if !ok {
        return false;
    }
    let GemmArgs {
        w,
        rb,
        n_rows,
        acts,
        act_stride,
        n_act,
        out,
        out_stride,
        ..
    } = g;
    // SAFETY: the driver only needs the features `Avx512Vnni::detect` checks. This wrapper
    // is reachable only through the table built by `avx512::table`, which requires an
    // `Avx512Vnni` token.
    unsafe { driver(w, rb, n_rows, acts, act_stride, n_act, nb, out, out_stride) };
    true
}

/// Token groups of [`T`] (outer), row groups of [`R`] (inner: a token group's activation
/// rows stay in L1 while the rows stream past). The caller checked every shape.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn driver(
    w: &[u8],
    rb: usize,
    n_rows: usize,
    acts: &[u8],
    act_stride: usize,
    n_act: usize,
    nb: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let cols = 32 * nb;
    let ab = q8_0_row_bytes(cols);
    let act = |t: usize| {
        Q8_0Act::new(&acts[t * act_stride..t * act_stride + ab], cols)
            .unwrap_or_else(|| unreachable!("checked by the wrapper"))
    };
    let row = |r: usize| &w[r * rb..(r + 1) * rb];
    for t0 in (0..n_act).step_by(T) {
        let nt = T.min(n_act - t0);
        let a: [Q8_0Act<'_>; T] = core::array::from_fn(|k| act(t0 + k.min(nt - 1)));
        let mut put = |r: usize, res: &[f32; T]| {
            for (k, &v) in res[..nt].iter().enumerate() {
                out[(t0 + k) * out_stride + r] = v;
            }
        };
        let mut r0 = 0;
        while r0 + R <= n_rows {
            let rows: [&[u8]; R] = core::array::from_fn(|i| row(r0 + i));
            let res = match nt {
                4 => tile::<4>(&rows, &a, nb),
                3 => tile::<3>(&rows, &a, nb),
                2 => tile::<2>(&rows, &a, nb),
                _ => tile::<1>(&rows, &a, nb),
            };
            for (i, rr) in res.iter().enumerate() {
                put(r0 + i, rr);
            }
            r0 += R;
        }
        // The last rows (fewer than R): the tile repeats the last one and drops the copies.
        if r0 < n_rows {
            let rows: [&[u8]; R] = core::array::from_fn(|i| row((r0 + i).min(n_rows - 1)));
            let res = match nt {
                4 => tile::<4>(&rows, &a, nb),
                3 => tile::<3>(&rows, &a, nb),
                2 => tile::<2>(&rows, &a, nb),
                _ => tile::<1>(&rows, &a, nb),
            };
            for (i, rr) in res[..n_rows - r0].iter().enumerate() {
                put(r0 + i, rr);
            }
        }
    }
}

/// `R` rows (`nb` blocks of 34 bytes each) × the first `NT` tokens of `a`: the results in
/// `[row][token]` (tokens past `NT` are 0).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tile<const NT: usize>(rows: &[&[u8]; R], a: &[Q8_0Act<'_>; T], nb: usize) -> [[f32; T]; R] {
    let bias = _mm512_set1_epi8(0x80u8 as i8);
    let zero = _mm512_setzero_si512();
    // f32 lane 0 to the low eight lanes, lane 1 to the high eight (`f16_halves`, `f32_halves`).
    let spread = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    let mut acc = [[_mm512_setzero_ps(); NT]; R];
    // Block pairs (2k, 2k + 1): low halves to the even accumulator, high to the odd.
    let pairs = nb / 2;
    for k in 0..pairs {
        let b = 2 * k;
        // Per row: w + 128 of both blocks, and dw of each block in its half.
        let mut x = [zero; R];
        let mut dw = [_mm512_setzero_ps(); R];
        for (i, &r) in rows.iter().enumerate() {
            let (b0, b1) = block_pair(r, b);
            x[i] = _mm512_xor_si512(join256(ld256(qs(b0)), ld256(qs(b1))), bias);
            dw[i] = f16_halves(b0, b1, spread);
        }
        for t in 0..NT {
            let y = ld512(&a[t].qs[32 * b..32 * b + 64].as_chunks::<64>().0[0]);
            // −128·Σ a per 4-byte group, the starting value of every row's accumulation.
            let negc = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, y));
            let da = f32_halves(&a[t].d[b..b + 2], spread);
            for i in 0..R {
                let lanes = _mm512_dpbusd_epi32(negc, x[i], y);
                let dd = _mm512_mul_ps(dw[i], da);
                acc[i][t] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(lanes), acc[i][t]);
            }
        }
    }
    // An odd last block: the even accumulator only (the low half, under a mask).
    if nb % 2 == 1 {
        let b = nb - 1;
        let lo: __mmask16 = 0x00FF;
        let mut x = [zero; R];
        let mut dw = [_mm512_setzero_ps(); R];
        for (i, &r) in rows.iter().enumerate() {
            let b0 = r[34 * b..34 * b + 34]
                .as_chunks::<34>()
                .0
                .first()
                .unwrap_or_else(|| unreachable!());
            x[i] = _mm512_xor_si512(_mm512_zextsi256_si512(ld256(qs(b0))), bias);
            dw[i] = _mm512_set1_ps(f16_at::<0, 34>(b0));
        }
        for t in 0..NT {
            let y =
                _mm512_zextsi256_si512(ld256(&a[t].qs[32 * b..32 * b + 32].as_chunks::<32>().0[0]));
            let negc = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, y));
            let da = _mm512_set1_ps(a[t].d(b));
            for i in 0..R {
                let lanes = _mm512_dpbusd_epi32(negc, x[i], y);
                let dd = _mm512_mul_ps(dw[i], da);
                acc[i][t] = _mm512_mask3_fmadd_ps(dd, _mm512_cvtepi32_ps(lanes), acc[i][t], lo);
            }
        }
    }
    let mut res = [[0.0f32; T]; R];
    for i in 0..R {
        for t in 0..NT {
            let v = acc[i][t];
            // hsum(acc[0] + acc[1]), as the one-row kernel ends.
            let s = _mm256_add_ps(
                _mm512_castps512_ps256(v),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
            );
            res[i][t] = hsum_ps(s);
        }
    }
    res
}

/// Blocks `b` and `b + 1` of a row.
#[inline(always)]
fn block_pair(r: &[u8], b: usize) -> (&[u8; 34], &[u8; 34]) {
    let two = r[34 * b..34 * b + 68].as_chunks::<34>().0;
    (&two[0], &two[1])
}

/// The 32 quants of a block.
#[inline(always)]
fn qs(blk: &[u8; 34]) -> &[u8; 32] {
    super::super::avx2::at::<u8, 2, 32, 34>(blk)
}

/// Two blocks' f16 scales, `b0`'s in the 8 low f32 lanes and `b1`'s in the 8 high: both
/// widened by one conversion and spread by one permute (`spread`: lane 0 to the low eight,
/// lane 1 to the high). The widening is exact, so these are the one-row kernel's f32 scales;
/// three vector operations where two scalar conversions, two broadcasts and an insert took
/// seven. With [`f32_halves`] for the tokens' scales, measured on the 2-core Zen 4 VM (session
/// 37): `prefill_q8_0_64tok` 79.3 → 94.3 GFLOP/s; XS.2 8 layers Q8_0 pp512 (2 threads,
/// alternating, two rounds) 119.0 / 120.6 → 140.8 / 142.8 t/s (BENCHMARKS.md).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn f16_halves(b0: &[u8; 34], b1: &[u8; 34], spread: __m512i) -> __m512 {
    let h0 = i32::from(u16::from_le_bytes([b0[0], b0[1]]));
    let h1 = i32::from(u16::from_le_bytes([b1[0], b1[1]]));
    let w = _mm_cvtph_ps(_mm_cvtsi32_si128(h0 | (h1 << 16)));
    _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(w))
}

/// Two consecutive f32 scales (little-endian bytes) spread as [`f16_halves`] spreads.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn f32_halves(d: &[[u8; 4]], spread: __m512i) -> __m512 {
    let two: &[u8; 8] = d
        .as_flattened()
        .try_into()
        .unwrap_or_else(|_| unreachable!("two scales"));
    let v = _mm_cvtsi64_si128(i64::from_le_bytes(*two));
    _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_castsi128_ps(v)))
}
