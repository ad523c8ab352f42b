//! IQ4_XS × Q8_K for eight repacked rows (`kernels::x8_iq4xs`'s layout, unchanged) on 512
//! bits, for CPUs with AVX512-VBMI as well as VNNI.
//!
//! Why: the 256-bit VNNI form (`avx2::iq4x8`'s body) spends seven vector ALU ops per 32 code
//! bytes (a nibble mask, a shift, a second mask, two `vpshufb` lookups, two `vpdpbusd`) and
//! came out at 48 GiB/s on the 16-core host with 16 threads, slower than the one-row 512-bit
//! kernel (56 GiB/s; BENCHMARKS.md, session 18). Here one 64-byte load covers two steps
//! (k, k + 1) of a sub-block and costs one `vpermd`, one shift, two `vpermb` lookups and two
//! `vpdpbusd` per token: three ALU ops per 32 bytes.
//!
//! - `vpermb` looks a byte up in a 64-byte table by its low six bits, so with the codebook
//!   repeated four times neither the low nibble (bits 4-5 are the high nibble's) nor the
//!   high one after a 16-bit shift (bits 4-5 are the next byte's) needs a mask.
//! - The load holds row r's four code bytes of step k in dword r and of step k + 1 in dword
//!   8 + r. `vpermd` interleaves them (dword 2r, 2r + 1), so that one 8-byte broadcast of
//!   the activation (its four bytes of step k, then of k + 1, adjacent in Q8_K order) meets
//!   both steps; no activation shuffle per token.
//! - Each sub-block's two lanes per row are multiplied by the row's scale (duplicated into
//!   both) and summed over the super-block; the pairs are added (exact i32: the lanes hold
//!   at most 8·|ls|·16·241·128 < 2³¹ in magnitude) and narrowed to the eight rows' lanes
//!   once per super-block. The codebook is shifted to unsigned (`v + 128`) for `vpdpbusd`
//!   and `128·Σ_j ls_j·Σa_j` taken off per super-block, as the 256-bit VNNI form does.
//!
//! The per-row integer `Σ_j ls_j·Σ v·a` is exact and the f32 steps are the scalar
//! reference's per row, so every output is its bits.

use core::arch::x86_64::*;

use crate::kernels::act::Q8KAct;
use crate::kernels::arch::x86_64::avx2::iq4x8::{iq4_finish, iq4nl_lut256};
use crate::kernels::arch::x86_64::avx2::k4x8 as x8b;
use crate::kernels::x8_iq4xs::IQ4XS_X8_BLOCK;

use super::ld512;

// The features every function here enables: `Avx512Vnni`'s set plus VBMI (`vpermb`).
crate::kernels::arch::x86_64::avx2::k4x8::x8_driver!(
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi",
    iq4xs_x8z,
    iq4xs_x8z_multi,
    tokens,
    IQ4XS_X8_BLOCK
);

/// Eight activation bytes (`b[0..8]`) broadcast to every 64-bit lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn bcast8(b: &[i8]) -> __m512i {
    let b: &[i8; 8] = b[..8].try_into().unwrap();
    // SAFETY: `b` is 8 readable bytes; `read_unaligned` accepts any alignment.
    _mm512_set1_epi64(unsafe { core::ptr::read_unaligned(b.as_ptr().cast::<i64>()) })
}

/// A 64-byte load of two steps (row r's step-k dword at r, step k + 1's at 8 + r) with the
/// steps interleaved: row r's dwords to lanes 2r and 2r + 1.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn ld_steps(v: &[u8], o: usize) -> __m512i {
    let inter = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    _mm512_permutexvar_epi32(inter, ld512(x8b::arr::<64>(v, o)))
}

/// Lane pairs (2r, 2r + 1) added, to row r's i32 lane (exact while the sums fit).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn fold_pairs(s: __m512i) -> __m256i {
    _mm512_cvtepi64_epi32(_mm512_add_epi32(s, _mm512_srli_epi64::<32>(s)))
}

