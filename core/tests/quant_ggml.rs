//! The scalar ggml decoders against gguf-py's numpy codecs (which match libggml bit for bit).
//!
//! Fixtures come from `tools/reference/quant_fixtures.py` (see fixtures/quant/README.md):
//! `<type>.blocks` are raw GGUF blocks, `<type>.f32` gguf-py's dequantisation of them.

use lagoon_core::dtype::GgmlType;
use lagoon_core::quant::{dequantize_row, quantize_row_q8_0, supported};
use proptest::prelude::*;

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/quant/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!("{path}: {e}; regenerate with tools/reference/quant_fixtures.py")
    })
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Bit-exact, except that any NaN equals any NaN (payloads differ between conversions).
fn assert_bits_eq(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
        assert!(
            same,
            "{what}[{i}]: got {g:e} ({:#010x}), want {w:e} ({:#010x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

/// Decodes the fixture for `ty` with `dequantize_row`, `blocks_per_row` blocks at a time,
/// and again as one row read from an odd (unaligned) address.
fn check_fixture(ty: GgmlType, name: &str, blocks_per_row: usize) {
    let (block_elems, block_bytes) = ty.block();
    let blocks = fixture(&format!("{name}.blocks"));
    let want = f32s(&fixture(&format!("{name}.f32")));
    assert!(supported(ty), "{name}");
    assert_eq!(
        blocks.len() % block_bytes,
        0,
        "{name}.blocks holds whole blocks"
    );
    assert_eq!(
        want.len(),
        blocks.len() / block_bytes * block_elems,
        "{name}: fixture sizes"
    );
    // A fixture of zeros would let a broken decoder pass; the generator adds NaN/inf blocks.
    assert!(want.iter().filter(|v| v.is_finite() && **v != 0.0).count() > want.len() / 2);
    assert!(
        want.iter().any(|v| !v.is_finite()),
        "{name}: non-finite edge block missing"
    );

    let row_bytes = blocks_per_row * block_bytes;
    let row_elems = blocks_per_row * block_elems;
    let mut got = vec![f32::NAN; row_elems];
    for (r, (src, want)) in blocks
        .chunks(row_bytes)
        .zip(want.chunks(row_elems))
        .enumerate()
    {
        let out = &mut got[..want.len()]; // the last row may be shorter
        out.fill(f32::NAN);
        dequantize_row(ty, src, out);
        assert_bits_eq(out, want, &format!("{name} row {r}"));
    }

    let mut shifted = vec![0u8; blocks.len() + 1];
    shifted[1..].copy_from_slice(&blocks);
    let mut all = vec![f32::NAN; want.len()];
    dequantize_row(ty, &shifted[1..], &mut all);
    assert_bits_eq(&all, &want, &format!("{name} unaligned"));
}

#[test]
fn q8_0_matches_gguf_py() {
    check_fixture(GgmlType::Q8_0, "q8_0", 4);
}

#[test]
fn q4_0_matches_gguf_py() {
    check_fixture(GgmlType::Q4_0, "q4_0", 4);
}

#[test]
fn q4_1_matches_gguf_py() {
    check_fixture(GgmlType::Q4_1, "q4_1", 4);
}

#[test]
fn q5_0_matches_gguf_py() {
    check_fixture(GgmlType::Q5_0, "q5_0", 4);
}

#[test]
fn q5_1_matches_gguf_py() {
    check_fixture(GgmlType::Q5_1, "q5_1", 4);
}

#[test]
fn q2_k_matches_gguf_py() {
    check_fixture(GgmlType::Q2K, "q2_k", 3);
}

#[test]
fn q3_k_matches_gguf_py() {
    check_fixture(GgmlType::Q3K, "q3_k", 3);
}

#[test]
fn q4_k_matches_gguf_py() {
    check_fixture(GgmlType::Q4K, "q4_k", 3);
}

#[test]
fn q5_k_matches_gguf_py() {
    check_fixture(GgmlType::Q5K, "q5_k", 3);
}

#[test]
fn q6_k_matches_gguf_py() {
    check_fixture(GgmlType::Q6K, "q6_k", 3);
}

#[test]
fn f16_matches_gguf_py() {
    check_fixture(GgmlType::F16, "f16", 16);
}

#[test]
fn bf16_matches_gguf_py() {
    check_fixture(GgmlType::BF16, "bf16", 16);
}

/// Every fp16 pattern against a decoder written from the IEEE definition (independent of the
/// `half` crate the library uses).
#[test]
fn f16_all_patterns() {
    fn ieee(h: u16) -> f32 {
        let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
        let (e, m) = (i32::from((h >> 10) & 0x1F), f64::from(h & 0x3FF));
        let v = match e {
            0 => m * 2f64.powi(-24),
            31 if m == 0.0 => f64::INFINITY,
            31 => f64::NAN,
            _ => (1.0 + m / 1024.0) * 2f64.powi(e - 15),
        };
        (sign * v) as f32
    }
    let src: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
    let mut got = vec![0.0f32; 1 << 16];
    dequantize_row(GgmlType::F16, &src, &mut got);
    let want: Vec<f32> = (0..=u16::MAX).map(ieee).collect();
    assert_bits_eq(&got, &want, "f16");
}

#[test]
fn bf16_known_values() {
    let bits: [u16; 6] = [0x3F80, 0xC000, 0x7F80, 0x0001, 0x8000, 0x4049];
    let src: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    let mut got = [0.0f32; 6];
    dequantize_row(GgmlType::BF16, &src, &mut got);
    let want = [
        1.0,
        -2.0,
        f32::INFINITY,
        f32::from_bits(0x0001_0000),
        -0.0,
        3.140625,
    ];
    assert_bits_eq(&got, &want, "bf16");
}

#[test]
fn f32_copies_bits() {
    let want: Vec<f32> = [
        1.5f32,
        -0.0,
        f32::MIN_POSITIVE / 8.0,
        f32::MAX,
        f32::NEG_INFINITY,
    ]
    .into_iter()
    .chain([f32::from_bits(0x7FC0_1234), f32::from_bits(0xFF80_0001)]) // NaN payloads
    .collect();
    let src: Vec<u8> = want.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut got = vec![0.0f32; want.len()];
    dequantize_row(GgmlType::F32, &src, &mut got);
    let got_bits: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
    let want_bits: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
    assert_eq!(got_bits, want_bits);
}

#[test]
fn quantize_q8_0_matches_gguf_py() {
    let x = f32s(&fixture("q8_0_quant.f32"));
    let want = fixture("q8_0_quant.blocks");
    assert_eq!(want.len(), x.len() / 32 * 34);
    let row = 256; // 4 rows of 8 blocks, as the generator wrote them
    for (r, (x, want)) in x.chunks(row).zip(want.chunks(row / 32 * 34)).enumerate() {
        let mut got = vec![0xAAu8; want.len()];
        quantize_row_q8_0(x, &mut got);
        for (b, (g, w)) in got.chunks(34).zip(want.chunks(34)).enumerate() {
            assert_eq!(g, w, "row {r} block {b}");
        }
    }
}

/// Per block, the worst error quantize→dequantize may show: half a step of the f32 scale
/// `d = amax/127` (the quants are rounded with it), plus `|q| * |d - d16|` because the
/// stored scale is `d` rounded to fp16, plus f32 rounding slack. (A plain `d/2` bound does
/// not hold: the fp16 rounding of `d` alone moves `127 * d` by up to `127 * d * 2^-11`.)
fn check_q8_0_round_trip(x: &[f32]) -> Result<(), TestCaseError> {
    let mut q = vec![0u8; x.len() / 32 * 34];
    quantize_row_q8_0(x, &mut q);
    let mut y = vec![0.0f32; x.len()];
    dequantize_row(GgmlType::Q8_0, &q, &mut y);
    for ((x, y), q) in x.chunks(32).zip(y.chunks(32)).zip(q.chunks(34)) {
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let d16 = half::f16::from_le_bytes([q[0], q[1]]).to_f32();
        prop_assert_eq!(d16, half::f16::from_f32(d).to_f32());
        if !d16.is_finite() {
            continue; // amax above ~8.3e6: the fp16 scale overflows, as in ggml
        }
        if d16 == 0.0 {
            // d < 2^-25 underflows fp16 (and 1/d may overflow f32, where ggml's int8 cast is
            // undefined): whatever the quants, the block decodes to zeros, |x| <= 127 * 2^-25.
            prop_assert!(y.iter().all(|&v| v == 0.0));
            continue;
        }
        for (j, (&x, &y)) in x.iter().zip(y).enumerate() {
            let qj = f64::from(q[2 + j] as i8);
            let bound = f64::from(d) / 2.0
                + qj.abs() * (f64::from(d) - f64::from(d16)).abs()
                + f64::from(amax) * 1e-6;
            let err = (f64::from(x) - f64::from(y)).abs();
            prop_assert!(
                err <= bound,
                "x={x:e} y={y:e} err={err:e} bound={bound:e} d={d:e}"
            );
        }
    }
    Ok(())
}

/// Finite activations: moderate, exact .5 ties, zeros, subnormals, and huge outliers.
fn activation() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => -10.0f32..10.0,
        1 => (-300i32..300).prop_map(|k| k as f32 + 0.5),
        1 => Just(0.0f32),
        1 => Just(-0.0f32),
        1 => prop::num::f32::SUBNORMAL | prop::num::f32::NEGATIVE | prop::num::f32::POSITIVE,
        1 => prop::num::f32::NORMAL,
    ]
}

