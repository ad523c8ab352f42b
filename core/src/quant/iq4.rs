//! Non-linear 4-bit quants: IQ4_NL (32-element blocks, 4.5 bits/weight) and IQ4_XS
//! (256-element super-blocks with 6-bit sub-scales, 4.25 bits/weight). Both map each nibble
//! through the 16-entry codebook [`KVALUES_IQ4NL`] instead of using it as an integer, and
//! split nibbles by half-block like Q4_0: byte `j` holds element `j` in its low nibble and
//! element `j + 16` in its high nibble (spec/formats.md §3.13, §3.14).

use half::f16;

use super::tables::KVALUES_IQ4NL;
use super::{QK, QK_K, for_each_block};

/// ggml `block_iq4_nl`. Layout (18 B): `[0..2) d:f16 | [2..18) qs[16]`.
/// `y[j] = d * kvalues[qs[j] & 0xF]`, `y[j + 16] = d * kvalues[qs[j] >> 4]`.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockIQ4NL {
    /// Scale (delta).
    pub d: f16,
    /// Codebook indices: low nibble = element j, high = element j + 16.
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockIQ4NL>() == 18);

/// ggml `block_iq4_xs`. Layout (136 B):
/// `[0..2) d:f16 | [2..4) scales_h:u16 LE | [4..8) scales_l[4] | [8..136) qs[128]`.
///
/// Sub-block `ib` (0..8) of 32 elements has the 6-bit scale
/// `ls = ((scales_l[ib / 2] >> 4(ib % 2)) & 0xF) | ((scales_h >> 2ib) & 3) << 4`, stored biased
/// by 32: `dl = d * (ls - 32)`. Its quants are `qs[16ib..16ib + 16)`, split as in IQ4_NL.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockIQ4XS {
    /// Super-block scale.
    pub d: f16,
    /// High 2 bits of the 8 sub-block scales (bits 2ib..2ib+2), a little-endian u16.
    pub scales_h: [u8; 2],
    /// Low 4 bits of the sub-block scales, two per byte (even ib in the low nibble).
    pub scales_l: [u8; QK_K / 64],
    /// Codebook indices, 16 bytes per 32-element sub-block.
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockIQ4XS>() == 136);

/// One IQ4_NL block.
pub fn dequantize_block_iq4_nl(b: &BlockIQ4NL, y: &mut [f32; QK]) {
    let d = b.d.to_f32();
    for (j, &q) in b.qs.iter().enumerate() {
        y[j] = d * f32::from(KVALUES_IQ4NL[usize::from(q & 0xF)]);
        y[j + QK / 2] = d * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
    }
}

/// Decodes `out.len() / 32` packed IQ4_NL blocks from `src`.
pub fn dequantize_row_iq4_nl(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_iq4_nl);
}

/// One IQ4_XS block: the sub-block scale `d * (ls - 32)` first, then times the codebook value.
pub fn dequantize_block_iq4_xs(b: &BlockIQ4XS, y: &mut [f32; QK_K]) {
    let d = b.d.to_f32();
    let scales_h = u16::from_le_bytes(b.scales_h);
    let (qs, _) = b.qs.as_chunks::<16>();
    let (ys, _) = y.as_chunks_mut::<32>();
    for (ib, (qs, y)) in qs.iter().zip(ys).enumerate() {
        let low4 = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
        let high2 = ((scales_h >> (2 * ib)) & 3) as u8;
        let dl = d * f32::from(i16::from(low4 | high2 << 4) - 32);
        for (j, &q) in qs.iter().enumerate() {
            y[j] = dl * f32::from(KVALUES_IQ4NL[usize::from(q & 0xF)]);
            y[j + 16] = dl * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
        }
    }
}

/// Decodes `out.len() / 256` packed IQ4_XS blocks from `src`.
pub fn dequantize_row_iq4_xs(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_iq4_xs);
}
