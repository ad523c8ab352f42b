//! Q2_K and Q3_K rows repacked eight at a time, for the 512-bit VNNI kernel
//! (`arch::x86_64::avx512::k23x8z`). Both types had only the AVX2 one-row kernels: XS.2
//! 8-layer Q2_K and Q3_K_M files prefilled at 0.69x / 0.83x llama.cpp's rate on the 2-core Zen
//! 4 VM (BENCHMARKS.md, session 42), their attention projections alone at ~85 GFLOP/s a thread
//! against ~220 for the types the store holds.
//!
//! Both types store element `128n + 32g + l` (half n, plane g, l < 32) in bits `2g, 2g + 1` of
//! `qs[32n + l]`, sub-block `8n + 2g + l / 16` of 16 elements; Q3_K's third bit is bit
//! `4n + g` of `hmask[l]`. Layout of one group of 8 rows, per super-block (Q2_K:
//! [`Q2K_X8_BLOCK`] = 672 bytes, 84 per row as in Q2_K; Q3_K: [`Q3K_X8_BLOCK`] = 912, 114 per
//! row against 110, its scales unpacked):
//!
//! | Q2_K bytes | Q3_K bytes | what |
//! |---|---|---|
//! | `[0, 16)` | `[0, 16)` | `d` of rows 0..8 (f16) |
//! | `[16, 32)` | — | `dmin` of rows 0..8 (f16) |
//! | `[32, 160)` | `[16, 144)` | sub-block j's scale byte of row r at `8j + r` (Q2_K: the stored byte, scale low nibble and min high; Q3_K: the 6-bit scale minus 32, i8) |
//! | `[160, 672)` | `[144, 656)` | `qs`: load `i = 4n + 2h + k` (64 bytes) holds row r's `qs[32n + 16h + 8k ..+ 8]` at `8r` |
//! | — | `[656, 912)` | `hmask`: line `2h + k` holds row r's `hmask[16h + 8k ..+ 8]` at `8r` |
//!
//! so one 64-byte load holds eight bytes of each row: its four 2-bit planes g are elements
//! `128n + 32g + 16h + 8k ..+ 8` of the eight rows, each met by one 8-byte activation
//! broadcast (no permute), and the `hmask` line of (h, k) serves both halves.
//!
//! Numerics: lanes are rows, each doing the scalar reference's per-super-block steps
//! (`scalar::vec_dot_q2k_q8k` / `vec_dot_q3k_q8k`, its `k_dot`: exact `sumi` and `summ`, then
//! `acc += (d_a·d)·sumi; acc −= (d_a·dmin)·summ`, Q3_K with `dmin` and `summ` zero), so every
//! kernel here gives its bits.

use lagoon_core::quant::QK_K;

use super::act::Q8KAct;
use super::x8::{DotX8, DotX8Multi};

/// Bytes of one group of 8 Q2_K rows per super-block.
pub const Q2K_X8_BLOCK: usize = 8 * 84;
/// Bytes of one group of 8 Q3_K rows per super-block.
pub const Q3K_X8_BLOCK: usize = 8 * 114;
pub(crate) const Q2K_BLOCK: usize = 84;
pub(crate) const Q3K_BLOCK: usize = 110;

/// Where the scale bytes, `qs` and (Q3_K) `hmask` start in a group's super-block.
pub(crate) const fn offsets(q3: bool) -> (usize, usize, usize) {
    if q3 { (16, 144, 656) } else { (32, 160, 672) }
}

