//! Activation quantisers: one f32 row in, one quantised row out, in the two integer formats
//! the CPU pairs with quantised weights (spec/formats.md §4.1, §4.2).
//!
//! The *values* are ggml's: Q8_0 is core's [`quantize_block_q8_0`] (ggml's
//! `quantize_row_q8_0_ref`), Q8_K follows `quantize_row_q8_K_ref`. The *layout* is ours:
//! struct-of-arrays, so that the int8 quants of a row are contiguous and the per-block
//! scales can be loaded eight at a time as f32 (no fp16 conversion in the hot loop).
//!
//! Q8_0 row (`cols = 32·nb`), [`q8_0_row_bytes`]:
//! `[0, cols) qs:i8 | [cols, cols+4nb) d:f32 | [cols+4nb, cols+8nb) ds:f32`
//! where `d` is ggml's fp16 scale widened to f32 (exact) and `ds = d · Σ qs` over the block
//! (exact too: 11 significant bits times at most 13). `ds` serves the offset and min terms of
//! Q4_0/Q4_1/Q5_x and compressed-tensors weights.
//!
//! Q8_K row (`cols = 256·nb`), [`q8k_row_bytes`]:
//! `[0, cols) qs:i8 | [cols, cols+4nb) d:f32 | [cols+4nb, cols+36nb) bsums:i16[16]`
//! with `bsums[16b + j] = Σ qs[256b + 16j .. +16]`.
//!
//! One deliberate difference from ggml: a block containing a NaN gets `d = NaN`, so the NaN
//! reaches every dot product that reads the block. ggml instead quantises the NaN to 0 (or,
//! for Q8_0, poisons `d` only when the NaN is the block's last element), which hides it.
//! Finite blocks and blocks with ±inf (ggml already gives d = ±inf there) are bit-identical
//! to ggml.

use lagoon_core::quant::q8_0::quantize_block_q8_0;
use lagoon_core::quant::{QK, QK_K};

/// Bytes of a Q8_0 activation row of `cols` (a multiple of 32) elements.
pub const fn q8_0_row_bytes(cols: usize) -> usize {
    cols + 8 * (cols / QK)
}

/// Bytes of a Q8_K activation row of `cols` (a multiple of 256) elements.
pub const fn q8k_row_bytes(cols: usize) -> usize {
    cols + 36 * (cols / QK_K)
}

/// The parts of a Q8_0 activation row.
#[derive(Clone, Copy)]
pub struct Q8_0Act<'a> {
    /// int8 quants, element order.
    pub qs: &'a [i8],
    /// Per-block scale (f32 little-endian bytes).
    pub d: &'a [[u8; 4]],
    /// Per-block `d · Σ qs` (f32 little-endian bytes).
    pub ds: &'a [[u8; 4]],
}

impl<'a> Q8_0Act<'a> {
    /// Splits a row of `cols` elements; `None` if `bytes` is not exactly that row's size.
    #[inline]
    pub fn new(bytes: &'a [u8], cols: usize) -> Option<Self> {
        if !cols.is_multiple_of(QK) || bytes.len() != q8_0_row_bytes(cols) {
            return None;
        }
        let nb = cols / QK;
        let (qs, rest) = bytes.split_at(cols);
        let (d, ds) = rest.split_at(4 * nb);
        Some(Q8_0Act {
            qs: i8_slice(qs),
            d: d.as_chunks::<4>().0,
            ds: ds.as_chunks::<4>().0,
        })
    }

    /// Scale of block `b`.
    #[inline]
    pub fn d(&self, b: usize) -> f32 {
        f32::from_le_bytes(self.d[b])
    }

    /// `d · Σ qs` of block `b`.
    #[inline]
    pub fn ds(&self, b: usize) -> f32 {
        f32::from_le_bytes(self.ds[b])
    }
}

/// The parts of a Q8_K activation row.
#[derive(Clone, Copy)]
pub struct Q8KAct<'a> {
    /// int8 quants, element order.
    pub qs: &'a [i8],
    /// Per-256-block scale (f32 little-endian bytes).
    pub d: &'a [[u8; 4]],
    /// Per-16 sums of `qs` (i16 little-endian bytes), 16 per block.
    pub bsums: &'a [[u8; 2]],
}