/// One pass over the group's super-blocks for T tokens; returns T.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn tokens<const T: usize>(p: &[u8], a: [Q8KAct<'_>; T], out: &mut [[f32; 8]; T]) -> usize {
    // The unsigned codebook in all four 128-bit lanes (vpermb reads index bits 0-5).
    let lut = _mm512_broadcast_i32x4(_mm256_castsi256_si128(iq4nl_lut256(-128)));
    let mut acc = [_mm256_setzero_ps(); T];
    let pd = x8b::prefetch_ahead();
    for (b, o) in p.as_chunks::<IQ4XS_X8_BLOCK>().0.iter().enumerate() {
        x8b::prefetch(o, pd);
        let mut qa: [&[i8]; T] = [&[]; T];
        for (q, at) in qa.iter_mut().zip(&a) {
            *q = &at.qs[256 * b..][..256];
        }
        let mut sumi = [_mm512_setzero_si512(); T];
        for j in 0..8 {
            // The rows' scales, each in both lanes of its pair.
            let s8 = x8b::lo8(o, 16 + 8 * j);
            let s32 = _mm512_cvtepi8_epi32(_mm_unpacklo_epi8(s8, s8));
            let mut sj = [_mm512_setzero_si512(); T];
            for kp in 0..2 {
                let w = ld_steps(o, 80 + 128 * j + 64 * kp);
                let vl = _mm512_permutexvar_epi8(w, lut);
                let vh = _mm512_permutexvar_epi8(_mm512_srli_epi16::<4>(w), lut);
                for t in 0..T {
                    let al = bcast8(&qa[t][32 * j + 8 * kp..]);
                    let ah = bcast8(&qa[t][32 * j + 16 + 8 * kp..]);
                    sj[t] = _mm512_dpbusd_epi32(sj[t], vl, al);
                    sj[t] = _mm512_dpbusd_epi32(sj[t], vh, ah);
                }
            }
            for t in 0..T {
                sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(sj[t], s32));
            }
        }
        // The lane pairs folded to the rows, then the 256-bit forms' end (with the
        // codebook's shift taken off).
        let mut rows = [_mm256_setzero_si256(); T];
        for (r, s) in rows.iter_mut().zip(sumi) {
            *r = fold_pairs(s);
        }
        iq4_finish(o, &a, b, rows, true, &mut acc);
    }
    x8b::store_rows(out, acc);
    T
}

/// Proof that the CPU runs these kernels: `Avx512Vnni` and AVX512-VBMI detected.
#[derive(Clone, Copy)]
pub(crate) struct Vbmi(());

impl Vbmi {
    pub(crate) fn detect(_proof: super::Avx512Vnni) -> Option<Self> {
        is_x86_feature_detected!("avx512vbmi").then_some(Vbmi(()))
    }
}

fn dot_iq4xs_x8z(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
    // SAFETY: `iq4xs_x8z` needs `Avx512Vnni`'s features and VBMI; this is reachable only
    // through `iq4xs_x8z_fn`, which takes a `Vbmi` token (built only after both were
    // detected).
    unsafe { iq4xs_x8z(p, a, cols, out) }
}

fn dot_iq4xs_x8z_multi(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
    // SAFETY: as for `dot_iq4xs_x8z` (reachable only through `iq4xs_x8z_multi_fn`).
    unsafe { iq4xs_x8z_multi(p, acts, cols, out) }
}

/// The one-token kernel, for a CPU with AVX512-VNNI and VBMI.
pub(crate) fn iq4xs_x8z_fn(_proof: Vbmi) -> crate::kernels::x8::DotX8 {
    dot_iq4xs_x8z
}

/// The several-token kernel, for a CPU with AVX512-VNNI and VBMI.
pub(crate) fn iq4xs_x8z_multi_fn(_proof: Vbmi) -> crate::kernels::x8::DotX8Multi {
    dot_iq4xs_x8z_multi
}
