//! compressed-tensors decoders against an independent scalar model of the format
//! (spec/formats.md §7.3–§7.5): codes are packed here by a separate bit-stream writer,
//! expected values computed in f64 and rounded once to the scale dtype. The bit-exact check
//! against compressed-tensors itself lives in `gguf/tests/hf_ct_oracle.rs`.

use lagoon_core::quant::ct::{
    CtError, CtKind, CtLayout, CtMatrix, CtStrategy, PackOrder, ScaleDtype, ZeroPoint, ZpDtype,
    fp8_e4m3_to_f32, packed_words,
};
use proptest::prelude::*;

/// Writes `vals` (unsigned codes) as a little-endian int32 stream, `bits` each.
fn pack_stream(vals: &[u32], bits: u8, order: PackOrder) -> Vec<u32> {
    let b = bits as usize;
    let mut words = vec![0u32; packed_words(vals.len(), bits, order)];
    for (i, &v) in vals.iter().enumerate() {
        assert!(v < (1 << b));
        match order {
            PackOrder::Dense => {
                for k in 0..b {
                    let bit = i * b + k;
                    words[bit / 32] |= ((v >> k) & 1) << (bit % 32);
                }
            }
            PackOrder::PerWord => {
                let per = 32 / b;
                words[i / per] |= v << (b * (i % per));
            }
        }
    }
    words
}

