//! Float weights (F32, F16, BF16) × f32 activations, and the fallback's f32 · f32.
//!
//! Scalar: `Σ_i w_i · a_i` in f32. Here: weights widened to f32 eight at a time (F16 through
//! F16C `vcvtph2ps`, BF16 by shifting the 16 bits into the top of an f32 — both exact), four
//! FMA accumulators over 32 elements per step, then 8-element steps, then a scalar tail.

use core::arch::x86_64::*;

use super::{hsum_ps, ld_ps, ld128, wrap};
use crate::kernels::scalar::{blocks, f32_act};

/// The shared loop. `$WB` is bytes per weight element; `$widen` turns `&[u8; 8·$WB]` into
/// 8 f32 lanes.
macro_rules! float_loop {
    ($w:expr, $a:expr, $n:expr, $WB:literal, $widen:expr, $scalar:expr) => {{
        let (Some(av), Some(_)) = (f32_act($a, $n), blocks::<$WB>($w, $n)) else {
            return f32::NAN;
        };
        let widen = $widen;
        let a_bytes = av.as_flattened();
        let (w32, wt) = $w.as_chunks::<{ 32 * $WB }>();
        let (a32, at_) = a_bytes.as_chunks::<128>();
        let mut acc = [_mm256_setzero_ps(); 4];
        for (wc, ac) in w32.iter().zip(a32) {
            let (wc, ac) = (wc.as_chunks::<{ 8 * $WB }>().0, ac.as_chunks::<32>().0);
            for k in 0..4 {
                acc[k] = _mm256_fmadd_ps(widen(&wc[k]), ld_ps(&ac[k]), acc[k]);
            }
        }
        let (w8, wt) = wt.as_chunks::<{ 8 * $WB }>();
        let (a8, at_) = at_.as_chunks::<32>();
        for (wc, ac) in w8.iter().zip(a8) {
            acc[0] = _mm256_fmadd_ps(widen(wc), ld_ps(ac), acc[0]);
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut sum = hsum_ps(s);
        let scalar = $scalar;
        for (wc, ac) in wt.as_chunks::<$WB>().0.iter().zip(at_.as_chunks::<4>().0) {
            sum += scalar(wc) * f32::from_le_bytes(*ac);
        }
        sum
    }};
}

wrap!(vec_dot_f32_f32 => f32_f32(w: &[u8], a: &[u8], n: usize) -> f32);
wrap!(vec_dot_f16_f32 => f16_f32(w: &[u8], a: &[u8], n: usize) -> f32);
wrap!(vec_dot_bf16_f32 => bf16_f32(w: &[u8], a: &[u8], n: usize) -> f32);
wrap!(dot_f32_act => f32_act_dot(w: &[f32], a: &[[u8; 4]]) -> f32);

/// F32 × F32 (4-byte LE elements).
#[target_feature(enable = "avx2,fma,f16c")]
fn f32_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    float_loop!(w, a, n, 4, |x: &[u8; 32]| ld_ps(x), |x: &[u8; 4]| {
        f32::from_le_bytes(*x)
    })
}

