//! IQ2_XXS × Q8_K for eight repacked rows (`kernels::x8_iq2xxs`'s layout) on 512 bits, for
//! CPUs with AVX512-VNNI, VBMI, BITALG and GFNI: `iq3x8z`'s construction for the 2-bit grid of
//! 8-byte points.
//!
//! Per pair of sub-blocks q (the register `x`: row r's four indices of sub-block `2q + s` in
//! bytes `8r + 4s ..`; byte `8r + 4s + l` is point l, weights `32(2q + s) + 8l ..+ 8`):
//!
//! - **Codes.** Each point's 16-bit code (weight p's 2-bit level in bits `2p..2p + 2`,
//!   `iq.rs`'s `IQ2XXS_CODES`) is read as two 256-byte tables, its low byte (weights 0-3)
//!   and its high byte (4-7), each with two `vpermt2b` (index bits 0-6) blended by index
//!   bit 7.
//! - **Planes.** Plane p (weight p of every point) is its code byte shifted right by
//!   `2(p % 4)` (a 16-bit shift: the bits shifted in from the next byte land above bit 1),
//!   then one `gf2p8affineqb` maps the two low bits to the magnitude plus 64 (`iq.rs`'s IQ2
//!   affine map, its constant with bit 6 set: every magnitude is below 64, so XOR is +64).
//! - **Signs.** The 7-bit fields of the sign-and-scale words are cut out and their parity
//!   appended as in `iq3x8z` (`vpmultishiftqb`, `gf2p8affineqb`), which puts point (r, s, l)'s
//!   eight sign bits in byte `8r + 4s + l`, the same byte as its index; plane p's negation
//!   mask is bit p of each (`vptestmb`), applied as `128 − (g + 64) = 64 − g`.
//! - **Products.** Dword lane (r, s) of plane p meets activation bytes `32(2q + s) + 8l + p`
//!   (l < 4): each token's super-block is transposed once (one `vpermb` per 64 bytes) so that
//!   a plane's eight bytes of both sub-blocks are one 64-bit broadcast. Eight `vpdpbusd` (one
//!   a plane) sum the lane's 32 products: lane (r, s) is row r's sub-block `2q + s`, started
//!   at `−64·Σa` of that sub-block (two Q8_K block sums), so it ends at `Σ ±g·a` exactly;
//!   one `vpmulld` by the lanes' scales `2(w >> 28) + 1` serves both sub-blocks.
//!
//! Lane pairs are folded to the eight rows once per super-block (exact i32: a lane holds at
//! most 4·31·32·43·128 < 2³¹ in magnitude), then the scalar reference's f32 steps per row, so
//! every output is its bits. Counted in the source (not measured): about 33 one-per-cycle
//! operations (permutes, `gf2p8affineqb`, mask tests, `vpdpbusd`, `vpmulld`) a pair at one
//! token, 24 of them shared by a pass's tokens.

use core::arch::x86_64::*;

use crate::kernels::act::Q8KAct;
use crate::kernels::arch::x86_64::avx2::k4x8 as x8b;
use crate::kernels::arch::x86_64::avx2::{ld128, ld256};
use crate::kernels::x8_iq2xxs::IQ2XXS_X8_BLOCK;

use super::iq::{IQ2_AFFINE, IQ2_AFFINE_CONST, IQ2XXS_CODES, KSIGNS_AFFINE};
use super::iq3x8z::FIELDS;
use super::iq4x8z::{bcast8, fold_pairs};
use super::ld512;

// The features every function here enables: `Avx512Vnni`'s set plus VBMI (`vpermb`,
// `vpermt2b`, `vpmultishiftqb`), BITALG (the `Grid` proof's set) and GFNI (`gf2p8affineqb`).
crate::kernels::arch::x86_64::avx2::k4x8::x8_driver!(
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,gfni",
    iq2xxs_x8z,
    iq2xxs_x8z_multi,
    tokens,
    IQ2XXS_X8_BLOCK
);

/// The grid's code bytes: the low (k = 0, weights 0-3) or high (k = 1, weights 4-7) byte of
/// every point's 16-bit code.
const fn code_tab(k: u32) -> [u8; 256] {
    let mut t = [0u8; 256];
    let mut e = 0;
    while e < 256 {
        t[e] = (IQ2XXS_CODES[e] >> (8 * k)) as u8;
        e += 1;
    }
    t
}

