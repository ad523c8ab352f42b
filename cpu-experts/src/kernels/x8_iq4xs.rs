//! IQ4_XS rows repacked eight at a time: [`super::x8`]'s layout idea for the other 4-bit type
//! of issue #5's decode bars (the one-row kernels reach 69% of the 16-core host's read floor
//! with 16 threads; BENCHMARKS.md). Each sub-block's scale is applied to eight rows per
//! instruction, the 6-bit scales are unpacked once at load, and one 32-byte load feeds eight
//! rows and every token of a pass. [`super::x8::X8Store`] holds these copies beside the Q4_K
//! ones.
//!
//! Layout of one group of 8 rows, per super-block ([`IQ4XS_X8_BLOCK`] = 1104 bytes, 138 per
//! row against IQ4_XS's 136):
//!
//! | bytes | what |
//! |---|---|
//! | `[0, 16)` | `d` of rows 0..8 (f16) |
//! | `[16, 80)` | `ls − 32` of sub-block j, row r at `16 + 8j + r` (i8) |
//! | `[80, 1104)` | codes: bytes `16j + 4k .. + 4` of row r's `qs` at `80 + 128j + 32k + 4r` |
//!
//! so the low nibbles of one 32-byte load are elements `32j + 4k ..` of all eight rows and the
//! high nibbles elements `32j + 16 + 4k ..`, each met by a broadcast of four activation bytes.
//!
//! Numerics: lanes are rows, and each lane does the scalar reference's steps
//! (`scalar::vec_dot_iq4_xs_q8k`: per super-block the exact `sumi = Σ_j (ls_j − 32)·Σ v·a`,
//! then `acc += (d·d_a)·sumi`), so every kernel here gives the scalar reference's bits.

use lagoon_core::quant::QK_K;
use lagoon_core::quant::tables::KVALUES_IQ4NL;

use super::act::Q8KAct;
use super::x8::{DotX8, DotX8Multi};

/// Bytes of one group of 8 rows per super-block.
pub const IQ4XS_X8_BLOCK: usize = 8 * 138;
pub(crate) const IQ4XS_BLOCK: usize = 136;

/// Repacks `rows` IQ4_XS rows of `cols` columns (`w`: the rows' 136-byte super-blocks, row
/// after row) into groups of 8 rows ([`IQ4XS_X8_BLOCK`] bytes per group and super-block,
/// groups in row order). `None` unless `rows` is a multiple of 8, `cols` of 256 and `w`
/// exactly that size.
pub fn repack_iq4xs_x8(w: &[u8], rows: usize, cols: usize) -> Option<Vec<u8>> {
    let nb = cols / QK_K;
    if rows == 0 || !rows.is_multiple_of(8) || nb == 0 || !cols.is_multiple_of(QK_K) {
        return None;
    }
    if w.len() != rows * nb * IQ4XS_BLOCK {
        return None;
    }
    let rb = nb * IQ4XS_BLOCK;
    let mut out = vec![0u8; rows / 8 * nb * IQ4XS_X8_BLOCK];
    for (g, dst) in out.chunks_exact_mut(nb * IQ4XS_X8_BLOCK).enumerate() {
        for (b, o) in dst
            .as_chunks_mut::<IQ4XS_X8_BLOCK>()
            .0
            .iter_mut()
            .enumerate()
        {
            for r in 0..8 {
                let blk: &[u8; IQ4XS_BLOCK] = w[(8 * g + r) * rb + b * IQ4XS_BLOCK..]
                    [..IQ4XS_BLOCK]
                    .try_into()
                    .unwrap();
                o[2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
                for (j, ls) in scales(blk).into_iter().enumerate() {
                    o[16 + 8 * j + r] = ls as u8;
                }
                // Four-byte piece i (= 4j + k) of the codes to bytes 4r.. of 32-byte row i.
                let (rows32, _) = o[80..].as_chunks_mut::<32>();
                for (d, q) in rows32.iter_mut().zip(blk[8..].as_chunks::<4>().0) {
                    d[4 * r..4 * r + 4].copy_from_slice(q);
                }
            }
        }
    }
    Some(out)
}

/// The eight sub-block scales `ls − 32` of one IQ4_XS block (`scales_h:u16 | scales_l[4]`).
fn scales(blk: &[u8; IQ4XS_BLOCK]) -> [i8; 8] {
    let sh = u16::from_le_bytes([blk[2], blk[3]]);
    core::array::from_fn(|j| {
        let low4 = (blk[4 + j / 2] >> (4 * (j % 2))) & 0xF;
        (low4 | (((sh >> (2 * j)) & 3) as u8) << 4) as i8 - 32
    })
}

/// The scalar kernel: each row in the scalar reference's order. NaN in every output when `p`
/// or `a` is not one group of `cols` columns.
pub fn dot_iq4xs_x8_scalar(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
    let nb = cols / QK_K;
    let Some(a) = Q8KAct::new(a, cols).filter(|_| p.len() == nb * IQ4XS_X8_BLOCK) else {
        *out = [f32::NAN; 8];
        return;
    };
    let f16 = super::scalar::f16_at;
    for (r, y) in out.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for (b, o) in p.chunks_exact(IQ4XS_X8_BLOCK).enumerate() {
            let qa = &a.qs[QK_K * b..][..QK_K];
            let mut sumi = 0i32;
            for j in 0..8 {
                let mut s = 0i32;
                for l in 0..16 {
                    let byte = o[80 + 128 * j + 32 * (l / 4) + 4 * r + l % 4];
                    let lo = KVALUES_IQ4NL[usize::from(byte & 0xF)];
                    let hi = KVALUES_IQ4NL[usize::from(byte >> 4)];
                    s += i32::from(lo) * i32::from(qa[32 * j + l])
                        + i32::from(hi) * i32::from(qa[32 * j + 16 + l]);
                }
                sumi += i32::from(o[16 + 8 * j + r] as i8) * s;
            }
            acc += (f16(o, 2 * r) * a.d(b)) * sumi as f32;
        }
        *y = acc;
    }
}

