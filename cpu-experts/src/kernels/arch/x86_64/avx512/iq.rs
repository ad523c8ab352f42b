//! IQ4_XS × Q8_K on 512 bits, and the grid IQ types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
//! IQ3_S) × Q8_K with VBMI, BITALG and GFNI (see the "Grid types" comment below).
//!
//! IQ4_XS:
//! Scalar, per super-block: `sumf += (d·d_a)·Σ_ib (ls_ib − 32)·Σ_{l<32} kv[nib]·q_a`.
//!
//! Sub-blocks 2k and 2k+1 are 32 bytes of `qs` (16 each: low nibbles elements 0..16, high
//! 16..32) and 64 contiguous activation bytes. The 32 bytes are spread to 128-bit lanes
//! [q₂ₖ, q₂ₖ, q₂ₖ₊₁, q₂ₖ₊₁], shifted right by 0/4/0/4 and masked, then `vpshufb` maps the
//! nibbles through the codebook: 64 signed values in element order. Sign trick (|v| and a
//! byte-mask negation of q_a), `maddubs` (pair sums ≤ 2·127·127), `vpdpwssd` with the two
//! sub-block scales.

use core::arch::x86_64::*;

use lagoon_core::quant::tables::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};

use super::super::avx2::iq::{iq4nl_lut, iq4xs_scales};
use super::super::avx2::{at, f16_at, hsum_ps, ld256};
use super::{fold256, ld512, pick2, rows_ok, wrap_n};
use crate::kernels::Table;
use crate::kernels::act::Q8KAct;
use crate::kernels::scalar::blocks;

// IQ4_XS × Q8_K for 2-4 tokens. The table's one-row kernel is `vnni256::vec_dot_iq4_xs_q8k`
// (the same lanes and f32 steps on 256 bits, faster at one token).
wrap_n!(multi vec_dot_iq4_xs_q8k_multi => 8; iq4_xs_n);

/// See the module comment. Every token's f32 operations are those of N = 1.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn iq4_xs_n<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
    let (Some(wb), Some(a)) = (
        blocks::<136>(w, n / 256),
        rows_ok(acts, |a| Q8KAct::new(a, n)),
    ) else {
        return core::array::from_fn(|t| {
            if N == 1 {
                f32::NAN
            } else {
                iq4_xs_n(w, [acts[t]], n)[0]
            }
        });
    };
    let qa = a.map(|a| a.qs.as_chunks::<256>().0);
    let lut = _mm512_broadcast_i32x4(iq4nl_lut());
    let m4 = _mm512_set1_epi8(0x0F);
    let four = 0x0004_0004_0004_0004i64;
    let shift = _mm512_set_epi64(four, four, 0, 0, four, four, 0, 0);
    let zero = _mm512_setzero_si512();
    let pick: [__m512i; 4] = core::array::from_fn(|k| pick2(2 * k as i16, 2 * k as i16 + 1));
    let mut acc = [_mm256_setzero_ps(); N];
    for (b, blk) in wb.iter().enumerate() {
        let sc = iq4xs_scales(at::<u8, 2, 6, 136>(blk));
        let sc16 = _mm512_castsi128_si512(_mm_setr_epi16(
            sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6], sc[7],
        ));
        let qs = at::<u8, 8, 128, 136>(blk).as_chunks::<32>().0;
        let mut sumi = [_mm512_setzero_si512(); N];
        for k in 0..4 {
            let x = _mm512_castsi256_si512(ld256(&qs[k]));
            let x = _mm512_shuffle_i64x2::<0b01_01_00_00>(x, x);
            let v = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srlv_epi16(x, shift), m4));
            let av = _mm512_abs_epi8(v);
            let neg = _mm512_movepi8_mask(v);
            let s = _mm512_permutexvar_epi16(pick[k], sc16);
            for t in 0..N {
                let y = ld512(&qa[t][b].as_chunks::<64>().0[k]);
                let sy = _mm512_mask_sub_epi8(y, neg, zero, y);
                sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(av, sy), s);
            }
        }
        let dw = f16_at::<0, 136>(blk);
        for t in 0..N {
            let d = _mm256_set1_ps(dw * a[t].d(b));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(fold256(sumi[t])), acc[t]);
        }
    }
    core::array::from_fn(|t| hsum_ps(acc[t]))
}

