//! Q5_K × Q8_K for eight repacked rows (`kernels::x8_q5k`'s layout) on 512 bits with
//! AVX512-VNNI: `k4x8z`'s kernel with the fifth bits added to the nibbles.
//!
//! Per super-block the four 64-byte `qh` loads (steps 2kp and 2kp + 1 of the eight rows,
//! interleaved by `iq4x8z::ld_steps` as the codes are) are made once and serve the four
//! chunks; per chunk c and load, one `vptestmb` per half picks the bytes whose bit 2c (low
//! nibbles) or 2c + 1 (high nibbles) is set and a masked byte add puts 16 on them: four
//! operations per 64 code bytes over `k4x8z`'s. The rest is `k4x8z`'s (one body,
//! `k4x8z::tokens_k`): per token two `vpdpbusd` against 8-byte activation broadcasts; the
//! rows' scales by `vpmulld` where Q4_K takes `vpdpwssd` (a lane's sum, 16 products of at most
//! 31·128, does not fit i16); the pairs folded once per super-block, then the mins and the
//! scalar reference's f32 steps (`q4k_finish`): the same bits.

use crate::kernels::act::Q8KAct;
use crate::kernels::x8_q5k::Q5K_X8_BLOCK;

crate::kernels::arch::x86_64::avx2::k4x8::x8_driver!(
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    q5k_x8z,
    q5k_x8z_multi,
    tokens,
    Q5K_X8_BLOCK
);

/// One pass over the group's super-blocks for T tokens (`k4x8z`'s pass with the fifth
/// bits); returns T.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tokens<const T: usize>(p: &[u8], a: [Q8KAct<'_>; T], out: &mut [[f32; 8]; T]) -> usize {
    super::k4x8z::tokens_k::<T, Q5K_X8_BLOCK, true>(p, a, out)
}

fn dot_q5k_x8z(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
    // SAFETY: `q5k_x8z` only needs the features `Avx512Vnni::detect` checks; this is
    // reachable only through `q5k_x8z_fn`, which requires an `Avx512Vnni` token.
    unsafe { q5k_x8z(p, a, cols, out) }
}

fn dot_q5k_x8z_multi(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
    // SAFETY: as for `dot_q5k_x8z` (reachable only through `q5k_x8z_multi_fn`).
    unsafe { q5k_x8z_multi(p, acts, cols, out) }
}

/// The one-token kernel, for a CPU with AVX512-VNNI.
pub(crate) fn q5k_x8z_fn(_proof: super::Avx512Vnni) -> crate::kernels::x8::DotX8 {
    dot_q5k_x8z
}

/// The several-token kernel, for a CPU with AVX512-VNNI.
pub(crate) fn q5k_x8z_multi_fn(_proof: super::Avx512Vnni) -> crate::kernels::x8::DotX8Multi {
    dot_q5k_x8z_multi
}
