//! Scalar integer kernels for the codebook ("i-quant") types and MXFP4, paired with the
//! activation formats ggml pairs them with: IQ4_NL and MXFP4 with Q8_0, every 256-element
//! IQ type with Q8_K.
//!
//! Learned from ggml's `ggml-cpu/quants.c` (`ggml_vec_dot_iq*_q8_K_generic`,
//! `ggml_vec_dot_iq4_nl_q8_0_generic`, `ggml_vec_dot_mxfp4_q8_0_generic`) and its AVX2 twins in
//! `ggml-cpu/arch/x86/quants.c`; restated here. Per super-block the weight·activation sum is
//! an exact i32 over odd integer sub-block scales (`2s + 1`; IQ4_XS: `ls − 32`), then
//! `sumf += (d_w·d_a) · sumi`, and the constant part of the sub-block scale (1/8 for IQ2_*,
//! 1/4 for IQ3_XXS) multiplies the finished sum, as in ggml. IQ4_XS takes the integer
//! super-block sum of ggml's AVX2 kernel rather than the per-32 f32 sums of its generic one
//! (the two differ only in f32 rounding). IQ1_S/IQ1_M add `±1/8 · Σ q_a` per run, in f32 as
//! ggml does. Block layouts: `lagoon_core::quant::{iq1, iq2, iq3, iq4, mxfp4}`.

use lagoon_core::quant::QK_K;
use lagoon_core::quant::mxfp4::e8m0_to_fp32_half;
use lagoon_core::quant::tables::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
    KVALUES_FP4, KVALUES_IQ4NL,
};

use super::{Legacy, blocks, f16_at, legacy_dot};
use crate::kernels::act::Q8KAct;

/// ggml's `IQ1S_DELTA` / `IQ1M_DELTA`.
const IQ1_DELTA: f32 = 0.125;

/// Shared super-block loop: `block(blk, q_a, bsums)` returns `(d_w, s)` with `s` the block's
/// scaled integer sum (as f32); `sumf += (d_w·d_a)·s`; the result is `factor · sumf`.
#[inline]
fn iq_dot<const B: usize>(
    w: &[u8],
    a: &[u8],
    n: usize,
    factor: f32,
    block: impl Fn(&[u8; B], &[i8; QK_K], &[[u8; 2]; 16]) -> (f32, f32),
) -> f32 {
    let (Some(a), Some(wb)) = (Q8KAct::new(a, n), blocks::<B>(w, n / QK_K)) else {
        return f32::NAN;
    };
    let mut acc = 0.0f32;
    let qa = a.qs.as_chunks::<QK_K>().0;
    let bs = a.bsums.as_chunks::<16>().0;
    for (b, ((blk, qa), bs)) in wb.iter().zip(qa).zip(bs).enumerate() {
        let (dw, s) = block(blk, qa, bs);
        acc += (dw * a.d(b)) * s;
    }
    factor * acc
}

/// `Σ_j g[j]·(±q_a[j])` over one 8-element run: `g` the 8 grid magnitudes (little-endian
/// bytes), bit j of `signs` negating element j.
#[inline]
fn run_dot(g: [u8; 8], signs: u8, qa: &[i8]) -> i32 {
    (0..8)
        .map(|j| {
            let p = i32::from(g[j]) * i32::from(qa[j]);
            if (signs >> j) & 1 != 0 { -p } else { p }
        })
        .sum()
}

/// Two 4-value IQ3 grid points as one 8-byte run.
#[inline]
fn join4(p0: u32, p1: u32) -> [u8; 8] {
    (u64::from(p1) << 32 | u64::from(p0)).to_le_bytes()
}

