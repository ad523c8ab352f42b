//! HF tensor names → GGUF names (spec/laguna.md §8.2), stacking per-expert Linears into one
//! `[E, out, in]` record per projection and splitting the fused `gate_up_proj`.
//!
//! Tensors with names lagoon does not know are kept under their HF name, so `inspect` shows
//! them; they do not stop loading.

use std::collections::BTreeMap;

use super::HfError;
use super::quant::Logical;
use crate::checkpoint::{PartRecord, Span, TensorRecord};

/// An expert projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proj {
    Gate,
    Up,
    Down,
}

impl Proj {
    pub fn name(self) -> &'static str {
        match self {
            Proj::Gate => "gate",
            Proj::Up => "up",
            Proj::Down => "down",
        }
    }

    fn parse(s: &str) -> Option<Proj> {
        match s {
            "gate_proj" => Some(Proj::Gate),
            "up_proj" => Some(Proj::Up),
            "down_proj" => Some(Proj::Down),
            _ => None,
        }
    }

    fn stacked(self, layer: usize) -> String {
        format!("blk.{layer}.ffn_{}_exps.weight", self.name())
    }
}

/// Where an HF tensor goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mapped {
    /// A GGUF name.
    Name(String),
    /// One expert's 2-D projection, to be stacked.
    Expert {
        layer: usize,
        proj: Proj,
        expert: usize,
    },
    /// `mlp.experts.gate_up_proj` `[E, 2I, H]` (gate rows first).
    FusedGateUp { layer: usize },
    /// `mlp.experts.down_proj` `[E, H, I]`.
    FusedDown { layer: usize },
    /// Not a Laguna tensor lagoon knows: kept under its HF name.
    Unknown,
}

/// Removes a multimodal wrapper prefix: `model.language_model.X` → `model.X`,
/// `language_model.X` → `X`.
fn strip_prefix(name: &str) -> std::borrow::Cow<'_, str> {
    if let Some(rest) = name.strip_prefix("model.language_model.") {
        return format!("model.{rest}").into();
    }
    name.strip_prefix("language_model.").unwrap_or(name).into()
}

/// Maps one HF tensor name (`…weight` / `…bias`; the fused expert parameters have no suffix).
pub fn map_name(hf: &str) -> Mapped {
    let name = strip_prefix(hf);
    let name = name.as_ref();
    let simple = match name {
        "lm_head.weight" => Some("output.weight"),
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        _ => None,
    };
    if let Some(s) = simple {
        return Mapped::Name(s.to_string());
    }
    let Some(rest) = name.strip_prefix("model.layers.") else {
        return Mapped::Unknown;
    };
    let Some((n, rest)) = rest.split_once('.') else {
        return Mapped::Unknown;
    };
    let Ok(layer) = n.parse::<usize>() else {
        return Mapped::Unknown;
    };
    if n != layer.to_string() {
        return Mapped::Unknown; // "01", "+1"
    }
    let blk = |s: &str| Mapped::Name(format!("blk.{layer}.{s}"));
    match rest {
        "input_layernorm.weight" => return blk("attn_norm.weight"),
        "post_attention_layernorm.weight" => return blk("ffn_norm.weight"),
        "self_attn.q_proj.weight" => return blk("attn_q.weight"),
        "self_attn.k_proj.weight" => return blk("attn_k.weight"),
        "self_attn.v_proj.weight" => return blk("attn_v.weight"),
        "self_attn.o_proj.weight" => return blk("attn_output.weight"),
        "self_attn.g_proj.weight" => return blk("attn_gate.weight"),
        "self_attn.q_norm.weight" => return blk("attn_q_norm.weight"),
        "self_attn.k_norm.weight" => return blk("attn_k_norm.weight"),
        "mlp.gate_proj.weight" => return blk("ffn_gate.weight"),
        "mlp.up_proj.weight" => return blk("ffn_up.weight"),
        "mlp.down_proj.weight" => return blk("ffn_down.weight"),
        "mlp.gate.weight" => return blk("ffn_gate_inp.weight"),
        "mlp.experts.e_score_correction_bias" | "mlp.gate.e_score_correction_bias" => {
            return blk("exp_probs_b.bias");
        }
        "mlp.experts.gate_up_proj" | "mlp.experts.gate_up_proj.weight" => {
            return Mapped::FusedGateUp { layer };
        }
        "mlp.experts.down_proj" | "mlp.experts.down_proj.weight" => {
            return Mapped::FusedDown { layer };
        }
        _ => {}
    }
    for shared in ["mlp.shared_expert.", "mlp.shared_experts."] {
        if let Some(p) = rest
            .strip_prefix(shared)
            .and_then(|r| r.strip_suffix(".weight"))
            .and_then(Proj::parse)
        {
            return blk(&format!("ffn_{}_shexp.weight", p.name()));
        }
    }
    if let Some(r) = rest.strip_prefix("mlp.experts.")
        && let Some((e, r)) = r.split_once('.')
        && let Ok(expert) = e.parse::<usize>()
        && e == expert.to_string()
        && let Some(proj) = r.strip_suffix(".weight").and_then(Proj::parse)
    {
        return Mapped::Expert {
            layer,
            proj,
            expert,
        };
    }
    Mapped::Unknown
}

