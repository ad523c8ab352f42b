//! AVX-512 (F, BW, VL) + VNNI kernels where they beat AVX2: Q6_K, IQ4_XS and
//! compressed-tensors int4, and — when the CPU also has VBMI, BITALG, GFNI and BMI2 — the
//! grid types IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S (`iq::with_grid_kernels`: grid
//! lookups by `vpermt2b`, codes to magnitudes by `gf2p8affineqb`; 1.6–2.6x AVX2 single
//! thread). Everything else keeps the AVX2 kernel (the table starts from AVX2's).
//!
//! Measured single thread on the development VM (Xeon, AVX-512 + VNNI), `benches/kernels.rs`
//! group `simd_cmp_*` (thread CPU time, three runs): 512-bit Q6_K +5-13 % decode and
//! +44-57 % prefill, IQ4_XS +15-34 % / +6-42 %, ct-int4 g32 +2-6 % decode. 512-bit Q4_K and
//! Q8_0 kernels (same construction: broadcast-and-shift nibbles + `vpdpwssd`, two 32-blocks
//! per register + `vpdpbusd`) lost 4-10 % on single-thread decode against AVX2 and were
//! inconclusive on prefill, so they were dropped; AVX2 keeps those types, except that
//! the one-row kernels of Q4_K and Q8_0 (and IQ4_XS's) run on 256 bits with VNNI
//! (`vnni256`: +7 %, +13 % and +17 % single thread on the AMD EPYC VM).
//!
//! Prefill adds rows × tokens GEMMs for Q4_K (`k4`), Q6_K (`k16`) and Q8_0 (`q8_0`),
//! bit-identical per (row, token) to the one-row kernels, measured single thread
//! (`simd_cmp_prefill`, thread CPU time, 1024 × 3072): Q4_K 131 GFLOP/s at 64 tokens and
//! 102 at 16 against AVX2's 54 / 60, Q6_K 112 / 81 against 39 / 44 (Xeon VM); Q8_0 end
//! to end pp512 62 → 114-117 t/s (AMD EPYC VM); and grouped-query attention (`float`).
//!
//! The same proof-token pattern as AVX2: every kernel is a `#[target_feature]` function
//! behind a private safe wrapper, reachable only through [`table`], which takes an
//! [`Avx512Vnni`] token, which only [`Avx512Vnni::detect`] builds after the CPU reported
//! AVX2, FMA, F16C, AVX-512 F/BW/VL and AVX512-VNNI.
//!
//! What 512 bits and VNNI buy (learned from ggml's AVX-512 paths in
//! `ggml-cpu/arch/x86/quants.c` and its `vpdpbusd` use in `ggml-cpu/llamafile/sgemm.cpp`,
//! restated): 64 quants per instruction instead of 32, `vpdpbusd` (u8·i8, 4 products
//! summed into i32 without the i16 saturation of `maddubs`) for the scale-free
//! compressed-tensors blocks, and `vpdpwssd` (i16·i16 pairs accumulated into i32) to fold
//! each sub-block scale into the accumulation for Q6_K and IQ4_XS. Signs move with a byte mask (`vpmovb2m` +
//! masked subtract), since there is no 512-bit `vpsignb`.
//!
//! Each type has one kernel generic over the token count N (1 = the row kernel, 2-4 = the
//! several-token kernel), so the several-token results are bit-identical to one at a time.
//! The integer sums are exact, as in the scalar oracle; only the f32 order differs.

mod attn_tiles;
mod ct;
pub(super) mod ct4x8z;
mod float;
mod iq;
mod iq1;
pub(super) mod iq2x8z;
pub(super) mod iq3x8z;
pub(super) mod iq4x8z;
mod k16;
pub(super) mod k23x8z;
pub(super) mod k4;
pub(super) mod k4x8amx;
pub(super) mod k4x8z;
pub(super) mod k5x8z;
mod q8_0;
pub(super) mod q8x8z;
mod vnni256;
pub(super) mod x8;

use core::arch::x86_64::*;

use super::super::super::Table;
use super::avx2;

/// Proof that this CPU runs AVX2+FMA+F16C and AVX-512 F/BW/VL/VNNI. Zero-sized; only
/// [`Avx512Vnni::detect`] makes one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512Vnni(());

