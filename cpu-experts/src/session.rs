//! A generation session: the graphs (one per ubatch size), the arena, the KV cache and the
//! position, all sized at creation so that a step allocates nothing.

use alloc::vec;
use alloc::vec::Vec;

use lagoon_core::config::ModelConfig;
use lagoon_core::graph::Graph;
use lagoon_core::laguna::{self, ModelWeights};
use lagoon_core::rope::RopeTable;

use crate::exec::profile::OpTime;
use crate::exec::{self, Scratch};
use crate::kernels::Kernels;
use crate::kv::KvCache;
use crate::pool::ThreadPool;

/// Sizes fixed at session creation.
#[derive(Clone, Copy, Debug)]
pub struct SessionOptions {
    /// Context length: positions `0..n_ctx`.
    pub n_ctx: usize,
    /// Largest number of tokens evaluated in one step (prefill chunk).
    pub ubatch: usize,
    /// Keep the logits of every token (the `logits` tool), not only the last one.
    pub all_logits: bool,
    /// Threads of the CPU pool (the caller's thread included); 0 = all available cores.
    pub n_threads: usize,
    /// Force the scalar reference path: weights decoded to f32, f32 math. Otherwise the
    /// fastest kernels this CPU supports (quantised activations, as llama.cpp does).
    pub reference: bool,
    /// Whether the Q4_K and IQ4_XS matrices are repacked eight rows at a time at session
    /// start ([`crate::kernels::x8::X8Store`]: faster products, results the scalar
    /// reference's bits, a second copy of those weights in memory). `None` (the default):
    /// as `LAGOON_CPU_X8=0|1` says, and unset, where the copy takes at most half of the
    /// memory available now and [`crate::kernels::x8::repack_by_default`] says so for this
    /// CPU.
    pub repack: Option<bool>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            n_ctx: 4096,
            ubatch: 512,
            all_logits: false,
            n_threads: 0,
            reference: false,
            repack: None,
        }
    }
}

/// Why a step was refused. A refused step changes nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepError {
    /// The tokens would run past the context.
    ContextFull {
        n_past: usize,
        n_tokens: usize,
        n_ctx: usize,
    },
    /// More tokens than the session's ubatch, or none.
    BadBatch { n_tokens: usize, ubatch: usize },
    /// A token id outside the vocabulary.
    BadToken { token: u32, vocab: usize },
}

impl core::fmt::Display for StepError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            StepError::ContextFull {
                n_past,
                n_tokens,
                n_ctx,
            } => write!(
                f,
                "{n_tokens} more tokens after {n_past} would exceed the context of {n_ctx}; create the session with a larger n_ctx"
            ),
            StepError::BadBatch { n_tokens, ubatch } => {
                write!(
                    f,
                    "a step takes 1..={ubatch} tokens, got {n_tokens}; split the input with `prefill`"
                )
            }
            StepError::BadToken { token, vocab } => {
                write!(
                    f,
                    "token id {token} is outside the vocabulary (size {vocab})"
                )
            }
        }
    }
}

impl std::error::Error for StepError {}

/// The mutable state a step works in.
#[derive(Debug)]
pub(crate) struct State {
    pub arena: Vec<f32>,
    pub kv: KvCache,
    pub scratch: Scratch,
    pub ropes: [RopeTable; 2],
    pub tokens: Vec<u32>,
    pub pool: ThreadPool,
    /// The fast kernel table, or `None` for the scalar reference path.
    pub kernels: Option<Kernels>,
    /// Node times while [`Session::set_profiling`] is on.
    pub profile: Option<exec::profile::Profile>,
}

/// A session over borrowed weights.
#[derive(Debug)]
pub struct Session<'w> {
    cfg: ModelConfig,
    w: &'w ModelWeights<'w>,
    decode: Graph,
    prefill: Graph,
    state: State,
    n_past: usize,
    opts: SessionOptions,
}