/// Rows of 1..=8 blocks, each block scaled by its own power of two (tiny to huge scales).
fn activation_row() -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec((prop::collection::vec(activation(), 32), -40i32..40), 1..=8).prop_map(
        |blocks| {
            blocks
                .into_iter()
                .flat_map(|(b, e)| b.into_iter().map(move |v| v * 2f32.powi(e)))
                .map(|v| {
                    if v.is_finite() {
                        v
                    } else {
                        f32::MAX.copysign(v)
                    }
                })
                .collect()
        },
    )
}

proptest! {
    #[test]
    fn q8_0_round_trip_error_is_bounded(x in activation_row()) {
        check_q8_0_round_trip(&x)?;
    }

    /// Anything, NaN and infinities included: quantize and dequantize must not panic, and
    /// finite blocks still round-trip.
    #[test]
    fn q8_0_never_panics(x in prop::collection::vec(any::<f32>(), 32..=32 * 4)) {
        let n = x.len() / 32 * 32;
        let mut q = vec![0u8; n / 32 * 34];
        quantize_row_q8_0(&x[..n], &mut q);
        let mut y = vec![0.0f32; n];
        dequantize_row(GgmlType::Q8_0, &q, &mut y);
        for b in x[..n].chunks(32).filter(|b| b.iter().all(|v| v.is_finite())) {
            check_q8_0_round_trip(b)?;
        }
    }
}

