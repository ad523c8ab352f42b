//! Q4_K: 256-element super-block of 8 sub-blocks of 32, 4-bit quants with 6-bit scales and
//! mins (4.5 bits/weight). The workhorse of "Q4_K_M" files.

use half::f16;

use super::{QK_K, for_each_block, get_scale_min_k4};

/// ggml `block_q4_K`. Layout (144 B):
/// `[0..2) d:f16 | [2..4) dmin:f16 | [4..16) scales[12] | [16..144) qs[128]`.
///
/// Chunk `c` (0..4) of 64 elements uses `qs[32c .. 32c + 32)`: element `64c + l` is the low
/// nibble of `qs[32c + l]` (sub-block `2c`), element `64c + 32 + l` its high nibble
/// (sub-block `2c + 1`). `y = (d * sc) * q - dmin * m`, q in 0..15.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ4K {
    /// Super-block scale for the sub-block scales.
    pub d: f16,
    /// Super-block scale for the sub-block mins.
    pub dmin: f16,
    /// 8 six-bit scales and 8 six-bit mins, packed as in `get_scale_min_k4`.
    pub scales: [u8; 12],
    /// 4-bit quants, chunk-wise low/high nibble split (see above).
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ4K>() == 144);

/// One Q4_K block, in ggml's loop order.
pub fn dequantize_block_q4k(b: &BlockQ4K, y: &mut [f32; QK_K]) {
    let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
    for c in 0..4 {
        let q = &b.qs[32 * c..32 * c + 32];
        let (sc1, m1) = get_scale_min_k4(2 * c, &b.scales);
        let (sc2, m2) = get_scale_min_k4(2 * c + 1, &b.scales);
        let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, min2) = (d * f32::from(sc2), dmin * f32::from(m2));
        for l in 0..32 {
            y[64 * c + l] = d1 * f32::from(q[l] & 0xF) - min1;
            y[64 * c + 32 + l] = d2 * f32::from(q[l] >> 4) - min2;
        }
    }
}

/// Decodes `out.len() / 256` packed Q4_K blocks from `src`.
pub fn dequantize_row_q4k(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_q4k);
}
