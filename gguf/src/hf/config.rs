//! `config.json` of a Laguna checkpoint → [`ModelConfig`], with the defaults of transformers
//! 5.23's `LagunaConfig` (`configuration_laguna.py`, `__post_init__`) and its RoPE helpers
//! (`modeling_rope_utils.py`: `standardize_rope_params`, `_compute_yarn_parameters`), and the
//! poolside remote-code schema (`mlp_only_layers` + `decoder_sparse_step`).

use lagoon_core::config::{AttnKind, MlpKind, ModelConfig, Rope, Yarn};
use serde_json::{Map, Value};

use super::HfError;

/// What config.json says beyond [`ModelConfig`].
#[derive(Clone, Debug, PartialEq)]
pub struct HfConfig {
    pub model: ModelConfig,
    /// `tie_word_embeddings`: `lm_head` reuses the embedding when it is not stored.
    pub tie_word_embeddings: bool,
}

/// `LagunaConfig` class defaults (transformers 5.23).
mod default {
    pub const VOCAB: usize = 100352;
    pub const HIDDEN: usize = 2048;
    pub const INTERMEDIATE: usize = 8192;
    pub const LAYERS: usize = 40;
    pub const HEADS: usize = 48;
    pub const KV_HEADS: usize = 8;
    pub const MAX_POSITION: usize = 131072;
    pub const RMS_EPS: f64 = 1e-6;
    pub const SLIDING_WINDOW: usize = 512;
    pub const MOE_INTERMEDIATE: usize = 512;
    pub const SHARED_INTERMEDIATE: usize = 512;
    pub const EXPERTS_PER_TOK: usize = 8;
    pub const EXPERTS: usize = 256;
    pub const HEAD_DIM: usize = 128;
    pub const ROUTED_SCALING: f64 = 1.0;
    /// `__post_init__`'s default `rope_parameters`: (theta, partial_rotary_factor).
    pub const ROPE_FULL: (f64, f64) = (500000.0, 0.5);
    pub const ROPE_SLIDING: (f64, f64) = (10000.0, 1.0);
    /// `_compute_yarn_parameters`: `beta_fast or 32`, `beta_slow or 1`.
    pub const BETA_FAST: f64 = 32.0;
    pub const BETA_SLOW: f64 = 1.0;
}

/// Typed access to the top-level object, with errors naming the key.
struct Cfg<'a> {
    m: &'a Map<String, Value>,
}

fn bad(key: &str, expected: &'static str, got: &Value) -> HfError {
    HfError::ConfigValue {
        key: key.to_string(),
        expected,
        got: short(got),
    }
}

/// A JSON value for an error message, cut to a sane length.
pub(crate) fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 80 {
        let mut end = 77;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...", &s[..end])
    } else {
        s
    }
}

/// A non-negative integer, also accepted as an integral float (`4096.0`).
fn as_usize(v: &Value) -> Option<usize> {
    if let Some(u) = v.as_u64() {
        return usize::try_from(u).ok();
    }
    let f = v.as_f64()?;
    (f >= 0.0 && f.fract() == 0.0 && f < 9.0e15).then_some(f as usize)
}

impl<'a> Cfg<'a> {
    /// The value of `key`, `None` when absent or null (transformers then uses its default).
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.m.get(key).filter(|v| !v.is_null())
    }

    fn usize_or(&self, key: &str, default: usize) -> Result<usize, HfError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => as_usize(v).ok_or_else(|| bad(key, "a non-negative integer", v)),
        }
    }

    fn f64_or(&self, key: &str, default: f64) -> Result<f64, HfError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| bad(key, "a number", v)),
        }
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool, HfError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| bad(key, "true or false", v)),
        }
    }

    fn str_list(&self, key: &str) -> Result<Option<Vec<&'a str>>, HfError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        v.as_array()
            .and_then(|a| a.iter().map(Value::as_str).collect::<Option<Vec<_>>>())
            .map(Some)
            .ok_or_else(|| bad(key, "a list of strings", v))
    }

    fn usize_list(&self, key: &str) -> Result<Option<Vec<usize>>, HfError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        v.as_array()
            .and_then(|a| a.iter().map(as_usize).collect::<Option<Vec<_>>>())
            .map(Some)
            .ok_or_else(|| bad(key, "a list of non-negative integers", v))
    }
}

