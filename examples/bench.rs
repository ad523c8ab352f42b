//! llama-bench for lagoon: prompt processing and generation speed of any checkpoint, each
//! figure next to the machine's own memory-bandwidth floor.
//!
//! `bench --model PATH [-p N[,N..]] [-n N[,N..]] [-ub N] [-d N[,N..]] [-r N] [--threads N]
//!  [--reference] [--no-warmup] [--json] [--device cpu|cuda[:N]] [--kv f32|f16|bf16|q8_0] [--profile N]
//!  [--profile-prefill N] [--host-sampling]`
//!
//! Semantics follow llama-bench: `pp N` evaluates a prompt of N random tokens (in ubatches
//! of `-ub`, default 512; `-b` is accepted as a synonym), `tg N` generates N tokens one at a
//! time after a one-token start, and `-d D` first prefills D tokens (not timed) so the test
//! runs at that context depth. Each test runs `-r` times (default 5) after one warmup run
//! (pp: the whole prompt, tg: one token, as llama-bench does); the median, min and max
//! tokens/s are reported. `--threads` defaults to all cores; `--reference` forces the
//! scalar reference path (on CUDA: f32 activations and exactly dequantised weights instead
//! of quantised activations). `--device cuda[:N]` runs on CUDA device N (decode steps
//! replayed as a CUDA graph); its floor is the device's streaming-read bandwidth, measured
//! at start by a read kernel over a 4 GiB buffer; on CUDA the KV cache is f16 by default
//! (llama-bench's default, `-ctk f16 -ctv f16`; f32 with `--reference`), `--kv f32` keeps it
//! in f32, `--kv bf16` in bf16, `--kv q8_0` in ggml's Q8_0 blocks (llama.cpp's `-ctk q8_0
//! -ctv q8_0`; not with `--reference`). `--profile N` then times every kernel (CUDA) or
//! graph node (CPU, with each product's weight bytes and GB/s) of N decode steps (after the
//! last test, at its depth) and prints where a token's time goes; `--profile-prefill N` does
//! the same for one prefill step of N tokens.
//!
//! Generation is greedy. On CUDA each tg step's token is chosen on the device and fed to the
//! next step there (`CudaSession::decode_greedy`: the steps are queued back to back, the
//! host reads the tokens once); `--host-sampling` copies every step's logits back and takes
//! the argmax on the CPU instead, as the CPU backend does (llama-bench syncs and reads the
//! logits back every token).
//!
//! Every test also reports the weight bytes it streams per token, the GB/s that implies,
//! and that as a fraction of the floor: the streaming-read bandwidth this program measures
//! first (a multi-threaded sum over a buffer much larger than the last-level cache, best of
//! five passes, same thread count). Bytes per token:
//! - tg: every dense matrix (attention, dense FFN, router, shared expert), top-k of the
//!   experts of each MoE layer, the lm_head and one embedding row;
//! - pp: per ubatch of u tokens, the dense matrices and the lm_head once (logits of the
//!   last token only), u embedding rows and, per MoE layer, the experts a uniform router
//!   touches, `E·(1 − (1 − k/E)^u)`; divided by u.
//!
//! FLOPs per token count 2 per multiply-add of those matrices (k experts for every token)
//! plus attention (`4·Hq·D` per visible key).
//!
//! Output: a markdown table, or with `--json` one JSON object per test per line.

#[path = "common/args.rs"]
mod args;

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use lagoon::core::config::ModelConfig;
use lagoon::core::laguna::weights::Ffn;
use lagoon::cuda_backend::{CudaSession, CudaSessionOptions};
use lagoon::{Checkpoint, ModelWeights, Session, SessionOptions};

/// Buffer of the CUDA read-bandwidth probe (well past the H200's 50 MB L2).
const CUDA_FLOOR_BYTES: usize = 4 << 30;

/// The session a bench runs on (one per run: the variants' size difference costs nothing).
#[allow(clippy::large_enum_variant)]
enum Backend<'w> {
    Cpu(Session<'w>),
    Cuda(CudaSession),
}

