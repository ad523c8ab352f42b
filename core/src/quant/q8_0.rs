//! Q8_0: 32 int8 quants with one fp16 scale (8.5 bits/weight). Weights use it, and it is the
//! activation format the CPU pairs with Q4_0/Q5_x/Q8_0 weights, so it has a quantiser too.

use half::f16;

use super::{QK, for_each_block};

/// ggml `block_q8_0`. Layout (34 B): `[0..2) d:f16 | [2..34) qs:i8[32]`.
/// Element `j` is `d * qs[j]`.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ8_0 {
    /// Scale (delta).
    pub d: f16,
    /// Signed quants, element order.
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_0>() == 34);

/// `y[j] = d * qs[j]`.
pub fn dequantize_block_q8_0(b: &BlockQ8_0, y: &mut [f32; QK]) {
    let d = b.d.to_f32();
    for (y, &q) in y.iter_mut().zip(&b.qs) {
        *y = d * f32::from(q);
    }
}

/// Decodes `out.len() / 32` packed Q8_0 blocks from `src`.
pub fn dequantize_row_q8_0(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_q8_0);
}

/// ggml's `quantize_row_q8_0_ref`: per block, `amax = max |x|`, `d = amax / 127` (stored as
/// fp16, round to nearest even), `q = roundf(x * (1/d))` with the *unrounded* f32 `d`, ties
/// away from zero; `d == 0` gives all-zero quants.
///
/// `src.len()` must be a multiple of 32 and `dst.len()` its 34-byte-per-block size
/// (debug-asserted; in release only the blocks present in both are written). Never panics:
/// non-finite inputs give what ggml gives where ggml is defined, and quants saturate to
/// int8 (NaN to 0) where C would be undefined.
pub fn quantize_row_q8_0(src: &[f32], dst: &mut [u8]) {
    debug_assert!(
        src.len().is_multiple_of(QK) && dst.len() == src.len() / QK * size_of::<BlockQ8_0>()
    );
    let (x_blocks, _) = src.as_chunks::<QK>();
    for (x, out) in x_blocks
        .iter()
        .zip(dst.chunks_exact_mut(size_of::<BlockQ8_0>()))
    {
        out.copy_from_slice(bytemuck::bytes_of(&quantize_block_q8_0(x)));
    }
}

/// One block of [`quantize_row_q8_0`].
pub fn quantize_block_q8_0(x: &[f32; QK]) -> BlockQ8_0 {
    // ggml: amax = MAX(amax, fabsf(v)) with MAX(a, b) = a > b ? a : b. Written the same way
    // so a NaN input behaves as in ggml (it replaces amax, and the next element replaces it).
    let amax = x.iter().fold(
        0.0f32,
        |amax, &v| if amax > v.abs() { amax } else { v.abs() },
    );
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    BlockQ8_0 {
        d: f16::from_f32(d),
        // libm::roundf rounds half away from zero, like C roundf; `as` saturates.
        qs: x.map(|v| libm::roundf(v * id) as i8),
    }
}