/// `k` with the model's Q4_K, IQ4_XS, Q6_K (but the output, below), IQ3_XXS (where this CPU
/// has its kernel) and symmetric int4 matrices repacked eight rows at a time
/// ([`crate::kernels::x8::X8Store`]; their products then give the scalar reference's bits).
/// The copy is a second one of those weights (148 bytes per 144 for Q4_K; the mapped
/// originals are not read again, so a file's pages become reclaimable page cache). `repack`
/// ([`SessionOptions::repack`]) decides, else `LAGOON_CPU_X8=0|1`; with neither, it is made
/// where [`crate::kernels::x8::repack_by_default`] says so for this CPU and it takes at most
/// half of the memory available now (`MemAvailable`, Linux), else skipped (the table's one-row
/// kernels run those matrices).
fn with_x8(k: Kernels, w: &ModelWeights<'_>, repack: Option<bool>) -> Kernels {
    use lagoon_core::laguna::weights::Ffn;
    let mut mats = vec![&w.output];
    for l in &w.layers {
        mats.extend([&l.q, &l.k, &l.v, &l.o]);
        mats.extend(l.gate.as_ref());
        match &l.ffn {
            Ffn::Dense(m) => mats.extend([&m.gate, &m.up, &m.down]),
            Ffn::Moe {
                gate,
                up,
                down,
                shared,
                ..
            } => {
                mats.extend(gate.iter().chain(up).chain(down));
                if let Some(m) = shared {
                    mats.extend([&m.gate, &m.up, &m.down]);
                }
            }
        }
    }
    // Q6_K: every matrix but the output (lm_head) by default; `LAGOON_CPU_X8_Q6K=0` none,
    // `=1` the output too. Its 8-row layout wins prefill (2.6x single thread on an AVX2 VM,
    // session 18) but its one-token kernel loses to the table's one-row one (−35% there), and
    // a matrix takes one kernel for decode and prefill (the two give different bits). The
    // output is the one Q6_K matrix that prefill runs on a single row (the last), and the
    // largest that decode reads; left to the one-row kernel, the others' repack is level in
    // decode and wins prefill. 2-core AVX512-VNNI VM, XS.2 8 layers Q4_K_M (Q6_K: 3 of 7
    // expert downs, 4 attn_v, the dense down, 3 shared downs, the output), pp512 / tg128 t/s,
    // alternating, session 32: none 319.5 / 48.95, 320.6 / 47.79; all but the output 327.8 /
    // 48.91, 330.9 / 49.30; all 328.9 / 44.64, 326.8 / 47.14 (BENCHMARKS.md).
    let q6 = std::env::var("LAGOON_CPU_X8_Q6K").unwrap_or_default();
    if q6 != "1" {
        let out: *const lagoon_core::weights::MatRef<'_> = &w.output;
        mats.retain(|m| {
            let is_q6k = matches!(
                m.enc,
                lagoon_core::weights::Encoding::Ggml {
                    ty: lagoon_core::dtype::GgmlType::Q6K,
                    ..
                }
            );
            !is_q6k || (q6 != "0" && !core::ptr::eq(*m, out))
        });
    }
    // int4 compressed-tensors rows unless `LAGOON_CPU_X8_CT4=0`: since session 23 (scales
    // ahead of the codes, the activation sums by `vpsadbw`) their 8-row kernel's expert GEMV
    // runs at 101-103% of a streaming read taken beside it on the 16-core host against the
    // one-row kernel's 83-86%, and 70-76% against 46-70% on the 2-core Zen 5 VM
    // (BENCHMARKS.md, "Session 23"); since session 41 (each line of scales just before its
    // codes) 89-92% on the 2-core Zen 4 VM in its low read mode. Until session 23 it was
    // level with the one-row kernel and opt-in.
    if std::env::var_os("LAGOON_CPU_X8_CT4").is_some_and(|v| v == "0") {
        mats.retain(|m| !matches!(m.enc, lagoon_core::weights::Encoding::Ct(_)));
    }
    let env = match std::env::var("LAGOON_CPU_X8").as_deref() {
        Ok("0") => Some(false),
        Ok("1") => Some(true),
        _ => None,
    };
    let make = match repack.or(env) {
        Some(b) => b,
        None => {
            let need = crate::kernels::x8::X8Store::planned_bytes(mats.iter().copied());
            crate::kernels::x8::repack_by_default()
                && need > 0
                && mem_available().is_none_or(|a| need <= a / 2)
        }
    };
    if !make {
        return k;
    }
    let store = crate::kernels::x8::X8Store::build(mats);
    if store.is_empty() {
        return k;
    }
    k.with_x8(std::sync::Arc::new(store))
}

/// `MemAvailable` of /proc/meminfo in bytes (None where there is none to read).
fn mem_available() -> Option<usize> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

