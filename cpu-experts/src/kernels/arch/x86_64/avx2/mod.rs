//! AVX2 + FMA + F16C kernels (Haswell / Zen 1 and later).
//!
//! Each kernel is a `#[target_feature(enable = "avx2,fma,f16c")]` function with a private
//! safe wrapper of the [`RowDot`](super::super::super::RowDot) shape. The wrappers are only
//! reachable through [`table`], which takes an [`Avx2Fma`] proof token, which only
//! [`Avx2Fma::detect`] builds after the CPU reported all three features: that is the
//! whole safety argument for calling the kernels.
//!
//! The integer part of every block is computed exactly as in the scalar oracle; only the f32
//! accumulation order differs (8 lanes, several accumulators).

mod attend;
mod attn_tiles;
pub(super) mod ct;
mod float;
pub(super) mod iq;
pub(super) mod iq4x8;
pub(super) mod k16;
pub(super) mod k4;
pub(super) mod k4x8;
pub(super) mod k6x8;
mod legacy;

use core::arch::x86_64::*;

use super::super::super::{Table, scalar_table};

/// Proof that this CPU runs AVX2, FMA and F16C. Zero-sized; only [`Avx2Fma::detect`] makes
/// one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2Fma(());

impl Avx2Fma {
    /// `Some` iff the running CPU reports AVX2, FMA and F16C.
    pub(crate) fn detect() -> Option<Self> {
        (is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"))
        .then_some(Avx2Fma(()))
    }
}

/// The repacked 8-row Q4_K kernel (`kernels::x8`; not in the table yet).
pub(crate) fn q4k_x8(_proof: Avx2Fma) -> crate::kernels::x8::DotX8 {
    k4x8::dot_q4k_x8
}

/// The repacked 8-row Q4_K several-token kernel (`kernels::x8`).
pub(crate) fn q4k_x8_multi(_proof: Avx2Fma) -> crate::kernels::x8::DotX8Multi {
    k4x8::dot_q4k_x8_multi
}

/// The repacked 8-row IQ4_XS kernel (`kernels::x8_iq4xs`).
pub(crate) fn iq4xs_x8(_proof: Avx2Fma) -> crate::kernels::x8::DotX8 {
    iq4x8::dot_iq4xs_x8
}

/// The repacked 8-row IQ4_XS several-token kernel (`kernels::x8_iq4xs`).
pub(crate) fn iq4xs_x8_multi(_proof: Avx2Fma) -> crate::kernels::x8::DotX8Multi {
    iq4x8::dot_iq4xs_x8_multi
}

/// The repacked 8-row Q6_K kernel (`kernels::x8_q6k`).
pub(crate) fn q6k_x8(_proof: Avx2Fma) -> crate::kernels::x8::DotX8 {
    k6x8::dot_q6k_x8
}

/// The repacked 8-row Q6_K several-token kernel (`kernels::x8_q6k`).
pub(crate) fn q6k_x8_multi(_proof: Avx2Fma) -> crate::kernels::x8::DotX8Multi {
    k6x8::dot_q6k_x8_multi
}

/// The AVX2 table: scalar kernels overridden by every AVX2 kernel that exists.
pub(crate) fn table(_proof: Avx2Fma) -> Table {
    Table {
        name: "avx2",
        force_fallback: false,
        q8_0: legacy::vec_dot_q8_0_q8_0,
        q4_0: legacy::vec_dot_q4_0_q8_0,
        q4_1: legacy::vec_dot_q4_1_q8_0,
        q5_0: legacy::vec_dot_q5_0_q8_0,
        q5_1: legacy::vec_dot_q5_1_q8_0,
        q2k: k16::vec_dot_q2k_q8k,
        q3k: k16::vec_dot_q3k_q8k,
        q4k: k4::vec_dot_q4k_q8k,
        q4k_multi: Some(k4::vec_dot_q4k_q8k_multi),
        q8_0_multi: Some(legacy::vec_dot_q8_0_q8_0_multi),
        q6k_multi: Some(k16::vec_dot_q6k_q8k_multi),
        q2k_multi: Some(k16::vec_dot_q2k_q8k_multi),
        q4_0_multi: Some(legacy::vec_dot_q4_0_q8_0_multi),
        q4_1_multi: Some(legacy::vec_dot_q4_1_q8_0_multi),
        q5_0_multi: Some(legacy::vec_dot_q5_0_q8_0_multi),
        q5_1_multi: Some(legacy::vec_dot_q5_1_q8_0_multi),
        q3k_multi: Some(k16::vec_dot_q3k_q8k_multi),
        iq1s_multi: Some(iq::vec_dot_iq1_s_q8k_multi),
        iq1m_multi: Some(iq::vec_dot_iq1_m_q8k_multi),
        q5k: k4::vec_dot_q5k_q8k,
        q6k: k16::vec_dot_q6k_q8k,
        iq4xs: iq::vec_dot_iq4_xs_q8k,
        iq4xs_multi: Some(iq::vec_dot_iq4_xs_q8k_multi),
        iq3xxs: iq::vec_dot_iq3_xxs_q8k,
        iq3s: iq::vec_dot_iq3_s_q8k,
        iq2xxs: iq::vec_dot_iq2_xxs_q8k,
        iq2xs: iq::vec_dot_iq2_xs_q8k,
        iq2s: iq::vec_dot_iq2_s_q8k,
        iq1s: iq::vec_dot_iq1_s_q8k,
        iq1m: iq::vec_dot_iq1_m_q8k,
        iq4nl: iq::vec_dot_iq4_nl_q8_0,
        mxfp4: iq::vec_dot_mxfp4_q8_0,
        f32: float::vec_dot_f32_f32,
        f32_gemm: Some(float::f32_f32_gemm),
        f16_gemm: Some(float::f16_f32_gemm),
        bf16_gemm: Some(float::bf16_f32_gemm),
        attend: Some(attend::attend_group),
        attend_tokens: Some(attend::attend_tokens),
        f16: float::vec_dot_f16_f32,
        bf16: float::vec_dot_bf16_f32,
        dot_f32: float::dot_f32_act,
        ct_nib4: ct::vec_dot_ct_nib4_q8_0,
        ct_nib4_perm: Some((ct::nib4_act_order, ct::vec_dot_ct_nib4_perm_q8_0)),
        prefetch: prefetch_bytes,
        ..scalar_table()
    }
}

/// Declares the safe wrapper `$name` of the target-feature kernel `$kernel` with the given
/// signature. The wrapper is only placed in the table built by [`table`].
macro_rules! wrap {
    ($(#[$m:meta])* $name:ident => $kernel:ident ($($arg:ident : $ty:ty),*) -> $ret:ty) => {
        $(#[$m])*
        pub(super) fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: `$kernel` only needs AVX2, FMA and F16C. This wrapper is reachable only
            // through the table built by `avx2::table`, which requires an `Avx2Fma` token,
            // and `Avx2Fma::detect` builds one only after detecting all three features.
            unsafe { $kernel($($arg),*) }
        }
    };
}
pub(crate) use wrap;

/// `out[t] = w · acts[t]` through the N-token kernel `$kernel` (`fn<const N>(w, [&[u8]; N], n)
/// -> [f32; N]`): the tokens in runs of four, each run of two to four in one call, a lone
/// token alone. With `8;` first, a call of exactly eight tokens (what
/// `Kernels::dot_rows_multi` hands over while eight remain) is one call of the kernel at
/// N = 8: only kernels measured faster so (session 43, `prefill_*_64tok` on the Zen 4 VM:
/// the grid and IQ1 kernels, whose per-block lookups then serve twice the tokens, +9–29%; the
/// legacy and Q2_K/Q3_K ones lost 5–21%, many AVX2 ones too, so they keep four). Every wrapper
/// of a several-token kernel (`multi_n!`, `avx512::wrap_n!`, the grid kernels') expands it.
macro_rules! by_n_tokens {
    // (The literal is 8; matched as a fragment so that wrappers can pass theirs on.)
    ($eight:literal; $kernel:ident, $w:expr, $acts:expr, $n:expr, $out:expr) => {{
        const { assert!($eight == 8) };
        match *$acts {
            [a0, a1, a2, a3, a4, a5, a6, a7] => {
                $out.copy_from_slice(&$kernel($w, [a0, a1, a2, a3, a4, a5, a6, a7], $n))
            }
            _ => $crate::kernels::arch::x86_64::avx2::by_n_tokens!($kernel, $w, $acts, $n, $out),
        }
    }};
    ($kernel:ident, $w:expr, $acts:expr, $n:expr, $out:expr) => {
        for (acts, out) in $acts.chunks(4).zip($out.chunks_mut(4)) {
            match *acts {
                [a0, a1, a2, a3] => out.copy_from_slice(&$kernel($w, [a0, a1, a2, a3], $n)),
                [a0, a1, a2] => out.copy_from_slice(&$kernel($w, [a0, a1, a2], $n)),
                [a0, a1] => out.copy_from_slice(&$kernel($w, [a0, a1], $n)),
                _ => {
                    for (o, a) in out.iter_mut().zip(acts) {
                        *o = $kernel($w, [*a], $n)[0];
                    }
                }
            }
        }
    };
}
pub(crate) use by_n_tokens;

/// Declares the safe several-token wrapper `$name` (a `MultiDot`) of the AVX2 N-token kernel
/// `$kernel`. Placed only in the table built by [`table`].
macro_rules! multi_n {
    ($($eight:literal;)? $name:ident => $kernel:ident) => {
        pub(super) fn $name(w: &[u8], acts: &[&[u8]], n: usize, out: &mut [f32]) {
            // SAFETY: `$kernel` only needs AVX2, FMA and F16C. This wrapper is reachable only
            // through the table built by `avx2::table`, which requires an `Avx2Fma` token, and
            // `Avx2Fma::detect` builds one only after detecting all three features.
            unsafe {
                $crate::kernels::arch::x86_64::avx2::by_n_tokens!($($eight;)? $kernel, w, acts, n, out)
            }
        }
    };
}
pub(crate) use multi_n;

/// The Q8_K rows of N tokens, or (`Err`) each token's result alone: NaN for N = 1 (a malformed
/// row), the one-token kernel `one`'s otherwise (a bad row spoils only itself).
#[inline(always)]
pub(crate) fn q8k_rows<'a, const N: usize>(
    acts: [&'a [u8]; N],
    n: usize,
    one: impl Fn(&[u8]) -> f32,
) -> Result<[crate::kernels::act::Q8KAct<'a>; N], [f32; N]> {
    let q = acts.map(|a| crate::kernels::act::Q8KAct::new(a, n));
    if q.iter().all(Option::is_some) {
        Ok(q.map(|a| a.unwrap_or_else(|| unreachable!())))
    } else if N == 1 {
        Err([f32::NAN; N])
    } else {
        Err(acts.map(one))
    }
}

/// `&b[O..O + L]` as an array reference (bounds checked at compile time).
#[inline(always)]
pub(crate) fn at<T, const O: usize, const L: usize, const B: usize>(b: &[T; B]) -> &[T; L] {
    const { assert!(O + L <= B) };
    // SAFETY: O + L <= B (asserted at compile time), so the L elements starting at O lie
    // inside `b`; `[T; L]` has the alignment of `T`; the borrow keeps `b`'s lifetime.
    unsafe { &*b.as_ptr().add(O).cast::<[T; L]>() }
}

/// Loads 32 bytes (no alignment needed).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn ld256<T: Copy>(b: &[T; 32]) -> __m256i {
    const { assert!(size_of::<T>() == 1) };
    // SAFETY: `b` is 32 readable bytes (T is one byte, asserted above); `loadu` accepts
    // any alignment.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

/// Stores 32 bytes (no alignment needed).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn st256<T: Copy>(b: &mut [T; 32], v: __m256i) {
    const { assert!(size_of::<T>() == 1) };
    // SAFETY: `b` is 32 writable bytes (T is one byte, asserted above); `storeu` accepts
    // any alignment.
    unsafe { _mm256_storeu_si256(b.as_mut_ptr().cast(), v) }
}

/// Loads 16 bytes (no alignment needed).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn ld128<T: Copy>(b: &[T; 16]) -> __m128i {
    const { assert!(size_of::<T>() == 1) };
    // SAFETY: `b` is 16 readable bytes; `loadu` accepts any alignment.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// Loads 8 little-endian f32 from 32 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn ld_ps(b: &[u8; 32]) -> __m256 {
    // SAFETY: `b` is 32 readable bytes; `loadu` accepts any alignment; x86 is little-endian.
    unsafe { _mm256_loadu_ps(b.as_ptr().cast()) }
}

