//! The reader against an independent writer: GGUF files written by llama.cpp's gguf-py
//! (`tools/reference/gguf_fixtures.py`, version in each manifest) must read back exactly
//! the values, tensor bytes and offsets the script recorded.

use std::path::{Path, PathBuf};

use lagoon_core::config::{AttnKind, MlpKind};
use lagoon_gguf::checkpoint::PartRecord;
use lagoon_gguf::gguf::{self, GgufError, GgufFile, GgufSet, Value, ValueType};
use lagoon_gguf::{Checkpoint, Error, Source};
use serde_json::{Value as Json, json};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf")
}

fn manifest(name: &str) -> Json {
    let text = std::fs::read_to_string(fixtures().join(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// gguf-py's `GGUFValueType` names.
fn py_name(t: ValueType) -> &'static str {
    match t {
        ValueType::U8 => "UINT8",
        ValueType::I8 => "INT8",
        ValueType::U16 => "UINT16",
        ValueType::I16 => "INT16",
        ValueType::U32 => "UINT32",
        ValueType::I32 => "INT32",
        ValueType::F32 => "FLOAT32",
        ValueType::Bool => "BOOL",
        ValueType::Str => "STRING",
        ValueType::Array => "ARRAY",
        ValueType::U64 => "UINT64",
        ValueType::I64 => "INT64",
        ValueType::F64 => "FLOAT64",
    }
}

/// A value in the manifest's encoding (floats as bit patterns).
fn encode(v: &Value) -> Json {
    let ty = py_name(v.ty());
    match v {
        Value::U8(x) => json!({"type": ty, "value": x}),
        Value::I8(x) => json!({"type": ty, "value": x}),
        Value::U16(x) => json!({"type": ty, "value": x}),
        Value::I16(x) => json!({"type": ty, "value": x}),
        Value::U32(x) => json!({"type": ty, "value": x}),
        Value::I32(x) => json!({"type": ty, "value": x}),
        Value::U64(x) => json!({"type": ty, "value": x}),
        Value::I64(x) => json!({"type": ty, "value": x}),
        Value::Bool(x) => json!({"type": ty, "value": x}),
        Value::Str(x) => json!({"type": ty, "value": x}),
        Value::F32(x) => json!({"type": ty, "bits": x.to_bits()}),
        Value::F64(x) => json!({"type": ty, "bits": x.to_bits()}),
        Value::Array(a) => {
            let items: Vec<Json> = (0..a.len()).map(|i| encode(&a.get(i).unwrap())).collect();
            json!({"type": ty, "elem": py_name(a.elem_type()), "items": items})
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn fnv1a64(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h = (h ^ u64::from(x)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[test]
fn all_types_reads_what_gguf_py_wrote() {
    let m = manifest("all_types.json");
    let bytes = std::fs::read(fixtures().join(m["file"].as_str().unwrap())).unwrap();
    let f = GgufFile::parse(&bytes).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, m["alignment"].as_u64().unwrap());
    assert_eq!(f.data_start % f.alignment, 0);

    let expected_kv = m["kv"].as_array().unwrap();
    assert_eq!(f.metadata.len(), expected_kv.len());
    for ((key, value), want) in f.metadata.iter().zip(expected_kv) {
        assert_eq!(key, want["key"].as_str().unwrap());
        let mut got = encode(value);
        got["key"] = json!(key);
        assert_eq!(&got, want, "key {key}");
    }
    // Spot checks that do not go through the manifest encoding.
    assert_eq!(f.get("test.u64"), Some(&Value::U64(u64::MAX)));
    assert_eq!(f.get("test.str_nul").and_then(Value::as_str), Some("a\0b"));
    let empty = f
        .get("test.arr.empty_str")
        .and_then(Value::as_array)
        .unwrap();
    assert_eq!((empty.len(), empty.elem_type()), (0, ValueType::Str));
    assert_eq!(
        f.get("test.arr.long_i32").unwrap().to_string(),
        "[100 × i32]"
    );
    assert_eq!(
        f.get("test.arr.nested_str").unwrap().to_string(),
        r#"[["a"], ["b", "c"]]"#
    );

    let expected_t = m["tensors"].as_array().unwrap();
    assert_eq!(f.tensors.len(), expected_t.len());
    for (t, want) in f.tensors.iter().zip(expected_t) {
        assert_eq!(t.name, want["name"].as_str().unwrap());
        assert_eq!(t.ty as u64, want["type"].as_u64().unwrap(), "{}", t.name);
        assert_eq!(json!(t.ne), want["ne"], "{}", t.name);
        let data = f.tensor_data(&bytes, t).unwrap();
        assert_eq!(hex(data), want["data_hex"].as_str().unwrap(), "{}", t.name);
        assert_eq!(
            f.tensor_range(t).start as u64,
            want["abs_offset"].as_u64().unwrap(),
            "{}",
            t.name
        );
        assert_eq!(t.offset % 64, 0);
    }
    // The same through the mapped-file path.
    let set = GgufSet::open(fixtures().join("all_types.gguf")).unwrap();
    // (Not `files[0] == f`: the metadata holds NaNs.)
    assert_eq!(set.files[0].tensors, f.tensors);
    assert_eq!(set.files[0].data_start, f.data_start);
    let (shard, t) = set.tensor("q.weight").unwrap();
    assert_eq!(set.tensor_data(shard, t), f.tensor_data(&bytes, t).unwrap());
}

#[test]
fn all_types_is_not_a_laguna_model() {
    let e = gguf::load_checkpoint(&fixtures().join("all_types.gguf")).unwrap_err();
    let Error::Gguf(e) = e else { panic!("{e:?}") };
    assert!(
        matches!(e.root(), GgufError::WrongArchitecture { got } if got == "test"),
        "{e:?}"
    );
    assert!(e.to_string().contains("all_types.gguf"), "{e}");
}

fn bits(j: &Json) -> u32 {
    j.as_u64().unwrap() as u32
}

#[test]
fn tiny_laguna_split_loads_from_either_shard() {
    let m = manifest("tiny_laguna.json");
    let files: Vec<&str> = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert_eq!(files.len(), 2);
    let first = gguf::load_checkpoint(&fixtures().join(files[0])).unwrap();
    let second = gguf::load_checkpoint(&fixtures().join(files[1])).unwrap();
    assert_eq!(first.0, second.0);

    let (config, source, maps, records) = first;
    let x = &m["expect_config"];
    let us = |k: &str| x[k].as_u64().unwrap() as usize;
    assert_eq!(config.vocab_size, us("vocab_size"));
    assert_eq!(config.hidden_size, us("hidden_size"));
    assert_eq!(config.n_layers, us("n_layers"));
    assert_eq!(json!(config.n_heads), x["n_heads"]);
    assert_eq!(config.n_kv_heads, us("n_kv_heads"));
    assert_eq!(config.head_dim, us("head_dim"));
    let lt: Vec<&str> = config
        .layer_types
        .iter()
        .map(|t| match t {
            AttnKind::Full => "full",
            AttnKind::Sliding => "sliding",
        })
        .collect();
    assert_eq!(json!(lt), x["layer_types"]);
    let mt: Vec<&str> = config
        .mlp_types
        .iter()
        .map(|t| match t {
            MlpKind::Dense => "dense",
            MlpKind::Sparse => "sparse",
        })
        .collect();
    assert_eq!(json!(mt), x["mlp_types"]);
    assert_eq!(config.sliding_window, us("sliding_window"));
    assert_eq!(config.dense_ffn, us("dense_ffn"));
    assert_eq!(config.n_experts, us("n_experts"));
    assert_eq!(config.n_experts_used, us("n_experts_used"));
    assert_eq!(config.expert_ffn, us("expert_ffn"));
    assert_eq!(config.shared_ffn, us("shared_ffn"));
    assert_eq!(
        config.routed_scaling.to_bits(),
        bits(&x["routed_scaling_bits"])
    );
    assert_eq!(
        config.norm_topk_prob,
        x["norm_topk_prob"].as_bool().unwrap()
    );
    assert_eq!(config.rms_eps.to_bits(), bits(&x["rms_eps_bits"]));
    let rf = &x["rope_full"];
    assert_eq!(config.rope_full.theta.to_bits(), bits(&rf["theta_bits"]));
    assert_eq!(
        config.rope_full.rotary_dim,
        rf["rotary_dim"].as_u64().unwrap() as usize
    );
    let y = config.rope_full.yarn.unwrap();
    let ry = &rf["yarn"];
    assert_eq!(y.factor.to_bits(), bits(&ry["factor_bits"]));
    assert_eq!(
        u64::from(y.original_context),
        ry["original_context"].as_u64().unwrap()
    );
    assert_eq!(y.beta_fast.to_bits(), bits(&ry["beta_fast_bits"]));
    assert_eq!(y.beta_slow.to_bits(), bits(&ry["beta_slow_bits"]));
    assert_eq!(
        y.attention_factor.to_bits(),
        bits(&ry["attention_factor_bits"])
    );
    let rs = &x["rope_sliding"];
    assert_eq!(config.rope_sliding.theta.to_bits(), bits(&rs["theta_bits"]));
    assert_eq!(
        config.rope_sliding.rotary_dim,
        rs["rotary_dim"].as_u64().unwrap() as usize
    );
    assert!(config.rope_sliding.yarn.is_none());
    assert_eq!(config.max_position, us("max_position"));
    assert_eq!(config.bos_token.map(u64::from), x["bos_token"].as_u64());
    assert_eq!(json!(config.eos_tokens), x["eos_tokens"]);
    config.validate().unwrap();

    // Source: both shard paths, metadata from shard 0 only.
    let Source::Gguf {
        files: paths,
        metadata,
    } = &source
    else {
        panic!("not a GGUF source")
    };
    assert_eq!(paths.len(), 2);
    assert!(paths[0].ends_with(files[0]) && paths[1].ends_with(files[1]));
    assert!(metadata.iter().any(|(k, _)| k == "laguna.block_count"));
    assert_eq!(maps.len(), 2);

    let expected_t = m["tensors"].as_array().unwrap();
    assert_eq!(records.len(), expected_t.len());
    for (r, want) in records.iter().zip(expected_t) {
        let name = want["name"].as_str().unwrap();
        assert_eq!(r.name, name);
        assert_eq!(r.source_name, name);
        assert_eq!(json!(r.shape), want["shape"], "{name}");
        let ne: Vec<u64> = want["ne"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(r.cols as u64, ne[0], "{name}");
        assert_eq!(r.rows as u64, ne.get(1).copied().unwrap_or(1), "{name}");
        let n_parts = ne.get(2).copied().unwrap_or(1) as usize;
        assert_eq!(r.parts.len(), n_parts, "{name}");
        let shard = want["shard"].as_u64().unwrap() as u32;
        let mut all = Vec::new();
        let mut next_start = want["abs_offset"].as_u64().unwrap() as usize;
        for p in &r.parts {
            let PartRecord::Ggml { ty, span } = p else {
                panic!("{name}: not a ggml part")
            };
            assert_eq!(*ty as u64, want["type"].as_u64().unwrap(), "{name}");
            assert_eq!(span.file, shard, "{name}");
            // Parts tile the tensor: expert e at e·nb[2].
            assert_eq!(span.start, next_start, "{name}");
            next_start += span.len;
            all.extend_from_slice(&maps[span.file as usize][span.start..span.start + span.len]);
        }
        assert_eq!(
            all.len() as u64,
            want["n_bytes"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(fnv1a64(&all), want["fnv1a64"].as_u64().unwrap(), "{name}");
    }
}

#[test]
fn tiny_laguna_opens_as_a_checkpoint() {
    let ckpt = Checkpoint::open(fixtures().join("tiny_laguna-00001-of-00002.gguf")).unwrap();
    let t = ckpt.tensor("blk.1.ffn_down_exps.weight").unwrap();
    // ne [I, H, E] = [4, 8, 4] → 4 experts of 8 rows × 4 columns.
    assert_eq!(t.shape, &[4, 8, 4]);
    assert_eq!(t.parts.len(), 4);
    assert_eq!((t.parts[0].rows, t.parts[0].cols), (8, 4));
    let norm = ckpt.tensor("output_norm.weight").unwrap();
    assert_eq!((norm.parts[0].rows, norm.parts[0].cols), (1, 8));
}

/// A fresh directory under the system temp dir.
fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lagoon-gguf-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn missing_shard_is_named() {
    let d = temp_dir("missing-shard");
    let first = d.join("tiny_laguna-00001-of-00002.gguf");
    std::fs::copy(fixtures().join("tiny_laguna-00001-of-00002.gguf"), &first).unwrap();
    let e = gguf::load_checkpoint(&first).unwrap_err();
    match e {
        Error::Gguf(GgufError::MissingShard { path, shard, count }) => {
            assert_eq!((shard, count), (1, 2));
            assert_eq!(path, d.join("tiny_laguna-00002-of-00002.gguf"));
            let msg = GgufError::MissingShard { path, shard, count }.to_string();
            assert!(msg.contains("tiny_laguna-00002-of-00002.gguf"), "{msg}");
        }
        e => panic!("{e:?}"),
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn renamed_shard_cannot_find_its_set() {
    let d = temp_dir("renamed-shard");
    let p = d.join("model.gguf");
    std::fs::copy(fixtures().join("tiny_laguna-00001-of-00002.gguf"), &p).unwrap();
    let e = gguf::load_checkpoint(&p).unwrap_err();
    assert!(
        matches!(e, Error::Gguf(GgufError::SplitName { count: 2, .. })),
        "{e:?}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn shards_from_different_sets_are_rejected() {
    // Shard 2 replaced by a copy of shard 1: its split.no says 0.
    let d = temp_dir("mixed-shards");
    let src = fixtures().join("tiny_laguna-00001-of-00002.gguf");
    std::fs::copy(&src, d.join("m-00001-of-00002.gguf")).unwrap();
    std::fs::copy(&src, d.join("m-00002-of-00002.gguf")).unwrap();
    let e = gguf::load_checkpoint(&d.join("m-00001-of-00002.gguf")).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Gguf(GgufError::SplitMismatch {
                key: "split.no",
                expected: 1,
                got: Some(0),
                ..
            })
        ),
        "{e:?}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn missing_file_is_an_io_error() {
    let e = gguf::load_checkpoint(&fixtures().join("no-such-file.gguf")).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
}

#[test]
fn empty_and_foreign_files_are_typed_errors() {
    let d = temp_dir("empty-file");
    let empty = d.join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let e = gguf::load_checkpoint(&empty).unwrap_err();
    let Error::Gguf(e) = e else { panic!("{e:?}") };
    assert!(matches!(e.root(), GgufError::Truncated { .. }), "{e:?}");
    let json = d.join("config.json");
    std::fs::write(&json, b"{\"model_type\": \"laguna\"}").unwrap();
    let e = gguf::load_checkpoint(&json).unwrap_err();
    let Error::Gguf(e) = e else { panic!("{e:?}") };
    assert!(matches!(e.root(), GgufError::BadMagic { .. }), "{e:?}");
    let _ = std::fs::remove_dir_all(&d);
}
