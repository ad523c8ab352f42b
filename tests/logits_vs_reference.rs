//! Logits of every fixture model against the independent references that produced it
//! (`tools/reference/`): transformers float32 for the HF, GGUF and compressed-tensors
//! variants (on the dequantised weights for the latter), in one-shot prefill, chunked
//! prefill (ubatch 7) and token-by-token decode.

mod common;

use std::path::{Path, PathBuf};

use common::{eval, modes, open, read_f32, read_tokens, rel_l2, row_errors};

/// Bound on the relative L2 error vs transformers f32 on the reference path. The fixtures'
/// weights are exactly representable in every stored format (powers-of-two scales), so every
/// variant is held to the f32 bound of issue #2.
const MAX_REL_L2: f64 = 1e-4;

/// On the default (fast) path a GGUF may be further from transformers than the reference
/// path (activations are quantised as llama.cpp does), but the typical position may be no
/// further than llama.cpp's own CPU path on the same file, times this margin...
const LLAMA_MEDIAN_MARGIN: f64 = 1.25;
/// ...and the whole sequence no further than this multiple. Quantised activations move
/// near-tied router scores, so either engine may pick a different expert for a token and
/// carry a 0.3 error at that position; which tokens flip differs between the two, so the
/// whole-sequence figure gets the wider margin (measured: xs2_style q8_0, ours 5.2e-2 with
/// one flip at position 7, llama.cpp 1.8e-2 with none).
const LLAMA_TOTAL_MARGIN: f64 = 3.0;

/// The committed fixture cases.
fn committed_fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models");
    fixtures()
        .into_iter()
        .filter(|p| p.starts_with(&root))
        .collect()
}

/// The committed fixture cases, plus any case directories listed (colon-separated) in
/// `LAGOON_EXTRA_FIXTURES`, e.g. unseen configs made by
/// `tools/reference/gen_fixtures.py --random-config SEED --out DIR`.
fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&root)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.join("tokens.txt").exists())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    if let Ok(extra) = std::env::var("LAGOON_EXTRA_FIXTURES") {
        v.extend(
            extra
                .split(':')
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
        );
    }
    v
}

/// Whether the case's llama.cpp logits are usable: `gen_fixtures.py` marks configs where
/// llama.cpp is known to deviate from transformers (`meta.json` → `llamacpp.status`).
fn llama_is_reference(case: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(case.join("meta.json")) else {
        return false;
    };
    let meta: serde_json::Value = serde_json::from_str(&text).expect("meta.json is JSON");
    meta["llamacpp"]["status"] == "ok"
}

/// Median over positions of the per-position relative L2 error.
fn median_row_err(a: &[f32], b: &[f32], vocab: usize) -> f64 {
    let mut e = row_errors(a, b, vocab);
    e.sort_by(f64::total_cmp);
    e[e.len() / 2]
}

/// Argmax agreement wherever the reference's top two are not a near tie.
fn check_greedy(ours: &[f32], reference: &[f32], vocab: usize, what: &str) {
    for (t, (a, b)) in ours
        .chunks_exact(vocab)
        .zip(reference.chunks_exact(vocab))
        .enumerate()
    {
        let mut idx: Vec<usize> = (0..vocab).collect();
        idx.sort_by(|&i, &j| b[j].total_cmp(&b[i]));
        if b[idx[0]] - b[idx[1]] > 1e-3 {
            assert_eq!(
                lagoon::sample::argmax(a) as usize,
                idx[0],
                "{what}: greedy token differs at position {t}"
            );
        }
    }
}

/// Every (checkpoint path, reference logits path) pair of a case.
fn variants(case: &Path) -> Vec<(PathBuf, PathBuf)> {
    let tf = case.join("logits.transformers.f32");
    let mut v = Vec::new();
    for d in ["hf-f32", "hf-bf16"] {
        if case.join(d).is_dir() {
            v.push((case.join(d), tf.clone()));
        }
    }
    for f in ["model-f32.gguf", "model-f16.gguf", "model-q8_0.gguf"] {
        if case.join(f).exists() {
            v.push((case.join(f), tf.clone()));
        }
    }
    for d in ["ct-int4", "ct-int4-asym", "ct-int8"] {
        let p = case.join(d);
        if p.join("logits.transformers.f32").exists() {
            v.push((p.clone(), p.join("logits.transformers.f32")));
        }
    }
    v
}

