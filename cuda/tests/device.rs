//! Tests that need a CUDA device (`#[ignore = "needs a CUDA device"]`; run on the GPU machine
//! with `.device/run-tests.sh`): kernels against the CPU reference on random data, and whole
//! tiny models against the CPU reference path and transformers' float32 logits in one-shot
//! prefill, chunked prefill and token-by-token decode.

use std::path::{Path, PathBuf};

use cudarc::driver::DevicePtr;
use lagoon_core::dtype::GgmlType;
use lagoon_core::laguna::ModelWeights;
use lagoon_core::weights::{Encoding, MatRef};
use lagoon_cuda::device::{Arg, Device, MvMat};
use lagoon_cuda::manifest::{ActQ, K, gate_up_blocks};
use lagoon_cuda::weights::{wtype, wtype_grid};
use lagoon_cuda::{CudaSession, CudaSessionOptions, KvCache};
use lagoon_gguf::Checkpoint;

mod common;

use common::{Rng, device, download, max_rel, random_rows, rel_l2, same_bits, upload};

#[test]
#[ignore = "needs a CUDA device"]
fn matmul_and_embed_match_reference_for_every_type() {
    let dev = device();
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let types = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::Q5K,
        GgmlType::IQ4XS,
        // Kept quantised only with CudaSessionOptions::grid_iq (wtype_grid).
        GgmlType::IQ3XXS,
        GgmlType::IQ2XXS,
        GgmlType::IQ2S,
    ];
    for ty in types {
        for (rows, cols) in [(37usize, 512usize), (5, 1024)] {
            let data = random_rows(&mut rng, ty, rows, cols);
            let m = MatRef {
                rows,
                cols,
                enc: Encoding::Ggml { ty, data: &data },
            };
            let wt = wtype_grid(ty, true).unwrap();
            let row_bytes = ty.row_bytes(cols as u64).unwrap();
            let (_wb, wp) = upload(&dev, &data);
            for n in [1usize, 3, 8, 11] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
                let mut want = vec![0.0; n * rows];
                let mut scratch = vec![0.0; cols];
                lagoon_core::ops::matmul::matmul(&m, &x, n, &mut want, &mut scratch);
                let (_xb, xp) = upload(&dev, &x);
                let ob = dev.stream.alloc_zeros::<f32>(n * rows).unwrap();
                let op = ob.device_ptr(&dev.stream).0;
                dev.launch(
                    wt.matmul(),
                    (rows.div_ceil(4) as u32, n.div_ceil(8) as u32),
                    128,
                    &[
                        Arg::P(wp),
                        Arg::P(row_bytes),
                        Arg::P(xp),
                        Arg::P(op),
                        Arg::I(rows as i32),
                        Arg::I(cols as i32),
                        Arg::I(n as i32),
                    ],
                )
                .unwrap();
                let got = download(&dev, &ob);
                let e = max_rel(&got, &want);
                println!("matmul {ty} {rows}x{cols} n={n}: max rel err {e:.2e}");
                assert!(e < 1e-5, "matmul {ty} n={n}: {e}");
            }
            // Embedding rows 0, rows-1, 2 via the step parameters.
            let toks = [0u32, rows as u32 - 1, 2];
            let params: Vec<u32> = [0, 3].iter().chain(&toks).copied().collect();
            let (_pb, pp) = upload(&dev, &params);
            let ob = dev.stream.alloc_zeros::<f32>(3 * cols).unwrap();
            let op = ob.device_ptr(&dev.stream).0;
            dev.launch(
                wt.embed(),
                (cols.div_ceil(32).div_ceil(128) as u32, 3),
                128,
                &[
                    Arg::P(wp),
                    Arg::P(row_bytes),
                    Arg::P(pp),
                    Arg::P(op),
                    Arg::I(cols as i32),
                ],
            )
            .unwrap();
            let got = download(&dev, &ob);
            let mut want = vec![0.0; 3 * cols];
            for (t, &tok) in toks.iter().enumerate() {
                m.dequant_row(tok as usize, &mut want[t * cols..(t + 1) * cols]);
            }
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "embed {ty}: dequantised rows differ from the reference decoder"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn router_matches_reference_including_ties() {
    let dev = device();
    let mut rng = Rng(77);
    for (e, k, norm) in [
        (64usize, 6usize, true),
        (256, 10, true),
        (40, 3, false),
        (8, 8, true),
        // E not a multiple of 4: route_block's one-key-at-a-time rank loop.
        (30, 4, true),
        // K above a warp's 32, and the most experts the kernels take.
        (96, 40, true),
        (512, 16, true),
    ] {
        let n = 9;
        let mut z: Vec<f32> = (0..n * e).map(|_| 4.0 * rng.f()).collect();
        // Token 0: exact ties (equal logits), token 1: a NaN, token 2: all -inf bias ties.
        for j in 0..e {
            z[j] = if j % 3 == 0 { 0.5 } else { -0.25 };
        }
        z[e + 1] = f32::NAN;
        let bias: Vec<f32> = (0..e).map(|i| if i % 5 == 0 { 0.1 } else { 0.0 }).collect();
        let (_zb, zp) = upload(&dev, &z);
        let (_bb, bp) = upload(&dev, &bias);
        // Both kernels; token 1's NaN sends route_block to its sequential picks.
        for (kern, grid, block) in [(K::Route, n.div_ceil(4), 128), (K::RouteBlock, n, 256)] {
            let ib = dev.stream.alloc_zeros::<f32>(n * k).unwrap();
            let wb = dev.stream.alloc_zeros::<f32>(n * k).unwrap();
            let (ip, wp) = (ib.device_ptr(&dev.stream).0, wb.device_ptr(&dev.stream).0);
            dev.launch(
                kern,
                (grid as u32, 1),
                block,
                &[
                    Arg::P(zp),
                    Arg::P(bp),
                    Arg::P(ip),
                    Arg::P(wp),
                    Arg::I(e as i32),
                    Arg::I(k as i32),
                    Arg::I(norm as i32),
                    Arg::I(n as i32),
                ],
            )
            .unwrap();
            let (ids, ws) = (download(&dev, &ib), download(&dev, &wb));
            let mut max_err = 0.0f32;
            for t in 0..n {
                let (mut ri, mut rw, mut sel) = (vec![0u32; k], vec![0f32; k], vec![0f32; e]);
                lagoon_core::ops::router::route(
                    &z[t * e..(t + 1) * e],
                    &bias,
                    norm,
                    &mut ri,
                    &mut rw,
                    &mut sel,
                );
                let gi: Vec<u32> = ids[t * k..(t + 1) * k]
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                assert_eq!(gi, ri, "E={e} K={k} token {t}: ids");
                for (a, b) in ws[t * k..(t + 1) * k].iter().zip(&rw) {
                    if !(a.is_nan() && b.is_nan()) {
                        max_err = max_err.max((a - b).abs());
                    }
                }
            }
            println!(
                "{} E={e} K={k} norm={norm}: ids equal, max weight err {max_err:.2e}",
                kern.name()
            );
            assert!(max_err < 1e-6);
        }
    }
}

fn read_f32(p: &Path) -> Vec<f32> {
    std::fs::read(p)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn weights(ckpt: &Checkpoint) -> ModelWeights<'_> {
    ModelWeights::resolve(&ckpt.config, |name| ckpt.tensor(name).ok().map(|t| t.parts)).unwrap()
}

/// Bound on the relative L2 error vs transformers f32 (issue #2's bound for the CPU path).
const MAX_REL_L2: f64 = 1e-4;
/// Bounds of the quantised-activation decode, relative to the CPU's fast path (same
/// quantisers, same integer sums, float sums in another order). Where no activation lands on
/// another side of a rounding boundary the two agree to ~5e-7 (most fixture variants); where
/// one does, the later layers re-round on top of it and every position it reaches moves by
/// about the quantisation error itself (tools/reference/quant_models.py measured the same
/// between llama.cpp and lagoon). So: no farther from the CPU fast path than that path is
/// from transformers, and no farther from transformers than 1.6 x the CPU fast path
/// (sqrt(1 + 1.25^2), independent rounding). A wrong kernel gives O(1).
const FAST_VS_CPU_FACTOR: f64 = 1.0;
const FAST_VS_TF_FACTOR: f64 = 1.6;
/// Bound of the tensor-core prefill (f16 operands) vs transformers where the CPU fast path is
/// closer than this (float-weight models).
const TC_VS_TF: f64 = 3e-3;

#[test]
#[ignore = "needs a CUDA device"]
fn tiny_models_match_cpu_and_transformers_in_every_mode() {
    let root = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/models"
    ));
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("tokens.txt").exists())
        .collect();
    cases.sort();
    assert!(!cases.is_empty());
    let mut n_checked = 0;
    let mut worst = 0.0f64;
    for case in cases {
        let toks: Vec<u32> = std::fs::read_to_string(case.join("tokens.txt"))
            .unwrap()
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.trim().parse().unwrap())
            .collect();
        let tf = case.join("logits.transformers.f32");
        let mut variants: Vec<(PathBuf, PathBuf)> =
            ["model-f32.gguf", "model-f16.gguf", "model-q8_0.gguf"]
                .iter()
                .map(|f| (case.join(f), tf.clone()))
                .chain(["hf-bf16"].iter().map(|d| (case.join(d), tf.clone())))
                .filter(|(p, _)| p.exists())
                .collect();
        for d in ["ct-int4", "ct-int4-asym", "ct-int8"] {
            let p = case.join(d);
            if p.join("logits.transformers.f32").exists() {
                variants.push((p.clone(), p.join("logits.transformers.f32")));
            }
        }
        for (model, refpath) in variants {
            let reference = read_f32(&refpath);
            let ckpt =
                Checkpoint::open(&model).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
            let w = weights(&ckpt);
            let cfg = &ckpt.config;
            // The CPU reference path, once (prefill).
            let mut cpu = lagoon_cpu::Session::new(
                cfg,
                &w,
                lagoon_cpu::SessionOptions {
                    n_ctx: toks.len(),
                    ubatch: toks.len(),
                    all_logits: true,
                    n_threads: 0,
                    reference: true,
                    repack: None,
                },
            );
            let cpu_logits = cpu.step(&toks).unwrap().to_vec();
            let mut first_mode: Option<Vec<f32>> = None;
            for (mode, ubatch) in [("prefill", toks.len()), ("chunked-7", 7), ("decode", 1)] {
                let mut s = CudaSession::new(
                    cfg,
                    &w,
                    CudaSessionOptions {
                        n_ctx: toks.len(),
                        ubatch,
                        all_logits: true,
                        device: 0,
                        cuda_graphs: true,
                        // Decode runs split-K attention over 8-key splits (full layers: up
                        // to 6 splits at 48 tokens; sliding, W = 16: 2).
                        attn_split_keys: if ubatch == 1 { 8 } else { 0 },
                        quantized_activations: false,
                        programmatic_launch: false,
                        kv: KvCache::F32,
                        grid_iq: false,
                        grid_iq_mvq: false,
                        q5k_iq4xs_mvq: false,
                        qk_attention: false,
                        norm_epilogue: false,
                        gate_up_q8: false,
                    },
                )
                .unwrap_or_else(|e| panic!("{e}"));
                let mut ours = Vec::new();
                s.prefill(&toks, |l| ours.extend_from_slice(l)).unwrap();
                let e_tf = rel_l2(&ours, &reference);
                let e_cpu = rel_l2(&ours, &cpu_logits);
                let name = model
                    .strip_prefix(&root)
                    .unwrap_or(&model)
                    .display()
                    .to_string();
                let (wb, nd) = s.weight_bytes();
                println!(
                    "{name} [{mode}]: rel L2 vs transformers {e_tf:.3e}, vs CPU reference {e_cpu:.3e} ({wb} weight bytes, {nd} matrices decoded to f32)"
                );
                assert!(
                    e_tf <= MAX_REL_L2,
                    "{name} [{mode}]: {e_tf:.3e} vs transformers"
                );
                assert!(e_cpu <= MAX_REL_L2, "{name} [{mode}]: {e_cpu:.3e} vs CPU");
                worst = worst.max(e_tf);
                n_checked += 1;
                // Every mode runs the same per-(row, token) arithmetic (the grouped expert
                // kernels included), so the modes should agree to rounding at most.
                match &first_mode {
                    None => first_mode = Some(ours),
                    Some(p) => {
                        let same = p.iter().zip(&ours).all(|(a, b)| a.to_bits() == b.to_bits());
                        let e = rel_l2(&ours, p);
                        println!("  [{mode}] vs [prefill]: rel L2 {e:.3e}, bitwise equal {same}");
                        assert!(e <= 1e-6, "{name} [{mode}] vs prefill: {e:.3e}");
                    }
                }
            }
            // Decode with quantised activations against the CPU's fast path, which quantises
            // the same inputs to the same values: only the float summation order differs.
            let mut cpu_fast = lagoon_cpu::Session::new(
                cfg,
                &w,
                lagoon_cpu::SessionOptions {
                    n_ctx: toks.len(),
                    ubatch: toks.len(),
                    all_logits: true,
                    n_threads: 0,
                    reference: false,
                    repack: None,
                },
            );
            let fast_cpu = cpu_fast.step(&toks).unwrap().to_vec();
            let mut s = CudaSession::new(
                cfg,
                &w,
                CudaSessionOptions {
                    n_ctx: toks.len(),
                    ubatch: 1,
                    all_logits: true,
                    // Split-K over 8-key splits, so the decode attention's partial states
                    // and the fused merge + gate run.
                    attn_split_keys: 8,
                    ..Default::default()
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let mut ours = Vec::new();
            s.prefill(&toks, |l| ours.extend_from_slice(l)).unwrap();
            let nd = s.weight_bytes().1;
            let (e_cpu, e_tf) = (rel_l2(&ours, &fast_cpu), rel_l2(&ours, &reference));
            let e_cpu_tf = rel_l2(&fast_cpu, &reference);
            println!(
                "  [decode, quantised activations]: rel L2 vs CPU fast path {e_cpu:.3e}, vs transformers {e_tf:.3e} (CPU fast path vs transformers {e_cpu_tf:.3e})"
            );
            // Matrices decoded to f32 at upload (compressed-tensors int8) run the f32 kernels
            // even here, while the CPU quantises their activations: those match the CPU
            // reference instead. (CT4 blocks pair with Q8_0 here as on the CPU.)
            let e_ref = rel_l2(&ours, &cpu_logits);
            let bound = e_cpu_tf.max(MAX_REL_L2);
            let exact_decode = nd > 0;
            assert!(
                e_cpu <= FAST_VS_CPU_FACTOR * bound || (exact_decode && e_ref <= MAX_REL_L2),
                "fast decode vs CPU fast: {e_cpu:.3e} (vs CPU reference {e_ref:.3e})"
            );
            assert!(
                e_tf <= FAST_VS_TF_FACTOR * bound,
                "fast decode vs transformers: {e_tf:.3e}"
            );
            // One-shot prefill on the fast path: the tensor-core products, whose f16
            // operands carry ~5e-4 relative rounding each. Against transformers within the
            // CPU fast path's distance or TC_VS_TF (f16 rounding through the tiny models,
            // measured ~1e-3 at most); a wrong tile or fragment gives O(1).
            let mut s = CudaSession::new(
                cfg,
                &w,
                CudaSessionOptions {
                    n_ctx: toks.len(),
                    ubatch: toks.len(),
                    all_logits: true,
                    ..Default::default()
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let mut tc = Vec::new();
            s.prefill(&toks, |l| tc.extend_from_slice(l)).unwrap();
            let e_tc = rel_l2(&tc, &reference);
            println!("  [prefill, tensor cores]: rel L2 vs transformers {e_tc:.3e}");
            assert!(
                e_tc <= (FAST_VS_TF_FACTOR * e_cpu_tf).max(TC_VS_TF),
                "tensor-core prefill vs transformers: {e_tc:.3e}"
            );
        }
    }
    println!("{n_checked} model/mode pairs checked, worst rel L2 vs transformers {worst:.3e}");
    assert!(n_checked >= 9);
}

/// A q8_0 KV cache where the tensor-core attention cannot take every step (this tiny
/// model's head_dim is not 128; the reference path) is refused with a typed error that
/// names the cache and what to use, before any device is touched (so this runs in CI).
#[test]
fn q8_0_kv_cache_outside_the_tensor_core_attention_is_refused() {
    let ckpt = Checkpoint::open(XS2_Q8).unwrap();
    assert_ne!(ckpt.config.head_dim, 128);
    let w = weights(&ckpt);
    for quantized_activations in [true, false] {
        let err = CudaSession::new(
            &ckpt.config,
            &w,
            CudaSessionOptions {
                kv: KvCache::Q8_0,
                quantized_activations,
                ..Default::default()
            },
        )
        .expect_err("a q8_0 cache on this model must be refused");
        let msg = err.to_string();
        assert!(
            matches!(err, lagoon_cuda::CudaError::Unsupported { .. })
                && msg.contains("q8_0")
                && msg.contains("--kv f16"),
            "{msg}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn bad_steps_are_typed_errors() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/models/hybrid_perhead/model-q8_0.gguf"
    );
    let ckpt = Checkpoint::open(path).unwrap();
    let w = weights(&ckpt);
    let mut s = CudaSession::new(
        &ckpt.config,
        &w,
        CudaSessionOptions {
            n_ctx: 4,
            ubatch: 2,
            all_logits: false,
            device: 0,
            cuda_graphs: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(matches!(
        s.step(&[]),
        Err(lagoon_cuda::CudaError::BadBatch { .. })
    ));
    assert!(matches!(
        s.step(&[1, 2, 3]),
        Err(lagoon_cuda::CudaError::BadBatch { .. })
    ));
    assert!(matches!(
        s.step(&[u32::MAX]),
        Err(lagoon_cuda::CudaError::BadToken { .. })
    ));
    s.step(&[1, 2]).unwrap();
    s.step(&[3, 4]).unwrap();
    assert!(matches!(
        s.step(&[5]),
        Err(lagoon_cuda::CudaError::ContextFull { .. })
    ));
    // A context whose KV cache cannot fit: refused before allocating, with its size.
    let Err(e) = CudaSession::new(
        &ckpt.config,
        &w,
        CudaSessionOptions {
            n_ctx: 1 << 36,
            ubatch: 2,
            ..Default::default()
        },
    ) else {
        panic!("a 2^36-token context fits nowhere");
    };
    println!("{e}");
    assert!(
        matches!(
            e,
            lagoon_cuda::CudaError::OutOfMemory {
                what: "the KV cache",
                ..
            }
        ),
        "{e}"
    );
}

/// The xs2_style Q8_0 tiny model, for comparisons of session options on one sequence.
const XS2_Q8: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/models/xs2_style/model-q8_0.gguf"
);

/// 40 deterministic tokens of `ckpt`'s vocabulary.
fn xs2_tokens(ckpt: &Checkpoint) -> Vec<u32> {
    (0..40u32)
        .map(|i| (i * 37 + 5) % ckpt.config.vocab_size as u32)
        .collect()
}

/// The logits a session with `opts` (its `n_ctx` set to the sequence) gives for `toks`.
fn session_logits(
    ckpt: &Checkpoint,
    w: &ModelWeights<'_>,
    toks: &[u32],
    opts: CudaSessionOptions,
) -> Vec<f32> {
    let opts = CudaSessionOptions {
        n_ctx: toks.len(),
        ..opts
    };
    let mut s = CudaSession::new(&ckpt.config, w, opts).unwrap();
    let mut out = Vec::new();
    s.prefill(toks, |l| out.extend_from_slice(l)).unwrap();
    out
}

/// [`session_logits`] with a session option on and off: `opts(on)`.
fn logits_on_off(
    ckpt: &Checkpoint,
    w: &ModelWeights<'_>,
    toks: &[u32],
    opts: impl Fn(bool) -> CudaSessionOptions,
) -> (Vec<f32>, Vec<f32>) {
    (
        session_logits(ckpt, w, toks, opts(true)),
        session_logits(ckpt, w, toks, opts(false)),
    )
}

/// Asserts that a fusion's logits are the unfused ones bit for bit (`logits_on_off`'s pair),
/// printing `what` with their distance.
fn assert_fusion_bits(what: &str, (fused, plain): (Vec<f32>, Vec<f32>)) {
    let same = same_bits(&fused, &plain);
    println!(
        "{what}: fused vs apart: bitwise equal {same}, rel L2 {:.3e}",
        rel_l2(&fused, &plain)
    );
    assert!(same, "{what}: the fusion changed the logits");
}

/// The kernels four one-token steps of a profiled `qk_attention` session ran (profiled steps
/// launch one at a time, no graph): launches named `fused*` and of `qk_norm_rope_store`, at
/// least one fused and every layer step one or the other (a layer whose output the planner
/// placed over the raw q, k or v keeps the two kernels).
fn qk_fused_launches(
    ckpt: &Checkpoint,
    w: &ModelWeights<'_>,
    toks: &[u32],
    opts: CudaSessionOptions,
    fused: &str,
    what: &str,
) {
    let mut s = CudaSession::new(&ckpt.config, w, opts).unwrap();
    let n = launches_by_prefix(&mut s, &toks[..4], &[fused, "qk_norm_rope_store"]);
    let steps = 4 * ckpt.config.n_layers;
    println!(
        "{what}: {} {fused} launches, {} qk_norm_rope_store",
        n[0], n[1]
    );
    assert!(
        n[0] > 0 && n[0] + n[1] == steps,
        "{what}: {} {fused} and {} qk_norm_rope_store launches for {steps} layer steps",
        n[0],
        n[1]
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn decode_graph_replay_equals_eager_steps() {
    let ckpt = Checkpoint::open(XS2_Q8).unwrap();
    let w = weights(&ckpt);
    let toks = xs2_tokens(&ckpt);
    let run = |graphs: bool, pdl: bool| {
        let opts = CudaSessionOptions {
            ubatch: 1,
            cuda_graphs: graphs,
            attn_split_keys: 8,
            programmatic_launch: pdl,
            ..Default::default()
        };
        session_logits(&ckpt, &w, &toks, opts)
    };
    let eager = run(false, false);
    // Programmatic dependent launch changes when kernels start, never what they compute: a
    // missing wait would show here as a race.
    for (graphs, pdl) in [(true, false), (false, true), (true, true)] {
        let same = same_bits(&run(graphs, pdl), &eager);
        println!(
            "decode (graph {graphs}, programmatic launch {pdl}) vs eager over {} steps: \
             bitwise equal = {same}",
            toks.len()
        );
        assert!(
            same,
            "graph {graphs} / programmatic launch {pdl} differs from eager launches"
        );
    }
}

/// The tiny models the fusion tests run (per-head and per-element gates, sliding and full
/// layers), where present: `f(name, checkpoint, weights, tokens)`.
fn each_fusion_model(
    models: &[&str],
    mut f: impl FnMut(&str, &Checkpoint, &ModelWeights<'_>, &[u32]),
) {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/models");
    for model in models {
        let path = PathBuf::from(root).join(model);
        if !path.exists() {
            continue;
        }
        let ckpt = Checkpoint::open(&path).unwrap();
        let w = weights(&ckpt);
        let toks = xs2_tokens(&ckpt);
        f(model, &ckpt, &w, &toks);
    }
}

/// The GGUF models of [`each_fusion_model`].
const FUSION_GGUFS: [&str; 3] = [
    "xs2_style/model-q8_0.gguf",
    "hybrid_perhead/model-f16.gguf",
    "perelem_legacy/model-q8_0.gguf",
];

/// Launches per kernel-name prefix over `n` one-token steps of a profiled session.
fn launches_by_prefix(s: &mut CudaSession, toks: &[u32], prefixes: &[&str]) -> Vec<usize> {
    s.set_profiling(true);
    s.prefill(toks, |_| {}).unwrap();
    let times = s.set_profiling(false).unwrap_or_default();
    prefixes
        .iter()
        .map(|p| {
            times
                .iter()
                .filter(|k| k.kernel.starts_with(p))
                .map(|k| k.launches)
                .sum()
        })
        .collect()
}

/// The decode step's QK-norm + RoPE + KV store done inside the attention kernel
/// (`CudaSessionOptions::qk_attention`, `attention_decode_qk`) gives the bits of the separate
/// `qk_norm_rope_store` + `attention_decode` launches: 40 one-token steps on the tiny models
/// (sliding and full layers, per-head and per-element gates), f32, f16 and bf16 KV caches, one
/// split and 8-key splits (the split holding the step's own position differs from the
/// others), graph replay with programmatic launch. A profiled run checks that the fused
/// kernel ran, and that every layer step ran either it or the separate QK kernel.
#[test]
#[ignore = "needs a CUDA device"]
fn qk_attention_fusion_gives_the_unfused_bits() {
    each_fusion_model(&FUSION_GGUFS, |model, ckpt, w, toks| {
        for kv in [KvCache::F32, KvCache::F16, KvCache::Bf16] {
            for split_keys in [0, 8] {
                let opts = |qk_attention: bool| CudaSessionOptions {
                    n_ctx: toks.len(),
                    ubatch: 1,
                    attn_split_keys: split_keys,
                    kv,
                    qk_attention,
                    ..Default::default()
                };
                assert_fusion_bits(
                    &format!(
                        "{model} kv {kv:?} split keys {split_keys}, {} steps, QK in attention",
                        toks.len()
                    ),
                    logits_on_off(ckpt, w, toks, opts),
                );
            }
            // Which kernels ran (profiled steps launch one at a time, no graph).
            let opts = CudaSessionOptions {
                n_ctx: toks.len(),
                ubatch: 1,
                kv,
                qk_attention: true,
                ..Default::default()
            };
            let what = format!("{model} kv {kv:?}");
            qk_fused_launches(ckpt, w, toks, opts, "attention_decode_qk", &what);
        }
    });
}

/// The attention norm split between the expert down kernel and the float Q/K/V/gate products
/// (`CudaSessionOptions::norm_epilogue`, `mmvq.cu`'s `mv_rinv_multi`) against its own launch:
/// 40 one-token steps of the tiny W4A16 models (CT4 experts, bf16 attention and shared
/// expert), graph replay with programmatic launch. The products scale (W · (g ∘ x)) by the
/// norm's 1 / rms where the launch rounds g·(x·r) per element, and the quantised activations
/// downstream may round across a step, so the bound is a float path's, not bitwise. A
/// profiled run checks that the split ran on every layer whose attention norm follows a
/// routed-expert layer, and that the norm launches went.
#[test]
#[ignore = "needs a CUDA device"]
fn norm_epilogue_matches_the_norm_launch() {
    let models = [
        "xs2_style/ct-int4",
        "hybrid_perhead/ct-int4",
        "perelem_legacy/ct-int4",
    ];
    let mut n_models = 0;
    each_fusion_model(&models, |model, ckpt, w, toks| {
        let opts = |norm_epilogue: bool| CudaSessionOptions {
            n_ctx: toks.len(),
            ubatch: 1,
            norm_epilogue,
            ..Default::default()
        };
        let (split, plain) = logits_on_off(ckpt, w, toks, opts);
        let e = rel_l2(&split, &plain);
        println!(
            "{model}: norm split vs its launch over {} steps: rel L2 {e:.3e}, bitwise equal {}",
            toks.len(),
            same_bits(&split, &plain)
        );
        assert!(
            e <= 2e-3,
            "{model}: the split norm moved the logits by {e:.3e}"
        );
        let count = |on: bool| {
            let mut s = CudaSession::new(&ckpt.config, w, opts(on)).unwrap();
            launches_by_prefix(&mut s, &toks[..4], &["mv_rinv", "rms_norm_row"])
        };
        let (on, off) = (count(true), count(false));
        println!("{model}: mv_rinv / rms_norm_row launches: split {on:?}, launch {off:?}");
        // Four steps: each layer after a routed-expert layer loses its norm launch.
        let mlp = &ckpt.config.mlp_types;
        let after_moe = (1..mlp.len())
            .filter(|&l| mlp[l - 1] == lagoon_core::config::MlpKind::Sparse)
            .count();
        assert_eq!(on[0], 4 * after_moe, "{model}: mv_rinv launches");
        assert_eq!(on[1] + on[0], off[1], "{model}: norm launches");
        n_models += 1;
    });
    assert!(n_models > 0, "no tiny W4A16 model found");
}

/// The routed SwiGLU rows quantised inside the expert gate/up kernel
/// (`CudaSessionOptions::gate_up_q8`: `moe_gate_up_mixed_q8_*`'s clusters, then
/// `moe_down_mixed_late_*`) give the bits of the quantiser launch between the two kernels: 40
/// one-token steps of the tiny W4A16 / W8A16 models (CT4 and CT8 experts beside a bf16 shared
/// expert; one whose shared expert is wider than the routed ones, so a cluster of rows past
/// the routed width skips the barrier), graph replay with programmatic launch. A profiled run
/// checks that every routed-expert layer step ran the clustered kernel and lost its quantiser.
#[test]
#[ignore = "needs a CUDA device"]
fn gate_up_quantiser_gives_the_launch_bits() {
    let models = [
        "xs2_style/ct-int4",
        "hybrid_perhead/ct-int4",
        "hybrid_perhead/ct-int4-asym",
        "perelem_legacy/ct-int4",
        "xs2_style/ct-int8",
        "hybrid_perhead/ct-int8",
        "perelem_legacy/ct-int8",
    ];
    let mut n_models = 0;
    each_fusion_model(&models, |model, ckpt, w, toks| {
        let opts = |gate_up_q8: bool| CudaSessionOptions {
            n_ctx: toks.len(),
            ubatch: 1,
            gate_up_q8,
            ..Default::default()
        };
        assert_fusion_bits(
            &format!(
                "{model}, {} steps, the routed quantiser inside the gate/up",
                toks.len()
            ),
            logits_on_off(ckpt, w, toks, opts),
        );
        let count = |on: bool| {
            let mut s = CudaSession::new(&ckpt.config, w, opts(on)).unwrap();
            launches_by_prefix(
                &mut s,
                &toks[..4],
                &[
                    "moe_gate_up_mixed_q8",
                    "moe_down_mixed_late",
                    "quantize_q8_0",
                ],
            )
        };
        let (on, off) = (count(true), count(false));
        println!("{model}: q8 gate/up, late down, quantize_q8_0 launches: on {on:?}, off {off:?}");
        let moe = ckpt
            .config
            .mlp_types
            .iter()
            .filter(|&&m| m == lagoon_core::config::MlpKind::Sparse)
            .count();
        assert_eq!(on[0], 4 * moe, "{model}: clustered gate/up launches");
        assert_eq!(on[1], 4 * moe, "{model}: late down launches");
        assert_eq!(
            (off[0], off[1]),
            (0, 0),
            "{model}: launches with the option off"
        );
        assert_eq!(off[2], on[2] + 4 * moe, "{model}: quantiser launches");
        n_models += 1;
    });
    assert!(
        n_models >= 4,
        "tiny W4A16 / W8A16 models missing ({n_models} found)"
    );
}

/// The prefill fusions (`session/fused_prefill.rs`: QK-norm + RoPE + KV store, the norm
/// writing the products' f16 input) give the unfused kernels' bits: whole tensor-core
/// prefill steps with fusions on and off, the three KV caches, one-shot and in 16-token chunks,
/// on the tiny models with a per-head and a per-element gate. (The attention epilogue's
/// fusion needs head_dim 128; tests/tensor_core.rs checks it against gate_mul + to_f16.)
#[test]
#[ignore = "needs a CUDA device"]
fn prefill_fusions_give_the_unfused_bits() {
    each_fusion_model(&FUSION_GGUFS, |model, ckpt, w, toks| {
        for kv in [KvCache::F32, KvCache::F16, KvCache::Bf16] {
            for ubatch in [toks.len(), 16] {
                let run = |fuse: bool| {
                    let opts = CudaSessionOptions {
                        n_ctx: toks.len(),
                        ubatch,
                        all_logits: true,
                        kv,
                        ..Default::default()
                    };
                    let mut s = CudaSession::new(&ckpt.config, w, opts).unwrap();
                    s.set_fusions(fuse);
                    let mut out = Vec::new();
                    s.prefill(toks, |l| out.extend_from_slice(l)).unwrap();
                    out
                };
                let (fused, plain) = (run(true), run(false));
                println!(
                    "{model} kv {kv:?} ubatch {ubatch}: fused vs unfused prefill rel L2 {:.3e}",
                    rel_l2(&fused, &plain)
                );
                assert!(
                    same_bits(&fused, &plain),
                    "{model} kv {kv:?} ubatch {ubatch}: the prefill fusions changed the logits"
                );
            }
        }
    });
}

/// The 16-bit KV caches (`KvCache::F16`, `KvCache::Bf16`) on a whole tiny model: every
/// attention kernel and the cache writers, in prefill, chunked and decode steps (split-K at
/// decode), against the f32 cache. K and V rounded to f16 move the logits by about f16
/// rounding (~2e-4 here), to bf16 by about bf16's (8x coarser), on every path but the
/// quantised decode step, whose Q8_K activations turn any small input change into different
/// roundings (and, on this random tiny model, now and then a different expert): that path's
/// logits move by 5.5e-2 between its own decode and chunked steps with the f32 cache, so the
/// 16-bit caches are held to that path's own spread there (the decode attention kernels
/// themselves match the f32 kernel on every cache: tests/attention.rs). Decode with a 16-bit
/// cache replays as a graph bitwise.
#[test]
#[ignore = "needs a CUDA device"]
fn kv_16bit_caches_match_the_f32_cache() {
    let ckpt = Checkpoint::open(XS2_Q8).unwrap();
    let w = weights(&ckpt);
    let toks = xs2_tokens(&ckpt);
    let run = |ubatch: usize, quantized: bool, kv: KvCache, graphs: bool| {
        let opts = CudaSessionOptions {
            ubatch,
            all_logits: true,
            cuda_graphs: graphs,
            attn_split_keys: if ubatch == 1 { 8 } else { 0 },
            quantized_activations: quantized,
            kv,
            ..Default::default()
        };
        session_logits(&ckpt, &w, &toks, opts)
    };
    // The quantised decode path's own spread: its decode steps against its chunked steps,
    // f32 cache.
    let spread = rel_l2(
        &run(1, true, KvCache::F32, true),
        &run(7, true, KvCache::F32, true),
    );
    println!("quantised decode vs chunked steps, f32 cache: rel L2 {spread:.3e}");
    for kv in [KvCache::F16, KvCache::Bf16] {
        assert!(
            same_bits(&run(1, true, kv, true), &run(1, true, kv, false)),
            "kv {kv:?}: graph replay differs from eager steps"
        );
        for quantized in [false, true] {
            for ubatch in [toks.len(), 7, 1] {
                let f32_cache = run(ubatch, quantized, KvCache::F32, true);
                let cache16 = run(ubatch, quantized, kv, true);
                let e = rel_l2(&cache16, &f32_cache);
                println!(
                    "kv {kv:?} vs f32, quantised {quantized}, ubatch {ubatch}: rel L2 {e:.3e}"
                );
                let bound = if quantized && ubatch == 1 {
                    2.0 * spread
                } else {
                    1e-2
                };
                assert!(
                    e > 0.0 && e < bound,
                    "kv {kv:?} (quantised {quantized}, ubatch {ubatch}): {e:.3e} (bound {bound:.1e})"
                );
            }
        }
    }
}

/// The quantiser kernels through the session's launch path: `rows` rows of `cols` into rows
/// `stride` apart, read back.
fn quantize_on_device(dev: &Device, fmt: ActQ, x: &[f32], cols: usize) -> (Vec<u8>, usize) {
    let rows = x.len() / cols;
    let stride = fmt.row_stride(cols);
    let (_xb, xp) = upload(dev, x);
    let ob = dev.stream.alloc_zeros::<u8>(rows * stride).unwrap();
    let op = ob.device_ptr(&dev.stream).0;
    dev.quantize_act(fmt, xp, op, cols, stride, rows).unwrap();
    let v = dev.stream.clone_dtoh(&ob).unwrap();
    dev.stream.synchronize().unwrap();
    (v, stride)
}

#[test]
#[ignore = "needs a CUDA device"]
fn activation_quantisers_match_the_cpu_bit_for_bit() {
    use lagoon_cpu::kernels::act;
    let dev = device();
    let mut rng = Rng(0xac7_0001);
    let cols = 1024;
    let rows = 6;
    let mut x: Vec<f32> = (0..rows * cols).map(|_| 3.0 * rng.f()).collect();
    // Row 1: all zero; row 2: a NaN; row 3: the largest element positive and repeated
    // (first-on-ties), exact .5 products (ties to even / away from zero); row 4: ±inf.
    x[cols..2 * cols].fill(0.0);
    x[2 * cols + 300] = f32::NAN;
    for (j, v) in x[3 * cols..4 * cols].iter_mut().enumerate() {
        *v = (j % 9) as f32 * 0.5 - 2.0;
    }
    x[3 * cols + 17] = 2.5;
    x[3 * cols + 18] = -2.5;
    x[4 * cols + 5] = f32::INFINITY;
    // Row 5: NaN where ggml's in-order amax fold gives something other than the plain
    // largest magnitude: a 32-block's last element, its first, two in one block (the fold
    // restarts after the last), one followed by the block's largest magnitude.
    x[5 * cols + 31] = f32::NAN;
    x[5 * cols + 32] = f32::NAN;
    x[5 * cols + 70] = f32::NAN;
    x[5 * cols + 75] = f32::NAN;
    x[5 * cols + 100] = f32::NAN;
    x[5 * cols + 101] = 9.0;
    for fmt in [ActQ::Q8K, ActQ::Q8_0] {
        let (got, stride) = quantize_on_device(&dev, fmt, &x, cols);
        for r in 0..rows {
            let row = &x[r * cols..(r + 1) * cols];
            let mut want = vec![
                0u8;
                if fmt == ActQ::Q8K {
                    act::q8k_row_bytes(cols)
                } else {
                    act::q8_0_row_bytes(cols)
                }
            ];
            match fmt {
                ActQ::Q8K => act::quantize_row_q8k(row, &mut want),
                ActQ::Q8_0 => act::quantize_row_q8_0(row, &mut want),
            }
            let g = &got[r * stride..r * stride + want.len()];
            // NaN scales may differ in payload; compare them as "both NaN".
            let same = g
                .chunks(4)
                .zip(want.chunks(4))
                .enumerate()
                .all(|(i, (a, b))| {
                    a == b
                        || (4 * i >= cols
                            && f32::from_le_bytes(a.try_into().unwrap()).is_nan()
                            && f32::from_le_bytes(b.try_into().unwrap()).is_nan())
                });
            assert!(
                same,
                "{fmt:?} row {r}: device bytes differ from the CPU quantiser"
            );
        }
        println!("{fmt:?}: {rows} rows of {cols} identical to the CPU quantiser");
    }
}

/// The CPU's rows of `m` dotted with `x` as the quantised-activation path computes them: `x`
/// quantised in the matrix's activation format, then the (scalar) integer dot kernels.
fn cpu_dots(k: &lagoon_cpu::kernels::Kernels, m: &MatRef<'_>, x: &[f32]) -> Vec<f32> {
    use lagoon_cpu::kernels::Kernels;
    let afmt = k.act_format(m);
    let mut a = vec![0u8; Kernels::act_row_bytes(afmt, m.cols)];
    k.quantize_act(afmt, x, &mut a);
    let mut y = vec![0.0f32; m.rows];
    k.dot_rows(m, 0, &a, &mut y);
    y
}

#[test]
#[ignore = "needs a CUDA device"]
fn quantised_mat_vec_matches_the_cpu_kernels() {
    use lagoon_cpu::kernels::Kernels;
    let dev = device();
    let mut rng = Rng(0x3a7_0002);
    let k = Kernels::scalar();
    // (The grid IQ types: the integer kernels of CudaSessionOptions::grid_iq_mvq; Q5_K and
    // IQ4_XS: those of CudaSessionOptions::q5k_iq4xs_mvq.)
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::IQ3XXS,
        GgmlType::IQ2XXS,
        GgmlType::IQ2S,
        GgmlType::Q5K,
        GgmlType::IQ4XS,
    ] {
        for (rows, cols) in [(37usize, 256usize), (70, 1024), (9, 3072)] {
            let data = random_rows(&mut rng, ty, rows, cols);
            let m = MatRef {
                rows,
                cols,
                enc: Encoding::Ggml { ty, data: &data },
            };
            let wt = lagoon_cuda::weights::wtype_grid(ty, true).unwrap();
            let fmt = wt.act().unwrap();
            let mv = wt.mvq().unwrap().mv;
            let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
            // CPU: the same activation quantisation and the scalar integer kernels.
            let want = cpu_dots(&k, &m, &x);
            let (q, _) = quantize_on_device(&dev, fmt, &x, cols);
            let (_qb, qp) = upload(&dev, &q);
            let (_wb, wp) = upload(&dev, &data);
            let ob = dev.stream.alloc_zeros::<f32>(rows).unwrap();
            let op = ob.device_ptr(&dev.stream).0;
            // The session's launch path (`Device::mv`), one product.
            let one = MvMat {
                w: wp,
                row_bytes: ty.row_bytes(cols as u64).unwrap(),
                rows,
                out: op,
                res: 0,
            };
            dev.mv(mv, qp, cols, &[one]).unwrap();
            let got = download(&dev, &ob);
            let e = max_rel(&got, &want);
            println!("mv {ty} {rows}x{cols}: max rel err vs CPU scalar kernel {e:.2e}");
            assert!(e < 1e-5, "mv {ty} {rows}x{cols}: {e}");
        }
    }
}

/// The two-type mat-vec kernels (`mv2_*`, one launch for a run of products of one input in
/// two weight types: Q4_K_M's Q6_K value projection beside its Q4_K Q/K/gate) give bitwise
/// the outputs of the single-type kernels launched per type, residual add included.
#[test]
#[ignore = "needs a CUDA device"]
fn two_type_mat_vec_runs_equal_single_type_launches() {
    let dev = device();
    let mut rng = Rng(0x3a7_0022);
    for (t, u) in [
        (GgmlType::Q4K, GgmlType::Q6K),
        (GgmlType::Q5K, GgmlType::Q6K),
        (GgmlType::IQ4XS, GgmlType::Q5K),
    ] {
        let (wt, wu) = (wtype_grid(t, true).unwrap(), wtype_grid(u, true).unwrap());
        let pair = wt.mv_pair(wu).expect("a two-type kernel");
        assert_eq!(wt.act(), wu.act());
        for cols in [256usize, 3072] {
            // Products: 37 rows of t (with a residual), 70 of u, 9 of t.
            let shapes = [(t, 37usize), (u, 70), (t, 9)];
            let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
            let (q, _) = quantize_on_device(&dev, wt.act().unwrap(), &x, cols);
            let (_qb, qp) = upload(&dev, &q);
            let res: Vec<f32> = (0..37).map(|_| rng.f()).collect();
            let (_rb, rp) = upload(&dev, &res);
            let mut keep = Vec::new();
            let mut mats = Vec::new();
            for &(ty, rows) in &shapes {
                let data = random_rows(&mut rng, ty, rows, cols);
                let (b, p) = upload(&dev, &data);
                keep.push(b);
                mats.push((ty, rows, p));
            }
            let outs: Vec<_> = (0..6)
                .map(|i| dev.stream.alloc_zeros::<f32>(shapes[i % 3].1).unwrap())
                .collect();
            let mv = |i: usize, o: usize| MvMat {
                w: mats[i].2,
                row_bytes: mats[i].0.row_bytes(cols as u64).unwrap(),
                rows: mats[i].1,
                out: outs[o].device_ptr(&dev.stream).0,
                res: if i == 0 { rp } else { 0 },
            };
            // One launch per type (the t products together), then the pair kernel with the
            // t products first.
            dev.mv(wt.mvq().unwrap().mv, qp, cols, &[mv(0, 0), mv(2, 2)])
                .unwrap();
            dev.mv(wu.mvq().unwrap().mv, qp, cols, &[mv(1, 1)]).unwrap();
            dev.mv2(pair, qp, cols, &[mv(0, 3), mv(2, 5), mv(1, 4)], 2)
                .unwrap();
            for i in 0..3 {
                let (a, b) = (download(&dev, &outs[i]), download(&dev, &outs[i + 3]));
                assert!(
                    a.iter().any(|&v| v != 0.0),
                    "{t}+{u} {cols}: product {i} empty"
                );
                assert!(
                    same_bits(&a, &b),
                    "{t}+{u} {cols}: product {i} differs from its single-type launch"
                );
            }
            println!("mv2 {t}+{u}, {cols} columns: bitwise the single-type launches");
        }
    }
}

/// The batch-1 kernels of compressed-tensors int4 and int8 blocks (against Q8_0 activations,
/// as the CPU pairs them) and of bf16/f16 weights (against the f32 input itself), through the
/// session's launch path, against the CPU: the CT4 products against the CPU's integer
/// kernel, the float ones against the exact f32 product; the SwiGLU kernels against the same
/// references of their gate and up.
#[test]
#[ignore = "needs a CUDA device"]
fn ct4_and_float_mat_vecs_match_the_cpu() {
    use lagoon_core::quant::ct::{CtKind, CtMatrix, CtStrategy, PackOrder, ScaleDtype};
    use lagoon_cpu::kernels::Kernels;
    use lagoon_cuda::manifest::WType;
    let dev = device();
    let mut rng = Rng(0xc74_0003);
    let k = Kernels::scalar();
    let silu = |v: f32| v / (1.0 + (-v).exp());
    // `mv` on the first matrix, and the SwiGLU kernel (with its grid) on both, read back.
    let run = |mv: K, swiglu: (K, u32), wp: [u64; 2], row_bytes: u64, rows, cols, src: u64| {
        let ob = dev.stream.alloc_zeros::<f32>(rows).unwrap();
        let op = ob.device_ptr(&dev.stream).0;
        let one = MvMat {
            w: wp[0],
            row_bytes,
            rows,
            out: op,
            res: 0,
        };
        dev.mv(mv, src, cols, &[one]).unwrap();
        let y = download(&dev, &ob);
        let sb = dev.stream.alloc_zeros::<f32>(rows).unwrap();
        dev.launch(
            swiglu.0,
            (swiglu.1, 1),
            128,
            &[
                Arg::P(wp[0]),
                Arg::P(wp[1]),
                Arg::P(row_bytes),
                Arg::P(src),
                Arg::P(sb.device_ptr(&dev.stream).0),
                Arg::I(rows as i32),
                Arg::I(cols as i32),
            ],
        )
        .unwrap();
        (y, download(&dev, &sb))
    };
    for (rows, cols) in [(37usize, 1024usize), (9, 3072), (70, 96)] {
        let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
        // CT4: symmetric and asymmetric (packed zero points), bf16 and f16 scales; CT8: W8A16
        // (pack-quantized 8-bit, group 32, packed zero points) and W8A8 (int-quantized I8,
        // channel scales, symmetric and with plain zero points).
        let ct4 =
            |asym: bool| CtKind::packed_int(4, CtStrategy::Group(32), !asym, PackOrder::Dense);
        let i8ch = |asym: bool| CtKind::Int8 {
            symmetric: !asym,
            strategy: CtStrategy::Channel,
        };
        for (kind, sd) in [
            (ct4(false), ScaleDtype::Bf16),
            (ct4(true), ScaleDtype::Bf16),
            (ct4(false), ScaleDtype::F16),
            (ct4(true), ScaleDtype::F16),
            (
                CtKind::packed_int(8, CtStrategy::Group(32), false, PackOrder::Dense),
                ScaleDtype::Bf16,
            ),
            (i8ch(false), ScaleDtype::Bf16),
            (i8ch(true), ScaleDtype::F16),
        ] {
            let bits8 = matches!(
                kind,
                CtKind::Int8 { .. } | CtKind::PackedInt { bits: 8, .. }
            );
            let (wt, block_bytes) = if bits8 {
                (WType::Ct8, lagoon_cuda::weights::CT8_BLOCK_BYTES)
            } else {
                (WType::Ct4, lagoon_cuda::weights::CT4_BLOCK_BYTES)
            };
            let mats: Vec<_> = (0..2)
                .map(|_| common::random_ct(&mut rng, kind, rows, cols, sd))
                .collect();
            let ms: Vec<MatRef> = mats
                .iter()
                .map(|(layout, [w, s, z])| MatRef {
                    rows,
                    cols,
                    enc: Encoding::Ct(CtMatrix::new(*layout, w, s, z).unwrap()),
                })
                .collect();
            let afmt = k.act_format(&ms[0]);
            let mut a = vec![0u8; Kernels::act_row_bytes(afmt, cols)];
            k.quantize_act(afmt, &x, &mut a);
            let want: Vec<Vec<f32>> = ms
                .iter()
                .map(|m| {
                    let mut y = vec![0.0f32; rows];
                    k.dot_rows(m, 0, &a, &mut y);
                    y
                })
                .collect();
            let blocks: Vec<Vec<u8>> = ms
                .iter()
                .map(|m| {
                    if bits8 {
                        lagoon_cuda::weights::ct8_blocks(m).unwrap()
                    } else {
                        lagoon_cuda::weights::ct4_blocks(m).unwrap()
                    }
                })
                .collect();
            let (_b0, w0) = upload(&dev, &blocks[0]);
            let (_b1, w1) = upload(&dev, &blocks[1]);
            let (q, _) = quantize_on_device(&dev, wt.act().unwrap(), &x, cols);
            let (_qb, qp) = upload(&dev, &q);
            let kq = wt.mvq().unwrap();
            let row_bytes = (cols / 32 * block_bytes) as u64;
            let swiglu = (kq.swiglu, rows.div_ceil(4) as u32);
            let (y, act) = run(kq.mv, swiglu, [w0, w1], row_bytes, rows, cols, qp);
            let e = max_rel(&y, &want[0]);
            let want_act: Vec<f32> = (0..rows).map(|r| silu(want[0][r]) * want[1][r]).collect();
            let ea = max_rel(&act, &want_act);
            println!(
                "{kind} ({sd:?}) {rows}x{cols}: mv {e:.2e}, swiglu {ea:.2e} vs CPU integer kernel"
            );
            assert!(
                e < 1e-5 && ea < 1e-5,
                "{kind} {rows}x{cols}: {e:.2e} / {ea:.2e}"
            );
        }
        // BF16 / F16 against the f32 input.
        for ty in [GgmlType::BF16, GgmlType::F16] {
            let data: Vec<Vec<u8>> = (0..2)
                .map(|_| random_rows(&mut rng, ty, rows, cols))
                .collect();
            let want: Vec<Vec<f32>> = data
                .iter()
                .map(|d| {
                    let m = MatRef {
                        rows,
                        cols,
                        enc: Encoding::Ggml { ty, data: d },
                    };
                    let mut y = vec![0.0f32; rows];
                    let mut scratch = vec![0.0; cols];
                    lagoon_core::ops::matmul::matmul(&m, &x, 1, &mut y, &mut scratch);
                    y
                })
                .collect();
            let (_b0, w0) = upload(&dev, &data[0]);
            let (_b1, w1) = upload(&dev, &data[1]);
            let (_xb, xp) = upload(&dev, &x);
            let (mv, swiglu) = wtype(ty).unwrap().mvh().unwrap();
            // The float SwiGLU kernel takes a block per row.
            let (y, act) = run(
                mv,
                (swiglu, rows as u32),
                [w0, w1],
                2 * cols as u64,
                rows,
                cols,
                xp,
            );
            let e = max_rel(&y, &want[0]);
            let want_act: Vec<f32> = (0..rows).map(|r| silu(want[0][r]) * want[1][r]).collect();
            let ea = max_rel(&act, &want_act);
            println!("{ty} {rows}x{cols}: mv {e:.2e}, swiglu {ea:.2e} vs exact f32 product");
            assert!(
                e < 1e-5 && ea < 1e-5,
                "{ty} {rows}x{cols}: {e:.2e} / {ea:.2e}"
            );
        }
    }
}

/// `mv_stage_*` (more of each row requested before the wait, lab switch `MV_STAGE`) adds each
/// lane's pieces in `mv_*`'s order, so its outputs equal the plain float kernel's bit for bit:
/// rows wider than the staged part (S 2.1's 9216-wide O projection), ending inside it (6144),
/// within the register batch (1000), with a residual and without. The plain kernel on the
/// same rows split into two products of one launch gives the same bits too (under
/// `LAGOON_CUDA_DEFINES=H_ROWS=2` this checks the row pairs against `mv_stage_*`'s one row a
/// warp, odd row counts included).
#[test]
#[ignore = "needs a CUDA device"]
fn staged_float_mat_vec_equals_the_plain_kernel() {
    let dev = device();
    let mut rng = Rng(0x57a6_e001);
    for (rows, cols) in [(770usize, 9216usize), (37, 6144), (9, 1000), (130, 12808)] {
        for ty in [GgmlType::BF16, GgmlType::F16] {
            let wt = wtype(ty).unwrap();
            let data = random_rows(&mut rng, ty, rows, cols);
            let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
            let res: Vec<f32> = (0..rows).map(|_| rng.f()).collect();
            let (_wb, wp) = upload(&dev, &data);
            let (_xb, xp) = upload(&dev, &x);
            let (_rb, rp) = upload(&dev, &res);
            for with_res in [false, true] {
                let outs: Vec<Vec<f32>> = [wt.mvh().unwrap().0, wt.mvh_stage().unwrap()]
                    .into_iter()
                    .map(|k| {
                        let ob = dev.stream.alloc_zeros::<f32>(rows).unwrap();
                        let m = MvMat {
                            w: wp,
                            row_bytes: 2 * cols as u64,
                            rows,
                            out: ob.device_ptr(&dev.stream).0,
                            res: if with_res { rp } else { 0 },
                        };
                        dev.mv(k, xp, cols, &[m]).unwrap();
                        download(&dev, &ob)
                    })
                    .collect();
                assert!(
                    outs[0]
                        .iter()
                        .zip(&outs[1])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ty} {rows}x{cols} residual {with_res}: staged differs from mv"
                );
                assert!(outs[0].iter().any(|&v| v != 0.0));
                // The plain kernel with the rows as two products of one launch, split after an
                // odd row (under H_ROWS=2 a pair of one row ends the first), gives the same bits.
                let ob = dev.stream.alloc_zeros::<f32>(rows).unwrap();
                let op = ob.device_ptr(&dev.stream).0;
                let part = |r0: usize, n: usize| MvMat {
                    w: wp + (r0 * 2 * cols) as u64,
                    row_bytes: 2 * cols as u64,
                    rows: n,
                    out: op + 4 * r0 as u64,
                    res: if with_res { rp + 4 * r0 as u64 } else { 0 },
                };
                let k = (rows / 2) | 1;
                dev.mv(
                    wt.mvh().unwrap().0,
                    xp,
                    cols,
                    &[part(0, k), part(k, rows - k)],
                )
                .unwrap();
                assert!(
                    download(&dev, &ob)
                        .iter()
                        .zip(&outs[0])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ty} {rows}x{cols} residual {with_res}: two products differ from one"
                );
            }
        }
    }
}

/// The quant-type fixtures (`tests/fixtures/models/quant`, llama.cpp-quantised, see
/// `tests/quant_logits.rs` for the bounds): the exact path against llama.cpp's f32 path on
/// the dequantised weights, and the quantised decode (the K-quant fused MoE and mat-vec
/// kernels on a real model) within 1.25 x llama.cpp's own CPU-vs-f32 distance of it.
#[test]
#[ignore = "needs a CUDA device"]
fn quant_type_models_match_llama_cpp() {
    let dir = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/models/quant"
    ));
    let toks: Vec<u32> = std::fs::read_to_string(dir.join("eval_tokens.txt"))
        .unwrap()
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    // The grid IQ types run with CudaSessionOptions::grid_iq (their codebook decoders, the
    // default since this test passed on the H200 in session 13) and must then have fewer
    // matrices decoded to f32 at upload than without it.
    for ty in [
        "q8_0", "q4_k_m", "q6_k", "q5_k_m", "iq4_xs", "q4_0", "iq3_xxs", "iq2_xxs", "iq2_s",
    ] {
        let grid_iq = matches!(ty, "iq3_xxs" | "iq2_xxs" | "iq2_s");
        let ckpt = Checkpoint::open(dir.join(format!("model-{ty}.gguf"))).unwrap();
        let w = weights(&ckpt);
        let deq = read_f32(&dir.join(format!("logits.llamacpp.{ty}.deq.f32")));
        let llama = read_f32(&dir.join(format!("logits.llamacpp.{ty}.f32")));
        let d_llama = rel_l2(&llama, &deq);
        let run_mvq = |ubatch: usize,
                       quantized: bool,
                       grid_iq: bool,
                       grid_iq_mvq: bool,
                       q5k_iq4xs_mvq: bool| {
            let mut s = CudaSession::new(
                &ckpt.config,
                &w,
                CudaSessionOptions {
                    n_ctx: toks.len(),
                    ubatch,
                    all_logits: true,
                    quantized_activations: quantized,
                    grid_iq,
                    grid_iq_mvq,
                    q5k_iq4xs_mvq,
                    ..Default::default()
                },
            )
            .unwrap_or_else(|e| panic!("{ty}: {e}"));
            let mut out = Vec::new();
            s.prefill(&toks, |l| out.extend_from_slice(l)).unwrap();
            (out, s.weight_bytes().1)
        };
        let run_with = |ubatch: usize, quantized: bool, grid_iq: bool| {
            run_mvq(ubatch, quantized, grid_iq, false, false)
        };
        let run = |ubatch: usize, quantized: bool| run_with(ubatch, quantized, grid_iq);
        let (exact, nd) = run(toks.len(), false);
        let (fast, _) = run(1, true);
        // One-shot prefill on the fast path: the tensor-core products (f16 operands).
        let (tc, _) = run(toks.len(), true);
        if grid_iq {
            let (_, nd_f32) = run_with(toks.len(), false, false);
            assert!(
                nd < nd_f32,
                "{ty}: {nd} matrices decoded to f32 with grid_iq, {nd_f32} without"
            );
        }
        let (e_exact, e_fast, e_tc) =
            (rel_l2(&exact, &deq), rel_l2(&fast, &deq), rel_l2(&tc, &deq));
        println!(
            "{ty}: exact vs llama.cpp f32 {e_exact:.3e}; quantised decode vs llama.cpp f32 {e_fast:.3e} ({:.2} x llama.cpp's own {d_llama:.3e}); tensor-core prefill {e_tc:.3e} ({:.2} x); {nd} matrices decoded to f32 at upload",
            e_fast / d_llama,
            e_tc / d_llama
        );
        if grid_iq {
            // Decode on the grid types' integer mat-vec kernels (Q8_K activations, as the
            // CPU's fast path and llama.cpp pair them).
            let (mvq, _) = run_mvq(1, true, true, true, false);
            let e_mvq = rel_l2(&mvq, &deq);
            println!(
                "{ty}: quantised decode on the integer grid-IQ kernels vs llama.cpp f32 {e_mvq:.3e} ({:.2} x llama.cpp's own)",
                e_mvq / d_llama
            );
            assert!(
                e_mvq <= 1.25 * d_llama,
                "{ty}: integer grid-IQ decode {e_mvq:.3e}"
            );
        }
        if matches!(ty, "q5_k_m" | "iq4_xs") {
            // Decode with Q5_K and IQ4_XS on their integer mat-vec kernels.
            let (mvq, _) = run_mvq(1, true, grid_iq, false, true);
            let e_mvq = rel_l2(&mvq, &deq);
            println!(
                "{ty}: quantised decode on the integer Q5_K / IQ4_XS kernels vs llama.cpp f32 {e_mvq:.3e} ({:.2} x llama.cpp's own)",
                e_mvq / d_llama
            );
            assert!(
                e_mvq <= 1.25 * d_llama,
                "{ty}: integer Q5_K / IQ4_XS decode {e_mvq:.3e}"
            );
        }
        assert!(e_exact <= MAX_REL_L2, "{ty}: exact {e_exact:.3e}");
        assert!(
            e_fast <= 1.25 * d_llama,
            "{ty}: quantised decode {e_fast:.3e}"
        );
        // f16 operands round more finely than llama.cpp's Q8 activations.
        assert!(
            e_tc <= 1.25 * d_llama,
            "{ty}: tensor-core prefill {e_tc:.3e}"
        );
    }
}

/// The 4-layer S 2.1-shaped model of head_dim 128 that `kv_caches_on_a_head_dim_128_model`
/// describes, written by `synth` (Q8_0) into a fresh temporary directory named after `tag`
/// (the caller removes it).
fn head_dim_128_model(tag: &str) -> (std::path::PathBuf, Checkpoint) {
    use lagoon_gguf::synth::{self, mix::TypeMix, preset::Preset};
    let shape = lagoon_gguf::synth::preset::Shape {
        vocab_size: 512,
        hidden: 256,
        n_heads_full: 12,
        n_heads_sliding: 18,
        n_kv_heads: 2,
        sliding_window: 16,
        dense_ffn: 512,
        n_experts: 8,
        n_experts_used: 2,
        expert_ffn: 256,
        shared_ffn: 256,
        ..Preset::S21.shape()
    }
    .with_layers(4);
    assert_eq!(shape.head_dim, 128);
    let dir = std::env::temp_dir().join(format!("lagoon-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.gguf");
    let mut o = synth::SynthOptions::new(shape, TypeMix::Q8_0, "kv128");
    o.seed = 7;
    synth::write(&path, &o).unwrap();
    let ckpt = Checkpoint::open(&path).unwrap();
    (dir, ckpt)
}

/// Every KV cache on a whole model with head_dim 128 (the tiny fixtures' 16 and 64 are too
/// narrow for the q8_0 cache and the tensor-core attention): a 4-layer S 2.1-shaped model
/// shrunk to hidden 256 (GQA groups of 6 and 9 over 2 KV heads, a 16-key sliding window so
/// the rings wrap, partial RoPE with YaRN on the full layers) written by `synth` (Q8_0), 40
/// tokens. Against the f32 cache on the quantised path: prefill, chunks of 7 (the q8_0
/// cache's small steps take the tensor-core prefill kernel) and decode (within twice the
/// decode path's own spread against its chunked steps, as `kv_16bit_caches_match_the_f32_cache`
/// bounds it; five times that for q8_0); decode replayed as a graph equals the eager steps bitwise.
#[test]
#[ignore = "needs a CUDA device"]
fn kv_caches_on_a_head_dim_128_model() {
    let (dir, ckpt) = head_dim_128_model("kv128");
    let w = weights(&ckpt);
    let mut rng = Rng(0x6e33_0128);
    let toks: Vec<u32> = (0..40).map(|_| (rng.next() % 512) as u32).collect();
    let run = |ubatch: usize, kv: KvCache, graphs: bool| {
        let opts = CudaSessionOptions {
            ubatch,
            all_logits: true,
            cuda_graphs: graphs,
            quantized_activations: true,
            kv,
            ..Default::default()
        };
        session_logits(&ckpt, &w, &toks, opts)
    };
    let spread = rel_l2(&run(1, KvCache::F32, true), &run(7, KvCache::F32, true));
    println!("head_dim 128: quantised decode vs chunked steps, f32 cache: rel L2 {spread:.3e}");
    for kv in [KvCache::F16, KvCache::Bf16, KvCache::Q8_0] {
        assert!(
            same_bits(&run(1, kv, true), &run(1, kv, false)),
            "kv {kv:?}: graph replay differs from eager steps"
        );
        for ubatch in [toks.len(), 7, 1] {
            let e = rel_l2(&run(ubatch, kv, true), &run(ubatch, KvCache::F32, true));
            println!("head_dim 128: kv {kv:?} vs f32, ubatch {ubatch}: rel L2 {e:.3e}");
            // The tensor-core kernels (prefill, decode) stage an f32 cache's K and V as f16,
            // so the f16 cache gives their bits exactly; the 7-token steps of the f16 cache
            // take attention.cu, which reads the f32 values as they are.
            if kv == KvCache::F16 && ubatch != 7 {
                assert_eq!(e, 0.0, "kv f16, ubatch {ubatch}: not the f32 cache's bits");
                continue;
            }
            // Decode steps quantise their activations to Q8 (discontinuous: a changed key
            // can flip a rounding), so they carry the cache's error ~10x further than the
            // f16-activation prefill does (measured on the device: bf16 1.5e-3 prefill,
            // 1.5e-2 decode; q8_0 4.4e-3, 6.4e-2). Twice the decode path's own spread bounds
            // the 16-bit caches; a q8_0 block's rounding error (rms ~0.57% of an element's
            // scale on Gaussian values: step max/127, max ~2.5 sigma) is ~5x bf16's (~0.11%),
            // so its bound is five times that. A wrong scale or ring slot is O(1).
            let bound = match (ubatch, kv) {
                (1, KvCache::Q8_0) => 10.0 * spread,
                (1, _) => 2.0 * spread,
                _ => 3e-2,
            };
            assert!(
                e > 0.0 && e < bound,
                "kv {kv:?}, ubatch {ubatch}: {e:.3e} (bound {bound:.1e})"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The QK-norm + RoPE + KV store inside the tensor-core GQA decode kernel
/// (`qk_attention` with an f16 cache: `flash.cu`'s `attention_decode_gqa_qk_f16`) gives the
/// bits of `qk_norm_rope_store` + `attention_decode_gqa`, on the head_dim 128 model (GQA
/// groups of 6 and 9, a 16-key sliding window whose ring wraps, YaRN on the full layers):
/// 40 one-token steps, one split and 8-key splits (only the split holding the position has
/// its key), graph replay and eager steps. A profiled run checks that every layer step ran
/// the fused kernel.
#[test]
#[ignore = "needs a CUDA device"]
fn gqa_qk_fusion_gives_the_unfused_bits() {
    let (dir, ckpt) = head_dim_128_model("gqaqk");
    let w = weights(&ckpt);
    let mut rng = Rng(0x6e33_0129);
    let toks: Vec<u32> = (0..40).map(|_| (rng.next() % 512) as u32).collect();
    for graphs in [true, false] {
        for split_keys in [0, 8] {
            let opts = |qk_attention: bool| CudaSessionOptions {
                n_ctx: toks.len(),
                ubatch: 1,
                attn_split_keys: split_keys,
                cuda_graphs: graphs,
                quantized_activations: true,
                kv: KvCache::F16,
                qk_attention,
                ..Default::default()
            };
            assert_fusion_bits(
                &format!("head_dim 128, graphs {graphs}, split keys {split_keys}, QK in GQA"),
                logits_on_off(&ckpt, &w, &toks, opts),
            );
        }
    }
    let opts = CudaSessionOptions {
        n_ctx: toks.len(),
        ubatch: 1,
        quantized_activations: true,
        kv: KvCache::F16,
        qk_attention: true,
        ..Default::default()
    };
    qk_fused_launches(
        &ckpt,
        &w,
        &toks,
        opts,
        "attention_decode_gqa_qk",
        "head_dim 128",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The batch-1 expert down kernels with one block per output row (`moe_down_r_*`, each row's
/// experts spread over the block's warps, one or two per warp) against `moe_down_q_*` (one
/// warp per output row): the same sums in another float order, so within a few ulp. Q4_K and
/// Q6_K at 1024 and 512 columns take the short-row paths (every piece loaded first), 1536
/// and Q8_0 the generic loop; with and without a shared expert and the residual.
#[test]
#[ignore = "needs a CUDA device"]
fn expert_down_rows_match_one_warp_per_row() {
    let dev = device();
    let mut rng = Rng(0xd0_0001);
    let (h, n_experts, k) = (200usize, 12usize, 10usize);
    for (ty, i) in [
        (GgmlType::Q4K, 1024usize),
        (GgmlType::Q6K, 1024),
        (GgmlType::Q6K, 512),
        (GgmlType::Q4K, 1536),
        (GgmlType::Q8_0, 1024),
    ] {
        let wt = wtype_grid(ty, true).unwrap();
        let down = wt.mvq().unwrap().down;
        let rows = down.down_rows().expect("a rows form");
        let row_bytes = ty.row_bytes(i as u64).unwrap();
        let expert_bytes = row_bytes * h as u64;
        let (_wb, wp) = upload(&dev, &random_rows(&mut rng, ty, n_experts * h, i));
        let (_sb, sp) = upload(&dev, &random_rows(&mut rng, ty, h, i));
        let x: Vec<f32> = (0..(k + 1) * i).map(|_| rng.f()).collect();
        let (q, stride) = quantize_on_device(&dev, wt.act().unwrap(), &x, i);
        let (_qb, qp) = upload(&dev, &q);
        // Ten distinct experts in a shuffled order, as the router's bits.
        let mut ids: Vec<u32> = (0..n_experts as u32).collect();
        for j in (1..ids.len()).rev() {
            ids.swap(j, (rng.next() % (j as u64 + 1)) as usize);
        }
        let wts: Vec<f32> = (0..k).map(|_| 0.05 + 0.1 * rng.f().abs()).collect();
        // As the gate/up kernel leaves route_copy: ids, weights, then the slots in ascending
        // (id, slot) order.
        let mut order: Vec<usize> = (0..k).collect();
        order.sort_by_key(|&s| (ids[s], s));
        let idf: Vec<f32> = (ids[..k].iter().map(|&e| f32::from_bits(e)))
            .chain(wts.iter().copied())
            .chain(order.iter().map(|&s| f32::from_bits(s as u32)))
            .collect();
        let (_ib, ip) = upload(&dev, &idf);
        let (_tb, tp) = upload(&dev, &wts);
        let res: Vec<f32> = (0..h).map(|_| rng.f()).collect();
        let (_rb, rp) = upload(&dev, &res);
        for (shared, residual) in [(true, true), (false, false)] {
            let run = |kern: K, grid: u32, block: u32| {
                let ob = dev.stream.alloc_zeros::<f32>(h).unwrap();
                let args = [
                    Arg::P(wp),
                    Arg::P(expert_bytes),
                    Arg::P(row_bytes),
                    Arg::P(if shared { sp } else { 0 }),
                    Arg::P(qp),
                    Arg::P(stride as u64),
                    Arg::P(ip),
                    Arg::P(tp),
                    Arg::P(if residual { rp } else { 0 }),
                    Arg::P(ob.device_ptr(&dev.stream).0),
                    Arg::I(h as i32),
                    Arg::I(i as i32),
                    Arg::I(k as i32),
                    Arg::F(1.5),
                ];
                dev.launch(kern, (grid, 1), block, &args).unwrap();
                download(&dev, &ob)
            };
            let want = run(down, h.div_ceil(4) as u32, 128);
            assert!(want.iter().all(|v| v.is_finite()) && want.iter().any(|&v| v != 0.0));
            for per_warp in [1usize, 2] {
                let warps = k.div_ceil(per_warp) + shared as usize;
                let got = run(rows, h as u32, 32 * warps as u32);
                let e = max_rel(&got, &want);
                println!("down rows {ty} I={i} shared={shared} {per_warp}/warp: max rel {e:.2e}");
                assert!(e < 1e-5, "{ty} I={i} shared={shared} {per_warp}/warp: {e}");
            }
        }
    }
}

/// The one-token expert gate/up kernels (`moe_gate_up_q_*`): for each routed slot and the
/// shared expert, silu(gate . x) * (up . x) per row, against the CPU's scalar integer dots
/// on the same quantised activation; and the routing copy the down kernel reads (ids,
/// weights, the slots in ascending (id, slot) order). Rows not a multiple of the block's
/// four warps, rows one and several rounds of super-blocks wide.
#[test]
#[ignore = "needs a CUDA device"]
fn expert_gate_up_matches_the_cpu_dots() {
    use lagoon_cpu::kernels::Kernels;
    let dev = device();
    let mut rng = Rng(0x6a7e_0001);
    let kern = Kernels::scalar();
    let (n_experts, k) = (12usize, 10usize);
    let silu = |z: f32| z / (1.0 + (-z).exp());
    for (ty, i, h) in [
        (GgmlType::Q4K, 70usize, 3072usize),
        (GgmlType::Q4K, 33, 256),
        (GgmlType::Q4K, 9, 4608),
        (GgmlType::Q6K, 70, 3072),
        (GgmlType::Q8_0, 37, 1024),
    ] {
        let wt = wtype_grid(ty, true).unwrap();
        let gate_up = wt.mvq().unwrap().gate_up;
        let row_bytes = ty.row_bytes(h as u64).unwrap();
        let expert_bytes = row_bytes * i as u64;
        let g = random_rows(&mut rng, ty, n_experts * i, h);
        let u = random_rows(&mut rng, ty, n_experts * i, h);
        let sg = random_rows(&mut rng, ty, i, h);
        let su = random_rows(&mut rng, ty, i, h);
        let x: Vec<f32> = (0..h).map(|_| rng.f()).collect();
        let mut ids: Vec<u32> = (0..n_experts as u32).collect();
        for j in (1..ids.len()).rev() {
            ids.swap(j, (rng.next() % (j as u64 + 1)) as usize);
        }
        ids.truncate(k);
        let wts: Vec<f32> = (0..k).map(|_| 0.05 + 0.1 * rng.f().abs()).collect();
        // The CPU: the same activation quantisation, the scalar integer dots.
        let m = |data: &[u8]| {
            let m = MatRef {
                rows: i,
                cols: h,
                enc: Encoding::Ggml { ty, data },
            };
            cpu_dots(&kern, &m, &x)
        };
        let eb = expert_bytes as usize;
        let mut want = Vec::with_capacity((k + 1) * i);
        for (gm, um) in ids
            .iter()
            .map(|&e| (&g[e as usize * eb..][..eb], &u[e as usize * eb..][..eb]))
            .chain([(&sg[..], &su[..])])
        {
            want.extend(m(gm).iter().zip(m(um)).map(|(&a, b)| silu(a) * b));
        }
        let (q, _) = quantize_on_device(&dev, wt.act().unwrap(), &x, h);
        let (_qb, qp) = upload(&dev, &q);
        let (_gb, gp) = upload(&dev, &g);
        let (_ub, up) = upload(&dev, &u);
        let (_sgb, sgp) = upload(&dev, &sg);
        let (_sub, sup) = upload(&dev, &su);
        let idf: Vec<f32> = ids.iter().map(|&e| f32::from_bits(e)).collect();
        let (_ib, ip) = upload(&dev, &idf);
        let (_tb, tp) = upload(&dev, &wts);
        let rc = dev.stream.alloc_zeros::<f32>(3 * k).unwrap();
        let ob = dev.stream.alloc_zeros::<f32>((k + 1) * i).unwrap();
        let args = [
            Arg::P(gp),
            Arg::P(up),
            Arg::P(expert_bytes),
            Arg::P(row_bytes),
            Arg::P(sgp),
            Arg::P(sup),
            Arg::P(qp),
            Arg::P(ip),
            Arg::P(tp),
            Arg::P(rc.device_ptr(&dev.stream).0),
            Arg::P(ob.device_ptr(&dev.stream).0),
            Arg::I(i as i32),
            Arg::I(h as i32),
            Arg::I(k as i32),
            Arg::I(0),
        ];
        dev.launch(
            gate_up,
            (gate_up_blocks(gate_up, i, h), k as u32 + 1),
            128,
            &args,
        )
        .unwrap();
        let got = download(&dev, &ob);
        let e = max_rel(&got, &want);
        println!("gate/up {ty} {i}x{h}: max rel {e:.2e} against the CPU's dots");
        assert!(e < 1e-5, "gate/up {ty} {i}x{h}: {e}");
        let copy = download(&dev, &rc);
        let mut order: Vec<usize> = (0..k).collect();
        order.sort_by_key(|&s| (ids[s], s));
        let want_copy: Vec<u32> = (ids.iter().copied())
            .chain(wts.iter().map(|w| w.to_bits()))
            .chain(order.iter().map(|&s| s as u32))
            .collect();
        let got_copy: Vec<u32> = copy.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got_copy, want_copy, "{ty}: the routing copy");
    }
}

/// `argmax_feed` (sample.cu) picks what the CPU's argmax picks -- ties to the first, NaN
/// never over a number, -0 equal to +0, 0 when every logit is NaN -- and feeds it on: the
/// token into params[2], the position advanced, the token appended to the list; launched
/// twice on the same state words, so the reset between launches is checked too.
#[test]
#[ignore = "needs a CUDA device"]
fn device_argmax_picks_what_the_cpu_picks() {
    let dev = device();
    let mut rng = Rng(4242);
    let n = 100_352usize;
    let mut cases: Vec<Vec<f32>> = Vec::new();
    let random: Vec<f32> = (0..n).map(|_| 8.0 * rng.f()).collect();
    cases.push(random.clone());
    // A tie between two far-apart positions (the second in a later block).
    let mut tie = random.clone();
    tie[70_001] = 100.0;
    tie[5] = 100.0;
    cases.push(tie);
    // NaNs everywhere but a few numbers, the largest negative.
    let mut nan = vec![f32::NAN; n];
    nan[9_000] = -3.0;
    nan[80_000] = -2.5;
    cases.push(nan);
    cases.push(vec![f32::NAN; n]);
    // All -inf, and signed zeros as the maximum (-0 first).
    cases.push(vec![f32::NEG_INFINITY; n]);
    let mut zeros = vec![-1.0f32; n];
    zeros[40_000] = -0.0;
    zeros[60_000] = 0.0;
    cases.push(zeros);
    // A short vocabulary (one partial block).
    cases.push((0..1000).map(|_| rng.f()).collect());
    for (c, logits) in cases.iter().enumerate() {
        let want = lagoon_core::sample::argmax(logits);
        let (_lb, lp) = upload(&dev, logits);
        let sb = dev.stream.alloc_zeros::<u64>(2).unwrap();
        let pb = dev.stream.alloc_zeros::<u32>(3).unwrap();
        let ob = dev.stream.alloc_zeros::<u32>(4).unwrap();
        let (sp, pp, op) = (
            sb.device_ptr(&dev.stream).0,
            pb.device_ptr(&dev.stream).0,
            ob.device_ptr(&dev.stream).0,
        );
        for _ in 0..2 {
            dev.launch(
                K::ArgmaxFeed,
                (logits.len().div_ceil(4096) as u32, 1),
                256,
                &[
                    Arg::P(lp),
                    Arg::I(logits.len() as i32),
                    Arg::P(sp),
                    Arg::P(pp),
                    Arg::P(op),
                ],
            )
            .unwrap();
        }
        let params = dev.stream.clone_dtoh(&pb).unwrap();
        let list = dev.stream.clone_dtoh(&ob).unwrap();
        let state = dev.stream.clone_dtoh(&sb).unwrap();
        dev.stream.synchronize().unwrap();
        println!(
            "argmax case {c}: cpu {want}, device {} (list {list:?})",
            params[2]
        );
        assert_eq!(params[2], want, "case {c}");
        assert_eq!(
            params[0], 2,
            "case {c}: the position advances once per launch"
        );
        assert_eq!(&list[..3], &[2, want, want], "case {c}");
        assert_eq!(state, [0, 0], "case {c}: the state words are reset");
    }
}

/// Greedy decoding on the device gives the tokens that one-token steps with the CPU's argmax
/// give, over more than one read-back chunk and across the split-K buckets (split every 8
/// keys), with and without programmatic launch.
#[test]
#[ignore = "needs a CUDA device"]
fn greedy_decode_on_the_device_equals_steps_and_host_argmax() {
    let ckpt = Checkpoint::open(XS2_Q8).unwrap();
    let w = weights(&ckpt);
    let prompt = &xs2_tokens(&ckpt)[..6];
    let n = lagoon_cuda::session::GREEDY_CHUNK + 44;
    for pdl in [true, false] {
        let opts = CudaSessionOptions {
            ubatch: 8,
            n_ctx: prompt.len() + n + 1,
            attn_split_keys: 8,
            programmatic_launch: pdl,
            ..Default::default()
        };
        let mut a = CudaSession::new(&ckpt.config, &w, opts).unwrap();
        let mut last = Vec::new();
        a.prefill(prompt, |l| last = l.to_vec()).unwrap();
        let cols = ckpt.config.vocab_size;
        let first = lagoon_core::sample::argmax(&last[last.len() - cols..]);
        let got = a.decode_greedy(first, n).unwrap();
        assert_eq!(a.n_past(), prompt.len() + n);
        let mut b = CudaSession::new(&ckpt.config, &w, opts).unwrap();
        b.prefill(prompt, |_| {}).unwrap();
        let mut t = first;
        let mut want = Vec::with_capacity(n);
        for _ in 0..n {
            t = lagoon_core::sample::argmax(b.step(&[t]).unwrap());
            want.push(t);
        }
        let distinct = want.iter().collect::<std::collections::HashSet<_>>().len();
        println!(
            "greedy on the device (programmatic launch {pdl}): {n} tokens, {distinct} distinct, \
             equal to steps + host argmax = {}",
            got == want
        );
        assert_eq!(got, want);
        // The session goes on from there with ordinary steps.
        assert!(a.step(&[want[n - 1]]).is_ok());
    }
}
