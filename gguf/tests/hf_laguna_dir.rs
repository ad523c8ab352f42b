//! Whole HF directories through `Checkpoint::open`: the tiny Laguna written by transformers'
//! own `save_pretrained`, and directories built here with per-expert, fused, prefixed and
//! compressed-tensors experts, plus the errors a broken directory must give.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use lagoon_core::quant::ct::CtKind;
use lagoon_core::weights::{Encoding, TypeName};
use lagoon_gguf::hf::HfError;
use lagoon_gguf::hf::safetensors::{self, Dtype, serialize};
use lagoon_gguf::{Checkpoint, Error};
use serde_json::{Value, json};

fn tempdir(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "lagoon-hf-dir-{}-{tag}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn row(ckpt: &Checkpoint, name: &str, part: usize, r: usize) -> Vec<f32> {
    let t = ckpt.tensor(name).unwrap();
    let m = &t.parts[part];
    let mut out = vec![f32::NAN; m.cols];
    m.dequant_row(r, &mut out);
    out
}

#[test]
fn transformers_save_pretrained_directory() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/tiny_laguna");
    let ckpt = Checkpoint::open(&dir).unwrap();
    let c = &ckpt.config;
    assert_eq!((c.n_layers, c.n_experts), (3, 4));
    let gate = ckpt.record("blk.1.ffn_gate_exps.weight").unwrap();
    assert_eq!(gate.shape, vec![4, 16, 32]);
    assert_eq!(gate.parts.len(), 4);
    assert_eq!(
        gate.source_name,
        "model.layers.1.mlp.experts.0.gate_proj.weight"
    );
    assert_eq!(
        ckpt.record("blk.2.ffn_down_exps.weight").unwrap().shape,
        vec![4, 32, 16]
    );
    assert_eq!(
        ckpt.record("blk.1.attn_gate.weight").unwrap().shape,
        vec![6, 32]
    );
    assert_eq!(
        ckpt.record("blk.1.exp_probs_b.bias").unwrap().shape,
        vec![4]
    );
    assert_eq!(
        ckpt.record("blk.1.ffn_up_shexp.weight").unwrap().shape,
        vec![8, 32]
    );
    assert_eq!(
        ckpt.record("blk.0.ffn_down.weight").unwrap().shape,
        vec![32, 48]
    );
    assert!(ckpt.record("blk.0.ffn_gate_inp.weight").is_none());

    // Expert 2's rows are exactly that expert's tensor in the file.
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let h = safetensors::parse("model.safetensors", &bytes).unwrap();
    let t = h
        .tensors
        .iter()
        .find(|t| t.name == "model.layers.2.mlp.experts.2.up_proj.weight")
        .unwrap();
    assert_eq!(t.dtype, Dtype::BF16);
    let want: Vec<f32> = bytes[t.start..t.start + t.len]
        .chunks_exact(2)
        .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
        .collect();
    for r in 0..16 {
        assert_eq!(
            row(&ckpt, "blk.2.ffn_up_exps.weight", 2, r),
            want[r * 32..(r + 1) * 32]
        );
    }
    assert!(want.iter().any(|&x| x != 0.0));
}

/// A small Laguna: 2 layers (dense, sparse), H 8, 2 heads of 4 (1 KV head), 4 experts of
/// width 4, shared expert 4, vocab 16.
const H: usize = 8;
const E: usize = 4;
const I: usize = 4;

fn config(extra: Value) -> Value {
    let mut v = json!({
        "architectures": ["LagunaForCausalLM"], "model_type": "laguna",
        "vocab_size": 16, "hidden_size": H, "intermediate_size": 8, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
        "num_experts": E, "num_experts_per_tok": 2, "moe_intermediate_size": I,
        "shared_expert_intermediate_size": 4, "moe_routed_scaling_factor": 2.5,
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5}},
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

/// Deterministic non-zero values, exactly representable in bf16.
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = ((i * 2654435761 + seed * 40503) % 1999) as f32 / 1000.0 - 0.9995;
            half::bf16::from_f32(x).to_f32()
        })
        .collect()
}

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
        .collect()
}