/// Horizontal sum of 8 f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// fp16 bits at byte `O` of a block → f32, through F16C (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn f16_at<const O: usize, const B: usize>(b: &[u8; B]) -> f32 {
    let h = u16::from_le_bytes(*at::<u8, O, 2, B>(b));
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
}

/// `Σ x·y` of signed bytes as 8 i32 lanes (ggml's sign trick: `maddubs` wants an unsigned
/// first operand, so move x's sign onto y). Exact while |x| ≤ 128 and |y| ≤ 127.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_i8(x: __m256i, y: __m256i) -> __m256i {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1))
}

/// `Σ u·y` of unsigned x signed bytes as 8 i32 lanes. Exact while 2·u·|y| < 2¹⁵.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_u8i8(u: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1))
}

/// The float GEMMs (F32, F16, BF16 weights × f32 activations) compiled with AVX-512 F and VL,
/// for the AVX-512 table (`float::f32_f32_gemm_z`): the AVX2 table's bits.
pub(super) fn float_gemms_z(_proof: super::avx512::Avx512Vnni) -> [crate::kernels::Gemm; 3] {
    [
        float::f32_f32_gemm_z,
        float::f16_f32_gemm_z,
        float::bf16_f32_gemm_z,
    ]
}

wrap!(prefetch_bytes => prefetch(b: &[u8]) -> ());

/// `prefetcht0` on every 64-byte line of `b`.
#[target_feature(enable = "avx2,fma,f16c")]
fn prefetch(b: &[u8]) {
    for line in b.chunks(64) {
        _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast());
    }
}