static TABS: [[u8; 256]; 2] = [code_tab(0), code_tab(1)];

/// The activation transpose of one pair of sub-blocks: output byte `8p + 4s + l` is input
/// byte `32s + 8l + p`.
const fn transpose_ctl() -> [u8; 64] {
    let mut t = [0u8; 64];
    let mut o = 0;
    while o < 64 {
        let (p, s, l) = (o / 8, (o % 8) / 4, o % 4);
        t[o] = (32 * s + 8 * l + p) as u8;
        o += 1;
    }
    t
}

static TRANSPOSE: [u8; 64] = transpose_ctl();

/// One token's super-block prepared for the rows: its activations transposed by plane, and
/// each sub-block's starting value `−64·Σa` (sub-blocks 2q and 2q + 1 as pair q's 64 bits).
#[repr(C, align(64))]
struct Prep {
    q: [i8; 256],
    start: [i64; 4],
}

/// [`Prep`] of token `a`'s super-block `b`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")]
fn prepare(a: &Q8KAct<'_>, b: usize, tr: __m512i, prep: &mut Prep) {
    let qa = a.qs[256 * b..][..256].as_chunks::<64>().0;
    for (c, d) in qa.iter().zip(prep.q.as_chunks_mut::<64>().0) {
        let v = _mm512_permutexvar_epi8(tr, ld512(c));
        // SAFETY: `d` is 64 writable bytes; `storeu` accepts any alignment.
        unsafe { _mm512_storeu_si512(d.as_mut_ptr().cast(), v) };
    }
    // The 16 block sums (16 elements each), added in pairs to the 8 sub-blocks' sums.
    let bs: &[u8; 32] = a.bsums.as_flattened()[32 * b..][..32].try_into().unwrap();
    let bs = _mm512_cvtepi16_epi32(ld256(bs));
    let sub = _mm512_cvtepi64_epi32(_mm512_add_epi32(bs, _mm512_srli_epi64::<32>(bs)));
    let start = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<6>(sub));
    // SAFETY: `prep.start` is 32 writable bytes; `storeu` accepts any alignment.
    unsafe { _mm256_storeu_si256(prep.start.as_mut_ptr().cast(), start) };
}

/// Plane p's magnitudes plus 64 from its code bytes `c` (`c` shifted right by `2(p % 4)`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni")]
fn plane(c: __m512i, p: usize, aff: __m512i) -> __m512i {
    let c = match p % 4 {
        0 => c,
        1 => _mm512_srli_epi16::<2>(c),
        2 => _mm512_srli_epi16::<4>(c),
        _ => _mm512_srli_epi16::<6>(c),
    };
    _mm512_gf2p8affine_epi64_epi8::<{ IQ2_AFFINE_CONST ^ 64 }>(c, aff)
}

