//! IQ2_XXS rows repacked eight at a time, for the 512-bit grid kernel
//! (`arch::x86_64::avx512::iq2x8z`): [`super::x8_iq3xxs`]'s construction for the 2-bit grid.
//! IQ2_XXS had only one-row kernels, one token at a time: an XS.2 8-layer IQ2_M-like file
//! (IQ2_XXS expert gate/up) spent 66% of its prefill in the experts at ~40 GFLOP/s a thread,
//! and its pp512 sat at 0.98x llama.cpp's on the 2-core Zen 4 VM (BENCHMARKS.md, session 42).
//! Eight rows per register let each grid lookup, sign mask and scale serve eight rows, and a
//! pass serves up to four tokens.
//!
//! Layout of one group of 8 rows, per super-block ([`IQ2XXS_X8_BLOCK`] = 528 bytes, 66 per row
//! as in IQ2_XXS itself: the bytes are only moved):
//!
//! | bytes | what |
//! |---|---|
//! | `[0, 16)` | `d` of rows 0..8 (f16) |
//! | `[16, 272)` | grid indices: row r's four of sub-block `2q` at `16 + 64q + 8r`, of `2q + 1` at `+ 4` |
//! | `[272, 528)` | sign-and-scale words: row r's `u32` of sub-block `2q` at `272 + 64q + 8r`, of `2q + 1` at `+ 4` |
//!
//! so one 64-byte load holds the indices (or the sign-and-scale words) of a pair of
//! sub-blocks of all eight rows, a row per 64-bit lane: byte `8r + 4s + l` is point l (8
//! weights) of sub-block `2q + s`.
//!
//! Numerics: each row's `Σ_j (2·(w_j >> 28) + 1)·Σ ±g·a` is exact, then the scalar
//! reference's f32 steps (`scalar::vec_dot_iq2_xxs_q8k`: `acc += (d·d_a)·sumi` per
//! super-block, `0.125·acc` at the end), so every kernel here gives its bits.

use lagoon_core::quant::QK_K;
use lagoon_core::quant::tables::{IQ2XXS_GRID, KSIGNS_IQ2XS};

use super::act::Q8KAct;
use super::x8::{DotX8, DotX8Multi};

/// Bytes of one group of 8 rows per super-block.
pub const IQ2XXS_X8_BLOCK: usize = 8 * 66;
pub(crate) const IQ2XXS_BLOCK: usize = 66;

/// Where row r's grid indices of sub-block `j` start in a group's super-block.
const fn idx_at(r: usize, j: usize) -> usize {
    16 + 64 * (j / 2) + 8 * r + 4 * (j % 2)
}

/// Where row r's sign-and-scale word of sub-block `j` starts.
const fn aux_at(r: usize, j: usize) -> usize {
    272 + 64 * (j / 2) + 8 * r + 4 * (j % 2)
}

