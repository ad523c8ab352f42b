//! GGUF `laguna.*` metadata → [`ModelConfig`] (spec/laguna.md §8.1), with llama.cpp's
//! defaults where a key is optional (`llama-model.cpp::load_hparams`,
//! `models/laguna.cpp::load_arch_hparams`).
//!
//! Integers are accepted at any width (writers mix u32, i32 and u64); floats at f32 or
//! f64. Per-layer keys (`attention.head_count`, `feed_forward_length`,
//! `expert_feed_forward_length`) may be a scalar or an array of `block_count` entries.

use lagoon_core::config::{AttnKind, MlpKind, ModelConfig, Rope, Yarn};

use super::error::GgufError;
use super::value::{Array, Value};

/// The `general.architecture` lagoon runs.
pub const ARCH: &str = "laguna";

/// More layers than any plausible model; a larger `block_count` is a corrupt file, and
/// must not size the per-layer vectors.
pub const MAX_LAYERS: usize = 1 << 16;

/// Default SWA period when `sliding_window_pattern` is absent: full at `l % 4 == 0`.
const DEFAULT_SWA_PERIOD: u64 = 4;

/// Typed lookups over a metadata list, with errors naming the key.
struct Meta<'a> {
    kv: &'a [(String, Value)],
}

fn key(suffix: &str) -> String {
    format!("{ARCH}.{suffix}")
}

fn wrong_type(key: &str, expected: &'static str, got: &Value) -> GgufError {
    let got = match got {
        Value::Array(a) => format!("an array of {}", a.elem_type()),
        v => format!("a {} ({v})", v.ty()),
    };
    GgufError::WrongKeyType {
        key: key.to_owned(),
        expected,
        got,
    }
}

fn bad(key: &str, detail: String) -> GgufError {
    GgufError::BadKeyValue {
        key: key.to_owned(),
        detail,
    }
}

fn to_usize(key: &str, v: u64) -> Result<usize, GgufError> {
    usize::try_from(v).map_err(|_| bad(key, format!("{v} does not fit this machine's usize")))
}

impl Meta<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.kv.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn req<T>(&self, key: &str, v: Option<T>) -> Result<T, GgufError> {
        v.ok_or_else(|| GgufError::MissingKey {
            key: key.to_owned(),
        })
    }

    fn usize(&self, key: &str) -> Result<Option<usize>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) => to_usize(key, n).map(Some),
                None => Err(wrong_type(key, "a non-negative integer", v)),
            },
        }
    }

    fn u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        match self.usize(key)? {
            None => Ok(None),
            Some(n) => u32::try_from(n)
                .map(Some)
                .map_err(|_| bad(key, format!("{n} does not fit u32"))),
        }
    }

    fn f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) => Ok(Some(x as f32)),
                None => Err(wrong_type(key, "a number", v)),
            },
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| wrong_type(key, "a bool", v)),
        }
    }

    fn str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| wrong_type(key, "a string", v)),
        }
    }

    /// A scalar repeated over `n` layers, or an array of exactly `n` integers.
    fn per_layer(&self, key: &str, n: usize) -> Result<Option<Vec<usize>>, GgufError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        if let Some(x) = v.as_u64() {
            return Ok(Some(vec![to_usize(key, x)?; n]));
        }
        let expected = "a non-negative integer or an array of one per layer";
        let Some(a) = v.as_array() else {
            return Err(wrong_type(key, expected, v));
        };
        let xs = a.to_u64s().ok_or_else(|| wrong_type(key, expected, v))?;
        if xs.len() != n {
            return Err(bad(
                key,
                format!("has {} entries, expected one per layer ({n})", xs.len()),
            ));
        }
        xs.into_iter()
            .map(|x| to_usize(key, x))
            .collect::<Result<_, _>>()
            .map(Some)
    }
}

