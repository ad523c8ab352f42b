//! The `gemm_h.cu` path inside a session (needs a CUDA device; run with
//! `.device/run-tests.sh`). The tiny models' matrices are far below the rows `gemm_h16`
//! takes by default, so this binary lowers the threshold through `LAGOON_CUDA_H16_MIN_ROWS`,
//! which sessions read at creation: it holds one test only, so no other test in the process
//! sees the setting.

use std::path::PathBuf;

use lagoon_core::laguna::ModelWeights;
use lagoon_cuda::{CudaSession, CudaSessionOptions};
use lagoon_gguf::Checkpoint;

mod common;

use common::{rel_l2, same_bits};

/// 600-token prefill steps of a tiny model with every matrix of at least 32 rows on
/// `gemm_h16`: the prefill fusions give the unfused kernels' bits there too (the f16 input
/// written by the norm and reused across products), and the one-shot step stays within f16
/// rounding of 300-token steps, which take the per-tile kernels instead (fewer than 512
/// tokens).
#[test]
#[ignore = "needs a CUDA device"]
fn gemm_h16_products_in_a_session() {
    // SAFETY: set before any thread of this test binary reads the environment (one test).
    unsafe { std::env::set_var("LAGOON_CUDA_H16_MIN_ROWS", "32") };
    let path = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/models/xs2_style/model-q8_0.gguf"
    ));
    let ckpt = Checkpoint::open(&path).unwrap();
    let w = ModelWeights::resolve(&ckpt.config, |name| ckpt.tensor(name).ok().map(|t| t.parts))
        .unwrap();
    let vocab = ckpt.config.vocab_size as u32;
    let toks: Vec<u32> = (0..600u32).map(|i| (i * 37 + 5) % vocab).collect();
    // The logits, and how many gemm_h16 launches the steps made.
    let run = |ubatch: usize, fuse: bool| {
        let opts = CudaSessionOptions {
            n_ctx: toks.len(),
            ubatch,
            all_logits: true,
            kv: lagoon_cuda::KvCache::F16,
            ..Default::default()
        };
        let mut s = CudaSession::new(&ckpt.config, &w, opts).unwrap();
        s.set_fusions(fuse);
        s.set_profiling(true);
        let mut out = Vec::new();
        s.prefill(&toks, |l| out.extend_from_slice(l)).unwrap();
        let h16 = s
            .set_profiling(false)
            .unwrap_or_default()
            .iter()
            .filter(|k| k.kernel == "gemm_h16")
            .map(|k| k.launches)
            .sum::<usize>();
        (out, h16)
    };
    let ((fused, n_fused), (plain, n_plain)) = (run(600, true), run(600, false));
    println!("gemm_h16 launches: {n_fused} fused, {n_plain} unfused");
    assert!(
        n_fused > 0 && n_fused == n_plain,
        "the 600-token steps did not run gemm_h16"
    );
    let same = same_bits(&fused, &plain);
    println!(
        "gemm_h16 session, fused vs unfused: bitwise equal {same}, rel L2 {:.3e}",
        rel_l2(&fused, &plain)
    );
    assert!(same, "the prefill fusions on gemm_h16 changed the logits");
    let (tiles, n_tiles) = run(300, true);
    assert_eq!(n_tiles, 0, "300-token steps ran gemm_h16");
    let e = rel_l2(&fused, &tiles);
    println!("gemm_h16 one-shot vs 300-token steps on the per-tile kernels: rel L2 {e:.3e}");
    assert!(fused.iter().all(|v| v.is_finite()));
    assert!(e < 1e-2, "gemm_h16 session vs per-tile kernels: {e:.3e}");
}
