//! Checks that a checkpoint holds every tensor the Laguna graph reads, with the shape its
//! config implies and a type lagoon can decode, before anything is allocated for it.

use lagoon_core::config::{MlpKind, ModelConfig};
use lagoon_core::weights::TypeName;

use crate::checkpoint::Checkpoint;
use crate::error::Error;

/// One expected tensor: normalised name and PyTorch-order shape. `gate_rows` marks the
/// attention gate, whose out-features may be per-head (`Hq`) or per-element (`Hq·D`).
pub struct Expected {
    pub name: String,
    pub shape: Vec<usize>,
    pub alt_shape: Option<Vec<usize>>,
    pub optional: bool,
}

/// The tensors of a Laguna model, with their shapes (spec §8.2).
pub fn laguna_tensors(c: &ModelConfig) -> Vec<Expected> {
    let h = c.hidden_size;
    let d = c.head_dim;
    let mut v = Vec::new();
    let mut add = |name: String, shape: Vec<usize>| {
        v.push(Expected {
            name,
            shape,
            alt_shape: None,
            optional: false,
        })
    };
    add("token_embd.weight".into(), vec![c.vocab_size, h]);
    add("output_norm.weight".into(), vec![h]);
    add("output.weight".into(), vec![c.vocab_size, h]);
    for l in 0..c.n_layers {
        let hq = c.n_heads[l];
        let p = |s: &str| format!("blk.{l}.{s}.weight");
        add(p("attn_norm"), vec![h]);
        add(p("attn_q"), vec![hq * d, h]);
        add(p("attn_k"), vec![c.n_kv_heads * d, h]);
        add(p("attn_v"), vec![c.n_kv_heads * d, h]);
        add(p("attn_q_norm"), vec![d]);
        add(p("attn_k_norm"), vec![d]);
        add(p("attn_output"), vec![h, hq * d]);
        add(p("ffn_norm"), vec![h]);
        match c.mlp_types[l] {
            MlpKind::Dense => {
                add(p("ffn_gate"), vec![c.dense_ffn, h]);
                add(p("ffn_up"), vec![c.dense_ffn, h]);
                add(p("ffn_down"), vec![h, c.dense_ffn]);
            }
            MlpKind::Sparse => {
                let (e, i) = (c.n_experts, c.expert_ffn);
                add(p("ffn_gate_inp"), vec![e, h]);
                add(format!("blk.{l}.exp_probs_b.bias"), vec![e]);
                add(p("ffn_gate_exps"), vec![e, i, h]);
                add(p("ffn_up_exps"), vec![e, i, h]);
                add(p("ffn_down_exps"), vec![e, h, i]);
                if c.shared_ffn > 0 {
                    add(p("ffn_gate_shexp"), vec![c.shared_ffn, h]);
                    add(p("ffn_up_shexp"), vec![c.shared_ffn, h]);
                    add(p("ffn_down_shexp"), vec![h, c.shared_ffn]);
                }
            }
        }
    }
    for l in 0..c.n_layers {
        let hq = c.n_heads[l];
        v.push(Expected {
            name: format!("blk.{l}.attn_gate.weight"),
            shape: vec![hq, h],
            alt_shape: Some(vec![hq * d, h]),
            optional: true,
        });
    }
    v
}

/// Fails with a typed error on the first missing, misshapen or undecodable tensor.
pub fn check_laguna(ckpt: &Checkpoint) -> Result<(), Error> {
    for e in laguna_tensors(&ckpt.config) {
        let Some(rec) = ckpt.record(&e.name) else {
            if e.optional {
                continue;
            }
            return Err(Error::MissingTensor { tensor: e.name });
        };
        if rec.shape != e.shape && e.alt_shape.as_ref() != Some(&rec.shape) {
            return Err(Error::WrongShape {
                tensor: e.name,
                expected: e.shape,
                got: rec.shape.clone(),
            });
        }
        let t = ckpt.resolve(rec);
        for p in &t.parts {
            if let TypeName::Ggml(ty) = p.type_name()
                && !lagoon_core::quant::supported(ty)
            {
                return Err(Error::UnsupportedType {
                    tensor: e.name.clone(),
                    ty: ty.name().into(),
                });
            }
        }
    }
    Ok(())
}