/// Rows and columns of a tensor seen as a matrix: 1-D → one row, N-D → all but the last
/// dimension are rows.
fn rows_cols(shape: &[usize]) -> (usize, usize) {
    match shape {
        [] => (1, 1),
        [n] => (1, *n),
        [rest @ .., last] => (rest.iter().product(), *last),
    }
}

/// How two parts compare for stacking: same ggml type, or same compressed-tensors layout.
fn encoding_of(p: &PartRecord) -> String {
    match p {
        PartRecord::Ggml { ty, .. } => ty.name().to_string(),
        PartRecord::Ct(r) => format!("{:?}", r.layout),
    }
}

enum Slot {
    Done(TensorRecord),
    Stack(usize, Proj),
}

/// Normalises names and assembles records, in the order the first tensor of each appears.
/// `n_experts` (from the config, when it has sparse layers) is how many experts a stack
/// must have; without it, the highest index present + 1.
pub fn build(
    logicals: Vec<Logical>,
    n_experts: Option<usize>,
) -> Result<Vec<TensorRecord>, HfError> {
    let mut slots: Vec<Slot> = Vec::new();
    let mut stacks: BTreeMap<(usize, Proj), BTreeMap<usize, Logical>> = BTreeMap::new();
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut claim = |gguf: &str, hf: &str| -> Result<(), HfError> {
        if let Some(first) = seen.insert(gguf.to_string(), hf.to_string()) {
            return Err(HfError::DuplicateTensor {
                tensor: gguf.to_string(),
                first,
                second: hf.to_string(),
            });
        }
        Ok(())
    };
    for l in logicals {
        match map_name(&l.hf_name) {
            Mapped::Name(name) => {
                claim(&name, &l.hf_name)?;
                slots.push(Slot::Done(single(name, l)));
            }
            Mapped::Unknown => {
                let name = l.hf_name.clone();
                claim(&name, &l.hf_name)?;
                slots.push(Slot::Done(single(name, l)));
            }
            Mapped::Expert {
                layer,
                proj,
                expert,
            } => {
                let stack = stacks.entry((layer, proj)).or_default();
                if stack.is_empty() {
                    claim(&proj.stacked(layer), &l.hf_name)?;
                    slots.push(Slot::Stack(layer, proj));
                }
                if let Some(prev) = stack.insert(expert, l) {
                    return Err(HfError::DuplicateTensor {
                        tensor: proj.stacked(layer),
                        first: prev.hf_name.clone(),
                        second: stack[&expert].hf_name.clone(),
                    });
                }
            }
            Mapped::FusedGateUp { layer } => {
                claim(&Proj::Gate.stacked(layer), &l.hf_name)?;
                claim(&Proj::Up.stacked(layer), &l.hf_name)?;
                let (g, u) = fused(layer, &l, true)?;
                slots.push(Slot::Done(g));
                slots.push(Slot::Done(u.ok_or_else(|| unreachable_err(&l))?));
            }
            Mapped::FusedDown { layer } => {
                claim(&Proj::Down.stacked(layer), &l.hf_name)?;
                let (d, _) = fused(layer, &l, false)?;
                slots.push(Slot::Done(d));
            }
        }
    }
    let mut out = Vec::with_capacity(slots.len());
    for s in slots {
        match s {
            Slot::Done(r) => out.push(r),
            Slot::Stack(layer, proj) => {
                let experts = stacks.remove(&(layer, proj)).unwrap_or_default();
                out.push(stack(layer, proj, experts, n_experts)?);
            }
        }
    }
    Ok(out)
}