/// IQ4_XS × Q8_K. Block (136 B): `d | scales_h:u16 | scales_l[4] | qs[128]`; sub-block ib
/// has scale `ls − 32` and its 32 codebook nibbles in `qs[16ib..]` (low nibble element j,
/// high nibble j + 16).
pub fn vec_dot_iq4_xs_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    iq_dot::<136>(w, a, n, 1.0, |b, qa, _| {
        let sh = u16::from_le_bytes([b[2], b[3]]);
        let mut sumi = 0i32;
        for ib in 0..8 {
            let low4 = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF;
            let ls = i32::from(low4 | (((sh >> (2 * ib)) & 3) as u8) << 4) - 32;
            let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
            let q = &qa[32 * ib..32 * ib + 32];
            let s: i32 = (0..16)
                .map(|j| {
                    i32::from(KVALUES_IQ4NL[usize::from(qs[j] & 0xF)]) * i32::from(q[j])
                        + i32::from(KVALUES_IQ4NL[usize::from(qs[j] >> 4)]) * i32::from(q[j + 16])
                })
                .sum();
            sumi += ls * s;
        }
        (f16_at(b, 0), sumi as f32)
    })
}

/// IQ3_XXS × Q8_K (× 1/4). Block (98 B): `d | qs[64] | u32[8]`; sub-block ib: `a = u32[ib]`,
/// scale `2(a >> 28) + 1`, run l signs `ksigns[(a >> 7l) & 127]`, grid points
/// `qs[8ib + 2l]`, `qs[8ib + 2l + 1]`.
pub fn vec_dot_iq3_xxs_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    iq_dot::<98>(w, a, n, 0.25, |b, qa, _| {
        let mut sumi = 0i32;
        for ib in 0..8 {
            let o = 66 + 4 * ib;
            let aw = u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
            let mut s = 0i32;
            for l in 0..4 {
                let signs = KSIGNS_IQ2XS[((aw >> (7 * l)) & 127) as usize];
                let i = 2 + 8 * ib + 2 * l;
                let g = join4(
                    IQ3XXS_GRID[usize::from(b[i])],
                    IQ3XXS_GRID[usize::from(b[i + 1])],
                );
                s += run_dot(g, signs, &qa[32 * ib + 8 * l..]);
            }
            sumi += (2 * (aw >> 28) + 1) as i32 * s;
        }
        (f16_at(b, 0), sumi as f32)
    })
}

/// IQ3_S × Q8_K. Block (110 B): `d | qs[64] | qh[8] | signs[32] | scales[4]`; run r of
/// sub-block sb = r/4: 9-bit points `qs[2r] | qh bit 2l`, `qs[2r+1] | qh bit 2l+1`, sign
/// byte `signs[r]`, scale `2·nibble + 1`.
pub fn vec_dot_iq3_s_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    iq_dot::<110>(w, a, n, 1.0, |b, qa, _| {
        let mut sumi = 0i32;
        for sb in 0..8 {
            let qh = b[66 + sb];
            let mut s = 0i32;
            for l in 0..4 {
                let r = 4 * sb + l;
                let i0 = usize::from(b[2 + 2 * r]) | usize::from((qh >> (2 * l)) & 1) << 8;
                let i1 = usize::from(b[3 + 2 * r]) | usize::from((qh >> (2 * l + 1)) & 1) << 8;
                let g = join4(IQ3S_GRID[i0], IQ3S_GRID[i1]);
                s += run_dot(g, b[74 + r], &qa[8 * r..]);
            }
            let ls = (b[106 + sb / 2] >> (4 * (sb % 2))) & 0xF;
            sumi += (2 * i32::from(ls) + 1) * s;
        }
        (f16_at(b, 0), sumi as f32)
    })
}

