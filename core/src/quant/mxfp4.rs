//! MXFP4 as ggml stores it (spec/formats.md §3.0, §3.3): 32 E2M1 (FP4) values sharing one
//! E8M0 power-of-two scale, 4.25 bits/weight.
//!
//! ggml keeps the FP4 table doubled ([`KVALUES_FP4`], integers) and halves the scale to
//! compensate, so both factors are exact. Nibbles split by half-block like Q4_0 (byte `j`:
//! element `j` low, `j + 16` high), which is *not* the adjacent-pair packing of OCP /
//! compressed-tensors MXFP4 tensors.

use super::tables::KVALUES_FP4;
use super::{QK, for_each_block};

/// ggml `block_mxfp4`. Layout (17 B): `[0] e:E8M0 | [1..17) qs[16]`.
/// `y[j] = kvalues_fp4[qs[j] & 0xF] * 2^(e - 128)`, `y[j + 16]` from the high nibble.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockMXFP4 {
    /// Shared exponent: the scale is 2^(e - 127), used halved.
    pub e: u8,
    /// FP4 codes: bit 3 the sign, bits 0-2 the magnitude index. Low nibble = element j,
    /// high = element j + 16.
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockMXFP4>() == 17);

/// Half the E8M0 value, 2^(e - 128), built from its bits as ggml does: e = 0 and 1 are the
/// f32 subnormals 2^-128 and 2^-127, and e = 255 (NaN in OCP) is 2^127, not NaN.
#[inline]
pub fn e8m0_to_fp32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// One MXFP4 block (the products are exact unless they overflow: 12 * 2^127 is inf).
pub fn dequantize_block_mxfp4(b: &BlockMXFP4, y: &mut [f32; QK]) {
    let d = e8m0_to_fp32_half(b.e);
    for (j, &q) in b.qs.iter().enumerate() {
        y[j] = f32::from(KVALUES_FP4[usize::from(q & 0xF)]) * d;
        y[j + QK / 2] = f32::from(KVALUES_FP4[usize::from(q >> 4)]) * d;
    }
}

/// Decodes `out.len() / 32` packed MXFP4 blocks from `src`.
pub fn dequantize_row_mxfp4(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_mxfp4);
}

#[cfg(test)]
mod tests {
    use super::e8m0_to_fp32_half;

    #[test]
    fn e8m0_half_is_two_to_the_e_minus_128() {
        for e in 0..=255u8 {
            let want = libm::ldexpf(1.0, i32::from(e) - 128);
            assert_eq!(e8m0_to_fp32_half(e).to_bits(), want.to_bits(), "e = {e}");
        }
    }
}
