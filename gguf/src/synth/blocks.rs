//! Random quant blocks with realistic scales: each generator writes whole blocks whose
//! decoded values have mean ≈ 0 and standard deviation ≈ `std`, using random quants and
//! random sub-scales (what a quantiser produces from random weights, without quantising
//! anything). Layouts are ggml's (`ggml-common.h`, spec/formats.md §3); the field offsets
//! are written out here because the IQ block structs are not in `lagoon_core` yet.
//!
//! The decoded standard deviation of each type is `super-scale × RMS(sub-scale) × RMS(quant)`,
//! with the RMS of the uniform quant and sub-scale ranges computed by [`rms_range`] and the
//! RMS of the IQ grids (over uniformly drawn grid indices) taken from ggml's tables.

use half::{bf16, f16};
use lagoon_core::dtype::GgmlType;

use super::rng::WyRand;

/// RMS of `iq2xxs_grid` values over all 256 points (bytes ∈ {8, 25, 43}).
const IQ2XXS_GRID_RMS: f32 = 23.117_746;
/// RMS of `iq2s_grid` values over all 1024 points.
const IQ2S_GRID_RMS: f32 = 24.430_343;
/// RMS of `iq3xxs_grid` values over all 256 points (bytes ∈ {4, 12, …, 62}).
const IQ3XXS_GRID_RMS: f32 = 30.848_673;

/// The types [`fill_blocks`] generates.
pub fn supported(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16
            | BF16
            | Q8_0
            | Q4_0
            | Q2K
            | Q3K
            | Q4K
            | Q5K
            | Q6K
            | IQ1S
            | IQ1M
            | IQ2XXS
            | IQ2S
            | IQ3XXS
            | IQ4XS
            | IQ4NL
            | MXFP4
    )
}

/// RMS of `k + offset` over the integers `k` in `lo..=hi` (uniformly drawn quants or
/// sub-scales).
pub fn rms_range(lo: i32, hi: i32, offset: f32) -> f32 {
    let n = (hi - lo + 1) as f64;
    let s: f64 = (lo..=hi)
        .map(|k| (f64::from(k) + f64::from(offset)).powi(2))
        .sum();
    (s / n).sqrt() as f32
}

/// Fills `out` (a whole number of `ty` blocks) with random blocks of decoded standard
/// deviation `std` and mean 0. Float types get approximately normal values.
pub fn fill_blocks(ty: GgmlType, std: f32, rng: &mut WyRand, out: &mut [u8]) {
    use GgmlType::*;
    let (_, bb) = ty.block();
    debug_assert!(out.len().is_multiple_of(bb));
    match ty {
        F32 => fill_floats(ty, 0.0, std, rng, out),
        F16 => fill_floats(ty, 0.0, std, rng, out),
        BF16 => fill_floats(ty, 0.0, std, rng, out),
        Q8_0 => q8_0(std, rng, out),
        Q4_0 => q4_0(std, rng, out),
        Q2K => q2k(std, rng, out),
        Q3K => q3k(std, rng, out),
        Q4K => q4k(std, rng, out),
        Q5K => q5k(std, rng, out),
        Q6K => q6k(std, rng, out),
        IQ1S => iq1s(std, rng, out),
        IQ1M => iq1m(std, rng, out),
        IQ2XXS => iq2xxs(std, rng, out),
        IQ2S => iq2s(std, rng, out),
        IQ3XXS => iq3xxs(std, rng, out),
        IQ4XS => iq4xs(std, rng, out),
        IQ4NL => iq4nl(std, rng, out),
        MXFP4 => mxfp4(std, rng, out),
        _ => unreachable!("plan refuses types without a generator"),
    }
}