impl<'w> Session<'w> {
    /// Builds the graphs and allocates everything a step needs.
    pub fn new(cfg: &ModelConfig, w: &'w ModelWeights<'w>, opts: SessionOptions) -> Session<'w> {
        let ubatch = opts.ubatch.max(1);
        let opts = SessionOptions {
            ubatch,
            n_ctx: opts.n_ctx.max(1),
            ..opts
        };
        let decode = laguna::build(cfg, &w.gates, 1, opts.all_logits);
        let prefill = laguna::build(cfg, &w.gates, ubatch, opts.all_logits);
        let arena = vec![0.0; decode.arena_len.max(prefill.arena_len)];
        let kv = KvCache::new(cfg, opts.n_ctx, ubatch);
        let max_cap = kv.layers.iter().map(|l| l.cap).max().unwrap_or(0);
        let n_threads = if opts.n_threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            opts.n_threads
        };
        let pool = ThreadPool::new(n_threads);
        let kernels = if opts.reference {
            None
        } else {
            Some(with_x8(Kernels::detect(), w, opts.repack))
        };
        let scratch = Scratch::new(cfg, w, ubatch, max_cap, n_threads, kernels.as_ref());
        let ropes = [
            RopeTable::new(&cfg.rope_full),
            RopeTable::new(&cfg.rope_sliding),
        ];
        let state = State {
            arena,
            kv,
            scratch,
            ropes,
            tokens: Vec::with_capacity(ubatch),
            pool,
            kernels,
            profile: None,
        };
        Session {
            cfg: cfg.clone(),
            w,
            decode,
            prefill,
            state,
            n_past: 0,
            opts,
        }
    }

    /// Tokens evaluated so far (the next token's position).
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// The options the session was created with.
    pub fn options(&self) -> SessionOptions {
        self.opts
    }

    /// Forgets the context (the cache is overwritten as positions are reused).
    pub fn reset(&mut self) {
        self.n_past = 0;
    }

    /// The kernel set in use: `"reference"`, `"scalar"` or `"avx2"`.
    pub fn kernels_name(&self) -> &'static str {
        self.state
            .kernels
            .as_ref()
            .map_or("reference", |k| k.name())
    }

    /// Bytes of the 8-row repacked Q4_K / IQ4_XS copies the session's kernels hold (0 without;
    /// [`crate::kernels::x8::X8Store`], `LAGOON_CPU_X8`).
    pub fn repacked_bytes(&self) -> usize {
        self.state.kernels.as_ref().map_or(0, Kernels::x8_bytes)
    }

    /// Starts (`true`) or stops timing every graph node of the following steps; stopping
    /// returns the totals per kind of node, largest first ([`OpTime`]). While on, each node
    /// costs two clock reads and its kind's bookkeeping, and the first steps may allocate.
    pub fn set_profiling(&mut self, on: bool) -> Option<Vec<OpTime>> {
        let prev = self.state.profile.take().map(|p| p.report());
        if on {
            self.state.profile = Some(exec::profile::Profile::default());
        }
        prev
    }

    /// Bytes of KV cache and arena.
    pub fn n_bytes(&self) -> usize {
        self.state.kv.n_bytes() + self.state.arena.len() * 4
    }

    /// Evaluates up to `ubatch` tokens at the next positions. Returns the logits: one row
    /// per token with `all_logits`, else the last token's row.
    pub fn step(&mut self, tokens: &[u32]) -> Result<&[f32], StepError> {
        let n = tokens.len();
        if n == 0 || n > self.opts.ubatch {
            return Err(StepError::BadBatch {
                n_tokens: n,
                ubatch: self.opts.ubatch,
            });
        }
        if self.n_past + n > self.opts.n_ctx {
            return Err(StepError::ContextFull {
                n_past: self.n_past,
                n_tokens: n,
                n_ctx: self.opts.n_ctx,
            });
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            return Err(StepError::BadToken {
                token: t,
                vocab: self.cfg.vocab_size,
            });
        }
        self.state.tokens.clear();
        self.state.tokens.extend_from_slice(tokens);
        let graph = if n == 1 { &self.decode } else { &self.prefill };
        exec::run(&mut self.state, graph, &self.cfg, self.w, n, self.n_past);
        self.n_past += n;
        let out = graph.values[graph.output];
        let len = out.rows(n) * out.cols;
        Ok(&self.state.arena[out.offset..out.offset + len])
    }

    /// Evaluates any number of tokens in ubatch chunks, calling `f` with each chunk's logits.
    pub fn prefill(&mut self, tokens: &[u32], mut f: impl FnMut(&[f32])) -> Result<(), StepError> {
        if self.n_past + tokens.len() > self.opts.n_ctx {
            return Err(StepError::ContextFull {
                n_past: self.n_past,
                n_tokens: tokens.len(),
                n_ctx: self.opts.n_ctx,
            });
        }
        for chunk in tokens.chunks(self.opts.ubatch) {
            f(self.step(chunk)?);
        }
        Ok(())
    }
}
