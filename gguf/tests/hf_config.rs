//! config.json → ModelConfig: both Laguna schemas, transformers 5.23 defaults, rejections.

use lagoon_core::config::{AttnKind, MlpKind, Rope, Yarn};
use lagoon_gguf::hf::config::parse;
use lagoon_gguf::hf::{self, HfError};
use serde_json::{Value, json};

const F: AttnKind = AttnKind::Full;
const S: AttnKind = AttnKind::Sliding;
const D: MlpKind = MlpKind::Dense;
const M: MlpKind = MlpKind::Sparse;

/// A small valid config; `patch` overrides keys (null removes one).
fn cfg(patch: Value) -> Value {
    let mut v = json!({
        "architectures": ["LagunaForCausalLM"],
        "model_type": "laguna",
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 8,
    });
    for (k, x) in patch.as_object().unwrap() {
        if x.is_null() {
            v.as_object_mut().unwrap().remove(k);
        } else {
            v[k] = x.clone();
        }
    }
    v
}

fn err(patch: Value) -> HfError {
    parse(&cfg(patch)).unwrap_err()
}

#[test]
fn transformers_written_config() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/tiny_laguna");
    let c = parse(&hf::read_config(&dir).unwrap()).unwrap().model;
    c.validate().unwrap();
    assert_eq!(c.n_layers, 3);
    assert_eq!(c.n_heads, vec![4, 6, 4]);
    assert_eq!(
        (c.n_kv_heads, c.head_dim, c.hidden_size, c.vocab_size),
        (2, 8, 32, 48)
    );
    assert_eq!(c.layer_types, vec![F, S, F]);
    assert_eq!(c.mlp_types, vec![D, M, M]);
    assert_eq!(c.sliding_window, 16);
    assert_eq!((c.dense_ffn, c.expert_ffn, c.shared_ffn), (48, 16, 8));
    assert_eq!((c.n_experts, c.n_experts_used), (4, 2));
    assert_eq!(c.routed_scaling, 2.5);
    assert_eq!(c.rms_eps, 1e-6);
    assert_eq!(c.max_position, 4096);
    assert_eq!((c.bos_token, c.eos_tokens.clone()), (Some(2), vec![2, 24]));
    assert_eq!(
        c.rope_full,
        Rope {
            theta: 500000.0,
            rotary_dim: 4,
            yarn: Some(Yarn {
                factor: 32.0,
                original_context: 512,
                beta_fast: 64.0,
                beta_slow: 1.0,
                attention_factor: (0.1 * 32f64.ln() + 1.0) as f32,
            }),
        }
    );
    assert_eq!(
        c.rope_sliding,
        Rope {
            theta: 10000.0,
            rotary_dim: 8,
            yarn: None
        }
    );
}

#[test]
fn laguna_defaults_when_keys_are_absent() {
    let v = json!({"model_type": "laguna", "num_hidden_layers": 3});
    let c = parse(&v).unwrap().model;
    // LagunaConfig class defaults.
    assert_eq!(
        (c.vocab_size, c.hidden_size, c.dense_ffn),
        (100352, 2048, 8192)
    );
    assert_eq!(c.n_heads, vec![48; 3]);
    assert_eq!((c.n_kv_heads, c.head_dim), (8, 128));
    assert_eq!(
        (c.n_experts, c.n_experts_used, c.expert_ffn, c.shared_ffn),
        (256, 8, 512, 512)
    );
    assert_eq!(c.routed_scaling, 1.0);
    assert!(c.norm_topk_prob);
    assert_eq!(c.max_position, 131072);
    // __post_init__: all full attention, [dense] + [sparse]·(L−1), default RoPE per type.
    assert_eq!(c.layer_types, vec![F; 3]);
    assert_eq!(c.mlp_types, vec![D, M, M]);
    assert_eq!(c.sliding_window, 0, "no layer slides");
    assert_eq!(
        c.rope_full,
        Rope {
            theta: 500000.0,
            rotary_dim: 64,
            yarn: None
        }
    );
    assert_eq!(
        c.rope_sliding,
        Rope {
            theta: 10000.0,
            rotary_dim: 128,
            yarn: None
        }
    );
    assert_eq!((c.bos_token, c.eos_tokens.len()), (None, 0));
    c.validate().unwrap();
}