// ---------------------------------------------------------------------------------------
// Grid types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S): the codebook as byte tables read with
// `vpermt2b` (AVX-512 VBMI), signs with BITALG, magnitudes with GFNI.
//
// ggml's AVX2/AVX-512 kernels (`ggml-cpu/arch/x86/quants.c`) and ik_llama.cpp's
// `iqk_mul_mat.cpp` fetch every 8- or 4-byte grid point with a scalar load and insert it
// into a vector (ik_llama.cpp's gain is in reusing the unpacked block over many activation
// columns, which a one-token GEMV cannot do); on this machine that assembly was the
// bottleneck (~1.2-1.8 GiB/s per thread). Here, restated in our own construction:
//
// * Each grid point is re-encoded as a 16-bit code (2 bits per IQ2 weight: 8, 25, 43;
//   3 bits per IQ3 weight), stored as byte tables of 128 points' low bytes and 128 points'
//   high bytes ([`split`]). 32 indices sit in the word lanes of one register, their low
//   byte in both bytes of the lane (their order chosen so that the outputs below come out
//   in element order); per 128 points one `vpermt2b` (1 uop, 7-bit index) reads the low
//   bytes and one the high bytes of all 32 codes; results are blended by index bit 7, 8,
//   ... and finally by byte parity (2 + 2 lookups for 256 points, 8 + 8 for IQ2_S's 1024).
// * `vpmultishiftqb` moves each weight's code into its own byte; `gf2p8affineqb` maps it to
//   the magnitude where the magnitudes are an affine function of the code bits over GF(2)
//   (IQ2: 8 ⊕ 17c₀ ⊕ 35c₁; IQ3_S: 1 ⊕ 2c), `vpermb` over a repeating 64-byte table where
//   not (IQ3_XXS); the neighbouring codes left in the byte's high bits need no mask.
// * Signs: the 7-bit `ksigns` fields are cut out with `vpmultishiftqb` and one
//   `gf2p8affineqb` appends the parity bit, which is ggml's `ksigns_iq2xs` without the
//   table; `vpshufbitqmb` turns the sign bytes into the 64-bit negation mask of each 64
//   activations (IQ2_S and IQ3_S store the mask itself), applied with a masked subtract.
// * `maddubs` (pair sums ≤ 2·62·127) and `vpdpwssd` with the sub-block scales, as for
//   IQ4_XS. The block's i32 sum is reduced exactly and combined in the scalar oracle's f32
//   order, so results equal scalar bit for bit (a unit test below checks that).
// * Several tokens (prefill): [`grid_loop!`] decodes each block once for up to four tokens
//   (the table's `*_multi` entries), as ik_llama.cpp reuses its unpacked blocks; only the
//   masked subtract, `maddubs`, `vpdpwssd` and the reduction are per token. Zen 4 VM, one
//   thread, 64 tokens of 1024 × 3072 in cache (`prefill_*_64tok`): IQ2_XXS 68.6, IQ2_S 57.3,
//   IQ3_XXS 66.3 GFLOP/s (BENCHMARKS.md, session 42).
//
// Tried and not kept (in-cache microbenchmark, ns per super-block, this VM): the lookup on
// 64-point byte tables (`vpermt2b` on index `i & 63 | 64·odd`): 3-6 % slower; on 16-bit
// tables with `vpermi2w` (3 uops each): no faster than that, within noise; reducing two
// blocks' lanes together: −3…+8 %; `vpermb` instead of `gf2p8affineqb` for the IQ2 magnitudes (within noise); IQ1_S this way (codes
// c = g + 1 unsigned, no signs, `Σ ls·Q` from `bsums` subtracted): bit-identical but
// 40 ns per super-block against the AVX2 kernel's 26 ns, its 2048-point grid needing 32
// tables per lookup, so IQ1_S / IQ1_M keep the AVX2 kernels.

/// The IQ2 grid magnitudes, in code order.
const IQ2_VALS: [u8; 3] = [8, 25, 43];
/// The IQ3_XXS grid magnitudes, in code order.
pub(super) const IQ3XXS_VALS: [u8; 8] = [4, 12, 20, 28, 36, 44, 52, 62];
/// The IQ3_S grid magnitudes, in code order (`2c + 1`).
const IQ3S_VALS: [u8; 8] = [1, 3, 5, 7, 9, 11, 13, 15];

/// Position of `v` in `vals` (compile-time panic if absent).
const fn level(vals: &[u8], v: u8) -> u16 {
    let mut i = 0;
    while i < vals.len() {
        if vals[i] == v {
            return i as u16;
        }
        i += 1;
    }
    panic!("grid byte outside the codebook's magnitudes")
}

/// 16-bit codes of an 8-byte-point grid: weight j's level in bits 2j..2j+2.
const fn codes8<const N: usize>(grid: &[u64; N], vals: &[u8]) -> [u16; N] {
    let mut t = [0u16; N];
    let mut e = 0;
    while e < N {
        let mut j = 0;
        while j < 8 {
            t[e] |= level(vals, (grid[e] >> (8 * j)) as u8) << (2 * j);
            j += 1;
        }
        e += 1;
    }
    t
}

/// 16-bit codes of a 4-byte-point grid: weight j's level in bits 3j..3j+3.
const fn codes4<const N: usize>(grid: &[u32; N], vals: &[u8]) -> [u16; N] {
    let mut t = [0u16; N];
    let mut e = 0;
    while e < N {
        let mut j = 0;
        while j < 4 {
            t[e] |= level(vals, (grid[e] >> (8 * j)) as u8) << (3 * j);
            j += 1;
        }
        e += 1;
    }
    t
}

/// `vpermb` table: entry i is `vals[i % 8]` (64 bytes; the high bits of i are neighbouring
/// codes).
const fn code_lut(vals: &[u8; 8]) -> [u8; 64] {
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        t[i] = vals[i % 8];
        i += 1;
    }
    t
}

/// `vpermt2b` tables of 16-bit codes: per 128 points, their low bytes (128 bytes) then
/// their high bytes (`B = 2N`).
const fn split<const N: usize, const B: usize>(c: &[u16; N]) -> [u8; B] {
    assert!(B == 2 * N && N.is_multiple_of(128));
    let mut t = [0u8; B];
    let mut e = 0;
    while e < N {
        t[256 * (e / 128) + e % 128] = c[e] as u8;
        t[256 * (e / 128) + 128 + e % 128] = (c[e] >> 8) as u8;
        e += 1;
    }
    t
}

