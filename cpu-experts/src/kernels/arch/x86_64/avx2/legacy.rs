//! Legacy 32-element weight blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) × Q8_0 activations.
//!
//! Shared shape, per block b: 32 weight quants expanded to one 256-bit register in element
//! order, `Σ q_w·q_a` as 8 i32 lanes (exact), then `acc += (d_w·d_a) · lanes` in f32; two
//! accumulators over even/odd blocks hide the FMA latency. Types with a min add
//! `m_w · ds_a` (ds_a = d_a·Σ q_a from the activation row) in a scalar accumulator.

use core::arch::x86_64::*;

use super::{at, dot_i8, dot_u8i8, f16_at, hsum_ps, ld128, ld256, wrap};
use crate::kernels::act::Q8_0Act;
use crate::kernels::scalar::blocks;

/// The two-accumulator block loop for N tokens (`N` in scope): `$blk` (with `$w: &[u8; $B]` in
/// scope) gives the block's 32 weights as bytes, `d_w` and `m_w` once; every token takes its
/// lanes with `$dot(weights, q_a)`, then `acc += (d_w·d_a)·lanes` (even blocks into one
/// accumulator, odd into the other, an odd last block into the even one) and, when `$min`,
/// `m_w·ds_a` into a scalar; each token's result is the one-token kernel's bits (the one-token
/// kernels are N = 1). `$one` is the kernel itself, for a token whose activation row is
/// malformed (NaN for it alone).
macro_rules! legacy_loop_n {
    ($one:ident, $w_row:expr, $acts:expr, $n:expr, $B:literal, $min:literal, $dot:ident,
     |$w:ident| $blk:expr) => {{
        let Some(wb) = blocks::<$B>($w_row, $n / 32) else {
            return [f32::NAN; N];
        };
        let q = $acts.map(|a| Q8_0Act::new(a, $n));
        if !q.iter().all(Option::is_some) {
            return core::array::from_fn(|t| {
                if N == 1 {
                    f32::NAN
                } else {
                    $one($w_row, [$acts[t]], $n)[0]
                }
            });
        }
        let a = q.map(|a| a.unwrap_or_else(|| unreachable!()));
        let mut acc = [[_mm256_setzero_ps(); 2]; N];
        let mut accm = [0.0f32; N];
        let (wp, wt) = wb.as_chunks::<2>();
        let blocks_n = wb.len();
        let mut step = |b: usize, h: usize, $w: &[u8; $B]| {
            let (x, dw, mw): (__m256i, f32, f32) = $blk;
            for t in 0..N {
                let lanes = $dot(x, ld256(&a[t].qs.as_chunks::<32>().0[b]));
                let dd = _mm256_set1_ps(dw * a[t].d(b));
                acc[t][h] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(lanes), acc[t][h]);
                if $min {
                    accm[t] += mw * a[t].ds(b);
                }
            }
        };
        for (k, w2) in wp.iter().enumerate() {
            step(2 * k, 0, &w2[0]);
            step(2 * k + 1, 1, &w2[1]);
        }
        if let [blk] = wt {
            step(blocks_n - 1, 0, blk);
        }
        core::array::from_fn(|t| hsum_ps(_mm256_add_ps(acc[t][0], acc[t][1])) + accm[t])
    }};
}

/// The 32 nibbles of a legacy `qs[16]` in element order: lane 0 = low nibbles (elements
/// 0..16), lane 1 = high nibbles (elements 16..32). Unsigned 0..15.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles(qs: &[u8; 16]) -> __m256i {
    let x = ld128(qs);
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(x), x);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Bit j of `qh` (a little-endian u32) spread to byte j: 0xFF where set, 0 elsewhere.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn bits_to_bytes(qh: &[u8; 4]) -> __m256i {
    let v = _mm256_set1_epi32(i32::from_le_bytes(*qh));
    // Byte j takes qh byte j/8 (shuffle works per 128-bit lane; both lanes hold all 4 bytes).
    let spread = _mm256_shuffle_epi8(
        v,
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0x0000_0000_0000_0000,
        ),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit)
}

wrap!(vec_dot_q8_0_q8_0 => q8_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32);
wrap!(vec_dot_q4_0_q8_0 => q4_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32);
wrap!(vec_dot_q4_1_q8_0 => q4_1_q8_0(w: &[u8], a: &[u8], n: usize) -> f32);
wrap!(vec_dot_q5_0_q8_0 => q5_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32);
wrap!(vec_dot_q5_1_q8_0 => q5_1_q8_0(w: &[u8], a: &[u8], n: usize) -> f32);

/// Q8_0 × Q8_0. Block (34 B): `[0..2) d:f16 | [2..34) qs:i8[32]`.
/// Scalar: `sumf += (Σ_j qs[j]·q_a[j]) · (d·d_a)`. Sign trick for the i8×i8 products.
#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    q8_0_q8_0_n(w, [a], n)[0]
}

/// Q4_0 × Q8_0. Block (18 B): `[0..2) d | [2..18) qs[16]`; element j < 16 is the low nibble
/// of qs[j], element j + 16 the high nibble; q = nibble − 8.
/// Scalar: `sumf += (Σ_j (nib_j − 8)·q_a[j]) · (d·d_a)`.
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    q4_0_q8_0_n(w, [a], n)[0]
}