/// A [`Gemm`](crate::kernels::Gemm) for float weights of `$WB` bytes an element × f32
/// activations: tokens in groups of four, and for each group every row in turn through `$n`
/// (`$one` for a lone token), so the group's activation rows stay in L1 while the rows stream
/// from L2 (rather than every token row streamed from L2 once per weight row), and each row's
/// chunk is loaded and widened once for the group. Each result is `$one`'s, bit for bit.
macro_rules! float_gemm {
    ($name:ident, $WB:literal, $n:ident, $one:ident) => {
        pub(super) fn $name(g: crate::kernels::GemmArgs<'_>) -> bool {
            let ab = 4 * g.cols;
            if !(g.rb == $WB * g.cols && g.bounds_ok(ab, |_| true)) {
                return false;
            }
            let crate::kernels::GemmArgs {
                w,
                rb,
                n_rows,
                acts,
                act_stride,
                n_act,
                cols,
                out,
                out_stride,
            } = g;
            let act = |t: usize| &acts[t * act_stride..t * act_stride + ab];
            for t0 in (0..n_act).step_by(4) {
                let nt = 4.min(n_act - t0);
                for r in 0..n_rows {
                    let row = &w[r * rb..(r + 1) * rb];
                    let mut v = [0.0f32; 4];
                    // SAFETY: the kernels need AVX2, FMA and F16C (the `_z` forms also
                    // AVX-512 F and VL). This wrapper is reachable only through the table built
                    // by `avx2::table`, which requires an `Avx2Fma` token (the `_z` wrappers:
                    // only through `avx512::table`, which requires an `Avx512Vnni` token).
                    unsafe {
                        match nt {
                            4 => {
                                v = $n::<4>(
                                    row,
                                    [act(t0), act(t0 + 1), act(t0 + 2), act(t0 + 3)],
                                    cols,
                                )
                            }
                            3 => v[..3].copy_from_slice(&$n::<3>(
                                row,
                                [act(t0), act(t0 + 1), act(t0 + 2)],
                                cols,
                            )),
                            2 => {
                                v[..2].copy_from_slice(&$n::<2>(row, [act(t0), act(t0 + 1)], cols))
                            }
                            _ => v[0] = $one(row, act(t0), cols),
                        }
                    }
                    for (k, &x) in v[..nt].iter().enumerate() {
                        out[(t0 + k) * out_stride + r] = x;
                    }
                }
            }
            true
        }
    };
}

float_gemm!(f32_f32_gemm, 4, f32_n, f32_f32);
float_gemm!(f16_f32_gemm, 2, f16_n, f16_f32);
float_gemm!(bf16_f32_gemm, 2, bf16_n, bf16_f32);
// The same GEMMs compiled with AVX-512 F and VL for the AVX-512 table: four tokens' sixteen
// accumulators spill on AVX2's sixteen ymm registers and fit in VL's 32. Same code, same
// operations in the same order: the same bits.
float_gemm!(f32_f32_gemm_z, 4, f32_n_z, f32_f32);
float_gemm!(f16_f32_gemm_z, 2, f16_n_z, f16_f32);
float_gemm!(bf16_f32_gemm_z, 2, bf16_n_z, bf16_f32);

/// `float_loop!` for `N` tokens at once: each weight chunk is loaded and widened once for all
/// of them, and every token's accumulators, steps and final reduction are exactly the one-row
/// kernel `$one`'s, so each result is bit-identical to that token alone. A malformed token
/// takes `$one` (NaN).
macro_rules! float_n {
    ($w:expr, $acts:expr, $n:expr, $N:ident, $WB:literal, $widen:expr, $scalar:expr, $one:ident) => {{
        let (w, acts, n) = ($w, $acts, $n);
        let ok = blocks::<$WB>(w, n).is_some() && acts.iter().all(|a| f32_act(a, n).is_some());
        if !ok {
            return core::array::from_fn(|t| $one(w, acts[t], n));
        }
        let widen = $widen;
        let (w32, wt) = w.as_chunks::<{ 32 * $WB }>();
        let a32: [&[[u8; 128]]; $N] = core::array::from_fn(|t| acts[t].as_chunks::<128>().0);
        let mut acc = [[_mm256_setzero_ps(); 4]; $N];
        for (c, wc) in w32.iter().enumerate() {
            let wc = wc.as_chunks::<{ 8 * $WB }>().0;
            for k in 0..4 {
                let wv = widen(&wc[k]);
                for t in 0..$N {
                    let av = ld_ps(&a32[t][c].as_chunks::<32>().0[k]);
                    acc[t][k] = _mm256_fmadd_ps(wv, av, acc[t][k]);
                }
            }
        }
        let tail0 = w32.len() * 32;
        let (w8, wt) = wt.as_chunks::<{ 8 * $WB }>();
        let scalar = $scalar;
        let mut res = [0.0f32; $N];
        for t in 0..$N {
            let at_ = &acts[t][4 * tail0..];
            let (a8, at_) = at_.as_chunks::<32>();
            let mut a0 = acc[t][0];
            for (wc, ac) in w8.iter().zip(a8) {
                a0 = _mm256_fmadd_ps(widen(wc), ld_ps(ac), a0);
            }
            let a = acc[t];
            let s = _mm256_add_ps(_mm256_add_ps(a0, a[1]), _mm256_add_ps(a[2], a[3]));
            let mut sum = hsum_ps(s);
            for (wc, ac) in wt.as_chunks::<$WB>().0.iter().zip(at_.as_chunks::<4>().0) {
                sum += scalar(wc) * f32::from_le_bytes(*ac);
            }
            res[t] = sum;
        }
        res
    }};
}

