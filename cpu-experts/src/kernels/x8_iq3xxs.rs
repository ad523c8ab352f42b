//! IQ3_XXS rows repacked eight at a time, for the 512-bit grid kernel
//! (`arch::x86_64::avx512::iq3x8z`): the one-row grid kernel reaches 39% of the 16-core host's
//! read floor with 16 threads (BENCHMARKS.md, session 19), compute-bound at ~2 GiB/s per
//! thread. Eight rows per register let each grid lookup, sign mask and scale serve eight rows,
//! and one activation broadcast meet all of them. [`super::x8::X8Store`] holds these copies
//! beside the other types' where the CPU runs that kernel ([`simd`]).
//!
//! Layout of one group of 8 rows, per super-block ([`IQ3XXS_X8_BLOCK`] = 784 bytes, 98 per row
//! as in IQ3_XXS itself: the bytes are only moved):
//!
//! | bytes | what |
//! |---|---|
//! | `[0, 16)` | `d` of rows 0..8 (f16) |
//! | `[16, 528)` | grid indices: row r's `qs[8j .. 8j + 8]` (sub-block j) at `16 + 64j + 8r` |
//! | `[528, 784)` | sign-and-scale words: row r's `u32` of sub-block `2q` at `528 + 64q + 8r`, of `2q + 1` at `+ 4` |
//!
//! so one 64-byte load holds sub-block j's eight indices of all eight rows (a row per 64-bit
//! lane), and one the sign and scale words of two sub-blocks (a row per 64-bit lane).
//!
//! Numerics: each row's `Σ_j (2·(w_j >> 28) + 1)·Σ ±g·a` is exact, then the scalar
//! reference's f32 steps (`scalar::vec_dot_iq3_xxs_q8k`: `acc += (d·d_a)·sumi` per
//! super-block, `0.25·acc` at the end), so every kernel here gives its bits.

use lagoon_core::quant::QK_K;
use lagoon_core::quant::tables::{IQ3XXS_GRID, KSIGNS_IQ2XS};

use super::act::Q8KAct;
use super::x8::{DotX8, DotX8Multi};

/// Bytes of one group of 8 rows per super-block.
pub const IQ3XXS_X8_BLOCK: usize = 8 * 98;
pub(crate) const IQ3XXS_BLOCK: usize = 98;

