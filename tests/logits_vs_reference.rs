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

/// On the default (fast) path activations are quantised as llama.cpp does (Q8_0 / Q8_K), so a
/// GGUF lands about as far from transformers as llama.cpp's CPU path on the same file (~1.6e-2
/// per position on q8_0), and a near-tied router decision may go the other way. The bounds
/// below are per position, in the regimes that [`default_path_within_llama_cpp_distance`]
/// describes with its measurements. A position further from transformers than this multiple
/// of llama.cpp's median position (and than [`MAX_REL_L2`]) counts as a router flip: flips
/// measured 10x..34x, positions without one up to 5.7x (right after a flip). One smaller flip
/// (4.9x) was seen; it stays among the unflipped positions, under [`TOTAL_MARGIN`].
const FLIP_FACTOR: f64 = 7.0;
/// At most one position in this many may flip (measured: at most 3 of 40 and of 48).
const FLIP_EVERY: usize = 8;
/// Before the first flip of either engine, the median position error is within this multiple
/// of llama.cpp's over the same positions (measured 0.91..1.05)...
const CLEAN_MARGIN: f64 = 1.25;
/// ...over at least this many positions.
const MIN_CLEAN: usize = 4;
/// The relative L2 over every position that did not flip is within this multiple of
/// llama.cpp's over its own (measured 0.98..1.63).
const TOTAL_MARGIN: f64 = 2.0;

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

/// The median of `v` (the upper one for an even length); `v` is not empty.
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// [`rel_l2`] over the positions (rows of `vocab`) that `keep` selects.
fn rel_l2_at(a: &[f32], b: &[f32], vocab: usize, keep: impl Fn(usize) -> bool) -> f64 {
    let pick = |x: &[f32]| -> Vec<f32> {
        x.chunks_exact(vocab)
            .enumerate()
            .filter(|&(t, _)| keep(t))
            .flat_map(|(_, r)| r.iter().copied())
            .collect()
    };
    rel_l2(&pick(a), &pick(b))
}