fn unreachable_err(l: &Logical) -> HfError {
    HfError::BadShape {
        tensor: l.hf_name.clone(),
        expected: "[E, 2·I, H]".into(),
        got: l.shape.clone(),
    }
}

fn single(name: String, l: Logical) -> TensorRecord {
    let (rows, cols) = rows_cols(&l.shape);
    TensorRecord {
        name,
        source_name: l.hf_name,
        shape: l.shape,
        rows,
        cols,
        parts: vec![l.part],
    }
}

/// One `[E, out, in]` record from per-expert 2-D tensors: every expert `0..E` present, all
/// with one shape and one encoding.
fn stack(
    layer: usize,
    proj: Proj,
    experts: BTreeMap<usize, Logical>,
    n_experts: Option<usize>,
) -> Result<TensorRecord, HfError> {
    let highest = experts.keys().next_back().map_or(0, |e| e + 1);
    let n = n_experts.unwrap_or(highest);
    if let Some((&e, l)) = experts.iter().find(|(e, _)| **e >= n) {
        return Err(HfError::UnexpectedExpert {
            tensor: l.hf_name.clone(),
            expert: e,
            n_experts: n,
        });
    }
    if let Some(missing) = (0..n).find(|e| !experts.contains_key(e)) {
        return Err(HfError::MissingExpert {
            layer,
            proj: proj.name(),
            expert: missing,
            n_experts: n,
        });
    }
    let mut it = experts.into_values();
    let first = it.next().ok_or(HfError::MissingExpert {
        layer,
        proj: proj.name(),
        expert: 0,
        n_experts: n,
    })?;
    if first.shape.len() != 2 {
        return Err(HfError::BadShape {
            tensor: first.hf_name.clone(),
            expected: "[out, in]".into(),
            got: first.shape.clone(),
        });
    }
    let enc = encoding_of(&first.part);
    let mut parts = vec![first.part.clone()];
    for l in it {
        if l.shape != first.shape {
            return Err(HfError::ExpertMismatch {
                tensor: l.hf_name.clone(),
                first: first.hf_name.clone(),
                detail: format!("shape {:?} vs {:?}", l.shape, first.shape),
            });
        }
        let e = encoding_of(&l.part);
        if e != enc {
            return Err(HfError::ExpertMismatch {
                tensor: l.hf_name.clone(),
                first: first.hf_name.clone(),
                detail: format!("encoding {e} vs {enc}"),
            });
        }
        parts.push(l.part);
    }
    Ok(TensorRecord {
        name: proj.stacked(layer),
        source_name: first.hf_name,
        shape: vec![n, first.shape[0], first.shape[1]],
        rows: first.shape[0],
        cols: first.shape[1],
        parts,
    })
}

