//! The scalar ggml decoders against gguf-py's numpy codecs (which match libggml bit for bit).
//!
//! Fixtures come from `tools/reference/quant_fixtures.py` (see fixtures/quant/README.md):
//! `<type>.blocks` are raw GGUF blocks, `<type>.f32` gguf-py's dequantisation of them;
//! `<type>_llama.*` hold rows that llama.cpp's own quantiser wrote. The IQ lookup tables are
//! checked against the SHA-256 values of spec/formats.md §3.12.

use lagoon_core::dtype::GgmlType;
use lagoon_core::quant::{dequantize_row, quantize_row_q8_0, supported, tables};
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

#[test]
fn iq2_xxs_matches_gguf_py() {
    check_fixture(GgmlType::IQ2XXS, "iq2_xxs", 3);
}

#[test]
fn iq2_xs_matches_gguf_py() {
    check_fixture(GgmlType::IQ2XS, "iq2_xs", 3);
}

#[test]
fn iq2_s_matches_gguf_py() {
    check_fixture(GgmlType::IQ2S, "iq2_s", 3);
}

#[test]
fn iq3_xxs_matches_gguf_py() {
    check_fixture(GgmlType::IQ3XXS, "iq3_xxs", 3);
}

#[test]
fn iq3_s_matches_gguf_py() {
    check_fixture(GgmlType::IQ3S, "iq3_s", 3);
}

#[test]
fn iq1_s_matches_gguf_py() {
    check_fixture(GgmlType::IQ1S, "iq1_s", 3);
}

#[test]
fn iq1_m_matches_gguf_py() {
    check_fixture(GgmlType::IQ1M, "iq1_m", 3);
}

#[test]
fn iq4_nl_matches_gguf_py() {
    check_fixture(GgmlType::IQ4NL, "iq4_nl", 4);
}

#[test]
fn iq4_xs_matches_gguf_py() {
    check_fixture(GgmlType::IQ4XS, "iq4_xs", 3);
}

#[test]
fn tq1_0_matches_gguf_py() {
    check_fixture(GgmlType::TQ1_0, "tq1_0", 3);
}

#[test]
fn tq2_0_matches_gguf_py() {
    check_fixture(GgmlType::TQ2_0, "tq2_0", 3);
}

#[test]
fn mxfp4_matches_gguf_py() {
    check_fixture(GgmlType::MXFP4, "mxfp4", 4);
}

/// Row length of the llama.cpp-quantised tensor (`blk.0.ffn_down.weight`, 512 inputs).
const LLAMA_ROW: usize = 512;

/// Rows that llama.cpp's quantiser wrote (`<name>_llama.*`), decoded row by row as a tensor
/// is: every value finite, nearly all non-zero, and bit-identical to gguf-py.
fn check_llama_fixture(ty: GgmlType, name: &str) {
    let name = format!("{name}_llama");
    let blocks = fixture(&format!("{name}.blocks"));
    let want = f32s(&fixture(&format!("{name}.f32")));
    let row_bytes = ty.row_bytes(LLAMA_ROW as u64).unwrap() as usize;
    assert_eq!(blocks.len() % row_bytes, 0, "{name}: whole rows");
    assert_eq!(
        want.len(),
        blocks.len() / row_bytes * LLAMA_ROW,
        "{name}: sizes"
    );
    assert!(want.iter().all(|v| v.is_finite()), "{name}");
    assert!(
        want.iter().filter(|v| **v != 0.0).count() > want.len() / 2,
        "{name}"
    );
    let mut got = vec![f32::NAN; LLAMA_ROW];
    for (r, (src, want)) in blocks
        .chunks(row_bytes)
        .zip(want.chunks(LLAMA_ROW))
        .enumerate()
    {
        got.fill(f32::NAN);
        dequantize_row(ty, src, &mut got);
        assert_bits_eq(&got, want, &format!("{name} row {r}"));
    }
}

#[test]
fn llama_cpp_quantised_rows_match_gguf_py() {
    let types = [
        (GgmlType::IQ2XXS, "iq2_xxs"),
        (GgmlType::IQ2XS, "iq2_xs"),
        (GgmlType::IQ2S, "iq2_s"),
        (GgmlType::IQ3XXS, "iq3_xxs"),
        (GgmlType::IQ3S, "iq3_s"),
        (GgmlType::IQ1S, "iq1_s"),
        (GgmlType::IQ1M, "iq1_m"),
        (GgmlType::IQ4NL, "iq4_nl"),
        (GgmlType::IQ4XS, "iq4_xs"),
        (GgmlType::TQ1_0, "tq1_0"),
        (GgmlType::TQ2_0, "tq2_0"),
        (GgmlType::MXFP4, "mxfp4"),
    ];
    for (ty, name) in types {
        check_llama_fixture(ty, name);
    }
}

/// In IQ2_XXS, IQ2_XS and IQ3_XXS the 8th sign of a run is the parity of the other 7, so with
/// a positive scale every 8-weight run has an even number of negative outputs.
#[test]
fn ksigns_types_have_even_negatives_per_run() {
    for (ty, name) in [
        (GgmlType::IQ2XXS, "iq2_xxs"),
        (GgmlType::IQ2XS, "iq2_xs"),
        (GgmlType::IQ3XXS, "iq3_xxs"),
    ] {
        let want = f32s(&fixture(&format!("{name}_llama.f32")));
        let blocks = fixture(&format!("{name}_llama.blocks"));
        let mut got = vec![0.0f32; want.len()];
        dequantize_row(ty, &blocks, &mut got);
        for (k, run) in got.chunks(8).enumerate() {
            let negatives = run.iter().filter(|v| v.is_sign_negative()).count();
            let positives = run.iter().filter(|v| v.is_sign_positive()).count();
            // A negative block scale flips all 8 signs: the count stays even either way.
            assert_eq!(negatives % 2, 0, "{name} run {k}: {run:?}");
            assert_eq!(negatives + positives, 8);
        }
    }
}

