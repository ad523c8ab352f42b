//! Q6_K rows repacked eight at a time ([`super::x8`]'s idea for Q4_K_M files' other type:
//! half the expert `down` matrices, `attn_v` and the output): one 32-byte load holds a piece
//! of every row, each 16-element sub-block's scale applies to eight rows per instruction, and
//! the 6-bit quants are regrouped so that no step needs more than masks and shifts.
//!
//! Layout of one group of 8 rows, per super-block ([`Q6K_X8_BLOCK`] = 1680 bytes, 210 per
//! row, as Q6_K's):
//!
//! | bytes | what |
//! |---|---|
//! | `[0, 16)` | `d` of rows 0..8 (f16) |
//! | `[16, 144)` | scale of sub-block j (16 elements), row r at `16 + 8j + r` (i8) |
//! | `[144, 1168)` | low nibbles: sub-block j's 64 bytes at `144 + 64j`, row r's bytes m = 0..4 at `+ 4r` and m = 4..8 at `+ 32 + 4r` |
//! | `[1168, 1680)` | high bit pairs: sub-block j's 32 bytes at `1168 + 32j`, row r's bytes m = 0..4 at `+ 4r` |
//!
//! With `u = q + 32` (0..63) the row's unsigned 6-bit value of element `16j + e`: low-nibble
//! byte m holds `u[m] & 15` (low) and `u[8 + m] & 15` (high); high-pair byte m holds `u[m] >> 4`,
//! `u[4 + m] >> 4`, `u[8 + m] >> 4` and `u[12 + m] >> 4` in bits 0-1, 2-3, 4-5 and 6-7. So three
//! loads give four vectors of four consecutive elements of every row, each met by a broadcast
//! of four activation bytes.
//!
//! Numerics: lanes are rows, and each lane does the scalar reference's steps
//! (`scalar::vec_dot_q6k_q8k`: per super-block the exact `sumi = Σ_j sc_j·Σ q·a`, then
//! `acc += (d_a·d)·sumi` and `acc −= (d_a·0)·0`), so every kernel here gives its bits.

use lagoon_core::quant::QK_K;

use super::act::Q8KAct;
use super::x8::{DotX8, DotX8Multi};

/// Bytes of one group of 8 rows per super-block.
pub const Q6K_X8_BLOCK: usize = 8 * 210;
pub(crate) const Q6K_BLOCK: usize = 210;

/// The unsigned 6-bit values `q + 32` of one Q6_K block's 256 elements (ggml's order).
fn unsigned_quants(blk: &[u8; Q6K_BLOCK]) -> [u8; QK_K] {
    let (ql, qh) = (&blk[..128], &blk[128..192]);
    core::array::from_fn(|i| {
        let (nh, g, l) = (i / 128, (i % 128) / 32, i % 32);
        let v = ql[64 * nh + l + 32 * (g & 1)];
        let lo = if g < 2 { v & 0xF } else { v >> 4 };
        let hi = (qh[32 * nh + l] >> (2 * g)) & 3;
        lo | hi << 4
    })
}

/// Repacks `rows` Q6_K rows of `cols` columns (`w`: the rows' 210-byte super-blocks, row
/// after row) into groups of 8 rows ([`Q6K_X8_BLOCK`] bytes per group and super-block, groups
/// in row order). `None` unless `rows` is a multiple of 8, `cols` of 256 and `w` exactly that
/// size.
pub fn repack_q6k_x8(w: &[u8], rows: usize, cols: usize) -> Option<Vec<u8>> {
    let nb = cols / QK_K;
    if rows == 0 || !rows.is_multiple_of(8) || nb == 0 || !cols.is_multiple_of(QK_K) {
        return None;
    }
    if w.len() != rows * nb * Q6K_BLOCK {
        return None;
    }
    let rb = nb * Q6K_BLOCK;
    let mut out = vec![0u8; rows / 8 * nb * Q6K_X8_BLOCK];
    for (g, dst) in out.chunks_exact_mut(nb * Q6K_X8_BLOCK).enumerate() {
        for (b, o) in dst.as_chunks_mut::<Q6K_X8_BLOCK>().0.iter_mut().enumerate() {
            for r in 0..8 {
                let blk: &[u8; Q6K_BLOCK] = w[(8 * g + r) * rb + b * Q6K_BLOCK..][..Q6K_BLOCK]
                    .try_into()
                    .unwrap();
                o[2 * r..2 * r + 2].copy_from_slice(&blk[208..210]);
                let u = unsigned_quants(blk);
                for j in 0..16 {
                    o[16 + 8 * j + r] = blk[192 + j];
                    let e = &u[16 * j..16 * j + 16];
                    for m in 0..8 {
                        let at = 144 + 64 * j + 32 * (m / 4) + 4 * r + m % 4;
                        o[at] = (e[m] & 0xF) | (e[8 + m] & 0xF) << 4;
                    }
                    for m in 0..4 {
                        o[1168 + 32 * j + 4 * r + m] = (e[m] >> 4)
                            | (e[4 + m] >> 4) << 2
                            | (e[8 + m] >> 4) << 4
                            | (e[12 + m] >> 4) << 6;
                    }
                }
            }
        }
    }
    Some(out)
}