/// Splits a fused `[E, R, C]` plain tensor into per-expert row-range parts: for
/// `gate_up_proj` (`R = 2I`) the gate record (rows `0..I` of each slice) and the up record
/// (rows `I..2I`); for `down_proj` one record.
fn fused(
    layer: usize,
    l: &Logical,
    gate_up: bool,
) -> Result<(TensorRecord, Option<TensorRecord>), HfError> {
    let (ty, span) = match (&l.part, l.dtype) {
        (
            PartRecord::Ggml { ty, span },
            Some(
                super::safetensors::Dtype::F32
                | super::safetensors::Dtype::F16
                | super::safetensors::Dtype::BF16,
            ),
        ) => (*ty, *span),
        _ => {
            return Err(HfError::UnsupportedDtype {
                tensor: l.hf_name.clone(),
                dtype: l
                    .dtype
                    .map_or_else(|| "a quantised encoding".to_string(), |d| d.to_string()),
            });
        }
    };
    let [e, r, c] = l.shape[..] else {
        return Err(HfError::BadShape {
            tensor: l.hf_name.clone(),
            expected: if gate_up { "[E, 2·I, H]" } else { "[E, H, I]" }.into(),
            got: l.shape.clone(),
        });
    };
    if gate_up && r % 2 != 0 {
        return Err(unreachable_err(l));
    }
    let es = ty.block().1;
    let slice = r * c * es;
    let rows = if gate_up { r / 2 } else { r };
    let part_len = rows * c * es;
    let record = |proj: Proj, row0: usize| TensorRecord {
        name: proj.stacked(layer),
        source_name: l.hf_name.clone(),
        shape: vec![e, rows, c],
        rows,
        cols: c,
        parts: (0..e)
            .map(|x| PartRecord::Ggml {
                ty,
                span: Span {
                    file: span.file,
                    start: span.start + x * slice + row0 * c * es,
                    len: part_len,
                },
            })
            .collect(),
    };
    if gate_up {
        Ok((record(Proj::Gate, 0), Some(record(Proj::Up, rows))))
    } else {
        Ok((record(Proj::Down, 0), None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_laguna_names() {
        let n = |s: &str| match map_name(s) {
            Mapped::Name(n) => n,
            other => panic!("{s}: {other:?}"),
        };
        assert_eq!(n("model.embed_tokens.weight"), "token_embd.weight");
        assert_eq!(n("lm_head.weight"), "output.weight");
        assert_eq!(n("language_model.lm_head.weight"), "output.weight");
        assert_eq!(n("model.norm.weight"), "output_norm.weight");
        assert_eq!(
            n("model.layers.7.input_layernorm.weight"),
            "blk.7.attn_norm.weight"
        );
        assert_eq!(
            n("model.language_model.layers.7.self_attn.o_proj.weight"),
            "blk.7.attn_output.weight"
        );
        assert_eq!(
            n("language_model.model.layers.3.self_attn.g_proj.weight"),
            "blk.3.attn_gate.weight"
        );
        assert_eq!(
            n("model.layers.1.mlp.gate.weight"),
            "blk.1.ffn_gate_inp.weight"
        );
        assert_eq!(
            n("model.layers.1.mlp.experts.e_score_correction_bias"),
            "blk.1.exp_probs_b.bias"
        );
        assert_eq!(
            n("model.layers.1.mlp.gate.e_score_correction_bias"),
            "blk.1.exp_probs_b.bias"
        );
        assert_eq!(
            n("model.layers.1.mlp.shared_expert.down_proj.weight"),
            "blk.1.ffn_down_shexp.weight"
        );
        assert_eq!(
            n("model.layers.1.mlp.shared_experts.up_proj.weight"),
            "blk.1.ffn_up_shexp.weight"
        );
        assert_eq!(
            n("model.layers.0.mlp.up_proj.weight"),
            "blk.0.ffn_up.weight"
        );
        assert_eq!(
            map_name("model.layers.2.mlp.experts.13.down_proj.weight"),
            Mapped::Expert {
                layer: 2,
                proj: Proj::Down,
                expert: 13
            }
        );
        assert_eq!(
            map_name("model.layers.2.mlp.experts.gate_up_proj"),
            Mapped::FusedGateUp { layer: 2 }
        );
        assert_eq!(
            map_name("model.layers.2.self_attn.q_proj.bias"),
            Mapped::Unknown
        );
        assert_eq!(
            map_name("model.layers.02.input_layernorm.weight"),
            Mapped::Unknown
        );
        assert_eq!(map_name("model.rotary_emb.inv_freq"), Mapped::Unknown);
    }
}