/// Repacks `rows` IQ3_XXS rows of `cols` columns (`w`: the rows' 98-byte super-blocks, row
/// after row) into groups of 8 rows ([`IQ3XXS_X8_BLOCK`] bytes per group and super-block,
/// groups in row order). `None` unless `rows` is a multiple of 8, `cols` of 256 and `w`
/// exactly that size.
pub fn repack_iq3xxs_x8(w: &[u8], rows: usize, cols: usize) -> Option<Vec<u8>> {
    let nb = cols / QK_K;
    if rows == 0 || !rows.is_multiple_of(8) || nb == 0 || !cols.is_multiple_of(QK_K) {
        return None;
    }
    if w.len() != rows * nb * IQ3XXS_BLOCK {
        return None;
    }
    let rb = nb * IQ3XXS_BLOCK;
    let mut out = vec![0u8; rows / 8 * nb * IQ3XXS_X8_BLOCK];
    for (g, dst) in out.chunks_exact_mut(nb * IQ3XXS_X8_BLOCK).enumerate() {
        for (b, o) in dst
            .as_chunks_mut::<IQ3XXS_X8_BLOCK>()
            .0
            .iter_mut()
            .enumerate()
        {
            for r in 0..8 {
                let blk = &w[(8 * g + r) * rb + b * IQ3XXS_BLOCK..][..IQ3XXS_BLOCK];
                o[2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
                for j in 0..8 {
                    o[16 + 64 * j + 8 * r..][..8].copy_from_slice(&blk[2 + 8 * j..][..8]);
                    let at = 528 + 64 * (j / 2) + 8 * r + 4 * (j % 2);
                    o[at..at + 4].copy_from_slice(&blk[66 + 4 * j..][..4]);
                }
            }
        }
    }
    Some(out)
}

/// The scalar kernel: each row in the scalar reference's order. NaN in every output when `p`
/// or `a` is not one group of `cols` columns.
pub fn dot_iq3xxs_x8_scalar(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
    let nb = cols / QK_K;
    let Some(a) = Q8KAct::new(a, cols).filter(|_| p.len() == nb * IQ3XXS_X8_BLOCK) else {
        *out = [f32::NAN; 8];
        return;
    };
    let f16 = super::scalar::f16_at;
    for (r, y) in out.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for (b, o) in p.chunks_exact(IQ3XXS_X8_BLOCK).enumerate() {
            let qa = &a.qs[QK_K * b..][..QK_K];
            let mut sumi = 0i32;
            for j in 0..8 {
                let at = 528 + 64 * (j / 2) + 8 * r + 4 * (j % 2);
                let aw = u32::from_le_bytes([o[at], o[at + 1], o[at + 2], o[at + 3]]);
                let mut s = 0i32;
                for e in 0..8 {
                    let g = IQ3XXS_GRID[usize::from(o[16 + 64 * j + 8 * r + e])].to_le_bytes();
                    let signs = KSIGNS_IQ2XS[((aw >> (7 * (e / 2))) & 127) as usize];
                    for (k, &gk) in g.iter().enumerate() {
                        let p = i32::from(gk) * i32::from(qa[32 * j + 4 * e + k]);
                        s += if (signs >> (4 * (e % 2) + k)) & 1 != 0 {
                            -p
                        } else {
                            p
                        };
                    }
                }
                sumi += (2 * (aw >> 28) + 1) as i32 * s;
            }
            acc += (f16(o, 2 * r) * a.d(b)) * sumi as f32;
        }
        *y = 0.25 * acc;
    }
}

/// [`DotX8Multi`] on the scalar kernel, token by token (NaN everywhere when the lengths of
/// `acts` and `out` differ).
pub fn dot_iq3xxs_x8_multi_scalar(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
    super::x8::by_token(dot_iq3xxs_x8_scalar, p, acts, cols, out);
}

/// The fastest IQ3_XXS [`DotX8Multi`] this CPU runs (`super::x8::x8_pick!`).
pub fn dot_iq3xxs_x8_multi() -> DotX8Multi {
    super::x8::x8_pick!(iq3xxs_x8_multi, dot_iq3xxs_x8_multi_scalar)
}

/// The fastest one-token IQ3_XXS [`DotX8`] this CPU runs.
pub fn dot_iq3xxs_x8() -> DotX8 {
    super::x8::x8_pick!(iq3xxs_x8, dot_iq3xxs_x8_scalar)
}