impl<'a> Q8KAct<'a> {
    /// Splits a row of `cols` elements; `None` if `bytes` is not exactly that row's size.
    #[inline]
    pub fn new(bytes: &'a [u8], cols: usize) -> Option<Self> {
        if !cols.is_multiple_of(QK_K) || bytes.len() != q8k_row_bytes(cols) {
            return None;
        }
        let nb = cols / QK_K;
        let (qs, rest) = bytes.split_at(cols);
        let (d, bsums) = rest.split_at(4 * nb);
        Some(Q8KAct {
            qs: i8_slice(qs),
            d: d.as_chunks::<4>().0,
            bsums: bsums.as_chunks::<2>().0,
        })
    }

    /// Scale of super-block `b`.
    #[inline]
    pub fn d(&self, b: usize) -> f32 {
        f32::from_le_bytes(self.d[b])
    }

    /// Sum of the 16 quants of group `j` (0..16) of super-block `b`.
    #[inline]
    pub fn bsum(&self, b: usize, j: usize) -> i16 {
        i16::from_le_bytes(self.bsums[16 * b + j])
    }
}

/// Views bytes as `i8` (same size and alignment).
#[inline]
fn i8_slice(b: &[u8]) -> &[i8] {
    // SAFETY: u8 and i8 have the same size, alignment and validity (every bit pattern), so
    // the pointer and length describe the same initialised memory for the same lifetime.
    unsafe { core::slice::from_raw_parts(b.as_ptr().cast::<i8>(), b.len()) }
}

/// Quantises `x` (a multiple of 32 elements) into a Q8_0 activation row (`out` exactly
/// [`q8_0_row_bytes`]). Values are ggml's `quantize_row_q8_0_ref` (through core's
/// quantiser): `d = fp16(amax/127)`, `q = roundf(x · 127/amax)` ties away from zero.
///
/// llama.cpp on AVX2 rounds ties to even instead (spec §4.2); the two differ only for
/// elements landing exactly on .5, a one-unit difference in one quant.
pub fn quantize_row_q8_0(x: &[f32], out: &mut [u8]) {
    let cols = x.len();
    debug_assert!(cols.is_multiple_of(QK) && out.len() == q8_0_row_bytes(cols));
    let nb = cols / QK;
    if out.len() != q8_0_row_bytes(cols) {
        out.fill(0xFF); // all-NaN scales: a wrong call shows up as NaN, never a panic
        return;
    }
    let (qs, rest) = out.split_at_mut(cols);
    let (d_out, ds_out) = rest.split_at_mut(4 * nb);
    let blocks = x.as_chunks::<QK>().0;
    for (b, xb) in blocks.iter().enumerate() {
        let blk = quantize_block_q8_0(xb);
        let nan = xb.iter().any(|v| v.is_nan());
        let d = if nan { f32::NAN } else { blk.d.to_f32() };
        let mut sum = 0i32;
        for (o, &q) in qs[QK * b..QK * (b + 1)].iter_mut().zip(&blk.qs) {
            *o = q as u8;
            sum += i32::from(q);
        }
        d_out[4 * b..4 * b + 4].copy_from_slice(&d.to_le_bytes());
        ds_out[4 * b..4 * b + 4].copy_from_slice(&(d * sum as f32).to_le_bytes());
    }
}

/// ggml's `nearest_int`: adds 1.5·2²³ so the f32 adder rounds to nearest, ties to even,
/// and reads the integer back from the mantissa. Valid for |v| < 2²²; NaN gives garbage
/// bits (as in ggml), which callers mask by poisoning `d`.
#[inline]
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0).to_bits() as i32;
    (bits & 0x007F_FFFF) - 0x0040_0000
}

