//! Legacy 5-bit quants: Q5_0 (symmetric, offset 16) and Q5_1 (scale and min).
//!
//! The low 4 bits use Q4_0's half-block nibble split (byte `j`: element `j` low, `j + 16`
//! high); the 5th bit of element `i` is bit `i` of `qh` read as a little-endian u32.

use half::f16;

use super::{QK, for_each_block};

/// ggml `block_q5_0`. Layout (22 B): `[0..2) d:f16 | [2..6) qh:u32 LE | [6..22) qs[16]`.
/// `q = (nibble | bit << 4) - 16`, `y = q * d`.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ5_0 {
    /// Scale (delta).
    pub d: f16,
    /// 5th bits, bit i = element i (a `u8` array because the field is unaligned in ggml too).
    pub qh: [u8; 4],
    /// Low nibbles: low = element j, high = element j + 16.
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_0>() == 22);

/// ggml `block_q5_1`. Layout (24 B):
/// `[0..2) d:f16 | [2..4) m:f16 | [4..8) qh:u32 LE | [8..24) qs[16]`.
/// `q = nibble | bit << 4` (0..31), `y = q * d + m`.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ5_1 {
    /// Scale (delta).
    pub d: f16,
    /// Min, added after scaling.
    pub m: f16,
    /// 5th bits, bit i = element i.
    pub qh: [u8; 4],
    /// Low nibbles: low = element j, high = element j + 16.
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_1>() == 24);

/// The unsigned 5-bit quants (0..31) of elements `j` and `j + 16`.
#[inline]
fn q5_pair(qs: &[u8; QK / 2], qh: u32, j: usize) -> (u8, u8) {
    let hi0 = ((qh >> j) & 1) as u8;
    let hi1 = ((qh >> (j + 16)) & 1) as u8;
    ((qs[j] & 0xF) | hi0 << 4, (qs[j] >> 4) | hi1 << 4)
}

/// One Q5_0 block.
pub fn dequantize_block_q5_0(b: &BlockQ5_0, y: &mut [f32; QK]) {
    let d = b.d.to_f32();
    let qh = u32::from_le_bytes(b.qh);
    for j in 0..QK / 2 {
        let (q0, q1) = q5_pair(&b.qs, qh, j);
        y[j] = f32::from(i16::from(q0) - 16) * d;
        y[j + QK / 2] = f32::from(i16::from(q1) - 16) * d;
    }
}

/// Decodes `out.len() / 32` packed Q5_0 blocks from `src`.
pub fn dequantize_row_q5_0(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_q5_0);
}

/// One Q5_1 block (multiply, then add the min: ggml's order).
pub fn dequantize_block_q5_1(b: &BlockQ5_1, y: &mut [f32; QK]) {
    let (d, m) = (b.d.to_f32(), b.m.to_f32());
    let qh = u32::from_le_bytes(b.qh);
    for j in 0..QK / 2 {
        let (q0, q1) = q5_pair(&b.qs, qh, j);
        y[j] = f32::from(q0) * d + m;
        y[j + QK / 2] = f32::from(q1) * d + m;
    }
}

/// Decodes `out.len() / 32` packed Q5_1 blocks from `src`.
pub fn dequantize_row_q5_1(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_q5_1);
}