#[test]
fn q8_0_round_trip_edge_rows() {
    let row = |f: fn(usize) -> f32| (0..32).map(f).collect::<Vec<f32>>();
    let rows = [
        row(|j| if j == 5 { -1e-3 } else { 0.0 }), // one non-zero, negative
        row(|j| j as f32 - 15.5),                  // x * id near .5 ties
        row(|_| 8.0e6),                            // d = 62992: just below the fp16 maximum
        row(|j| (j as f32 - 3.0) * 1e-9),          // d underflows fp16 to zero
        row(|j| (j as f32) * 1e-41),               // subnormal inputs: 1/d overflows f32
    ];
    for row in rows {
        check_q8_0_round_trip(&row).unwrap();
    }
}

/// NaN inputs follow ggml's `amax = MAX(amax, fabsf(v))` with `MAX(a, b) = a > b ? a : b`:
/// a NaN becomes amax, and the next element replaces it. Trailing NaN: d is NaN.
#[test]
fn q8_0_nan_inputs_follow_ggml_max() {
    let mut x = [0.0f32; 32];
    x[0] = f32::NAN;
    x[1] = -12.7;
    x[2] = 1.0;
    let mut q = [0u8; 34];
    quantize_row_q8_0(&x, &mut q);
    let d = half::f16::from_le_bytes([q[0], q[1]]);
    assert_eq!(d, half::f16::from_f32(12.7 / 127.0)); // the NaN was forgotten
    assert_eq!(q[2..5], [0, (-127i8) as u8, 10]); // NaN * id quantises to 0

    x[31] = f32::NAN; // a trailing NaN is kept as amax
    quantize_row_q8_0(&x, &mut q);
    assert!(half::f16::from_le_bytes([q[0], q[1]]).is_nan());
}