/// Parses a Laguna `config.json`. The result is not yet validated
/// ([`ModelConfig::validate`] runs when the checkpoint is assembled).
pub fn parse(v: &Value) -> Result<HfConfig, HfError> {
    let m = v.as_object().ok_or_else(|| HfError::BadJson {
        file: "config.json".into(),
        detail: "the top level is not an object".into(),
    })?;
    let c = Cfg { m };
    check_laguna(&c)?;
    check_unsupported(&c)?;

    let n_layers = c.usize_or("num_hidden_layers", default::LAYERS)?;
    let n_heads_default = c.usize_or("num_attention_heads", default::HEADS)?;
    let hidden_size = c.usize_or("hidden_size", default::HIDDEN)?;
    let head_dim = match c.get("head_dim") {
        Some(v) => as_usize(v).ok_or_else(|| bad("head_dim", "a non-negative integer", v))?,
        None if c.m.contains_key("head_dim") => hidden_size / n_heads_default.max(1),
        None => default::HEAD_DIM,
    };
    let n_heads = c
        .usize_list("num_attention_heads_per_layer")?
        .unwrap_or_else(|| vec![n_heads_default; n_layers]);

    let layer_types = match c.str_list("layer_types")? {
        None => vec![AttnKind::Full; n_layers],
        Some(l) => l
            .iter()
            .map(|t| match *t {
                "full_attention" => Ok(AttnKind::Full),
                "sliding_attention" => Ok(AttnKind::Sliding),
                other => Err(HfError::Unsupported {
                    key: "layer_types".into(),
                    value: other.to_string(),
                    detail: "layer types are `full_attention` or `sliding_attention`",
                }),
            })
            .collect::<Result<_, _>>()?,
    };

    let n_experts = c.usize_or("num_experts", default::EXPERTS)?;
    let mlp_types = mlp_types(&c, n_layers, n_experts)?;

    let max_position = c.usize_or("max_position_embeddings", default::MAX_POSITION)?;
    let (rope_full, rope_sliding) = ropes(&c, &layer_types, head_dim, max_position)?;

    let sliding_window = if layer_types.contains(&AttnKind::Sliding) {
        match c.m.get("sliding_window") {
            None => default::SLIDING_WINDOW,
            Some(Value::Null) => {
                return Err(bad(
                    "sliding_window",
                    "a window size (some layers are `sliding_attention`)",
                    &Value::Null,
                ));
            }
            Some(v) => {
                as_usize(v).ok_or_else(|| bad("sliding_window", "a non-negative integer", v))?
            }
        }
    } else {
        0
    };

    let bos_token = match c.get("bos_token_id") {
        None => None,
        Some(v) => Some(token_id("bos_token_id", v)?),
    };
    let eos_tokens = match c.get("eos_token_id") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|t| token_id("eos_token_id", t))
            .collect::<Result<_, _>>()?,
        Some(v) => vec![token_id("eos_token_id", v)?],
    };

    let model = ModelConfig {
        vocab_size: c.usize_or("vocab_size", default::VOCAB)?,
        hidden_size,
        n_layers,
        n_heads,
        n_kv_heads: c.usize_or("num_key_value_heads", default::KV_HEADS)?,
        head_dim,
        layer_types,
        mlp_types,
        sliding_window,
        dense_ffn: c.usize_or("intermediate_size", default::INTERMEDIATE)?,
        n_experts,
        n_experts_used: c.usize_or("num_experts_per_tok", default::EXPERTS_PER_TOK)?,
        expert_ffn: c.usize_or("moe_intermediate_size", default::MOE_INTERMEDIATE)?,
        shared_ffn: c.usize_or(
            "shared_expert_intermediate_size",
            default::SHARED_INTERMEDIATE,
        )?,
        routed_scaling: c.f64_or("moe_routed_scaling_factor", default::ROUTED_SCALING)? as f32,
        norm_topk_prob: c.bool_or("norm_topk_prob", true)?,
        rms_eps: c.f64_or("rms_norm_eps", default::RMS_EPS)? as f32,
        rope_full,
        rope_sliding,
        max_position,
        bos_token,
        eos_tokens,
    };
    Ok(HfConfig {
        model,
        tie_word_embeddings: c.bool_or("tie_word_embeddings", false)?,
    })
}