/// IQ2_XXS × Q8_K (× 1/8). Block (66 B): `d | 8 × (grid idx[4] | u32 a)`; scale
/// `2(a >> 28) + 1`, run l signs `ksigns[(a >> 7l) & 127]`.
pub fn vec_dot_iq2_xxs_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    iq_dot::<66>(w, a, n, 0.125, |b, qa, _| {
        let mut sumi = 0i32;
        for ib in 0..8 {
            let g = &b[2 + 8 * ib..2 + 8 * ib + 8];
            let aw = u32::from_le_bytes([g[4], g[5], g[6], g[7]]);
            let mut s = 0i32;
            for l in 0..4 {
                let signs = KSIGNS_IQ2XS[((aw >> (7 * l)) & 127) as usize];
                let p = IQ2XXS_GRID[usize::from(g[l])].to_le_bytes();
                s += run_dot(p, signs, &qa[32 * ib + 8 * l..]);
            }
            sumi += (2 * (aw >> 28) + 1) as i32 * s;
        }
        (f16_at(b, 0), sumi as f32)
    })
}

/// IQ2_XS × Q8_K (× 1/8). Block (74 B): `d | u16[32] | scales[8]`; run r: grid
/// `u16 & 511`, signs `ksigns[u16 >> 9]`; runs 0-1 of a sub-block scale `2·lo + 1`, 2-3
/// `2·hi + 1`.
pub fn vec_dot_iq2_xs_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    iq_dot::<74>(w, a, n, 0.125, |b, qa, _| {
        let mut sumi = 0i32;
        for r in 0..32 {
            let q = u16::from_le_bytes([b[2 + 2 * r], b[3 + 2 * r]]);
            let p = IQ2XS_GRID[usize::from(q & 511)].to_le_bytes();
            let s = run_dot(p, KSIGNS_IQ2XS[usize::from(q >> 9)], &qa[8 * r..]);
            let sc = b[66 + r / 4];
            let ls = if r % 4 < 2 { sc & 0xF } else { sc >> 4 };
            sumi += (2 * i32::from(ls) + 1) * s;
        }
        (f16_at(b, 0), sumi as f32)
    })
}

/// IQ2_S × Q8_K (× 1/8). Block (82 B): `d | qs[32] | signs[32] | qh[8] | scales[8]`; run r
/// of sub-block ib: 10-bit grid index `qs[r] | ((qh[ib] >> 2l) & 3) << 8`, sign byte
/// `signs[r]`, scales as IQ2_XS.
pub fn vec_dot_iq2_s_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    iq_dot::<82>(w, a, n, 0.125, |b, qa, _| {
        let mut sumi = 0i32;
        for r in 0..32 {
            let (ib, l) = (r / 4, r % 4);
            let idx = usize::from(b[2 + r]) | usize::from((b[66 + ib] >> (2 * l)) & 3) << 8;
            let s = run_dot(IQ2S_GRID[idx].to_le_bytes(), b[34 + r], &qa[8 * r..]);
            let sc = b[74 + ib];
            let ls = if l < 2 { sc & 0xF } else { sc >> 4 };
            sumi += (2 * i32::from(ls) + 1) * s;
        }
        (f16_at(b, 0), sumi as f32)
    })
}

/// `Σ_j grid_j · q_a[j]` over one IQ1 run (grid values are signed −1, 0, 1).
#[inline]
fn iq1_run_dot(idx: usize, qa: &[i8]) -> i32 {
    let g = IQ1S_GRID[idx].to_le_bytes();
    (0..8)
        .map(|j| i32::from(g[j] as i8) * i32::from(qa[j]))
        .sum()
}