/// [`q4_0_q8_0`] for N tokens, each block's nibbles unpacked once.
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_0_q8_0_n<const N: usize>(wr: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
    legacy_loop_n!(q4_0_q8_0_n, wr, acts, n, 18, false, dot_i8, |w| {
        let x = _mm256_sub_epi8(nibbles(at::<u8, 2, 16, 18>(w)), _mm256_set1_epi8(8));
        (x, f16_at::<0, 18>(w), 0.0)
    })
}

/// Q4_1 × Q8_0. Block (20 B): `[0..2) d | [2..4) m | [4..20) qs[16]`, nibbles as Q4_0,
/// unsigned. Scalar: `sumf += (Σ nib·q_a)·(d·d_a) + m·ds_a`.
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_1_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    q4_1_q8_0_n(w, [a], n)[0]
}

/// [`q4_1_q8_0`] for N tokens, each block's nibbles unpacked once.
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_1_q8_0_n<const N: usize>(wr: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
    legacy_loop_n!(q4_1_q8_0_n, wr, acts, n, 20, true, dot_u8i8, |w| {
        let x = nibbles(at::<u8, 4, 16, 20>(w));
        (x, f16_at::<0, 20>(w), f16_at::<2, 20>(w))
    })
}

/// Q5_0 × Q8_0. Block (22 B): `[0..2) d | [2..6) qh:u32 | [6..22) qs[16]`; element j's
/// bit 4 is qh bit j; q = 5-bit − 16. `nib | 0xF0` where the bit is clear is `nib − 16` as
/// a signed byte. Scalar: `sumf += (Σ q·q_a)·(d·d_a)`.
#[target_feature(enable = "avx2,fma,f16c")]
fn q5_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    q5_0_q8_0_n(w, [a], n)[0]
}

/// [`q5_0_q8_0`] for N tokens, each block's quants unpacked once.
#[target_feature(enable = "avx2,fma,f16c")]
fn q5_0_q8_0_n<const N: usize>(wr: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
    legacy_loop_n!(q5_0_q8_0_n, wr, acts, n, 22, false, dot_i8, |w| {
        let hb = bits_to_bytes(at::<u8, 2, 4, 22>(w));
        let x = _mm256_or_si256(
            nibbles(at::<u8, 6, 16, 22>(w)),
            _mm256_andnot_si256(hb, _mm256_set1_epi8(0xF0u8 as i8)),
        );
        (x, f16_at::<0, 22>(w), 0.0)
    })
}

/// Q5_1 × Q8_0. Block (24 B): `[0..2) d | [2..4) m | [4..8) qh | [8..24) qs[16]`; q =
/// 5-bit unsigned. Scalar: `sumf += (Σ q·q_a)·(d·d_a) + m·ds_a`.
#[target_feature(enable = "avx2,fma,f16c")]
fn q5_1_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    q5_1_q8_0_n(w, [a], n)[0]
}

/// [`q5_1_q8_0`] for N tokens, each block's quants unpacked once.
#[target_feature(enable = "avx2,fma,f16c")]
fn q5_1_q8_0_n<const N: usize>(wr: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
    legacy_loop_n!(q5_1_q8_0_n, wr, acts, n, 24, true, dot_u8i8, |w| {
        let hb = bits_to_bytes(at::<u8, 4, 4, 24>(w));
        let x = _mm256_or_si256(
            nibbles(at::<u8, 8, 16, 24>(w)),
            _mm256_and_si256(hb, _mm256_set1_epi8(0x10)),
        );
        (x, f16_at::<0, 24>(w), f16_at::<2, 24>(w))
    })
}

// Q4_0, Q4_1, Q5_0 and Q5_1 × Q8_0 for up to 4 tokens at once (`out[t] = w · acts[t]`).
super::multi_n!(vec_dot_q4_0_q8_0_multi => q4_0_q8_0_n);
super::multi_n!(vec_dot_q4_1_q8_0_multi => q4_1_q8_0_n);
super::multi_n!(vec_dot_q5_0_q8_0_multi => q5_0_q8_0_n);
super::multi_n!(vec_dot_q5_1_q8_0_multi => q5_1_q8_0_n);

// Q8_0 × Q8_0 for up to 4 tokens at once (`out[t] = w · acts[t]`).
super::multi_n!(vec_dot_q8_0_q8_0_multi => q8_0_q8_0_n);

/// Q8_0 × Q8_0 against N activation rows: each weight block is loaded
/// once and dotted with every token. Per token, the f32 operations and their order are
/// those of [`q8_0_q8_0`] (even blocks into one accumulator, odd into the other, an odd
/// last block into the even one), so each result is bit-identical to the one-row kernel.
#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_q8_0_n<const N: usize>(wr: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
    legacy_loop_n!(q8_0_q8_0_n, wr, acts, n, 34, false, dot_i8, |w| (
        ld256(at::<u8, 2, 32, 34>(w)),
        f16_at::<0, 34>(w),
        0.0
    ))
}