/// Repacks `rows` Q2_K (`q3` false) or Q3_K rows of `cols` columns into groups of 8 rows.
/// `None` unless `rows` is a multiple of 8, `cols` of 256 and `w` exactly that size.
fn repack(w: &[u8], rows: usize, cols: usize, q3: bool) -> Option<Vec<u8>> {
    let (bs, gs) = if q3 {
        (Q3K_BLOCK, Q3K_X8_BLOCK)
    } else {
        (Q2K_BLOCK, Q2K_X8_BLOCK)
    };
    let nb = cols / QK_K;
    if rows == 0 || !rows.is_multiple_of(8) || nb == 0 || !cols.is_multiple_of(QK_K) {
        return None;
    }
    if w.len() != rows * nb * bs {
        return None;
    }
    let (sc_at, qs_at, hm_at) = offsets(q3);
    let rb = nb * bs;
    let mut out = vec![0u8; rows / 8 * nb * gs];
    for (g, dst) in out.chunks_exact_mut(nb * gs).enumerate() {
        for (b, o) in dst.chunks_exact_mut(gs).enumerate() {
            for r in 0..8 {
                let blk = &w[(8 * g + r) * rb + b * bs..][..bs];
                let (qs, sc): (&[u8], [u8; 16]) = if q3 {
                    o[2 * r..2 * r + 2].copy_from_slice(&blk[108..110]);
                    let s = super::scalar::q3k_scales(&blk[96..108]).map(|v| v as u8);
                    for (i, hm) in blk[..32].chunks_exact(8).enumerate() {
                        o[hm_at + 64 * i + 8 * r..][..8].copy_from_slice(hm);
                    }
                    (&blk[32..96], s)
                } else {
                    o[2 * r..2 * r + 2].copy_from_slice(&blk[80..82]);
                    o[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&blk[82..84]);
                    (&blk[16..80], blk[..16].try_into().unwrap())
                };
                for (j, &s) in sc.iter().enumerate() {
                    o[sc_at + 8 * j + r] = s;
                }
                // Row bytes 8i.. (i = 4n + 2h + k) to load i.
                for (i, q) in qs.chunks_exact(8).enumerate() {
                    o[qs_at + 64 * i + 8 * r..][..8].copy_from_slice(q);
                }
            }
        }
    }
    Some(out)
}

/// Repacks Q2_K rows ([`Q2K_X8_BLOCK`] bytes per group and super-block).
pub fn repack_q2k_x8(w: &[u8], rows: usize, cols: usize) -> Option<Vec<u8>> {
    repack(w, rows, cols, false)
}

/// Repacks Q3_K rows ([`Q3K_X8_BLOCK`] bytes per group and super-block).
pub fn repack_q3k_x8(w: &[u8], rows: usize, cols: usize) -> Option<Vec<u8>> {
    repack(w, rows, cols, true)
}

/// The scalar kernel over either layout: each row in the scalar reference's order. NaN in
/// every output when `p` or `a` is not one group of `cols` columns.
fn dot_scalar(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8], q3: bool) {
    let gs = if q3 { Q3K_X8_BLOCK } else { Q2K_X8_BLOCK };
    let nb = cols / QK_K;
    let Some(a) = Q8KAct::new(a, cols).filter(|_| p.len() == nb * gs) else {
        *out = [f32::NAN; 8];
        return;
    };
    let (sc_at, qs_at, hm_at) = offsets(q3);
    let f16 = super::scalar::f16_at;
    for (r, y) in out.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for (b, o) in p.chunks_exact(gs).enumerate() {
            let qa = &a.qs[QK_K * b..][..QK_K];
            let (mut sumi, mut summ) = (0i32, 0i32);
            for j in 0..16 {
                let (n, g, h) = (j / 8, (j % 8) / 2, j % 2);
                let s = o[sc_at + 8 * j + r];
                let mut dot = 0i32;
                for l in 16 * h..16 * h + 16 {
                    let byte = o[qs_at + 64 * (4 * n + l / 8) + 8 * r + l % 8];
                    let mut q = i32::from((byte >> (2 * g)) & 3);
                    if q3 {
                        let hm = o[hm_at + 64 * (l / 8) + 8 * r + l % 8];
                        q -= if hm & (1 << (4 * n + g)) != 0 { 0 } else { 4 };
                    }
                    dot += q * i32::from(qa[128 * n + 32 * g + l]);
                }
                if q3 {
                    sumi += i32::from(s as i8) * dot;
                } else {
                    sumi += i32::from(s & 0xF) * dot;
                    summ += i32::from(s >> 4) * i32::from(a.bsum(b, j));
                }
            }
            let da = a.d(b);
            let (d, dmin) = if q3 {
                (f16(o, 2 * r), 0.0)
            } else {
                (f16(o, 2 * r), f16(o, 16 + 2 * r))
            };
            acc += (da * d) * sumi as f32;
            acc -= (da * dmin) * summ as f32;
        }
        *y = acc;
    }
}

