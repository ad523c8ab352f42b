//! Q5_K: Q4_K plus a 5th quant bit (5.5 bits/weight).

use half::f16;

use super::{QK_K, for_each_block, get_scale_min_k4};

/// ggml `block_q5_K`. Layout (176 B):
/// `[0..2) d:f16 | [2..4) dmin:f16 | [4..16) scales[12] | [16..48) qh[32] | [48..176) qs[128]`.
///
/// As Q4_K, plus: element `64c + l` takes its 5th bit from `qh[l]` bit `2c`, element
/// `64c + 32 + l` from bit `2c + 1`. `q = nibble + 16 * bit` (0..31),
/// `y = (d * sc) * q - dmin * m`.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ5K {
    /// Super-block scale for the sub-block scales.
    pub d: f16,
    /// Super-block scale for the sub-block mins.
    pub dmin: f16,
    /// 8 six-bit scales and 8 six-bit mins, packed as in `get_scale_min_k4`.
    pub scales: [u8; 12],
    /// 5th quant bits: byte l, bit s serves element 32s + l.
    pub qh: [u8; QK_K / 8],
    /// Low 4 bits, laid out as Q4_K's `qs`.
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ5K>() == 176);

/// One Q5_K block, in ggml's loop order.
pub fn dequantize_block_q5k(b: &BlockQ5K, y: &mut [f32; QK_K]) {
    let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
    for c in 0..4 {
        let ql = &b.qs[32 * c..32 * c + 32];
        let (sc1, m1) = get_scale_min_k4(2 * c, &b.scales);
        let (sc2, m2) = get_scale_min_k4(2 * c + 1, &b.scales);
        let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, min2) = (d * f32::from(sc2), dmin * f32::from(m2));
        for l in 0..32 {
            let hi1 = (b.qh[l] >> (2 * c)) & 1;
            let hi2 = (b.qh[l] >> (2 * c + 1)) & 1;
            y[64 * c + l] = d1 * f32::from((ql[l] & 0xF) | hi1 << 4) - min1;
            y[64 * c + 32 + l] = d2 * f32::from((ql[l] >> 4) | hi2 << 4) - min2;
        }
    }
}

/// Decodes `out.len() / 256` packed Q5_K blocks from `src`.
pub fn dequantize_row_q5k(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_q5k);
}
