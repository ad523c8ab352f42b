//! Whole-model logits of a tiny Laguna GGUF in every llama.cpp quant type against llama.cpp's
//! logits for the same file (issue #5). The files were quantised by llama.cpp's own quantiser
//! from one f32 model by `tools/reference/quant_models.py`, which also recorded, per type,
//! llama.cpp's logits on the file (its CPU path, activations quantised to Q8_0 / Q8_K) and on
//! the file's weights dequantised to F32 by llama.cpp (its f32 reference path). See the
//! script's header for the model (hidden 256, every row a multiple of 256, all Laguna
//! features) and `meta.json` for versions, type histograms and llama.cpp's own spreads.
//!
//! The bounds, per type, in prefill, chunked prefill (ubatch 7) and token-by-token decode
//! (`d` = relative L2 over all positions; `d_llama` = d(llama.cpp CPU path, llama.cpp f32
//! reference path) on the same file, ~1e-2 here: llama.cpp's own distance between its CPU
//! and reference paths, as the issue asks):
//!
//! * Reference path (weights decoded to f32, f32 math) vs llama.cpp's f32 path on the
//!   dequantised weights: [`MAX_REL_L2_REFERENCE`]. Both compute the same f32 model, so a
//!   wrong decoded value anywhere in the model shows up (the script records the float64 numpy
//!   forward on those weights at ~2e-7 from llama.cpp there; lagoon lands at ~6e-7).
//! * Fast path vs llama.cpp's f32 reference path: at most [`SELF_MARGIN`] x `d_llama`, i.e.
//!   lagoon's quantised activations cost no more accuracy than llama.cpp's (1.25).
//! * Fast path vs llama.cpp's CPU path: at most [`FAST_MARGIN`] x `d_llama` (1.6).
//!
//! Why not tighter. Where lagoon rounds activations as ggml does, most positions agree with
//! llama.cpp to ~1e-7; but once one activation element rounds the other way (a near-tie, or
//! f32 ops before the rounding done in another order), every later matrix re-rounds a
//! slightly different input and the positions that element reaches (every later one through
//! the full-attention layer, 8 through the sliding one) differ by about `d_llama`: flipping a single Q8 step of one element
//! in a numpy emulation of ggml's activation rounding moves the logits of those 8 positions
//! by ~1e-2. So the per-position distance is either ~1e-7 or ~`d_llama`, and two engines
//! whose roundings are independent land near sqrt(2) x `d_llama` over the sequence (measured
//! from 1e-5 to 1.17 x `d_llama`; which types agree bit-close moves with kernel changes). For
//! the same reason the spread
//! between llama.cpp's own configurations (ubatch 1, 1 thread, no weight repacking, in
//! `meta.json`) is 0 for most types and up to 7e-3 for others: no usable bound.
//!
//! Resolution, measured by perturbing a copy of the workspace: the activation scale of Q8_K
//! off by 2^-7 fails every K and IQ type (fast vs f32 reference 6.3e-2 > 1.25 x 1.5e-2); the
//! Q5_K odd-sub-block min off by one step fails the reference path (1.4e-2 > 1e-4). A scale
//! off by 2^-9 passes (ours vs f32 +2..6%): kernel exactness is the kernel tests' job.

mod common;

use std::path::{Path, PathBuf};

use common::{eval, modes, read_f32, read_tokens, rel_l2, row_errors};
use lagoon::Checkpoint;
use lagoon::gguf::checkpoint::PartRecord;
use serde_json::Value;

/// Every type of `tools/reference/quant_models.py` (file `model-<t>.gguf`).
const TYPES: [&str; 20] = [
    "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k_m", "q4_k_m", "q5_k_m", "q6_k", "iq1_s",
    "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq4_nl", "iq4_xs", "mxfp4",
];

/// Reference path vs llama.cpp f32 on the dequantised weights: the f32 bound of the other
/// fixture tests (llama.cpp f32 and numpy float64 agree to ~2e-7 on these models).
const MAX_REL_L2_REFERENCE: f64 = 1e-4;

/// Fast path vs llama.cpp's f32 reference path, as a multiple of llama.cpp's own CPU-vs-f32
/// distance on the same file (measured 0.97 to 1.02).
const SELF_MARGIN: f64 = 1.25;

/// Fast path vs llama.cpp's CPU path, as a multiple of llama.cpp's own CPU-vs-f32 distance
/// on the same file: sqrt(1 + SELF_MARGIN^2), the distance between two independent errors of
/// at most SELF_MARGIN and 1 times it (measured 1e-5 to 1.17 here, where part of the rounding
/// is shared; an engine with fully independent rounding lands near sqrt(2)).
const FAST_MARGIN: f64 = 1.6;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/quant")
}

fn tokens() -> Vec<u32> {
    read_tokens(&dir().join("eval_tokens.txt"))
}

fn meta() -> Value {
    let text = std::fs::read_to_string(dir().join("meta.json")).expect("meta.json");
    serde_json::from_str(&text).expect("meta.json is JSON")
}

