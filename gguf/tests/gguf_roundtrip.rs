//! Writer → reader → writer: every value type and every ggml tensor type survive, at
//! several alignments, and rewriting what was read gives the same bytes.

use lagoon_core::dtype::GgmlType;
use lagoon_gguf::gguf::{Array, GgufError, GgufFile, GgufWriter, Value};

/// Every ggml type lagoon knows.
const ALL_TYPES: [GgmlType; 33] = {
    use GgmlType::*;
    [
        F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2K, Q3K, Q4K, Q5K, Q6K, Q8K, IQ2XXS, IQ2XS,
        IQ3XXS, IQ1S, IQ4NL, IQ3S, IQ2S, IQ4XS, I8, I16, I32, I64, F64, IQ1M, BF16, TQ1_0, TQ2_0,
        MXFP4, NVFP4,
    ]
};

/// Deterministic non-zero bytes (xorshift).
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

fn every_value() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::from("roundtrip")),
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-5)),
        ("t.u16", Value::U16(60000)),
        ("t.i16", Value::I16(-30000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.f32", Value::F32(f32::NAN)),
        ("t.f32b", Value::F32(-0.0)),
        ("t.bool", Value::Bool(true)),
        ("t.str", Value::from("ünïcode ✓")),
        ("t.str_empty", Value::from("")),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f64", Value::F64(f64::INFINITY)),
        ("t.a.u8", Value::from(vec![1u8, 2, 3])),
        ("t.a.i8", Value::from(vec![-1i8, 1])),
        ("t.a.u16", Value::from(vec![7u16])),
        ("t.a.i16", Value::from(vec![-7i16, 7])),
        ("t.a.u32", Value::from(vec![48u32, 64, 64, 64])),
        ("t.a.i32", Value::from((0..1000).collect::<Vec<i32>>())),
        ("t.a.f32", Value::from(vec![1.5f32, f32::NAN, -0.0])),
        ("t.a.bool", Value::from(vec![true, false, true])),
        ("t.a.str", Value::from(vec!["Ġa", "", "\u{0}x"])),
        ("t.a.u64", Value::from(vec![u64::MAX, 0])),
        ("t.a.i64", Value::from(vec![i64::MIN, i64::MAX])),
        ("t.a.f64", Value::from(vec![f64::MIN_POSITIVE, -1e300])),
        ("t.a.empty_str", Value::Array(Array::Str(vec![]))),
        ("t.a.empty_f32", Value::Array(Array::F32(vec![]))),
        (
            "t.a.nested",
            Value::Array(Array::Array(vec![
                Array::U8(vec![1, 2]),
                Array::Str(vec!["x".into()]),
                Array::Array(vec![Array::Bool(vec![])]),
            ])),
        ),
    ]
}

/// A writer with every value type and one tensor of every ggml type (2-D, 3-D, 1-D).
fn full_writer(alignment: Option<u32>) -> GgufWriter {
    let mut w = GgufWriter::new();
    if let Some(a) = alignment {
        w.set_alignment(a).unwrap();
    }
    for (k, v) in every_value() {
        w.add(k, v).unwrap();
    }
    for (i, ty) in ALL_TYPES.into_iter().enumerate() {
        let (blk, bb) = ty.block();
        let ne: Vec<u64> = match i % 3 {
            0 => vec![2 * blk as u64, 3],
            1 => vec![blk as u64, 2, 3],
            _ => vec![blk as u64],
        };
        let n = (ne[0] as usize / blk) * bb * ne[1..].iter().product::<u64>() as usize;
        w.add_tensor(&format!("t{i}.{}", ty.name()), ty, &ne, bytes(n, i as u64))
            .unwrap();
    }
    w
}

#[test]
fn write_read_write_is_identical() {
    for alignment in [None, Some(1), Some(8), Some(64), Some(4096)] {
        let w = full_writer(alignment);
        let (b, layout) = w.to_bytes_with_layout();
        let f = GgufFile::parse(&b).unwrap();
        let a = u64::from(alignment.unwrap_or(32));
        assert_eq!(f.alignment, a);
        assert_eq!(f.data_start, layout.data_start);
        assert_eq!(b.len() as u64, layout.file_len);
        assert_eq!(f.data_start % a, 0);
        // Metadata: same keys, types and values (Debug compares NaN payload-free but
        // equal; the byte comparison below catches any bit difference).
        assert_eq!(f.metadata.len(), w.metadata().len());
        for ((k1, v1), (k2, v2)) in f.metadata.iter().zip(w.metadata()) {
            assert_eq!(k1, k2);
            assert_eq!(format!("{v1:?}"), format!("{v2:?}"), "{k1}");
        }
        // Tensors: same dims, type, offsets and bytes.
        assert_eq!(f.tensors.len(), ALL_TYPES.len());
        for (t, l) in f.tensors.iter().zip(&layout.tensors) {
            assert_eq!(t.name, l.name);
            assert_eq!(t.offset, l.offset);
            assert_eq!(t.n_bytes, l.n_bytes);
            assert_eq!(t.offset % a, 0);
            let i: usize = t.name[1..t.name.find('.').unwrap()].parse().unwrap();
            assert_eq!(t.ty, ALL_TYPES[i]);
            assert_eq!(
                f.tensor_data(&b, t).unwrap(),
                bytes(t.n_bytes as usize, i as u64)
            );
        }
        // Rewrite from what was read.
        let mut w2 = GgufWriter::new();
        for (k, v) in &f.metadata {
            w2.add(k, v.clone()).unwrap();
        }
        for t in &f.tensors {
            w2.add_tensor(&t.name, t.ty, &t.ne, f.tensor_data(&b, t).unwrap())
                .unwrap();
        }
        assert_eq!(w2.to_bytes(), b, "alignment {alignment:?}");
    }
}