impl Backend<'_> {
    fn reset(&mut self) {
        match self {
            Backend::Cpu(s) => s.reset(),
            Backend::Cuda(s) => s.reset(),
        }
    }

    fn prefill(&mut self, tokens: &[u32]) -> anyhow::Result<()> {
        match self {
            Backend::Cpu(s) => s.prefill(tokens, |_| {})?,
            Backend::Cuda(s) => s.prefill(tokens, |_| {})?,
        }
        Ok(())
    }

    /// (ubatch, n_ctx, n_past).
    fn shape(&self) -> (usize, usize, usize) {
        match self {
            Backend::Cpu(s) => (s.options().ubatch, s.options().n_ctx, s.n_past()),
            Backend::Cuda(s) => (s.options().ubatch, s.options().n_ctx, s.n_past()),
        }
    }

    /// Starts or stops the per-kernel (CUDA) or per-node (CPU) timer; stopping returns
    /// (name, launches, ms, weight bytes or 0) per kind.
    fn set_profiling(&mut self, on: bool) -> Option<Vec<(String, usize, f64, usize)>> {
        match self {
            Backend::Cpu(s) => s.set_profiling(on).map(|v| {
                v.into_iter()
                    .map(|t| (t.op, t.calls, t.ms, t.bytes))
                    .collect()
            }),
            Backend::Cuda(s) => s.set_profiling(on).map(|v| {
                v.into_iter()
                    .map(|t| (t.kernel.to_string(), t.launches, t.ms, 0))
                    .collect()
            }),
        }
    }

    /// `n` greedy steps from `token`; returns the last token chosen. On CUDA the tokens are
    /// chosen on the device unless `host` (`--host-sampling`).
    fn generate(&mut self, token: u32, n: usize, host: bool) -> anyhow::Result<u32> {
        if let (Backend::Cuda(s), false) = (&mut *self, host) {
            return Ok(s.decode_greedy(token, n)?.last().copied().unwrap_or(token));
        }
        let mut t = token;
        for _ in 0..n {
            t = self.step(&[t])?;
        }
        Ok(t)
    }

    /// One step; returns the argmax of its last logits row.
    fn step(&mut self, tokens: &[u32]) -> anyhow::Result<u32> {
        Ok(match self {
            Backend::Cpu(s) => lagoon::sample::argmax(s.step(tokens)?),
            Backend::Cuda(s) => lagoon::sample::argmax(s.step(tokens)?),
        })
    }
}
use serde_json::json;