pub(super) static IQ2XXS_CODES: [u16; 256] = codes8(&IQ2XXS_GRID, &IQ2_VALS);
static IQ2XS_CODES: [u16; 512] = codes8(&IQ2XS_GRID, &IQ2_VALS);
static IQ2S_CODES: [u16; 1024] = codes8(&IQ2S_GRID, &IQ2_VALS);
pub(super) static IQ3XXS_CODES: [u16; 256] = codes4(&IQ3XXS_GRID, &IQ3XXS_VALS);
static IQ3S_CODES: [u16; 512] = codes4(&IQ3S_GRID, &IQ3S_VALS);
static IQ2XXS_TAB: [u8; 512] = split(&IQ2XXS_CODES);
static IQ2XS_TAB: [u8; 1024] = split(&IQ2XS_CODES);
static IQ2S_TAB: [u8; 2048] = split(&IQ2S_CODES);
static IQ3XXS_TAB: [u8; 512] = split(&IQ3XXS_CODES);
static IQ3S_TAB: [u8; 1024] = split(&IQ3S_CODES);
static IQ3XXS_LUT: [u8; 64] = code_lut(&IQ3XXS_VALS);

/// `gf2p8affineqb` matrix whose output is `⊕_k col[k]·(input bit k)` (before the constant):
/// row i (output bit i) is byte 7 − i of the matrix.
const fn affine_matrix(col: [u8; 8]) -> i64 {
    let mut m = 0u64;
    let mut i = 0;
    while i < 8 {
        let mut row = 0u64;
        let mut k = 0;
        while k < 8 {
            row |= (((col[k] >> i) & 1) as u64) << k;
            k += 1;
        }
        m |= row << (8 * (7 - i));
        i += 1;
    }
    m as i64
}

/// `ksigns_iq2xs[x & 127]`: output bits 0-6 copy input bits 0-6, bit 7 is their parity.
pub(super) const KSIGNS_AFFINE: i64 = affine_matrix([0x81, 0x82, 0x84, 0x88, 0x90, 0xA0, 0xC0, 0]);
/// The same of input bits 1-7 (the top 7 bits of an IQ2_XS u16's high byte).
const KSIGNS_HI_AFFINE: i64 = affine_matrix([0, 0x81, 0x82, 0x84, 0x88, 0x90, 0xA0, 0xC0]);
/// IQ2 magnitudes as an affine map of the 2-bit code over GF(2): 8 ⊕ 17·c₀ ⊕ 35·c₁ is 8, 25,
/// 43 for codes 0, 1, 2 (input bits 2-7, the neighbouring codes, are ignored).
pub(super) const IQ2_AFFINE: i64 = affine_matrix([8 ^ 25, 8 ^ 43, 0, 0, 0, 0, 0, 0]);
pub(super) const IQ2_AFFINE_CONST: i32 = 8;
/// IQ3_S magnitudes `2c + 1` = 1 ⊕ 2c₀ ⊕ 4c₁ ⊕ 8c₂ (no carries), also affine.
const IQ3S_AFFINE: i64 = affine_matrix([2, 4, 8, 0, 0, 0, 0, 0]);
const IQ3S_AFFINE_CONST: i32 = 1;

/// The grid kernels' features: the AVX-512 set plus BMI2 (`pdep`), VBMI (`vpermb`,
/// `vpmultishiftqb`), BITALG (`vpshufbitqmb`) and GFNI (`gf2p8affineqb`).
macro_rules! grid_kernel {
    ($(#[$m:meta])* fn $name:ident $($rest:tt)*) => {
        $(#[$m])*
        #[target_feature(
            enable = "avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx512bitalg,gfni"
        )]
        fn $name $($rest)*
    };
}

/// The AVX-512 table `t` with the grid kernels put in, when the CPU also has BMI2, VBMI,
/// BITALG and GFNI.
pub(super) fn with_grid_kernels(_proof: super::Avx512Vnni, t: Table) -> Table {
    if !(is_x86_feature_detected!("bmi2")
        && is_x86_feature_detected!("avx512vbmi")
        && is_x86_feature_detected!("avx512bitalg")
        && is_x86_feature_detected!("gfni"))
    {
        return t;
    }
    Table {
        iq2xxs: vec_dot_iq2_xxs_q8k,
        iq2xs: vec_dot_iq2_xs_q8k,
        iq2s: vec_dot_iq2_s_q8k,
        iq3xxs: vec_dot_iq3_xxs_q8k,
        iq3s: vec_dot_iq3_s_q8k,
        iq2xxs_multi: Some(vec_dot_iq2_xxs_q8k_multi),
        iq2xs_multi: Some(vec_dot_iq2_xs_q8k_multi),
        iq2s_multi: Some(vec_dot_iq2_s_q8k_multi),
        iq3xxs_multi: Some(vec_dot_iq3_xxs_q8k_multi),
        iq3s_multi: Some(vec_dot_iq3_s_q8k_multi),
        ..t
    }
}

macro_rules! wrap_grid {
    ($name:ident, $multi:ident => $kernel:ident) => {
        fn $name(w: &[u8], a: &[u8], n: usize) -> f32 {
            // SAFETY: `$kernel` needs the features `Avx512Vnni::detect` checks plus BMI2,
            // VBMI, BITALG and GFNI. This wrapper is reachable only through
            // `with_grid_kernels`, which takes an `Avx512Vnni` token and checks the other four
            // before placing it in the table.
            unsafe { $kernel::<1>(w, [a], n)[0] }
        }

        fn $multi(w: &[u8], acts: &[&[u8]], n: usize, out: &mut [f32]) {
            // SAFETY: as for the one-token wrapper (placed in the table by
            // `with_grid_kernels` only).
            unsafe { $crate::kernels::arch::x86_64::avx2::by_n_tokens!(8; $kernel, w, acts, n, out) }
        }
    };
}

