//! Q3_K: 256-element super-block of 16 sub-blocks of 16, 3-bit quants (2 low bits plus a
//! high-bit mask) with signed 6-bit scales (3.4375 bits/weight).

use half::f16;

use super::{QK_K, for_each_block};

/// ggml `block_q3_K`. Layout (110 B):
/// `[0..32) hmask[32] | [32..96) qs[64] | [96..108) scales[12] | [108..110) d:f16`.
///
/// Element `i`: half `n = i / 128`, plane `k = (i % 128) / 32`, byte `l = i % 32`;
/// `low2 = (qs[32n + l] >> 2k) & 3`; the high bit is `hmask[l]` bit `4n + k`, and a *set*
/// bit means "no -4": `q = low2 - (bit ? 0 : 4)` in -4..3. `y = (d * sc[i / 16]) * q`.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ3K {
    /// High bits of the quants; byte l serves element l of every 32-plane (bit 4n + k).
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits of the quants, four planes per byte.
    pub qs: [u8; QK_K / 4],
    /// 16 six-bit scales, packed (see [`q3k_scales`]); stored biased by 32.
    pub scales: [u8; 12],
    /// Super-block scale.
    pub d: f16,
}
const _: () = assert!(size_of::<BlockQ3K>() == 110);

/// Unpacks the 16 signed scales (-32..31). Sub-block j: the low 4 bits are
/// `j < 8 ? b[j] & 0xF : b[j - 8] >> 4`, the high 2 bits `(b[8 + j % 4] >> 2(j / 4)) & 3`.
pub fn q3k_scales(b: &[u8; 12]) -> [i8; 16] {
    core::array::from_fn(|j| {
        let low4 = if j < 8 { b[j] & 0xF } else { b[j - 8] >> 4 };
        let high2 = (b[8 + j % 4] >> (2 * (j / 4))) & 3;
        (low4 | high2 << 4) as i8 - 32
    })
}

/// One Q3_K block (per element, the same f32 operations as ggml).
pub fn dequantize_block_q3k(b: &BlockQ3K, y: &mut [f32; QK_K]) {
    let d = b.d.to_f32();
    let scales = q3k_scales(&b.scales);
    for i in 0..QK_K {
        let (n, k, l) = (i / 128, (i % 128) / 32, i % 32);
        let dl = d * f32::from(scales[i / 16]);
        let low2 = ((b.qs[32 * n + l] >> (2 * k)) & 3) as i8;
        let high = b.hmask[l] & (1 << (4 * n + k)) != 0;
        let q = low2 - if high { 0 } else { 4 };
        y[i] = dl * f32::from(q);
    }
}

/// Decodes `out.len() / 256` packed Q3_K blocks from `src`.
pub fn dequantize_row_q3k(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_q3k);
}

#[cfg(test)]
mod tests {
    #[test]
    fn scales_match_spec_example() {
        // spec/formats.md §3.7 worked example.
        let b = [
            0xC1, 0x42, 0x03, 0x04, 0x85, 0x06, 0x47, 0x08, 0x9A, 0xBC, 0xDE, 0xF0,
        ];
        let want = [
            1, -30, 3, -28, 5, 22, 23, -24, -4, 20, -16, 16, 8, 0, 20, 16,
        ];
        assert_eq!(super::q3k_scales(&b), want);
    }
}