/// One pass over the group's super-blocks for T tokens; returns T.
#[inline]
#[target_feature(
    enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,gfni"
)]
fn tokens<const T: usize>(p: &[u8], a: [Q8KAct<'_>; T], out: &mut [[f32; 8]; T]) -> usize {
    let tabs: [[__m512i; 4]; 2] =
        core::array::from_fn(|k| core::array::from_fn(|m| ld512(&TABS[k].as_chunks::<64>().0[m])));
    let tr = ld512(&TRANSPOSE);
    let fields = ld512(&FIELDS);
    let ksigns = _mm512_set1_epi64(KSIGNS_AFFINE);
    let aff = _mm512_set1_epi64(IQ2_AFFINE);
    let c128 = _mm512_set1_epi8(-128);
    let one = _mm512_set1_epi32(1);
    let mut prep: [Prep; T] = core::array::from_fn(|_| Prep {
        q: [0; 256],
        start: [0; 4],
    });
    let mut acc = [_mm256_setzero_ps(); T];
    let pd = x8b::prefetch_ahead();
    for (b, o) in p.as_chunks::<IQ2XXS_X8_BLOCK>().0.iter().enumerate() {
        x8b::prefetch(o, pd);
        for (pr, at) in prep.iter_mut().zip(&a) {
            prepare(at, b, tr, pr);
        }
        let mut sumi = [_mm512_setzero_si512(); T];
        for q in 0..4 {
            let x = ld512(x8b::arr::<64>(o, 16 + 64 * q));
            let aux = ld512(x8b::arr::<64>(o, 272 + 64 * q));
            let signs = _mm512_gf2p8affine_epi64_epi8::<0>(
                _mm512_multishift_epi64_epi8(fields, aux),
                ksigns,
            );
            let ls = _mm512_or_si512(_mm512_srli_epi32::<27>(aux), one);
            let hi = _mm512_movepi8_mask(x);
            let codes = tabs.map(|t| {
                _mm512_mask_blend_epi8(
                    hi,
                    _mm512_permutex2var_epi8(t[0], x, t[1]),
                    _mm512_permutex2var_epi8(t[2], x, t[3]),
                )
            });
            let u: [__m512i; 8] = core::array::from_fn(|pl| {
                let g = plane(codes[pl / 4], pl, aff);
                let neg = _mm512_test_epi8_mask(signs, _mm512_set1_epi8(1 << pl));
                _mm512_mask_sub_epi8(g, neg, c128, g)
            });
            for t in 0..T {
                let mut sj = _mm512_set1_epi64(prep[t].start[q]);
                for (pl, &up) in u.iter().enumerate() {
                    sj = _mm512_dpbusd_epi32(sj, up, bcast8(&prep[t].q[64 * q + 8 * pl..]));
                }
                sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(sj, ls));
            }
        }
        // The scalar reference's f32 step per row: acc += (d·d_a)·sumi.
        let d = _mm256_cvtph_ps(ld128(x8b::arr::<16>(o, 0)));
        for t in 0..T {
            let da = _mm256_set1_ps(a[t].d(b));
            let rows = _mm256_cvtepi32_ps(fold_pairs(sumi[t]));
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_mul_ps(d, da), rows));
        }
    }
    let eighth = _mm256_set1_ps(0.125);
    x8b::store_rows(out, acc.map(|v| _mm256_mul_ps(eighth, v)));
    T
}

fn dot_iq2xxs_x8z(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
    // SAFETY: `iq2xxs_x8z` needs `Avx512Vnni`'s features, VBMI, BITALG and GFNI; this is
    // reachable only through `iq2xxs_x8z_fn`, which takes a `Grid` token (built only after
    // all were detected).
    unsafe { iq2xxs_x8z(p, a, cols, out) }
}

fn dot_iq2xxs_x8z_multi(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
    // SAFETY: as for `dot_iq2xxs_x8z` (reachable only through `iq2xxs_x8z_multi_fn`).
    unsafe { iq2xxs_x8z_multi(p, acts, cols, out) }
}

/// The one-token kernel.
pub(crate) fn iq2xxs_x8z_fn(_proof: super::iq3x8z::Grid) -> crate::kernels::x8::DotX8 {
    dot_iq2xxs_x8z
}

/// The several-token kernel.
pub(crate) fn iq2xxs_x8z_multi_fn(_proof: super::iq3x8z::Grid) -> crate::kernels::x8::DotX8Multi {
    dot_iq2xxs_x8z_multi
}

#[cfg(test)]
mod tests {
    use lagoon_core::quant::tables::IQ2XXS_GRID;

    /// The code tables and the affine map give back every grid byte (plus 64).
    #[test]
    fn code_tables_reproduce_the_grid() {
        for (e, &g) in IQ2XXS_GRID.iter().enumerate() {
            for p in 0..8 {
                let code = super::TABS[p / 4][e] >> (2 * (p % 4));
                let c = u32::from(code & 3);
                // 8 ⊕ 17·c₀ ⊕ 35·c₁ (iq.rs's IQ2 map), then bit 6.
                let mag = (8 ^ (17 * (c & 1)) ^ (35 * (c >> 1))) ^ 64;
                assert_eq!(
                    mag,
                    u32::from((g >> (8 * p)) as u8) + 64,
                    "point {e} byte {p}"
                );
            }
        }
    }
}
