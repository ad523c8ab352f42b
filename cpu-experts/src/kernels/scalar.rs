//! Scalar integer `vec_dot` kernels, one per weight/activation pairing (spec §4.1): the
//! oracle every SIMD kernel is tested against, and the path used when no SIMD is detected
//! or `LAGOON_FORCE_SCALAR=1`.
//!
//! Every kernel has the signature `super::RowDot`: one weight row's bytes, one activation
//! row (layouts in [`super::act`]) and the element count; it returns the dot product. The
//! integer part of each block is exact (i32); the f32 accumulation runs block by block in
//! ggml's reference order (`sumf += sumi · (d_w · d_a)`). A length mismatch returns NaN
//! rather than panicking (callers validated the shapes at load; this is belt and braces).

use lagoon_core::quant::{QK, QK_K};

use super::act::{Q8_0Act, Q8KAct};

mod iq;
pub use iq::*;

/// Exact IEEE binary16 → f32 (subnormals, ±inf, NaN payloads).
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1F);
    let man = u32::from(h & 0x3FF);
    let bits = match exp {
        0 => (man as f32 * (1.0 / 16_777_216.0)).to_bits(), // man · 2⁻²⁴, exact
        31 => 0x7F80_0000 | man << 13,
        _ => (exp + 112) << 23 | man << 13,
    };
    f32::from_bits(sign | bits)
}

/// f16 at byte offset `o` of a block.
#[inline]
pub(crate) fn f16_at(b: &[u8], o: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[o], b[o + 1]]))
}

/// The row as `nb` blocks of `B` bytes, or `None` if it is not exactly that.
#[inline]
pub(crate) fn blocks<const B: usize>(w: &[u8], nb: usize) -> Option<&[[u8; B]]> {
    let (b, tail) = w.as_chunks::<B>();
    (tail.is_empty() && b.len() == nb).then_some(b)
}

/// `Σ w·a` over two equal-length i8 slices, exact.
#[inline]
fn dot_i8(w: &[i8], a: &[i8]) -> i32 {
    w.iter()
        .zip(a)
        .map(|(&x, &y)| i32::from(x) * i32::from(y))
        .sum()
}

// ---------------------------------------------------------------------------------------
// Q8_0-paired weights (32-element blocks).
// ---------------------------------------------------------------------------------------

/// The signed quants of one legacy block and its scale; `min` is `Some` for Q4_1/Q5_1.
struct Legacy {
    d: f32,
    min: Option<f32>,
    q: [i8; QK],
}

/// Shared loop of the legacy kernels: `sumf += sumi · (d_w · d_a)` per block, plus
/// `m_w · (d_a · Σ q_a)` for the types with a min.
///
/// ggml pairs Q4_1/Q5_1 with Q8_1, whose `s = fp16(d_a · Σ q_a)` is rounded to fp16; we use
/// the exact f32 `ds` of our Q8_0 row instead, which is closer to the true product (the two
/// differ by at most 2⁻¹¹ relative on the min term).
#[inline]
fn legacy_dot<const B: usize>(
    w: &[u8],
    a: &[u8],
    n: usize,
    decode: impl Fn(&[u8; B]) -> Legacy,
) -> f32 {
    let (Some(a), Some(wb)) = (Q8_0Act::new(a, n), blocks::<B>(w, n / QK)) else {
        return f32::NAN;
    };
    let mut acc = 0.0f32;
    for (b, (blk, qa)) in wb.iter().zip(a.qs.as_chunks::<QK>().0).enumerate() {
        let l = decode(blk);
        let sumi = dot_i8(&l.q, qa);
        acc += sumi as f32 * (l.d * a.d(b));
        if let Some(m) = l.min {
            acc += m * a.ds(b);
        }
    }
    acc
}

/// Q8_0 × Q8_0. Block (34 B): `d:f16 | qs:i8[32]`.
pub fn vec_dot_q8_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    legacy_dot::<34>(w, a, n, |b| Legacy {
        d: f16_at(b, 0),
        min: None,
        q: core::array::from_fn(|j| b[2 + j] as i8),
    })
}

