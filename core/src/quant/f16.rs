//! Unquantised float rows: F32, F16 (IEEE binary16) and BF16 (upper half of an f32), all
//! little-endian (spec/formats.md §3.0). Shared by GGUF and safetensors tensors.
//!
//! Like the block decoders, these decode the elements present in both slices; the byte
//! length is the caller's contract (validated by [`super::dequantize_row`]).

/// Little-endian f32 elements; bits (NaN payloads included) are copied unchanged.
pub fn dequantize_row_f32(src: &[u8], out: &mut [f32]) {
    debug_assert_eq!(src.len(), out.len() * 4);
    for (o, c) in out.iter_mut().zip(src.as_chunks::<4>().0) {
        *o = f32::from_le_bytes(*c);
    }
}

/// Little-endian fp16 elements, exact (subnormals, ±inf; NaNs stay NaN).
pub fn dequantize_row_f16(src: &[u8], out: &mut [f32]) {
    debug_assert_eq!(src.len(), out.len() * 2);
    for (o, c) in out.iter_mut().zip(src.as_chunks::<2>().0) {
        *o = half::f16::from_le_bytes(*c).to_f32();
    }
}

/// Little-endian bf16 elements: `f32_bits = u16 << 16`, exact for every pattern.
pub fn dequantize_row_bf16(src: &[u8], out: &mut [f32]) {
    debug_assert_eq!(src.len(), out.len() * 2);
    for (o, c) in out.iter_mut().zip(src.as_chunks::<2>().0) {
        *o = f32::from_bits(u32::from(u16::from_le_bytes(*c)) << 16);
    }
}
