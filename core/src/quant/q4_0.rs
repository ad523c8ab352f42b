//! Legacy 4-bit quants: Q4_0 (symmetric, offset 8) and Q4_1 (scale and min).
//!
//! Both split the nibbles by half-block: byte `j` (< 16) holds element `j` in its low nibble
//! and element `j + 16` in its high nibble. Adjacent elements are *not* paired in a byte.

use half::f16;

use super::{QK, for_each_block};

/// ggml `block_q4_0`. Layout (18 B): `[0..2) d:f16 | [2..18) qs[16]`.
/// `y[j] = d * ((qs[j] & 0xF) - 8)`, `y[j + 16] = d * ((qs[j] >> 4) - 8)`.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ4_0 {
    /// Scale (delta).
    pub d: f16,
    /// Nibbles: low = element j, high = element j + 16.
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_0>() == 18);

/// ggml `block_q4_1`. Layout (20 B): `[0..2) d:f16 | [2..4) m:f16 | [4..20) qs[16]`.
/// `y[j] = (qs[j] & 0xF) * d + m`, `y[j + 16] = (qs[j] >> 4) * d + m`.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ4_1 {
    /// Scale (delta).
    pub d: f16,
    /// Min, added after scaling.
    pub m: f16,
    /// Nibbles: low = element j, high = element j + 16 (unsigned 0..15).
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_1>() == 20);

/// One Q4_0 block.
pub fn dequantize_block_q4_0(b: &BlockQ4_0, y: &mut [f32; QK]) {
    let d = b.d.to_f32();
    for (j, &q) in b.qs.iter().enumerate() {
        y[j] = f32::from(i16::from(q & 0xF) - 8) * d;
        y[j + QK / 2] = f32::from(i16::from(q >> 4) - 8) * d;
    }
}

/// Decodes `out.len() / 32` packed Q4_0 blocks from `src`.
pub fn dequantize_row_q4_0(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_q4_0);
}

/// One Q4_1 block (multiply, then add the min: ggml's order).
pub fn dequantize_block_q4_1(b: &BlockQ4_1, y: &mut [f32; QK]) {
    let (d, m) = (b.d.to_f32(), b.m.to_f32());
    for (j, &q) in b.qs.iter().enumerate() {
        y[j] = f32::from(q & 0xF) * d + m;
        y[j + QK / 2] = f32::from(q >> 4) * d + m;
    }
}

/// Decodes `out.len() / 32` packed Q4_1 blocks from `src`.
pub fn dequantize_row_q4_1(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_q4_1);
}
