//! Generates tokens from a prompt of token ids.
//!
//! `generate [--model PATH] [--prompt-tokens 2,10,11] [-n 32] [--temp T] [--top-k K]
//!  [--top-p P] [--seed S] [--ubatch N] [--ctx N] [--threads N] [--reference]`
//!
//! Without `--model` it runs the small Laguna-architecture model bundled with the repository
//! (random weights: it exercises the whole engine but writes no meaningful text).

#[path = "common/args.rs"]
mod args;

use std::time::Instant;

use anyhow::Context;
use lagoon::sample::{Rng, SamplerParams, sample};
use lagoon::{Checkpoint, Session, SessionOptions};

fn main() -> anyhow::Result<()> {
    let a = args::Args::parse(include_str!("generate.rs"), &["reference"])?;
    let model = a.get("model").unwrap_or(lagoon::BUNDLED_MODEL);
    let n_gen: usize = a.num("n", 32)?;
    let params = SamplerParams {
        temperature: a.num("temp", 0.0)?,
        top_k: a.num("top-k", 0)?,
        top_p: a.num("top-p", 1.0)?,
    };
    let mut rng = Rng::new(a.num("seed", 0)?);

    let t_load = Instant::now();
    let ckpt = Checkpoint::open(model).with_context(|| format!("opening {model}"))?;
    let weights = lagoon::weights(&ckpt)?;
    let prompt = a
        .tokens("prompt-tokens")?
        .unwrap_or_else(|| vec![ckpt.config.bos_token.unwrap_or(0)]);
    let n_ctx: usize = a.num("ctx", prompt.len() + n_gen)?;
    let ubatch: usize = a.num("ubatch", 64)?;
    let n_threads: usize = a.num("threads", 0)?;
    let mut s = Session::new(
        &ckpt.config,
        &weights,
        SessionOptions {
            n_ctx,
            ubatch,
            all_logits: false,
            n_threads,
            reference: a.flag("reference"),
        },
    );
    eprintln!("loaded {model} in {:.2} s", t_load.elapsed().as_secs_f64());

    let mut scratch = vec![(0.0f32, 0u32); ckpt.config.vocab_size];
    let t0 = Instant::now();
    let mut last = Vec::new();
    s.prefill(&prompt, |l| {
        last.clear();
        last.extend_from_slice(l)
    })?;
    let t_prefill = t0.elapsed().as_secs_f64();
    let mut next = sample(&last, &params, &mut rng, &mut scratch);
    let mut out = vec![next];
    let t1 = Instant::now();
    while out.len() < n_gen && !ckpt.config.eos_tokens.contains(&next) {
        let logits = s.step(&[next])?;
        next = sample(logits, &params, &mut rng, &mut scratch);
        out.push(next);
    }
    let t_decode = t1.elapsed().as_secs_f64();
    let ids: Vec<String> = out.iter().map(|t| t.to_string()).collect();
    println!("{}", ids.join(","));
    eprintln!(
        "prefill {} tokens: {:.1} tok/s; decode {} tokens: {:.1} tok/s",
        prompt.len(),
        prompt.len() as f64 / t_prefill,
        out.len() - 1,
        (out.len() - 1) as f64 / t_decode.max(1e-9)
    );
    Ok(())
}
