//! 3-bit codebook quants: IQ3_XXS (3.0625 bits/weight) and IQ3_S (3.4375), spec/formats.md
//! §3.18, §3.19.
//!
//! A 256-element super-block has one fp16 scale and eight 32-element sub-blocks of four
//! 8-element runs; each run is two codebook points of 4 magnitudes with a sign per weight:
//! `y = db * grid[idx].byte[j] * (±1)`, in that order. IQ3_XXS stores 7-bit sign indices into
//! [`KSIGNS_IQ2XS`] (even parity), IQ3_S whole sign bytes.

use half::f16;

use super::tables::{IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};
use super::{QK_K, for_each_block};

/// ggml `block_iq3_xxs`. Layout (98 B): `[0..2) d:f16 | [2..66) qs[64] | [66..98) u32 LE[8]`
/// (ggml declares one `qs[96]`).
///
/// Sub-block `ib`: `a = u32[ib]`, `db = d * (0.5 + (a >> 28)) * 0.5`; run `l` takes the signs
/// `ksigns[(a >> 7l) & 127]` and the points `qs[8ib + 2l]` (weights 0-3) and
/// `qs[8ib + 2l + 1]` (weights 4-7) of [`IQ3XXS_GRID`].
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockIQ3XXS {
    /// Super-block scale.
    pub d: f16,
    /// Grid indices, one per 4 weights.
    pub qs: [u8; QK_K / 4],
    /// Per sub-block, a little-endian u32: four 7-bit sign indices, then a 4-bit scale.
    pub scales_and_signs: [u8; QK_K / 8],
}
const _: () = assert!(size_of::<BlockIQ3XXS>() == 98);

/// ggml `block_iq3_s`. Layout (110 B):
/// `[0..2) d:f16 | [2..66) qs[64] | [66..74) qh[8] | [74..106) signs[32] | [106..110) scales[4]`.
///
/// Sub-block `sb`: `db = d * (1 + 2 * ((scales[sb / 2] >> 4(sb % 2)) & 0xF))`. Run `l` uses
/// the 9-bit indices `qs[8sb + 2l] | (qh[sb] >> 2l & 1) << 8` and
/// `qs[8sb + 2l + 1] | (qh[sb] >> (2l + 1) & 1) << 8` into [`IQ3S_GRID`], and the sign byte
/// `signs[4sb + l]` (bits 0-3 for the first point, 4-7 for the second).
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockIQ3S {
    /// Super-block scale.
    pub d: f16,
    /// Low 8 bits of the grid indices, one per 4 weights.
    pub qs: [u8; QK_K / 4],
    /// 9th bits of the 8 grid indices of each sub-block.
    pub qh: [u8; QK_K / 32],
    /// Explicit sign bytes, one per 8-weight run (bit j = weight j negative).
    pub signs: [u8; QK_K / 8],
    /// 4-bit scales, two per byte (even sub-block in the low nibble).
    pub scales: [u8; QK_K / 64],
}
const _: () = assert!(size_of::<BlockIQ3S>() == 110);

/// One 8-weight run from two 4-weight points: `(db * byte) * (sign bit j ? -1 : 1)`.
#[inline]
fn iq3_run(db: f32, points: [u32; 2], signs: u8, y: &mut [f32; 8]) {
    let [p0, p1] = points.map(u32::to_le_bytes);
    for (j, (y, g)) in y.iter_mut().zip(p0.into_iter().chain(p1)).enumerate() {
        *y = db * f32::from(g) * if (signs >> j) & 1 != 0 { -1.0 } else { 1.0 };
    }
}

/// One IQ3_XXS block.
pub fn dequantize_block_iq3_xxs(b: &BlockIQ3XXS, y: &mut [f32; QK_K]) {
    let d = b.d.to_f32();
    let (words, _) = b.scales_and_signs.as_chunks::<4>();
    let (qs, _) = b.qs.as_chunks::<2>();
    let (runs, _) = y.as_chunks_mut::<8>();
    for (r, (q, y)) in qs.iter().zip(runs).enumerate() {
        let a = u32::from_le_bytes(words[r / 4]);
        let db = d * (0.5 + (a >> 28) as f32) * 0.5;
        let signs = KSIGNS_IQ2XS[((a >> (7 * (r % 4))) & 127) as usize];
        let points = q.map(|i| IQ3XXS_GRID[usize::from(i)]);
        iq3_run(db, points, signs, y);
    }
}

/// Decodes `out.len() / 256` packed IQ3_XXS blocks from `src`.
pub fn dequantize_row_iq3_xxs(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_iq3_xxs);
}

/// One IQ3_S block.
pub fn dequantize_block_iq3_s(b: &BlockIQ3S, y: &mut [f32; QK_K]) {
    let d = b.d.to_f32();
    let (qs, _) = b.qs.as_chunks::<2>();
    let (runs, _) = y.as_chunks_mut::<8>();
    for (r, (q, y)) in qs.iter().zip(runs).enumerate() {
        let (sb, l) = (r / 4, r % 4);
        let s = (b.scales[sb / 2] >> (4 * (sb % 2))) & 0xF;
        let db = d * f32::from(1 + 2 * s);
        let high = |k: usize| usize::from((b.qh[sb] >> (2 * l + k)) & 1) << 8;
        let points = [
            IQ3S_GRID[usize::from(q[0]) | high(0)],
            IQ3S_GRID[usize::from(q[1]) | high(1)],
        ];
        iq3_run(db, points, b.signs[r], y);
    }
}

/// Decodes `out.len() / 256` packed IQ3_S blocks from `src`.
pub fn dequantize_row_iq3_s(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_iq3_s);
}