/// [`DotX8Multi`] on the scalar kernel, token by token (NaN everywhere when the lengths of
/// `acts` and `out` differ).
pub fn dot_iq4xs_x8_multi_scalar(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
    super::x8::by_token(dot_iq4xs_x8_scalar, p, acts, cols, out);
}

/// The fastest IQ4_XS [`DotX8Multi`] this CPU runs (`super::x8::x8_pick!`).
pub fn dot_iq4xs_x8_multi() -> DotX8Multi {
    super::x8::x8_pick!(iq4xs_x8_multi, dot_iq4xs_x8_multi_scalar)
}

/// The fastest one-token IQ4_XS [`DotX8`] this CPU runs.
pub fn dot_iq4xs_x8() -> DotX8 {
    super::x8::x8_pick!(iq4xs_x8, dot_iq4xs_x8_scalar)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::scalar;
    use crate::kernels::x8::testing::{Layout, check_reference_bits, kernels, rng};

    /// Random IQ4_XS rows: random codes and scale bits, small positive f16 `d`.
    fn rows(seed: &mut u64, rows: usize, cols: usize) -> Vec<u8> {
        let mut w = vec![0u8; rows * cols / QK_K * IQ4XS_BLOCK];
        for blk in w.chunks_exact_mut(IQ4XS_BLOCK) {
            for b in blk.iter_mut() {
                *b = rng(seed) as u8;
            }
            let d = half::f16::from_f32((rng(seed) % 1000) as f32 * 1e-5 + 1e-6);
            blk[0..2].copy_from_slice(&d.to_le_bytes());
        }
        w
    }

    #[test]
    fn iq4xs_x8_kernels_give_the_scalar_reference_bits() {
        let layout = Layout {
            rows,
            repack: repack_iq4xs_x8,
            reference: scalar::vec_dot_iq4_xs_q8k,
            block: IQ4XS_BLOCK,
            group_block: IQ4XS_X8_BLOCK,
        };
        #[allow(unused_mut)]
        let mut k = kernels(
            dot_iq4xs_x8_multi_scalar,
            #[cfg(target_arch = "x86_64")]
            crate::kernels::arch::x86_64::iq4xs_x8_multi,
        );
        // Both AVX-512 forms, whatever LAGOON_CPU_X8_ZMM says.
        #[cfg(target_arch = "x86_64")]
        k.extend(crate::kernels::arch::x86_64::iq4xs_x8_avx512_multi());
        check_reference_bits(&layout, &k, 0x51ed_27a3_99c1_0f4bu64);
    }

    #[test]
    fn iq4xs_repack_refuses_ragged_shapes_and_kernels_flag_bad_input() {
        assert!(repack_iq4xs_x8(&[0; 136 * 7], 7, 256).is_none());
        assert!(repack_iq4xs_x8(&[0; 136 * 8], 8, 255).is_none());
        assert!(repack_iq4xs_x8(&[0; 136 * 8 - 1], 8, 256).is_none());
        let mut out = [0.0f32; 8];
        dot_iq4xs_x8()(&[0; IQ4XS_X8_BLOCK - 1], &[0; 256 + 4 + 32], 256, &mut out);
        assert!(out.iter().all(|v| v.is_nan()));
        let mut out = vec![[0.0f32; 8]; 2];
        dot_iq4xs_x8_multi()(&[0; IQ4XS_X8_BLOCK], &[&[0; 256 + 4 + 32]], 256, &mut out);
        assert!(out.iter().flatten().all(|v| v.is_nan()), "lengths differ");
    }
}