#[test]
fn every_fixture_matches_transformers_in_every_mode() {
    let cases = fixtures();
    assert!(!cases.is_empty(), "no fixtures under tests/fixtures/models");
    let mut n_checked = 0;
    for case in cases {
        let toks = read_tokens(&case.join("tokens.txt"));
        for (model, refpath) in variants(&case) {
            let reference = read_f32(&refpath);
            let ckpt = open(&model);
            let vocab = ckpt.config.vocab_size;
            assert_eq!(reference.len(), toks.len() * vocab, "{}", refpath.display());
            for (mode, ubatch) in modes(toks.len()) {
                let ours = eval(&ckpt, &toks, ubatch, true);
                let e = rel_l2(&ours, &reference);
                let what = format!(
                    "{} [{mode}]",
                    model
                        .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                        .unwrap_or(&model)
                        .display()
                );
                println!("{what}: rel L2 {e:.3e}");
                assert!(e <= MAX_REL_L2, "{what}: rel L2 {e:.3e} > {MAX_REL_L2:e}");
                check_greedy(&ours, &reference, vocab, &what);
                n_checked += 1;
            }
        }
    }
    assert!(n_checked > 0);
}

/// The default path on every GGUF, bounded by llama.cpp's own distance to transformers on
/// the same file (its logits were recorded by `tools/reference/ref_llamacpp.py`).
///
/// Only the committed cases are asserted: their token sequences were chosen for clear router
/// margins. On arbitrary random configs (`LAGOON_EXTRA_FIXTURES`) quantised activations flip
/// near-tied experts in both engines at random positions (measured over 8 configs: 6 flipped
/// positions for lagoon, 3 for llama.cpp, equal medians where neither flips), so there the
/// figures are printed, not asserted; the reference path is asserted on every case above.
#[test]
fn default_path_within_llama_cpp_distance() {
    let mut n_checked = 0;
    for case in committed_fixtures() {
        if !llama_is_reference(&case) {
            println!(
                "{}: llama.cpp logits are marked as not a reference; skipped",
                case.display()
            );
            continue;
        }
        let toks = read_tokens(&case.join("tokens.txt"));
        let tf = read_f32(&case.join("logits.transformers.f32"));
        for ty in ["f32", "f16", "q8_0"] {
            let (model, lc) = (
                case.join(format!("model-{ty}.gguf")),
                case.join(format!("logits.llamacpp.{ty}.f32")),
            );
            if !model.exists() || !lc.exists() {
                continue;
            }
            let lcl = read_f32(&lc);
            let llama = rel_l2(&lcl, &tf);
            let vocab = tf.len() / toks.len();
            let llama_med = median_row_err(&lcl, &tf, vocab);
            let ckpt = open(&model);
            for (_, ubatch) in modes(toks.len()) {
                let ours = eval(&ckpt, &toks, ubatch, false);
                let (e, med) = (rel_l2(&ours, &tf), median_row_err(&ours, &tf, vocab));
                println!(
                    "{} ubatch {ubatch}: ours {e:.3e} (median position {med:.3e}), llama.cpp {llama:.3e} (median {llama_med:.3e})",
                    model.display()
                );
                let bound = (llama * LLAMA_TOTAL_MARGIN).max(MAX_REL_L2);
                assert!(
                    e <= bound,
                    "{}: rel L2 {e:.3e} > {bound:.3e} (llama.cpp: {llama:.3e})",
                    model.display()
                );
                let bound = (llama_med * LLAMA_MEDIAN_MARGIN).max(MAX_REL_L2);
                assert!(
                    med <= bound,
                    "{}: median position error {med:.3e} > {bound:.3e}",
                    model.display()
                );
                n_checked += 1;
            }
        }
    }
    assert!(n_checked > 0, "no GGUF fixture with llama.cpp logits");
}
