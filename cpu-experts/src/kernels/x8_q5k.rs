//! Q5_K rows repacked eight at a time: [`super::x8`]'s Q4_K layout with the fifth bits beside
//! it. Q5_K had no 8-row form, so its prefill ran on the table's several-token kernel at ~60
//! GFLOP/s a thread on the Zen 4 VM against 200–250 for the types the store holds
//! (BENCHMARKS.md, session 41), and llama.cpp's IQ4_XS and Q5_K_M mixes keep `attn_v` or whole
//! models in Q5_K.
//!
//! Layout of one group of 8 rows, per super-block ([`Q5K_X8_BLOCK`] = 1440 bytes, 180 per row
//! against Q5_K's 176): `[0, 1184)` is [`super::x8`]'s Q4_K layout of the rows' `d`, `dmin`,
//! unpacked 6-bit scales and mins and 4-bit `qs`, then
//!
//! | bytes | what |
//! |---|---|
//! | `[1184, 1440)` | `qh`: bytes `4k .. 4k + 4` of row r's `qh` at `1184 + 32k + 4r` |
//!
//! so the `qh` load of step k serves all four 64-element chunks c of the super-block: bit 2c of
//! `qh[l]` is the fifth bit of element `64c + l` (the low nibble's), bit 2c + 1 of element
//! `64c + 32 + l` (the high nibble's).
//!
//! Numerics: lanes are rows, each doing the scalar reference's per-super-block steps
//! (`scalar::vec_dot_q5k_q8k`: exact `sumi` and `summ`, then `acc += (d_a·d)·sumi; acc −=
//! (d_a·dmin)·summ`, no FMA), so every kernel here gives its bits.

use lagoon_core::quant::QK_K;

use super::x8::{DotX8, DotX8Multi, Q4K_X8_BLOCK};

/// Bytes of one group of 8 rows per super-block.
pub const Q5K_X8_BLOCK: usize = 8 * 180;
pub(crate) const Q5K_BLOCK: usize = 176;

/// Repacks `rows` Q5_K rows of `cols` columns (`w`: the rows' 176-byte super-blocks, row after
/// row) into groups of 8 rows ([`Q5K_X8_BLOCK`] bytes per group and super-block). `None`
/// unless `rows` is a multiple of 8, `cols` of 256 and `w` exactly that size.
pub fn repack_q5k_x8(w: &[u8], rows: usize, cols: usize) -> Option<Vec<u8>> {
    let nb = cols / QK_K;
    if rows == 0 || !rows.is_multiple_of(8) || nb == 0 || !cols.is_multiple_of(QK_K) {
        return None;
    }
    if w.len() != rows * nb * Q5K_BLOCK {
        return None;
    }
    let rb = nb * Q5K_BLOCK;
    let mut out = vec![0u8; rows / 8 * nb * Q5K_X8_BLOCK];
    for (g, dst) in out.chunks_exact_mut(nb * Q5K_X8_BLOCK).enumerate() {
        for (b, o) in dst.as_chunks_mut::<Q5K_X8_BLOCK>().0.iter_mut().enumerate() {
            for r in 0..8 {
                let blk: &[u8; Q5K_BLOCK] = w[(8 * g + r) * rb + b * Q5K_BLOCK..][..Q5K_BLOCK]
                    .try_into()
                    .unwrap();
                let qh = &blk[16..48];
                super::x8::pack_q4k_row(o, r, &blk[..16], &blk[48..176]);
                let (hrows, _) = o[Q4K_X8_BLOCK..].as_chunks_mut::<32>();
                for (d, h) in hrows.iter_mut().zip(qh.as_chunks::<4>().0) {
                    d[4 * r..4 * r + 4].copy_from_slice(h);
                }
            }
        }
    }
    Some(out)
}

/// The scalar kernel: each row in the scalar reference's order. NaN in every output when `p`
/// or `a` is not one group of `cols` columns.
pub fn dot_q5k_x8_scalar(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
    super::x8::k_x8_scalar::<Q5K_X8_BLOCK>(p, a, cols, out, true);
}

/// [`DotX8Multi`] on the scalar kernel, token by token (NaN everywhere when the lengths of
/// `acts` and `out` differ).
pub fn dot_q5k_x8_multi_scalar(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
    super::x8::by_token(dot_q5k_x8_scalar, p, acts, cols, out);
}