wrap_grid!(vec_dot_iq2_xxs_q8k, vec_dot_iq2_xxs_q8k_multi => iq2_xxs_q8k);
wrap_grid!(vec_dot_iq2_xs_q8k, vec_dot_iq2_xs_q8k_multi => iq2_xs_q8k);
wrap_grid!(vec_dot_iq2_s_q8k, vec_dot_iq2_s_q8k_multi => iq2_s_q8k);
wrap_grid!(vec_dot_iq3_xxs_q8k, vec_dot_iq3_xxs_q8k_multi => iq3_xxs_q8k);
wrap_grid!(vec_dot_iq3_s_q8k, vec_dot_iq3_s_q8k_multi => iq3_s_q8k);

grid_kernel! {
    /// The 16-bit codes of 32 grid indices. `d` holds index i's low byte in both bytes of
    /// word lane i. Per 128 points (see [`split`]) one `vpermt2b` on the low-byte table and
    /// one on the high-byte table (index bits 0-6 as they are); the low-byte results are
    /// blended by index bit 7, 8, ... (byte masks from `bit`), the high-byte ones likewise,
    /// and the two by lane parity (even bytes low, odd bytes high).
    #[inline]
    fn lookup_codes<const B: usize>(
        t: &[u8; B],
        d: __m512i,
        bit: impl Fn(u32) -> __mmask64,
    ) -> __m512i {
        let t = t.as_chunks::<64>().0;
        let mut lo = [_mm512_setzero_si512(); 16];
        let mut hi = [_mm512_setzero_si512(); 16];
        let mut n = B / 256;
        for k in 0..n {
            lo[k] = _mm512_permutex2var_epi8(ld512(&t[4 * k]), d, ld512(&t[4 * k + 1]));
            hi[k] = _mm512_permutex2var_epi8(ld512(&t[4 * k + 2]), d, ld512(&t[4 * k + 3]));
        }
        let mut b = 7;
        while n > 1 {
            let m = bit(b);
            for i in 0..n / 2 {
                lo[i] = _mm512_mask_blend_epi8(m, lo[2 * i], lo[2 * i + 1]);
                hi[i] = _mm512_mask_blend_epi8(m, hi[2 * i], hi[2 * i + 1]);
            }
            n /= 2;
            b += 1;
        }
        _mm512_mask_blend_epi8(0xAAAA_AAAA_AAAA_AAAA, lo[0], hi[0])
    }
}

grid_kernel! {
    /// Byte mask of bit 7 of every byte of `d` (`vpmovb2m`).
    #[inline]
    fn low_bit(d: __m512i, b: u32) -> __mmask64 {
        debug_assert_eq!(b, 7);
        _mm512_movepi8_mask(d)
    }
}

grid_kernel! {
    /// Byte mask of bit 0 (`b` = 8) or 1 (`b` = 9) of every byte of `h`.
    #[inline]
    fn high_bit(h: __m512i, b: u32) -> __mmask64 {
        if b == 8 {
            _mm512_movepi8_mask(_mm512_slli_epi16::<7>(h))
        } else {
            _mm512_movepi8_mask(_mm512_slli_epi16::<6>(h))
        }
    }
}

grid_kernel! {
    /// `vpmultishiftqb` control: byte b of every qword takes the 8 bits at `off(b)`.
    #[inline]
    fn ms_ctrl(off: impl Fn(u32) -> u32) -> __m512i {
        let q = (0..8).fold(0i64, |q, b| q | i64::from((off(b) % 64) as u8) << (8 * b));
        _mm512_set1_epi64(q)
    }
}

grid_kernel! {
    /// The 64 bytes `f(0), .., f(63)` (index vectors for `vpermb`).
    #[inline]
    fn bytes_of(f: impl Fn(usize) -> usize) -> __m512i {
        let t: [u8; 64] = core::array::from_fn(|i| f(i) as u8);
        ld512(&t)
    }
}

grid_kernel! {
    /// IQ2 magnitudes of the 2-bit codes in the low bits of each byte (`gf2p8affineqb`).
    #[inline]
    fn iq2_vals(c: __m512i) -> __m512i {
        _mm512_gf2p8affine_epi64_epi8::<IQ2_AFFINE_CONST>(c, _mm512_set1_epi64(IQ2_AFFINE))
    }
}

grid_kernel! {
    /// The four 8-point outputs of an IQ2 code register whose word lane 4j + m holds point
    /// 8m + j: output m is points 8m..8m+8 (elements 64m..64m+64) as magnitudes.
    #[inline]
    fn iq2_expand(codes: __m512i) -> [__m512i; 4] {
        core::array::from_fn(|m| {
            let ctrl = ms_ctrl(|b| 16 * m as u32 + 2 * b);
            iq2_vals(_mm512_multishift_epi64_epi8(ctrl, codes))
        })
    }
}

grid_kernel! {
    /// Negation masks from sign bytes: `s` qword j byte `st·m` is the sign byte of run
    /// 8m + j (bit b negates element 64m + 8j + b); `vpshufbitqmb` picks bit 8·st·m + b of
    /// qword j for byte b, i.e. Y_m's 64 sign bits.
    #[inline]
    fn sign_masks<const ST: usize>(s: __m512i) -> [__mmask64; 4] {
        core::array::from_fn(|m| _mm512_bitshuffle_epi64_mask(s, bytes_of(|i| 8 * ST * m + i % 8)))
    }
}

grid_kernel! {
    /// Per-Y scale words from `sc` (dword k = `s_k | s_k << 16`): 128-bit lane L of Y_m
    /// (elements 64m + 16L..) takes dword `f(m, L)`.
    #[inline]
    fn scales4(sc: __m512i, f: impl Fn(usize, usize) -> usize) -> [__m512i; 4] {
        core::array::from_fn(|m| {
            let i: [i32; 16] = core::array::from_fn(|d| f(m, d / 4) as i32);
            // SAFETY: `i` is 64 readable bytes; `loadu` accepts any alignment.
            let i = unsafe { _mm512_loadu_si512(i.as_ptr().cast()) };
            _mm512_permutexvar_epi32(i, sc)
        })
    }
}