/// A small SHA-256 (FIPS 180-4), enough to check the lookup tables without a dependency.
fn sha256(msg: &[u8]) -> [u8; 32] {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut data = msg.to_vec();
    data.push(0x80);
    while data.len() % 64 != 56 {
        data.push(0);
    }
    data.extend_from_slice(&(msg.len() as u64 * 8).to_be_bytes());
    for chunk in data.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (t, word) in chunk.chunks_exact(4).enumerate() {
            w[t] = u32::from_be_bytes(word.try_into().unwrap());
        }
        for t in 16..64 {
            let s0 = w[t - 15].rotate_right(7) ^ w[t - 15].rotate_right(18) ^ (w[t - 15] >> 3);
            let s1 = w[t - 2].rotate_right(17) ^ w[t - 2].rotate_right(19) ^ (w[t - 2] >> 10);
            w[t] = w[t - 16]
                .wrapping_add(s0)
                .wrapping_add(w[t - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for t in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[t])
                .wrapping_add(w[t]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            (hh, g, f, e, d, c, b, a) = (g, f, e, d.wrapping_add(t1), c, b, a, t1.wrapping_add(t2));
        }
        for (h, v) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *h = h.wrapping_add(v);
        }
    }
    let mut out = [0u8; 32];
    for (o, v) in out.chunks_exact_mut(4).zip(h) {
        o.copy_from_slice(&v.to_be_bytes());
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn sha256_known_answers() {
    // FIPS 180-4 examples: empty, one block, two blocks (56 bytes pushes the length over).
    let cases = [
        (
            &b""[..],
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        ),
        (
            b"abc",
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        ),
        (
            b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
        ),
    ];
    for (msg, want) in cases {
        assert_eq!(
            hex(&sha256(msg)),
            want,
            "{:?}",
            String::from_utf8_lossy(msg)
        );
    }
}

/// The lookup tables, as little-endian bytes, against the SHA-256 values listed in
/// spec/formats.md §3.12 (kvalues_fp4, not listed there, against the value in
/// fixtures/quant/README.md, computed by tools/reference/gen_iq_tables.py from ggml).
#[test]
fn lookup_tables_match_spec_sha256() {
    fn le<const N: usize, T: Copy>(t: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        t.iter().flat_map(|&v| f(v)).collect()
    }
    let i8s = |t: &[i8]| t.iter().map(|&v| v as u8).collect::<Vec<u8>>();
    let cases: [(&str, Vec<u8>, &str); 10] = [
        (
            "kvalues_iq4nl",
            i8s(&tables::KVALUES_IQ4NL),
            "61aa47540aa024b5d6ddaa839b84ffe59f3d5a349af5c6c7ffcb5e0474b46163",
        ),
        (
            "kmask_iq2xs",
            tables::KMASK_IQ2XS.to_vec(),
            "5ac9831b2e30eb285ef34f8501620f878432d5c04331ad1ae47f977a83ba41a5",
        ),
        (
            "ksigns_iq2xs",
            tables::KSIGNS_IQ2XS.to_vec(),
            "a76742a603f8beca5212ecce0f1f02f11a4887fd2f7c8b15aca0ea3eb3380c31",
        ),
        (
            "iq2xxs_grid",
            le(&tables::IQ2XXS_GRID, u64::to_le_bytes),
            "05826b5d3e472a3a78f196be62ac78acf81df0f909626e12ab9fa2a5d490dd54",
        ),
        (
            "iq2xs_grid",
            le(&tables::IQ2XS_GRID, u64::to_le_bytes),
            "06e47aaca60b4dc1d9b5a3f34540437058a6b142b4d7a59d5ded769b4d1bf1de",
        ),
        (
            "iq2s_grid",
            le(&tables::IQ2S_GRID, u64::to_le_bytes),
            "e1aa1473412b0552c2174c30ef22ab4073f6a181b85a17056e8249bd2932fd88",
        ),
        (
            "iq3xxs_grid",
            le(&tables::IQ3XXS_GRID, u32::to_le_bytes),
            "46e35f5a997efdee6c99ce57854c8a0d4f0ff8ca57e5e8a60c0793ea580acf5d",
        ),
        (
            "iq3s_grid",
            le(&tables::IQ3S_GRID, u32::to_le_bytes),
            "bd1af4945a1717c65610b0284e4628b9a1ba3b306fae3a06f6e5f597356e349f",
        ),
        (
            "iq1s_grid",
            le(&tables::IQ1S_GRID, u64::to_le_bytes),
            "07540ffc1aeaf6ad4d97e96b0fcc765aae39671d4ae4a27bbd0e796fde167c6a",
        ),
        (
            "kvalues_fp4",
            i8s(&tables::KVALUES_FP4),
            "adf76b672d47eb7fc0afd4db132d548d59d3190aa0ad118fdbf569d5fd478f97",
        ),
    ];
    for (name, bytes, want) in cases {
        assert_eq!(hex(&sha256(&bytes)), want, "{name}");
    }
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