/// Repacks `rows` IQ2_XXS rows of `cols` columns (`w`: the rows' 66-byte super-blocks, row
/// after row) into groups of 8 rows ([`IQ2XXS_X8_BLOCK`] bytes per group and super-block,
/// groups in row order). `None` unless `rows` is a multiple of 8, `cols` of 256 and `w`
/// exactly that size.
pub fn repack_iq2xxs_x8(w: &[u8], rows: usize, cols: usize) -> Option<Vec<u8>> {
    let nb = cols / QK_K;
    if rows == 0 || !rows.is_multiple_of(8) || nb == 0 || !cols.is_multiple_of(QK_K) {
        return None;
    }
    if w.len() != rows * nb * IQ2XXS_BLOCK {
        return None;
    }
    let rb = nb * IQ2XXS_BLOCK;
    let mut out = vec![0u8; rows / 8 * nb * IQ2XXS_X8_BLOCK];
    for (g, dst) in out.chunks_exact_mut(nb * IQ2XXS_X8_BLOCK).enumerate() {
        for (b, o) in dst
            .as_chunks_mut::<IQ2XXS_X8_BLOCK>()
            .0
            .iter_mut()
            .enumerate()
        {
            for r in 0..8 {
                let blk = &w[(8 * g + r) * rb + b * IQ2XXS_BLOCK..][..IQ2XXS_BLOCK];
                o[2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
                for j in 0..8 {
                    o[idx_at(r, j)..][..4].copy_from_slice(&blk[2 + 8 * j..][..4]);
                    o[aux_at(r, j)..][..4].copy_from_slice(&blk[6 + 8 * j..][..4]);
                }
            }
        }
    }
    Some(out)
}

/// The scalar kernel: each row in the scalar reference's order. NaN in every output when `p`
/// or `a` is not one group of `cols` columns.
pub fn dot_iq2xxs_x8_scalar(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
    let nb = cols / QK_K;
    let Some(a) = Q8KAct::new(a, cols).filter(|_| p.len() == nb * IQ2XXS_X8_BLOCK) else {
        *out = [f32::NAN; 8];
        return;
    };
    let f16 = super::scalar::f16_at;
    for (r, y) in out.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for (b, o) in p.chunks_exact(IQ2XXS_X8_BLOCK).enumerate() {
            let qa = &a.qs[QK_K * b..][..QK_K];
            let mut sumi = 0i32;
            for j in 0..8 {
                let at = aux_at(r, j);
                let aw = u32::from_le_bytes([o[at], o[at + 1], o[at + 2], o[at + 3]]);
                let mut s = 0i32;
                for l in 0..4 {
                    let g = IQ2XXS_GRID[usize::from(o[idx_at(r, j) + l])].to_le_bytes();
                    let signs = KSIGNS_IQ2XS[((aw >> (7 * l)) & 127) as usize];
                    for (k, &gk) in g.iter().enumerate() {
                        let p = i32::from(gk) * i32::from(qa[32 * j + 8 * l + k]);
                        s += if (signs >> k) & 1 != 0 { -p } else { p };
                    }
                }
                sumi += (2 * (aw >> 28) + 1) as i32 * s;
            }
            acc += (f16(o, 2 * r) * a.d(b)) * sumi as f32;
        }
        *y = 0.125 * acc;
    }
}

/// [`DotX8Multi`] on the scalar kernel, token by token (NaN everywhere when the lengths of
/// `acts` and `out` differ).
pub fn dot_iq2xxs_x8_multi_scalar(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
    super::x8::by_token(dot_iq2xxs_x8_scalar, p, acts, cols, out);
}

/// The fastest IQ2_XXS [`DotX8Multi`] this CPU runs (`super::x8::x8_pick!`).
pub fn dot_iq2xxs_x8_multi() -> DotX8Multi {
    super::x8::x8_pick!(iq2xxs_x8_multi, dot_iq2xxs_x8_multi_scalar)
}

/// The fastest one-token IQ2_XXS [`DotX8`] this CPU runs.
pub fn dot_iq2xxs_x8() -> DotX8 {
    super::x8::x8_pick!(iq2xxs_x8, dot_iq2xxs_x8_scalar)
}