grid_kernel! {
    /// Scale words `2·nibble + 1` (both words of dword k, k < 16) from the 16 nibbles of the
    /// 8 bytes at `p` (nibble k = byte k/2 >> 4(k%2)): one broadcast, a `vpmultishiftqb`
    /// that puts nibble k one bit up in bytes 0 and 2 of dword k, and one `vpternlogd`.
    #[inline]
    fn nibble_scales(p: &[u8; 8]) -> __m512i {
        let v = _mm512_set1_epi64(i64::from_le_bytes(*p));
        // Dword k is bytes 4(k%2).. of qword k/2: take bit 4k − 1 (rotating) for bytes 0, 2.
        let ctrl = bytes_of(|i| {
            let k = i / 4;
            (4 * k + 63) % 64
        });
        let x = _mm512_multishift_epi64_epi8(ctrl, v);
        _mm512_ternarylogic_epi32::<0xEA>(
            x,
            _mm512_set1_epi32(0x001E_001E),
            _mm512_set1_epi32(0x0001_0001),
        )
    }
}

grid_kernel! {
    /// `Σ_m grid_m·(±q_a)` with the scale words: `g[m]` magnitudes of elements 64m..64m+64,
    /// `neg[m]` their negation mask, `sc[m]` the word scales; exact i32.
    #[inline]
    fn dot4(g: [__m512i; 4], neg: [__mmask64; 4], sc: [__m512i; 4], qa: &[i8; 256]) -> i32 {
        let qa = qa.as_chunks::<64>().0;
        let zero = _mm512_setzero_si512();
        let mut sumi = _mm512_setzero_si512();
        for m in 0..4 {
            let y = ld512(&qa[m]);
            let sy = _mm512_mask_sub_epi8(y, neg[m], zero, y);
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(g[m], sy), sc[m]);
        }
        _mm512_reduce_add_epi32(sumi)
    }
}

/// Shared super-block loop of a kernel `$name::<N>` for N tokens: `$body(blk)` decodes the
/// block once (magnitudes, negation masks and scale words for [`dot4`]), then each token's
/// exact i32 sum and the scalar oracle's f32 steps (`acc += (d_w·d_a)·sumi`, then
/// `factor · acc`), so every token gets the one-token bits. A token whose activation row is
/// malformed gets NaN (the others their values, one at a time).
macro_rules! grid_loop {
    ($name:ident, $w:expr, $acts:expr, $n:expr, $B:literal, $factor:expr, |$blk:ident| $body:expr) => {{
        let (Some(a), Some(wb)) = (
            rows_ok($acts, |a| Q8KAct::new(a, $n)),
            blocks::<$B>($w, $n / 256),
        ) else {
            return core::array::from_fn(|t| {
                if N == 1 {
                    f32::NAN
                } else {
                    $name::<1>($w, [$acts[t]], $n)[0]
                }
            });
        };
        let mut acc = [0.0f32; N];
        for (b, $blk) in wb.iter().enumerate() {
            let (g, neg, sc) = $body;
            let dw = f16_at::<0, $B>($blk);
            for t in 0..N {
                let sumi = dot4(g, neg, sc, &a[t].qs.as_chunks::<256>().0[b]);
                acc[t] += (dw * a[t].d(b)) * sumi as f32;
            }
        }
        acc.map(|v| $factor * v)
    }};
}

grid_kernel! {
    /// IQ2_XXS × Q8_K (× 1/8). Block (66 B): `[0..2) d | [2..66) 8 × (idx[4] | u32 a)`; run
    /// l of sub-block ib (elements 32ib + 8l..) is `IQ2XXS_GRID[idx[l]]`, signs
    /// `ksigns[(a >> 7l) & 127]`, scale `2(a >> 28) + 1`.
    ///
    /// Point e = 4ib + l sits at byte 8ib + l of `q` (the 64 bytes after `d`); its index goes
    /// to word lane 4j + m for e = 8m + j (the high byte is left as is: the lookup ignores
    /// it), so [`iq2_expand`] yields elements in order.
    fn iq2_xxs_q8k<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
        let pick = bytes_of(|i| {
            let e = 8 * ((i / 2) % 4) + i / 8;
            8 * (e / 4) + e % 4
        });
        // Sign fields of sub-block ib: bits 32 + 7l of qword ib into bytes 0-3 of that qword,
        // parity appended, then run 8m + j (qword 2m + j/4, byte j%4) moved to qword j byte m.
        let ms_sign = ms_ctrl(|b| 32 + 7 * (b % 4));
        let ksigns = _mm512_set1_epi64(KSIGNS_AFFINE);
        let arrange = bytes_of(|i| {
            let (j, m) = (i / 8, (i % 8) % 4);
            8 * (2 * m + j / 4) + j % 4
        });
        let one = _mm512_set1_epi64(1);
        grid_loop!(iq2_xxs_q8k, w, acts, n, 66, 0.125, |blk| {
            let q = ld512(at::<u8, 2, 64, 66>(blk));
            let idx = _mm512_permutexvar_epi8(pick, q);
            let g = iq2_expand(lookup_codes(&IQ2XXS_TAB, idx, |b| low_bit(idx, b)));
            let s = _mm512_multishift_epi64_epi8(ms_sign, q);
            let s = _mm512_gf2p8affine_epi64_epi8::<0>(s, ksigns);
            let neg = sign_masks::<1>(_mm512_permutexvar_epi8(arrange, s));
            // 2(a >> 28) + 1 in both words of dword 2ib.
            let sc = _mm512_or_si512(_mm512_srli_epi64::<59>(q), one);
            let sc = _mm512_or_si512(sc, _mm512_slli_epi64::<16>(sc));
            (g, neg, scales4(sc, |m, l| 2 * (2 * m + l / 2)))
        })
    }
}

