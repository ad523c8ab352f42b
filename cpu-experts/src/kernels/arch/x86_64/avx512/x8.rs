//! The repacked 8-row Q4_K, IQ4_XS and Q6_K kernels (`kernels::x8`, `kernels::x8_iq4xs`,
//! `kernels::x8_q6k`; the bodies of `avx2::k4x8`, `avx2::iq4x8` and `avx2::k6x8`). Q4_K: on 256 bits
//! with AVX512-VNNI: each step's `maddubs` and i16 add become one `vpdpbusd` (u8 nibbles ·
//! i8 activations, four products summed into each row's i32 lane), and the per-sub-block
//! scaling is a `mullo`. The lanes hold the same exact integers as AVX2's, so the results
//! are the same bits (the scalar reference's).

use core::arch::x86_64::*;

use super::Avx512Vnni;

crate::kernels::arch::x86_64::avx2::k4x8::x8_kernels!(
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    |x, w, a| _mm256_dpbusd_epi32(x, w, a),
    // A lane here sums 32 products (up to 61,440 in magnitude), past i16: a `mullo` by the
    // scales, not the AVX2 form's `madd`.
    |sum, y, s| _mm256_add_epi32(sum, _mm256_mullo_epi32(y, s)),
    false
);

fn dot_q4k_x8(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
    // SAFETY: `q4k_x8` only needs the features `Avx512Vnni::detect` checks; this function is
    // reachable only through `q4k_x8_fn`, which requires an `Avx512Vnni` token.
    unsafe { q4k_x8(p, a, cols, out) }
}

fn dot_q4k_x8_multi(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
    // SAFETY: as for `dot_q4k_x8` (reachable only through `q4k_x8_multi_fn`).
    unsafe { q4k_x8_multi(p, acts, cols, out) }
}

/// The one-token kernel, for a CPU with AVX512-VNNI.
pub(crate) fn q4k_x8_fn(_proof: Avx512Vnni) -> crate::kernels::x8::DotX8 {
    dot_q4k_x8
}

/// The several-token kernel, for a CPU with AVX512-VNNI.
pub(crate) fn q4k_x8_multi_fn(_proof: Avx512Vnni) -> crate::kernels::x8::DotX8Multi {
    dot_q4k_x8_multi
}

/// IQ4_XS (`avx2::iq4x8`'s body): the codebook shifted to unsigned and one `vpdpbusd` per step,
/// the shift's `128·Σa` taken off per super-block.
mod iq4 {
    use core::arch::x86_64::*;

    crate::kernels::arch::x86_64::avx2::iq4x8::iq4x8_kernels!(
        "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
        crate::kernels::arch::x86_64::avx2::iq4x8::iq4nl_lut256(-128),
        |v| v,
        |x, p, a, s| _mm256_dpbusd_epi32(x, p, a),
        |y, s32| _mm256_mullo_epi32(y, s32),
        true
    );

    pub(super) fn dot_iq4xs_x8(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
        // SAFETY: `iq4xs_x8` only needs the features `Avx512Vnni::detect` checks; this is
        // reachable only through `iq4xs_x8_fn`, which requires an `Avx512Vnni` token.
        unsafe { iq4xs_x8(p, a, cols, out) }
    }

    pub(super) fn dot_iq4xs_x8_multi(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
        // SAFETY: as for `dot_iq4xs_x8` (reachable only through `iq4xs_x8_multi_fn`).
        unsafe { iq4xs_x8_multi(p, acts, cols, out) }
    }
}

/// The one-token IQ4_XS kernel, for a CPU with AVX512-VNNI.
pub(crate) fn iq4xs_x8_fn(_proof: Avx512Vnni) -> crate::kernels::x8::DotX8 {
    iq4::dot_iq4xs_x8
}

/// The several-token IQ4_XS kernel, for a CPU with AVX512-VNNI.
pub(crate) fn iq4xs_x8_multi_fn(_proof: Avx512Vnni) -> crate::kernels::x8::DotX8Multi {
    iq4::dot_iq4xs_x8_multi
}

/// Q6_K (`avx2::k6x8`'s body): one `vpdpbusd` per value vector, each sub-block's sum times the
/// rows' scales by `mullo`.
mod q6k {
    use core::arch::x86_64::*;

    crate::kernels::arch::x86_64::avx2::k6x8::k6x8_kernels!(
        "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
        |x, u, a, s| _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(x, u.0, a.0), u.1, a.1),
        |y, s32| _mm256_mullo_epi32(y, s32)
    );

    pub(super) fn dot_q6k_x8(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
        // SAFETY: `q6k_x8` only needs the features `Avx512Vnni::detect` checks; this is
        // reachable only through `q6k_x8_fn`, which requires an `Avx512Vnni` token.
        unsafe { q6k_x8(p, a, cols, out) }
    }

    pub(super) fn dot_q6k_x8_multi(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
        // SAFETY: as for `dot_q6k_x8` (reachable only through `q6k_x8_multi_fn`).
        unsafe { q6k_x8_multi(p, acts, cols, out) }
    }
}

/// The one-token Q6_K kernel, for a CPU with AVX512-VNNI.
pub(crate) fn q6k_x8_fn(_proof: Avx512Vnni) -> crate::kernels::x8::DotX8 {
    q6k::dot_q6k_x8
}

/// The several-token Q6_K kernel, for a CPU with AVX512-VNNI.
pub(crate) fn q6k_x8_multi_fn(_proof: Avx512Vnni) -> crate::kernels::x8::DotX8Multi {
    q6k::dot_q6k_x8_multi
}
