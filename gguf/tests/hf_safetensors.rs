//! safetensors containers and shard indexes: every malformed input is a typed error naming
//! the file and tensor, never a panic.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use lagoon_gguf::Error;
use lagoon_gguf::hf::safetensors::{Dtype, MAX_HEADER_BYTES, parse, serialize};
use lagoon_gguf::hf::{self, HfError};
use serde_json::json;

/// A fresh empty directory under the system temp dir.
fn tempdir(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "lagoon-hf-st-{}-{tag}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A raw file: header length, header text, data.
fn raw(header: &str, data_len: usize) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend(std::iter::repeat_n(0x3c, data_len));
    v
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn round_trips_the_writer() {
    let a = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = vec![1u8, 2, 3];
    let f = serialize(
        &[("a", Dtype::F32, &[2, 3], &a), ("b", Dtype::U8, &[3], &b)],
        &[("format", "pt")],
    );
    // The reference writer pads the header so the data starts 8-byte aligned.
    let n = u64::from_le_bytes(f[..8].try_into().unwrap());
    assert_eq!(n % 8, 0);
    let h = parse("f", &f).unwrap();
    assert_eq!(h.metadata, vec![("format".into(), "pt".into())]);
    let t = &h.tensors[0];
    assert_eq!(
        (t.name.as_str(), t.dtype, &t.shape[..]),
        ("a", Dtype::F32, &[2, 3][..])
    );
    assert_eq!(&f[t.start..t.start + t.len], &a[..]);
    assert_eq!(&f[h.tensors[1].start..][..3], &b[..]);
}

#[test]
fn header_longer_than_the_limit() {
    let mut f = (MAX_HEADER_BYTES + 1).to_le_bytes().to_vec();
    f.extend_from_slice(b"{}");
    let e = parse("big.safetensors", &f).unwrap_err();
    assert!(
        matches!(&e, HfError::HeaderTooLarge { file, header_len, .. } if file == "big.safetensors" && *header_len == MAX_HEADER_BYTES + 1),
        "{e:?}"
    );
    assert!(e.to_string().contains("big.safetensors"));
}

#[test]
fn header_longer_than_the_file() {
    let mut f = 64u64.to_le_bytes().to_vec();
    f.extend_from_slice(b"{}");
    let e = parse("t", &f).unwrap_err();
    assert!(
        matches!(
            e,
            HfError::HeaderOutOfFile {
                header_len: 64,
                file_len: 10,
                ..
            }
        ),
        "{e:?}"
    );
    let e = parse("t", &[1, 2, 3]).unwrap_err();
    assert!(matches!(e, HfError::FileTooShort { len: 3, .. }), "{e:?}");
}

#[test]
fn bad_json_and_bad_entries() {
    for h in ["{\"a\": ", "[1, 2]", "   {}", "{\"a\": 1}x"] {
        let e = parse("t", &raw(h, 0)).unwrap_err();
        assert!(matches!(&e, HfError::BadJson { .. }), "{h}: {e:?}");
    }
    let cases = [
        r#"{"a":{"shape":[1],"data_offsets":[0,4]}}"#,
        r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
        r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#,
        r#"{"a":"x"}"#,
        r#"{"__metadata__":{"k":1}}"#,
    ];
    for h in cases {
        let e = parse("t", &raw(h, 4)).unwrap_err();
        assert!(matches!(&e, HfError::BadTensorEntry { .. }), "{h}: {e:?}");
    }
    let e = parse(
        "t",
        &raw(
            r#"{"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,1]}}"#,
            1,
        ),
    )
    .unwrap_err();
    assert!(
        matches!(&e, HfError::UnknownDtype { tensor, dtype, .. } if tensor == "a" && dtype == "Q4"),
        "{e:?}"
    );
}

#[test]
fn offsets_out_of_range() {
    let h = r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    let e = parse("t", &raw(h, 12)).unwrap_err();
    assert!(
        matches!(&e, HfError::OffsetsOutOfRange { tensor, begin: 0, end: 16, data_len: 12, .. } if tensor == "w"),
        "{e:?}"
    );
    let h = r#"{"w":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}}"#;
    assert!(matches!(
        parse("t", &raw(h, 8)).unwrap_err(),
        HfError::OffsetsOutOfRange { .. }
    ));
}

#[test]
fn size_must_match_shape_and_dtype() {
    let h = r#"{"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}}"#;
    let e = parse("t", &raw(h, 8)).unwrap_err();
    assert!(
        matches!(&e, HfError::SizeMismatch { tensor, expected: 12, got: 8, .. } if tensor == "w"),
        "{e:?}"
    );
    // Overflowing shapes are a size mismatch too, not a panic.
    let h = r#"{"w":{"dtype":"F64","shape":[18446744073709551615, 4],"data_offsets":[0,8]}}"#;
    assert!(matches!(
        parse("t", &raw(h, 8)).unwrap_err(),
        HfError::SizeMismatch { .. }
    ));
}

#[test]
fn overlapping_tensors() {
    let h = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let e = parse("t", &raw(h, 12)).unwrap_err();
    assert!(
        matches!(&e, HfError::Overlap { tensor, other, .. } if tensor == "b" && other == "a"),
        "{e:?}"
    );
}

#[test]
fn sharded_directory_with_index() {
    let d = tempdir("shards");
    let a = f32s(&[1.0; 4]);
    let b = f32s(&[2.0; 2]);
    std::fs::write(
        d.join("model-00001-of-00002.safetensors"),
        serialize(&[("x.weight", Dtype::F32, &[2, 2], &a)], &[]),
    )
    .unwrap();
    std::fs::write(
        d.join("model-00002-of-00002.safetensors"),
        serialize(&[("y.bias", Dtype::F32, &[2], &b)], &[]),
    )
    .unwrap();
    let index = json!({"metadata": {"total_size": 24}, "weight_map": {
        "x.weight": "model-00001-of-00002.safetensors",
        "y.bias": "model-00002-of-00002.safetensors"}});
    std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let t = hf::open_tensors(&d, &json!({}), None).unwrap();
    assert_eq!(t.files.len(), 2);
    let x = t.record("x.weight").unwrap();
    assert_eq!((x.rows, x.cols), (2, 2));
    let y = t.record("y.bias").unwrap();
    assert_eq!((y.rows, y.cols, y.shape.clone()), (1, 2, vec![2]));
    let mut row = [0f32; 2];
    t.parts(y)[0].dequant_row(0, &mut row);
    assert_eq!(row, [2.0, 2.0]);

    // The index names a shard that is absent.
    let index = json!({"weight_map": {"x.weight": "model-00001-of-00002.safetensors",
        "z": "model-00003-of-00003.safetensors"}});
    std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let e = hf::open_tensors(&d, &json!({}), None).unwrap_err();
    assert!(
        matches!(&e, Error::Hf(HfError::MissingShard { shard, .. }) if shard == "model-00003-of-00003.safetensors"),
        "{e:?}"
    );
    assert!(e.to_string().contains("model-00003-of-00003.safetensors"));

    // The index puts a tensor in the wrong shard.
    let index = json!({"weight_map": {"x.weight": "model-00002-of-00002.safetensors",
        "y.bias": "model-00002-of-00002.safetensors"}});
    std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let e = hf::open_tensors(&d, &json!({}), None).unwrap_err();
    assert!(
        matches!(&e, Error::Hf(HfError::ShardMismatch { tensor, .. }) if tensor == "x.weight"),
        "{e:?}"
    );

    // Two shards hold the same tensor.
    std::fs::write(
        d.join("model-00002-of-00002.safetensors"),
        serialize(&[("x.weight", Dtype::F32, &[2, 2], &a)], &[]),
    )
    .unwrap();
    let index = json!({"weight_map": {"x.weight": "model-00001-of-00002.safetensors",
        "y.bias": "model-00002-of-00002.safetensors"}});
    std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let e = hf::open_tensors(&d, &json!({}), None).unwrap_err();
    assert!(
        matches!(&e, Error::Hf(HfError::DuplicateTensor { .. })),
        "{e:?}"
    );

    // A shard path that leaves the directory.
    let index = json!({"weight_map": {"x.weight": "../model.safetensors"}});
    std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let e = hf::open_tensors(&d, &json!({}), None).unwrap_err();
    assert!(matches!(&e, Error::Hf(HfError::BadJson { .. })), "{e:?}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn directory_without_weights_or_config() {
    let d = tempdir("empty");
    let e = hf::open_tensors(&d, &json!({}), None).unwrap_err();
    assert!(matches!(e, Error::Hf(HfError::NoWeights { .. })), "{e:?}");
    let e = lagoon_gguf::Checkpoint::open(&d).unwrap_err();
    assert!(matches!(e, Error::Hf(HfError::NoConfig { .. })), "{e:?}");
    std::fs::write(d.join("config.json"), "{not json").unwrap();
    let e = lagoon_gguf::Checkpoint::open(&d).unwrap_err();
    assert!(matches!(e, Error::Hf(HfError::BadJson { .. })), "{e:?}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn truncated_file_in_a_directory() {
    let d = tempdir("trunc");
    let mut f = serialize(&[("x.weight", Dtype::F32, &[4], &f32s(&[1.0; 4]))], &[]);
    f.truncate(f.len() - 3);
    std::fs::write(d.join("model.safetensors"), f).unwrap();
    let e = hf::open_tensors(&d, &json!({}), None).unwrap_err();
    assert!(
        matches!(&e, Error::Hf(HfError::OffsetsOutOfRange { file, tensor, .. }) if file == "model.safetensors" && tensor == "x.weight"),
        "{e:?}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// Arbitrary bytes never panic the header parser.
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn random_bytes_do_not_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse("f", &bytes);
        }

        #[test]
        fn random_headers_do_not_panic(
            dtype in prop::sample::select(vec!["F32", "BF16", "I64", "F4", "U8", "??"]),
            shape in proptest::collection::vec(0usize..1000, 0..3),
            b in 0u64..64, e in 0u64..64, data in 0usize..64,
        ) {
            let h = json!({"t": {"dtype": dtype, "shape": shape, "data_offsets": [b, e]}}).to_string();
            let _ = parse("f", &raw(&h, data));
        }
    }
}
