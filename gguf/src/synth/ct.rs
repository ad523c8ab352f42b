//! Streaming compressed-tensors output: a HF checkpoint directory shaped like poolside's
//! INT4 release (spec/laguna.md §9.1–9.2): routed experts W4A16 pack-quantized, group 32,
//! symmetric, BF16 scales — or, for `int8`, W8A8 int-quantized (`I8` weights, one BF16 scale
//! per output channel, dynamic per-token int8 activations: llm-compressor's W8A8 scheme);
//! everything else BF16 (router bias F32); `config.json` with the `quantization_config` and
//! the Laguna-standard ignore list; sharded `model-0000k-of-0000n.safetensors` plus
//! `model.safetensors.index.json`.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use half::bf16;
use lagoon_core::dtype::GgmlType;
use serde_json::{Value, json};

use super::blocks;
use super::mix::Role;
use super::plan::{Init, TensorPlan, plan};
use super::rng::WyRand;
use super::stream::{self, Job};
use super::{Summary, SynthError, SynthOptions};

/// INT4 group size of the release.
pub const GROUP: u64 = 32;
/// RMS of the signed 4-bit values −8..7 (stored nibble − 8) when nibbles are uniform.
const INT4_RMS: f32 = 4.636_809;
/// RMS of uniform signed bytes −128..127: sqrt(Σ k² / 256).
const INT8_RMS: f32 = 73.900_6;

/// How one stored tensor's bytes are drawn.
#[derive(Clone, Debug)]
enum Kind {
    /// BF16 or F32 values.
    Float { ty: GgmlType, init: Init },
    /// `weight_packed` I32 words (8 random nibbles each), or `weight` I8 codes: random bytes.
    Packed,
    /// `weight_scale` BF16: `std / rms` (the codes' RMS), ±10% per group or channel.
    Scale { std: f32, rms: f32 },
    /// `weight_shape` I64 `[out, in]`.
    WeightShape([i64; 2]),
}

#[derive(Clone, Debug)]
struct HfTensor {
    name: String,
    dtype: &'static str,
    /// PyTorch order.
    shape: Vec<u64>,
    kind: Kind,
    unit_bytes: usize,
    n_bytes: u64,
    shard: usize,
    /// Offset inside the shard's data buffer.
    offset: u64,
}

/// The HF module name of a planned tensor (without `.weight`), or for routed experts the
/// prefix before the expert index.
fn hf_module(p: &TensorPlan) -> String {
    let l = p.layer.unwrap_or(0);
    let ly = format!("model.layers.{l}");
    match p.role {
        Role::TokenEmbd => "model.embed_tokens".into(),
        Role::Output => "lm_head".into(),
        Role::OutputNorm => "model.norm".into(),
        Role::AttnNorm => format!("{ly}.input_layernorm"),
        Role::FfnNorm => format!("{ly}.post_attention_layernorm"),
        Role::Q => format!("{ly}.self_attn.q_proj"),
        Role::K => format!("{ly}.self_attn.k_proj"),
        Role::V => format!("{ly}.self_attn.v_proj"),
        Role::O => format!("{ly}.self_attn.o_proj"),
        Role::AttnGate => format!("{ly}.self_attn.g_proj"),
        Role::QNorm => format!("{ly}.self_attn.q_norm"),
        Role::KNorm => format!("{ly}.self_attn.k_norm"),
        Role::DenseGate => format!("{ly}.mlp.gate_proj"),
        Role::DenseUp => format!("{ly}.mlp.up_proj"),
        Role::DenseDown => format!("{ly}.mlp.down_proj"),
        Role::Router => format!("{ly}.mlp.gate"),
        Role::RouterBias => format!("{ly}.mlp.experts.e_score_correction_bias"),
        Role::ExpGate | Role::ExpUp | Role::ExpDown => format!("{ly}.mlp.experts"),
        Role::ShGate => format!("{ly}.mlp.shared_expert.gate_proj"),
        Role::ShUp => format!("{ly}.mlp.shared_expert.up_proj"),
        Role::ShDown => format!("{ly}.mlp.shared_expert.down_proj"),
    }
}

