//! The Laguna model configuration, format-neutral.
//!
//! Both checkpoint formats (GGUF metadata, HF `config.json`) are parsed into this one struct
//! by `lagoon-gguf`; [`ModelConfig::validate`] then checks everything the forward pass relies
//! on, so that nothing downstream has to.

use alloc::string::String;
use alloc::vec::Vec;

/// Attention kind of one layer (`layer_types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnKind {
    /// Causal attention over the whole context, YaRN RoPE (if configured).
    Full,
    /// Causal attention over the last `sliding_window` positions, plain RoPE.
    Sliding,
}

/// Feed-forward kind of one layer (`mlp_layer_types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlpKind {
    Dense,
    Sparse,
}

/// YaRN parameters (transformers `_compute_yarn_parameters`, spec §3.4).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f32,
    pub original_context: u32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// Magnitude multiplying cos and sin. `attention_factor` when the checkpoint gives it,
    /// else `0.1·ln(factor) + 1`.
    pub attention_factor: f32,
}

/// RoPE of one layer kind. NeoX (rotate-half) pairing on the first `rotary_dim` dims.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    pub theta: f32,
    /// Number of leading head dims that rotate (`head_dim · partial_rotary_factor`).
    pub rotary_dim: usize,
    pub yarn: Option<Yarn>,
}

/// Everything the Laguna forward pass needs to know about a checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub n_layers: usize,
    /// Query heads per layer (`num_attention_heads_per_layer`).
    pub n_heads: Vec<usize>,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub layer_types: Vec<AttnKind>,
    pub mlp_types: Vec<MlpKind>,
    /// Keys visible to a sliding layer: positions `p - W < j <= p`. 0 when no layer slides.
    pub sliding_window: usize,
    /// Width of the dense FFN (`intermediate_size`).
    pub dense_ffn: usize,
    pub n_experts: usize,
    pub n_experts_used: usize,
    pub expert_ffn: usize,
    /// Width of the shared expert; 0 when there is none.
    pub shared_ffn: usize,
    pub routed_scaling: f32,
    pub norm_topk_prob: bool,
    pub rms_eps: f32,
    pub rope_full: Rope,
    pub rope_sliding: Rope,
    pub max_position: usize,
    pub bos_token: Option<u32>,
    pub eos_tokens: Vec<u32>,
}

/// A configuration value that the forward pass cannot run with.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigError {
    /// The key (HF spelling) that is wrong.
    pub key: &'static str,
    /// What was found and what was expected.
    pub detail: String,
}

impl core::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "invalid model config `{}`: {}", self.key, self.detail)
    }
}

impl ModelConfig {
    /// Layer `l` is a sliding-window layer.
    pub fn is_sliding(&self, l: usize) -> bool {
        self.layer_types[l] == AttnKind::Sliding
    }

    /// RoPE parameters for layer `l`.
    pub fn rope(&self, l: usize) -> &Rope {
        match self.layer_types[l] {
            AttnKind::Full => &self.rope_full,
            AttnKind::Sliding => &self.rope_sliding,
        }
    }

    /// Largest query-head count of any layer.
    pub fn max_heads(&self) -> usize {
        self.n_heads.iter().copied().max().unwrap_or(0)
    }

    /// Checks the invariants the forward pass relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn err(key: &'static str, detail: String) -> Result<(), ConfigError> {
            Err(ConfigError { key, detail })
        }
        let l = self.n_layers;
        if l == 0 {
            return err("num_hidden_layers", "must be at least 1".into());
        }
        if self.hidden_size == 0 || self.vocab_size == 0 || self.head_dim == 0 {
            return err(
                "hidden_size",
                alloc::format!(
                    "hidden_size {}, vocab_size {}, head_dim {} must all be non-zero",
                    self.hidden_size,
                    self.vocab_size,
                    self.head_dim
                ),
            );
        }
        if !self.head_dim.is_multiple_of(2) {
            return err(
                "head_dim",
                alloc::format!("{} must be even for RoPE", self.head_dim),
            );
        }
        for (key, len) in [
            ("num_attention_heads_per_layer", self.n_heads.len()),
            ("layer_types", self.layer_types.len()),
            ("mlp_layer_types", self.mlp_types.len()),
        ] {
            if len != l {
                return err(
                    key,
                    alloc::format!("has {len} entries, expected one per layer ({l})"),
                );
            }
        }
        if self.n_kv_heads == 0 {
            return err("num_key_value_heads", "must be at least 1".into());
        }
        for (i, &h) in self.n_heads.iter().enumerate() {
            if h == 0 || !h.is_multiple_of(self.n_kv_heads) {
                return err(
                    "num_attention_heads_per_layer",
                    alloc::format!(
                        "layer {i} has {h} query heads, not a non-zero multiple of the {} KV heads",
                        self.n_kv_heads
                    ),
                );
            }
        }
        if self.layer_types.contains(&AttnKind::Sliding) && self.sliding_window == 0 {
            return err(
                "sliding_window",
                "a layer slides but the window is 0".into(),
            );
        }
        if self.mlp_types.contains(&MlpKind::Dense) && self.dense_ffn == 0 {
            return err(
                "intermediate_size",
                "a layer is dense but its width is 0".into(),
            );
        }
        if self.mlp_types.contains(&MlpKind::Sparse) {
            if self.n_experts == 0 || self.expert_ffn == 0 {
                return err(
                    "num_experts",
                    alloc::format!(
                        "a layer is sparse but num_experts = {} and moe_intermediate_size = {}",
                        self.n_experts,
                        self.expert_ffn
                    ),
                );
            }
            if self.n_experts_used == 0 || self.n_experts_used > self.n_experts {
                return err(
                    "num_experts_per_tok",
                    alloc::format!(
                        "{} is not in 1..={} (num_experts)",
                        self.n_experts_used,
                        self.n_experts
                    ),
                );
            }
        }
        for (key, r) in [
            ("rope_parameters.full_attention", &self.rope_full),
            ("rope_parameters.sliding_attention", &self.rope_sliding),
        ] {
            if r.rotary_dim == 0 || r.rotary_dim > self.head_dim || !r.rotary_dim.is_multiple_of(2)
            {
                return err(
                    key,
                    alloc::format!(
                        "rotary dim {} must be even and in 2..={} (head_dim)",
                        r.rotary_dim,
                        self.head_dim
                    ),
                );
            }
            if !(r.theta.is_finite() && r.theta > 1.0) {
                return err(
                    key,
                    alloc::format!("rope_theta {} must be finite and > 1", r.theta),
                );
            }
            if let Some(y) = r.yarn {
                if !(y.factor.is_finite() && y.factor >= 1.0) || y.original_context == 0 {
                    return err(
                        key,
                        alloc::format!(
                            "yarn factor {} must be >= 1 and original_max_position_embeddings {} > 0",
                            y.factor,
                            y.original_context
                        ),
                    );
                }
                if !(y.attention_factor.is_finite()
                    && y.beta_fast.is_finite()
                    && y.beta_slow.is_finite())
                {
                    return err(
                        key,
                        "yarn attention_factor/beta values must be finite".into(),
                    );
                }
            }
        }
        if !(self.rms_eps.is_finite() && self.rms_eps >= 0.0) {
            return err(
                "rms_norm_eps",
                alloc::format!("{} must be finite and >= 0", self.rms_eps),
            );
        }
        if !self.routed_scaling.is_finite() {
            return err("moe_routed_scaling_factor", "must be finite".into());
        }
        Ok(())
    }
}
