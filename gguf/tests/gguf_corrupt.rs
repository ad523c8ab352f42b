//! The corrupt-file catalogue: each case mutates one field of a valid file written by
//! `GgufWriter` (located through its `Layout`) and must give its own typed error, never
//! a panic and never an allocation sized by the corrupt field. A proptest then flips and
//! truncates random bytes and only asks that the reader return.

use lagoon_core::dtype::GgmlType;
use lagoon_gguf::gguf::{Array, Claim, GgufError, GgufFile, GgufWriter, Layout, Value, ValueType};
use proptest::prelude::*;

const HUGE: u64 = 1 << 60;

/// A valid file with keys and tensors chosen so that every mutation below has a field to
/// hit: two keys of equal length, numeric/string/bool/nested arrays, an explicit
/// `general.alignment`, and three tensors (Q8_0 2-D, F32 1-D, F32 2-D) with names of equal
/// length; the last one is 48 bytes, so 16 bytes of padding end the file.
fn base() -> (Vec<u8>, Layout) {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "laguna").unwrap();
    w.set_alignment(32).unwrap();
    w.add("a.key1", 7u32).unwrap();
    w.add("a.key2", 8u32).unwrap();
    w.add("a.arr", vec![1u32, 2, 3]).unwrap();
    w.add("a.strs", vec!["x", "yy", "zzz"]).unwrap();
    w.add("a.bool", true).unwrap();
    w.add(
        "a.deep",
        Value::Array(Array::Array(vec![Array::Array(vec![Array::Array(vec![
            Array::U8(vec![1, 2, 3, 4]),
        ])])])),
    )
    .unwrap();
    w.add("a.name", "some text").unwrap();
    w.add_tensor("tensor.aa", GgmlType::Q8_0, &[32, 2], vec![0x11; 68])
        .unwrap();
    w.add_tensor("tensor.bb", GgmlType::F32, &[4], vec![0x22; 16])
        .unwrap();
    w.add_tensor("tensor.cc", GgmlType::F32, &[6, 2], vec![0x33; 48])
        .unwrap();
    let (b, l) = w.to_bytes_with_layout();
    GgufFile::parse(&b).expect("the base file is valid");
    (b, l)
}

fn kv<'a>(l: &'a Layout, key: &str) -> &'a lagoon_gguf::gguf::KvLayout {
    l.kvs.iter().find(|k| k.key == key).unwrap()
}