type Tensors = Vec<(String, Dtype, Vec<usize>, Vec<u8>)>;

fn push(t: &mut Tensors, name: &str, shape: &[usize], seed: usize) {
    let v = values(shape.iter().product(), seed);
    t.push((
        name.to_string(),
        Dtype::BF16,
        shape.to_vec(),
        bf16_bytes(&v),
    ));
}

/// Everything except the routed experts.
fn base_tensors(prefix: &str) -> Tensors {
    let mut t = Tensors::new();
    let p = |s: &str| format!("{prefix}{s}");
    push(&mut t, &p("model.embed_tokens.weight"), &[16, H], 1);
    push(&mut t, &p("model.norm.weight"), &[H], 2);
    push(&mut t, &p("lm_head.weight"), &[16, H], 3);
    for l in 0..2 {
        let b = |s: &str| p(&format!("model.layers.{l}.{s}"));
        push(&mut t, &b("input_layernorm.weight"), &[H], 10 + l);
        push(&mut t, &b("post_attention_layernorm.weight"), &[H], 12 + l);
        push(&mut t, &b("self_attn.q_proj.weight"), &[8, H], 14 + l);
        push(&mut t, &b("self_attn.k_proj.weight"), &[4, H], 16 + l);
        push(&mut t, &b("self_attn.v_proj.weight"), &[4, H], 18 + l);
        push(&mut t, &b("self_attn.o_proj.weight"), &[H, 8], 20 + l);
        push(&mut t, &b("self_attn.g_proj.weight"), &[2, H], 22 + l);
        push(&mut t, &b("self_attn.q_norm.weight"), &[4], 24 + l);
        push(&mut t, &b("self_attn.k_norm.weight"), &[4], 26 + l);
    }
    let b = |s: &str| p(&format!("model.layers.0.mlp.{s}"));
    push(&mut t, &b("gate_proj.weight"), &[8, H], 30);
    push(&mut t, &b("up_proj.weight"), &[8, H], 31);
    push(&mut t, &b("down_proj.weight"), &[H, 8], 32);
    let b = |s: &str| p(&format!("model.layers.1.mlp.{s}"));
    push(&mut t, &b("gate.weight"), &[E, H], 33);
    let bias = values(E, 34);
    t.push((
        b("experts.e_score_correction_bias"),
        Dtype::F32,
        vec![E],
        bias.iter().flat_map(|x| x.to_le_bytes()).collect(),
    ));
    push(&mut t, &b("shared_expert.gate_proj.weight"), &[4, H], 35);
    push(&mut t, &b("shared_expert.up_proj.weight"), &[4, H], 36);
    push(&mut t, &b("shared_expert.down_proj.weight"), &[H, 4], 37);
    t
}

fn expert_seed(e: usize, proj: &str) -> usize {
    100 + 3 * e
        + ["gate", "up", "down"]
            .iter()
            .position(|p| *p == proj)
            .unwrap()
}

fn per_expert(t: &mut Tensors, prefix: &str) {
    for e in 0..E {
        for (proj, shape) in [("gate", [I, H]), ("up", [I, H]), ("down", [H, I])] {
            push(
                t,
                &format!("{prefix}model.layers.1.mlp.experts.{e}.{proj}_proj.weight"),
                &shape,
                expert_seed(e, proj),
            );
        }
    }
}

fn write(dir: &Path, cfg: &Value, t: &Tensors) {
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let refs: Vec<(&str, Dtype, &[usize], &[u8])> = t
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), b.as_slice()))
        .collect();
    std::fs::write(
        dir.join("model.safetensors"),
        serialize(&refs, &[("format", "pt")]),
    )
    .unwrap();
}

fn open(tag: &str, cfg: Value, t: &Tensors) -> Result<Checkpoint, Error> {
    let d = tempdir(tag);
    write(&d, &cfg, t);
    let r = Checkpoint::open(&d);
    std::fs::remove_dir_all(&d).unwrap();
    r
}

