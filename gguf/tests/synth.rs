//! Synthetic checkpoints (`lagoon_gguf::synth`): every type mix writes a file our reader
//! opens (or refuses with the precise `UnsupportedType` for types without a decoder yet),
//! output is a function of the seed alone, the INT4 directory opens, gguf-py reads the
//! GGUF files and decodes the IQ blocks to the intended magnitude, and the weight
//! statistics keep a 48-layer single-token forward pass at a sane scale with tokens spread
//! over the experts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use lagoon_core::dtype::GgmlType;
use lagoon_gguf::gguf::GgufSet;
use lagoon_gguf::synth::{self, Preset, Shape, SynthOptions, TypeMix};
use lagoon_gguf::{Checkpoint, Error};

fn temp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lagoon-synth-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// An XS-style model scaled to test size: the layer pattern, head ratios, gate, router and
/// shared expert of XS.2, with widths that are still whole K-quant blocks.
fn tiny(n_layers: usize) -> Shape {
    Shape {
        vocab_size: 512,
        hidden: 256,
        n_heads_full: 4,
        n_heads_sliding: 8,
        n_kv_heads: 2,
        head_dim: 64,
        rope_dims: 32,
        rope_dims_swa: 64,
        sliding_window: 16,
        dense_ffn: 512,
        n_experts: 8,
        n_experts_used: 2,
        expert_ffn: 256,
        shared_ffn: 256,
        max_position: 4096,
        ..Preset::Xs2.shape()
    }
    .with_layers(n_layers)
}

fn opts(mix: TypeMix, shape: Shape, seed: u64) -> SynthOptions {
    let mut o = SynthOptions::new(shape, mix, "tiny");
    o.seed = seed;
    o
}

/// Type of every tensor of a GGUF file, by name.
fn gguf_types(path: &Path) -> HashMap<String, GgmlType> {
    let set = GgufSet::open(path).unwrap();
    set.tensors().map(|(_, t)| (t.name.clone(), t.ty)).collect()
}

/// The data section of a GGUF file (everything after the header).
fn data_section(path: &Path) -> Vec<u8> {
    let bytes = std::fs::read(path).unwrap();
    let f = lagoon_gguf::gguf::GgufFile::parse(&bytes).unwrap();
    let start = f
        .tensors
        .iter()
        .map(|t| f.tensor_range(t).start)
        .min()
        .unwrap();
    bytes[start..].to_vec()
}