fn token_id(key: &str, v: &Value) -> Result<u32, HfError> {
    v.as_u64()
        .and_then(|t| u32::try_from(t).ok())
        .ok_or_else(|| bad(key, "a token id or a list of token ids", v))
}

/// `architectures` / `model_type` must name Laguna.
fn check_laguna(c: &Cfg<'_>) -> Result<(), HfError> {
    let model_type = c.get("model_type").and_then(Value::as_str);
    if let Some(t) = model_type
        && t != "laguna"
    {
        return Err(HfError::NotLaguna {
            key: "model_type",
            got: t.to_string(),
        });
    }
    let archs = c.str_list("architectures").ok().flatten();
    if let Some(a) = &archs
        && !a.is_empty()
        && !a.iter().any(|s| s.starts_with("Laguna"))
    {
        return Err(HfError::NotLaguna {
            key: "architectures",
            got: a.join(", "),
        });
    }
    if model_type.is_none() && archs.is_none_or(|a| a.is_empty()) {
        return Err(HfError::NotLaguna {
            key: "model_type",
            got: "(absent, and no `architectures`)".into(),
        });
    }
    Ok(())
}

/// Options the forward pass does not implement: refuse rather than compute something else.
fn check_unsupported(c: &Cfg<'_>) -> Result<(), HfError> {
    let unsupported = |key: &str, v: &Value, detail: &'static str| HfError::Unsupported {
        key: key.to_string(),
        value: short(v),
        detail,
    };
    if let Some(v) = c.get("moe_apply_router_weight_on_input")
        && v.as_bool() != Some(false)
    {
        return Err(unsupported(
            "moe_apply_router_weight_on_input",
            v,
            "scaling expert inputs by router weights is not implemented (transformers refuses it too)",
        ));
    }
    for key in [
        "moe_router_logit_softcapping",
        "final_logit_softcapping",
        "attn_logit_softcapping",
    ] {
        if let Some(v) = c.get(key)
            && v.as_f64() != Some(0.0)
        {
            if v.as_f64().is_some_and(|x| x < 0.0) {
                continue; // negative means off, as in transformers' `> 0` test
            }
            return Err(unsupported(
                key,
                v,
                "logit softcapping is not implemented; only 0 (off) is supported",
            ));
        }
    }
    if let Some(v) = c.get("moe_router_score_func")
        && v.as_str() != Some("sigmoid")
    {
        return Err(unsupported(
            "moe_router_score_func",
            v,
            "Laguna routes with sigmoid scores; other score functions are not implemented",
        ));
    }
    if let Some(v) = c.get("moe_router_use_sigmoid")
        && v.as_bool() != Some(true)
    {
        return Err(unsupported(
            "moe_router_use_sigmoid",
            v,
            "Laguna routes with sigmoid scores; other score functions are not implemented",
        ));
    }
    if let Some(v) = c.get("hidden_act")
        && v.as_str() != Some("silu")
    {
        return Err(unsupported("hidden_act", v, "only `silu` is implemented"));
    }
    for key in [
        "attention_bias",
        "qkv_bias",
        "swa_attention_sink_enabled",
        "use_bidirectional_attention",
    ] {
        if let Some(v) = c.get(key)
            && v.as_bool() != Some(false)
        {
            return Err(unsupported(key, v, "only `false` is implemented"));
        }
    }
    Ok(())
}

