//! A shared expert whose rows want another activation format than the routed experts'
//! (Q8_0 shared rows, which take Q8_0 activations, beside K-quant experts, which take Q8_K:
//! the shape of Unsloth-style "UD" mixes) still runs inside the routed experts' two
//! dispatches, and its results are the reference path's within the quantised activations'
//! error, in one-shot prefill, chunks and decode alike.

#[allow(dead_code)] // (this binary uses the config and raw buffers only)
mod common;

use lagoon_core::dtype::GgmlType;
use lagoon_core::laguna::ModelWeights;

/// The f32 rows (little-endian bytes) quantised to Q8_0.
fn q8_0(f32_bytes: &[u8], cols: usize) -> Vec<u8> {
    let x: Vec<f32> = f32_bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let rb = cols / 32 * 34;
    let mut out = vec![0u8; x.len() / cols * rb];
    for (src, dst) in x.chunks_exact(cols).zip(out.chunks_exact_mut(rb)) {
        lagoon_core::quant::q8_0::quantize_row_q8_0(src, dst);
    }
    out
}

fn logits(
    c: &lagoon_core::config::ModelConfig,
    w: &ModelWeights<'_>,
    toks: &[u32],
    ubatch: usize,
    reference: bool,
) -> (Vec<f32>, Vec<lagoon_cpu::OpTime>) {
    let mut s = lagoon_cpu::Session::new(
        c,
        w,
        lagoon_cpu::SessionOptions {
            n_ctx: toks.len(),
            ubatch,
            all_logits: true,
            n_threads: 2,
            reference,
            repack: None,
        },
    );
    s.set_profiling(true);
    let mut out = Vec::new();
    s.prefill(toks, |l| out.extend_from_slice(l)).unwrap();
    (out, s.set_profiling(false).unwrap())
}

#[test]
fn q8_0_shared_expert_beside_k_quant_experts_runs_in_their_dispatches() {
    let mut c = common::config();
    c.hidden_size = 256;
    c.dense_ffn = 256;
    c.expert_ffn = 256;
    c.shared_ffn = 256;
    let store = common::Store::new(&c, None);
    let mut seed = 0x5eed_5eedu64;
    let mut q = common::Overrides::default();
    let mut names: Vec<&String> = store.bufs.keys().collect();
    names.sort();
    for name in names {
        let parts = &store.bufs[name];
        let (ty, data) = if name.contains("shexp") {
            let d = parts.iter().map(|(_, cc, b)| q8_0(b, *cc)).collect();
            (GgmlType::Q8_0, d)
        } else if name.contains("_exps") {
            let d = parts
                .iter()
                .map(|(r, cc, _)| common::q4k(*r, *cc, &mut seed))
                .collect();
            (GgmlType::Q4K, d)
        } else {
            continue;
        };
        q.insert(name.clone(), (ty, data));
    }
    let count = |ty| q.values().filter(|(t, _)| *t == ty).count();
    assert!(count(GgmlType::Q8_0) >= 3 && count(GgmlType::Q4K) >= 3);
    let w = store.weights_with(&c, &q);
    let toks: Vec<u32> = (0..17)
        .map(|i| (i * 29 + 3) % c.vocab_size as u32)
        .collect();
    let (fast, prof) = logits(&c, &w, &toks, toks.len(), false);
    // Fused: no product of the shared expert's runs as a node of its own.
    let ops: Vec<&str> = prof.iter().map(|t| t.op.as_str()).collect();
    assert!(
        ops.iter().any(|o| o.starts_with("experts")),
        "no experts node: {ops:?}"
    );
    assert!(
        !ops.iter().any(|o| o.starts_with("matmul shared")),
        "the shared expert ran apart: {ops:?}"
    );
    let (reference, _) = logits(&c, &w, &toks, toks.len(), true);
    let e = common::rel_l2(&fast, &reference);
    println!("fast vs reference: rel L2 {e:.3e}");
    assert!(fast.iter().all(|v| v.is_finite()));
    assert!(e < 5e-2, "fast vs reference: rel L2 {e:.3e}");
    for ubatch in [1, 4] {
        let (other, _) = logits(&c, &w, &toks, ubatch, false);
        let e = common::rel_l2(&other, &fast);
        println!("ubatch {ubatch} vs one-shot: rel L2 {e:.3e}");
        assert!(e < 1e-5, "ubatch {ubatch}: rel L2 {e:.3e}");
    }
}
