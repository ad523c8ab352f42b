//! 2-bit codebook quants ("i-quants"): IQ2_XXS (2.0625 bits/weight), IQ2_XS (2.3125) and
//! IQ2_S (2.5625), spec/formats.md §3.15-§3.17.
//!
//! A 256-element super-block has one fp16 scale and eight 32-element sub-blocks of four
//! 8-element runs. Each run is one codebook point (8 magnitudes in {8, 25, 43}) with a sign
//! per weight; there is no zero-point: `y = db * grid[idx].byte[j] * (±1)`, in that order.
//! The sub-block scale is `db = d * (0.5 + s) * 0.25` with a 4-bit `s`.
//!
//! IQ2_XXS and IQ2_XS store 7-bit sign indices into [`KSIGNS_IQ2XS`] (the 8th sign is the
//! parity of the other 7); IQ2_S stores whole sign bytes.

use half::f16;

use super::tables::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS_IQ2XS};
use super::{QK_K, for_each_block};

/// ggml `block_iq2_xxs`. Layout (66 B): `[0..2) d:f16 | [2..66) qs[64]`.
///
/// `qs` is eight 8-byte groups, one per sub-block `ib`: bytes 0-3 index [`IQ2XXS_GRID`] for
/// runs 0-3, bytes 4-7 are a u32 LE `a` with the sign index of run `l` in bits `7l..7l+7`
/// and the scale `s` in bits 28-31.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockIQ2XXS {
    /// Super-block scale.
    pub d: f16,
    /// Grid indices, sign indices and scales, 8 bytes per 32-element sub-block.
    pub qs: [u8; QK_K / 4],
}
const _: () = assert!(size_of::<BlockIQ2XXS>() == 66);

/// ggml `block_iq2_xs`. Layout (74 B): `[0..2) d:f16 | [2..66) qs:u16 LE[32] | [66..74) scales[8]`.
///
/// Each u16 is one run: bits 0-8 index [`IQ2XS_GRID`], bits 9-15 are the sign index. Sub-block
/// `ib` uses u16s `4ib..4ib + 4`; runs 0-1 take the scale `scales[ib] & 0xF`, runs 2-3
/// `scales[ib] >> 4`.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockIQ2XS {
    /// Super-block scale.
    pub d: f16,
    /// 32 little-endian u16s: 9-bit grid index | 7-bit sign index << 9.
    pub qs: [u8; QK_K / 4],
    /// Two 4-bit scales per sub-block (first 16 elements in the low nibble).
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIQ2XS>() == 74);

/// ggml `block_iq2_s`. Layout (82 B):
/// `[0..2) d:f16 | [2..34) qs[32] | [34..66) signs[32] | [66..74) qh[8] | [74..82) scales[8]`
/// (ggml declares `qs[64]` and reads the signs from its second half).
///
/// Run `l` of sub-block `ib`: `idx = qs[4ib + l] | ((qh[ib] >> 2l) & 3) << 8` (10 bits, into
/// [`IQ2S_GRID`]); sign bit `j` of `signs[4ib + l]` negates weight `j`. Scales as in IQ2_XS.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockIQ2S {
    /// Super-block scale.
    pub d: f16,
    /// Low 8 bits of the grid indices, one per run.
    pub qs: [u8; QK_K / 8],
    /// Explicit sign bytes, one per run (bit j = weight j negative).
    pub signs: [u8; QK_K / 8],
    /// High 2 bits of the four grid indices of each sub-block.
    pub qh: [u8; QK_K / 32],
    /// Two 4-bit scales per sub-block (first 16 elements in the low nibble).
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIQ2S>() == 82);

/// `d * (0.5 + s) * 0.25`, left to right as in ggml. Every product in this file is
/// exact (an 11-bit fp16 mantissa times a few-bit integer fits in f32), so the order cannot
/// change the bits; it is kept to read side by side with ggml.
#[inline]
fn iq2_scale(d: f32, s: u32) -> f32 {
    d * (0.5 + s as f32) * 0.25
}

/// One 8-weight run: `(db * point.byte[j]) * (sign bit j ? -1 : 1)`.
#[inline]
fn iq2_run(db: f32, point: u64, signs: u8, y: &mut [f32; 8]) {
    for (j, (y, g)) in y.iter_mut().zip(point.to_le_bytes()).enumerate() {
        *y = db * f32::from(g) * if (signs >> j) & 1 != 0 { -1.0 } else { 1.0 };
    }
}

/// One IQ2_XXS block.
pub fn dequantize_block_iq2_xxs(b: &BlockIQ2XXS, y: &mut [f32; QK_K]) {
    let d = b.d.to_f32();
    let (groups, _) = b.qs.as_chunks::<8>();
    let (runs, _) = y.as_chunks_mut::<8>();
    for (ib, g) in groups.iter().enumerate() {
        let a = u32::from_le_bytes([g[4], g[5], g[6], g[7]]);
        let db = iq2_scale(d, a >> 28);
        for l in 0..4 {
            let signs = KSIGNS_IQ2XS[((a >> (7 * l)) & 127) as usize];
            iq2_run(
                db,
                IQ2XXS_GRID[usize::from(g[l])],
                signs,
                &mut runs[4 * ib + l],
            );
        }
    }
}

/// Decodes `out.len() / 256` packed IQ2_XXS blocks from `src`.
pub fn dequantize_row_iq2_xxs(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_iq2_xxs);
}

/// One IQ2_XS block.
pub fn dequantize_block_iq2_xs(b: &BlockIQ2XS, y: &mut [f32; QK_K]) {
    let d = b.d.to_f32();
    let (qs, _) = b.qs.as_chunks::<2>();
    let (runs, _) = y.as_chunks_mut::<8>();
    for (r, (q, y)) in qs.iter().zip(runs).enumerate() {
        let sc = b.scales[r / 4];
        let s = if r % 4 < 2 { sc & 0xF } else { sc >> 4 };
        let q = u16::from_le_bytes(*q);
        let signs = KSIGNS_IQ2XS[usize::from(q >> 9)];
        iq2_run(
            iq2_scale(d, u32::from(s)),
            IQ2XS_GRID[usize::from(q & 511)],
            signs,
            y,
        );
    }
}

/// Decodes `out.len() / 256` packed IQ2_XS blocks from `src`.
pub fn dequantize_row_iq2_xs(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_iq2_xs);
}

/// One IQ2_S block.
pub fn dequantize_block_iq2_s(b: &BlockIQ2S, y: &mut [f32; QK_K]) {
    let d = b.d.to_f32();
    let (runs, _) = y.as_chunks_mut::<8>();
    for (r, y) in runs.iter_mut().enumerate() {
        let (ib, l) = (r / 4, r % 4);
        let sc = b.scales[ib];
        let s = if l < 2 { sc & 0xF } else { sc >> 4 };
        let idx = usize::from(b.qs[r]) | usize::from((b.qh[ib] >> (2 * l)) & 3) << 8;
        iq2_run(iq2_scale(d, u32::from(s)), IQ2S_GRID[idx], b.signs[r], y);
    }
}

/// Decodes `out.len() / 256` packed IQ2_S blocks from `src`.
pub fn dequantize_row_iq2_s(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_iq2_s);
}