/// The one value a per-layer list takes on the layers `select` picks; an error if they
/// differ (lagoon's config has one width per kind).
fn uniform(
    key: &str,
    values: &[usize],
    select: impl Fn(usize) -> bool,
    what: &str,
) -> Result<Option<usize>, GgufError> {
    let mut it = values.iter().enumerate().filter(|&(l, _)| select(l));
    let Some((first_l, &first)) = it.next() else {
        return Ok(None);
    };
    if let Some((l, &v)) = it.find(|&(_, &v)| v != first) {
        return Err(bad(
            key,
            format!(
                "layer {l} has {v} but layer {first_l} has {first}; lagoon needs the same value on every {what}layer"
            ),
        ));
    }
    Ok(Some(first))
}

/// Builds the Laguna config from GGUF metadata (shard 0 of a split set).
pub fn laguna_config(metadata: &[(String, Value)]) -> Result<ModelConfig, GgufError> {
    let m = Meta { kv: metadata };
    let arch_key = "general.architecture";
    let arch = m.req(arch_key, m.str(arch_key)?)?;
    if arch != ARCH {
        return Err(GgufError::WrongArchitecture {
            got: arch.to_owned(),
        });
    }

    let n_layers_key = key("block_count");
    let n_layers = m.req(&n_layers_key, m.usize(&n_layers_key)?)?;
    if n_layers > MAX_LAYERS {
        return Err(bad(
            &n_layers_key,
            format!(
                "{n_layers} layers is implausible (lagoon allows {MAX_LAYERS}); the file is corrupt"
            ),
        ));
    }
    let hidden_key = key("embedding_length");
    let hidden_size = m.req(&hidden_key, m.usize(&hidden_key)?)?;
    let ctx_key = key("context_length");
    let max_position = m.req(&ctx_key, m.usize(&ctx_key)?)?;

    // The converter writes vocab_size; older files only have the token list.
    let vocab_key = key("vocab_size");
    let vocab_size = match m.usize(&vocab_key)? {
        Some(v) => v,
        None => match m.get("tokenizer.ggml.tokens").and_then(Value::as_array) {
            Some(a) => a.len(),
            None => return Err(GgufError::MissingKey { key: vocab_key }),
        },
    };

    // Attention heads.
    let heads_key = key("attention.head_count");
    let n_heads = m.req(&heads_key, m.per_layer(&heads_key, n_layers)?)?;
    let all = |_: usize| true;
    let kv_key = key("attention.head_count_kv");
    let n_kv_heads = match m.per_layer(&kv_key, n_layers)? {
        Some(v) => uniform(&kv_key, &v, all, "")?,
        // llama.cpp: n_head_kv defaults to n_head.
        None => uniform(&heads_key, &n_heads, all, "").map_err(|_| GgufError::MissingKey {
            key: kv_key.clone(),
        })?,
    }
    .unwrap_or(0);

    // head_dim: key_length, else llama.cpp's n_embd / n_head(0).
    let k_len_key = key("attention.key_length");
    let head_dim = match m.usize(&k_len_key)? {
        Some(d) => d,
        None => match n_heads.first() {
            Some(&h) if h > 0 && hidden_size % h == 0 => hidden_size / h,
            _ => return Err(GgufError::MissingKey { key: k_len_key }),
        },
    };
    for other in [
        "attention.value_length",
        "attention.key_length_swa",
        "attention.value_length_swa",
    ] {
        let k = key(other);
        if let Some(d) = m.usize(&k)?
            && d != head_dim
        {
            return Err(bad(
                &k,
                format!("{d} differs from the key length {head_dim}; lagoon needs one head size"),
            ));
        }
    }

    let eps_key = key("attention.layer_norm_rms_epsilon");
    let rms_eps = m.req(&eps_key, m.f32(&eps_key)?)?;

    // Sliding layers: only if a window is given (M.1-style files omit the key). The
    // pattern is a per-layer bool array (true = sliding), or a period with the first
    // layer of each period full (llama.cpp `set_swa_pattern(n, dense_first = true)`:
    // period 0 means every layer slides), or absent = period 4.
    let window_key = key("attention.sliding_window");
    let window = m.usize(&window_key)?.unwrap_or(0);
    let pattern_key = key("attention.sliding_window_pattern");
    let layer_types: Vec<AttnKind> = if window == 0 {
        vec![AttnKind::Full; n_layers]
    } else {
        let kind = |sliding: bool| {
            if sliding {
                AttnKind::Sliding
            } else {
                AttnKind::Full
            }
        };
        let by_period = |p: u64| -> Vec<AttnKind> {
            (0..n_layers as u64)
                .map(|l| kind(p == 0 || l % p != 0))
                .collect()
        };
        match m.get(&pattern_key) {
            None => by_period(DEFAULT_SWA_PERIOD),
            Some(Value::Array(Array::Bool(b))) => {
                if b.len() != n_layers {
                    return Err(bad(
                        &pattern_key,
                        format!(
                            "has {} entries, expected one per layer ({n_layers})",
                            b.len()
                        ),
                    ));
                }
                b.iter().map(|&s| kind(s)).collect()
            }
            Some(v) => match v.as_u64() {
                Some(p) => by_period(p),
                None => {
                    return Err(wrong_type(
                        &pattern_key,
                        "a period (integer) or a per-layer bool array",
                        v,
                    ));
                }
            },
        }
    };
    let sliding_window = if layer_types.contains(&AttnKind::Sliding) {
        window
    } else {
        0
    };

    // Feed-forward kinds: the first `leading_dense_block_count` layers are dense.
    let n_experts = m.usize(&key("expert_count"))?.unwrap_or(0);
    let dense_key = key("leading_dense_block_count");
    let n_dense = match m.usize(&dense_key)? {
        Some(d) if d > n_layers => {
            return Err(bad(
                &dense_key,
                format!("{d} exceeds the {n_layers} layers"),
            ));
        }
        Some(d) => d,
        None if n_experts == 0 => n_layers,
        None => return Err(GgufError::MissingKey { key: dense_key }),
    };
    let mlp_types: Vec<MlpKind> = (0..n_layers)
        .map(|l| {
            if l < n_dense {
                MlpKind::Dense
            } else {
                MlpKind::Sparse
            }
        })
        .collect();
    let is_dense = |l: usize| l < n_dense;
    let is_sparse = |l: usize| l >= n_dense;
    let any_sparse = n_dense < n_layers;

    let ff_key = key("feed_forward_length");
    let dense_ffn = match m.per_layer(&ff_key, n_layers)? {
        Some(v) => uniform(&ff_key, &v, is_dense, "dense ")?.unwrap_or(0),
        None if n_dense > 0 => return Err(GgufError::MissingKey { key: ff_key }),
        None => 0,
    };
    let exp_ff_key = key("expert_feed_forward_length");
    let expert_ffn = match m.per_layer(&exp_ff_key, n_layers)? {
        Some(v) => uniform(&exp_ff_key, &v, is_sparse, "sparse ")?.unwrap_or(0),
        None if any_sparse => return Err(GgufError::MissingKey { key: exp_ff_key }),
        None => 0,
    };
    let n_experts_used = m.usize(&key("expert_used_count"))?.unwrap_or(0);
    // One shared expert unless told otherwise; its width defaults to the routed width
    // times the count, as in laguna.cpp.
    let n_shared = m.usize(&key("expert_shared_count"))?.unwrap_or(1);
    let shared_ffn = if !any_sparse || n_shared == 0 {
        0
    } else {
        match m.usize(&key("expert_shared_feed_forward_length"))? {
            Some(w) => w,
            None => expert_ffn.saturating_mul(n_shared),
        }
    };
    let gating_key = key("expert_gating_func");
    // 0 = unset (laguna.cpp then uses sigmoid), 2 = sigmoid; softmax (1) and others are
    // not what Laguna was trained with.
    if let Some(g) = m.usize(&gating_key)?
        && g != 0
        && g != 2
    {
        return Err(bad(
            &gating_key,
            format!("gating function {g} is not sigmoid (2), the only router lagoon implements"),
        ));
    }
    // llama.cpp skips the scale when it is 0 or 1, so absent and 0 both mean 1.
    let routed_scaling = match m.f32(&key("expert_weights_scale"))? {
        None | Some(0.0) => 1.0,
        Some(s) => s,
    };
    // llama.cpp's default when absent; the Laguna converter always writes true.
    let norm_topk_prob = m.bool(&key("expert_weights_norm"))?.unwrap_or(false);

    // RoPE. Full layers: freq_base (llama.cpp default 10000), dimension_count (default
    // head_dim), YaRN if the scaling type says so. Sliding layers: plain RoPE with the
    // *_swa values, each defaulting to the full-layer value.
    let theta = m.f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);
    let theta_swa = m.f32(&key("rope.freq_base_swa"))?.unwrap_or(theta);
    let rot = m.usize(&key("rope.dimension_count"))?.unwrap_or(head_dim);
    let rot_swa = m.usize(&key("rope.dimension_count_swa"))?.unwrap_or(rot);
    let yarn = yarn(&m, max_position)?;

    let bos_token = m.u32("tokenizer.ggml.bos_token_id")?;
    // HF's eos list [2, 24] is split by the converter into eos (2) and eot (24).
    let mut eos_tokens = Vec::new();
    for k in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
        if let Some(id) = m.u32(k)?
            && !eos_tokens.contains(&id)
        {
            eos_tokens.push(id);
        }
    }

    Ok(ModelConfig {
        vocab_size,
        hidden_size,
        n_layers,
        n_heads,
        n_kv_heads,
        head_dim,
        layer_types,
        mlp_types,
        sliding_window,
        dense_ffn,
        n_experts,
        n_experts_used,
        expert_ffn,
        shared_ffn,
        routed_scaling,
        norm_topk_prob,
        rms_eps,
        rope_full: Rope {
            theta,
            rotary_dim: rot,
            yarn,
        },
        rope_sliding: Rope {
            theta: theta_swa,
            rotary_dim: rot_swa,
            yarn: None,
        },
        max_position,
        bos_token,
        eos_tokens,
    })
}