/// Quantises `x` (a multiple of 256 elements) into a Q8_K activation row (`out` exactly
/// [`q8k_row_bytes`]), with ggml's `quantize_row_q8_K_ref` semantics:
///
/// * `max` is the element of largest magnitude, **with its sign** (first one on ties; NaN
///   never wins the comparison);
/// * all-zero block: `d = 0`, quants and sums 0;
/// * otherwise `iscale = −127 / max`, `q = min(127, nearest_int(iscale · x))` (ties to even),
///   `d = 1 / iscale` as f32 — so `d` is **negative** when the largest element is positive,
///   and the quants carry the opposite sign of `x`; `d · q` still approximates `x`;
/// * `bsums[j]` = Σ of the 16 quants of group j.
pub fn quantize_row_q8k(x: &[f32], out: &mut [u8]) {
    let cols = x.len();
    debug_assert!(cols.is_multiple_of(QK_K) && out.len() == q8k_row_bytes(cols));
    let nb = cols / QK_K;
    if out.len() != q8k_row_bytes(cols) {
        out.fill(0xFF);
        return;
    }
    let (qs, rest) = out.split_at_mut(cols);
    let (d_out, bsums_out) = rest.split_at_mut(4 * nb);
    for (b, xb) in x.as_chunks::<QK_K>().0.iter().enumerate() {
        let q = &mut qs[QK_K * b..QK_K * (b + 1)];
        let (amax, max, nan) = signed_amax(xb);
        let d = if amax == 0.0 {
            q.fill(0);
            0.0
        } else {
            let iscale = -127.0 / max;
            for (o, &v) in q.iter_mut().zip(xb) {
                *o = nearest_int(iscale * v).min(127) as i8 as u8;
            }
            1.0 / iscale
        };
        let d = if nan { f32::NAN } else { d };
        d_out[4 * b..4 * b + 4].copy_from_slice(&d.to_le_bytes());
        for (j, g) in q.as_chunks::<16>().0.iter().enumerate() {
            let s: i32 = g.iter().map(|&v| i32::from(v as i8)).sum();
            let o = 2 * (16 * b + j);
            bsums_out[o..o + 2].copy_from_slice(&(s as i16).to_le_bytes());
        }
    }
}

/// `(amax, max, nan)` of one super-block: the largest magnitude (NaN never wins, 0 for an
/// all-zero or all-NaN block), the first element with that magnitude, with its sign (the
/// one a sequential `|v| > amax` scan keeps), and whether any element is NaN. The
/// magnitude and the NaN test run in independent lanes (the compiler vectorises them);
/// only the short search for the first maximal element is sequential.
#[inline]
fn signed_amax(xb: &[f32; QK_K]) -> (f32, f32, bool) {
    const W: usize = 16;
    let mut lanes = [0.0f32; W];
    let mut nan = [false; W];
    for c in xb.as_chunks::<W>().0 {
        for l in 0..W {
            // `c[l].abs() > lanes[l]` is false for NaN, as in the sequential scan.
            let a = c[l].abs();
            lanes[l] = if a > lanes[l] { a } else { lanes[l] };
            nan[l] |= c[l].is_nan();
        }
    }
    let amax = lanes.iter().fold(0.0f32, |m, &a| if a > m { a } else { m });
    let max = xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
    (
        amax,
        if amax == 0.0 { 0.0 } else { max },
        nan.contains(&true),
    )
}

/// `e^x` for the fast path's SiLU, within 2 ulp of `expf` on `[-87, 88]` (learned from the
/// Cody–Waite reduction plus polynomial of ggml's `ggml_v_expf` in `ggml-cpu/vec.h`,
/// restated here as plain f32 code the compiler vectorises): `x = n·ln2 + r`, `|r| ≤ ln2/2`,
/// `e^r` by a degree-6 Taylor polynomial, `2^n` built in the exponent bits. Inputs are
/// clamped to `[-87, 88]` (so `2^n` stays a normal float); NaN stays NaN.
#[inline(always)]
fn exp_fast(x: f32) -> f32 {
    // `clamp` (unlike min/max) passes NaN through unchanged.
    let x = x.clamp(-87.0, 88.0);
    // n = round(x / ln2) by the 1.5·2²³ trick (ties to even), exact for |n| < 2²².
    let n = (x * core::f32::consts::LOG2_E + 12_582_912.0) - 12_582_912.0;
    // ln2 split in a high part exact in f32 times n and a low correction.
    let r = (x - n * 0.693_145_75) - n * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let e = f32::from_bits(((n as i32 + 127) as u32) << 23);
    p * e
}

/// `g ← silu(g) · u` elementwise (SwiGLU), SiLU as `g / (1 + e^(−g))` with `exp_fast`: the
/// fast path's activation. Each element's value depends only on its own inputs.
pub fn swiglu_in_place(g: &mut [f32], u: &[f32]) {
    const W: usize = 16;
    let n = g.len().min(u.len());
    let (gc, gt) = g[..n].as_chunks_mut::<W>();
    let (uc, ut) = u[..n].as_chunks::<W>();
    for (g, u) in gc.iter_mut().zip(uc) {
        for l in 0..W {
            g[l] = g[l] / (1.0 + exp_fast(-g[l])) * u[l];
        }
    }
    for (g, &u) in gt.iter_mut().zip(ut) {
        *g = *g / (1.0 + exp_fast(-*g)) * u;
    }
}