/// Every stored tensor, in file order (routed experts expert by expert).
fn hf_tensors(o: &SynthOptions) -> Result<Vec<HfTensor>, SynthError> {
    let mut v = Vec::new();
    let mut push = |name: String, dtype, shape: Vec<u64>, kind: Kind, unit_bytes: usize| {
        let n_bytes = shape.iter().product::<u64>()
            * match dtype {
                "BF16" => 2,
                "F32" | "I32" => 4,
                "I8" => 1,
                _ => 8,
            };
        v.push(HfTensor {
            name,
            dtype,
            shape,
            kind,
            unit_bytes,
            n_bytes,
            shard: 0,
            offset: 0,
        });
    };
    for p in plan(&o.shape, o.seed, o.router_skew) {
        let module = hf_module(&p);
        let shape: Vec<u64> = p.ne.iter().rev().copied().collect();
        if p.role.is_routed_expert() {
            let proj = match p.role {
                Role::ExpGate => "gate_proj",
                Role::ExpUp => "up_proj",
                _ => "down_proj",
            };
            let (k_in, n_out, n_exp) = (p.ne[0], p.ne[1], p.ne[2]);
            if !k_in.is_multiple_of(GROUP) {
                return Err(SynthError::BadShape {
                    detail: format!(
                        "{}: {k_in} input features are not a multiple of the INT4 group size {GROUP}",
                        p.name
                    ),
                });
            }
            let Init::Normal { std, .. } = p.init else {
                unreachable!("expert weights are drawn, not listed")
            };
            for e in 0..n_exp {
                let m = format!("{module}.{e}.{proj}");
                if o.mix == super::mix::TypeMix::Int8 {
                    push(
                        format!("{m}.weight"),
                        "I8",
                        vec![n_out, k_in],
                        Kind::Packed,
                        1,
                    );
                    let rms = INT8_RMS;
                    let kind = Kind::Scale { std, rms };
                    push(format!("{m}.weight_scale"), "BF16", vec![n_out, 1], kind, 2);
                    continue;
                }
                push(
                    format!("{m}.weight_packed"),
                    "I32",
                    vec![n_out, k_in / 8],
                    Kind::Packed,
                    4,
                );
                push(
                    format!("{m}.weight_scale"),
                    "BF16",
                    vec![n_out, k_in / GROUP],
                    Kind::Scale { std, rms: INT4_RMS },
                    2,
                );
                push(
                    format!("{m}.weight_shape"),
                    "I64",
                    vec![2],
                    Kind::WeightShape([n_out as i64, k_in as i64]),
                    16,
                );
            }
        } else if p.role == Role::RouterBias {
            let ty = GgmlType::F32;
            push(module, "F32", shape, Kind::Float { ty, init: p.init }, 4);
        } else {
            let ty = GgmlType::BF16;
            let kind = Kind::Float { ty, init: p.init };
            push(format!("{module}.weight"), "BF16", shape, kind, 2);
        }
    }
    Ok(v)
}

fn generate(t: &HfTensor, seed: u64, job: &Job, out: &mut [u8]) {
    let mut rng = WyRand::for_chunk(seed, job.tensor as u64, job.chunk);
    match &t.kind {
        Kind::Float {
            ty,
            init: Init::Normal { mean, std },
        } => blocks::fill_floats(*ty, *mean, *std, &mut rng, out),
        Kind::Float {
            ty,
            init: Init::Values(v),
        } => {
            let first = job.first_unit as usize;
            blocks::write_values(*ty, &v[first..first + job.n_units as usize], out)
        }
        Kind::Packed => rng.fill(out),
        Kind::Scale { std, rms } => {
            let s = std / rms;
            for c in out.chunks_exact_mut(2) {
                let jitter = 0.9 + 0.2 * rng.unit();
                c.copy_from_slice(&bf16::from_f32(s * jitter).to_le_bytes());
            }
        }
        Kind::WeightShape([a, b]) => {
            out[..8].copy_from_slice(&a.to_le_bytes());
            out[8..16].copy_from_slice(&b.to_le_bytes());
        }
    }
}

/// The shard file name (`model-00001-of-00003.safetensors`).
pub fn shard_name(k: usize, n: usize) -> String {
    format!("model-{:05}-of-{:05}.safetensors", k + 1, n)
}

/// A safetensors header: JSON padded with spaces to a multiple of 8, after its u64 length.
fn st_header(tensors: &[&HfTensor]) -> Vec<u8> {
    let mut m = serde_json::Map::new();
    m.insert("__metadata__".into(), json!({ "format": "pt" }));
    for t in tensors {
        m.insert(
            t.name.clone(),
            json!({
                "dtype": t.dtype,
                "shape": t.shape,
                "data_offsets": [t.offset, t.offset + t.n_bytes],
            }),
        );
    }
    let mut js = Value::Object(m).to_string().into_bytes();
    js.resize(js.len().next_multiple_of(8), b' ');
    let mut h = (js.len() as u64).to_le_bytes().to_vec();
    h.extend(js);
    h
}

