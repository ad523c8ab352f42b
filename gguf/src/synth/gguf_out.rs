//! Streaming GGUF output: the header and tensor infos first (every size follows from the
//! dims and types), then each tensor's bytes chunk by chunk, laid out exactly as
//! [`GgufWriter`] and gguf-py lay them out (tensors in order, each padded to the
//! alignment, the file padded at the end).

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use lagoon_core::dtype::GgmlType;

use super::blocks;
use super::mix::{Role, TypeMix, fit_block};
use super::plan::{Init, TensorPlan, plan};
use super::preset::Shape;
use super::rng::WyRand;
use super::stream::{self, Job};
use super::tokenizer;
use super::{Summary, SynthError, SynthOptions};
use crate::gguf::reader::{align_up, tensor_bytes};
use crate::gguf::value::{Array, Value};
use crate::gguf::writer::GgufWriter;

/// One tensor with its type and place in the data section.
struct Placed {
    plan: TensorPlan,
    ty: GgmlType,
    offset: u64,
    n_bytes: u64,
}

/// The type each planned tensor gets under `mix`.
pub fn tensor_type(p: &TensorPlan, mix: TypeMix, n_layers: usize) -> GgmlType {
    let ty = mix.ggml_type(p.role, p.layer.unwrap_or(0), n_layers);
    fit_block(ty, p.ne[0])
}

/// The `laguna.*`, `general.*` and `tokenizer.*` metadata.
pub fn metadata(o: &SynthOptions) -> Result<GgufWriter, SynthError> {
    let s = &o.shape;
    let mut w = GgufWriter::new();
    let u32v = |x: usize| Value::U32(x as u32);
    let l = s.n_layers;
    let mut kv: Vec<(&str, Value)> = vec![
        ("general.architecture", "laguna".into()),
        ("general.type", "model".into()),
        (
            "general.name",
            Value::Str(format!("laguna-synth-{}-{}", o.label, o.mix.name())),
        ),
        ("laguna.vocab_size", u32v(s.vocab_size)),
        ("laguna.context_length", u32v(s.max_position)),
        ("laguna.embedding_length", u32v(s.hidden)),
        ("laguna.block_count", u32v(l)),
        ("laguna.feed_forward_length", u32v(s.dense_ffn)),
        (
            "laguna.attention.head_count",
            Value::Array(Array::U32((0..l).map(|i| s.n_heads(i) as u32).collect())),
        ),
        ("laguna.attention.head_count_kv", u32v(s.n_kv_heads)),
        ("laguna.attention.key_length", u32v(s.head_dim)),
        ("laguna.attention.value_length", u32v(s.head_dim)),
        (
            "laguna.attention.layer_norm_rms_epsilon",
            Value::F32(s.rms_eps),
        ),
        ("laguna.rope.freq_base", Value::F32(s.rope_theta)),
        ("laguna.rope.dimension_count", u32v(s.rope_dims)),
        ("laguna.expert_count", u32v(s.n_experts)),
        ("laguna.expert_used_count", u32v(s.n_experts_used)),
        ("laguna.expert_feed_forward_length", u32v(s.expert_ffn)),
        (
            "laguna.expert_shared_feed_forward_length",
            u32v(s.shared_ffn),
        ),
        ("laguna.expert_weights_norm", Value::Bool(true)),
        ("laguna.expert_weights_scale", Value::F32(s.routed_scaling)),
        ("laguna.expert_gating_func", Value::U32(2)),
        (
            "laguna.leading_dense_block_count",
            u32v(s.n_dense_lead.min(l)),
        ),
    ];
    if let Some(y) = s.yarn {
        kv.extend([
            ("laguna.rope.scaling.type", "yarn".into()),
            ("laguna.rope.scaling.factor", Value::F32(y.factor)),
            (
                "laguna.rope.scaling.original_context_length",
                Value::U32(y.original_context),
            ),
            (
                "laguna.rope.scaling.yarn_beta_fast",
                Value::F32(y.beta_fast),
            ),
            (
                "laguna.rope.scaling.yarn_beta_slow",
                Value::F32(y.beta_slow),
            ),
            (
                "laguna.rope.scaling.yarn_attn_factor",
                Value::F32(y.attention_factor),
            ),
        ]);
    }
    // A model without sliding layers carries no window key (spec §8.1).
    if (0..l).any(|i| s.is_sliding(i)) {
        kv.extend([
            ("laguna.attention.sliding_window", u32v(s.sliding_window)),
            (
                "laguna.attention.sliding_window_pattern",
                Value::Array(Array::Bool((0..l).map(|i| s.is_sliding(i)).collect())),
            ),
            ("laguna.rope.freq_base_swa", Value::F32(s.rope_theta_swa)),
            ("laguna.rope.dimension_count_swa", u32v(s.rope_dims_swa)),
        ]);
    }
    if let Some(ft) = o.mix.file_type() {
        kv.push(("general.file_type", Value::U32(ft)));
    }
    kv.push(("general.quantization_version", Value::U32(2)));
    let (tokens, types) = tokenizer::vocab(s.vocab_size);
    kv.extend([
        ("tokenizer.ggml.model", "gpt2".into()),
        ("tokenizer.ggml.pre", "laguna".into()),
        ("tokenizer.ggml.tokens", Value::Array(Array::Str(tokens))),
        ("tokenizer.ggml.token_type", Value::Array(Array::I32(types))),
        (
            "tokenizer.ggml.merges",
            Value::Array(Array::Str(Vec::new())),
        ),
        ("tokenizer.ggml.bos_token_id", Value::U32(tokenizer::BOS)),
        ("tokenizer.ggml.eos_token_id", Value::U32(tokenizer::EOS)),
        ("tokenizer.ggml.eot_token_id", Value::U32(tokenizer::EOT)),
        (
            "tokenizer.ggml.unknown_token_id",
            Value::U32(tokenizer::UNK),
        ),
        (
            "tokenizer.ggml.padding_token_id",
            Value::U32(tokenizer::PAD),
        ),
        ("tokenizer.ggml.add_bos_token", Value::Bool(true)),
        ("tokenizer.ggml.add_eos_token", Value::Bool(false)),
        // Provenance, so `inspect` and `bench` can say what they are looking at.
        ("lagoon.synth.preset", Value::Str(o.label.clone())),
        ("lagoon.synth.types", o.mix.name().into()),
        ("lagoon.synth.seed", Value::U64(o.seed)),
        ("lagoon.synth.router_skew", Value::F32(o.router_skew)),
    ]);
    for (k, v) in kv {
        w.add(k, v)?;
    }
    Ok(w)
}