/// Per-position relative L2: (median, worst, worst position).
fn positions(a: &[f32], b: &[f32], vocab: usize) -> (f64, f64, usize) {
    let mut e: Vec<(f64, usize)> = row_errors(a, b, vocab)
        .into_iter()
        .enumerate()
        .map(|(t, e)| (e, t))
        .collect();
    e.sort_by(|x, y| x.0.total_cmp(&y.0));
    let worst = e[e.len() - 1];
    (e[e.len() / 2].0, worst.0, worst.1)
}

fn open(ty: &str) -> Checkpoint {
    common::open(&dir().join(format!("model-{ty}.gguf")))
}

/// ggml's type name without underscores (`Q4_K` and lagoon's `Q4K` both become `Q4K`).
fn norm_type(s: &str) -> String {
    s.replace('_', "").to_ascii_uppercase()
}

/// The types lagoon reads from each file are those the script recorded: the histogram of
/// tensor types (each stacked expert tensor counted once, as in the GGUF).
#[test]
fn files_hold_the_recorded_types() {
    let meta = meta();
    for ty in TYPES {
        let ckpt = open(ty);
        let mut got = std::collections::BTreeMap::<String, u64>::new();
        for r in ckpt.records() {
            let mut kinds = r.parts.iter().map(|p| match p {
                PartRecord::Ggml { ty, .. } => norm_type(&format!("{ty:?}")),
                PartRecord::Ct(_) => "CT".to_string(),
            });
            let first = kinds.next().expect("a tensor has parts");
            assert!(kinds.all(|k| k == first), "{ty}: {} mixes types", r.name);
            *got.entry(first).or_default() += 1;
        }
        let want: std::collections::BTreeMap<String, u64> = meta["types"][ty]["histogram"]
            .as_object()
            .unwrap_or_else(|| panic!("{ty}: no histogram in meta.json"))
            .iter()
            .map(|(k, v)| (norm_type(k), v.as_u64().unwrap()))
            .collect();
        assert_eq!(got, want, "{ty}: tensor types");
        let main = norm_type(meta["types"][ty]["main_type"].as_str().unwrap());
        assert!(got.contains_key(&main), "{ty}: no {main} tensor");
    }
}

#[test]
fn reference_path_matches_llama_cpp_on_the_dequantised_weights() {
    let toks = tokens();
    for ty in TYPES {
        let ckpt = open(ty);
        let expected = read_f32(&dir().join(format!("logits.llamacpp.{ty}.deq.f32")));
        assert_eq!(expected.len(), toks.len() * ckpt.config.vocab_size, "{ty}");
        for (mode, ubatch) in modes(toks.len()) {
            let ours = eval(&ckpt, &toks, ubatch, true);
            let e = rel_l2(&ours, &expected);
            println!("{ty:8} reference [{mode}]: rel L2 vs llama.cpp f32 {e:.3e}");
            assert!(
                e <= MAX_REL_L2_REFERENCE,
                "{ty} reference path [{mode}]: rel L2 {e:.3e} > {MAX_REL_L2_REFERENCE:e} vs llama.cpp \
                 f32 on the dequantised weights"
            );
        }
    }
}

#[test]
fn fast_path_within_llama_cpp_own_distance() {
    let toks = tokens();
    for ty in TYPES {
        let ckpt = open(ty);
        let cpu = read_f32(&dir().join(format!("logits.llamacpp.{ty}.f32")));
        let f32_ref = read_f32(&dir().join(format!("logits.llamacpp.{ty}.deq.f32")));
        let d_llama = rel_l2(&cpu, &f32_ref);
        let bound = FAST_MARGIN * d_llama;
        for (mode, ubatch) in modes(toks.len()) {
            let ours = eval(&ckpt, &toks, ubatch, false);
            let (e, e_ref) = (rel_l2(&ours, &cpu), rel_l2(&ours, &f32_ref));
            let (med, worst, at) = positions(&ours, &cpu, ckpt.config.vocab_size);
            println!(
                "{ty:8} fast [{mode}]: vs llama.cpp {e:.3e} (median position {med:.2e}, worst {worst:.2e} \
                 at {at}; bound {bound:.3e}; llama.cpp cpu vs f32 {d_llama:.3e}, ours vs f32 {e_ref:.3e})"
            );
            assert!(
                e_ref <= SELF_MARGIN * d_llama,
                "{ty} fast path [{mode}]: rel L2 {e_ref:.3e} vs llama.cpp's f32 reference path > \
                 {SELF_MARGIN} x {d_llama:.3e} (llama.cpp's own CPU path's distance to it)"
            );
            assert!(
                e <= bound,
                "{ty} fast path [{mode}]: rel L2 {e:.3e} vs llama.cpp > {FAST_MARGIN} x {d_llama:.3e} \
                 (llama.cpp's own CPU-path vs f32 distance on this file)"
            );
        }
    }
}
