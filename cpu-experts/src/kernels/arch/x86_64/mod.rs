//! x86-64 kernels: AVX2+FMA+F16C, and AVX-512 F/BW/VL + VNNI variants of the hottest types
//! on CPUs that have them (resolved at run time; `LAGOON_FORCE_AVX2=1` keeps AVX2).

mod avx2;
// The AVX-512 intrinsics and target features are stable from Rust 1.89 (the workspace's
// `rust-version`).
mod avx512;

use super::super::Table;

/// The best table this CPU supports, or `None` for the scalar one.
pub(crate) fn best_table() -> Option<Table> {
    let no512 = std::env::var_os("LAGOON_FORCE_AVX2").is_some_and(|v| v == "1");
    match avx512::Avx512Vnni::detect() {
        Some(p) if !no512 => Some(avx512::table(p)),
        _ => avx2_table(),
    }
}

/// The AVX2 table, where the CPU runs it.
pub(crate) fn avx2_table() -> Option<Table> {
    avx2::Avx2Fma::detect().map(avx2::table)
}

/// The AVX-512 VNNI table, where the CPU runs it.
pub(crate) fn avx512_table() -> Option<Table> {
    avx512::Avx512Vnni::detect().map(avx512::table)
}

/// The repacked 8-row Q4_K several-token kernel (`kernels::x8`): AVX512-VNNI's when `vnni`
/// and the CPU has it, else AVX2's where the CPU runs it. (The IQ4_XS and Q6_K families below
/// choose the same way.)
pub(crate) fn q4k_x8_multi(vnni: bool) -> Option<crate::kernels::x8::DotX8Multi> {
    match avx512::Avx512Vnni::detect().filter(|_| vnni) {
        Some(p) => Some(avx512::x8::q4k_x8_multi_fn(p)),
        None => avx2::Avx2Fma::detect().map(avx2::q4k_x8_multi),
    }
}

/// The repacked 8-row Q4_K one-token kernel, as [`q4k_x8_multi`] chooses.
pub(crate) fn q4k_x8(vnni: bool) -> Option<crate::kernels::x8::DotX8> {
    match avx512::Avx512Vnni::detect().filter(|_| vnni) {
        Some(p) => Some(avx512::x8::q4k_x8_fn(p)),
        None => avx2::Avx2Fma::detect().map(avx2::q4k_x8),
    }
}

/// The repacked 8-row IQ4_XS several-token kernel (`kernels::x8_iq4xs`), as
/// [`q4k_x8_multi`] chooses.
/// Where the CPU also has AVX512-VBMI, the 512-bit kernels (`avx512::iq4x8z`) unless
/// `LAGOON_CPU_X8_ZMM=0`.
pub(crate) fn iq4xs_x8_multi(vnni: bool) -> Option<crate::kernels::x8::DotX8Multi> {
    match avx512::Avx512Vnni::detect().filter(|_| vnni) {
        Some(p) => Some(match iq4_zmm(p) {
            Some(z) => avx512::iq4x8z::iq4xs_x8z_multi_fn(z),
            None => avx512::x8::iq4xs_x8_multi_fn(p),
        }),
        None => avx2::Avx2Fma::detect().map(avx2::iq4xs_x8_multi),
    }
}

/// The 512-bit IQ4_XS 8-row kernels' proof, where the CPU has VBMI and `LAGOON_CPU_X8_ZMM`
/// is not `0`.
fn iq4_zmm(p: avx512::Avx512Vnni) -> Option<avx512::iq4x8z::Vbmi> {
    if std::env::var_os("LAGOON_CPU_X8_ZMM").is_some_and(|v| v == "0") {
        return None;
    }
    avx512::iq4x8z::Vbmi::detect(p)
}

/// Both AVX-512 IQ4_XS 8-row several-token kernels where the CPU runs them, whatever
/// `LAGOON_CPU_X8_ZMM` says (tests).
#[cfg(test)]
pub(crate) fn iq4xs_x8_avx512_multi() -> Vec<(&'static str, crate::kernels::x8::DotX8Multi)> {
    let Some(p) = avx512::Avx512Vnni::detect() else {
        return Vec::new();
    };
    let mut k = vec![("vnni256", avx512::x8::iq4xs_x8_multi_fn(p))];
    k.extend(
        avx512::iq4x8z::Vbmi::detect(p).map(|z| ("vbmi512", avx512::iq4x8z::iq4xs_x8z_multi_fn(z))),
    );
    k
}

/// The repacked 8-row IQ4_XS one-token kernel (as [`q4k_x8_multi`] chooses).
pub(crate) fn iq4xs_x8(vnni: bool) -> Option<crate::kernels::x8::DotX8> {
    match avx512::Avx512Vnni::detect().filter(|_| vnni) {
        Some(p) => Some(match iq4_zmm(p) {
            Some(z) => avx512::iq4x8z::iq4xs_x8z_fn(z),
            None => avx512::x8::iq4xs_x8_fn(p),
        }),
        None => avx2::Avx2Fma::detect().map(avx2::iq4xs_x8),
    }
}

/// The repacked 8-row Q6_K several-token kernel (`kernels::x8_q6k`), as [`iq4xs_x8_multi`]
/// chooses.
pub(crate) fn q6k_x8_multi(vnni: bool) -> Option<crate::kernels::x8::DotX8Multi> {
    match avx512::Avx512Vnni::detect().filter(|_| vnni) {
        Some(p) => Some(avx512::x8::q6k_x8_multi_fn(p)),
        None => avx2::Avx2Fma::detect().map(avx2::q6k_x8_multi),
    }
}

/// The repacked 8-row Q6_K one-token kernel, as [`q4k_x8_multi`] chooses.
pub(crate) fn q6k_x8(vnni: bool) -> Option<crate::kernels::x8::DotX8> {
    match avx512::Avx512Vnni::detect().filter(|_| vnni) {
        Some(p) => Some(avx512::x8::q6k_x8_fn(p)),
        None => avx2::Avx2Fma::detect().map(avx2::q6k_x8),
    }
}