/// The scalar Q2_K 8-row kernel.
pub fn dot_q2k_x8_scalar(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
    dot_scalar(p, a, cols, out, false);
}

/// The scalar Q3_K 8-row kernel.
pub fn dot_q3k_x8_scalar(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
    dot_scalar(p, a, cols, out, true);
}

/// [`DotX8Multi`] on the scalar Q2_K kernel, token by token.
pub fn dot_q2k_x8_multi_scalar(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
    super::x8::by_token(dot_q2k_x8_scalar, p, acts, cols, out);
}

/// [`DotX8Multi`] on the scalar Q3_K kernel, token by token.
pub fn dot_q3k_x8_multi_scalar(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
    super::x8::by_token(dot_q3k_x8_scalar, p, acts, cols, out);
}

/// The fastest Q2_K [`DotX8Multi`] this CPU runs: the 512-bit VNNI kernel where there is one
/// (no AVX2 form: the store repacks Q2_K only where [`simd`] says there is a vector kernel).
pub fn dot_q2k_x8_multi() -> DotX8Multi {
    super::x8::x8_pick!(q2k_x8_multi, dot_q2k_x8_multi_scalar)
}

/// The fastest Q3_K [`DotX8Multi`] this CPU runs (as [`dot_q2k_x8_multi`]).
pub fn dot_q3k_x8_multi() -> DotX8Multi {
    super::x8::x8_pick!(q3k_x8_multi, dot_q3k_x8_multi_scalar)
}

/// The fastest one-token Q2_K [`DotX8`] this CPU runs.
pub fn dot_q2k_x8() -> DotX8 {
    super::x8::x8_pick!(q2k_x8, dot_q2k_x8_scalar)
}

/// The fastest one-token Q3_K [`DotX8`] this CPU runs.
pub fn dot_q3k_x8() -> DotX8 {
    super::x8::x8_pick!(q3k_x8, dot_q3k_x8_scalar)
}