#[test]
fn legacy_remote_code_schema() {
    let c = parse(&cfg(
        json!({"mlp_only_layers": [0], "decoder_sparse_step": 1}),
    ))
    .unwrap();
    assert_eq!(c.model.mlp_types, vec![D, M, M, M]);
    let c = parse(&cfg(
        json!({"mlp_only_layers": [], "decoder_sparse_step": 2}),
    ))
    .unwrap();
    assert_eq!(c.model.mlp_types, vec![D, M, D, M]);
    let c = parse(&cfg(json!({"mlp_only_layers": [0, 3]}))).unwrap();
    assert_eq!(c.model.mlp_types, vec![D, M, M, D]);
    let c = parse(&cfg(json!({"decoder_sparse_step": 1, "num_experts": 0}))).unwrap();
    assert_eq!(c.model.mlp_types, vec![D; 4]);
    // mlp_layer_types wins over the legacy keys, as in native transformers.
    let c = parse(&cfg(
        json!({"mlp_layer_types": ["dense", "dense", "sparse", "sparse"],
        "mlp_only_layers": [0], "decoder_sparse_step": 1}),
    ))
    .unwrap();
    assert_eq!(c.model.mlp_types, vec![D, D, M, M]);
    assert!(matches!(
        err(json!({"decoder_sparse_step": 0})),
        HfError::ConfigValue { key, .. } if key == "decoder_sparse_step"
    ));
    assert!(matches!(
        err(json!({"mlp_layer_types": ["dense", "moe", "sparse", "sparse"]})),
        HfError::Unsupported { key, value, .. } if key == "mlp_layer_types" && value == "moe"
    ));
}

#[test]
fn yarn_defaults() {
    let rope = |full: Value| {
        cfg(json!({
            "max_position_embeddings": 65536,
            "rope_parameters": {"full_attention": full,
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
        }))
    };
    let y = |v: Value| parse(&v).unwrap().model.rope_full.yarn.unwrap();
    // Missing original context ⇒ max_position_embeddings; β defaults 32/1; mscale from factor.
    let got = y(rope(
        json!({"rope_type": "yarn", "rope_theta": 500000.0, "factor": 8.0}),
    ));
    assert_eq!(
        got,
        Yarn {
            factor: 8.0,
            original_context: 65536,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: (0.1 * 8f64.ln() + 1.0) as f32,
        }
    );
    // `beta_fast or 32`: 0 falls back; an explicit attention_factor is kept (XS.2's 1.0).
    let got = y(rope(
        json!({"rope_type": "yarn", "rope_theta": 500000.0, "factor": 32.0,
        "original_max_position_embeddings": 4096, "beta_fast": 0, "beta_slow": 2.0,
        "attention_factor": 1.0, "partial_rotary_factor": 0.5}),
    ));
    assert_eq!(
        (got.beta_fast, got.beta_slow, got.attention_factor),
        (32.0, 2.0, 1.0)
    );
    // mscale / mscale_all_dim variant.
    let got = y(rope(
        json!({"rope_type": "yarn", "rope_theta": 1e4, "factor": 16.0,
        "mscale": 2.0, "mscale_all_dim": 1.0}),
    ));
    let ms = |m: f64| 0.1 * m * 16f64.ln() + 1.0;
    assert_eq!(got.attention_factor, (ms(2.0) / ms(1.0)) as f32);
    // A null factor is max / original (transformers); a missing one is an error.
    let got = y(rope(
        json!({"rope_type": "yarn", "rope_theta": 1e4, "factor": null,
        "original_max_position_embeddings": 8192}),
    ));
    assert_eq!(got.factor, 8.0);
    let e = parse(&rope(json!({"rope_type": "yarn", "rope_theta": 1e4}))).unwrap_err();
    assert!(
        matches!(&e, HfError::ConfigValue { key, .. } if key == "rope_parameters.full_attention.factor"),
        "{e:?}"
    );
    // Missing rope_theta falls back to the top-level attribute.
    let mut v = rope(json!({"rope_type": "default", "partial_rotary_factor": 0.25}));
    v["rope_theta"] = json!(250000.0);
    let c = parse(&v).unwrap().model;
    assert_eq!((c.rope_full.theta, c.rope_full.rotary_dim), (250000.0, 2));
    // Legacy `type` spelling.
    let c = parse(&rope(
        json!({"type": "yarn", "rope_theta": 1e4, "factor": 2.0}),
    ))
    .unwrap();
    assert!(c.model.rope_full.yarn.is_some());
}

#[test]
fn rope_rejections() {
    let e = err(
        json!({"rope_parameters": {"full_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}}),
    );
    assert!(
        matches!(&e, HfError::Unsupported { key, value, .. } if key == "rope_parameters.full_attention.rope_type" && value == "linear"),
        "{e:?}"
    );
    let e =
        err(json!({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}));
    assert!(
        matches!(&e, HfError::Unsupported { key, .. } if key == "rope_parameters"),
        "{e:?}"
    );
    // A layer type in use needs its dict.
    let e = err(
        json!({"layer_types": ["full_attention", "sliding_attention", "full_attention", "full_attention"],
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4}}}),
    );
    assert!(
        matches!(&e, HfError::ConfigValue { key, .. } if key == "rope_parameters.sliding_attention"),
        "{e:?}"
    );
    let e = err(
        json!({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.5}}}),
    );
    assert!(
        matches!(&e, HfError::ConfigValue { key, .. } if key == "rope_parameters.full_attention.partial_rotary_factor"),
        "{e:?}"
    );
}