/// `mlp_layer_types`, else the remote-code `mlp_only_layers` + `decoder_sparse_step` (layer `l`
/// is sparse iff `l ∉ mlp_only_layers && num_experts > 0 && (l+1) % step == 0`), else
/// `[dense] + [sparse]·(L−1)`.
fn mlp_types(c: &Cfg<'_>, n_layers: usize, n_experts: usize) -> Result<Vec<MlpKind>, HfError> {
    if let Some(l) = c.str_list("mlp_layer_types")? {
        return l
            .iter()
            .map(|t| match *t {
                "dense" => Ok(MlpKind::Dense),
                "sparse" => Ok(MlpKind::Sparse),
                other => Err(HfError::Unsupported {
                    key: "mlp_layer_types".into(),
                    value: other.to_string(),
                    detail: "MLP layer types are `dense` or `sparse`",
                }),
            })
            .collect();
    }
    let only = c.usize_list("mlp_only_layers")?;
    let step = c.get("decoder_sparse_step");
    if only.is_none() && step.is_none() {
        let mut v = vec![MlpKind::Sparse; n_layers];
        if let Some(first) = v.first_mut() {
            *first = MlpKind::Dense;
        }
        return Ok(v);
    }
    let only = only.unwrap_or_default();
    let step = c.usize_or("decoder_sparse_step", 1)?;
    if step == 0 {
        return Err(bad(
            "decoder_sparse_step",
            "a positive integer",
            &Value::from(0),
        ));
    }
    Ok((0..n_layers)
        .map(|l| {
            if !only.contains(&l) && n_experts > 0 && (l + 1) % step == 0 {
                MlpKind::Sparse
            } else {
                MlpKind::Dense
            }
        })
        .collect())
}

/// The nested per-layer-type `rope_parameters`, as transformers reads them.
fn ropes(
    c: &Cfg<'_>,
    layer_types: &[AttnKind],
    head_dim: usize,
    max_position: usize,
) -> Result<(Rope, Rope), HfError> {
    let top = match c.get("rope_parameters").or_else(|| c.get("rope_scaling")) {
        None => None,
        Some(Value::Object(m)) => Some(m),
        Some(v) => return Err(bad("rope_parameters", "an object", v)),
    };
    if let Some(m) = top
        && !m.contains_key("full_attention")
        && !m.contains_key("sliding_attention")
        && !m.is_empty()
    {
        return Err(HfError::Unsupported {
            key: "rope_parameters".into(),
            value: short(&Value::Object(m.clone())),
            detail: "Laguna keys RoPE by layer type (`full_attention`, `sliding_attention`); a flat dict is not what transformers reads",
        });
    }
    // `standardize_rope_params` fills a nested dict's missing `rope_theta` /
    // `partial_rotary_factor` from the top-level attributes.
    let top_theta = c.get("rope_theta").and_then(Value::as_f64);
    let top_partial = c.get("partial_rotary_factor").and_then(Value::as_f64);
    let one = |kind: AttnKind, name: &str, dflt: (f64, f64)| -> Result<Rope, HfError> {
        let fallback = Rope {
            theta: dflt.0 as f32,
            rotary_dim: (head_dim as f64 * dflt.1) as usize,
            yarn: None,
        };
        let Some(top) = top else {
            return Ok(fallback);
        };
        let used = layer_types.contains(&kind);
        match top.get(name).filter(|v| !v.is_null()) {
            Some(v) if used => rope(name, v, head_dim, max_position, top_theta, top_partial),
            // transformers never reads the dict of a layer type no layer has.
            Some(v) => Ok(
                rope(name, v, head_dim, max_position, top_theta, top_partial).unwrap_or(fallback),
            ),
            None if used => Err(HfError::ConfigValue {
                key: format!("rope_parameters.{name}"),
                expected: "the RoPE parameters of this layer type (some layers use it)",
                got: "(absent)".into(),
            }),
            None => Ok(fallback),
        }
    };
    Ok((
        one(AttnKind::Full, "full_attention", default::ROPE_FULL)?,
        one(
            AttnKind::Sliding,
            "sliding_attention",
            default::ROPE_SLIDING,
        )?,
    ))
}