grid_kernel! {
    /// IQ2_XS × Q8_K (× 1/8). Block (74 B): `[0..2) d | [2..66) u16[32] | [66..74) scales`;
    /// run r (elements 8r..8r+8): `IQ2XS_GRID[u16 & 511]`, signs `ksigns[u16 >> 9]`; runs
    /// 0-1 of sub-block ib scale `2·lo + 1`, runs 2-3 `2·hi + 1` (nibbles of `scales[ib]`).
    ///
    /// The u16 of run 8m + j goes to word lane 4j + m (as for IQ2_XXS); the lookup tests
    /// bits 6-8 only, and `>> 9` leaves the sign field in the low byte of each lane, so the
    /// sign byte of run 8m + j lands at byte 2m of qword j.
    fn iq2_xs_q8k<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
        let run = |i: usize| 8 * ((i / 2) % 4) + i / 8;
        let (pick_lo, pick_hi) = (bytes_of(|i| 2 * run(i)), bytes_of(|i| 2 * run(i) + 1));
        // ksigns of the high byte's bits 1-7.
        let ksigns = _mm512_set1_epi64(KSIGNS_HI_AFFINE);
        grid_loop!(iq2_xs_q8k, w, acts, n, 74, 0.125, |blk| {
            let q = ld512(at::<u8, 2, 64, 74>(blk));
            let (d, h) = (_mm512_permutexvar_epi8(pick_lo, q), _mm512_permutexvar_epi8(pick_hi, q));
            let codes = lookup_codes(&IQ2XS_TAB, d, |b| {
                if b < 8 { low_bit(d, b) } else { high_bit(h, b) }
            });
            let s = _mm512_gf2p8affine_epi64_epi8::<0>(h, ksigns);
            let sc = nibble_scales(at::<u8, 66, 8, 74>(blk));
            (iq2_expand(codes), sign_masks::<2>(s), scales4(sc, |m, l| 4 * m + l))
        })
    }
}

grid_kernel! {
    /// IQ2_S × Q8_K (× 1/8). Block (82 B): `[0..2) d | [2..34) qs | [34..66) signs |
    /// [66..74) qh | [74..82) scales`; run r = 4ib + l: `IQ2S_GRID[qs[r] | ((qh[ib] >> 2l) &
    /// 3) << 8]`, sign byte `signs[r]` (bit b negates element 8r + b, so the 32 bytes are
    /// the 256-bit mask), scales as IQ2_XS.
    ///
    /// Word lane 4j + m (run r = 8m + j) gets `qs[r]` in its low byte and `qh[r/4]` in its
    /// high byte (`vpermi2b` over the bytes 2..66 and 18..82), then the high byte shifted
    /// right by 2(r % 4) = 2(j % 4): index bits 8-9 (the lookup ignores bits 10-15).
    fn iq2_s_q8k<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
        let run = |i: usize| 8 * ((i / 2) % 4) + i / 8;
        let pick_qs = bytes_of(run);
        let pick_qh = bytes_of(|i| 48 + run(i) / 4);
        let shift: [u16; 32] = core::array::from_fn(|lane| 2 * ((lane / 4) % 4) as u16);
        // SAFETY: `shift` is 64 readable bytes; `loadu` accepts any alignment.
        let shift = unsafe { _mm512_loadu_si512(shift.as_ptr().cast()) };
        grid_loop!(iq2_s_q8k, w, acts, n, 82, 0.125, |blk| {
            let d = _mm512_permutexvar_epi8(pick_qs, ld512(at::<u8, 2, 64, 82>(blk)));
            let h = _mm512_permutexvar_epi8(pick_qh, ld512(at::<u8, 18, 64, 82>(blk)));
            let h = _mm512_srlv_epi16(h, shift);
            let codes = lookup_codes(&IQ2S_TAB, d, |b| {
                if b < 8 { low_bit(d, b) } else { high_bit(h, b) }
            });
            let sg = at::<u8, 34, 32, 82>(blk).as_chunks::<8>().0;
            let neg = core::array::from_fn(|m| u64::from_le_bytes(sg[m]));
            let sc = nibble_scales(at::<u8, 74, 8, 82>(blk));
            (iq2_expand(codes), neg, scales4(sc, |m, l| 4 * m + l))
        })
    }
}

grid_kernel! {
    /// Word-lane indices of IQ3 half h (points 32h..32h+32): lane 4j + k takes point
    /// 32h + 2j + k (k < 2) or 32h + 16 + 2j + (k − 2), so the `vpmultishiftqb` taking words
    /// 0-1 of every qword yields elements 128h..128h+64 and the one taking words 2-3 the
    /// next 64. Entry: byte offset of point e in the source register.
    #[inline]
    fn iq3_pick(h: usize) -> __m512i {
        bytes_of(|i| {
            let (j, k) = (i / 8, (i / 2) % 4);
            32 * h + if k < 2 { 2 * j + k } else { 16 + 2 * j + k - 2 }
        })
    }
}

grid_kernel! {
    /// The two 16-point outputs of an IQ3 code register laid out by [`iq3_pick`]: 3-bit codes
    /// in the low bits of each byte (the caller maps them to magnitudes).
    #[inline]
    fn iq3_codes(codes: __m512i) -> [__m512i; 2] {
        core::array::from_fn(|k| {
            let ctrl = ms_ctrl(|b| 32 * k as u32 + 16 * (b / 4) + 3 * (b % 4));
            _mm512_multishift_epi64_epi8(ctrl, codes)
        })
    }
}