/// The header (magic through the last tensor info, padded to the alignment) for these
/// tensors. Metadata is encoded by [`GgufWriter`]; the tensor-info records follow.
fn header(meta: &GgufWriter, tensors: &[Placed]) -> Vec<u8> {
    let (bytes, layout) = meta.to_bytes_with_layout();
    let kv_end = layout.kvs.last().map_or(layout.kv_count_at + 8, |k| k.end) as usize;
    let mut h = bytes[..kv_end].to_vec();
    let at = layout.tensor_count_at as usize;
    h[at..at + 8].copy_from_slice(&(tensors.len() as u64).to_le_bytes());
    for t in tensors {
        h.extend((t.plan.name.len() as u64).to_le_bytes());
        h.extend(t.plan.name.as_bytes());
        h.extend((t.plan.ne.len() as u32).to_le_bytes());
        for &d in &t.plan.ne {
            h.extend(d.to_le_bytes());
        }
        h.extend((t.ty as u32).to_le_bytes());
        h.extend(t.offset.to_le_bytes());
    }
    let a = meta.alignment();
    h.resize(align_up(h.len() as u64, a).unwrap_or(0) as usize, 0);
    h
}

/// Generates the bytes of chunk `job` of tensor `t`.
fn generate(t: &Placed, seed: u64, job: &Job, out: &mut [u8]) {
    let mut rng = WyRand::for_chunk(seed, job.tensor as u64, job.chunk);
    match &t.plan.init {
        Init::Normal { mean, std } if *mean == 0.0 => {
            blocks::fill_blocks(t.ty, *std, &mut rng, out)
        }
        Init::Normal { mean, std } => blocks::fill_floats(t.ty, *mean, *std, &mut rng, out),
        Init::Values(v) => {
            let first = job.first_unit as usize;
            blocks::write_values(t.ty, &v[first..first + job.n_units as usize], out)
        }
    }
}

/// Writes the GGUF checkpoint `o` describes to `path`.
pub fn write(path: &Path, o: &SynthOptions) -> Result<Summary, SynthError> {
    o.shape.validate()?;
    let t0 = Instant::now();
    let meta = metadata(o)?;
    let a = meta.alignment();
    let tensors = place(&o.shape, o, a)?;
    let head = header(&meta, &tensors);

    let mut jobs = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        let (_, bb) = t.ty.block();
        let pad = (align_up(t.n_bytes, a).unwrap_or(0) - t.n_bytes) as usize;
        stream::chunk_jobs(0, i, t.n_bytes / bb as u64, bb, pad, &mut jobs);
    }

    let io_err = |source| SynthError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = File::create(path).map_err(io_err)?;
    f.write_all(&head).map_err(io_err)?;
    let zeros = vec![0u8; a as usize];
    stream::run(
        &jobs,
        o.n_threads,
        |job, out| generate(&tensors[job.tensor], o.seed, job, out),
        |job, bytes| {
            f.write_all(bytes)?;
            f.write_all(&zeros[..job.pad_after])
        },
    )
    .map_err(io_err)?;
    if o.sync {
        f.sync_all().map_err(io_err)?;
    }
    let bytes = head.len() as u64
        + tensors
            .iter()
            .map(|t| align_up(t.n_bytes, a).unwrap_or(0))
            .sum::<u64>();
    Ok(Summary {
        files: vec![path.to_path_buf()],
        n_tensors: tensors.len(),
        bytes,
        n_params: o.shape.n_params(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Types, sizes and data offsets of every tensor.
fn place(s: &Shape, o: &SynthOptions, alignment: u64) -> Result<Vec<Placed>, SynthError> {
    let mut offset = 0u64;
    let mut out = Vec::new();
    for p in plan(s, o.seed, o.router_skew) {
        let ty = tensor_type(&p, o.mix, s.n_layers);
        if !blocks::supported(ty) {
            return Err(SynthError::UnsupportedType {
                tensor: p.name,
                ty: ty.name(),
            });
        }
        if let Init::Normal { mean, .. } = p.init
            && mean != 0.0
            && !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
        {
            return Err(SynthError::UnsupportedType {
                tensor: p.name,
                ty: ty.name(),
            });
        }
        let n_bytes = tensor_bytes(&p.name, ty, &p.ne)?;
        let placed = Placed {
            plan: p,
            ty,
            offset,
            n_bytes,
        };
        offset += align_up(n_bytes, alignment).unwrap_or(0);
        out.push(placed);
    }
    debug_assert!(
        out.iter()
            .all(|t| t.plan.role != Role::Router || t.ty == GgmlType::F32)
    );
    Ok(out)
}