#[test]
fn sliding_window_and_heads() {
    let lt = json!([
        "full_attention",
        "sliding_attention",
        "sliding_attention",
        "sliding_attention"
    ]);
    // transformers' default window when a layer slides.
    let c = parse(&cfg(json!({"layer_types": lt}))).unwrap().model;
    assert_eq!(c.sliding_window, 512);
    assert_eq!(c.layer_types, vec![F, S, S, S]);
    let c = parse(&cfg(json!({"layer_types": lt, "sliding_window": 128,
        "num_attention_heads_per_layer": [4, 6, 6, 6]})))
    .unwrap()
    .model;
    assert_eq!(
        (c.sliding_window, c.n_heads.clone()),
        (128, vec![4, 6, 6, 6])
    );
    // An explicit null window with sliding layers (`null` in `cfg`'s patch removes a key).
    let mut v = cfg(json!({"layer_types": lt}));
    v["sliding_window"] = Value::Null;
    let e = parse(&v).unwrap_err();
    assert!(
        matches!(&e, HfError::ConfigValue { key, .. } if key == "sliding_window"),
        "{e:?}"
    );
    let e = err(
        json!({"layer_types": ["full_attention", "chunked_attention", "full_attention", "full_attention"]}),
    );
    assert!(
        matches!(&e, HfError::Unsupported { key, .. } if key == "layer_types"),
        "{e:?}"
    );
    // head_dim: null ⇒ hidden / heads.
    let mut v = cfg(json!({}));
    v["head_dim"] = Value::Null;
    assert_eq!(parse(&v).unwrap().model.head_dim, 8);
}

#[test]
fn token_ids() {
    let c = parse(&cfg(json!({"bos_token_id": 2, "eos_token_id": 24})))
        .unwrap()
        .model;
    assert_eq!((c.bos_token, c.eos_tokens), (Some(2), vec![24]));
    let c = parse(&cfg(json!({"eos_token_id": [2, 24]}))).unwrap().model;
    assert_eq!(c.eos_tokens, vec![2, 24]);
    let e = err(json!({"eos_token_id": [2, "x"]}));
    assert!(
        matches!(&e, HfError::ConfigValue { key, .. } if key == "eos_token_id"),
        "{e:?}"
    );
}

#[test]
fn rejects_what_the_forward_pass_does_not_do() {
    let cases = [
        (
            json!({"moe_apply_router_weight_on_input": true}),
            "moe_apply_router_weight_on_input",
        ),
        (
            json!({"moe_router_logit_softcapping": 30.0}),
            "moe_router_logit_softcapping",
        ),
        (
            json!({"final_logit_softcapping": 15.0}),
            "final_logit_softcapping",
        ),
        (
            json!({"moe_router_score_func": "softmax"}),
            "moe_router_score_func",
        ),
        (
            json!({"moe_router_use_sigmoid": false}),
            "moe_router_use_sigmoid",
        ),
        (json!({"hidden_act": "gelu"}), "hidden_act"),
        (json!({"attention_bias": true}), "attention_bias"),
    ];
    for (patch, key) in cases {
        let e = err(patch.clone());
        assert!(
            matches!(&e, HfError::Unsupported { key: k, .. } if k == key),
            "{patch}: {e:?}"
        );
        assert!(e.to_string().contains(key), "{e}");
    }
    // The values that mean "off" are accepted.
    parse(&cfg(
        json!({"moe_apply_router_weight_on_input": false, "moe_router_logit_softcapping": 0.0,
        "moe_router_score_func": "sigmoid", "gating": true, "router_aux_loss_coef": 0.0}),
    ))
    .unwrap();
}

#[test]
fn rejects_other_models_and_bad_values() {
    let e = err(json!({"model_type": "llama"}));
    assert!(
        matches!(&e, HfError::NotLaguna { key: "model_type", got } if got == "llama"),
        "{e:?}"
    );
    let e = err(json!({"model_type": null, "architectures": ["LlamaForCausalLM"]}));
    assert!(
        matches!(
            &e,
            HfError::NotLaguna {
                key: "architectures",
                ..
            }
        ),
        "{e:?}"
    );
    let e = err(json!({"model_type": null, "architectures": null}));
    assert!(matches!(&e, HfError::NotLaguna { .. }), "{e:?}");
    let e = err(json!({"num_hidden_layers": "four"}));
    assert!(
        matches!(&e, HfError::ConfigValue { key, got, .. } if key == "num_hidden_layers" && got == "\"four\""),
        "{e:?}"
    );
    let e = err(json!({"num_attention_heads_per_layer": [4, -4, 4, 4]}));
    assert!(
        matches!(&e, HfError::ConfigValue { key, .. } if key == "num_attention_heads_per_layer"),
        "{e:?}"
    );
    // Integral floats are integers.
    assert_eq!(
        parse(&cfg(json!({"hidden_size": 32.0})))
            .unwrap()
            .model
            .hidden_size,
        32
    );
    // Length mismatches are left to ModelConfig::validate, which names the key.
    let c = parse(&cfg(json!({"layer_types": ["full_attention"]})))
        .unwrap()
        .model;
    assert_eq!(c.validate().unwrap_err().key, "layer_types");
}