fn put_u32(b: &mut [u8], at: u64, v: u32) {
    b[at as usize..at as usize + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: u64, v: u64) {
    b[at as usize..at as usize + 8].copy_from_slice(&v.to_le_bytes());
}

/// Parses a mutated file; it must fail, and its message must be printable.
fn parse_err(b: &[u8]) -> GgufError {
    let e = GgufFile::parse(b).expect_err("the corrupt file parsed");
    assert!(!e.to_string().is_empty());
    e
}

/// Applies `mutate` to a fresh base file and parses it.
fn mutated(mutate: impl FnOnce(&mut Vec<u8>, &Layout)) -> GgufError {
    let (mut b, l) = base();
    mutate(&mut b, &l);
    parse_err(&b)
}

// ------------------------------------------------------------------------- header

#[test]
fn truncated_header() {
    for n in [0, 3, 4, 7, 8, 15, 16, 23] {
        let (b, _) = base();
        let e = parse_err(&b[..n]);
        assert!(matches!(e, GgufError::Truncated { .. }), "{n}: {e:?}");
    }
}

#[test]
fn bad_magic() {
    let e = mutated(|b, _| b[0] = b'X');
    assert!(
        matches!(e, GgufError::BadMagic { got } if &got == b"XGUF"),
        "{e:?}"
    );
    assert!(e.to_string().contains("not a GGUF file"));
}

#[test]
fn version_1() {
    let e = mutated(|b, _| put_u32(b, 4, 1));
    assert!(
        matches!(e, GgufError::UnsupportedVersion { version: 1 }),
        "{e:?}"
    );
}

#[test]
fn version_4() {
    let e = mutated(|b, _| put_u32(b, 4, 4));
    assert!(
        matches!(e, GgufError::UnsupportedVersion { version: 4 }),
        "{e:?}"
    );
}

#[test]
fn big_endian_version() {
    let e = mutated(|b, _| b[4..8].copy_from_slice(&[0, 0, 0, 3]));
    assert!(
        matches!(
            e,
            GgufError::BigEndian {
                version: 0x0300_0000
            }
        ),
        "{e:?}"
    );
}

#[test]
fn absurd_kv_count() {
    let e = mutated(|b, l| put_u64(b, l.kv_count_at, HUGE));
    assert!(
        matches!(
            e,
            GgufError::ClaimExceedsFile {
                claim: Claim::KvCount,
                claimed: HUGE,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn absurd_tensor_count() {
    let e = mutated(|b, l| put_u64(b, l.tensor_count_at, HUGE));
    assert!(
        matches!(
            e,
            GgufError::ClaimExceedsFile {
                claim: Claim::TensorCount,
                claimed: HUGE,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn kv_count_one_too_many() {
    // Plausible but wrong: the parser runs off the KV records into the tensor infos and
    // must fail on what it finds there, whatever that is, without panicking.
    let (mut b, l) = base();
    put_u64(&mut b, l.kv_count_at, l.kvs.len() as u64 + 1);
    let _ = parse_err(&b);
}

// ------------------------------------------------------------------- key/values

#[test]
fn absurd_key_length() {
    let e = mutated(|b, l| put_u64(b, kv(l, "a.key1").start, HUGE));
    assert!(
        matches!(
            e,
            GgufError::ClaimExceedsFile {
                claim: Claim::StringLength,
                claimed: HUGE,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn absurd_string_value_length() {
    let e = mutated(|b, l| put_u64(b, kv(l, "a.name").value_at, u64::MAX));
    assert!(
        matches!(
            e,
            GgufError::ClaimExceedsFile {
                claim: Claim::StringLength,
                claimed: u64::MAX,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn absurd_array_count() {
    let e = mutated(|b, l| put_u64(b, kv(l, "a.arr").value_at + 4, HUGE));
    assert!(
        matches!(
            e,
            GgufError::ClaimExceedsFile {
                claim: Claim::ArrayLength,
                claimed: HUGE,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn absurd_string_array_count() {
    // Each string needs at least 8 bytes: a count just above remaining/8 is impossible.
    let e = mutated(|b, l| {
        let at = kv(l, "a.strs").value_at + 4;
        let left = b.len() as u64 - (at + 8);
        put_u64(b, at, left / 8 + 1);
    });
    assert!(
        matches!(
            e,
            GgufError::ClaimExceedsFile {
                claim: Claim::ArrayLength,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn array_element_string_too_long() {
    // The first string element ("x") claims more bytes than remain.
    let e = mutated(|b, l| put_u64(b, kv(l, "a.strs").value_at + 12, HUGE));
    assert!(
        matches!(
            e,
            GgufError::ClaimExceedsFile {
                claim: Claim::StringLength,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn unknown_value_type() {
    let e = mutated(|b, l| put_u32(b, kv(l, "a.key1").type_at, 13));
    assert!(
        matches!(&e, GgufError::UnknownValueType { key, got: 13, .. } if key == "a.key1"),
        "{e:?}"
    );
}

#[test]
fn unknown_array_element_type() {
    let e = mutated(|b, l| put_u32(b, kv(l, "a.arr").value_at, 0xdead));
    assert!(
        matches!(&e, GgufError::UnknownValueType { key, got: 0xdead, .. } if key == "a.arr"),
        "{e:?}"
    );
}

#[test]
fn duplicate_key() {
    let e = mutated(|b, l| {
        let at = kv(l, "a.key2").start as usize + 8;
        b[at..at + 6].copy_from_slice(b"a.key1");
    });
    assert!(
        matches!(&e, GgufError::DuplicateKey { key, .. } if key == "a.key1"),
        "{e:?}"
    );
}

#[test]
fn empty_key() {
    let e = mutated(|b, l| {
        let k = kv(l, "a.key1");
        put_u64(b, k.start, 0);
        let s = k.start as usize + 8;
        b.drain(s..s + "a.key1".len());
    });
    assert!(matches!(e, GgufError::EmptyKey { .. }), "{e:?}");
}

#[test]
fn invalid_bool() {
    let e = mutated(|b, l| b[kv(l, "a.bool").value_at as usize] = 2);
    assert!(
        matches!(&e, GgufError::InvalidBool { key, got: 2, .. } if key == "a.bool"),
        "{e:?}"
    );
}

#[test]
fn key_not_utf8() {
    let e = mutated(|b, l| b[kv(l, "a.key1").start as usize + 8] = 0xff);
    assert!(matches!(e, GgufError::InvalidUtf8 { .. }), "{e:?}");
}

#[test]
fn nested_arrays_too_deep() {
    // a.deep is 4 levels; turn the innermost u8 array into an array of arrays.
    let e = mutated(|b, l| put_u32(b, kv(l, "a.deep").value_at + 36, ValueType::Array.id()));
    assert!(
        matches!(&e, GgufError::ArrayTooDeep { key, max_depth: 4, .. } if key == "a.deep"),
        "{e:?}"
    );
}

#[test]
fn alignment_not_power_of_two() {
    let e = mutated(|b, l| put_u32(b, kv(l, "general.alignment").value_at, 48));
    assert!(matches!(e, GgufError::BadAlignment { got: 48 }), "{e:?}");
}

#[test]
fn alignment_zero() {
    let e = mutated(|b, l| put_u32(b, kv(l, "general.alignment").value_at, 0));
    assert!(matches!(e, GgufError::BadAlignment { got: 0 }), "{e:?}");
}

#[test]
fn alignment_not_u32() {
    // Same width, other type: i32 32.
    let e = mutated(|b, l| put_u32(b, kv(l, "general.alignment").type_at, ValueType::I32.id()));
    assert!(
        matches!(
            e,
            GgufError::AlignmentNotU32 {
                got: ValueType::I32
            }
        ),
        "{e:?}"
    );
}

// ------------------------------------------------------------------ tensor infos

#[test]
fn tensor_name_64_bytes() {
    let e = mutated(|b, l| {
        let t = &l.tensors[1];
        let grow = 64 - t.name.len();
        put_u64(b, t.start, 64);
        let at = t.start as usize + 8 + t.name.len();
        b.splice(at..at, std::iter::repeat_n(b'z', grow));
    });
    assert!(matches!(e, GgufError::NameTooLong { len: 64, .. }), "{e:?}");
}

#[test]
fn absurd_tensor_name_length() {
    let e = mutated(|b, l| put_u64(b, l.tensors[0].start, HUGE));
    assert!(
        matches!(
            e,
            GgufError::ClaimExceedsFile {
                claim: Claim::StringLength,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn duplicate_tensor_names() {
    let e = mutated(|b, l| {
        let at = l.tensors[2].start as usize + 8;
        b[at..at + 9].copy_from_slice(b"tensor.aa");
    });
    assert!(
        matches!(&e, GgufError::DuplicateTensor { name, .. } if name == "tensor.aa"),
        "{e:?}"
    );
}

#[test]
fn n_dims_5() {
    let e = mutated(|b, l| put_u32(b, l.tensors[0].n_dims_at, 5));
    assert!(
        matches!(e, GgufError::TooManyDims { n_dims: 5, .. }),
        "{e:?}"
    );
}

#[test]
fn absurd_n_dims() {
    let e = mutated(|b, l| put_u32(b, l.tensors[0].n_dims_at, u32::MAX));
    assert!(matches!(e, GgufError::TooManyDims { .. }), "{e:?}");
}

#[test]
fn unknown_tensor_type_ids() {
    // 4, 5 and 31..=33 were removed (block size 0); 41+ is newer than lagoon; u32::MAX.
    for id in [4, 5, 31, 33, 36, 41, 1000, u32::MAX] {
        let e = mutated(|b, l| put_u32(b, l.tensors[1].type_at, id));
        assert!(
            matches!(&e, GgufError::UnknownTensorType { tensor, got, .. } if tensor == "tensor.bb" && *got == id),
            "{id}: {e:?}"
        );
    }
}

#[test]
fn ne0_not_a_multiple_of_the_block() {
    let e = mutated(|b, l| put_u64(b, l.tensors[0].ne_at, 33));
    assert!(
        matches!(
            e,
            GgufError::RaggedRow {
                ne0: 33,
                block: 32,
                ty: GgmlType::Q8_0,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn dims_overflow_when_multiplied() {
    // 32 × 2^62 elements overflow i64.
    let e = mutated(|b, l| put_u64(b, l.tensors[0].ne_at + 8, 1 << 62));
    assert!(matches!(e, GgufError::DimsOverflow { .. }), "{e:?}");
    // A dim that is negative as i64.
    let e = mutated(|b, l| put_u64(b, l.tensors[2].ne_at, u64::MAX));
    assert!(matches!(e, GgufError::DimsOverflow { .. }), "{e:?}");
    // Fits i64 elements, but not u64 bytes: F32 2^61 elements × 4 bytes × 2 rows.
    let e = mutated(|b, l| put_u64(b, l.tensors[2].ne_at, 1 << 61));
    assert!(matches!(e, GgufError::DimsOverflow { .. }), "{e:?}");
}

#[test]
fn truncated_tensor_info() {
    let (b, l) = base();
    let mid = (l.tensors[1].ne_at + 3) as usize;
    let e = parse_err(&b[..mid]);
    assert!(matches!(e, GgufError::Truncated { .. }), "{e:?}");
}

// ------------------------------------------------------------------- data section

#[test]
fn offset_past_eof() {
    let e = mutated(|b, l| put_u64(b, l.tensors[2].offset_at, 1 << 40));
    assert!(
        matches!(&e, GgufError::TensorOutOfFile { tensor, .. } if tensor == "tensor.cc"),
        "{e:?}"
    );
    // An offset so large that data_start + offset overflows u64.
    let e = mutated(|b, l| put_u64(b, l.tensors[2].offset_at, u64::MAX - 31));
    assert!(matches!(e, GgufError::TensorOutOfFile { .. }), "{e:?}");
}

#[test]
fn overlapping_tensors() {
    // tensor.bb moved onto tensor.aa's bytes.
    let e = mutated(|b, l| put_u64(b, l.tensors[1].offset_at, l.tensors[0].offset));
    assert!(
        matches!(&e, GgufError::TensorsOverlap { first, second, .. }
            if (first.as_str(), second.as_str()) == ("tensor.aa", "tensor.bb")
                || (first.as_str(), second.as_str()) == ("tensor.bb", "tensor.aa")),
        "{e:?}"
    );
    // Partial overlap: tensor.aa is 68 bytes, so offset 64 for tensor.bb overlaps it.
    let e = mutated(|b, l| put_u64(b, l.tensors[1].offset_at, 64));
    assert!(matches!(e, GgufError::TensorsOverlap { .. }), "{e:?}");
}

#[test]
fn misaligned_offset() {
    let e = mutated(|b, l| put_u64(b, l.tensors[1].offset_at, l.tensors[1].offset + 4));
    assert!(
        matches!(&e, GgufError::MisalignedTensor { tensor, alignment: 32, .. } if tensor == "tensor.bb"),
        "{e:?}"
    );
}

#[test]
fn truncated_data_section() {
    let (b, l) = base();
    for cut in [l.data_start, l.data_start + 10, l.file_len - 17] {
        let e = parse_err(&b[..cut as usize]);
        assert!(
            matches!(e, GgufError::TensorOutOfFile { .. }),
            "{cut}: {e:?}"
        );
    }
    // Only the trailing padding of the last tensor may be cut.
    assert!(GgufFile::parse(&b[..(l.file_len - 16) as usize]).is_ok());
}

#[test]
fn errors_name_what_and_where() {
    let e = mutated(|b, l| put_u32(b, l.tensors[1].type_at, 4));
    let msg = e.to_string();
    assert!(
        msg.contains("tensor.bb") && msg.contains("type id 4"),
        "{msg}"
    );
    let e = mutated(|b, l| put_u64(b, kv(l, "a.arr").value_at + 4, HUGE));
    let msg = e.to_string();
    assert!(
        msg.contains("a.arr") && msg.contains(&HUGE.to_string()),
        "{msg}"
    );
    let wrapped = e.in_file("/models/x.gguf");
    assert!(wrapped.to_string().starts_with("/models/x.gguf: "));
    assert!(matches!(wrapped.root(), GgufError::ClaimExceedsFile { .. }));
}

// ---------------------------------------------------------------- no-panic sweeps

#[test]
fn every_truncation_fails_cleanly() {
    let (b, l) = base();
    // Cutting anywhere before the last tensor's end is an error; never a panic.
    let last_end = l.data_start + l.tensors[2].offset + l.tensors[2].n_bytes;
    for n in 0..last_end as usize {
        assert!(GgufFile::parse(&b[..n]).is_err(), "prefix {n} parsed");
    }
}

#[test]
fn every_byte_set_to_extremes_returns() {
    let (b, l) = base();
    for i in 0..l.data_start as usize {
        for v in [0x00, 0x01, 0x7f, 0x80, 0xff] {
            let mut c = b.clone();
            c[i] = v;
            let _ = GgufFile::parse(&c);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn random_flips_and_truncations_never_panic(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..8),
        cut in proptest::option::of(any::<prop::sample::Index>()),
        // Bias towards the header and records, where the structure is.
        header_only in any::<bool>(),
    ) {
        let (mut b, l) = base();
        let span = if header_only { l.data_start as usize } else { b.len() };
        for (i, x) in flips {
            b[i.index(span)] ^= x;
        }
        if let Some(c) = cut {
            b.truncate(c.index(b.len() + 1));
        }
        match GgufFile::parse(&b) {
            Ok(f) => {
                // Whatever parsed must be internally consistent.
                for t in &f.tensors {
                    prop_assert!(f.tensor_data(&b, t).is_some());
                    prop_assert_eq!(t.offset % f.alignment, 0);
                }
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}
