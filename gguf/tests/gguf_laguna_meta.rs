//! `laguna.*` metadata → ModelConfig (spec/laguna.md §8.1): every rule and default, and
//! a typed error for every key the config cannot use. Metadata goes through the writer
//! and the reader, as it would from a file.

use lagoon_core::config::{AttnKind, MlpKind};
use lagoon_gguf::gguf::{Array, GgufError, GgufFile, GgufWriter, Value, laguna_config};

use AttnKind::{Full as F, Sliding as S};

/// Laguna XS 2.1-shaped metadata (spec §1.1, §8.1), with 8 layers to keep it short.
fn xs() -> Vec<(String, Value)> {
    let l = 8;
    let heads: Vec<u32> = (0..l).map(|i| if i % 4 == 0 { 48 } else { 64 }).collect();
    let kv: Vec<(&str, Value)> = vec![
        ("general.architecture", "laguna".into()),
        ("laguna.vocab_size", 100352u32.into()),
        ("laguna.context_length", 262144u32.into()),
        ("laguna.embedding_length", 2048u32.into()),
        ("laguna.block_count", (l as u32).into()),
        ("laguna.feed_forward_length", 8192u32.into()),
        ("laguna.attention.head_count", heads.into()),
        ("laguna.attention.head_count_kv", 8u32.into()),
        ("laguna.attention.key_length", 128u32.into()),
        ("laguna.attention.value_length", 128u32.into()),
        ("laguna.attention.layer_norm_rms_epsilon", 1e-6f32.into()),
        ("laguna.attention.sliding_window", 512u32.into()),
        ("laguna.rope.dimension_count", 64u32.into()),
        ("laguna.rope.dimension_count_swa", 128u32.into()),
        ("laguna.rope.freq_base", 500000f32.into()),
        ("laguna.rope.freq_base_swa", 10000f32.into()),
        ("laguna.rope.scaling.type", "yarn".into()),
        ("laguna.rope.scaling.factor", 32f32.into()),
        (
            "laguna.rope.scaling.original_context_length",
            8192u32.into(),
        ),
        ("laguna.rope.scaling.yarn_beta_fast", 64f32.into()),
        ("laguna.rope.scaling.yarn_beta_slow", 1f32.into()),
        (
            "laguna.rope.scaling.yarn_attn_factor",
            (1.3465735902799727f64 as f32).into(),
        ),
        ("laguna.expert_count", 256u32.into()),
        ("laguna.expert_used_count", 8u32.into()),
        ("laguna.expert_feed_forward_length", 512u32.into()),
        ("laguna.expert_shared_feed_forward_length", 512u32.into()),
        ("laguna.expert_weights_norm", true.into()),
        ("laguna.expert_weights_scale", 2.5f32.into()),
        ("laguna.expert_gating_func", 2u32.into()),
        ("laguna.leading_dense_block_count", 1u32.into()),
        ("tokenizer.ggml.model", "gpt2".into()),
        ("tokenizer.ggml.bos_token_id", 2u32.into()),
        ("tokenizer.ggml.eos_token_id", 2u32.into()),
        ("tokenizer.ggml.eot_token_id", 24u32.into()),
        ("tokenizer.ggml.padding_token_id", 9u32.into()),
    ];
    kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

fn set(mut m: Vec<(String, Value)>, key: &str, v: impl Into<Value>) -> Vec<(String, Value)> {
    let v = v.into();
    match m.iter_mut().find(|(k, _)| k == key) {
        Some(e) => e.1 = v,
        None => m.push((key.to_string(), v)),
    }
    m
}

fn del(mut m: Vec<(String, Value)>, key: &str) -> Vec<(String, Value)> {
    let n = m.len();
    m.retain(|(k, _)| k != key);
    assert_eq!(m.len() + 1, n, "{key} was not there");
    m
}

/// Through a real file: write, parse, convert.
fn config(m: &[(String, Value)]) -> Result<lagoon_core::config::ModelConfig, GgufError> {
    let mut w = GgufWriter::new();
    for (k, v) in m {
        w.add(k, v.clone()).unwrap();
    }
    let f = GgufFile::parse(&w.to_bytes()).unwrap();
    laguna_config(&f.metadata)
}

fn err(m: &[(String, Value)]) -> GgufError {
    config(m).unwrap_err()
}

#[test]
fn xs_metadata_gives_the_xs_config() {
    let c = config(&xs()).unwrap();
    c.validate().unwrap();
    assert_eq!(
        (
            c.vocab_size,
            c.hidden_size,
            c.n_layers,
            c.n_kv_heads,
            c.head_dim
        ),
        (100352, 2048, 8, 8, 128)
    );
    assert_eq!(c.n_heads, vec![48, 64, 64, 64, 48, 64, 64, 64]);
    assert_eq!(c.layer_types, vec![F, S, S, S, F, S, S, S]);
    assert_eq!(c.mlp_types[0], MlpKind::Dense);
    assert!(c.mlp_types[1..].iter().all(|&t| t == MlpKind::Sparse));
    assert_eq!(c.sliding_window, 512);
    assert_eq!(
        (
            c.dense_ffn,
            c.n_experts,
            c.n_experts_used,
            c.expert_ffn,
            c.shared_ffn
        ),
        (8192, 256, 8, 512, 512)
    );
    assert_eq!(
        (c.routed_scaling, c.norm_topk_prob, c.rms_eps),
        (2.5, true, 1e-6)
    );
    assert_eq!((c.rope_full.theta, c.rope_full.rotary_dim), (500000.0, 64));
    let y = c.rope_full.yarn.unwrap();
    assert_eq!(
        (y.factor, y.original_context, y.beta_fast, y.beta_slow),
        (32.0, 8192, 64.0, 1.0)
    );
    assert_eq!(y.attention_factor, 1.3465735902799727f64 as f32);
    assert_eq!(
        (
            c.rope_sliding.theta,
            c.rope_sliding.rotary_dim,
            c.rope_sliding.yarn
        ),
        (10000.0, 128, None)
    );
    assert_eq!(c.max_position, 262144);
    assert_eq!(c.bos_token, Some(2));
    assert_eq!(c.eos_tokens, vec![2, 24]);
}

#[test]
fn yarn_defaults() {
    let m = del(xs(), "laguna.rope.scaling.yarn_attn_factor");
    let m = del(m, "laguna.rope.scaling.yarn_beta_fast");
    let m = del(m, "laguna.rope.scaling.yarn_beta_slow");
    let m = del(m, "laguna.rope.scaling.original_context_length");
    let m = set(m, "laguna.rope.scaling.factor", 128f32);
    let y = config(&m).unwrap().rope_full.yarn.unwrap();
    // HF's default mscale 0.1·ln(128) + 1 (S 2.1's attention_factor).
    assert_eq!(y.attention_factor, 1.4852030263919618f64 as f32);
    assert_eq!((y.beta_fast, y.beta_slow), (32.0, 1.0));
    assert_eq!(y.original_context, 262144, "defaults to context_length");
    // An f64 factor and a u64 context are read as well.
    let m = set(xs(), "laguna.rope.scaling.factor", 64f64);
    let m = set(m, "laguna.rope.scaling.original_context_length", 4096u64);
    let y = config(&m).unwrap().rope_full.yarn.unwrap();
    assert_eq!((y.factor, y.original_context), (64.0, 4096));
}

#[test]
fn rope_scaling_types() {
    let m = del(xs(), "laguna.rope.scaling.type");
    let e = err(&m);
    assert!(
        matches!(&e, GgufError::BadKeyValue { key, .. } if key == "laguna.rope.scaling.factor"),
        "{e:?}"
    );
    let m = del(m, "laguna.rope.scaling.factor");
    assert_eq!(config(&m).unwrap().rope_full.yarn, None);
    let m = set(xs(), "laguna.rope.scaling.type", "none");
    assert_eq!(config(&m).unwrap().rope_full.yarn, None);
    let m = set(xs(), "laguna.rope.scaling.type", "linear");
    assert!(matches!(err(&m), GgufError::BadKeyValue { .. }));
    let m = set(xs(), "laguna.rope.scaling.type", "longrope");
    assert!(matches!(err(&m), GgufError::BadKeyValue { .. }));
    let m = set(xs(), "laguna.rope.scaling.type", 1u32);
    assert!(matches!(err(&m), GgufError::WrongKeyType { .. }));
}

#[test]
fn rope_defaults_follow_llama_cpp() {
    let m = del(xs(), "laguna.rope.freq_base_swa");
    let m = del(m, "laguna.rope.dimension_count_swa");
    let c = config(&m).unwrap();
    assert_eq!(
        (c.rope_sliding.theta, c.rope_sliding.rotary_dim),
        (500000.0, 64)
    );
    let m = del(m, "laguna.rope.freq_base");
    let m = del(m, "laguna.rope.dimension_count");
    let c = config(&m).unwrap();
    assert_eq!((c.rope_full.theta, c.rope_full.rotary_dim), (10000.0, 128));
    assert_eq!(
        (c.rope_sliding.theta, c.rope_sliding.rotary_dim),
        (10000.0, 128)
    );
}

#[test]
fn sliding_window_pattern_forms() {
    // Per-layer bool array, true = sliding.
    let pat = vec![false, true, false, true, true, true, true, false];
    let m = set(xs(), "laguna.attention.sliding_window_pattern", pat);
    assert_eq!(
        config(&m).unwrap().layer_types,
        vec![F, S, F, S, S, S, S, F]
    );
    // A period: full at l % p == 0.
    let m = set(xs(), "laguna.attention.sliding_window_pattern", 2u32);
    assert_eq!(
        config(&m).unwrap().layer_types,
        vec![F, S, F, S, F, S, F, S]
    );
    let m = set(xs(), "laguna.attention.sliding_window_pattern", 1i32);
    assert_eq!(config(&m).unwrap().layer_types, vec![F; 8]);
    assert_eq!(config(&m).unwrap().sliding_window, 0, "no layer slides");
    // Period 0: every layer slides (llama.cpp set_swa_pattern).
    let m = set(xs(), "laguna.attention.sliding_window_pattern", 0u32);
    assert_eq!(config(&m).unwrap().layer_types, vec![S; 8]);
    // Wrong length and wrong type.
    let m = set(
        xs(),
        "laguna.attention.sliding_window_pattern",
        vec![true; 3],
    );
    assert!(matches!(err(&m), GgufError::BadKeyValue { .. }));
    let m = set(
        xs(),
        "laguna.attention.sliding_window_pattern",
        vec![1u8; 8],
    );
    assert!(matches!(err(&m), GgufError::WrongKeyType { .. }));
}

#[test]
fn no_sliding_window_key_means_no_sliding_layers() {
    let m = del(xs(), "laguna.attention.sliding_window");
    let c = config(&m).unwrap();
    assert_eq!((c.layer_types, c.sliding_window), (vec![F; 8], 0));
    // Even with a pattern present (M.1-style files must not slide).
    let m = set(m, "laguna.attention.sliding_window_pattern", vec![true; 8]);
    assert_eq!(config(&m).unwrap().layer_types, vec![F; 8]);
    // A zero window is the same as none.
    let m = set(xs(), "laguna.attention.sliding_window", 0u32);
    assert_eq!(config(&m).unwrap().layer_types, vec![F; 8]);
}

#[test]
fn head_counts() {
    let m = set(xs(), "laguna.attention.head_count", 64i32);
    assert_eq!(config(&m).unwrap().n_heads, vec![64; 8]);
    let m = set(xs(), "laguna.attention.head_count", vec![48u64; 8]);
    assert_eq!(config(&m).unwrap().n_heads, vec![48; 8]);
    let m = set(xs(), "laguna.attention.head_count", vec![48u32; 7]);
    assert!(matches!(err(&m), GgufError::BadKeyValue { .. }));
    let m = set(xs(), "laguna.attention.head_count", vec![-48i32; 8]);
    assert!(matches!(err(&m), GgufError::WrongKeyType { .. }));
    let m = set(xs(), "laguna.attention.head_count", "48");
    assert!(matches!(err(&m), GgufError::WrongKeyType { .. }));
    let e = err(&del(xs(), "laguna.attention.head_count"));
    assert!(
        matches!(&e, GgufError::MissingKey { key } if key == "laguna.attention.head_count"),
        "{e:?}"
    );
    // KV heads: uniform array accepted, mixed rejected, absent = n_head when uniform.
    let m = set(xs(), "laguna.attention.head_count_kv", vec![8u32; 8]);
    assert_eq!(config(&m).unwrap().n_kv_heads, 8);
    let mut kv = vec![8u32; 8];
    kv[3] = 4;
    let m = set(xs(), "laguna.attention.head_count_kv", kv);
    assert!(matches!(err(&m), GgufError::BadKeyValue { .. }));
    let m = del(xs(), "laguna.attention.head_count_kv");
    assert!(matches!(err(&m), GgufError::MissingKey { .. }));
    let m = set(m, "laguna.attention.head_count", 16u32);
    assert_eq!(config(&m).unwrap().n_kv_heads, 16);
}

#[test]
fn head_dim_default_and_mismatch() {
    let m = del(xs(), "laguna.attention.key_length");
    let m = del(m, "laguna.attention.value_length");
    let m = set(m, "laguna.attention.head_count", 16u32);
    assert_eq!(config(&m).unwrap().head_dim, 2048 / 16);
    let m = set(xs(), "laguna.attention.value_length", 64u32);
    assert!(matches!(err(&m), GgufError::BadKeyValue { .. }));
}

#[test]
fn mlp_layout() {
    let m = set(xs(), "laguna.leading_dense_block_count", 3u32);
    let c = config(&m).unwrap();
    assert_eq!(
        &c.mlp_types[..4],
        &[
            MlpKind::Dense,
            MlpKind::Dense,
            MlpKind::Dense,
            MlpKind::Sparse
        ]
    );
    let m = set(xs(), "laguna.leading_dense_block_count", 9u32);
    assert!(matches!(err(&m), GgufError::BadKeyValue { .. }));
    let m = del(xs(), "laguna.leading_dense_block_count");
    assert!(matches!(err(&m), GgufError::MissingKey { .. }));
    // No experts at all: every layer dense.
    let m = del(
        del(m, "laguna.expert_count"),
        "laguna.expert_feed_forward_length",
    );
    assert_eq!(config(&m).unwrap().mlp_types, vec![MlpKind::Dense; 8]);
    // Per-layer widths: dense layers read feed_forward_length, sparse layers
    // expert_feed_forward_length; entries of the other kind are ignored.
    let mut ff = vec![0u32; 8];
    ff[0] = 8192;
    let mut eff = vec![512u32; 8];
    eff[0] = 0;
    let m = set(xs(), "laguna.feed_forward_length", ff);
    let m = set(m, "laguna.expert_feed_forward_length", eff.clone());
    let c = config(&m).unwrap();
    assert_eq!((c.dense_ffn, c.expert_ffn), (8192, 512));
    eff[5] = 256;
    let m = set(xs(), "laguna.expert_feed_forward_length", eff);
    assert!(matches!(err(&m), GgufError::BadKeyValue { .. }));
    let m = del(xs(), "laguna.feed_forward_length");
    assert!(matches!(err(&m), GgufError::MissingKey { .. }));
}

#[test]
fn shared_expert_and_router_keys() {
    let m = del(xs(), "laguna.expert_shared_feed_forward_length");
    assert_eq!(config(&m).unwrap().shared_ffn, 512, "routed width × 1");
    let m = set(xs(), "laguna.expert_shared_count", 0u32);
    assert_eq!(config(&m).unwrap().shared_ffn, 0);
    let m = set(xs(), "laguna.expert_gating_func", 1u32);
    assert!(matches!(err(&m), GgufError::BadKeyValue { .. }));
    let m = set(xs(), "laguna.expert_gating_func", 0u32);
    assert!(config(&m).is_ok());
    let m = del(
        del(xs(), "laguna.expert_weights_scale"),
        "laguna.expert_weights_norm",
    );
    let c = config(&m).unwrap();
    assert_eq!((c.routed_scaling, c.norm_topk_prob), (1.0, false));
    let m = set(xs(), "laguna.expert_weights_norm", 1u8);
    assert!(matches!(err(&m), GgufError::WrongKeyType { .. }));
}

#[test]
fn vocab_and_tokens() {
    let m = del(xs(), "laguna.vocab_size");
    assert!(matches!(err(&m), GgufError::MissingKey { .. }));
    let toks: Vec<String> = (0..1000).map(|i| format!("t{i}")).collect();
    let m = set(m, "tokenizer.ggml.tokens", Value::Array(Array::Str(toks)));
    assert_eq!(config(&m).unwrap().vocab_size, 1000);
    let m = set(xs(), "tokenizer.ggml.eot_token_id", 2u32);
    assert_eq!(config(&m).unwrap().eos_tokens, vec![2]);
    let m = del(
        del(xs(), "tokenizer.ggml.eot_token_id"),
        "tokenizer.ggml.bos_token_id",
    );
    let c = config(&m).unwrap();
    assert_eq!((c.bos_token, c.eos_tokens), (None, vec![2]));
    let m = set(xs(), "tokenizer.ggml.bos_token_id", u64::from(u32::MAX) + 1);
    assert!(matches!(err(&m), GgufError::BadKeyValue { .. }));
}

#[test]
fn architecture_and_required_keys() {
    let m = set(xs(), "general.architecture", "llama");
    assert!(matches!(err(&m), GgufError::WrongArchitecture { got } if got == "llama"));
    assert!(matches!(
        err(&del(xs(), "general.architecture")),
        GgufError::MissingKey { .. }
    ));
    for key in [
        "laguna.block_count",
        "laguna.embedding_length",
        "laguna.context_length",
        "laguna.attention.layer_norm_rms_epsilon",
        "laguna.expert_feed_forward_length",
    ] {
        let e = err(&del(xs(), key));
        assert!(
            matches!(&e, GgufError::MissingKey { key: k } if k == key),
            "{key}: {e:?}"
        );
        assert!(e.to_string().contains(key));
    }
    let m = set(xs(), "laguna.embedding_length", -1i32);
    assert!(matches!(err(&m), GgufError::WrongKeyType { .. }));
    let m = set(xs(), "laguna.attention.layer_norm_rms_epsilon", "1e-6");
    assert!(matches!(err(&m), GgufError::WrongKeyType { .. }));
}

#[test]
fn absurd_block_count_is_an_error_not_an_allocation() {
    let m = set(xs(), "laguna.block_count", 1u64 << 40);
    let m = set(m, "laguna.attention.head_count", 48u32);
    let e = err(&m);
    assert!(
        matches!(&e, GgufError::BadKeyValue { key, .. } if key == "laguna.block_count"),
        "{e:?}"
    );
}