/// Float values `mean + std·N(0,1)` in `ty` (F32, F16 or BF16).
pub fn fill_floats(ty: GgmlType, mean: f32, std: f32, rng: &mut WyRand, out: &mut [u8]) {
    match ty {
        GgmlType::F32 => {
            for c in out.chunks_exact_mut(4) {
                c.copy_from_slice(&(mean + std * rng.normal()).to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in out.chunks_exact_mut(2) {
                c.copy_from_slice(&f16::from_f32(mean + std * rng.normal()).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for c in out.chunks_exact_mut(2) {
                c.copy_from_slice(&bf16::from_f32(mean + std * rng.normal()).to_le_bytes());
            }
        }
        _ => unreachable!("only float types hold explicit values"),
    }
}

/// Explicit values in `ty` (F32, F16 or BF16).
pub fn write_values(ty: GgmlType, values: &[f32], out: &mut [u8]) {
    let w = ty.block().1;
    for (c, &v) in out.chunks_exact_mut(w).zip(values) {
        match ty {
            GgmlType::F32 => c.copy_from_slice(&v.to_le_bytes()),
            GgmlType::F16 => c.copy_from_slice(&f16::from_f32(v).to_le_bytes()),
            GgmlType::BF16 => c.copy_from_slice(&bf16::from_f32(v).to_le_bytes()),
            _ => unreachable!("only float types hold explicit values"),
        }
    }
}

fn put_f16(b: &mut [u8], x: f32) {
    b[..2].copy_from_slice(&f16::from_f32(x).to_le_bytes());
}

/// Q8_0 (34 B): `d:f16 | qs:i8[32]`, `y = d·q`, q uniform over all of i8.
fn q8_0(std: f32, rng: &mut WyRand, out: &mut [u8]) {
    let d = std / rms_range(-128, 127, 0.0);
    for b in out.chunks_exact_mut(34) {
        put_f16(b, d);
        rng.fill(&mut b[2..34]);
    }
}

/// Q4_0 (18 B): `d:f16 | qs[16]`, `y = d·(q − 8)`, each nibble q uniform in 1..15 (values
/// −7..7, mean 0; a quantiser normalising the largest magnitude to −8 uses 0 rarely).
fn q4_0(std: f32, rng: &mut WyRand, out: &mut [u8]) {
    let d = std / rms_range(-7, 7, 0.0);
    for b in out.chunks_exact_mut(18) {
        put_f16(b, d);
        for q in &mut b[2..18] {
            *q = rng.range(1, 15) as u8 | (rng.range(1, 15) as u8) << 4;
        }
    }
}

/// The 12-byte 6-bit scale/min packing of Q4_K and Q5_K (`get_scale_min_k4` inverted).
fn pack_scale_min_k4(sc: &[u8; 8], m: &[u8; 8], s: &mut [u8]) {
    for j in 0..4 {
        s[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4);
    }
}

/// Sub-scales drawn from the upper half of the 6-bit range, as a quantiser's are after it
/// normalises the largest to 63.
const K_SC_LO: i32 = 32;
const K_SC_HI: i32 = 63;

/// Random 6-bit scales with mins equal to them, so `y = d·sc·(q − q_mid)` when
/// `dmin = q_mid·d`: zero mean for uniform quants.
fn k4_scales(rng: &mut WyRand, s: &mut [u8]) {
    let sc: [u8; 8] = core::array::from_fn(|_| rng.range(K_SC_LO, K_SC_HI) as u8);
    pack_scale_min_k4(&sc, &sc, s);
}

/// Q2_K (84 B): `scales[16] | qs[64] | d | dmin`, `y = d·sc·q − dmin·m` (sc, m the low and
/// high nibbles of a scale byte, q in 0..3), every byte random and `dmin = 1.5·d`: mean 0
/// (sc, q and m independent), `E[y²] = d²·(E[sc²]E[q²] − 3E[sc]E[q]E[m] + 2.25E[m²])`.
fn q2k(std: f32, rng: &mut WyRand, out: &mut [u8]) {
    let (s2, q2) = (rms_range(0, 15, 0.0).powi(2), rms_range(0, 3, 0.0).powi(2));
    let d = std / (s2 * q2 - 3.0 * 7.5 * 1.5 * 7.5 + 2.25 * s2).sqrt();
    for b in out.chunks_exact_mut(84) {
        rng.fill(&mut b[0..80]);
        put_f16(&mut b[80..82], d);
        put_f16(&mut b[82..84], 1.5 * d);
    }
}

/// Q3_K (110 B): `hmask[32] | qs[64] | scales[12] | d`, `y = d·(sc − 32)·q` with q in −4..3
/// and the 6-bit sc in 0..63, every byte random: mean `d·(−0.5)²`, negligible beside the
/// standard deviation `d·RMS(sc − 32)·RMS(q)` (~0.6%).
fn q3k(std: f32, rng: &mut WyRand, out: &mut [u8]) {
    let d = std / (rms_range(-32, 31, 0.0) * rms_range(-4, 3, 0.0));
    for b in out.chunks_exact_mut(110) {
        rng.fill(&mut b[0..108]);
        put_f16(&mut b[108..110], d);
    }
}

/// RMS of `g ± 1/8` over the IQ1 grid's values g (all 2048 points, each sign of the shift
/// equally likely), and the scale factor RMS of `2k + 1` for the 3-bit k.
fn iq1_rms() -> (f32, f32) {
    let g2: f64 = lagoon_core::quant::tables::IQ1S_GRID
        .iter()
        .flat_map(|p| p.to_le_bytes())
        .map(|b| f64::from(b as i8).powi(2))
        .sum::<f64>()
        / (2048.0 * 8.0);
    let delta = f64::from(lagoon_core::quant::iq1::IQ1S_DELTA);
    (
        (g2 + delta * delta).sqrt() as f32,
        rms_range(0, 7, 0.5) * 2.0,
    )
}

/// IQ1_S (50 B): `d | qs[32] | qh:u16[8]`, `y = d·(2k + 1)·(g ± 1/8)` (k, the shift's sign and
/// the grid index from `qh` and `qs`), every byte but `d` random.
fn iq1s(std: f32, rng: &mut WyRand, out: &mut [u8]) {
    let (g, s) = iq1_rms();
    let d = std / (g * s);
    for b in out.chunks_exact_mut(50) {
        put_f16(&mut b[0..2], d);
        rng.fill(&mut b[2..50]);
    }
}

/// IQ1_M (56 B): `qs[32] | qh[16] | scales:u16[4]`, the f16 `d` in the top nibbles of the
/// four scale words (word k holds bits 4k..4k + 4), `y = d·(2k + 1)·(g ± 1/8)`; every other
/// bit random.
fn iq1m(std: f32, rng: &mut WyRand, out: &mut [u8]) {
    let (g, s) = iq1_rms();
    let d = f16::from_f32(std / (g * s)).to_bits();
    for b in out.chunks_exact_mut(56) {
        rng.fill(&mut b[..56]);
        for k in 0..4 {
            let w = u16::from_le_bytes([b[48 + 2 * k], b[49 + 2 * k]]);
            let w = (w & 0x0FFF) | ((d >> (4 * k)) & 0xF) << 12;
            b[48 + 2 * k..50 + 2 * k].copy_from_slice(&w.to_le_bytes());
        }
    }
}

/// Q4_K (144 B): `d | dmin | scales[12] | qs[128]`, `y = d·sc·q − dmin·m`, q in 0..15.
fn q4k(std: f32, rng: &mut WyRand, out: &mut [u8]) {
    let d = std / (rms_range(K_SC_LO, K_SC_HI, 0.0) * rms_range(0, 15, -7.5));
    for b in out.chunks_exact_mut(144) {
        put_f16(&mut b[0..2], d);
        put_f16(&mut b[2..4], 7.5 * d);
        k4_scales(rng, &mut b[4..16]);
        rng.fill(&mut b[16..144]);
    }
}

/// Q5_K (176 B): `d | dmin | scales[12] | qh[32] | qs[128]`, q in 0..31.
fn q5k(std: f32, rng: &mut WyRand, out: &mut [u8]) {
    let d = std / (rms_range(K_SC_LO, K_SC_HI, 0.0) * rms_range(0, 31, -15.5));
    for b in out.chunks_exact_mut(176) {
        put_f16(&mut b[0..2], d);
        put_f16(&mut b[2..4], 15.5 * d);
        k4_scales(rng, &mut b[4..16]);
        rng.fill(&mut b[16..176]);
    }
}

/// Q6_K (210 B): `ql[128] | qh[64] | scales:i8[16] | d`, `y = d·sc·q`, q in −32..31.
fn q6k(std: f32, rng: &mut WyRand, out: &mut [u8]) {
    const LO: i32 = 64;
    const HI: i32 = 127;
    let d = std / (rms_range(LO, HI, 0.0) * rms_range(-32, 31, 0.0));
    for b in out.chunks_exact_mut(210) {
        rng.fill(&mut b[0..192]);
        for s in &mut b[192..208] {
            *s = rng.range(LO, HI) as u8;
        }
        put_f16(&mut b[208..210], d);
    }
}

/// RMS of the IQ sub-scale factor `0.5 + s` for 4-bit `s` drawn uniformly.
fn iq_scale_rms() -> f32 {
    rms_range(0, 15, 0.5)
}

/// IQ2_XXS (66 B): `d | 8 × (4 grid-index bytes | u32: 4 × 7-bit sign index, 4-bit s)`,
/// `y = d·(0.5 + s)·0.25 · grid · sign`.
fn iq2xxs(std: f32, rng: &mut WyRand, out: &mut [u8]) {
    let d = std / (0.25 * iq_scale_rms() * IQ2XXS_GRID_RMS);
    for b in out.chunks_exact_mut(66) {
        put_f16(b, d);
        rng.fill(&mut b[2..66]);
        // The 4-bit sub-scale is the top nibble of each group's u32; random bytes already
        // make it uniform in 0..15 and every grid index and sign index is valid.
    }
}

/// IQ2_S (82 B): `d | qs[32] | signs[32] | qh[8] | scales[8]` (10-bit grid indices,
/// explicit sign bytes, two 4-bit sub-scales per byte), `y = d·(0.5 + s)·0.25 · grid · sign`.
fn iq2s(std: f32, rng: &mut WyRand, out: &mut [u8]) {
    let d = std / (0.25 * iq_scale_rms() * IQ2S_GRID_RMS);
    for b in out.chunks_exact_mut(82) {
        put_f16(b, d);
        rng.fill(&mut b[2..82]);
    }
}

/// IQ3_XXS (98 B): `d | qs[64] (grid indices) | 8 × u32 (4 × 7-bit sign index, 4-bit s)`,
/// `y = d·(0.5 + s)·0.5 · grid · sign`.
fn iq3xxs(std: f32, rng: &mut WyRand, out: &mut [u8]) {
    let d = std / (0.5 * iq_scale_rms() * IQ3XXS_GRID_RMS);
    for b in out.chunks_exact_mut(98) {
        put_f16(b, d);
        rng.fill(&mut b[2..98]);
    }
}

/// IQ4_XS (136 B): `d | scales_h:u16 | scales_l[4] | qs[128]` (6-bit sub-scales `ls`, the
/// 16-entry IQ4_NL codebook), `y = d·(ls − 32)·kvalues[q]`; random bytes make `ls` uniform in
/// 0..63 and every index valid.
fn iq4xs(std: f32, rng: &mut WyRand, out: &mut [u8]) {
    let kv = &lagoon_core::quant::tables::KVALUES_IQ4NL;
    let kv_rms = (kv.iter().map(|&v| f32::from(v).powi(2)).sum::<f32>() / 16.0).sqrt();
    let d = std / (rms_range(-32, 31, 0.0) * kv_rms);
    for b in out.chunks_exact_mut(136) {
        put_f16(b, d);
        rng.fill(&mut b[2..136]);
    }
}

/// IQ4_NL (18 B): `d | qs[16]` (element j the low nibble of byte j, j + 16 the high one),
/// `y = d·kvalues[q]`; random bytes make every index uniform, and `d`'s sign is random per
/// block (the codebook's mean is not 0; llama.cpp's quantiser also picks the sign per block).
fn iq4nl(std: f32, rng: &mut WyRand, out: &mut [u8]) {
    let kv = &lagoon_core::quant::tables::KVALUES_IQ4NL;
    let kv_rms = (kv.iter().map(|&v| f32::from(v).powi(2)).sum::<f32>() / 16.0).sqrt();
    let d = std / kv_rms;
    for b in out.chunks_exact_mut(18) {
        put_f16(b, if rng.below(2) == 0 { d } else { -d });
        rng.fill(&mut b[2..18]);
    }
}

/// MXFP4 (17 B): `e:E8M0 | qs[16]`, `y = 2^(e − 128)·fp4x2[q]` (ggml's doubled FP4 values and
/// halved scale). The scale is a power of two, so each block takes the exponent below the
/// planned scale or the one above, the upper with the probability that makes the mean square
/// the planned one; random bytes make every index uniform (the codebook is symmetric).
fn mxfp4(std: f32, rng: &mut WyRand, out: &mut [u8]) {
    let kv = &lagoon_core::quant::tables::KVALUES_FP4;
    let kv_rms = (kv.iter().map(|&v| f32::from(v).powi(2)).sum::<f32>() / 16.0).sqrt();
    let t = f64::from(std / kv_rms);
    let lo = t.log2().floor();
    // d_lo² (1 − p) + (2 d_lo)² p = t²
    let p = ((t / lo.exp2()).powi(2) - 1.0) / 3.0;
    let e_lo = (lo + 128.0).clamp(2.0, 254.0) as u8;
    for b in out.chunks_exact_mut(17) {
        b[0] = e_lo + u8::from(f64::from(rng.unit()) < p);
        rng.fill(&mut b[1..17]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lagoon_core::quant::dequantize_row;

    fn moments(v: &[f32]) -> (f64, f64) {
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        (mean, var.sqrt())
    }

    /// Every type with a lagoon decoder decodes to finite values of the intended spread.
    /// (The IQ types are checked against gguf-py's decoder in `gguf/tests/synth.rs`.)
    #[test]
    fn decoded_blocks_have_the_requested_std() {
        use GgmlType::*;
        let std = 0.03f32;
        for ty in [F32, F16, BF16, Q8_0, Q4K, Q5K, Q6K, IQ4XS, IQ4NL, MXFP4] {
            let n = 256 * 64;
            let mut bytes = vec![0u8; ty.row_bytes(n as u64).unwrap() as usize];
            fill_blocks(ty, std, &mut WyRand::new(3), &mut bytes);
            let mut y = vec![0.0f32; n];
            dequantize_row(ty, &bytes, &mut y);
            assert!(y.iter().all(|v| v.is_finite()), "{ty:?}");
            let (mean, s) = moments(&y);
            assert!(mean.abs() < 0.05 * f64::from(std), "{ty:?} mean {mean}");
            assert!(
                (s / f64::from(std) - 1.0).abs() < 0.05,
                "{ty:?} std {s} vs {std}"
            );
        }
    }

    #[test]
    fn scale_min_packing_inverts_get_scale_min_k4() {
        let sc = [1, 2, 3, 4, 58, 28, 14, 0];
        let m = [5, 6, 7, 8, 41, 11, 29, 15];
        let mut s = [0u8; 12];
        pack_scale_min_k4(&sc, &m, &mut s);
        // spec/formats.md §3.8: these are the bytes of the worked example.
        assert_eq!(
            s,
            [
                0xC1, 0x42, 0x03, 0x04, 0x85, 0x06, 0x47, 0x08, 0x9A, 0xBC, 0xDE, 0xF0
            ]
        );
    }
}