fn rope(
    name: &str,
    v: &Value,
    head_dim: usize,
    max_position: usize,
    top_theta: Option<f64>,
    top_partial: Option<f64>,
) -> Result<Rope, HfError> {
    let key = |k: &str| format!("rope_parameters.{name}.{k}");
    let m = v
        .as_object()
        .ok_or_else(|| bad(&format!("rope_parameters.{name}"), "an object", v))?;
    let get = |k: &str| m.get(k).filter(|v| !v.is_null());
    let num = |k: &str| -> Result<Option<f64>, HfError> {
        match get(k) {
            None => Ok(None),
            Some(x) => x
                .as_f64()
                .map(Some)
                .ok_or_else(|| bad(&key(k), "a number", x)),
        }
    };
    let rope_type = get("rope_type")
        .or_else(|| get("type"))
        .map(|t| {
            t.as_str()
                .ok_or_else(|| bad(&key("rope_type"), "a string", t))
        })
        .transpose()?
        .unwrap_or("default");
    let theta = num("rope_theta")?
        .or(top_theta)
        .ok_or_else(|| HfError::ConfigValue {
            key: key("rope_theta"),
            expected: "a number",
            got: "(absent)".into(),
        })?;
    let partial = num("partial_rotary_factor")?.or(top_partial).unwrap_or(1.0);
    if !(partial > 0.0 && partial <= 1.0) {
        return Err(bad(
            &key("partial_rotary_factor"),
            "a number in (0, 1]",
            &Value::from(partial),
        ));
    }
    let rotary_dim = (head_dim as f64 * partial) as usize;
    let yarn = match rope_type {
        "default" => None,
        "yarn" => {
            let original = match get("original_max_position_embeddings") {
                None => max_position,
                Some(x) => as_usize(x).ok_or_else(|| {
                    bad(
                        &key("original_max_position_embeddings"),
                        "a positive integer",
                        x,
                    )
                })?,
            };
            // `rope_parameters_dict["factor"]`: a missing key fails in transformers, a null
            // one means max_position_embeddings / original.
            let factor = match m.get("factor") {
                None => {
                    return Err(HfError::ConfigValue {
                        key: key("factor"),
                        expected: "a number (yarn needs a scaling factor)",
                        got: "(absent)".into(),
                    });
                }
                Some(Value::Null) => max_position as f64 / original.max(1) as f64,
                Some(x) => x
                    .as_f64()
                    .ok_or_else(|| bad(&key("factor"), "a number", x))?,
            };
            let get_mscale = |scale: f64, mscale: f64| {
                if scale <= 1.0 {
                    1.0
                } else {
                    0.1 * mscale * scale.ln() + 1.0
                }
            };
            let attention_factor = match num("attention_factor")? {
                Some(a) => a,
                None => match (num("mscale")?, num("mscale_all_dim")?) {
                    (Some(ms), Some(md)) if ms != 0.0 && md != 0.0 => {
                        get_mscale(factor, ms) / get_mscale(factor, md)
                    }
                    _ => get_mscale(factor, 1.0),
                },
            };
            // `beta_fast or 32`, `beta_slow or 1`: 0 also falls back.
            let beta_fast = num("beta_fast")?
                .filter(|b| *b != 0.0)
                .unwrap_or(default::BETA_FAST);
            let beta_slow = num("beta_slow")?
                .filter(|b| *b != 0.0)
                .unwrap_or(default::BETA_SLOW);
            Some(Yarn {
                factor: factor as f32,
                original_context: u32::try_from(original).unwrap_or(u32::MAX),
                beta_fast: beta_fast as f32,
                beta_slow: beta_slow as f32,
                attention_factor: attention_factor as f32,
            })
        }
        other => {
            return Err(HfError::Unsupported {
                key: key("rope_type"),
                value: other.to_string(),
                detail: "Laguna uses `yarn` (full layers) and `default` (sliding layers)",
            });
        }
    };
    Ok(Rope {
        theta: theta as f32,
        rotary_dim,
        yarn,
    })
}
