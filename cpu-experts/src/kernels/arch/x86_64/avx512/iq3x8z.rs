//! IQ3_XXS × Q8_K for eight repacked rows (`kernels::x8_iq3xxs`'s layout) on 512 bits, for
//! CPUs with AVX512-VNNI, VBMI, BITALG and GFNI (the grid kernels' set less BMI2).
//!
//! Why: the one-row grid kernel (`iq::iq3_xxs_q8k`) spends ~60 vector ops per 98-byte
//! super-block (counted in its source) and ran at 39% of the 16-core host's read floor with
//! 16 threads (~2 GiB/s per thread). Here one register holds one sub-block's 64 grid indices
//! of eight rows, so every lookup, sign mask and scale serves eight rows: ~30 ops per 98 bytes
//! at one token (counted likewise). Measured (BENCHMARKS.md, session 21): 72-77% of the host's
//! read floor, 2x the one-row kernel on the Zen 5 VM.
//!
//! Per sub-block j (the register `x`: row r's eight indices in 64-bit lane r; byte
//! `8r + 4h + i` is point `4h + i`):
//!
//! - **Planes.** Point e's byte p (weight `4e + p`) is looked up for all 64 indices at once,
//!   "plane p". The grid is stored as two 256-byte tables of 6-bit codes, `A[e] = c₀ | c₁ << 3`
//!   and `B[e] = c₂ | c₃ << 3` (`c_p`: the level of byte p among 4, 12, .., 52, 62). Each is
//!   read with two `vpermt2b` (index bits 0-6, 128 points each) blended by index bit 7; then
//!   one `vpermb` per plane maps a code to its magnitude (plus 64, below) through a 64-byte
//!   table indexed by both codes' six bits (`vals[i & 7]` for planes 0 and 2, `vals[i >> 3]`
//!   for 1 and 3): 6 + 4 ops for 256 weights.
//! - **Activations.** Plane p's dword of lane (r, h) holds weights `16h + 4i + p` (i < 4), so
//!   it meets the activation bytes `a[4i' + p]` (i' = 4h + i): each sub-block's 32 bytes are
//!   transposed once per token and super-block (one `vpermb` per 64 bytes), and each plane's
//!   eight bytes are one 64-bit broadcast for all eight rows.
//! - **Signs.** Weight w's sign is bit w of the sub-block's ksigns-expanded 32-bit word: the
//!   7-bit fields of two sub-blocks are cut out with `vpmultishiftqb`, one `gf2p8affineqb`
//!   appends each field's parity (`iq.rs`'s construction), and `vpshufbitqmb` gathers plane
//!   p's 64 sign bits into a mask (the bit index of byte `8r + 4h + i` is `16h + 4i + p`).
//! - **Products.** Magnitudes are held as `g + 64` (unsigned), negated as `128 − (g + 64) =
//!   64 − g` by a masked subtract, and `vpdpbusd` adds four products per dword. Each dword
//!   lane starts at `−64·Σa` over its 16 activations (the Q8_K block sum `bsums[2j + h]`),
//!   so it ends at `Σ ±g·a` exactly; times the sub-block scale `2(w >> 28) + 1` (`vpmulld`)
//!   into the super-block sum.
//!
//! Lane pairs are folded to the eight rows once per super-block (exact i32: each lane is at
//! most 8·31·16·(62 + 64)·128 < 2³¹), then the scalar reference's f32 steps per row, so every
//! output is its bits.

use core::arch::x86_64::*;

use crate::kernels::act::Q8KAct;
use crate::kernels::arch::x86_64::avx2::k4x8 as x8b;
use crate::kernels::arch::x86_64::avx2::{ld128, ld256};
use crate::kernels::x8_iq3xxs::IQ3XXS_X8_BLOCK;

use super::iq::{IQ3XXS_CODES, IQ3XXS_VALS, KSIGNS_AFFINE};
use super::iq4x8z::{bcast8, fold_pairs};
use super::ld512;

// The features every function here enables: `Avx512Vnni`'s set plus VBMI (`vpermb`,
// `vpermt2b`, `vpmultishiftqb`), BITALG (`vpshufbitqmb`) and GFNI (`gf2p8affineqb`).
crate::kernels::arch::x86_64::avx2::k4x8::x8_driver!(
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,gfni",
    iq3xxs_x8z,
    iq3xxs_x8z_multi,
    tokens,
    IQ3XXS_X8_BLOCK
);