/// Whether this CPU runs the vector kernel (AVX512-VNNI with VBMI, BITALG and GFNI, and
/// `LAGOON_FORCE_AVX2` unset): the store repacks IQ3_XXS only then (elsewhere only the
/// scalar 8-row kernel would read the copy, while the table has vector one-row kernels).
pub fn simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::kernels::arch::x86_64::iq3xxs_x8(!super::x8::no_avx512()).is_some();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::scalar;
    use crate::kernels::x8::testing::{Layout, check_reference_bits, full_scale, kernels, rng};

    /// Random IQ3_XXS rows: random indices, signs and scales, small positive f16 `d`.
    fn rows(seed: &mut u64, rows: usize, cols: usize) -> Vec<u8> {
        let mut w = vec![0u8; rows * cols / QK_K * IQ3XXS_BLOCK];
        for blk in w.chunks_exact_mut(IQ3XXS_BLOCK) {
            for b in blk.iter_mut() {
                *b = rng(seed) as u8;
            }
            let d = half::f16::from_f32((rng(seed) % 1000) as f32 * 1e-5 + 1e-6);
            blk[0..2].copy_from_slice(&d.to_le_bytes());
        }
        w
    }

    #[test]
    fn iq3xxs_x8_kernels_give_the_scalar_reference_bits() {
        let layout = Layout {
            rows,
            repack: repack_iq3xxs_x8,
            reference: scalar::vec_dot_iq3_xxs_q8k,
            block: IQ3XXS_BLOCK,
            group_block: IQ3XXS_X8_BLOCK,
        };
        let k = kernels(
            dot_iq3xxs_x8_multi_scalar,
            #[cfg(target_arch = "x86_64")]
            crate::kernels::arch::x86_64::iq3xxs_x8_multi,
        );
        check_reference_bits(&layout, &k, 0x3c3c_9e37_0f0f_5a5au64);
    }

    /// Full-scale activations (every Q8_K value of ±127, and the −128 a Q8_K row may hold) and
    /// the largest grid points with every sign: the exact sums' extremes.
    #[test]
    fn iq3xxs_x8_extremes_give_the_scalar_reference_bits() {
        let cols = 512;
        let mut seed = 0x7777_1234_u64;
        let mut w = rows(&mut seed, 8, cols);
        // The grid point with the largest magnitudes.
        let big = (0..256)
            .max_by_key(|&i| {
                IQ3XXS_GRID[i]
                    .to_le_bytes()
                    .iter()
                    .map(|&b| u32::from(b))
                    .sum::<u32>()
            })
            .unwrap() as u8;
        for (i, blk) in w.chunks_exact_mut(IQ3XXS_BLOCK).enumerate() {
            blk[2..66].fill(big);
            for j in 0..8 {
                // All negative, all positive, or mixed; the largest scale.
                let signs: u32 = match (i + j) % 3 {
                    0 => 0x0FFF_FFFF,
                    1 => 0,
                    _ => 0x0AAA_AAAA,
                };
                blk[66 + 4 * j..][..4].copy_from_slice(&(signs | 0xF000_0000).to_le_bytes());
            }
        }
        let p = repack_iq3xxs_x8(&w, 8, cols).unwrap();
        let a = full_scale(&mut seed, cols);
        let rb = cols / QK_K * IQ3XXS_BLOCK;
        for (name, f) in kernels(
            dot_iq3xxs_x8_multi_scalar,
            #[cfg(target_arch = "x86_64")]
            crate::kernels::arch::x86_64::iq3xxs_x8_multi,
        ) {
            let mut out = [[0.0f32; 8]];
            f(&p, &[&a], cols, &mut out);
            for r in 0..8 {
                let want = scalar::vec_dot_iq3_xxs_q8k(&w[r * rb..][..rb], &a, cols);
                assert_eq!(out[0][r].to_bits(), want.to_bits(), "{name} row {r}");
            }
        }
    }

    #[test]
    fn iq3xxs_repack_refuses_ragged_shapes_and_kernels_flag_bad_input() {
        assert!(repack_iq3xxs_x8(&[0; 98 * 7], 7, 256).is_none());
        assert!(repack_iq3xxs_x8(&[0; 98 * 8], 8, 255).is_none());
        assert!(repack_iq3xxs_x8(&[0; 98 * 8 - 1], 8, 256).is_none());
        let mut out = [0.0f32; 8];
        dot_iq3xxs_x8()(&[0; IQ3XXS_X8_BLOCK - 1], &[0; 256 + 4 + 32], 256, &mut out);
        assert!(out.iter().all(|v| v.is_nan()));
        let mut out = vec![[0.0f32; 8]; 2];
        dot_iq3xxs_x8_multi()(&[0; IQ3XXS_X8_BLOCK], &[&[0; 256 + 4 + 32]], 256, &mut out);
        assert!(out.iter().flatten().all(|v| v.is_nan()), "lengths differ");
    }
}
