//! Quant block structs and scalar reference dequantisation (the test oracle for every fast
//! kernel). Layouts follow ggml's `ggml-common.h`, described in `spec/formats.md` §3.
//!
//! One quant family per file; each holds the `#[repr(C)]` block struct(s), a per-block
//! decoder and a `dequantize_row_*` that walks packed blocks. GGUF blocks are not aligned
//! (18, 34, 210 B ...), so blocks are copied out of byte slices, never cast in place. The
//! arithmetic is f32 in ggml's order (scale product, then times the quant, then minus the
//! min): tests compare bit for bit against gguf-py, which matches libggml.

pub mod ct;
pub mod f16;
pub mod iq1;
pub mod iq2;
pub mod iq3;
pub mod iq4;
pub mod mxfp4;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_k;
pub mod q5_0;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod tables;
pub mod tq;

pub use iq1::{BlockIQ1M, BlockIQ1S};
pub use iq2::{BlockIQ2S, BlockIQ2XS, BlockIQ2XXS};
pub use iq3::{BlockIQ3S, BlockIQ3XXS};
pub use iq4::{BlockIQ4NL, BlockIQ4XS};
pub use mxfp4::BlockMXFP4;
pub use q2_k::BlockQ2K;
pub use q3_k::BlockQ3K;
pub use q4_0::{BlockQ4_0, BlockQ4_1};
pub use q4_k::BlockQ4K;
pub use q5_0::{BlockQ5_0, BlockQ5_1};
pub use q5_k::BlockQ5K;
pub use q6_k::BlockQ6K;
pub use q8_0::{BlockQ8_0, quantize_row_q8_0};
pub use tq::{BlockTQ1_0, BlockTQ2_0};

use crate::dtype::GgmlType;

/// Elements per block of the legacy 32-element types (`QK4_0`, `QK8_0`, ...).
pub const QK: usize = 32;
/// Elements per K-quant super-block (`QK_K`).
pub const QK_K: usize = 256;

/// Decodes one row of `out.len()` elements of type `ty` from `src` (exactly the row's bytes).
///
/// Types without a decoder write NaN; loading refuses such tensors before any compute (see
/// [`supported`]), so this is never reached on validated input. Likewise, if `src.len()` is
/// not the byte size of `out.len()` elements of `ty` (including a ragged last block), `out`
/// is filled with NaN rather than panicking or decoding a prefix.
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) {
    match row_decoder(ty) {
        Some(decode) if ty.row_bytes(out.len() as u64) == Some(src.len() as u64) => {
            decode(src, out)
        }
        _ => out.fill(f32::NAN),
    }
}

/// Whether [`dequantize_row`] decodes `ty`.
pub fn supported(ty: GgmlType) -> bool {
    row_decoder(ty).is_some()
}

/// Decodes a row of packed bytes into `out` (lengths already validated).
type RowDecoder = fn(&[u8], &mut [f32]);

/// The scalar row decoder for `ty`: the one table both [`dequantize_row`] and [`supported`]
/// read, so they cannot disagree.
fn row_decoder(ty: GgmlType) -> Option<RowDecoder> {
    use GgmlType::*;
    Some(match ty {
        F32 => f16::dequantize_row_f32,
        F16 => f16::dequantize_row_f16,
        BF16 => f16::dequantize_row_bf16,
        Q4_0 => q4_0::dequantize_row_q4_0,
        Q4_1 => q4_0::dequantize_row_q4_1,
        Q5_0 => q5_0::dequantize_row_q5_0,
        Q5_1 => q5_0::dequantize_row_q5_1,
        Q8_0 => q8_0::dequantize_row_q8_0,
        Q2K => q2_k::dequantize_row_q2k,
        Q3K => q3_k::dequantize_row_q3k,
        Q4K => q4_k::dequantize_row_q4k,
        Q5K => q5_k::dequantize_row_q5k,
        Q6K => q6_k::dequantize_row_q6k,
        IQ2XXS => iq2::dequantize_row_iq2_xxs,
        IQ2XS => iq2::dequantize_row_iq2_xs,
        IQ2S => iq2::dequantize_row_iq2_s,
        IQ3XXS => iq3::dequantize_row_iq3_xxs,
        IQ3S => iq3::dequantize_row_iq3_s,
        IQ1S => iq1::dequantize_row_iq1_s,
        IQ1M => iq1::dequantize_row_iq1_m,
        IQ4NL => iq4::dequantize_row_iq4_nl,
        IQ4XS => iq4::dequantize_row_iq4_xs,
        TQ1_0 => tq::dequantize_row_tq1_0,
        TQ2_0 => tq::dequantize_row_tq2_0,
        MXFP4 => mxfp4::dequantize_row_mxfp4,
        _ => return None,
    })
}

/// Walks the whole blocks of a packed row: copies each `B` out of `src` (unaligned) and hands
/// it with its `N` outputs to `block`. Lengths are the caller's contract (debug-asserted);
/// in release a mismatch decodes only the blocks present in both and never panics.
#[inline]
fn for_each_block<B: bytemuck::Pod, const N: usize>(
    src: &[u8],
    out: &mut [f32],
    block: impl Fn(&B, &mut [f32; N]),
) {
    let block_bytes = size_of::<B>();
    debug_assert!(
        out.len().is_multiple_of(N) && src.len() == out.len() / N * block_bytes,
        "row of {} elements needs {} bytes, got {}",
        out.len(),
        out.len() / N * block_bytes,
        src.len()
    );
    let (out_blocks, _) = out.as_chunks_mut::<N>();
    for (bytes, y) in src.chunks_exact(block_bytes).zip(out_blocks) {
        block(&bytemuck::pod_read_unaligned(bytes), y);
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) from the 12 packed bytes shared by Q4_K
/// and Q5_K (ggml `get_scale_min_k4`, spec §3.8):
/// bytes 0-3: scales 0-3 in bits 0-5, high 2 bits of scales 4-7 in bits 6-7;
/// bytes 4-7: mins 0-3 in bits 0-5, high 2 bits of mins 4-7 in bits 6-7;
/// bytes 8-11: low nibble of scales 4-7 | low nibble of mins 4-7 << 4.
#[inline]
fn get_scale_min_k4(j: usize, s: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_min_k4_matches_spec_example() {
        // spec/formats.md §3.8 worked example.
        let s = [
            0xC1, 0x42, 0x03, 0x04, 0x85, 0x06, 0x47, 0x08, 0x9A, 0xBC, 0xDE, 0xF0,
        ];
        let got: [(u8, u8); 8] = core::array::from_fn(|j| get_scale_min_k4(j, &s));
        let want = [
            (1, 5),
            (2, 6),
            (3, 7),
            (4, 8),
            (58, 41),
            (28, 11),
            (14, 29),
            (0, 15),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn mismatched_lengths_fill_nan() {
        let mut out = [0.0f32; 32];
        dequantize_row(GgmlType::Q8_0, &[0u8; 33], &mut out);
        assert!(out.iter().all(|v| v.is_nan()));
        let mut out = [0.0f32; 31]; // ragged: not a whole block
        dequantize_row(GgmlType::Q8_0, &[0u8; 34], &mut out);
        assert!(out.iter().all(|v| v.is_nan()));
    }

    #[test]
    fn unsupported_types_fill_nan() {
        // Q8_1 is an activation-side type: no weight tensor holds it, so it has no decoder.
        let mut out = [0.0f32; 32];
        dequantize_row(GgmlType::Q8_1, &[0x11u8; 36], &mut out);
        assert!(out.iter().all(|v| v.is_nan()));
        assert!(!supported(GgmlType::Q8_1));
    }
}