/// The grid's 6-bit code pairs: `(c_{2k} | c_{2k+1} << 3)` of every point (k = 0: table A,
/// 1: table B), from `iq.rs`'s 12-bit codes (weight j's level in bits 3j..3j+3).
const fn pair_tab(k: u32) -> [u8; 256] {
    let mut t = [0u8; 256];
    let mut e = 0;
    while e < 256 {
        t[e] = ((IQ3XXS_CODES[e] >> (6 * k)) & 0x3F) as u8;
        e += 1;
    }
    t
}

static TABS: [[u8; 256]; 2] = [pair_tab(0), pair_tab(1)];

/// `vpermb` tables from a code pair to `g + 64`: the low code (`high` false) or the high one.
const fn mag_lut(high: bool) -> [u8; 64] {
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        let c = if high { i >> 3 } else { i & 7 };
        t[i] = IQ3XXS_VALS[c] + 64;
        i += 1;
    }
    t
}

static LUTS: [[u8; 64]; 2] = [mag_lut(false), mag_lut(true)];

/// The activation transpose of two sub-blocks: output byte `32s + 8p + i` is input byte
/// `32s + 4i + p`.
const fn transpose_ctl() -> [u8; 64] {
    let mut t = [0u8; 64];
    let mut o = 0;
    while o < 64 {
        t[o] = (32 * (o / 32) + 4 * (o % 8) + (o % 32) / 8) as u8;
        o += 1;
    }
    t
}

static TRANSPOSE: [u8; 64] = transpose_ctl();

/// `vpshufbitqmb` controls of sub-block s of a pair and plane p (index `4s + p`): byte
/// `k = 8r + 4h + i` takes bit `32s + 16h + 4i + p` of row r's expanded sign words.
const fn sign_ctls() -> [[u8; 64]; 8] {
    let mut t = [[0u8; 64]; 8];
    let mut sp = 0;
    while sp < 8 {
        let (s, p) = (sp / 4, sp % 4);
        let mut k = 0;
        while k < 64 {
            t[sp][k] = (32 * s + 16 * ((k / 4) % 2) + 4 * (k % 4) + p) as u8;
            k += 1;
        }
        sp += 1;
    }
    t
}

static SIGN_CTLS: [[u8; 64]; 8] = sign_ctls();

/// `vpmultishiftqb` control: byte t of each 64-bit lane starts at bit `32(t / 4) + 7(t % 4)`,
/// the 7-bit sign field t % 4 of the lane's low (t < 4) or high sign-and-scale word.
const fn field_ctl() -> [u8; 64] {
    let mut t = [0u8; 64];
    let mut b = 0;
    while b < 64 {
        let u = b % 8;
        t[b] = (32 * (u / 4) + 7 * (u % 4)) as u8;
        b += 1;
    }
    t
}

pub(super) static FIELDS: [u8; 64] = field_ctl();

/// One token's super-block prepared for the rows: its activations transposed by plane, and
/// each dword lane's starting value `−64·bsums[2j + h]` as sub-block j's 64-bit pair.
#[repr(C, align(64))]
struct Prep {
    q: [i8; 256],
    start: [i64; 8],
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
    let bs: &[u8; 32] = a.bsums.as_flattened()[32 * b..][..32].try_into().unwrap();
    let bs = _mm512_cvtepi16_epi32(ld256(bs));
    let start = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<6>(bs));
    // SAFETY: `prep.start` is 64 writable bytes; `storeu` accepts any alignment.
    unsafe { _mm512_storeu_si512(prep.start.as_mut_ptr().cast(), start) };
}