/// The fastest Q5_K [`DotX8Multi`] this CPU runs (`super::x8::x8_pick!`): the 512-bit VNNI
/// kernel (`avx512::k5x8z`) where there is one (no AVX2 form: the store repacks Q5_K only
/// where [`simd`] says there is a vector kernel).
pub fn dot_q5k_x8_multi() -> DotX8Multi {
    super::x8::x8_pick!(q5k_x8_multi, dot_q5k_x8_multi_scalar)
}

/// The fastest one-token Q5_K [`DotX8`] this CPU runs.
pub fn dot_q5k_x8() -> DotX8 {
    super::x8::x8_pick!(q5k_x8, dot_q5k_x8_scalar)
}

/// Whether this CPU runs a vector Q5_K 8-row kernel (unless `LAGOON_FORCE_AVX2=1` keeps
/// AVX-512 out).
pub fn simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::kernels::arch::x86_64::q5k_x8(!super::x8::no_avx512()).is_some();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::scalar;
    use crate::kernels::x8::testing::{Layout, check_reference_bits, kernels, rng};

    /// Random Q5_K rows with finite f16 scales (`dmin` sometimes zero) and random bytes.
    fn rows(seed: &mut u64, rows: usize, cols: usize) -> Vec<u8> {
        let mut w = vec![0u8; rows * cols / QK_K * Q5K_BLOCK];
        for blk in w.chunks_exact_mut(Q5K_BLOCK) {
            for b in blk.iter_mut() {
                *b = rng(seed) as u8;
            }
            let d = half::f16::from_f32((rng(seed) % 1000) as f32 * 1e-5 + 1e-6);
            let m = half::f16::from_f32((rng(seed) % 4) as f32 * 1e-3);
            blk[0..2].copy_from_slice(&d.to_le_bytes());
            blk[2..4].copy_from_slice(&m.to_le_bytes());
        }
        w
    }

    #[test]
    fn q5k_x8_kernels_give_the_scalar_reference_bits() {
        let layout = Layout {
            rows,
            repack: repack_q5k_x8,
            reference: scalar::vec_dot_q5k_q8k,
            block: Q5K_BLOCK,
            group_block: Q5K_X8_BLOCK,
        };
        let k = kernels(
            dot_q5k_x8_multi_scalar,
            #[cfg(target_arch = "x86_64")]
            crate::kernels::arch::x86_64::q5k_x8_multi,
        );
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            k.len() == 2,
            crate::kernels::arch::x86_64::avx512_table().is_some(),
            "the 512-bit kernel is tested wherever the CPU runs it"
        );
        check_reference_bits(&layout, &k, 0x55aa_1357_9bdf_2468u64);
        // Every nibble and fifth bit set (values of 31) against the extreme activations.
        let full = Layout {
            rows: |seed, n, cols| {
                let mut w = rows(seed, n, cols);
                for blk in w.chunks_exact_mut(Q5K_BLOCK) {
                    blk[16..].fill(0xFF);
                }
                w
            },
            ..layout
        };
        check_reference_bits(&full, &k, 0x2468_9bdf_1357_55aau64);
        // The one-token entry point gives the several-token one's bits.
        let mut seed = 0x0505_0505_1234_u64;
        let (n_rows, cols) = (8, 1024);
        let w = rows(&mut seed, n_rows, cols);
        let p = repack_q5k_x8(&w, n_rows, cols).unwrap();
        let a = crate::kernels::x8::testing::act(&mut seed, cols, 1.0);
        let mut one = [0.0f32; 8];
        dot_q5k_x8()(&p, &a, cols, &mut one);
        let mut multi = [[0.0f32; 8]];
        dot_q5k_x8_multi()(&p, &[&a], cols, &mut multi);
        assert_eq!(one.map(f32::to_bits), multi[0].map(f32::to_bits));
    }

    #[test]
    fn q5k_repack_refuses_ragged_shapes_and_kernels_flag_bad_input() {
        assert!(repack_q5k_x8(&[0; 176 * 7], 7, 256).is_none());
        assert!(repack_q5k_x8(&[0; 176 * 8], 8, 255).is_none());
        assert!(repack_q5k_x8(&[0; 176 * 8 - 1], 8, 256).is_none());
        let mut out = [0.0f32; 8];
        dot_q5k_x8()(&[0; Q5K_X8_BLOCK - 1], &[0; 256 + 4 + 32], 256, &mut out);
        assert!(out.iter().all(|v| v.is_nan()));
        let mut out = vec![[0.0f32; 8]; 2];
        dot_q5k_x8_multi()(&[0; Q5K_X8_BLOCK], &[&[0; 256 + 4 + 32]], 256, &mut out);
        assert!(out.iter().flatten().all(|v| v.is_nan()), "lengths differ");
    }
}