/// Whether this CPU runs the vector kernel (AVX512-VNNI with VBMI, BITALG and GFNI, and
/// `LAGOON_FORCE_AVX2` unset): the store repacks IQ2_XXS only then, as IQ3_XXS.
pub fn simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::kernels::arch::x86_64::iq2xxs_x8(!super::x8::no_avx512()).is_some();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::scalar;
    use crate::kernels::x8::testing::{Layout, check_reference_bits, full_scale, kernels, rng};

    /// Random IQ2_XXS rows: random indices, signs and scales, small positive f16 `d`.
    fn rows(seed: &mut u64, rows: usize, cols: usize) -> Vec<u8> {
        let mut w = vec![0u8; rows * cols / QK_K * IQ2XXS_BLOCK];
        for blk in w.chunks_exact_mut(IQ2XXS_BLOCK) {
            for b in blk.iter_mut() {
                *b = rng(seed) as u8;
            }
            let d = half::f16::from_f32((rng(seed) % 1000) as f32 * 1e-5 + 1e-6);
            blk[0..2].copy_from_slice(&d.to_le_bytes());
        }
        w
    }

    #[test]
    fn iq2xxs_x8_kernels_give_the_scalar_reference_bits() {
        let layout = Layout {
            rows,
            repack: repack_iq2xxs_x8,
            reference: scalar::vec_dot_iq2_xxs_q8k,
            block: IQ2XXS_BLOCK,
            group_block: IQ2XXS_X8_BLOCK,
        };
        let k = kernels(
            dot_iq2xxs_x8_multi_scalar,
            #[cfg(target_arch = "x86_64")]
            crate::kernels::arch::x86_64::iq2xxs_x8_multi,
        );
        check_reference_bits(&layout, &k, 0x2c2c_9e37_0f0f_5a5au64);
    }

    /// Full-scale activations (every Q8_K value of ±127, and the −128 a Q8_K row may hold) and
    /// the largest grid points with every sign and the largest scale: the exact sums' extremes.
    #[test]
    fn iq2xxs_x8_extremes_give_the_scalar_reference_bits() {
        let cols = 512;
        let mut seed = 0x2222_1234_u64;
        let mut w = rows(&mut seed, 8, cols);
        let big = (0..256)
            .max_by_key(|&i| {
                IQ2XXS_GRID[i]
                    .to_le_bytes()
                    .iter()
                    .map(|&b| u32::from(b))
                    .sum::<u32>()
            })
            .unwrap() as u8;
        for (i, blk) in w.chunks_exact_mut(IQ2XXS_BLOCK).enumerate() {
            for j in 0..8 {
                blk[2 + 8 * j..][..4].fill(big);
                let signs: u32 = match (i + j) % 3 {
                    0 => 0x0FFF_FFFF,
                    1 => 0,
                    _ => 0x0AAA_AAAA,
                };
                blk[6 + 8 * j..][..4].copy_from_slice(&(signs | 0xF000_0000).to_le_bytes());
            }
        }
        let p = repack_iq2xxs_x8(&w, 8, cols).unwrap();
        let a = full_scale(&mut seed, cols);
        let rb = cols / QK_K * IQ2XXS_BLOCK;
        for (name, f) in kernels(
            dot_iq2xxs_x8_multi_scalar,
            #[cfg(target_arch = "x86_64")]
            crate::kernels::arch::x86_64::iq2xxs_x8_multi,
        ) {
            let mut out = [[0.0f32; 8]];
            f(&p, &[&a], cols, &mut out);
            for r in 0..8 {
                let want = scalar::vec_dot_iq2_xxs_q8k(&w[r * rb..][..rb], &a, cols);
                assert_eq!(out[0][r].to_bits(), want.to_bits(), "{name} row {r}");
            }
        }
    }

    #[test]
    fn iq2xxs_repack_refuses_ragged_shapes_and_kernels_flag_bad_input() {
        assert!(repack_iq2xxs_x8(&[0; 66 * 7], 7, 256).is_none());
        assert!(repack_iq2xxs_x8(&[0; 66 * 8], 8, 255).is_none());
        assert!(repack_iq2xxs_x8(&[0; 66 * 8 - 1], 8, 256).is_none());
        let mut out = [0.0f32; 8];
        dot_iq2xxs_x8()(&[0; IQ2XXS_X8_BLOCK - 1], &[0; 256 + 4 + 32], 256, &mut out);
        assert!(out.iter().all(|v| v.is_nan()));
        let mut out = vec![[0.0f32; 8]; 2];
        dot_iq2xxs_x8_multi()(&[0; IQ2XXS_X8_BLOCK], &[&[0; 256 + 4 + 32]], 256, &mut out);
        assert!(out.iter().flatten().all(|v| v.is_nan()), "lengths differ");
    }
}