/// Nibbles of a 16-byte legacy `qs`: element j low nibble of byte j, j + 16 high nibble.
#[inline]
fn nibbles(qs: &[u8], off: i8) -> [i8; QK] {
    core::array::from_fn(|j| {
        let v = if j < 16 { qs[j] & 0xF } else { qs[j - 16] >> 4 };
        v as i8 - off
    })
}

/// 5-bit quants: low 4 bits as [`nibbles`], bit 4 of element j is bit j of `qh` (LE u32).
#[inline]
fn fives(qh: &[u8], qs: &[u8], off: i8) -> [i8; QK] {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let lo = nibbles(qs, 0);
    core::array::from_fn(|j| (lo[j] | (((h >> j) & 1) << 4) as i8) - off)
}

/// Q4_0 × Q8_0. Block (18 B): `d:f16 | qs[16]`, q = nibble − 8.
pub fn vec_dot_q4_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    legacy_dot::<18>(w, a, n, |b| Legacy {
        d: f16_at(b, 0),
        min: None,
        q: nibbles(&b[2..], 8),
    })
}

/// Q4_1 × Q8_0 (+ exact block sums; see `legacy_dot`). Block (20 B): `d | m | qs[16]`.
pub fn vec_dot_q4_1_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    legacy_dot::<20>(w, a, n, |b| Legacy {
        d: f16_at(b, 0),
        min: Some(f16_at(b, 2)),
        q: nibbles(&b[4..], 0),
    })
}

/// Q5_0 × Q8_0. Block (22 B): `d | qh:u32 | qs[16]`, q = 5-bit − 16.
pub fn vec_dot_q5_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    legacy_dot::<22>(w, a, n, |b| Legacy {
        d: f16_at(b, 0),
        min: None,
        q: fives(&b[2..6], &b[6..], 16),
    })
}

/// Q5_1 × Q8_0 (+ exact block sums). Block (24 B): `d | m | qh:u32 | qs[16]`.
pub fn vec_dot_q5_1_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    legacy_dot::<24>(w, a, n, |b| Legacy {
        d: f16_at(b, 0),
        min: Some(f16_at(b, 2)),
        q: fives(&b[4..8], &b[8..], 0),
    })
}

// ---------------------------------------------------------------------------------------
// Q8_K-paired weights (256-element super-blocks).
// ---------------------------------------------------------------------------------------

/// Unpacked super-block: 256 quants (signed or unsigned per type), per-16 integer scales and
/// mins, and the two f32 super-scales (`dmin` 0 when the type has no mins).
struct KBlock {
    q: [i8; QK_K],
    sc: [i16; 16],
    m: [i16; 16],
    d: f32,
    dmin: f32,
}

/// Shared loop of the K-quant kernels, per super-block:
/// `sumf += (d_a·d_w) · Σ_j sc_j·Σ_{16} q·a  −  (d_a·dmin_w) · Σ_j m_j·bsums_j`.
#[inline]
fn k_dot<const B: usize>(w: &[u8], a: &[u8], n: usize, decode: impl Fn(&[u8; B]) -> KBlock) -> f32 {
    let (Some(a), Some(wb)) = (Q8KAct::new(a, n), blocks::<B>(w, n / QK_K)) else {
        return f32::NAN;
    };
    let mut acc = 0.0f32;
    for (b, (blk, qa)) in wb.iter().zip(a.qs.as_chunks::<QK_K>().0).enumerate() {
        let k = decode(blk);
        let mut sumi = 0i32;
        let mut summ = 0i32;
        for j in 0..16 {
            let r = 16 * j..16 * j + 16;
            sumi += i32::from(k.sc[j]) * dot_i8(&k.q[r.clone()], &qa[r]);
            summ += i32::from(k.m[j]) * i32::from(a.bsum(b, j));
        }
        let da = a.d(b);
        acc += (da * k.d) * sumi as f32;
        acc -= (da * k.dmin) * summ as f32;
    }
    acc
}