fn expert_rows(e: usize, proj: &str) -> Vec<f32> {
    values(I * H, expert_seed(e, proj))
}

#[test]
fn per_expert_directory_stacks_experts_and_keeps_extras() {
    let mut t = base_tensors("");
    per_expert(&mut t, "");
    // Unknown extras are kept under their HF name.
    t.push((
        "model.rotary_emb.inv_freq".into(),
        Dtype::F32,
        vec![2],
        [1f32, 0.5].iter().flat_map(|x| x.to_le_bytes()).collect(),
    ));
    let ckpt = open("per-expert", config(json!({})), &t).unwrap();
    for e in 0..E {
        let want = expert_rows(e, "down");
        for r in 0..H {
            assert_eq!(
                row(&ckpt, "blk.1.ffn_down_exps.weight", e, r),
                want[r * I..(r + 1) * I]
            );
        }
    }
    assert_eq!(
        ckpt.record("blk.1.ffn_gate_exps.weight").unwrap().shape,
        vec![E, I, H]
    );
    assert!(ckpt.record("model.rotary_emb.inv_freq").is_some());
    assert_eq!(ckpt.config.routed_scaling, 2.5);
}

#[test]
fn fused_gate_up_and_prefixed_names() {
    for prefix in ["language_model.", "model.language_model."] {
        let mut t = base_tensors("");
        // Re-prefix every name the way multimodal exports do.
        for x in &mut t {
            // `model.language_model.X` (transformers 5 multimodal) keeps `lm_head` on top;
            // `language_model.` (older wrappers) prefixes everything.
            x.0 = match x.0.strip_prefix("model.") {
                Some(rest) if prefix == "model.language_model." => format!("{prefix}{rest}"),
                None if prefix == "model.language_model." => x.0.clone(),
                _ => format!("{prefix}{}", x.0),
            };
        }
        let layer = if prefix == "model.language_model." {
            "model.language_model.layers.1"
        } else {
            "language_model.model.layers.1"
        };
        // gate_up [E, 2I, H]: per expert, gate rows then up rows.
        let mut gu = Vec::new();
        let mut down = Vec::new();
        for e in 0..E {
            gu.extend(expert_rows(e, "gate"));
            gu.extend(expert_rows(e, "up"));
            down.extend(expert_rows(e, "down"));
        }
        t.push((
            format!("{layer}.mlp.experts.gate_up_proj"),
            Dtype::BF16,
            vec![E, 2 * I, H],
            bf16_bytes(&gu),
        ));
        t.push((
            format!("{layer}.mlp.experts.down_proj"),
            Dtype::BF16,
            vec![E, H, I],
            bf16_bytes(&down),
        ));
        let ckpt = open("fused", config(json!({})), &t).unwrap();
        for e in 0..E {
            for (name, proj, rows, cols) in [
                ("blk.1.ffn_gate_exps.weight", "gate", I, H),
                ("blk.1.ffn_up_exps.weight", "up", I, H),
                ("blk.1.ffn_down_exps.weight", "down", H, I),
            ] {
                let want = expert_rows(e, proj);
                for r in 0..rows {
                    assert_eq!(
                        row(&ckpt, name, e, r),
                        want[r * cols..(r + 1) * cols],
                        "{prefix} {name} e{e} r{r}"
                    );
                }
            }
        }
        assert_eq!(
            ckpt.record("blk.1.ffn_up_exps.weight").unwrap().shape,
            vec![E, I, H]
        );
        assert!(ckpt.record("output.weight").is_some());
    }
}

#[test]
fn tied_embeddings_supply_the_output_head() {
    let mut t = base_tensors("");
    per_expert(&mut t, "");
    t.retain(|x| x.0 != "lm_head.weight");
    let e = open("untied", config(json!({})), &t).unwrap_err();
    assert!(
        matches!(&e, Error::MissingTensor { tensor } if tensor == "output.weight"),
        "{e:?}"
    );
    let ckpt = open("tied", config(json!({"tie_word_embeddings": true})), &t).unwrap();
    assert_eq!(
        row(&ckpt, "output.weight", 0, 3),
        row(&ckpt, "token_embd.weight", 0, 3)
    );
}