/// The three `float_n!` kernels (F32, F16, BF16 weights; [`f32_f32`], [`f16_f32`] and
/// [`bf16_f32`] for `N` tokens at once) compiled with the target features `$feat`: once for
/// AVX2, once with AVX-512 F and VL (see `f32_f32_gemm_z`).
macro_rules! float_n_kernels {
    ($feat:literal, $f32:ident, $f16:ident, $bf16:ident) => {
        #[target_feature(enable = $feat)]
        fn $f32<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
            float_n!(
                w,
                acts,
                n,
                N,
                4,
                |x: &[u8; 32]| ld_ps(x),
                |x: &[u8; 4]| { f32::from_le_bytes(*x) },
                f32_f32
            )
        }

        #[target_feature(enable = $feat)]
        fn $f16<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
            float_n!(
                w,
                acts,
                n,
                N,
                2,
                |x: &[u8; 16]| _mm256_cvtph_ps(ld128(x)),
                |x: &[u8; 2]| crate::kernels::scalar::f16_to_f32(u16::from_le_bytes(*x)),
                f16_f32
            )
        }

        #[target_feature(enable = $feat)]
        fn $bf16<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
            float_n!(
                w,
                acts,
                n,
                N,
                2,
                |x: &[u8; 16]| _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                    ld128(x)
                ))),
                |x: &[u8; 2]| f32::from_bits(u32::from(u16::from_le_bytes(*x)) << 16),
                bf16_f32
            )
        }
    };
}

float_n_kernels!("avx2,fma,f16c", f32_n, f16_n, bf16_n);
float_n_kernels!("avx2,fma,f16c,avx512f,avx512vl", f32_n_z, f16_n_z, bf16_n_z);

/// F16 × F32: `vcvtph2ps` widens 8 halves at once.
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    float_loop!(
        w,
        a,
        n,
        2,
        |x: &[u8; 16]| _mm256_cvtph_ps(ld128(x)),
        |x: &[u8; 2]| crate::kernels::scalar::f16_to_f32(u16::from_le_bytes(*x))
    )
}

/// BF16 × F32: zero-extend to 32 bits and shift into the top half.
#[target_feature(enable = "avx2,fma,f16c")]
fn bf16_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    float_loop!(
        w,
        a,
        n,
        2,
        |x: &[u8; 16]| _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(ld128(
            x
        )))),
        |x: &[u8; 2]| f32::from_bits(u32::from(u16::from_le_bytes(*x)) << 16)
    )
}

/// Dequantised f32 weights × f32 activation bytes (the fallback).
#[target_feature(enable = "avx2,fma,f16c")]
fn f32_act_dot(w: &[f32], a: &[[u8; 4]]) -> f32 {
    let n = w.len().min(a.len());
    // SAFETY: reinterprets the first n f32s as their 4n bytes (f32 has no invalid bit
    // patterns as bytes, u8 has alignment 1, and the borrow keeps `w` alive).
    let wb = unsafe { core::slice::from_raw_parts(w.as_ptr().cast::<u8>(), 4 * n) };
    let ab = a[..n].as_flattened();
    f32_f32(wb, ab, n)
}