/// Row r's unsigned value of element `16j + e` in a repacked super-block `o`.
fn unsigned_at(o: &[u8], r: usize, j: usize, e: usize) -> u8 {
    let (m, hi_nib) = (e % 8, e >= 8);
    let lo_byte = o[144 + 64 * j + 32 * (m / 4) + 4 * r + m % 4];
    let lo = if hi_nib { lo_byte >> 4 } else { lo_byte & 0xF };
    let h = o[1168 + 32 * j + 4 * r + e % 4];
    lo | ((h >> (2 * (e / 4))) & 3) << 4
}

/// The scalar kernel: each row in the scalar reference's order. NaN in every output when `p`
/// or `a` is not one group of `cols` columns.
pub fn dot_q6k_x8_scalar(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
    let nb = cols / QK_K;
    let Some(a) = Q8KAct::new(a, cols).filter(|_| p.len() == nb * Q6K_X8_BLOCK) else {
        *out = [f32::NAN; 8];
        return;
    };
    let f16 = super::scalar::f16_at;
    for (r, y) in out.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for (b, o) in p.chunks_exact(Q6K_X8_BLOCK).enumerate() {
            let qa = &a.qs[QK_K * b..][..QK_K];
            let mut sumi = 0i32;
            for j in 0..16 {
                let s: i32 = (0..16)
                    .map(|e| (i32::from(unsigned_at(o, r, j, e)) - 32) * i32::from(qa[16 * j + e]))
                    .sum();
                sumi += i32::from(o[16 + 8 * j + r] as i8) * s;
            }
            let da = a.d(b);
            acc += (da * f16(o, 2 * r)) * sumi as f32;
            acc -= (da * 0.0) * 0.0;
        }
        *y = acc;
    }
}

/// [`DotX8Multi`] on the scalar kernel, token by token (NaN everywhere when the lengths of
/// `acts` and `out` differ).
pub fn dot_q6k_x8_multi_scalar(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
    super::x8::by_token(dot_q6k_x8_scalar, p, acts, cols, out);
}

/// The fastest Q6_K [`DotX8Multi`] this CPU runs (`super::x8::x8_pick!`).
pub fn dot_q6k_x8_multi() -> DotX8Multi {
    super::x8::x8_pick!(q6k_x8_multi, dot_q6k_x8_multi_scalar)
}

/// The fastest one-token Q6_K [`DotX8`] this CPU runs.
pub fn dot_q6k_x8() -> DotX8 {
    super::x8::x8_pick!(q6k_x8, dot_q6k_x8_scalar)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::scalar;
    use crate::kernels::x8::testing::{Layout, check_reference_bits, kernels, rng};

    /// Random Q6_K rows: random quants and scales, small positive f16 `d`.
    fn rows(seed: &mut u64, rows: usize, cols: usize) -> Vec<u8> {
        let mut w = vec![0u8; rows * cols / QK_K * Q6K_BLOCK];
        for blk in w.chunks_exact_mut(Q6K_BLOCK) {
            for b in blk.iter_mut() {
                *b = rng(seed) as u8;
            }
            let d = half::f16::from_f32((rng(seed) % 1000) as f32 * 1e-5 + 1e-6);
            blk[208..210].copy_from_slice(&d.to_le_bytes());
        }
        w
    }

    #[test]
    fn q6k_x8_kernels_give_the_scalar_reference_bits() {
        let layout = Layout {
            rows,
            repack: repack_q6k_x8,
            reference: scalar::vec_dot_q6k_q8k,
            block: Q6K_BLOCK,
            group_block: Q6K_X8_BLOCK,
        };
        check_reference_bits(
            &layout,
            &kernels(
                dot_q6k_x8_multi_scalar,
                #[cfg(target_arch = "x86_64")]
                crate::kernels::arch::x86_64::q6k_x8_multi,
            ),
            0x6a09_e667_f3bc_c909u64,
        );
    }

    #[test]
    fn q6k_repack_refuses_ragged_shapes_and_kernels_flag_bad_input() {
        assert!(repack_q6k_x8(&[0; 210 * 7], 7, 256).is_none());
        assert!(repack_q6k_x8(&[0; 210 * 8], 8, 255).is_none());
        assert!(repack_q6k_x8(&[0; 210 * 8 - 1], 8, 256).is_none());
        let mut out = [0.0f32; 8];
        dot_q6k_x8()(&[0; Q6K_X8_BLOCK - 1], &[0; 256 + 4 + 32], 256, &mut out);
        assert!(out.iter().all(|v| v.is_nan()));
        let mut out = vec![[0.0f32; 8]; 2];
        dot_q6k_x8_multi()(&[0; Q6K_X8_BLOCK], &[&[0; 256 + 4 + 32]], 256, &mut out);
        assert!(out.iter().flatten().all(|v| v.is_nan()), "lengths differ");
    }
}