#[test]
fn missing_and_mismatched_experts() {
    let mut t = base_tensors("");
    per_expert(&mut t, "");
    let mut missing = t.clone();
    missing.retain(|x| x.0 != "model.layers.1.mlp.experts.2.down_proj.weight");
    let e = open("missing", config(json!({})), &missing).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Hf(HfError::MissingExpert {
                layer: 1,
                proj: "down",
                expert: 2,
                n_experts: 4
            })
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("expert 2"), "{e}");

    let mut extra = t.clone();
    push(
        &mut extra,
        "model.layers.1.mlp.experts.4.up_proj.weight",
        &[I, H],
        7,
    );
    let e = open("extra", config(json!({})), &extra).unwrap_err();
    assert!(
        matches!(&e, Error::Hf(HfError::UnexpectedExpert { expert: 4, .. })),
        "{e:?}"
    );

    let mut mixed = t.clone();
    let x = mixed
        .iter_mut()
        .find(|x| x.0 == "model.layers.1.mlp.experts.3.gate_proj.weight")
        .unwrap();
    x.1 = Dtype::F16;
    let e = open("mixed", config(json!({})), &mixed).unwrap_err();
    assert!(
        matches!(&e, Error::Hf(HfError::ExpertMismatch { tensor, .. }) if tensor.contains("experts.3.gate_proj")),
        "{e:?}"
    );

    let mut dup = t.clone();
    push(
        &mut dup,
        "model.layers.1.mlp.experts.gate_up_proj",
        &[E, 2 * I, H],
        8,
    );
    let e = open("dup", config(json!({})), &dup).unwrap_err();
    assert!(
        matches!(&e, Error::Hf(HfError::DuplicateTensor { .. })),
        "{e:?}"
    );
}

/// Packs signed int4 codes of one row per spec formats §7.3: +8, column c in word c/8 at bits
/// 4·(c%8), rows zero-padded to whole words.
fn pack_int4(q: &[i8], cols: usize) -> Vec<u8> {
    let words = cols.div_ceil(8);
    let mut out = Vec::new();
    for r in q.chunks(cols) {
        let mut w = vec![0u32; words];
        for (c, &x) in r.iter().enumerate() {
            w[c / 8] |= ((x + 8) as u32) << (4 * (c % 8));
        }
        out.extend(w.iter().flat_map(|x| x.to_le_bytes()));
    }
    out
}

/// Routed experts as compressed-tensors int4 group-4 symmetric (pack-quantized), the rest
/// BF16, with the Laguna-style ignore list. Returns the tensors and each expert projection's
/// expected rows.
fn ct_experts(t: &mut Tensors) -> Vec<((usize, &'static str), Vec<f32>)> {
    let mut expected = Vec::new();
    for e in 0..E {
        for (proj, rows, cols) in [("gate", I, H), ("up", I, H), ("down", H, I)] {
            let p = format!("model.layers.1.mlp.experts.{e}.{proj}_proj");
            let n = rows * cols;
            let q: Vec<i8> = (0..n)
                .map(|i| ((i * 7 + e * 3 + proj.len()) % 16) as i8 - 8)
                .collect();
            let g = 4;
            let scales: Vec<f32> = (0..rows * cols / g)
                .map(|i| half::bf16::from_f32(0.01 + 0.003 * (i + e) as f32).to_f32())
                .collect();
            let want: Vec<f32> = (0..n)
                .map(|i| {
                    let (r, c) = (i / cols, i % cols);
                    half::bf16::from_f32(q[i] as f32 * scales[r * (cols / g) + c / g]).to_f32()
                })
                .collect();
            t.push((
                format!("{p}.weight_packed"),
                Dtype::I32,
                vec![rows, cols.div_ceil(8)],
                pack_int4(&q, cols),
            ));
            t.push((
                format!("{p}.weight_scale"),
                Dtype::BF16,
                vec![rows, cols / g],
                bf16_bytes(&scales),
            ));
            t.push((
                format!("{p}.weight_shape"),
                Dtype::I64,
                vec![2],
                [rows as i64, cols as i64]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
            ));
            expected.push(((e, proj), want));
        }
    }
    expected
}

fn ct_config(extra: Value) -> Value {
    let mut q = json!({
        "quant_method": "compressed-tensors", "version": "0.20.0", "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "format": "pack-quantized",
            "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group",
                "group_size": 4, "dynamic": false}, "input_activations": null}},
        "ignore": ["lm_head", "re:.*\\.self_attn\\.(q|k|v|o|g)_proj$", "re:.*\\.mlp\\.gate$",
            "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj",
            "model.layers.0.mlp.down_proj", "re:.*\\.mlp\\.shared_expert\\.(gate|up|down)_proj$"],
        "sparsity_config": {}, "transform_config": {},
    });
    for (k, x) in extra.as_object().unwrap() {
        q[k] = x.clone();
    }
    config(json!({ "quantization_config": q }))
}