grid_kernel! {
    /// IQ3_XXS × Q8_K (× 1/4). Block (98 B): `[0..2) d | [2..66) qs | [66..98) u32[8]`;
    /// point e (elements 4e..4e+4) is `IQ3XXS_GRID[qs[e]]`; sub-block ib: `a = u32[ib]`, run
    /// l signs `ksigns[(a >> 7l) & 127]`, scale `2(a >> 28) + 1`. Codes to magnitudes with
    /// `vpermb` (4, 12, .., 52, 62 is not affine over GF(2)).
    fn iq3_xxs_q8k<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
        let pick = [iq3_pick(0), iq3_pick(1)];
        let lut = ld512(&IQ3XXS_LUT);
        // Sign fields: qword q of the 32 `a` bytes holds sub-blocks 2q, 2q+1; byte t of the
        // result takes bits 7t (t < 4) or 32 + 7(t − 4), i.e. run 8q + t; parity appended;
        // then run 8m + j moved to qword j byte m.
        let ms_sign = _mm512_castsi512_si256(ms_ctrl(|b| 32 * (b / 4) + 7 * (b % 4)));
        let ksigns = _mm256_set1_epi64x(KSIGNS_AFFINE);
        let arrange = bytes_of(|i| 8 * ((i % 8) % 4) + i / 8);
        let one = _mm256_set1_epi32(1);
        grid_loop!(iq3_xxs_q8k, w, acts, n, 98, 0.25, |blk| {
            let q = ld512(at::<u8, 2, 64, 98>(blk));
            let aux = ld256(at::<u8, 66, 32, 98>(blk));
            let mut g = [_mm512_setzero_si512(); 4];
            for h in 0..2 {
                let idx = _mm512_permutexvar_epi8(pick[h], q);
                let c = iq3_codes(lookup_codes(&IQ3XXS_TAB, idx, |b| low_bit(idx, b)));
                for k in 0..2 {
                    g[2 * h + k] = _mm512_permutexvar_epi8(c[k], lut);
                }
            }
            let s = _mm256_gf2p8affine_epi64_epi8::<0>(
                _mm256_multishift_epi64_epi8(ms_sign, aux),
                ksigns,
            );
            let neg = sign_masks::<1>(_mm512_permutexvar_epi8(arrange, _mm512_castsi256_si512(s)));
            let sc = _mm256_or_si256(_mm256_srli_epi32::<27>(aux), one);
            let sc = _mm256_or_si256(sc, _mm256_slli_epi32::<16>(sc));
            (g, neg, scales4(_mm512_castsi256_si512(sc), |m, l| 2 * m + l / 2))
        })
    }
}

grid_kernel! {
    /// IQ3_S × Q8_K. Block (110 B): `[0..2) d | [2..66) qs | [66..74) qh | [74..106) signs |
    /// [106..110) scales`; point e = 8sb + k (elements 4e..4e+4) is `IQ3S_GRID[qs[e] | (qh[sb]
    /// bit k) << 8]`, i.e. index bit 8 is bit e of `qh` read as a u64; `signs` is the
    /// 256-bit negation mask; scale `2·nibble + 1`. Codes to magnitudes `2c + 1` with
    /// `gf2p8affineqb`.
    fn iq3_s_q8k<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
        let pick = [iq3_pick(0), iq3_pick(1)];
        let vals = _mm512_set1_epi64(IQ3S_AFFINE);
        grid_loop!(iq3_s_q8k, w, acts, n, 110, 1.0, |blk| {
            let q = ld512(at::<u8, 2, 64, 110>(blk));
            let qh = u64::from_le_bytes(*at::<u8, 66, 8, 110>(blk));
            let mut g = [_mm512_setzero_si512(); 4];
            for h in 0..2 {
                // Index bit 8 as a byte mask: word lane 4j + k is point 2j + k (k < 2) or
                // 16 + 2j + k − 2 of the half, two bytes per lane.
                let c = (qh >> (32 * h)) as u32;
                let twice = |x: u32| {
                    let d = _pdep_u32(x, 0x5555_5555);
                    d | d << 1
                };
                let b8 = _pdep_u64(u64::from(twice(c & 0xFFFF)), 0x0F0F_0F0F_0F0F_0F0F)
                    | _pdep_u64(u64::from(twice(c >> 16)), 0xF0F0_F0F0_F0F0_F0F0);
                let d = _mm512_permutexvar_epi8(pick[h], q);
                let codes = lookup_codes(&IQ3S_TAB, d, |b| if b == 8 { b8 } else { low_bit(d, b) });
                let c = iq3_codes(codes);
                for k in 0..2 {
                    g[2 * h + k] =
                        _mm512_gf2p8affine_epi64_epi8::<IQ3S_AFFINE_CONST>(c[k], vals);
                }
            }
            let sg = at::<u8, 74, 32, 110>(blk).as_chunks::<8>().0;
            let neg = core::array::from_fn(|m| u64::from_le_bytes(sg[m]));
            let s4 = u32::from_le_bytes(*at::<u8, 106, 4, 110>(blk));
            let sc = nibble_scales(&u64::from(s4).to_le_bytes());
            (g, neg, scales4(sc, |m, l| 2 * m + l / 2))
        })
    }
}

#[cfg(test)]
mod tests {
    use lagoon_core::quant::tables::{
        IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
    };