impl Avx512Vnni {
    /// `Some` iff the running CPU reports every feature the kernels enable.
    pub(crate) fn detect() -> Option<Self> {
        (is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni"))
        .then_some(Avx512Vnni(()))
    }

    /// The AVX2 proof this one implies (AVX2, FMA and F16C were all detected).
    fn avx2(self) -> avx2::Avx2Fma {
        avx2::Avx2Fma::detect().unwrap_or_else(|| unreachable!("detected with AVX-512"))
    }
}

/// The AVX-512 table: the AVX2 table with the kernels that measurably win replaced
/// (single thread, `benches/kernels.rs`; see each module).
pub(crate) fn table(proof: Avx512Vnni) -> Table {
    let [f32_gemm, f16_gemm, bf16_gemm] = avx2::float_gemms_z(proof);
    let t = Table {
        name: "avx512vnni",
        q4k: vnni256::vec_dot_q4k_q8k,
        q8_0: vnni256::vec_dot_q8_0_q8_0,
        q6k: k16::vec_dot_q6k_q8k,
        q6k_multi: Some(k16::vec_dot_q6k_q8k_multi),
        q4k_gemm: Some(k4::q4k_q8k_gemm),
        q6k_gemm: Some(k16::q6k_q8k_gemm),
        q8_0_gemm: Some(q8_0::q8_0_q8_0_gemm),
        f32_gemm: Some(f32_gemm),
        f16_gemm: Some(f16_gemm),
        bf16_gemm: Some(bf16_gemm),
        attend: Some(float::attend_group),
        attend_tokens: Some(float::attend_tokens),
        iq4xs: vnni256::vec_dot_iq4_xs_q8k,
        iq4xs_multi: Some(iq::vec_dot_iq4_xs_q8k_multi),
        // IQ1_S at one token stays on the AVX2 kernel (same bits; XS.2 IQ1_S-like tg128 52.3
        // against 50.6 t/s with this one, session 42).
        iq1m: iq1::vec_dot_iq1_m_q8k,
        iq1s_multi: Some(iq1::vec_dot_iq1_s_q8k_multi),
        iq1m_multi: Some(iq1::vec_dot_iq1_m_q8k_multi),
        ct_nib4: ct::vec_dot_ct_nib4_q8_0,
        // (The AVX2 activation-order kernel is not measured against this one.)
        ct_nib4_perm: None,
        ..avx2::table(proof.avx2())
    };
    iq::with_grid_kernels(proof, t)
}

/// Declares the safe row wrapper `$name` and the several-token wrapper `$multi` of the
/// N-generic kernel `$kernel` (`multi $multi => $kernel`: the latter only).
macro_rules! wrap_n {
    ($name:ident, $multi:ident => $($eight:literal;)? $kernel:ident) => {
        pub(super) fn $name(w: &[u8], a: &[u8], n: usize) -> f32 {
            // SAFETY: `$kernel` only needs the features `Avx512Vnni::detect` checks. This
            // wrapper is reachable only through the table built by `avx512::table`, which
            // requires an `Avx512Vnni` token.
            unsafe { $kernel(w, [a], n)[0] }
        }

        $crate::kernels::arch::x86_64::avx512::wrap_n!(multi $multi => $($eight;)? $kernel);
    };
    // The several-token wrapper alone (the type's row kernel is another one). `8;` before
    // the kernel: eight tokens a call ([`super::avx2::by_n_tokens`]).
    (multi $multi:ident => $($eight:literal;)? $kernel:ident) => {
        pub(super) fn $multi(w: &[u8], acts: &[&[u8]], n: usize, out: &mut [f32]) {
            // SAFETY: `$kernel` only needs the features `Avx512Vnni::detect` checks. This
            // wrapper is reachable only through the table built by `avx512::table`, which
            // requires an `Avx512Vnni` token.
            unsafe {
                $crate::kernels::arch::x86_64::avx2::by_n_tokens!($($eight;)? $kernel, w, acts, n, out)
            }
        }
    };
}
pub(crate) use wrap_n;

/// Loads 64 bytes (no alignment needed).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn ld512<T: Copy>(b: &[T; 64]) -> __m512i {
    const { assert!(size_of::<T>() == 1) };
    // SAFETY: `b` is 64 readable bytes (T is one byte); `loadu` accepts any alignment.
    unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
}

/// `lo` in the low 256 bits, `hi` in the high.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn join256(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// The 16 i32 lanes folded to 8 (low half + high half).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn fold256(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// Index vector for `vpermw` picking i16 element `a` into words 0-15 and `b` into 16-31.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn pick2(a: i16, b: i16) -> __m512i {
    join256(_mm256_set1_epi16(a), _mm256_set1_epi16(b))
}

/// Per-token row views for an N-generic kernel: `Some` when every token row is valid.
pub(super) fn rows_ok<'a, const N: usize, A: Copy>(
    acts: [&'a [u8]; N],
    new: impl Fn(&'a [u8]) -> Option<A>,
) -> Option<[A; N]> {
    let v = acts.map(new);
    v.iter()
        .all(Option::is_some)
        .then(|| v.map(|a| a.unwrap_or_else(|| unreachable!())))
}