fn main() -> anyhow::Result<()> {
    let a = args::Args::parse(
        include_str!("bench.rs"),
        &["json", "reference", "no-warmup", "host-sampling"],
    )?;
    let model = a.get("model").context("--model PATH is required")?;
    let list = |name: &str, default: &str| -> anyhow::Result<Vec<usize>> {
        a.get(name)
            .unwrap_or(default)
            .split(',')
            .map(|s| {
                s.trim()
                    .parse()
                    .map_err(|_| anyhow::anyhow!("-{name}: `{s}` is not a number"))
            })
            .collect()
    };
    let prompts = list("p", "512")?;
    let gens = list("n", "128")?;
    let depths = list("d", "0")?;
    let ubatch: usize = match a.get("ub") {
        Some(_) => a.num("ub", 512)?,
        None => a.num("b", 512)?,
    };
    let reps: usize = a.num("r", 5)?;
    anyhow::ensure!(ubatch > 0 && reps > 0, "-ub and -r must be at least 1");
    let n_threads = match a.num("threads", 0usize)? {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let reference = a.flag("reference");
    let warmup = !a.flag("no-warmup");
    let as_json = a.flag("json");
    let host_sampling = a.flag("host-sampling");
    let device = a.device()?;
    // f16 KV by default on CUDA, f32 on the reference path (whose numerics are exact).
    let kv = a.kv(device, !reference)?;
    let kv_f16 = kv != lagoon::cuda_backend::KvCache::F32;
    let profile_steps: usize = a.num("profile", 0)?;
    let profile_prefill: usize = a.num("profile-prefill", 0)?;

    // The CPU floor first, before the model's pages compete for memory (the CUDA floor is
    // measured once the session holds the device).
    let mut floor = match device {
        None => measure_floor(n_threads),
        Some(_) => Floor {
            gb_s: 0.0,
            buffer_bytes: CUDA_FLOOR_BYTES,
        },
    };
    if device.is_none() {
        eprintln!(
            "floor: {:.2} GB/s streaming read ({} threads, {} MiB buffer)",
            floor.gb_s,
            n_threads,
            floor.buffer_bytes >> 20
        );
    }

    let ckpt = Checkpoint::open(model).with_context(|| format!("opening {model}"))?;
    let weights = lagoon::weights(&ckpt)?;
    let costs = Costs::new(&ckpt, &weights);
    let c = &ckpt.config;
    let max_p = prompts.iter().copied().max().unwrap_or(0);
    let max_n = gens.iter().copied().max().unwrap_or(0);
    // Room for the profiled steps (and their warm-up) after the last test, so `--profile`
    // times them at that test's depth instead of after a reset.
    let profile_room = match (profile_steps, profile_prefill) {
        (0, 0) => 0,
        (s, p) => s + 2 + 2 * p,
    };
    let n_ctx = depths.iter().copied().max().unwrap_or(0) + max_p.max(max_n + 1) + 1 + profile_room;
    let mut s = match device {
        None => Backend::Cpu(Session::new(
            c,
            &weights,
            SessionOptions {
                n_ctx,
                ubatch,
                all_logits: false,
                n_threads,
                reference,
                repack: None,
            },
        )),
        Some(device) => Backend::Cuda(CudaSession::new(
            c,
            &weights,
            CudaSessionOptions {
                n_ctx,
                ubatch,
                all_logits: false,
                device,
                cuda_graphs: true,
                quantized_activations: !reference,
                kv,
                ..Default::default()
            },
        )?),
    };
    if let (Backend::Cuda(cs), Some(d)) = (&s, device) {
        floor.gb_s = cs.read_bandwidth(CUDA_FLOOR_BYTES)?;
        eprintln!(
            "device: cuda:{d} ({}); floor: {:.0} GB/s streaming read ({} MiB buffer)",
            cs.arch(),
            floor.gb_s,
            CUDA_FLOOR_BYTES >> 20
        );
    }
    if let Backend::Cpu(cs) = &s
        && cs.repacked_bytes() > 0
    {
        eprintln!(
            "cpu: {} kernels; rows repacked 8 at a time (Q4_K, IQ4_XS; IQ3_XXS, IQ2_XXS, Q2_K, Q3_K, Q5_K, Q8_0, Q4_0, IQ4_NL and MXFP4 where this CPU has their kernels; int4 unless LAGOON_CPU_X8_CT4=0, Q6_K but the output unless LAGOON_CPU_X8_Q6K=0, the output too with =1): {:.2} GiB (LAGOON_CPU_X8=0 skips it)",
            cs.kernels_name(),
            cs.repacked_bytes() as f64 / (1u64 << 30) as f64
        );
    }
    let backend = match (device, reference) {
        (Some(d), true) if kv_f16 => format!("cuda:{d} kv {} (reference)", kv.name()),
        (Some(d), true) => format!("cuda:{d} (reference)"),
        (Some(d), false) if kv_f16 => format!("cuda:{d} kv {}", kv.name()),
        (Some(d), false) => format!("cuda:{d}"),
        (None, true) => "cpu (reference)".to_string(),
        (None, false) => "cpu".to_string(),
    };
    let model_name = Path::new(model)
        .file_name()
        .map_or(model.to_string(), |n| n.to_string_lossy().into_owned());
    let mut tokens = TokenStream::new(c.vocab_size);

    let mut rows = Vec::new();
    for &depth in &depths {
        let tests = prompts
            .iter()
            .filter(|&&p| p > 0)
            .map(|&p| Test::Pp(p))
            .chain(gens.iter().filter(|&&n| n > 0).map(|&n| Test::Tg(n)));
        for test in tests {
            if warmup {
                let w = match test {
                    Test::Pp(p) => Test::Pp(p),
                    Test::Tg(_) => Test::Tg(1),
                };
                run(&mut s, w, 0, &mut tokens, host_sampling)?;
            }
            let mut samples = Vec::with_capacity(reps);
            for _ in 0..reps {
                let secs = run(&mut s, test, depth, &mut tokens, host_sampling)?;
                samples.push(test.n_tokens() as f64 / secs);
            }
            let bytes = costs.bytes_per_token(c, test, ubatch);
            let flops = costs.flops_per_token(c, test, depth, ubatch);
            let row = Row::new(test, depth, samples, bytes, flops, floor.gb_s);
            if as_json {
                println!(
                    "{}",
                    row.json(&model_name, &costs, n_threads, ubatch, &backend)
                );
            } else {
                eprintln!("{} @ d{}: {:.2} t/s", test.name(), depth, row.median);
            }
            rows.push(row);
        }
    }
    if profile_steps > 0 {
        profile(&mut s, profile_steps, 1, &mut tokens, &costs, c, floor.gb_s)?;
    }
    if profile_prefill > 0 {
        profile(
            &mut s,
            1,
            profile_prefill,
            &mut tokens,
            &costs,
            c,
            floor.gb_s,
        )?;
    }
    if !as_json {
        print_table(
            &model_name,
            &costs,
            n_threads,
            ubatch,
            &backend,
            floor.gb_s,
            &rows,
        );
    }
    Ok(())
}

/// Times every kernel (CUDA) or graph node (CPU) of `steps` steps of `n_tok` tokens each
/// (decode steps for 1, prefill ubatches otherwise) and prints each kind's share per token,
/// the sum, for decode the bandwidth floor, and on the CPU each product's weight bytes and
/// GB/s.
fn profile(
    s: &mut Backend<'_>,
    steps: usize,
    n_tok: usize,
    tokens: &mut TokenStream,
    costs: &Costs,
    c: &ModelConfig,
    floor_gb_s: f64,
) -> anyhow::Result<()> {
    let (ubatch, n_ctx, n_past) = s.shape();
    anyhow::ensure!(
        n_tok <= ubatch,
        "--profile-prefill {n_tok} is larger than the ubatch ({ubatch}); raise -ub"
    );
    anyhow::ensure!(
        steps * n_tok < n_ctx,
        "profiling {steps} steps of {n_tok} tokens needs a context above {}; the session has {n_ctx}",
        steps * n_tok
    );
    // A warm-up step first where the context has room for it.
    let warm = (steps + 1) * n_tok < n_ctx;
    if n_past + (steps + usize::from(warm)) * n_tok + 1 > n_ctx {
        s.reset();
    }
    let batch = |t: &mut TokenStream| (0..n_tok).map(|_| t.next()).collect::<Vec<_>>();
    if warm {
        s.step(&batch(tokens))?;
    }
    // The depth the profiled steps start at (after the last test and the warm-up step).
    let depth = s.shape().2;
    s.set_profiling(true);
    for _ in 0..steps {
        s.step(&batch(tokens))?;
    }
    let mut times = s.set_profiling(false).unwrap_or_default();
    times.sort_by(|a, b| b.2.total_cmp(&a.2));
    let (unit, parts) = match s {
        Backend::Cpu(_) => ("node", "graph nodes back to back, each to its pool join"),
        Backend::Cuda(_) => ("kernel", "kernels back to back, no graph"),
    };
    let per = (steps * n_tok) as f64;
    let total: f64 = times.iter().map(|k| k.2).sum::<f64>() / per;
    if n_tok == 1 {
        let bytes = costs.bytes_per_token(c, Test::Tg(1), 1);
        eprintln!(
            "\n{unit} time per decode token ({steps} steps from depth {depth}, {parts}): {:.1} µs; \
             floor {:.1} µs ({:.0} MB at {:.0} GB/s)",
            1e3 * total,
            bytes / floor_gb_s * 1e-3,
            bytes / 1e6,
            floor_gb_s
        );
    } else {
        eprintln!(
            "\n{unit} time per token of a {n_tok}-token prefill step at depth {depth} ({parts}): {:.2} µs ({:.0} t/s)",
            1e3 * total,
            1e3 / total
        );
    }
    // Weight bytes are known per CPU node (the CUDA profile times kernels only).
    let with_bytes = times.iter().any(|t| t.3 > 0);
    if with_bytes {
        eprintln!("| {unit} | runs/token | µs/token | share | MB/token | GB/s | of floor |");
        eprintln!("|---|---|---|---|---|---|---|");
    } else {
        eprintln!("| {unit} | runs/token | µs/token | share |");
        eprintln!("|---|---|---|---|");
    }
    for (name, runs, ms, bytes) in &times {
        let line = format!(
            "| {name} | {:.2} | {:.2} | {:.1}% |",
            *runs as f64 / per,
            1e3 * ms / per,
            100.0 * ms / per / total
        );
        match (with_bytes, *bytes) {
            (false, _) => eprintln!("{line}"),
            (true, 0) => eprintln!("{line} | | | |"),
            (true, b) => {
                let gb_s = b as f64 / (ms * 1e-3) / 1e9;
                eprintln!(
                    "{line} {:.1} | {gb_s:.1} | {:.0}% |",
                    b as f64 / per / 1e6,
                    100.0 * gb_s / floor_gb_s
                );
            }
        }
    }
    Ok(())
}

#[derive(Clone, Copy, Debug)]
enum Test {
    Pp(usize),
    Tg(usize),
}

impl Test {
    fn name(self) -> String {
        match self {
            Test::Pp(n) => format!("pp{n}"),
            Test::Tg(n) => format!("tg{n}"),
        }
    }

    fn n_tokens(self) -> usize {
        match self {
            Test::Pp(n) | Test::Tg(n) => n,
        }
    }
}

/// Random token ids above the special range (xorshift64*).
struct TokenStream {
    state: u64,
    vocab: usize,
}

impl TokenStream {
    fn new(vocab: usize) -> TokenStream {
        TokenStream {
            state: 0x9e37_79b9_7f4a_7c15,
            vocab,
        }
    }

    fn next(&mut self) -> u32 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        let x = self.state.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let lo = 32.min(self.vocab - 1);
        (lo + (x >> 33) as usize % (self.vocab - lo)) as u32
    }

    fn take(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// One timed run of `test` at `depth`; returns its seconds.
fn run(
    s: &mut Backend<'_>,
    test: Test,
    depth: usize,
    t: &mut TokenStream,
    host_sampling: bool,
) -> anyhow::Result<f64> {
    s.reset();
    if depth > 0 {
        s.prefill(&t.take(depth))?;
    }
    match test {
        Test::Pp(n) => {
            let prompt = t.take(n);
            let t0 = Instant::now();
            s.prefill(&prompt)?;
            Ok(t0.elapsed().as_secs_f64())
        }
        Test::Tg(n) => {
            let next = s.step(&[t.next()])?;
            let t0 = Instant::now();
            s.generate(next, n, host_sampling)?;
            Ok(t0.elapsed().as_secs_f64())
        }
    }
}

/// Weight bytes and multiply-adds by what touches them.
struct Costs {
    /// Every tensor of the checkpoint.
    model_bytes: u64,
    n_params: u64,
    /// Matrices every step reads whole: attention, dense FFN, router, shared expert.
    dense_bytes: u64,
    dense_macs: u64,
    lm_head_bytes: u64,
    lm_head_macs: u64,
    embd_row_bytes: u64,
    /// Per MoE layer: one expert's bytes and multiply-adds.
    expert_bytes: Vec<u64>,
    expert_macs: Vec<u64>,
}

impl Costs {
    fn new(ckpt: &Checkpoint, w: &ModelWeights<'_>) -> Costs {
        let model_bytes = ckpt
            .records()
            .iter()
            .flat_map(|r| r.parts.iter().flat_map(|p| p.spans()))
            .map(|s| s.len as u64)
            .sum();
        let n_params = ckpt
            .records()
            .iter()
            .map(|r| r.shape.iter().product::<usize>() as u64)
            .sum();
        let b = |m: &lagoon::core::weights::MatRef<'_>| m.n_bytes() as u64;
        let macs = |m: &lagoon::core::weights::MatRef<'_>| (m.rows * m.cols) as u64;
        let mut c = Costs {
            model_bytes,
            n_params,
            dense_bytes: 0,
            dense_macs: 0,
            lm_head_bytes: b(&w.output),
            lm_head_macs: macs(&w.output),
            embd_row_bytes: b(&w.token_embd) / w.token_embd.rows.max(1) as u64,
            expert_bytes: Vec::new(),
            expert_macs: Vec::new(),
        };
        for l in &w.layers {
            let mut dense = vec![&l.q, &l.k, &l.v, &l.o];
            dense.extend(l.gate.as_ref());
            match &l.ffn {
                Ffn::Dense(m) => dense.extend([&m.gate, &m.up, &m.down]),
                Ffn::Moe {
                    router,
                    gate,
                    up,
                    down,
                    shared,
                    ..
                } => {
                    dense.push(router);
                    if let Some(m) = shared {
                        dense.extend([&m.gate, &m.up, &m.down]);
                    }
                    let n = gate.len().max(1) as u64;
                    let all = |v: &[lagoon::core::weights::MatRef<'_>], f: &dyn Fn(&lagoon::core::weights::MatRef<'_>) -> u64| {
                        v.iter().map(f).sum::<u64>()
                    };
                    c.expert_bytes
                        .push((all(gate, &b) + all(up, &b) + all(down, &b)) / n);
                    c.expert_macs
                        .push((all(gate, &macs) + all(up, &macs) + all(down, &macs)) / n);
                }
            }
            c.dense_bytes += dense.iter().map(|m| b(m)).sum::<u64>();
            c.dense_macs += dense.iter().map(|m| macs(m)).sum::<u64>();
        }
        c
    }

    /// Sizes of the ubatches a test evaluates.
    fn ubatches(test: Test, ubatch: usize) -> Vec<usize> {
        match test {
            Test::Tg(n) => vec![1; n],
            Test::Pp(n) => (0..n).step_by(ubatch).map(|s| ubatch.min(n - s)).collect(),
        }
    }

    /// Weight bytes streamed per token (see the module docs).
    fn bytes_per_token(&self, c: &ModelConfig, test: Test, ubatch: usize) -> f64 {
        let (e, k) = (c.n_experts.max(1) as f64, c.n_experts_used as f64);
        let per_step = |u: usize| {
            let touched = e * (1.0 - (1.0 - k / e).powi(u as i32));
            let experts: f64 = self.expert_bytes.iter().map(|&b| b as f64 * touched).sum();
            (self.dense_bytes + self.lm_head_bytes) as f64
                + u as f64 * self.embd_row_bytes as f64
                + experts
        };
        let ubs = Self::ubatches(test, ubatch);
        ubs.iter().map(|&u| per_step(u)).sum::<f64>() / test.n_tokens() as f64
    }

    /// FLOPs per token at context `depth` (attention over the keys each token sees).
    fn flops_per_token(&self, c: &ModelConfig, test: Test, depth: usize, ubatch: usize) -> f64 {
        let k = c.n_experts_used as u64;
        let matmul = 2 * (self.dense_macs + k * self.expert_macs.iter().sum::<u64>());
        let n = test.n_tokens();
        // Tokens at positions depth.. (tg: after its one-token start).
        let first = depth + matches!(test, Test::Tg(_)) as usize;
        let mut attn = 0u64;
        for p in first..first + n {
            for l in 0..c.n_layers {
                let keys = if c.is_sliding(l) {
                    (p + 1).min(c.sliding_window)
                } else {
                    p + 1
                };
                attn += 4 * (c.n_heads[l] * c.head_dim * keys) as u64;
            }
        }
        let steps = Self::ubatches(test, ubatch).len() as f64;
        matmul as f64 + attn as f64 / n as f64 + 2.0 * self.lm_head_macs as f64 * steps / n as f64
    }
}

struct Row {
    test: Test,
    depth: usize,
    samples: Vec<f64>,
    median: f64,
    min: f64,
    max: f64,
    bytes_per_token: f64,
    flops_per_token: f64,
    floor_gb_s: f64,
}

impl Row {
    fn new(
        test: Test,
        depth: usize,
        mut samples: Vec<f64>,
        bytes: f64,
        flops: f64,
        floor: f64,
    ) -> Row {
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        let m = sorted.len();
        let median = if m % 2 == 1 {
            sorted[m / 2]
        } else {
            (sorted[m / 2 - 1] + sorted[m / 2]) / 2.0
        };
        samples.shrink_to_fit();
        Row {
            test,
            depth,
            median,
            min: sorted[0],
            max: sorted[m - 1],
            samples,
            bytes_per_token: bytes,
            flops_per_token: flops,
            floor_gb_s: floor,
        }
    }

    fn gb_s(&self) -> f64 {
        self.median * self.bytes_per_token / 1e9
    }

    fn json(&self, model: &str, c: &Costs, threads: usize, ubatch: usize, backend: &str) -> String {
        let (n_prompt, n_gen) = match self.test {
            Test::Pp(n) => (n, 0),
            Test::Tg(n) => (0, n),
        };
        json!({
            "model": model,
            "model_bytes": c.model_bytes,
            "n_params": c.n_params,
            "backend": backend,
            "reference": backend.ends_with("(reference)"),
            "threads": threads,
            "n_ubatch": ubatch,
            "test": self.test.name(),
            "n_prompt": n_prompt,
            "n_gen": n_gen,
            "depth": self.depth,
            "reps": self.samples.len(),
            "tokens_per_s": self.median,
            "tokens_per_s_min": self.min,
            "tokens_per_s_max": self.max,
            "samples_tokens_per_s": self.samples,
            "bytes_per_token": self.bytes_per_token,
            "achieved_gb_s": self.gb_s(),
            "floor_gb_s": self.floor_gb_s,
            "fraction_of_floor": self.gb_s() / self.floor_gb_s,
            "flops_per_token": self.flops_per_token,
            "achieved_gflops": self.median * self.flops_per_token / 1e9,
        })
        .to_string()
    }
}

fn print_table(
    model: &str,
    c: &Costs,
    threads: usize,
    ubatch: usize,
    backend: &str,
    floor: f64,
    rows: &[Row],
) {
    println!(
        "| model | size | params | backend | threads | n_ubatch | test | t/s (median) | min – max | MB/token | GB/s | % of floor | GFLOP/s |"
    );
    println!(
        "| --- | ---: | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for r in rows {
        let test = if r.depth > 0 {
            format!("{} @ d{}", r.test.name(), r.depth)
        } else {
            r.test.name()
        };
        println!(
            "| {model} | {:.2} GiB | {:.2} B | {backend} | {threads} | {ubatch} | {test} | {:.2} | {:.2} – {:.2} | {:.1} | {:.2} | {:.1}% | {:.1} |",
            c.model_bytes as f64 / (1u64 << 30) as f64,
            c.n_params as f64 / 1e9,
            r.median,
            r.min,
            r.max,
            r.bytes_per_token / 1e6,
            r.gb_s(),
            100.0 * r.gb_s() / floor,
            r.median * r.flops_per_token / 1e9,
        );
    }
    println!("\nfloor: {floor:.2} GB/s streaming read, {threads} threads");
}

struct Floor {
    gb_s: f64,
    buffer_bytes: usize,
}

/// Last-level cache size from sysfs (`index3`, else the largest index), in bytes.
fn llc_bytes() -> Option<usize> {
    let dir = Path::new("/sys/devices/system/cpu/cpu0/cache");
    (0..8)
        .rev()
        .filter_map(|i| std::fs::read_to_string(dir.join(format!("index{i}/size"))).ok())
        .filter_map(|s| {
            let s = s.trim();
            let (num, mult) = match s.chars().last()? {
                'K' => (&s[..s.len() - 1], 1 << 10),
                'M' => (&s[..s.len() - 1], 1 << 20),
                'G' => (&s[..s.len() - 1], 1 << 30),
                _ => (s, 1),
            };
            num.parse::<usize>().ok().map(|n| n * mult)
        })
        .max()
}

/// `MemAvailable` from /proc/meminfo, in bytes.
fn mem_available() -> Option<usize> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb << 10)
}