    /// `gf2p8affineqb` on one byte (constant 0).
    fn affine(m: i64, x: u8) -> u8 {
        (0..8).fold(0, |v, i| {
            let row = (m as u64 >> (8 * (7 - i))) as u8;
            v | (((row & x).count_ones() % 2) as u8) << i
        })
    }

    #[test]
    fn grid_codes_decode_to_the_grids() {
        let iq2 = |c: u16, j: usize| affine(super::IQ2_AFFINE, (c >> (2 * j)) as u8) ^ 8;
        for (codes, grid) in [
            (&super::IQ2XXS_CODES[..], &IQ2XXS_GRID[..]),
            (&super::IQ2XS_CODES[..], &IQ2XS_GRID[..]),
            (&super::IQ2S_CODES[..], &IQ2S_GRID[..]),
        ] {
            for (e, (&c, &p)) in codes.iter().zip(grid).enumerate() {
                for j in 0..8 {
                    assert_eq!(iq2(c, j), (p >> (8 * j)) as u8, "iq2 point {e} weight {j}");
                }
            }
        }
        for (e, &c) in super::IQ3XXS_CODES.iter().enumerate() {
            for j in 0..4 {
                let v = super::IQ3XXS_LUT[usize::from((c >> (3 * j)) & 0xFF) & 63];
                assert_eq!(v, (IQ3XXS_GRID[e] >> (8 * j)) as u8, "iq3xxs {e} {j}");
            }
        }
        for (e, &c) in super::IQ3S_CODES.iter().enumerate() {
            for j in 0..4 {
                let v = affine(super::IQ3S_AFFINE, (c >> (3 * j)) as u8) ^ 1;
                assert_eq!(v, (IQ3S_GRID[e] >> (8 * j)) as u8, "iq3s {e} {j}");
            }
        }
    }

    #[test]
    fn affine_parity_is_ksigns() {
        let Some(_) = super::super::Avx512Vnni::detect() else {
            return;
        };
        if !is_x86_feature_detected!("gfni") {
            return;
        }
        // SAFETY: GFNI and AVX-512 were detected above.
        let got: [u8; 64] = unsafe { affine_from(0) };
        for x in 0..64usize {
            assert_eq!(got[x], KSIGNS_IQ2XS[x], "{x}");
        }
        // SAFETY: as above.
        let got: [u8; 64] = unsafe { affine_from(64) };
        for x in 0..64usize {
            assert_eq!(got[x], KSIGNS_IQ2XS[x + 64], "{}", x + 64);
        }
        // Bit 7 of the input is ignored.
        // SAFETY: as above.
        let got: [u8; 64] = unsafe { affine_from(192) };
        for x in 0..64usize {
            assert_eq!(got[x], KSIGNS_IQ2XS[x + 64], "{} with bit 7", x + 192);
        }
    }

    /// Random blocks of `B` bytes with a finite fp16 `d` at `d_at` (None: leave the bytes).
    fn random_row(nb: usize, bsize: usize, d_at: Option<usize>, seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut w: Vec<u8> = (0..nb * bsize).map(|_| next() as u8).collect();
        if let Some(o) = d_at {
            for blk in w.chunks_exact_mut(bsize) {
                // fp16 with exponent 5..20 (about 2^-10 .. 2^5), random mantissa and sign.
                let h = (next() as u16 & 0x83FF) | ((5 + (next() % 16) as u16) << 10);
                blk[o..o + 2].copy_from_slice(&h.to_le_bytes());
            }
        }
        w
    }

    /// The grid kernels are bit-identical to the scalar oracle on random rows.
    #[test]
    fn grid_kernels_equal_scalar_bitwise() {
        let Some(p) = super::super::Avx512Vnni::detect() else {
            return;
        };
        let t = super::with_grid_kernels(p, crate::kernels::scalar_table());
        let s = crate::kernels::scalar_table();
        let cases = [
            ("iq2_xxs", t.iq2xxs, s.iq2xxs, 66),
            ("iq2_xs", t.iq2xs, s.iq2xs, 74),
            ("iq2_s", t.iq2s, s.iq2s, 82),
            ("iq3_xxs", t.iq3xxs, s.iq3xxs, 98),
            ("iq3_s", t.iq3s, s.iq3s, 110),
        ];
        for (name, fast, slow, bsize) in cases {
            for seed in 0..200u64 {
                let nb = 1 + (seed as usize % 13);
                let n = 256 * nb;
                let w = random_row(nb, bsize, Some(0), seed);
                let x: Vec<f32> = random_row(n, 1, None, seed + 7)
                    .iter()
                    .map(|&b| f32::from(b as i8) * 0.37)
                    .collect();
                let mut a = vec![0u8; crate::kernels::act::q8k_row_bytes(n)];
                crate::kernels::act::quantize_row_q8k(&x, &mut a);
                let (f, r) = (fast(&w, &a, n), slow(&w, &a, n));
                assert_eq!(f.to_bits(), r.to_bits(), "{name} seed {seed}: {f} vs {r}");
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,gfni")]
    fn affine_from(base: u8) -> [u8; 64] {
        let x: [u8; 64] = core::array::from_fn(|i| base.wrapping_add(i as u8));
        // SAFETY: `x` is 64 readable bytes.
        let v = unsafe { core::arch::x86_64::_mm512_loadu_si512(x.as_ptr().cast()) };
        let r = core::arch::x86_64::_mm512_gf2p8affine_epi64_epi8::<0>(
            v,
            core::arch::x86_64::_mm512_set1_epi64(super::KSIGNS_AFFINE),
        );
        let mut out = [0u8; 64];
        // SAFETY: `out` is 64 writable bytes.
        unsafe { core::arch::x86_64::_mm512_storeu_si512(out.as_mut_ptr().cast(), r) };
        out
    }
}