fn le(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn scale_bytes(s: &[f32], d: ScaleDtype) -> Vec<u8> {
    match d {
        ScaleDtype::Bf16 => s
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect(),
        ScaleDtype::F16 => s
            .iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect(),
        ScaleDtype::F32 => s.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

/// The value of a stored scale.
fn stored(s: f32, d: ScaleDtype) -> f64 {
    match d {
        ScaleDtype::Bf16 => half::bf16::from_f32(s).to_f64(),
        ScaleDtype::F16 => half::f16::from_f32(s).to_f64(),
        ScaleDtype::F32 => s as f64,
    }
}

/// `x` (exact in f64) rounded once to the scale dtype.
fn round_to(x: f64, d: ScaleDtype) -> f32 {
    match d {
        ScaleDtype::Bf16 => half::bf16::from_f64(x).to_f32(),
        ScaleDtype::F16 => half::f16::from_f64(x).to_f32(),
        ScaleDtype::F32 => x as f32,
    }
}

fn decode_all(m: &CtMatrix<'_>) -> Vec<f32> {
    let l = m.layout;
    let mut out = vec![f32::NAN; l.rows * l.cols];
    for r in 0..l.rows {
        m.dequant_row(r, &mut out[r * l.cols..(r + 1) * l.cols]);
    }
    out
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// The spec §8 recipe: `[16, 64]` int4 group 32, packed by hand, round trip = `q·s` in bf16.
#[test]
fn spec_recipe_int4_g32() {
    let (rows, cols) = (16, 64);
    let q: Vec<i32> = (0..rows * cols).map(|i| (i * 5 % 16) as i32 - 8).collect();
    let s: Vec<f32> = (0..rows * 2).map(|i| 0.001 * (i + 1) as f32).collect();
    let mut w = Vec::new();
    for r in 0..rows {
        let codes: Vec<u32> = q[r * cols..(r + 1) * cols]
            .iter()
            .map(|&x| (x + 8) as u32)
            .collect();
        w.extend(le(&pack_stream(&codes, 4, PackOrder::Dense)));
    }
    // Column 8k sits in the least significant nibble: byte c/2, low nibble for even c.
    assert_eq!(w[0] & 0xF, (q[0] + 8) as u8);
    assert_eq!(w[0] >> 4, (q[1] + 8) as u8);
    let sb = scale_bytes(&s, ScaleDtype::Bf16);
    let layout = CtLayout {
        kind: CtKind::packed_int(4, CtStrategy::Group(32), true, PackOrder::Dense),
        rows,
        cols,
        scale_dtype: ScaleDtype::Bf16,
        zero: None,
    };
    let m = CtMatrix::new(layout, &w, &sb, &[]).unwrap();
    assert_eq!(m.n_bytes(), 16 * 32 + 16 * 2 * 2);
    let got = decode_all(&m);
    for r in 0..rows {
        for c in 0..cols {
            let want = round_to(
                q[r * cols + c] as f64 * stored(s[r * 2 + c / 32], ScaleDtype::Bf16),
                ScaleDtype::Bf16,
            );
            assert!(same(got[r * cols + c], want), "[{r},{c}]");
        }
    }
    assert!(got.iter().any(|&x| x != 0.0));
}

#[test]
fn fp8_e4m3_every_code() {
    let mut prev = -1.0f32;
    for b in 0u8..=0x7E {
        let v = fp8_e4m3_to_f32(b);
        assert!(v > prev || b == 0, "{b:#04x}");
        prev = v;
        // Sign bit negates exactly.
        assert_eq!(
            fp8_e4m3_to_f32(b | 0x80).to_bits(),
            (-v).to_bits(),
            "{b:#04x}"
        );
        // Independent formula.
        let (e, m) = ((b >> 3) as i32, (b & 7) as f64);
        let want = if e == 0 {
            m * 2f64.powi(-9)
        } else {
            (1.0 + m / 8.0) * 2f64.powi(e - 7)
        };
        assert_eq!(v as f64, want, "{b:#04x}");
    }
    assert_eq!(fp8_e4m3_to_f32(0x7E), 448.0);
    assert!(fp8_e4m3_to_f32(0x7F).is_nan() && fp8_e4m3_to_f32(0xFF).is_nan());
}

#[test]
fn buffer_sizes_are_checked() {
    let layout = CtLayout {
        kind: CtKind::Fp8 {
            strategy: CtStrategy::Block {
                rows: 128,
                cols: 128,
            },
        },
        rows: 130,
        cols: 136,
        scale_dtype: ScaleDtype::Bf16,
        zero: None,
    };
    assert_eq!(layout.scale_grid(), (2, 2));
    let w = vec![0x38u8; 130 * 136];
    let s = vec![0u8; 8];
    assert!(CtMatrix::new(layout, &w, &s, &[]).is_ok());
    assert_eq!(
        CtMatrix::new(layout, &w[1..], &s, &[]).unwrap_err(),
        CtError::Size {
            buffer: "weight",
            expected: 130 * 136,
            got: 130 * 136 - 1
        }
    );
    assert!(matches!(
        CtMatrix::new(layout, &w, &s[..6], &[]),
        Err(CtError::Size {
            buffer: "weight_scale",
            ..
        })
    ));
    assert!(matches!(
        CtMatrix::new(layout, &w, &s, &[0; 4]),
        Err(CtError::Size {
            buffer: "weight_zero_point",
            ..
        })
    ));
    let mut bad = layout;
    bad.zero = Some(ZeroPoint::Packed);
    assert!(matches!(
        CtMatrix::new(bad, &w, &s, &[]),
        Err(CtError::Geometry { .. })
    ));
}

#[test]
fn fp8_partial_blocks_use_their_own_scales() {
    let (rows, cols) = (130, 136);
    let w = vec![0x38u8; rows * cols]; // 1.0
    let s = [1.0f32, 2.0, 4.0, 8.0];
    let sb = scale_bytes(&s, ScaleDtype::Bf16);
    let layout = CtLayout {
        kind: CtKind::Fp8 {
            strategy: CtStrategy::Block {
                rows: 128,
                cols: 128,
            },
        },
        rows,
        cols,
        scale_dtype: ScaleDtype::Bf16,
        zero: None,
    };
    let m = CtMatrix::new(layout, &w, &sb, &[]).unwrap();
    let got = decode_all(&m);
    assert_eq!(got[0], 1.0);
    assert_eq!(got[127], 1.0);
    assert_eq!(got[128], 2.0);
    assert_eq!(got[128 * cols], 4.0);
    assert_eq!(got[129 * cols + 135], 8.0);
}

fn dtype() -> impl Strategy<Value = ScaleDtype> {
    prop::sample::select(vec![ScaleDtype::Bf16, ScaleDtype::F16, ScaleDtype::F32])
}

/// Scales with edge cases: tiny (subnormal in f16), huge (overflow to inf after × q).
fn scale_value() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => 1e-4f32..10.0,
        1 => prop::sample::select(vec![6.0e-8f32, 1.0e-7, 60000.0, 65504.0, 3.0e38, 1.1754944e-38]),
    ]
}

proptest! {
    /// pack-quantized, every width and both word orders, group/channel/tensor, symmetric or
    /// with packed zero points, ragged widths (rows padded to whole words).
    #[test]
    fn packed_int_matches_the_model(
        bits in 1u8..=8,
        per_word in any::<bool>(),
        rows in 1usize..12,
        cols in 1usize..80,
        strat in 0u8..3,
        group in prop::sample::select(vec![1usize, 2, 4, 8, 16, 32]),
        asym in any::<bool>(),
        d in dtype(),
        seed in any::<u64>(),
        scales in proptest::collection::vec(scale_value(), 1..1000),
    ) {
        let order = if per_word { PackOrder::PerWord } else { PackOrder::Dense };
        let mut rng = seed;
        let mut next = || { rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (rng >> 33) as u32 };
        let levels = 1u32 << bits;
        let codes: Vec<u32> = (0..rows * cols).map(|_| next() % levels).collect();
        let strategy = match strat {
            0 => CtStrategy::Tensor,
            1 => CtStrategy::Channel,
            _ => CtStrategy::Group(group as u32),
        };
        let packed_zp = asym && strat != 0;
        let kind = CtKind::packed_int(bits, strategy, !asym, order);
        let zero = match (asym, packed_zp) {
            (false, _) => None,
            (true, true) => Some(ZeroPoint::Packed),
            (true, false) => Some(ZeroPoint::Plain(ZpDtype::I8)),
        };
        let layout = CtLayout { kind, rows, cols, scale_dtype: d, zero };
        let order = match kind { CtKind::PackedInt { order, .. } => order, _ => unreachable!() };
        let (gr, gc) = layout.scale_grid();
        let s: Vec<f32> = (0..gr * gc).map(|i| scales[i % scales.len()]).collect();
        let zps: Vec<i32> = (0..gr * gc).map(|_| (next() % levels) as i32 - (levels / 2) as i32).collect();
        let mut w = Vec::new();
        for r in 0..rows {
            w.extend(le(&pack_stream(&codes[r * cols..(r + 1) * cols], bits, order)));
        }
        let zb: Vec<u8> = match zero {
            None => vec![],
            Some(ZeroPoint::Plain(_)) => zps.iter().map(|&z| z as i8 as u8).collect(),
            Some(ZeroPoint::Packed) => {
                // Packed along dim 0: column g's stream holds rows 0..rows, word k of column
                // g at index k·gc + g.
                let nw = packed_words(rows, bits, order);
                let mut words = vec![0u32; nw * gc];
                for g in 0..gc {
                    let col: Vec<u32> = (0..rows).map(|r| (zps[r * gc + g] + (levels / 2) as i32) as u32).collect();
                    for (k, x) in pack_stream(&col, bits, order).into_iter().enumerate() {
                        words[k * gc + g] = x;
                    }
                }
                le(&words)
            }
        };
        let sb = scale_bytes(&s, d);
        let m = CtMatrix::new(layout, &w, &sb, &zb).unwrap();
        let got = decode_all(&m);
        for r in 0..rows {
            for c in 0..cols {
                let cell = match strategy {
                    CtStrategy::Tensor => 0,
                    CtStrategy::Channel => r,
                    CtStrategy::Group(g) => r * gc + c / g as usize,
                    CtStrategy::Block { .. } => unreachable!(),
                };
                let q = codes[r * cols + c] as i64 - (levels / 2) as i64;
                let z = if asym { zps[cell] as i64 } else { 0 };
                let want = round_to((q - z) as f64 * stored(s[cell], d), d);
                prop_assert!(same(got[r * cols + c], want), "[{},{}] got {} want {}", r, c, got[r * cols + c], want);
            }
        }
    }

    /// int-quantized I8 and FP8 E4M3 with every strategy, including partial blocks.
    #[test]
    fn int8_and_fp8_match_the_model(
        fp8 in any::<bool>(),
        rows in 1usize..20,
        cols in 1usize..40,
        strat in 0u8..4,
        asym in any::<bool>(),
        d in dtype(),
        bytes in proptest::collection::vec(any::<u8>(), 800),
        scales in proptest::collection::vec(scale_value(), 1..100),
        zp_f32 in any::<bool>(),
    ) {
        let strategy = match strat {
            0 => CtStrategy::Tensor,
            1 => CtStrategy::Channel,
            2 => CtStrategy::Group(4),
            _ => CtStrategy::Block { rows: 3, cols: 7 },
        };
        let asym = asym && !fp8;
        let kind = if fp8 { CtKind::Fp8 { strategy } } else { CtKind::Int8 { symmetric: !asym, strategy } };
        let zt = if zp_f32 { ZpDtype::F32 } else { ZpDtype::I8 };
        let layout = CtLayout { kind, rows, cols, scale_dtype: d, zero: asym.then_some(ZeroPoint::Plain(zt)) };
        let (gr, gc) = layout.scale_grid();
        let w = &bytes[..rows * cols];
        let s: Vec<f32> = (0..gr * gc).map(|i| scales[i % scales.len()]).collect();
        let zps: Vec<i8> = (0..gr * gc).map(|i| bytes[799 - i] as i8).collect();
        let zb: Vec<u8> = if !asym { vec![] } else if zp_f32 {
            zps.iter().flat_map(|&z| (z as f32).to_le_bytes()).collect()
        } else {
            zps.iter().map(|&z| z as u8).collect()
        };
        let sb = scale_bytes(&s, d);
        let m = CtMatrix::new(layout, w, &sb, &zb).unwrap();
        let got = decode_all(&m);
        for r in 0..rows {
            for c in 0..cols {
                let cell = match strategy {
                    CtStrategy::Tensor => 0,
                    CtStrategy::Channel => r,
                    CtStrategy::Group(g) => r * gc + c / g as usize,
                    CtStrategy::Block { rows: br, cols: bc } => (r / br as usize) * gc + c / bc as usize,
                };
                let b = w[r * cols + c];
                let want = if fp8 {
                    round_to(fp8_e4m3_to_f32(b) as f64 * stored(s[cell], d), d)
                } else {
                    let z = if asym { zps[cell] as f64 } else { 0.0 };
                    round_to((b as i8 as f64 - z) * stored(s[cell], d), d)
                };
                prop_assert!(same(got[r * cols + c], want), "[{},{}] got {} want {}", r, c, got[r * cols + c], want);
            }
        }
    }
}
