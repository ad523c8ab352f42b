//! Shows what a checkpoint really contains: metadata, every tensor (name, type, shape,
//! bytes) and a per-role summary of tensor types, whatever the file's name claims.
//!
//! `inspect --model PATH [--tensors]` (PATH: `.gguf` file or HF directory)

#[path = "common/args.rs"]
mod args;

use std::collections::BTreeMap;

use anyhow::Context;
use lagoon::gguf::{Checkpoint, Source};

/// The role a normalised tensor name plays in the model.
fn role(name: &str) -> String {
    let layer = name.strip_prefix("blk.").and_then(|r| r.split('.').next());
    let has = |s: &str| name.contains(s);
    let r = if name.starts_with("token_embd") {
        "embeddings"
    } else if name.starts_with("output.") {
        "output (lm_head)"
    } else if has("_exps") {
        return format!("routed experts, layer {}", layer.unwrap_or("?"));
    } else if has("_shexp") {
        "shared expert"
    } else if has("ffn_gate_inp") || has("exp_probs_b") {
        "router"
    } else if has("attn_q.")
        || has("attn_k.")
        || has("attn_v.")
        || has("attn_output")
        || has("attn_gate")
    {
        "attention"
    } else if has("ffn_gate.") || has("ffn_up.") || has("ffn_down.") {
        "dense ffn"
    } else if has("norm") {
        "norms"
    } else {
        "other"
    };
    r.to_string()
}

fn main() -> anyhow::Result<()> {
    let a = args::Args::parse(include_str!("inspect.rs"), &["tensors"])?;
    let model = a.get("model").context("--model PATH is required")?;
    let ckpt = Checkpoint::open(model).with_context(|| format!("opening {model}"))?;
    match &ckpt.source {
        Source::Gguf { files, metadata } => {
            println!(
                "GGUF, {} file(s): {}",
                files.len(),
                files
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            for (k, v) in metadata {
                println!("  {k} = {v}");
            }
        }
        Source::Hf { dir, config } => {
            println!("HF checkpoint directory {}", dir.display());
            println!("{}", serde_json::to_string_pretty(config)?);
        }
    }
    let c = &ckpt.config;
    println!(
        "\nmodel: {} layers, hidden {}, vocab {}, heads {:?}, kv heads {}, head_dim {}, window {}, experts {} (top-{}, width {}), shared {}, dense {}",
        c.n_layers,
        c.hidden_size,
        c.vocab_size,
        c.n_heads,
        c.n_kv_heads,
        c.head_dim,
        c.sliding_window,
        c.n_experts,
        c.n_experts_used,
        c.expert_ffn,
        c.shared_ffn,
        c.dense_ffn
    );
    let mut roles: BTreeMap<String, BTreeMap<String, (usize, usize)>> = BTreeMap::new();
    let mut total = 0usize;
    let show = a.flag("tensors");
    if show {
        println!(
            "\n{:<40} {:<14} {:>24} {:>14}",
            "tensor", "type", "shape", "bytes"
        );
    }
    for rec in ckpt.records() {
        let t = ckpt.resolve(rec);
        let ty = t
            .parts
            .first()
            .map(|p| p.type_name().to_string())
            .unwrap_or_default();
        let bytes: usize = t.parts.iter().map(|p| p.n_bytes()).sum();
        total += bytes;
        if show {
            println!(
                "{:<40} {:<14} {:>24} {:>14}",
                rec.name,
                ty,
                format!("{:?}", rec.shape),
                bytes
            );
        }
        let e = roles
            .entry(role(&rec.name))
            .or_default()
            .entry(ty)
            .or_default();
        e.0 += 1;
        e.1 += bytes;
    }
    println!("\nper role (type: tensors, MiB):");
    for (r, types) in &roles {
        let s: Vec<String> = types
            .iter()
            .map(|(t, (n, b))| format!("{t}: {n}, {:.2}", *b as f64 / 1048576.0))
            .collect();
        println!("  {r:<28} {}", s.join("; "));
    }
    println!(
        "total {:.2} MiB in {} tensors",
        total as f64 / 1048576.0,
        ckpt.records().len()
    );
    Ok(())
}
