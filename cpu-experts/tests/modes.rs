//! One-shot prefill, chunked prefill and token-by-token decode give the same logits, over a
//! sequence several sliding windows long (so the ring buffer wraps).

mod common;

use lagoon_cpu::{Session, SessionOptions, StepError};

fn run(
    c: &lagoon_core::config::ModelConfig,
    w: &lagoon_core::laguna::ModelWeights<'_>,
    toks: &[u32],
    ubatch: usize,
) -> Vec<f32> {
    common::session_logits(c, w, toks, ubatch, 0)
}

#[test]
fn prefill_chunked_and_decode_agree() {
    let c = common::config();
    let store = common::Store::new(&c, Some(3));
    let w = store.weights(&c);
    let toks: Vec<u32> = (0..23)
        .map(|i| (i * 37 + 5) % c.vocab_size as u32)
        .collect();
    let one = run(&c, &w, &toks, toks.len());
    assert_eq!(one.len(), toks.len() * c.vocab_size);
    assert!(one.iter().all(|v| v.is_finite()));
    for ubatch in [1, 3, 7] {
        let other = run(&c, &w, &toks, ubatch);
        let e = common::rel_l2(&other, &one);
        assert!(e < 1e-5, "ubatch {ubatch}: rel L2 {e}");
    }
}

#[test]
fn sliding_window_changes_the_result() {
    // A test that cannot fail is a defect: widening the window must move late logits.
    let c = common::config();
    let store = common::Store::new(&c, None);
    let w = store.weights(&c);
    let toks: Vec<u32> = (0..16)
        .map(|i| (i * 11 + 3) % c.vocab_size as u32)
        .collect();
    let a = run(&c, &w, &toks, 16);
    let mut c2 = c.clone();
    c2.sliding_window = 64;
    let b = run(&c2, &w, &toks, 16);
    let v = c.vocab_size;
    // Identical while every position still fits the window, different after.
    assert!(common::rel_l2(&a[..4 * v], &b[..4 * v]) < 1e-6);
    assert!(common::rel_l2(&a[12 * v..], &b[12 * v..]) > 1e-3);
}

#[test]
fn bad_steps_are_refused_without_side_effects() {
    let c = common::config();
    let store = common::Store::new(&c, None);
    let w = store.weights(&c);
    let mut s = Session::new(
        &c,
        &w,
        SessionOptions {
            n_ctx: 4,
            ubatch: 2,
            all_logits: false,
            n_threads: 0,
            reference: false,
            repack: None,
        },
    );
    assert!(matches!(s.step(&[]), Err(StepError::BadBatch { .. })));
    assert!(matches!(
        s.step(&[1, 2, 3]),
        Err(StepError::BadBatch { .. })
    ));
    assert!(matches!(
        s.step(&[1, 9999]),
        Err(StepError::BadToken { token: 9999, .. })
    ));
    assert_eq!(s.n_past(), 0);
    s.step(&[1, 2]).unwrap();
    s.step(&[1, 2]).unwrap();
    assert!(matches!(s.step(&[1]), Err(StepError::ContextFull { .. })));
    assert_eq!(s.n_past(), 4);
}
