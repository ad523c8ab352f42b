//! 1-bit codebook quants: IQ1_S (1.5625 bits/weight) and IQ1_M (1.75), spec/formats.md §3.20.
//!
//! Each 8-weight run is one point of [`IQ1S_GRID`] (8 values in {-1, 0, 1}) shifted by a
//! per-group delta of ±1/8: `y = dl * (grid[idx].byte[j] as i8 + delta)`, with an odd integer
//! sub-block scale `dl = d * (2k + 1)`. No signs are stored.

use half::f16;

use super::tables::IQ1S_GRID;
use super::{QK_K, for_each_block};

/// The magnitude of the shift added to every grid value (ggml `IQ1S_DELTA`, `IQ1M_DELTA`).
pub const IQ1S_DELTA: f32 = 0.125;

/// ggml `block_iq1_s`. Layout (50 B): `[0..2) d:f16 | [2..34) qs[32] | [34..50) qh:u16 LE[8]`.
///
/// Sub-block `ib`: `h = qh[ib]`, `dl = d * (2 * ((h >> 12) & 7) + 1)`, delta `-1/8` if bit
/// 15 of `h` is set else `+1/8`. Run `l` (0..4) indexes the grid with
/// `qs[4ib + l] | ((h >> 3l) & 7) << 8` (11 bits).
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockIQ1S {
    /// Super-block scale.
    pub d: f16,
    /// Low 8 bits of the grid indices, one per run.
    pub qs: [u8; QK_K / 8],
    /// Per sub-block, a little-endian u16: four 3-bit index highs, the 3-bit scale at bit 12,
    /// the delta sign at bit 15.
    pub qh: [u8; QK_K / 16],
}
const _: () = assert!(size_of::<BlockIQ1S>() == 50);

/// ggml `block_iq1_m`. Layout (56 B): `[0..32) qs[32] | [32..48) qh[16] | [48..56) scales`,
/// with `scales` read as four u16 LE words `s0..s3`.
///
/// There is no `d` field: the fp16 super-scale's bits are the top nibbles of the words,
/// `s0 >> 12 | (s1 >> 8) & 0xF0 | (s2 >> 4) & 0xF00 | s3 & 0xF000`. Sub-block `ib` has two
/// 3-bit scales at bits `6(ib % 2)` and `6(ib % 2) + 3` of `s[ib / 2]` (runs 0-1 use the
/// first, runs 2-3 the second), each giving `d * (2k + 1)`. With `h0 = qh[2ib]`,
/// `h1 = qh[2ib + 1]`, runs 0..4 take their index high bits from `h0 & 7`, `h0 >> 4 & 7`,
/// `h1 & 7`, `h1 >> 4 & 7` and their delta sign from bits 3, 7, 3, 7 of the same bytes.
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockIQ1M {
    /// Low 8 bits of the grid indices, one per run.
    pub qs: [u8; QK_K / 8],
    /// Per run, a nibble: 3 index high bits, then the delta sign.
    pub qh: [u8; QK_K / 16],
    /// Four u16 LE: 3-bit sub-block scales in bits 0-11, fp16 super-scale nibbles in 12-15.
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIQ1M>() == 56);

impl BlockIQ1M {
    /// The four scale words, little-endian.
    #[inline]
    pub fn scale_words(&self) -> [u16; 4] {
        let (w, _) = self.scales.as_chunks::<2>();
        core::array::from_fn(|k| u16::from_le_bytes(w[k]))
    }

    /// The fp16 super-scale assembled from the top nibbles of the scale words.
    #[inline]
    pub fn d(&self) -> f16 {
        let s = self.scale_words();
        f16::from_bits(
            (s[0] >> 12) | ((s[1] >> 8) & 0x00F0) | ((s[2] >> 4) & 0x0F00) | (s[3] & 0xF000),
        )
    }
}

/// One 8-weight run: `dl * (grid byte j as i8 + delta)`.
#[inline]
fn iq1_run(dl: f32, idx: usize, delta: f32, y: &mut [f32; 8]) {
    for (y, g) in y.iter_mut().zip(IQ1S_GRID[idx].to_le_bytes()) {
        *y = dl * (f32::from(g as i8) + delta);
    }
}

/// One IQ1_S block.
pub fn dequantize_block_iq1_s(b: &BlockIQ1S, y: &mut [f32; QK_K]) {
    let d = b.d.to_f32();
    let (qh, _) = b.qh.as_chunks::<2>();
    let (runs, _) = y.as_chunks_mut::<8>();
    for (r, y) in runs.iter_mut().enumerate() {
        let (ib, l) = (r / 4, r % 4);
        let h = u16::from_le_bytes(qh[ib]);
        let dl = d * f32::from(2 * ((h >> 12) & 7) + 1);
        let delta = if h & 0x8000 != 0 {
            -IQ1S_DELTA
        } else {
            IQ1S_DELTA
        };
        let idx = usize::from(b.qs[r]) | usize::from((h >> (3 * l)) & 7) << 8;
        iq1_run(dl, idx, delta, y);
    }
}

/// Decodes `out.len() / 256` packed IQ1_S blocks from `src`.
pub fn dequantize_row_iq1_s(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_iq1_s);
}

/// One IQ1_M block.
pub fn dequantize_block_iq1_m(b: &BlockIQ1M, y: &mut [f32; QK_K]) {
    let d = b.d().to_f32();
    let sc = b.scale_words();
    let (runs, _) = y.as_chunks_mut::<8>();
    for (r, y) in runs.iter_mut().enumerate() {
        let (ib, l) = (r / 4, r % 4);
        let shift = 6 * (ib % 2) + 3 * (l / 2);
        let dl = d * f32::from(2 * ((sc[ib / 2] >> shift) & 7) + 1);
        let h = b.qh[2 * ib + l / 2] >> (4 * (l % 2)); // this run's nibble
        let delta = if h & 0x08 != 0 {
            -IQ1S_DELTA
        } else {
            IQ1S_DELTA
        };
        let idx = usize::from(b.qs[r]) | usize::from(h & 7) << 8;
        iq1_run(dl, idx, delta, y);
    }
}

/// Decodes `out.len() / 256` packed IQ1_M blocks from `src`.
pub fn dequantize_row_iq1_m(src: &[u8], out: &mut [f32]) {
    for_each_block(src, out, dequantize_block_iq1_m);
}
