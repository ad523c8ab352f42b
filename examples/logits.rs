//! Evaluates a token sequence and writes the logits of every position.
//!
//! `logits --model PATH --tokens 1,2,3 [--out FILE] [--ubatch N] [--decode] [--reference]
//!  [--threads N] [--device cpu|cuda[:N]] [--kv f32|f16|bf16|q8_0]`
//!
//! PATH is a `.gguf` file or a HF / compressed-tensors directory. FILE receives raw
//! little-endian f32, row-major `[n_tokens, vocab]`. The argmax of each position is printed.
//! `--decode` feeds the tokens one at a time through the KV cache; `--reference` forces the
//! scalar reference path (weights decoded to f32, f32 math), the baseline for bisecting any
//! numerical question about the fast kernels. `--device cuda[:N]` runs on CUDA device N
//! (default 0) instead of the CPU (`--threads` then does not apply; `--reference` selects
//! the CUDA kernels' f32-activation path, whose numerics are the reference's; `--kv f16` /
//! `--kv bf16` / `--kv q8_0` keeps its KV cache in f16 / bf16 / Q8_0 blocks, the last only
//! without `--reference` on head_dim-128 models).

#[path = "common/args.rs"]
mod args;

use std::io::Write;

use anyhow::Context;
use lagoon::cuda_backend::{CudaSession, CudaSessionOptions};
use lagoon::{Checkpoint, Session, SessionOptions};

fn main() -> anyhow::Result<()> {
    let a = args::Args::parse(include_str!("logits.rs"), &["decode", "reference"])?;
    let model = a.get("model").context("--model PATH is required")?;
    let tokens = a.tokens("tokens")?.context("--tokens 1,2,3 is required")?;
    let ubatch: usize = a.num("ubatch", 512)?;
    anyhow::ensure!(ubatch > 0, "--ubatch must be at least 1");
    let decode = a.flag("decode");
    let reference = a.flag("reference");
    let n_threads: usize = a.num("threads", 0)?;

    let ckpt = Checkpoint::open(model).with_context(|| format!("opening {model}"))?;
    let weights = lagoon::weights(&ckpt)?;
    let vocab = ckpt.config.vocab_size;
    let opts = SessionOptions {
        n_ctx: tokens.len(),
        ubatch: if decode { 1 } else { ubatch },
        all_logits: true,
        n_threads,
        reference,
        repack: None,
    };
    let mut all = Vec::with_capacity(tokens.len() * vocab);
    let device = a.device()?;
    let kv = a.kv(device, false)?;
    match device {
        None => {
            let mut session = Session::new(&ckpt.config, &weights, opts);
            session.prefill(&tokens, |l| all.extend_from_slice(l))?;
        }
        Some(device) => {
            let copts = CudaSessionOptions {
                n_ctx: opts.n_ctx,
                ubatch: opts.ubatch,
                all_logits: true,
                device,
                cuda_graphs: true,
                quantized_activations: !reference,
                kv,
                ..Default::default()
            };
            let mut session = CudaSession::new(&ckpt.config, &weights, copts)?;
            session.prefill(&tokens, |l| all.extend_from_slice(l))?;
        }
    }
    debug_assert_eq!(all.len(), tokens.len() * vocab);

    let argmax: Vec<String> = all
        .chunks_exact(vocab)
        .map(|row| lagoon::sample::argmax(row).to_string())
        .collect();
    println!("argmax: {}", argmax.join(","));
    if let Some(out) = a.get("out") {
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(out).with_context(|| format!("creating {out}"))?,
        );
        for v in &all {
            f.write_all(&v.to_le_bytes())?;
        }
        f.flush()?;
        eprintln!("wrote {} x {} logits to {out}", tokens.len(), vocab);
    }
    Ok(())
}
