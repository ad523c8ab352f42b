//! Quant block structs and scalar reference dequantisation (the test oracle for every fast
//! kernel). Layouts follow ggml's `ggml-common.h`, described in `spec/formats.md` §3.

pub mod ct;

use crate::dtype::GgmlType;

/// Decodes one row of `out.len()` elements of type `ty` from `src` (exactly the row's bytes).
///
/// Types without a decoder yet write NaN; loading refuses such tensors before any compute
/// (see [`supported`]), so this is never reached on validated input.
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
        }
        _ => out.fill(f32::NAN),
    }
}

/// Whether [`dequantize_row`] decodes `ty`.
pub fn supported(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}