/// The 6-bit scale and min of sub-block `j` (0..8) of Q4_K/Q5_K (`get_scale_min_k4`,
/// spec §3.8): bytes 0-3 hold scales 0-3 (+ high bits of scales 4-7 in bits 6-7), bytes
/// 4-7 mins 0-3 (+ high bits of mins 4-7), bytes 8-11 the low nibbles of scales/mins 4-7.
#[inline]
pub(crate) fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Per-16 scales and mins of Q4_K/Q5_K (each 32-element sub-block's value twice).
#[inline]
fn k4_scales(s: &[u8]) -> ([i16; 16], [i16; 16]) {
    let mut sc = [0i16; 16];
    let mut m = [0i16; 16];
    for j in 0..8 {
        let (a, b) = scale_min_k4(j, s);
        sc[2 * j] = a.into();
        sc[2 * j + 1] = a.into();
        m[2 * j] = b.into();
        m[2 * j + 1] = b.into();
    }
    (sc, m)
}

/// Q4_K × Q8_K. Block (144 B): `d | dmin | scales[12] | qs[128]`; chunk c of 64 elements:
/// low nibbles of `qs[32c..]` then high nibbles.
pub fn vec_dot_q4k_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    k_dot::<144>(w, a, n, |b| {
        let (sc, m) = k4_scales(&b[4..16]);
        let qs = &b[16..144];
        KBlock {
            q: core::array::from_fn(|i| {
                let (c, half, l) = (i / 64, (i / 32) % 2, i % 32);
                let v = qs[32 * c + l];
                (if half == 0 { v & 0xF } else { v >> 4 }) as i8
            }),
            sc,
            m,
            d: f16_at(b, 0),
            dmin: f16_at(b, 2),
        }
    })
}

/// Q5_K × Q8_K. Block (176 B): `d | dmin | scales[12] | qh[32] | qs[128]`; as Q4_K plus
/// bit 4 of element `32s + l` from `qh[l]` bit s.
pub fn vec_dot_q5k_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    k_dot::<176>(w, a, n, |b| {
        let (sc, m) = k4_scales(&b[4..16]);
        let (qh, qs) = (&b[16..48], &b[48..176]);
        KBlock {
            q: core::array::from_fn(|i| {
                let (c, half, l) = (i / 64, (i / 32) % 2, i % 32);
                let v = qs[32 * c + l];
                let lo = if half == 0 { v & 0xF } else { v >> 4 };
                (lo | ((qh[l] >> (i / 32)) & 1) << 4) as i8
            }),
            sc,
            m,
            d: f16_at(b, 0),
            dmin: f16_at(b, 2),
        }
    })
}

/// Q6_K × Q8_K. Block (210 B): `ql[128] | qh[64] | scales:i8[16] | d`; element i (n = i/128,
/// g = (i%128)/32, l = i%32): low 4 bits from `ql[64n + l + 32(g&1)]` (low nibble for g < 2),
/// high 2 bits `(qh[32n + l] >> 2g) & 3`, q = that − 32.
pub fn vec_dot_q6k_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    k_dot::<210>(w, a, n, |b| {
        let (ql, qh) = (&b[..128], &b[128..192]);
        KBlock {
            q: core::array::from_fn(|i| {
                let (nh, g, l) = (i / 128, (i % 128) / 32, i % 32);
                let v = ql[64 * nh + l + 32 * (g & 1)];
                let lo = if g < 2 { v & 0xF } else { v >> 4 };
                let hi = (qh[32 * nh + l] >> (2 * g)) & 3;
                (lo | hi << 4) as i8 - 32
            }),
            sc: core::array::from_fn(|j| i16::from(b[192 + j] as i8)),
            m: [0; 16],
            d: f16_at(b, 208),
            dmin: 0.0,
        }
    })
}

/// The 16 signed 6-bit scales of Q3_K (spec §3.7).
#[inline]
pub(crate) fn q3k_scales(b: &[u8]) -> [i8; 16] {
    core::array::from_fn(|j| {
        let low4 = if j < 8 { b[j] & 0xF } else { b[j - 8] >> 4 };
        let high2 = (b[8 + j % 4] >> (2 * (j / 4))) & 3;
        (low4 | high2 << 4) as i8 - 32
    })
}