/// Positions whose error in `err` is above `at`.
fn flipped(err: &[f64], at: f64) -> Vec<usize> {
    (0..err.len()).filter(|&t| err[t] > at).collect()
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
/// the same file (its logits were recorded by `tools/reference/ref_llamacpp.py`), position by
/// position:
///
/// * Flipped ([`FLIP_FACTOR`], [`FLIP_EVERY`]): a near-tied router decision went the other
///   way and the position computed another expert: 0.16..0.55 from transformers here.
/// * Clean ([`CLEAN_MARGIN`]): before the first flip of either engine both carry activation
///   quantisation noise only, so ours is held close to llama.cpp's there.
/// * Downstream ([`TOTAL_MARGIN`]): after a flip, later positions attend to the flipped
///   position's K/V and carry part of its change, the more the nearer they are.
///
/// Why per position. Which decisions flip is down to rounding, and rounding is chaotic here:
/// the forced scalar kernels (`LAGOON_FORCE_SCALAR=1`) and the AVX-512 ones quantise
/// activations identically and each of their dots is within 1.2 units of f32 roundoff (of
/// the sum of |products|) of the exact product of the quantised operands (checked in float64
/// on xs2_style q8_0), but they sum in another order. On xs2_style q8_0 the two agree to 1e-7
/// up to position 7; at position 8, element 59 of layer 0's FFN-down input is 73.49998 Q8_0
/// steps on AVX-512 and 73.5 on scalar (its SwiGLU inputs differ by one ulp), so it rounds to
/// 73 on one and 74 on the other, and from there every later matrix re-rounds a slightly
/// different input: the two paths differ by ~1.5e-2 per position, as far as either is from
/// llama.cpp. Both flip layer 2's decision at position 7; scalar also flips layer 4's at
/// position 23 (the fixture's smallest transformers margin, 1.47e-3), which AVX-512 keeps.
/// The single whole-sequence bound this test had (3 x llama.cpp's distance) so passed or
/// failed by which path drew the near-tie: AVX-512 2.9x, scalar 3.4x, and 5.1x (three flips)
/// with activations rounded half to even, as ggml's own SIMD quantiser does. llama.cpp itself
/// flips one decision on hybrid_perhead (position 16), one that half-to-even flips too.
///
/// Measured on the committed q8_0 files over AVX-512, AVX2, scalar, and scalar with
/// half-to-even, x/d instead of x·(1/d), f64 or reassociated block sums: at most 3 flips,
/// clean median 0.91..1.05x, unflipped total 0.98..1.63x. Resolution, measured in a copy of
/// the workspace on the scalar path: the Q8_0 activation scale off by 2^-7 fails on every
/// case (clean median 1.59x and 1.85x; on xs2_style flips from position 2 on); one weight
/// per row with its sign flipped fails at every position; one weight per 32-block off by one
/// step (of 127) passes (clean median 1.14..1.21x: about half the activation quantisation
/// noise), as does one weight per row off by one step: kernel exactness is
/// `cpu-experts/tests/kernels.rs`'s job.
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
        let n = toks.len();
        let vocab = tf.len() / n;
        for ty in ["f32", "f16", "q8_0"] {
            let (model, lc) = (
                case.join(format!("model-{ty}.gguf")),
                case.join(format!("logits.llamacpp.{ty}.f32")),
            );
            if !model.exists() || !lc.exists() {
                continue;
            }
            let lcl = read_f32(&lc);
            let l_err = row_errors(&lcl, &tf, vocab);
            let flip_at = (FLIP_FACTOR * median(&l_err)).max(MAX_REL_L2);
            let l_flips = flipped(&l_err, flip_at);
            let l_total = rel_l2_at(&lcl, &tf, vocab, |t| !l_flips.contains(&t));
            let ckpt = open(&model);
            for (mode, ubatch) in modes(n) {
                let what = format!("{} [{mode}]", model.display());
                let ours = eval(&ckpt, &toks, ubatch, false);
                let err = row_errors(&ours, &tf, vocab);
                let flips = flipped(&err, flip_at);
                let clean = flips.iter().chain(&l_flips).copied().min().unwrap_or(n);
                let total = rel_l2_at(&ours, &tf, vocab, |t| !flips.contains(&t));
                println!(
                    "{what}: flipped positions {flips:?} (llama.cpp {l_flips:?}, above \
                     {flip_at:.2e}); median position over 0..{clean} {:.3e} (llama.cpp {:.3e}); \
                     unflipped positions {total:.3e} (llama.cpp {l_total:.3e}); all {:.3e} \
                     (llama.cpp {:.3e})",
                    median(&err[..clean.max(1)]),
                    median(&l_err[..clean.max(1)]),
                    rel_l2(&ours, &tf),
                    rel_l2(&lcl, &tf)
                );
                assert!(
                    flips.len() <= n / FLIP_EVERY,
                    "{what}: {} positions {flips:?} are over {flip_at:.2e} from transformers \
                     (a router flip each?), more than 1 in {FLIP_EVERY}",
                    flips.len()
                );
                assert!(
                    clean >= MIN_CLEAN,
                    "{what}: position {clean} is already over {flip_at:.2e} from transformers \
                     ({FLIP_FACTOR} x llama.cpp's median position)"
                );
                let (m, m_llama) = (median(&err[..clean]), median(&l_err[..clean]));
                let bound = (CLEAN_MARGIN * m_llama).max(MAX_REL_L2);
                assert!(
                    m <= bound,
                    "{what}: median position error over 0..{clean} {m:.3e} > {bound:.3e} \
                     ({CLEAN_MARGIN} x llama.cpp's {m_llama:.3e})"
                );
                let bound = (TOTAL_MARGIN * l_total).max(MAX_REL_L2);
                assert!(
                    total <= bound,
                    "{what}: rel L2 over the unflipped positions {total:.3e} > {bound:.3e} \
                     ({TOTAL_MARGIN} x llama.cpp's {l_total:.3e})"
                );
                n_checked += 1;
            }
        }
    }
    assert!(n_checked > 0, "no GGUF fixture with llama.cpp logits");
}
