//! Writes a random-weight Laguna checkpoint of any configuration, streaming it to disk.
//!
//! `synth --preset s-2.1|xs-2.1|xs.2|m.1 [--layers N] [--experts N] [--experts-used K]
//!  [--vocab N] --types q4_k_m|q5_k_m|q3_k_m|q2_k|q4_0|q8_0|ud-q3_k_m|iq2_m|iq1_m|iq1_s|iq4_xs|iq4_nl|mxfp4_moe|bf16|int4-g32|int8
//!  [--seed S] [--router-skew X] [--threads N] [--shard-gb G] [--no-sync] --out PATH`
//!
//! PATH is a `.gguf` file, or a directory for `int4-g32` (compressed-tensors W4A16 g32,
//! laid out like poolside's INT4 release) and `int8` (compressed-tensors W8A8: int-quantized
//! I8 experts, per-channel scales). Speed does not depend on what the weights say,
//! only on their types, shapes and routing spread, so the file measures a real model's
//! speed (`bench --model PATH`). `--router-skew X` shifts the selection bias of top-k
//! experts per layer by X router-score deviations (0 = uniform, 3 = nearly always chosen).
//! The data is fsynced before the write speed is reported unless `--no-sync`.

#[path = "common/args.rs"]
mod args;

use std::path::Path;

use anyhow::Context;
use lagoon::gguf::synth::{self, Preset, SynthOptions, TypeMix};

fn main() -> anyhow::Result<()> {
    let a = args::Args::parse(include_str!("synth.rs"), &["no-sync"])?;
    let names = |v: Vec<&str>| v.join("|");
    let preset_name = a.get("preset").with_context(|| {
        format!(
            "--preset {} is required",
            names(Preset::ALL.map(|p| p.name()).to_vec())
        )
    })?;
    let preset = Preset::parse(preset_name).with_context(|| {
        format!(
            "unknown preset `{preset_name}`; choose one of {}",
            names(Preset::ALL.map(|p| p.name()).to_vec())
        )
    })?;
    let mix_names = names(TypeMix::ALL.map(|m| m.name()).to_vec());
    let types = a
        .get("types")
        .with_context(|| format!("--types {mix_names} is required"))?;
    let mix = TypeMix::parse(types)
        .with_context(|| format!("unknown --types `{types}`; choose one of {mix_names}"))?;
    let out = a.get("out").context("--out PATH is required")?;

    let mut shape = preset.shape();
    if let Some(n) = a.get("layers") {
        shape = shape.with_layers(n.parse().context("--layers takes a number")?);
    }
    if let Some(n) = a.get("experts") {
        shape = shape.with_experts(n.parse().context("--experts takes a number")?);
    }
    shape.n_experts_used = a.num("experts-used", shape.n_experts_used)?;
    shape.vocab_size = a.num("vocab", shape.vocab_size)?;

    let mut o = SynthOptions::new(shape, mix, preset.name());
    o.seed = a.num("seed", 0)?;
    o.router_skew = a.num("router-skew", 0.0)?;
    o.n_threads = a.num("threads", 0)?;
    o.sync = !a.flag("no-sync");
    o.shard_bytes = (a.num("shard-gb", 5.0f64)? * 1e9) as u64;
    anyhow::ensure!(o.shard_bytes > 0, "--shard-gb must be positive");
    o.shape.validate()?;

    let estimate = synth::estimated_bytes(&o);
    let s = &o.shape;
    eprintln!(
        "{} {}: {} layers, hidden {}, {} experts (top {}), vocab {}: {:.2}B params, ~{:.2} GB",
        preset.name(),
        mix.name(),
        s.n_layers,
        s.hidden,
        s.n_experts,
        s.n_experts_used,
        s.vocab_size,
        s.n_params() as f64 / 1e9,
        estimate as f64 / 1e9
    );
    // Only where a file or directory will be created (not e.g. `/dev/null`).
    let regular = std::fs::metadata(out).map_or(true, |m| m.is_file() || m.is_dir());
    if let Some(free) = free_bytes(Path::new(out)).filter(|_| regular) {
        anyhow::ensure!(
            free > estimate + (1 << 30),
            "{out}: {:.1} GB free but the checkpoint needs ~{:.1} GB (+1 GB margin); use --layers or --experts to scale it down",
            free as f64 / 1e9,
            estimate as f64 / 1e9
        );
    }

    let sum = synth::write(Path::new(out), &o)?;
    println!(
        "wrote {} tensors, {:.3} GB in {} file(s) to {out} in {:.1} s: {:.0} MB/s{}",
        sum.n_tensors,
        sum.bytes as f64 / 1e9,
        sum.files.len(),
        sum.seconds,
        sum.bytes as f64 / 1e6 / sum.seconds.max(1e-9),
        if o.sync {
            " (fsynced)"
        } else {
            " (page cache, not fsynced)"
        }
    );
    Ok(())
}

/// Free bytes on the filesystem that will hold `out` (from `df`; `None` if unknown).
fn free_bytes(out: &Path) -> Option<u64> {
    let dir = out
        .ancestors()
        .find(|p| p.is_dir())
        .unwrap_or(Path::new("."));
    let o = std::process::Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        })
        .output()
        .ok()?;
    String::from_utf8(o.stdout)
        .ok()?
        .lines()
        .nth(1)?
        .trim()
        .parse()
        .ok()
}