#[test]
fn compressed_tensors_experts() {
    let mut t = base_tensors("");
    let expected = ct_experts(&mut t);
    let ckpt = open("ct", ct_config(json!({})), &t).unwrap();
    let rec = ckpt.record("blk.1.ffn_down_exps.weight").unwrap();
    assert_eq!(rec.shape, vec![E, H, I]);
    let tensor = ckpt.tensor("blk.1.ffn_down_exps.weight").unwrap();
    assert!(matches!(
        tensor.parts[0].type_name(),
        TypeName::Ct(CtKind::PackedInt {
            bits: 4,
            group: 4,
            symmetric: true,
            ..
        })
    ));
    assert_eq!(tensor.parts[0].type_name().to_string(), "ct-int4-g4");
    for ((e, proj), want) in &expected {
        let (name, rows, cols) = match *proj {
            "down" => ("blk.1.ffn_down_exps.weight", H, I),
            p => (
                if p == "gate" {
                    "blk.1.ffn_gate_exps.weight"
                } else {
                    "blk.1.ffn_up_exps.weight"
                },
                I,
                H,
            ),
        };
        for r in 0..rows {
            assert_eq!(
                row(&ckpt, name, *e, r),
                want[r * cols..(r + 1) * cols],
                "{name} e{e} r{r}"
            );
        }
    }
    // Attention, router and shared expert stay BF16.
    let q = ckpt.tensor("blk.1.attn_q.weight").unwrap();
    assert!(matches!(q.parts[0].enc, Encoding::Ggml { .. }));
}