#[test]
fn empty_file_round_trips() {
    let b = GgufWriter::new().to_bytes();
    assert_eq!(b.len(), 32, "24-byte header padded to 32");
    let f = GgufFile::parse(&b).unwrap();
    assert!(f.metadata.is_empty() && f.tensors.is_empty());
    // A header with nothing after it (no padding) is valid too.
    assert!(GgufFile::parse(&b[..24]).is_ok());
}

#[test]
fn zero_element_tensor_round_trips() {
    let mut w = GgufWriter::new();
    w.add_tensor("empty", GgmlType::F32, &[0, 7], Vec::new())
        .unwrap();
    w.add_tensor("one", GgmlType::F32, &[1], 1.0f32.to_le_bytes())
        .unwrap();
    let b = w.to_bytes();
    let f = GgufFile::parse(&b).unwrap();
    assert_eq!(f.tensors[0].n_bytes, 0);
    assert_eq!(f.tensors[0].shape(), vec![7, 0]);
    assert_eq!(
        f.tensor_data(&b, &f.tensors[1]).unwrap(),
        1.0f32.to_le_bytes()
    );
}

#[test]
fn writer_rejects_what_the_reader_would() {
    let mut w = GgufWriter::new();
    w.add("a", 1u32).unwrap();
    assert!(matches!(
        w.add("a", 2u32),
        Err(GgufError::DuplicateKey { .. })
    ));
    assert!(matches!(w.add("", 2u32), Err(GgufError::EmptyKey { .. })));
    assert!(matches!(
        w.set_alignment(48),
        Err(GgufError::BadAlignment { got: 48 })
    ));
    assert!(matches!(
        w.set_alignment(0),
        Err(GgufError::BadAlignment { got: 0 })
    ));
    assert!(matches!(
        w.add("general.alignment", 64u64),
        Err(GgufError::AlignmentNotU32 { .. })
    ));
    let deep = Array::Array(vec![Array::Array(vec![Array::Array(vec![Array::Array(
        vec![Array::U8(vec![])],
    )])])]);
    assert!(matches!(
        w.add("deep", deep),
        Err(GgufError::ArrayTooDeep { .. })
    ));
    let long = "x".repeat(64);
    assert!(matches!(
        w.add_tensor(&long, GgmlType::F32, &[1], vec![0; 4]),
        Err(GgufError::NameTooLong { len: 64, .. })
    ));
    w.add_tensor(&"x".repeat(63), GgmlType::F32, &[1], vec![0; 4])
        .unwrap();
    assert!(matches!(
        w.add_tensor(&"x".repeat(63), GgmlType::F32, &[1], vec![0; 4]),
        Err(GgufError::DuplicateTensor { .. })
    ));
    assert!(matches!(
        w.add_tensor("d", GgmlType::F32, &[1, 1, 1, 1, 1], vec![0; 4]),
        Err(GgufError::TooManyDims { n_dims: 5, .. })
    ));
    assert!(matches!(
        w.add_tensor("r", GgmlType::Q8_0, &[33], vec![0; 34]),
        Err(GgufError::RaggedRow { .. })
    ));
    assert!(matches!(
        w.add_tensor("s", GgmlType::Q8_0, &[32, 2], vec![0; 34]),
        Err(GgufError::DataSizeMismatch {
            expected: 68,
            got: 34,
            ..
        })
    ));
    // Nothing rejected was recorded.
    let f = GgufFile::parse(&w.to_bytes()).unwrap();
    assert_eq!(f.metadata.len(), 1);
    assert_eq!(f.tensors.len(), 1);
}

#[test]
fn file_round_trip_through_disk() {
    let w = full_writer(Some(64));
    let p = std::env::temp_dir().join(format!("lagoon-gguf-rt-{}.gguf", std::process::id()));
    let layout = w.write_file(&p).unwrap();
    let on_disk = std::fs::read(&p).unwrap();
    assert_eq!(on_disk, w.to_bytes());
    assert_eq!(on_disk.len() as u64, layout.file_len);
    let set = lagoon_gguf::gguf::GgufSet::open(&p).unwrap();
    assert_eq!(set.files[0].tensors.len(), ALL_TYPES.len());
    let _ = std::fs::remove_file(&p);
}