/// Q3_K × Q8_K. Block (110 B): `hmask[32] | qs[64] | scales[12] | d`; element i (n, k, l as
/// in Q2_K): low 2 bits `(qs[32n + l] >> 2k) & 3`, minus 4 unless `hmask[l]` bit `4n + k`.
pub fn vec_dot_q3k_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    k_dot::<110>(w, a, n, |b| {
        let (hm, qs) = (&b[..32], &b[32..96]);
        let scales = q3k_scales(&b[96..108]);
        KBlock {
            q: core::array::from_fn(|i| {
                let (nh, k, l) = (i / 128, (i % 128) / 32, i % 32);
                let low2 = ((qs[32 * nh + l] >> (2 * k)) & 3) as i8;
                let high = hm[l] & (1 << (4 * nh + k)) != 0;
                low2 - if high { 0 } else { 4 }
            }),
            sc: scales.map(i16::from),
            m: [0; 16],
            d: f16_at(b, 108),
            dmin: 0.0,
        }
    })
}

/// Q2_K × Q8_K. Block (84 B): `scales[16] | qs[64] | d | dmin`; element i: n = i/128,
/// k = (i%128)/32, l = i%32, q = `(qs[32n + l] >> 2k) & 3`; sub-block i/16 has scale
/// `scales & 0xF` and min `scales >> 4`.
pub fn vec_dot_q2k_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    k_dot::<84>(w, a, n, |b| {
        let qs = &b[16..80];
        KBlock {
            q: core::array::from_fn(|i| {
                let (nh, k, l) = (i / 128, (i % 128) / 32, i % 32);
                ((qs[32 * nh + l] >> (2 * k)) & 3) as i8
            }),
            sc: core::array::from_fn(|j| i16::from(b[j] & 0xF)),
            m: core::array::from_fn(|j| i16::from(b[j] >> 4)),
            d: f16_at(b, 80),
            dmin: f16_at(b, 82),
        }
    })
}

// ---------------------------------------------------------------------------------------
// Float weights × f32 activations.
// ---------------------------------------------------------------------------------------

/// The f32 activation row, or `None` if `a` is not `n` f32s.
#[inline]
pub(crate) fn f32_act(a: &[u8], n: usize) -> Option<&[[u8; 4]]> {
    let (c, tail) = a.as_chunks::<4>();
    (tail.is_empty() && c.len() == n).then_some(c)
}

/// F32 × F32, sequential f32 sum.
pub fn vec_dot_f32_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (Some(a), Some(w)) = (f32_act(a, n), blocks::<4>(w, n)) else {
        return f32::NAN;
    };
    w.iter()
        .zip(a)
        .map(|(&x, &y)| f32::from_le_bytes(x) * f32::from_le_bytes(y))
        .sum()
}

/// F16 × F32 (ggml rounds the activations to fp16 first; we keep them f32).
pub fn vec_dot_f16_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (Some(a), Some(w)) = (f32_act(a, n), blocks::<2>(w, n)) else {
        return f32::NAN;
    };
    w.iter()
        .zip(a)
        .map(|(&x, &y)| f16_to_f32(u16::from_le_bytes(x)) * f32::from_le_bytes(y))
        .sum()
}

/// BF16 × F32 (ggml rounds the activations to bf16 first; we keep them f32).
pub fn vec_dot_bf16_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (Some(a), Some(w)) = (f32_act(a, n), blocks::<2>(w, n)) else {
        return f32::NAN;
    };
    w.iter()
        .zip(a)
        .map(|(&x, &y)| {
            f32::from_bits(u32::from(u16::from_le_bytes(x)) << 16) * f32::from_le_bytes(y)
        })
        .sum()
}

/// Dequantised weights (f32 values) × f32 activation bytes: the fallback's inner dot.
pub fn dot_f32_act(w: &[f32], a: &[[u8; 4]]) -> f32 {
    w.iter()
        .zip(a)
        .map(|(&x, &y)| x * f32::from_le_bytes(y))
        .sum()
}
