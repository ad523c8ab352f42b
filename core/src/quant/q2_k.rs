//! Q2_K: 256-element super-block of 16 sub-blocks of 16, 2-bit quants with 4-bit scales and
//! mins (2.625 bits/weight).

use half::f16;

use super::{QK_K, for_each_block};

/// ggml `block_q2_K`. Layout (84 B):
/// `[0..16) scales[16] | [16..80) qs[64] | [80..82) d:f16 | [82..84) dmin:f16`
/// (note `d`, `dmin` at the *end*, unlike Q4_K/Q5_K).
///
/// Element `i`: half `n = i / 128`, plane `k = (i % 128) / 32`, byte `l = i % 32`;
/// `q = (qs[32n + l] >> 2k) & 3`, sub-block `s = i / 16`;
/// `y = (d * (scales[s] & 0xF)) * q - dmin * (scales[s] >> 4)`.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ2K {
    /// Per sub-block: scale in the low nibble, min in the high nibble (unsigned).
    pub scales: [u8; QK_K / 16],
    /// 2-bit quants, four planes per byte (see the element formula above).
    pub qs: [u8; QK_K / 4],
    /// Super-block scale for the sub-block scales.
    pub d: f16,
    /// Super-block scale for the sub-block mins.
    pub dmin: f16,
}
const _: () = assert!(size_of::<BlockQ2K>() == 84);

/// One Q2_K block (per element, the same f32 operations as ggml).
pub fn dequantize_block_q2k(b: &BlockQ2K, y: &mut [f32; QK_K]) {
    let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
    for i in 0..QK_K {
        let (n, k, l) = (i / 128, (i % 128) / 32, i % 32);
        let sc = b.scales[i / 16];
        let dl = d * f32::from(sc & 0xF);
        let ml = dmin * f32::from(sc >> 4);
        let q = (b.qs[32 * n + l] >> (2 * k)) & 3;
        y[i] = dl * f32::from(q) - ml;
    }
}

/// Decodes `out.len() / 256` packed Q2_K blocks from `src`.
pub fn dequantize_row_q2k(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_q2k);
}
