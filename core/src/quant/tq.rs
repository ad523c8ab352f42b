//! Ternary quants: TQ1_0 (base-3 packed, 1.6875 bits/weight) and TQ2_0 (2-bit, 2.0625),
//! spec/formats.md §3.21. Every weight is `d * t` with `t` in {-1, 0, 1}.

use half::f16;

use super::{QK_K, for_each_block};

/// ggml `block_tq1_0`. Layout (54 B): `[0..48) qs[48] | [48..52) qh[4] | [52..54) d:f16`.
///
/// Each byte packs base-3 digits as a fixed-point fraction: digit `n` of byte `q` is
/// `((q * 3^n mod 256) * 3) >> 8`, and the weight is `digit - 1`. Output order: digits 0-4
/// of bytes 0-31 (digit-major, 160 weights), digits 0-4 of bytes 32-47 (80), digits 0-3 of
/// the 4 `qh` bytes (16).
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockTQ1_0 {
    /// Five base-3 digits per byte.
    pub qs: [u8; (QK_K - 4 * QK_K / 64) / 5],
    /// Four base-3 digits per byte.
    pub qh: [u8; QK_K / 64],
    /// Scale.
    pub d: f16,
}
const _: () = assert!(size_of::<BlockTQ1_0>() == 54);

/// ggml `block_tq2_0`. Layout (66 B): `[0..64) qs[64] | [64..66) d:f16`.
/// In each 32-byte half `h`, 2-bit plane `p` of byte `m` is weight `128h + 32p + m`, stored
/// as `t + 1`.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockTQ2_0 {
    /// Four 2-bit weights per byte.
    pub qs: [u8; QK_K / 4],
    /// Scale.
    pub d: f16,
}
const _: () = assert!(size_of::<BlockTQ2_0>() == 66);

/// Base-3 digit `n` of a TQ1_0 byte, as -1, 0 or 1.
#[inline]
fn tq1_digit(q: u8, n: u32) -> i8 {
    let shifted = q.wrapping_mul(3u8.pow(n));
    ((u16::from(shifted) * 3) >> 8) as i8 - 1
}

/// One TQ1_0 block.
pub fn dequantize_block_tq1_0(b: &BlockTQ1_0, y: &mut [f32; QK_K]) {
    let d = b.d.to_f32();
    let groups: [(&[u8], u32); 3] = [(&b.qs[..32], 5), (&b.qs[32..], 5), (&b.qh, 4)];
    let mut out = y.iter_mut();
    for (bytes, digits) in groups {
        for n in 0..digits {
            for (&q, y) in bytes.iter().zip(&mut out) {
                *y = f32::from(tq1_digit(q, n)) * d;
            }
        }
    }
}

/// Decodes `out.len() / 256` packed TQ1_0 blocks from `src`.
pub fn dequantize_row_tq1_0(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_tq1_0);
}

/// One TQ2_0 block.
pub fn dequantize_block_tq2_0(b: &BlockTQ2_0, y: &mut [f32; QK_K]) {
    let d = b.d.to_f32();
    for (i, y) in y.iter_mut().enumerate() {
        let (h, p, m) = (i / 128, (i % 128) / 32, i % 32);
        let t = ((b.qs[32 * h + m] >> (2 * p)) & 3) as i8 - 1;
        *y = f32::from(t) * d;
    }
}

/// Decodes `out.len() / 256` packed TQ2_0 blocks from `src`.
pub fn dequantize_row_tq2_0(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_tq2_0);
}