/// RMSNorm of each `w.len()`-wide row of `x` into `out` (`out = w · x / sqrt(mean(x²) +
/// eps)`), the fast path's: the sum of squares by [`dot_lanes`] instead of
/// `lagoon_core::ops::norm::rms_norm`'s one serial chain, whose 128 dependent adds per head
/// made a decode step's QK norms ~3.5 µs a node on the 16-core host (BENCHMARKS.md, "Session
/// 22"). The same operations otherwise; the sum's rounding differs from the reference's.
pub fn rms_norm_lanes(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    if n == 0 {
        return;
    }
    for (xg, og) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let r = 1.0 / (dot_lanes(xg, xg) / n as f32 + eps).sqrt();
        for ((o, &v), &g) in og.iter_mut().zip(xg).zip(w) {
            *o = g * (v * r);
        }
    }
}

/// Partial sums of [`dot_lanes`].
pub const DOT_LANES: usize = 16;

/// `a · b` accumulated in [`DOT_LANES`] independent lanes (element `i` into lane
/// `i % DOT_LANES`), the lanes then summed pairwise in a fixed order and the tail added last:
/// the compiler keeps several vector accumulators in flight instead of one serial chain.
pub fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; DOT_LANES];
    let (ac, at) = a.as_chunks::<DOT_LANES>();
    let (bc, bt) = b.as_chunks::<DOT_LANES>();
    for (x, y) in ac.iter().zip(bc) {
        for l in 0..DOT_LANES {
            acc[l] += x[l] * y[l];
        }
    }
    let mut w = DOT_LANES;
    while w > 1 {
        w /= 2;
        for l in 0..w {
            acc[l] += acc[l + w];
        }
    }
    let mut s = acc[0];
    for (x, y) in at.iter().zip(bt) {
        s += x * y;
    }
    s
}

/// Decodes a Q8_0 activation row back to f32 (`d · q`), for tests and debugging.
pub fn dequantize_row_q8_0(bytes: &[u8], out: &mut [f32]) {
    let Some(a) = Q8_0Act::new(bytes, out.len()) else {
        out.fill(f32::NAN);
        return;
    };
    for (i, o) in out.iter_mut().enumerate() {
        *o = a.d(i / QK) * f32::from(a.qs[i]);
    }
}