/// Streaming-read bandwidth: `threads` threads sum disjoint slices of a buffer 8× the
/// last-level cache (1–4 GiB, at most a quarter of available memory); best of 5 passes.
fn measure_floor(threads: usize) -> Floor {
    const GIB: usize = 1 << 30;
    let cap = mem_available().map_or(4 * GIB, |m| (m / 4).clamp(256 << 20, 4 * GIB));
    let bytes = (8 * llc_bytes().unwrap_or(32 << 20)).clamp(GIB.min(cap), cap);
    let n = bytes / 8;
    let per = n.div_ceil(threads);
    let mut buf = vec![0u64; n];
    // First touch in parallel, with data, so every page is really mapped.
    std::thread::scope(|s| {
        for (t, chunk) in buf.chunks_mut(per).enumerate() {
            s.spawn(move || {
                for (i, x) in chunk.iter_mut().enumerate() {
                    *x = (i as u64) ^ (t as u64) << 40;
                }
            });
        }
    });
    let mut best = 0.0f64;
    for _ in 0..5 {
        let t0 = Instant::now();
        let total = std::thread::scope(|s| {
            let hs: Vec<_> = buf.chunks(per).map(|c| s.spawn(move || sum(c))).collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0u64, u64::wrapping_add)
        });
        let secs = t0.elapsed().as_secs_f64();
        std::hint::black_box(total);
        best = best.max(bytes as f64 / secs / 1e9);
    }
    Floor {
        gb_s: best,
        buffer_bytes: bytes,
    }
}

/// Wrapping sum with 8 independent accumulators (vectorises; no dependency chain).
fn sum(c: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let (blocks, rest) = c.as_chunks::<8>();
    for b in blocks {
        for i in 0..8 {
            acc[i] = acc[i].wrapping_add(b[i]);
        }
    }
    acc.iter().chain(rest).fold(0u64, |a, &x| a.wrapping_add(x))
}