#[test]
fn compressed_tensors_refusals() {
    let mut t = base_tensors("");
    ct_experts(&mut t);

    // An online (activation) rotation.
    let tc = json!({"config_groups": {"R1": {"type": "hadamard", "head_dim": 128,
        "apply": [{"targets": ["re:.*mlp.experts.*down_proj$"], "location": "weight_input"},
                  {"targets": ["re:.*mlp.experts.*down_proj$"], "location": "input", "inverse": true}]}}});
    let e = open("online", ct_config(json!({"transform_config": tc})), &t).unwrap_err();
    assert!(
        matches!(&e, Error::Hf(HfError::OnlineTransform { group, location, .. }) if group == "R1" && location == "input"),
        "{e:?}"
    );
    assert!(e.to_string().contains("inference time"), "{e}");
    // Weight-only transforms were folded in offline: fine.
    let tc = json!({"config_groups": {"R1": {"type": "hadamard",
        "apply": [{"targets": ["Linear"], "location": "weight_input"},
                  {"targets": ["Linear"], "location": "weight_output", "inverse": true}]}}});
    open("offline", ct_config(json!({"transform_config": tc})), &t).unwrap();

    // A group whose format has no decoder, named with the module.
    let mut cfg = ct_config(json!({}));
    cfg["quantization_config"]["config_groups"]["group_0"]["format"] =
        json!("nvfp4-pack-quantized");
    let e = open("nvfp4-cfg", cfg, &t).unwrap_err();
    assert!(
        matches!(&e, Error::Hf(HfError::UnsupportedFormat { format, module }) if format == "nvfp4-pack-quantized" && module.starts_with("model.layers.1.mlp.experts.")),
        "{e:?}"
    );

    // NVFP4 tensors (U8 packed + global scale), whatever the config says.
    let mut nv = base_tensors("");
    per_expert(&mut nv, "");
    nv.retain(|x| x.0 != "model.layers.1.mlp.experts.0.up_proj.weight");
    nv.push((
        "model.layers.1.mlp.experts.0.up_proj.weight_packed".into(),
        Dtype::U8,
        vec![I, H / 2],
        vec![0x21; I * H / 2],
    ));
    nv.push((
        "model.layers.1.mlp.experts.0.up_proj.weight_scale".into(),
        Dtype::F8E4M3,
        vec![I, 1],
        vec![0x38; I],
    ));
    nv.push((
        "model.layers.1.mlp.experts.0.up_proj.weight_global_scale".into(),
        Dtype::F32,
        vec![1],
        1f32.to_le_bytes().to_vec(),
    ));
    let e = open("nvfp4", config(json!({})), &nv).unwrap_err();
    assert!(
        matches!(&e, Error::Hf(HfError::UnsupportedFormat { format, module }) if format == "nvfp4-pack-quantized" && module == "model.layers.1.mlp.experts.0.up_proj"),
        "{e:?}"
    );

    // A sparse format.
    let e = open(
        "sparse",
        ct_config(
            json!({"sparsity_config": {"format": "sparse-24-bitmask", "targets": ["Linear"]}}),
        ),
        &t,
    )
    .unwrap_err();
    assert!(
        matches!(&e, Error::Hf(HfError::UnsupportedFormat { format, .. }) if format == "sparse-24-bitmask"),
        "{e:?}"
    );

    // Other quantisation methods.
    let mut cfg = config(json!({}));
    cfg["quantization_config"] = json!({"quant_method": "gptq", "bits": 4});
    let e = open("gptq", cfg, &t).unwrap_err();
    assert!(
        matches!(&e, Error::Hf(HfError::UnsupportedQuantMethod { method }) if method == "gptq"),
        "{e:?}"
    );

    // A module missing its scale; a config whose bit width contradicts the packing.
    let mut no_scale = t.clone();
    no_scale.retain(|x| x.0 != "model.layers.1.mlp.experts.1.gate_proj.weight_scale");
    let e = open("noscale", ct_config(json!({})), &no_scale).unwrap_err();
    assert!(
        matches!(&e, Error::Hf(HfError::CtMissing { tensor, .. }) if tensor == "model.layers.1.mlp.experts.1.gate_proj.weight_scale"),
        "{e:?}"
    );
    let mut cfg = ct_config(json!({}));
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = json!(8);
    let e = open("bits", cfg, &t).unwrap_err();
    assert!(
        matches!(&e, Error::Hf(HfError::CtUnsupported { .. })),
        "{e:?}"
    );
    // A group size the scales contradict.
    let mut cfg = ct_config(json!({}));
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = json!(2);
    let e = open("group", cfg, &t).unwrap_err();
    assert!(matches!(&e, Error::Hf(HfError::CtShape { .. })), "{e:?}");
    // A bad regex is reported with its pattern.
    let mut cfg = ct_config(json!({}));
    cfg["quantization_config"]["ignore"] = json!(["re:(?=lookahead)"]);
    let e = open("regex", cfg, &t).unwrap_err();
    assert!(
        matches!(&e, Error::Hf(HfError::BadRegex { pattern, .. }) if pattern == "re:(?=lookahead)"),
        "{e:?}"
    );
}

#[test]
fn ambiguous_width_without_a_config_is_refused() {
    // No quantization_config: one int32 word per row of 8 (or 4) columns fits 1..4 bits,
    // so the loader must say so rather than guess.
    let mut t = base_tensors("");
    ct_experts(&mut t);
    let e = open("noconfig", config(json!({})), &t).unwrap_err();
    assert!(
        matches!(&e, Error::Hf(HfError::CtUnsupported { detail, .. }) if detail.contains("several bit widths")),
        "{e:?}"
    );
}