/// YaRN parameters of the full-attention layers, or `None` for unscaled RoPE.
fn yarn(m: &Meta<'_>, max_position: usize) -> Result<Option<Yarn>, GgufError> {
    let type_key = key("rope.scaling.type");
    let factor_key = key("rope.scaling.factor");
    let factor = m.f32(&factor_key)?;
    let unscaled = factor.is_none_or(|f| f == 0.0 || f == 1.0);
    match m.str(&type_key)? {
        Some("yarn") => {}
        Some("none") => return Ok(None),
        // llama.cpp reads an absent type as "linear"; without a factor that is a no-op.
        Some("linear") | None if unscaled => return Ok(None),
        Some(other) => {
            return Err(bad(
                &type_key,
                format!("RoPE scaling `{other}` is not supported; lagoon implements yarn only"),
            ));
        }
        None => {
            return Err(bad(
                &factor_key,
                "a scaling factor without `rope.scaling.type` means linear scaling, which lagoon does not implement".into(),
            ));
        }
    }
    // llama.cpp: an absent or zero factor means no scaling.
    let factor = match factor {
        None | Some(0.0) => 1.0,
        Some(f) => f,
    };
    let orig_key = key("rope.scaling.original_context_length");
    let original_context = match m.u32(&orig_key)? {
        Some(c) => c,
        None => u32::try_from(max_position).map_err(|_| {
            bad(
                &orig_key,
                format!("absent, and context_length {max_position} does not fit u32"),
            )
        })?,
    };
    let beta_fast = m.f32(&key("rope.scaling.yarn_beta_fast"))?.unwrap_or(32.0);
    let beta_slow = m.f32(&key("rope.scaling.yarn_beta_slow"))?.unwrap_or(1.0);
    // The converter writes HF's `attention_factor` into yarn_attn_factor; without it,
    // HF's default mscale: 0.1·ln(factor) + 1 (1 when factor <= 1).
    let attention_factor = match m.f32(&key("rope.scaling.yarn_attn_factor"))? {
        Some(a) => a,
        None if factor <= 1.0 => 1.0,
        None => (0.1 * f64::from(factor).ln() + 1.0) as f32,
    };
    Ok(Some(Yarn {
        factor,
        original_context,
        beta_fast,
        beta_slow,
        attention_factor,
    }))
}