#[test]
fn every_gguf_mix_opens_or_names_its_first_undecodable_tensor() {
    let d = temp("mixes");
    for mix in TypeMix::ALL {
        if mix == TypeMix::Int4G32 || mix == TypeMix::Int8 {
            continue;
        }
        let path = d.join(format!("{}.gguf", mix.name()));
        let sum = synth::write(&path, &opts(mix, tiny(3), 1)).unwrap();
        assert_eq!(sum.bytes, std::fs::metadata(&path).unwrap().len());
        let types = gguf_types(&path);
        // The reader's own validation order decides which tensor it names first.
        let config =
            lagoon_gguf::gguf::laguna_config(GgufSet::open(&path).unwrap().metadata()).unwrap();
        let first_bad = lagoon_gguf::validate::laguna_tensors(&config)
            .into_iter()
            .find_map(|e| {
                let ty = *types.get(&e.name)?;
                (!lagoon_core::quant::supported(ty)).then_some((e.name, ty))
            });
        match (Checkpoint::open(&path), first_bad) {
            (Ok(ckpt), None) => {
                assert_eq!(ckpt.config.n_layers, 3);
                assert_eq!(ckpt.config.n_experts, 8);
                assert_eq!(ckpt.config.vocab_size, 512);
            }
            (Err(Error::UnsupportedType { tensor, ty }), Some((name, want))) => {
                assert_eq!((tensor.as_str(), ty.as_str()), (name.as_str(), want.name()));
            }
            (r, want) => panic!("{}: got {r:?}, expected refusal of {want:?}", mix.name()),
        }
    }
    // The mixes really differ: IQ experts in the UD mixes, K-quants in Q4_K_M.
    let t = gguf_types(&d.join("ud-q3_k_m.gguf"));
    assert_eq!(t["blk.1.ffn_gate_exps.weight"], GgmlType::IQ3XXS);
    assert_eq!(t["blk.1.attn_q.weight"], GgmlType::Q8_0);
    let t = gguf_types(&d.join("iq2_m.gguf"));
    assert_eq!(t["blk.2.ffn_up_exps.weight"], GgmlType::IQ2XXS);
    assert_eq!(t["blk.2.ffn_down_exps.weight"], GgmlType::IQ2S);
    let t = gguf_types(&d.join("iq4_xs.gguf"));
    assert_eq!(t["blk.1.ffn_down_exps.weight"], GgmlType::IQ4XS);
    assert_eq!(t["blk.1.attn_v.weight"], GgmlType::Q5K);
    assert_eq!(t["output.weight"], GgmlType::Q6K);
    let t = gguf_types(&d.join("mxfp4_moe.gguf"));
    assert_eq!(t["blk.1.ffn_down_exps.weight"], GgmlType::MXFP4);
    assert_eq!(t["blk.1.attn_q.weight"], GgmlType::Q8_0);
    assert_eq!(t["output.weight"], GgmlType::Q8_0);
    let t = gguf_types(&d.join("iq4_nl.gguf"));
    assert_eq!(t["blk.1.ffn_gate_exps.weight"], GgmlType::IQ4NL);
    assert_eq!(t["blk.1.attn_v.weight"], GgmlType::Q5K);
    let t = gguf_types(&d.join("q4_k_m.gguf"));
    assert_eq!(t["output.weight"], GgmlType::Q6K);
    assert_eq!(t["blk.1.ffn_gate_exps.weight"], GgmlType::Q4K);
    assert_eq!(t["blk.0.attn_norm.weight"], GgmlType::F32);
    assert_eq!(t["blk.1.ffn_gate_inp.weight"], GgmlType::F32);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn metadata_describes_the_shape() {
    let d = temp("meta");
    let path = d.join("m.gguf");
    synth::write(&path, &opts(TypeMix::Q8_0, tiny(6), 2)).unwrap();
    let ckpt = Checkpoint::open(&path).unwrap();
    let c = &ckpt.config;
    assert_eq!(c.n_heads, vec![4, 8, 8, 8, 4, 8]);
    assert!(!c.is_sliding(0) && c.is_sliding(1) && !c.is_sliding(4));
    assert_eq!(c.sliding_window, 16);
    assert_eq!(
        (c.n_experts_used, c.expert_ffn, c.shared_ffn),
        (2, 256, 256)
    );
    assert_eq!(c.routed_scaling, 2.5);
    assert_eq!(c.rope_full.rotary_dim, 32);
    assert!(c.rope_full.yarn.is_some());
    assert_eq!(c.eos_tokens, vec![2, 24]);
    let gate = ckpt.tensor("blk.1.attn_gate.weight").unwrap();
    assert_eq!(gate.shape, &[8, 256]);

    // M.1-style: no sliding layers, no window key, per-element gate.
    let m1 = Shape {
        n_heads_full: 4,
        n_heads_sliding: 4,
        sliding_window: 0,
        gate_per_element: true,
        n_dense_lead: 2,
        ..tiny(3)
    };
    let path = d.join("m1.gguf");
    synth::write(&path, &opts(TypeMix::Bf16, m1, 2)).unwrap();
    let ckpt = Checkpoint::open(&path).unwrap();
    assert!((0..3).all(|l| !ckpt.config.is_sliding(l)));
    assert_eq!(ckpt.config.sliding_window, 0);
    assert_eq!(
        ckpt.tensor("blk.2.attn_gate.weight").unwrap().shape,
        &[256, 256]
    );
    assert!(ckpt.record("blk.1.ffn_gate.weight").is_some());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn output_depends_on_the_seed_only() {
    let d = temp("determinism");
    for mix in [TypeMix::Q4KM, TypeMix::Iq2M, TypeMix::Bf16] {
        let mut a = opts(mix, tiny(3), 7);
        a.n_threads = 1;
        let mut b = a.clone();
        b.n_threads = 3;
        let c = opts(mix, tiny(3), 8);
        let (pa, pb, pc) = (d.join("a.gguf"), d.join("b.gguf"), d.join("c.gguf"));
        synth::write(&pa, &a).unwrap();
        synth::write(&pb, &b).unwrap();
        synth::write(&pc, &c).unwrap();
        let (da, db, dc) = (data_section(&pa), data_section(&pb), data_section(&pc));
        assert!(da == db, "{}: same seed, different data", mix.name());
        assert_eq!(std::fs::read(&pa).unwrap(), std::fs::read(&pb).unwrap());
        assert_eq!(da.len(), dc.len());
        let same = da.iter().zip(&dc).filter(|(x, y)| x == y).count();
        assert!(
            same < da.len() / 2,
            "{}: another seed should change the data",
            mix.name()
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}

fn dir_bytes(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

/// `o` written again into `d/b` on one thread: the same files, byte for byte, as `d/a`; then
/// `d` is removed.
fn assert_same_bytes_on_one_thread(d: &Path, mut o: synth::SynthOptions) {
    o.n_threads = 1;
    synth::write(&d.join("b"), &o).unwrap();
    assert!(dir_bytes(&d.join("a")) == dir_bytes(&d.join("b")));
    let _ = std::fs::remove_dir_all(d);
}

/// Row 5 of a 256-column expert matrix decodes to the spread the plan draws weights with.
fn assert_planned_spread(m: &lagoon_core::weights::MatRef<'_>) {
    let mut row = vec![0.0f32; 256];
    m.dequant_row(5, &mut row);
    let rms = (row.iter().map(|x| x * x).sum::<f32>() / 256.0).sqrt();
    let want = synth::plan::WEIGHT_GAIN / 256f32.sqrt();
    assert!((rms / want - 1.0).abs() < 0.25, "rms {rms} vs {want}");
}

#[test]
fn int4_g32_directory_opens_sharded_and_deterministic() {
    let d = temp("int4");
    let mut o = opts(TypeMix::Int4G32, tiny(3), 3);
    o.shard_bytes = 1 << 20;
    let sum = synth::write(&d.join("a"), &o).unwrap();
    let shards: Vec<_> = sum
        .files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    assert!(shards.len() > 1, "1 MB shards should split a 3-layer model");
    assert!(
        shards[0]
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("model-00001-of-0000")
    );
    let ckpt = Checkpoint::open(d.join("a")).unwrap();
    assert_eq!(ckpt.config.n_layers, 3);
    assert_eq!(ckpt.config.n_experts, 8);
    let exps = ckpt.tensor("blk.1.ffn_down_exps.weight").unwrap();
    assert_eq!(exps.parts.len(), 8);
    assert_eq!(exps.parts[0].type_name().to_string(), "ct-int4-g32");
    // Decoded expert weights have the planned spread, and the router stays BF16.
    assert_planned_spread(&exps.parts[3]);
    assert_eq!(
        ckpt.tensor("blk.1.ffn_gate_inp.weight").unwrap().parts[0]
            .type_name()
            .to_string(),
        "bf16"
    );

    assert_same_bytes_on_one_thread(&d, o);
}

/// The INT8 (W8A8) directory: int-quantized `I8` experts with one bf16 scale per output
/// channel that the loader reads as compressed-tensors int8, decoding to the planned spread;
/// everything else bf16; the same bytes whatever the thread count.
#[test]
fn int8_directory_opens_as_w8a8_channel_experts() {
    let d = temp("int8");
    let o = opts(TypeMix::Int8, tiny(3), 3);
    let sum = synth::write(&d.join("a"), &o).unwrap();
    assert!(sum.bytes > 0);
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("a/config.json")).unwrap()).unwrap();
    let q = &config["quantization_config"];
    assert_eq!(q["format"], "int-quantized");
    assert_eq!(q["config_groups"]["group_0"]["weights"]["num_bits"], 8);
    assert_eq!(
        q["config_groups"]["group_0"]["weights"]["strategy"],
        "channel"
    );
    assert_eq!(
        q["config_groups"]["group_0"]["input_activations"]["dynamic"],
        true
    );
    let ckpt = Checkpoint::open(d.join("a")).unwrap();
    let exps = ckpt.tensor("blk.1.ffn_up_exps.weight").unwrap();
    assert_eq!(exps.parts.len(), 8);
    assert_eq!(exps.parts[0].type_name().to_string(), "ct-i8-ch");
    assert_planned_spread(&exps.parts[3]);
    assert_eq!(
        ckpt.tensor("blk.1.attn_q.weight").unwrap().parts[0]
            .type_name()
            .to_string(),
        "bf16"
    );
    assert_same_bytes_on_one_thread(&d, o);
}

/// `y = W x` for a matrix view.
fn matvec(m: &lagoon_core::weights::MatRef<'_>, x: &[f32], row: &mut [f32]) -> Vec<f32> {
    (0..m.rows)
        .map(|r| {
            m.dequant_row(r, row);
            row[..m.cols].iter().zip(x).map(|(a, b)| a * b).sum()
        })
        .collect()
}

fn rms_norm(x: &[f32], g: &[f32]) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let s = 1.0 / (ms + 1e-6).sqrt();
    x.iter().zip(g).map(|(v, g)| v * s * g).collect()
}

fn rms(x: &[f32]) -> f32 {
    (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt()
}

/// One token at position 0 through the whole model (attention over one key returns its
/// value, so no RoPE or cache is needed): the residual stays finite and of order 1-10
/// after 48 layers, the logits are spread, and the router picks many distinct experts
/// across tokens (few with a strong skew).
#[test]
fn statistics_keep_48_layers_stable_and_spread_the_router() {
    let d = temp("stability");
    let forward = |skew: f32| -> (Vec<f32>, Vec<f32>, HashMap<usize, usize>) {
        let mut o = opts(TypeMix::Q8_0, tiny(48), 11);
        o.router_skew = skew;
        let path = d.join(format!("s{skew}.gguf"));
        synth::write(&path, &o).unwrap();
        let ckpt = Checkpoint::open(&path).unwrap();
        let c = ckpt.config.clone();
        let t = |n: &str| ckpt.tensor(n).unwrap().parts;
        let vec1 = |n: &str| {
            let p = &t(n)[0];
            let mut v = vec![0.0; p.cols];
            p.dequant_row(0, &mut v);
            v
        };
        let mut row = vec![0.0f32; 4096];
        let mut hits = HashMap::new();
        let mut finals = Vec::new();
        let mut logits_rms = Vec::new();
        for tok in [40u32, 300, 77, 511, 123, 250, 6, 400] {
            let mut x = vec![0.0f32; c.hidden_size];
            t("token_embd.weight")[0].dequant_row(tok as usize, &mut x);
            for l in 0..c.n_layers {
                let b = |s: &str| format!("blk.{l}.{s}.weight");
                let h = rms_norm(&x, &vec1(&b("attn_norm")));
                let v = matvec(&t(&b("attn_v"))[0], &h, &mut row);
                let g = matvec(&t(&b("attn_gate"))[0], &h, &mut row);
                let hq = c.n_heads[l];
                let rep = hq / c.n_kv_heads;
                let mut o = Vec::with_capacity(hq * c.head_dim);
                for j in 0..hq {
                    let gate = (1.0 + g[j].exp()).ln();
                    let kv = j / rep;
                    o.extend(
                        v[kv * c.head_dim..(kv + 1) * c.head_dim]
                            .iter()
                            .map(|v| v * gate),
                    );
                }
                let a = matvec(&t(&b("attn_output"))[0], &o, &mut row);
                x.iter_mut().zip(&a).for_each(|(x, a)| *x += a);
                let h = rms_norm(&x, &vec1(&b("ffn_norm")));
                let mlp = |gate: &lagoon_core::weights::MatRef<'_>,
                           up: &lagoon_core::weights::MatRef<'_>,
                           down: &lagoon_core::weights::MatRef<'_>,
                           row: &mut [f32]| {
                    let g = matvec(gate, &h, row);
                    let u = matvec(up, &h, row);
                    let act: Vec<f32> = g
                        .iter()
                        .zip(&u)
                        .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                        .collect();
                    matvec(down, &act, row)
                };
                let y = if l == 0 {
                    mlp(
                        &t(&b("ffn_gate"))[0],
                        &t(&b("ffn_up"))[0],
                        &t(&b("ffn_down"))[0],
                        &mut row,
                    )
                } else {
                    let z = matvec(&t(&b("ffn_gate_inp"))[0], &h, &mut row);
                    let bias = vec1(&format!("blk.{l}.exp_probs_b.bias"));
                    let s: Vec<f32> = z.iter().map(|z| 1.0 / (1.0 + (-z).exp())).collect();
                    let mut ids: Vec<usize> = (0..s.len()).collect();
                    ids.sort_by(|&a, &b| (s[b] + bias[b]).total_cmp(&(s[a] + bias[a])));
                    ids.truncate(c.n_experts_used);
                    let wsum: f32 = ids.iter().map(|&e| s[e]).sum();
                    let (ge, ue, de) = (
                        t(&b("ffn_gate_exps")),
                        t(&b("ffn_up_exps")),
                        t(&b("ffn_down_exps")),
                    );
                    let mut y = mlp(
                        &t(&b("ffn_gate_shexp"))[0],
                        &t(&b("ffn_up_shexp"))[0],
                        &t(&b("ffn_down_shexp"))[0],
                        &mut row,
                    );
                    for &e in &ids {
                        *hits.entry(e + 1000 * l).or_insert(0) += 1;
                        let ye = mlp(&ge[e], &ue[e], &de[e], &mut row);
                        let w = s[e] / wsum * c.routed_scaling;
                        y.iter_mut().zip(&ye).for_each(|(y, v)| *y += w * v);
                    }
                    y
                };
                x.iter_mut().zip(&y).for_each(|(x, y)| *x += y);
            }
            finals.push(rms(&x));
            let h = rms_norm(&x, &vec1("output_norm.weight"));
            logits_rms.push(rms(&matvec(&t("output.weight")[0], &h, &mut row)));
        }
        (finals, logits_rms, hits)
    };

    let (finals, logits, hits) = forward(0.0);
    eprintln!("residual RMS after 48 layers {finals:?}, logit RMS {logits:?}");
    for (x, lg) in finals.iter().zip(&logits) {
        assert!(
            x.is_finite() && (0.5..20.0).contains(x),
            "residual RMS {x} after 48 layers"
        );
        assert!((0.5..5.0).contains(lg), "logit RMS {lg}");
    }
    // 8 tokens × 2 slots over 8 experts, per layer: uniform routing touches most experts.
    let distinct = |hits: &HashMap<usize, usize>| hits.len() as f64 / 47.0;
    let spread = distinct(&hits);
    assert!(
        spread > 5.0,
        "only {spread:.1} distinct experts per layer for 8 tokens"
    );
    let (_, _, hot) = forward(5.0);
    let skewed = distinct(&hot);
    eprintln!("distinct experts per layer over 8 tokens: {spread:.2} uniform, {skewed:.2} skew 5");
    assert!(
        skewed < 3.0,
        "skew 5 should concentrate on the hot pair, got {skewed:.1}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// gguf-py (the independent reader llama.cpp ships) parses every mix and decodes every
/// tensor to finite values; the IQ blocks, which lagoon cannot decode yet, decode to the
/// planned standard deviation. Skipped with a message when the reference Python is absent.
#[test]
fn gguf_py_reads_every_mix_and_decodes_iq_blocks_to_the_planned_scale() {
    let py = std::env::var("LAGOON_REF_PYTHON").unwrap_or("/work/venv/ref/bin/python".into());
    if !Path::new(&py).exists() {
        eprintln!("skipped: no reference Python at {py} (set LAGOON_REF_PYTHON)");
        return;
    }
    let d = temp("gguf-py");
    let mut paths = Vec::new();
    for mix in [
        TypeMix::Q4KM,
        TypeMix::Q3KM,
        TypeMix::Q2K,
        TypeMix::Q4_0,
        TypeMix::Q8_0,
        TypeMix::UdQ3KM,
        TypeMix::Iq2M,
        TypeMix::Iq1M,
        TypeMix::Iq1S,
        TypeMix::Iq4Nl,
        TypeMix::Mxfp4Moe,
        TypeMix::Bf16,
    ] {
        let p = d.join(format!("{}.gguf", mix.name()));
        synth::write(&p, &opts(mix, tiny(3), 5)).unwrap();
        paths.push(p);
    }
    let script = r#"
import sys, numpy as np, gguf
from gguf.quants import dequantize
for path in sys.argv[1:]:
    r = gguf.GGUFReader(path)
    assert r.fields["general.architecture"].contents() == "laguna"
    assert len(r.fields["tokenizer.ggml.tokens"].contents()) == 512
    for t in r.tensors:
        y = dequantize(t.data, t.tensor_type).astype(np.float64)
        assert np.isfinite(y).all(), (path, t.name)
        if t.name.endswith("_exps.weight"):
            fan_in = int(t.shape[0])
            want = 0.8 / np.sqrt(fan_in)
            got = y.std()
            assert abs(got / want - 1) < 0.1, (path, t.name, t.tensor_type.name, got, want)
            assert abs(y.mean()) < 0.05 * want, (path, t.name, y.mean())
            print(t.name, t.tensor_type.name, round(got / want, 4))
    print(path, len(r.tensors), "ok")
"#;
    let out = std::process::Command::new(&py)
        .arg("-c")
        .arg(script)
        .args(&paths)
        .output()
        .unwrap();
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "gguf-py failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&d);
}
