//! Helpers shared by the whole-model logits tests (`bundled_model.rs`,
//! `logits_vs_reference.rs`, `quant_logits.rs`): reading the reference files the Python
//! tooling writes, running a checkpoint over a prompt, and the distance the bounds are
//! stated in.

use std::path::Path;

use lagoon::{Checkpoint, Session, SessionOptions};

/// The evaluation modes every logits test runs, as (name, ubatch) for a prompt of
/// `n_tokens`: one-shot prefill, chunked prefill (ubatch 7) and token-by-token decode.
pub fn modes(n_tokens: usize) -> [(&'static str, usize); 3] {
    [("prefill", n_tokens), ("chunked-7", 7), ("decode", 1)]
}

/// A raw little-endian f32 file (the logits the reference scripts write), `[pos][vocab]`.
pub fn read_f32(p: &Path) -> Vec<f32> {
    let b = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A comma-separated token-id file (`tokens.txt`, `eval_tokens.txt`).
#[allow(dead_code)] // bundled_model.rs reads its prompts from reference.json
pub fn read_tokens(p: &Path) -> Vec<u32> {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.trim()
                .parse()
                .unwrap_or_else(|e| panic!("{}: token id {s:?}: {e}", p.display()))
        })
        .collect()
}

/// Relative L2 distance `|a - b| / |b|`, in f64.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut n, mut d) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        n += (x as f64 - y as f64).powi(2);
        d += (y as f64).powi(2);
    }
    (n / d).sqrt()
}

/// [`rel_l2`] of each position (row of `vocab` logits), in position order.
pub fn row_errors(a: &[f32], b: &[f32], vocab: usize) -> Vec<f64> {
    assert_eq!(a.len(), b.len());
    a.chunks_exact(vocab)
        .zip(b.chunks_exact(vocab))
        .map(|(x, y)| rel_l2(x, y))
        .collect()
}

/// Opens a checkpoint (GGUF file or HF / compressed-tensors directory), panicking with its
/// path on error.
pub fn open(p: &Path) -> Checkpoint {
    Checkpoint::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Logits of every position of `toks`, `ubatch` tokens per step, on the reference path
/// (weights decoded to f32) or the default one.
pub fn eval(ckpt: &Checkpoint, toks: &[u32], ubatch: usize, reference: bool) -> Vec<f32> {
    let w = lagoon::weights(ckpt).unwrap();
    let mut s = Session::new(
        &ckpt.config,
        &w,
        SessionOptions {
            n_ctx: toks.len(),
            ubatch,
            all_logits: true,
            n_threads: 0,
            reference,
            repack: None,
        },
    );
    let mut out = Vec::new();
    s.prefill(toks, |l| out.extend_from_slice(l)).unwrap();
    out
}