/// Decodes a Q8_K activation row back to f32 (`d · q`), for tests and debugging.
pub fn dequantize_row_q8k(bytes: &[u8], out: &mut [f32]) {
    let Some(a) = Q8KAct::new(bytes, out.len()) else {
        out.fill(f32::NAN);
        return;
    };
    for (i, o) in out.iter_mut().enumerate() {
        *o = a.d(i / QK_K) * f32::from(a.qs[i]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_lanes_close_to_the_reference() {
        for n in [1usize, 15, 16, 128, 130, 2048] {
            let x: Vec<f32> = (0..3 * n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.03)
                .collect();
            let w: Vec<f32> = (0..n).map(|i| 0.5 + (i % 7) as f32 * 0.1).collect();
            let (mut a, mut b) = (vec![0.0; 3 * n], vec![0.0; 3 * n]);
            rms_norm_lanes(&x, &w, 1e-6, &mut a);
            lagoon_core::ops::norm::rms_norm(&x, &w, 1e-6, &mut b);
            for (i, (p, q)) in a.iter().zip(&b).enumerate() {
                assert!(
                    (p - q).abs() <= 1e-5 * q.abs().max(1e-3),
                    "n {n} [{i}]: {p} vs {q}"
                );
            }
        }
        // Zero rows stay finite (eps), an empty width writes nothing.
        let mut o = [9.0f32; 4];
        rms_norm_lanes(&[0.0; 4], &[1.0; 4], 1e-6, &mut o);
        assert_eq!(o, [0.0; 4]);
        rms_norm_lanes(&[1.0; 4], &[], 1e-6, &mut o);
    }

    #[test]
    fn exp_fast_close_to_expf() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp_fast(x), libm_free_exp(x));
            assert!(
                ((got - want) / want).abs() < 4e-7,
                "exp({x}) = {got}, want {want}"
            );
            x += 0.0137;
        }
        assert!(exp_fast(f32::NAN).is_nan());
        assert!(exp_fast(-1000.0) > 0.0 && exp_fast(1000.0).is_finite());
        let mut g = [0.5f32, -3.0, 20.0, -100.0, f32::NAN];
        swiglu_in_place(&mut g, &[2.0; 5]);
        assert!((g[0] - 2.0 * 0.5 / (1.0 + (-0.5f64).exp()) as f32).abs() < 1e-6);
        assert!((g[2] - 40.0).abs() < 1e-5 && g[3].abs() < 1e-30 && g[4].is_nan());
    }

    /// `e^x` in f64 rounded to f32 (the correctly rounded value, nearly always).
    fn libm_free_exp(x: f32) -> f32 {
        f64::from(x).exp() as f32
    }

    /// The lane-parallel magnitude search against the sequential scan it replaces: ties of
    /// opposite sign (the first wins), NaN, infinities, zeros of both signs, random blocks.
    #[test]
    fn signed_amax_matches_sequential_scan() {
        let scan = |xb: &[f32; QK_K]| {
            let (mut amax, mut max, mut nan) = (0.0f32, 0.0f32, false);
            for &v in xb {
                nan |= v.is_nan();
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            (amax, max, nan)
        };
        let mut s = 0x2545_f491_4f6c_dd1du64;
        for case in 0..400 {
            let mut xb = [0.0f32; QK_K];
            for v in xb.iter_mut() {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                // Few distinct magnitudes, so ties of both signs are common.
                *v = ((s >> 61) as f32 - 3.5) * if case % 2 == 0 { 0.25 } else { 1.0e-3 };
            }
            match case % 8 {
                1 => xb[(case * 7) % QK_K] = f32::NAN,
                2 => xb[(case * 3) % QK_K] = f32::NEG_INFINITY,
                3 => xb.fill(if case % 16 == 3 { -0.0 } else { 0.0 }),
                4 => xb.fill(f32::NAN),
                _ => {}
            }
            let (a, m, n) = signed_amax(&xb);
            let (wa, wm, wn) = scan(&xb);
            assert_eq!(
                (a.to_bits(), m.to_bits(), n),
                (wa.to_bits(), wm.to_bits(), wn),
                "case {case}"
            );
        }
    }

    #[test]
    fn q8k_sign_convention() {
        // spec §4.2: the largest element +2.0 gives d = −1/63.5 and q = −127 for it.
        let mut x = [0.0f32; QK_K];
        for (i, v) in x.iter_mut().enumerate() {
            *v = (i as f32 - 100.0) / 100.0;
        }
        x[7] = 2.0;
        let mut out = vec![0u8; q8k_row_bytes(QK_K)];
        quantize_row_q8k(&x, &mut out);
        let a = Q8KAct::new(&out, QK_K).unwrap();
        assert_eq!(a.d(0), 1.0 / (-127.0 / 2.0));
        assert!(a.d(0) < 0.0);
        assert_eq!(a.qs[7], -127);
        for j in 0..16 {
            let s: i32 = a.qs[16 * j..16 * j + 16].iter().map(|&v| v as i32).sum();
            assert_eq!(i32::from(a.bsum(0, j)), s);
        }
    }

    #[test]
    fn nearest_int_ties_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-2.6), -3);
        assert_eq!(nearest_int(127.0), 127);
    }

    #[test]
    fn zero_block_and_nan() {
        let mut x = [0.0f32; 2 * QK_K];
        x[QK_K + 3] = f32::NAN;
        x[QK_K + 4] = 1.0;
        let mut out = vec![0u8; q8k_row_bytes(2 * QK_K)];
        quantize_row_q8k(&x, &mut out);
        let a = Q8KAct::new(&out, 2 * QK_K).unwrap();
        assert_eq!(a.d(0), 0.0);
        assert!(a.d(1).is_nan());
        let mut out = vec![0u8; q8_0_row_bytes(64)];
        let mut x = [0.25f32; 64];
        x[0] = f32::NAN;
        quantize_row_q8_0(&x, &mut out);
        let a = Q8_0Act::new(&out, 64).unwrap();
        assert!(a.d(0).is_nan() && a.ds(0).is_nan());
        assert_eq!(a.d(1), quantize_block_q8_0(&[0.25; QK]).d.to_f32());
        assert_eq!(a.ds(1), a.d(1) * 127.0 * 32.0);
    }
}