/// config.json for the model, with its `quantization_config`.
pub fn config_json(o: &SynthOptions) -> Value {
    let s = &o.shape;
    let l = s.n_layers;
    let layer_types: Vec<&str> = (0..l)
        .map(|i| {
            if s.is_sliding(i) {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    let mlp_types: Vec<&str> = (0..l)
        .map(|i| if s.is_dense(i) { "dense" } else { "sparse" })
        .collect();
    let partial = s.rope_dims as f64 / s.head_dim as f64;
    let full_rope = match s.yarn {
        Some(y) => json!({
            "rope_type": "yarn",
            "rope_theta": s.rope_theta,
            "factor": y.factor,
            "original_max_position_embeddings": y.original_context,
            "beta_fast": y.beta_fast,
            "beta_slow": y.beta_slow,
            "attention_factor": y.attention_factor,
            "partial_rotary_factor": partial,
        }),
        None => json!({
            "rope_type": "default",
            "rope_theta": s.rope_theta,
            "partial_rotary_factor": partial,
        }),
    };
    let mut rope = serde_json::Map::new();
    rope.insert("full_attention".into(), full_rope);
    let any_sliding = (0..l).any(|i| s.is_sliding(i));
    if any_sliding {
        rope.insert(
            "sliding_attention".into(),
            json!({
                "rope_type": "default",
                "rope_theta": s.rope_theta_swa,
                "partial_rotary_factor": s.rope_dims_swa as f64 / s.head_dim as f64,
            }),
        );
    }
    let dense: Vec<String> = (0..s.n_dense_lead.min(l))
        .flat_map(|i| {
            ["gate_proj", "up_proj", "down_proj"].map(|p| format!("model.layers.{i}.mlp.{p}"))
        })
        .collect();
    let mut ignore = vec![
        json!("lm_head"),
        json!("re:.*\\.self_attn\\.(q|k|v|o|g)_proj$"),
        json!("re:.*\\.mlp\\.gate$"),
    ];
    ignore.extend(dense.into_iter().map(Value::String));
    ignore.push(json!("re:.*\\.mlp\\.shared_expert\\.(gate|up|down)_proj$"));
    let int8 = o.mix == super::mix::TypeMix::Int8;
    let format = if int8 {
        "int-quantized"
    } else {
        "pack-quantized"
    };
    let group = if int8 {
        json!({
            "targets": ["Linear"],
            "weights": {
                "num_bits": 8,
                "type": "int",
                "symmetric": true,
                "group_size": null,
                "strategy": "channel",
                "dynamic": false,
                "actorder": null,
                "observer": "minmax",
            },
            "input_activations": {
                "num_bits": 8,
                "type": "int",
                "symmetric": true,
                "group_size": null,
                "strategy": "token",
                "dynamic": true,
                "actorder": null,
                "observer": null,
            },
            "output_activations": null,
            "format": format,
        })
    } else {
        json!({
            "targets": ["Linear"],
            "weights": {
                "num_bits": 4,
                "type": "int",
                "symmetric": true,
                "group_size": GROUP,
                "strategy": "group",
                "dynamic": false,
                "actorder": null,
                "observer": "minmax",
            },
            "input_activations": null,
            "output_activations": null,
            "format": format,
        })
    };
    let quantization = json!({
        "version": "0.20.0",
        "quant_method": "compressed-tensors",
        "sparsity_config": {},
        "transform_config": {},
        "config_groups": { "group_0": group },
        "kv_cache_scheme": null,
        "format": format,
        "quantization_status": "compressed",
        "global_compression_ratio": null,
        "ignore": ignore,
        "moe_sparsity_config": null,
    });
    let mut config = json!({
        "architectures": ["LagunaForCausalLM"],
        "model_type": "laguna",
        "vocab_size": s.vocab_size,
        "hidden_size": s.hidden,
        "hidden_act": "silu",
        "rms_norm_eps": s.rms_eps,
        "attention_bias": false,
        "tie_word_embeddings": false,
        "bos_token_id": super::tokenizer::BOS,
        "eos_token_id": [super::tokenizer::EOS, super::tokenizer::EOT],
        "pad_token_id": super::tokenizer::PAD,
        "moe_apply_router_weight_on_input": false,
        "moe_router_logit_softcapping": 0.0,
        "router_aux_loss_coef": 0.0,
        "norm_topk_prob": true,
        "torch_dtype": "bfloat16",
        "num_hidden_layers": l,
        "layer_types": layer_types,
        "sliding_window": if any_sliding { json!(s.sliding_window) } else { Value::Null },
        "num_attention_heads": s.n_heads_full,
        "num_attention_heads_per_layer": (0..l).map(|i| s.n_heads(i)).collect::<Vec<_>>(),
        "num_key_value_heads": s.n_kv_heads,
        "head_dim": s.head_dim,
        "gating": if s.gate_per_element { "per-element" } else { "per-head" },
        "intermediate_size": s.dense_ffn,
        "mlp_layer_types": mlp_types,
        "num_experts": s.n_experts,
        "num_experts_per_tok": s.n_experts_used,
        "moe_intermediate_size": s.expert_ffn,
        "shared_expert_intermediate_size": s.shared_ffn,
        "moe_routed_scaling_factor": s.routed_scaling,
        "rope_parameters": Value::Object(rope),
        "max_position_embeddings": s.max_position,
        "lagoon_synth": {
            "preset": o.label,
            "types": o.mix.name(),
            "seed": o.seed,
            "router_skew": o.router_skew,
        },
    });
    config["quantization_config"] = quantization;
    config
}

/// Writes the compressed-tensors directory `o` describes into `dir` (created if needed).
pub fn write(dir: &Path, o: &SynthOptions) -> Result<Summary, SynthError> {
    o.shape.validate()?;
    let t0 = Instant::now();
    let mut tensors = hf_tensors(o)?;

    // Shards: consecutive tensors while the shard stays under the limit.
    let mut shard = 0usize;
    let mut used = 0u64;
    for t in &mut tensors {
        if used > 0 && used + t.n_bytes > o.shard_bytes {
            shard += 1;
            used = 0;
        }
        t.shard = shard;
        t.offset = used;
        used += t.n_bytes;
    }
    let n_shards = shard + 1;

    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SynthError::Io { path, source }
    };
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let paths: Vec<PathBuf> = (0..n_shards)
        .map(|k| dir.join(shard_name(k, n_shards)))
        .collect();
    let headers: Vec<Vec<u8>> = (0..n_shards)
        .map(|k| st_header(&tensors.iter().filter(|t| t.shard == k).collect::<Vec<_>>()))
        .collect();

    let mut jobs = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        stream::chunk_jobs(
            t.shard,
            i,
            t.n_bytes / t.unit_bytes as u64,
            t.unit_bytes,
            0,
            &mut jobs,
        );
    }

    let mut current: Option<(usize, File)> = None;
    let open_shard = |k: usize| -> std::io::Result<File> {
        let mut f = File::create(&paths[k])?;
        f.write_all(&headers[k])?;
        Ok(f)
    };
    let mut failed_path = paths[0].clone();
    let result = stream::run(
        &jobs,
        o.n_threads,
        |job, out| generate(&tensors[job.tensor], o.seed, job, out),
        |job, bytes| {
            if current.as_ref().is_none_or(|(k, _)| *k != job.file) {
                if let Some((_, f)) = current.take()
                    && o.sync
                {
                    f.sync_all()?;
                }
                failed_path = paths[job.file].clone();
                current = Some((job.file, open_shard(job.file)?));
            }
            let (_, f) = current.as_mut().expect("opened above");
            f.write_all(bytes)
        },
    );
    result.map_err(io_err(&failed_path))?;
    if let Some((k, f)) = current.take()
        && o.sync
    {
        f.sync_all().map_err(io_err(&paths[k]))?;
    }

    let total: u64 = tensors.iter().map(|t| t.n_bytes).sum();
    let weight_map: serde_json::Map<String, Value> = tensors
        .iter()
        .map(|t| (t.name.clone(), Value::String(shard_name(t.shard, n_shards))))
        .collect();
    let index = json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
    let index_path = dir.join("model.safetensors.index.json");
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap_or_default() + "\n";
    fs::write(&index_path, pretty(&index)).map_err(io_err(&index_path))?;
    let config_path = dir.join("config.json");
    fs::write(&config_path, pretty(&config_json(o))).map_err(io_err(&config_path))?;

    let mut files = paths;
    files.extend([index_path, config_path]);
    let bytes = files
        .iter()
        .map(|p| fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    Ok(Summary {
        files,
        n_tensors: tensors.len(),
        bytes,
        n_params: o.shape.n_params(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}