#[test]
fn hf_fp8_block_experts() {
    // quant_method fp8 (DeepSeek-style): F8_E4M3 weights, F32 `weight_scale_inv` per
    // block, which multiplies despite its name.
    let mut t = base_tensors("");
    let mut expected = Vec::new();
    for e in 0..E {
        for (proj, rows, cols) in [("gate", I, H), ("up", I, H), ("down", H, I)] {
            let p = format!("model.layers.1.mlp.experts.{e}.{proj}_proj");
            let codes: Vec<u8> = (0..rows * cols)
                .map(|i| ((i * 37 + e * 11) % 0x7e) as u8 | ((i % 3 == 0) as u8) << 7)
                .collect();
            let (gr, gc) = (rows.div_ceil(2), cols.div_ceil(4));
            let s: Vec<f32> = (0..gr * gc).map(|i| 0.5 + 0.25 * (i + e) as f32).collect();
            let want: Vec<f32> = (0..rows * cols)
                .map(|i| {
                    let (r, c) = (i / cols, i % cols);
                    lagoon_core::quant::ct::fp8_e4m3_to_f32(codes[i]) * s[(r / 2) * gc + c / 4]
                })
                .collect();
            t.push((
                format!("{p}.weight"),
                Dtype::F8E4M3,
                vec![rows, cols],
                codes,
            ));
            t.push((
                format!("{p}.weight_scale_inv"),
                Dtype::F32,
                vec![gr, gc],
                s.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ));
            expected.push((e, proj, rows, cols, want));
        }
    }
    let cfg = config(
        json!({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
        "activation_scheme": "dynamic", "weight_block_size": [2, 4]}}),
    );
    let ckpt = open("hffp8", cfg, &t).unwrap();
    assert_eq!(
        ckpt.tensor("blk.1.ffn_up_exps.weight").unwrap().parts[0]
            .type_name()
            .to_string(),
        "ct-fp8-b2x4"
    );
    for (e, proj, rows, cols, want) in expected {
        let name = format!("blk.1.ffn_{proj}_exps.weight");
        for r in 0..rows {
            assert_eq!(
                row(&ckpt, &name, e, r),
                want[r * cols..(r + 1) * cols],
                "{name} e{e} r{r}"
            );
        }
    }
}

#[test]
fn undecodable_dtypes_are_named() {
    let mut t = base_tensors("");
    per_expert(&mut t, "");
    // A bare FP8 weight with no scale: a quantised module missing its scale.
    let mut fp8 = t.clone();
    let x = fp8
        .iter_mut()
        .find(|x| x.0 == "model.layers.0.self_attn.k_proj.weight")
        .unwrap();
    x.1 = Dtype::F8E4M3;
    x.3.truncate(x.3.len() / 2);
    let e = open("fp8-bare", config(json!({})), &fp8).unwrap_err();
    assert!(
        matches!(&e, Error::Hf(HfError::CtMissing { tensor, .. }) if tensor == "model.layers.0.self_attn.k_proj.weight_scale"),
        "{e:?}"
    );
    // A Laguna tensor in a dtype with no decoder is named, not reported missing.
    let mut u16w = t.clone();
    u16w.iter_mut()
        .find(|x| x.0 == "model.norm.weight")
        .unwrap()
        .1 = Dtype::U16;
    let e = open("u16", config(json!({})), &u16w).unwrap_err();
    assert!(
        matches!(&e, Error::Hf(HfError::UnsupportedDtype { tensor, dtype }) if tensor == "model.norm.weight" && dtype == "U16"),
        "{e:?}"
    );
    // A stray buffer of such a dtype is skipped, not fatal.
    t.push((
        "model.layers.0.attn_mask_cache".into(),
        Dtype::Bool,
        vec![4],
        vec![1; 4],
    ));
    let ckpt = open("stray", config(json!({})), &t).unwrap();
    assert!(ckpt.record("model.layers.0.attn_mask_cache").is_none());
}
