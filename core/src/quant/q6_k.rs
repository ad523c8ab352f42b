//! Q6_K: 256-element super-block of 16 sub-blocks of 16, 6-bit quants (4 low + 2 high bits)
//! with signed 8-bit scales (6.5625 bits/weight). Usual type of `output.weight`.

use half::f16;

use super::{QK_K, for_each_block};

/// ggml `block_q6_K`. Layout (210 B):
/// `[0..128) ql[128] | [128..192) qh[64] | [192..208) scales:i8[16] | [208..210) d:f16`.
///
/// Element `i`: half `n = i / 128`, group `g = (i % 128) / 32`, `l = i % 32`;
/// low 4 bits from `ql[64n + l + 32(g & 1)]` (low nibble for g < 2, high for g >= 2);
/// high 2 bits `(qh[32n + l] >> 2g) & 3`; `q = (low4 | high2 << 4) - 32` in -32..31;
/// `y = (d * scales[i / 16]) * q`.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ6K {
    /// Low 4 bits of the quants.
    pub ql: [u8; QK_K / 2],
    /// High 2 bits of the quants, four groups per byte.
    pub qh: [u8; QK_K / 4],
    /// Signed per-sub-block scales.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale.
    pub d: f16,
}
const _: () = assert!(size_of::<BlockQ6K>() == 210);

/// One Q6_K block (per element, the same f32 operations as ggml).
pub fn dequantize_block_q6k(b: &BlockQ6K, y: &mut [f32; QK_K]) {
    let d = b.d.to_f32();
    for i in 0..QK_K {
        let (n, g, l) = (i / 128, (i % 128) / 32, i % 32);
        let byte = b.ql[64 * n + l + 32 * (g & 1)];
        let low4 = if g < 2 { byte & 0xF } else { byte >> 4 };
        let high2 = (b.qh[32 * n + l] >> (2 * g)) & 3;
        let q = (low4 | high2 << 4) as i8 - 32;
        y[i] = d * f32::from(b.scales[i / 16]) * f32::from(q);
    }
}

/// Decodes `out.len() / 256` packed Q6_K blocks from `src`.
pub fn dequantize_row_q6k(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_q6k);
}