/// IQ1_S × Q8_K. Block (50 B): `d | qs[32] | qh:u16[8]`; sub-block ib: `h = qh[ib]`, scale
/// `2((h >> 12) & 7) + 1`, delta sign bit 15, run l index `qs[4ib + l] | ((h >> 3l) & 7) << 8`.
/// `sumf += (d_w·d_a)·(Σ ls·Σ g·q_a + 1/8·Σ ls·δ·Σ q_a)` (the last sum from `bsums`).
pub fn vec_dot_iq1_s_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    iq_dot::<50>(w, a, n, 1.0, |b, qa, bs| {
        let (mut sumi, mut sumi1) = (0i32, 0i32);
        for ib in 0..8 {
            let h = u16::from_le_bytes([b[34 + 2 * ib], b[35 + 2 * ib]]);
            let ls = i32::from(2 * ((h >> 12) & 7) + 1);
            let delta = if h & 0x8000 != 0 { -1 } else { 1 };
            let mut s = 0i32;
            for l in 0..4 {
                let idx = usize::from(b[2 + 4 * ib + l]) | usize::from((h >> (3 * l)) & 7) << 8;
                s += iq1_run_dot(idx, &qa[32 * ib + 8 * l..]);
            }
            let q = i32::from(i16::from_le_bytes(bs[2 * ib]))
                + i32::from(i16::from_le_bytes(bs[2 * ib + 1]));
            sumi += ls * s;
            sumi1 += ls * delta * q;
        }
        (f16_at(b, 0), sumi as f32 + IQ1_DELTA * sumi1 as f32)
    })
}

/// IQ1_M × Q8_K. Block (56 B): `qs[32] | qh[16] | scales:u16[4]` (the fp16 `d` in the top
/// nibbles of the scale words); run l of sub-block ib: index `qs[4ib + l] | (nibble & 7) << 8`,
/// delta sign nibble bit 3 (nibble l%2 of `qh[2ib + l/2]`), scale `2·k + 1` with the 3-bit
/// k at bit `6(ib%2) + 3(l/2)` of word ib/2.
pub fn vec_dot_iq1_m_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    iq_dot::<56>(w, a, n, 1.0, |b, qa, _| {
        let sc: [u16; 4] =
            core::array::from_fn(|k| u16::from_le_bytes([b[48 + 2 * k], b[49 + 2 * k]]));
        let d =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for ib in 0..8 {
            for l in 0..4 {
                let nib = b[32 + 2 * ib + l / 2] >> (4 * (l % 2));
                let idx = usize::from(b[4 * ib + l]) | usize::from(nib & 7) << 8;
                let q = &qa[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                let ls = i32::from(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3 * (l / 2))) & 7) + 1);
                let qsum: i32 = q.iter().map(|&v| i32::from(v)).sum();
                let delta = if nib & 8 != 0 { -1 } else { 1 };
                sumi1 += ls * iq1_run_dot(idx, q);
                sumi2 += ls * delta * qsum;
            }
        }
        (
            super::f16_to_f32(d),
            sumi1 as f32 + IQ1_DELTA * sumi2 as f32,
        )
    })
}

/// 32 codebook values of a half-split nibble block (`qs[16]`: low nibble element j, high
/// nibble j + 16).
#[inline]
fn lut_nibbles(qs: &[u8], lut: &[i8; 16]) -> [i8; 32] {
    core::array::from_fn(|j| {
        let v = if j < 16 { qs[j] & 0xF } else { qs[j - 16] >> 4 };
        lut[usize::from(v)]
    })
}

/// IQ4_NL × Q8_0. Block (18 B): `d | qs[16]`; `sumf += Σ kvalues[nib]·q_a · (d_w·d_a)`.
pub fn vec_dot_iq4_nl_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    legacy_dot::<18>(w, a, n, |b| Legacy {
        d: f16_at(b, 0),
        min: None,
        q: lut_nibbles(&b[2..], &KVALUES_IQ4NL),
    })
}

/// MXFP4 × Q8_0. Block (17 B): `e:E8M0 | qs[16]`; `sumf += Σ fp4x2[nib]·q_a ·
/// (2^(e−128)·d_a)` (doubled FP4 table, halved scale, as ggml).
pub fn vec_dot_mxfp4_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    legacy_dot::<17>(w, a, n, |b| Legacy {
        d: e8m0_to_fp32_half(b[0]),
        min: None,
        q: lut_nibbles(&b[1..], &KVALUES_FP4),
    })
}