/// Whether this CPU runs the vector Q2_K / Q3_K 8-row kernels (AVX512-VNNI, and
/// `LAGOON_FORCE_AVX2` unset).
pub fn simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::kernels::arch::x86_64::q2k_x8(!super::x8::no_avx512()).is_some();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::scalar;
    use crate::kernels::x8::testing::{Layout, check_reference_bits, kernels, rng};

    /// Random Q2_K (`q3` false) or Q3_K rows: random bytes, finite small f16 `d` (Q2_K's
    /// `dmin` sometimes zero).
    fn rows_of(seed: &mut u64, rows: usize, cols: usize, q3: bool) -> Vec<u8> {
        let bs = if q3 { Q3K_BLOCK } else { Q2K_BLOCK };
        let mut w = vec![0u8; rows * cols / QK_K * bs];
        for blk in w.chunks_exact_mut(bs) {
            for b in blk.iter_mut() {
                *b = rng(seed) as u8;
            }
            let d = half::f16::from_f32((rng(seed) % 1000) as f32 * 1e-5 + 1e-6);
            let m = half::f16::from_f32((rng(seed) % 4) as f32 * 1e-3);
            if q3 {
                blk[108..110].copy_from_slice(&d.to_le_bytes());
            } else {
                blk[80..82].copy_from_slice(&d.to_le_bytes());
                blk[82..84].copy_from_slice(&m.to_le_bytes());
            }
        }
        w
    }

    #[test]
    fn q2k_x8_kernels_give_the_scalar_reference_bits() {
        let layout = Layout {
            rows: |s, n, c| rows_of(s, n, c, false),
            repack: repack_q2k_x8,
            reference: scalar::vec_dot_q2k_q8k,
            block: Q2K_BLOCK,
            group_block: Q2K_X8_BLOCK,
        };
        let k = kernels(
            dot_q2k_x8_multi_scalar,
            #[cfg(target_arch = "x86_64")]
            crate::kernels::arch::x86_64::q2k_x8_multi,
        );
        check_reference_bits(&layout, &k, 0x2222_1357_9bdf_2468u64);
        // Every quant at 3 and every scale and min at 15 against the extreme activations.
        let full = Layout {
            rows: |seed, n, cols| {
                let mut w = rows_of(seed, n, cols, false);
                for blk in w.chunks_exact_mut(Q2K_BLOCK) {
                    blk[..80].fill(0xFF);
                }
                w
            },
            ..layout
        };
        check_reference_bits(&full, &k, 0x2468_9bdf_1357_2222u64);
    }

    #[test]
    fn q3k_x8_kernels_give_the_scalar_reference_bits() {
        let layout = Layout {
            rows: |s, n, c| rows_of(s, n, c, true),
            repack: repack_q3k_x8,
            reference: scalar::vec_dot_q3k_q8k,
            block: Q3K_BLOCK,
            group_block: Q3K_X8_BLOCK,
        };
        let k = kernels(
            dot_q3k_x8_multi_scalar,
            #[cfg(target_arch = "x86_64")]
            crate::kernels::arch::x86_64::q3k_x8_multi,
        );
        check_reference_bits(&layout, &k, 0x3333_1357_9bdf_2468u64);
        // Quants at −4 (no high bits, low bits zero) with the most negative scale (−32), and
        // at 3 with the largest (31), against the extreme activations.
        for (fill_q, fill_hm, fill_sc) in [(0x00u8, 0x00u8, 0x00u8), (0xFF, 0xFF, 0xFF)] {
            let full = Layout {
                rows: match (fill_q, fill_hm, fill_sc) {
                    (0, _, _) => |seed: &mut u64, n, cols| {
                        let mut w = rows_of(seed, n, cols, true);
                        for blk in w.chunks_exact_mut(Q3K_BLOCK) {
                            blk[..108].fill(0x00);
                        }
                        w
                    },
                    _ => |seed: &mut u64, n, cols| {
                        let mut w = rows_of(seed, n, cols, true);
                        for blk in w.chunks_exact_mut(Q3K_BLOCK) {
                            blk[..108].fill(0xFF);
                        }
                        w
                    },
                },
                ..layout
            };
            check_reference_bits(&full, &k, 0x2468_9bdf_1357_3333u64);
        }
    }

    #[test]
    fn k23_one_token_entries_match_the_several_token_ones() {
        let mut seed = 0x0606_0606_1234_u64;
        let (n_rows, cols) = (8, 1024);
        let a = crate::kernels::x8::testing::act(&mut seed, cols, 1.0);
        for q3 in [false, true] {
            let w = rows_of(&mut seed, n_rows, cols, q3);
            let (p, one_f, multi_f) = if q3 {
                (
                    repack_q3k_x8(&w, n_rows, cols).unwrap(),
                    dot_q3k_x8(),
                    dot_q3k_x8_multi(),
                )
            } else {
                (
                    repack_q2k_x8(&w, n_rows, cols).unwrap(),
                    dot_q2k_x8(),
                    dot_q2k_x8_multi(),
                )
            };
            let mut one = [0.0f32; 8];
            one_f(&p, &a, cols, &mut one);
            let mut multi = [[0.0f32; 8]];
            multi_f(&p, &[&a], cols, &mut multi);
            assert_eq!(one.map(f32::to_bits), multi[0].map(f32::to_bits), "q3 {q3}");
        }
    }

    #[test]
    fn k23_repack_refuses_ragged_shapes_and_kernels_flag_bad_input() {
        assert!(repack_q2k_x8(&[0; 84 * 7], 7, 256).is_none());
        assert!(repack_q2k_x8(&[0; 84 * 8], 8, 255).is_none());
        assert!(repack_q3k_x8(&[0; 110 * 8 - 1], 8, 256).is_none());
        let mut out = [0.0f32; 8];
        dot_q2k_x8()(&[0; Q2K_X8_BLOCK - 1], &[0; 256 + 4 + 32], 256, &mut out);
        assert!(out.iter().all(|v| v.is_nan()));
        dot_q3k_x8()(&[0; Q3K_X8_BLOCK + 1], &[0; 256 + 4 + 32], 256, &mut out);
        assert!(out.iter().all(|v| v.is_nan()));
        let mut out = vec![[0.0f32; 8]; 2];
        dot_q3k_x8_multi()(&[0; Q3K_X8_BLOCK], &[&[0; 256 + 4 + 32]], 256, &mut out);
        assert!(out.iter().flatten().all(|v| v.is_nan()), "lengths differ");
    }
}