/// One pass over the group's super-blocks for T tokens; returns T.
#[inline]
#[target_feature(
    enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,gfni"
)]
fn tokens<const T: usize>(p: &[u8], a: [Q8KAct<'_>; T], out: &mut [[f32; 8]; T]) -> usize {
    let tabs: [[__m512i; 4]; 2] =
        core::array::from_fn(|k| core::array::from_fn(|m| ld512(&TABS[k].as_chunks::<64>().0[m])));
    let luts = [ld512(&LUTS[0]), ld512(&LUTS[1])];
    let tr = ld512(&TRANSPOSE);
    let fields = ld512(&FIELDS);
    let ksigns = _mm512_set1_epi64(KSIGNS_AFFINE);
    let c128 = _mm512_set1_epi8(-128);
    let one = _mm512_set1_epi32(1);
    let mut prep: [Prep; T] = core::array::from_fn(|_| Prep {
        q: [0; 256],
        start: [0; 8],
    });
    let mut acc = [_mm256_setzero_ps(); T];
    let pd = x8b::prefetch_ahead();
    for (b, o) in p.as_chunks::<IQ3XXS_X8_BLOCK>().0.iter().enumerate() {
        x8b::prefetch(o, pd);
        for (pr, at) in prep.iter_mut().zip(&a) {
            prepare(at, b, tr, pr);
        }
        let mut sumi = [_mm512_setzero_si512(); T];
        for q in 0..4 {
            let aux = ld512(x8b::arr::<64>(o, 528 + 64 * q));
            let signs = _mm512_gf2p8affine_epi64_epi8::<0>(
                _mm512_multishift_epi64_epi8(fields, aux),
                ksigns,
            );
            let ls = _mm512_or_si512(_mm512_srli_epi32::<27>(aux), one);
            for s in 0..2 {
                let j = 2 * q + s;
                let x = ld512(x8b::arr::<64>(o, 16 + 64 * j));
                let hi = _mm512_movepi8_mask(x);
                let codes = tabs.map(|t| {
                    _mm512_mask_blend_epi8(
                        hi,
                        _mm512_permutex2var_epi8(t[0], x, t[1]),
                        _mm512_permutex2var_epi8(t[2], x, t[3]),
                    )
                });
                let u: [__m512i; 4] = core::array::from_fn(|pl| {
                    let g = _mm512_permutexvar_epi8(codes[pl / 2], luts[pl % 2]);
                    let neg = _mm512_bitshuffle_epi64_mask(signs, ld512(&SIGN_CTLS[4 * s + pl]));
                    _mm512_mask_sub_epi8(g, neg, c128, g)
                });
                let ls_j = if s == 0 {
                    _mm512_shuffle_epi32::<0b10_10_00_00>(ls)
                } else {
                    _mm512_shuffle_epi32::<0b11_11_01_01>(ls)
                };
                for t in 0..T {
                    let mut sj = _mm512_set1_epi64(prep[t].start[j]);
                    for (pl, &up) in u.iter().enumerate() {
                        sj = _mm512_dpbusd_epi32(sj, up, bcast8(&prep[t].q[32 * j + 8 * pl..]));
                    }
                    sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(sj, ls_j));
                }
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
    let quarter = _mm256_set1_ps(0.25);
    x8b::store_rows(out, acc.map(|v| _mm256_mul_ps(quarter, v)));
    T
}

/// Proof that the CPU runs these kernels: `Avx512Vnni` and AVX512-VBMI, AVX512-BITALG and
/// GFNI detected.
#[derive(Clone, Copy)]
pub(crate) struct Grid(());

impl Grid {
    pub(crate) fn detect(_proof: super::Avx512Vnni) -> Option<Self> {
        (is_x86_feature_detected!("avx512vbmi")
            && is_x86_feature_detected!("avx512bitalg")
            && is_x86_feature_detected!("gfni"))
        .then_some(Grid(()))
    }
}

fn dot_iq3xxs_x8z(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
    // SAFETY: `iq3xxs_x8z` needs `Avx512Vnni`'s features, VBMI, BITALG and GFNI; this is
    // reachable only through `iq3xxs_x8z_fn`, which takes a `Grid` token (built only after
    // all were detected).
    unsafe { iq3xxs_x8z(p, a, cols, out) }
}

fn dot_iq3xxs_x8z_multi(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
    // SAFETY: as for `dot_iq3xxs_x8z` (reachable only through `iq3xxs_x8z_multi_fn`).
    unsafe { iq3xxs_x8z_multi(p, acts, cols, out) }
}

/// The one-token kernel.
pub(crate) fn iq3xxs_x8z_fn(_proof: Grid) -> crate::kernels::x8::DotX8 {
    dot_iq3xxs_x8z
}

/// The several-token kernel.
pub(crate) fn iq3xxs_x8z_multi_fn(_proof: Grid) -> crate::kernels::x8::DotX8Multi {
    dot_iq3xxs_x8z_multi
}

#[cfg(test)]
mod tests {
    use lagoon_core::quant::tables::IQ3XXS_GRID;

    /// The code-pair tables and magnitude tables give back every grid byte.
    #[test]
    fn plane_tables_reproduce_the_grid() {
        for (e, &g) in IQ3XXS_GRID.iter().enumerate() {
            for p in 0..4 {
                let code = super::TABS[p / 2][e];
                let mag = super::LUTS[p % 2][usize::from(code)] - 64;
                assert_eq!(mag, (g >> (8 * p)) as u8, "point {e} byte {p}");
            }
        }
    }
}
