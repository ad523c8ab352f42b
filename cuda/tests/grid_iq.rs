//! The grid IQ types kept in their GGUF encoding on the GPU (`LAGOON_CUDA_GRID_IQ=1`,
//! `quant.cuh`'s IQ3_XXS / IQ2_XXS / IQ2_S codebook decoders), on the llama.cpp-quantised
//! fixture models: against llama.cpp's logits of the same file on its dequantised weights,
//! exact path, quantised-activation decode and tensor-core prefill, and with fewer matrices
//! decoded to f32 at upload than without the setting. A test binary of its own: it sets the
//! environment variable, which no other test may see change.

use std::path::{Path, PathBuf};

use lagoon_core::laguna::ModelWeights;
use lagoon_cuda::{CudaSession, CudaSessionOptions};
use lagoon_gguf::Checkpoint;

fn read_f32(p: &Path) -> Vec<f32> {
    std::fs::read(p)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut n, mut d) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        n += (x as f64 - y as f64).powi(2);
        d += (y as f64).powi(2);
    }
    (n / d).sqrt()
}

#[test]
#[ignore = "needs a CUDA device"]
fn grid_iq_models_match_llama_cpp_kept_quantised() {
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
    for ty in ["iq3_xxs", "iq2_xxs", "iq2_s"] {
        let ckpt = Checkpoint::open(dir.join(format!("model-{ty}.gguf"))).unwrap();
        let w = ModelWeights::resolve(&ckpt.config, |name| ckpt.tensor(name).ok().map(|t| t.parts))
            .unwrap();
        let deq = read_f32(&dir.join(format!("logits.llamacpp.{ty}.deq.f32")));
        let llama = read_f32(&dir.join(format!("logits.llamacpp.{ty}.f32")));
        let d_llama = rel_l2(&llama, &deq);
        let run = |keep: bool, ubatch: usize, quantized: bool| {
            // SAFETY: this binary's only test, on its own thread; nothing else reads the
            // environment concurrently.
            unsafe { std::env::set_var("LAGOON_CUDA_GRID_IQ", if keep { "1" } else { "0" }) };
            let mut s = CudaSession::new(
                &ckpt.config,
                &w,
                CudaSessionOptions {
                    n_ctx: toks.len(),
                    ubatch,
                    all_logits: true,
                    quantized_activations: quantized,
                    ..Default::default()
                },
            )
            .unwrap_or_else(|e| panic!("{ty}: {e}"));
            let mut out = Vec::new();
            s.prefill(&toks, |l| out.extend_from_slice(l)).unwrap();
            (out, s.weight_bytes().1)
        };
        let (_, nd_f32) = run(false, toks.len(), false);
        let (exact, nd) = run(true, toks.len(), false);
        let (fast, _) = run(true, 1, true);
        let (tc, _) = run(true, toks.len(), true);
        let (e_exact, e_fast, e_tc) =
            (rel_l2(&exact, &deq), rel_l2(&fast, &deq), rel_l2(&tc, &deq));
        println!(
            "{ty}: exact vs llama.cpp f32 {e_exact:.3e}; quantised-activation decode {e_fast:.3e} ({:.2} x llama.cpp's own {d_llama:.3e}); tensor-core prefill {e_tc:.3e}; matrices decoded to f32 at upload: {nd} kept / {nd_f32} without",
            e_fast / d_llama
        );
        assert!(
            nd < nd_f32,
            "{ty}: {nd} matrices decoded to f32 with the grid decoders on"
        );
        assert!(e_exact <= 1e-4, "{ty}: exact {e_exact:.3e}");
        assert!(
            e_fast <= 1.25 * d_llama,
            "{ty}: quantised decode {e_fast:.3e}"
        );
        assert!(
            e_tc <= 1.25 * d_llama,
            "{ty}: tensor-core prefill {e_tc:.3e}"
        );
    }
}
