//! Generates text with a Laguna model, streaming it to stdout.
//!
//! `generate [--model PATH] [--prompt TEXT | --chat TEXT | --prompt-tokens 2,10,11]
//!  [--system TEXT] [--think | --no-think] [--chat-template FILE] [--tools FILE]
//!  [-n | --max-tokens N] [--temp T] [--top-k K] [--top-p P] [--min-p P]
//!  [--repeat-penalty R] [--presence-penalty P] [--frequency-penalty F] [--seed S]
//!  [--stop STR]... [--reasoning-budget N] [--ids]
//!  [--ctx N] [--ubatch N] [--threads N] [--reference] [--device cpu|cuda[:N]] [--kv f32|f16|bf16|q8_0]`
//!
//! --prompt TEXT        raw completion: the tokenizer's BOS, then TEXT.
//! --chat TEXT          one user turn rendered with the checkpoint's chat template
//!                      (--system adds a system turn; --think / --no-think set
//!                      `enable_thinking`, else the template's default). A checkpoint
//!                      without a template gets --chat-template FILE or the Laguna v8 one.
//! --prompt-tokens IDS  comma-separated prompt ids.
//! --tools FILE         a JSON array of OpenAI-style tools, given to the chat template; the
//!                      reply's `<tool_call>`s are then parsed as vLLM's `poolside_v1`
//!                      parser does and printed on stderr as `tool_call: name {args}`.
//! --stop STR           stop string; repeatable, or a comma list (`\,` for a comma; `\n`,
//!                      `\t`, `\\` escapes).
//! --reasoning-budget N force `</think>` after N reasoning tokens.
//! --ids                also print the generated ids on stdout at the end.
//! --device D           `cpu` (default) or `cuda[:N]`: run on CUDA device N.
//! --kv T               `f16` (the CUDA default but with --reference), `bf16` or `f32` (the
//!                       CPU's only type): the KV cache's element type.
//! Sampling defaults: greedy (temp 0), every filter and penalty off, seed 0, 256 tokens.
//!
//! Reasoning is shown dimmed on a terminal, otherwise wrapped in literal `<think>…</think>`
//! (left open when generation is cut inside reasoning).
//! Timings and the finish reason go to stderr. Without a prompt flag a default prompt is
//! used: a chat turn when the checkpoint has a chat template, else a raw completion.
//! Without `--model` it runs the small model bundled with the repository (a toy trained on
//! Python's standard library, `models/laguna-tiny/MODEL_CARD.md`): without a prompt flag it
//! completes a Python snippet, sampling at temperature 0.7, top-k 40 unless told otherwise.

#[path = "common/args.rs"]
mod args;

use std::io::{IsTerminal, Write};
use std::time::Instant;

use anyhow::Context;
use lagoon::chat::ChatTemplate;
use lagoon::cuda_backend::{CudaError, CudaSession, CudaSessionOptions};
use lagoon::generate::prompt::{ChatRequest, encode_completion, encode_rendered};
use lagoon::generate::{
    Channel, Event, GenerateParams, Generator, LogitsSource, end_of_generation_ids,
};
use lagoon::parse::{ParseOptions, ToolChoice, Tools};
use lagoon::sample::{Sampler, SamplerParams};
use lagoon::tokenizer::Tokenizer;
use lagoon::{Checkpoint, Session, SessionOptions, StepError};

/// Used by `--chat` when the checkpoint carries no template (spec/laguna.md §7.2).
const LAGUNA_V8_TEMPLATE: &str = include_str!("../tests/fixtures/chat/laguna_v8.jinja");
const DEFAULT_CHAT: &str = "Write a short poem about the sea.";
const DEFAULT_COMPLETION: &str = "Once upon a time";
/// The bundled model's default prompt: it only knows Python.
const BUNDLED_COMPLETION: &str = "class Queue:\n    \"\"\"";

/// Splits `--stop` values on unescaped commas and resolves `\n \t \\ \,`.
fn stop_strings(values: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for v in values {
        let mut cur = String::new();
        let mut chars = v.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => cur.push('\n'),
                    Some('t') => cur.push('\t'),
                    Some(',') => cur.push(','),
                    Some('\\') => cur.push('\\'),
                    Some(o) => {
                        cur.push('\\');
                        cur.push(o);
                    }
                    None => cur.push('\\'),
                },
                ',' => out.push(std::mem::take(&mut cur)),
                c => cur.push(c),
            }
        }
        out.push(cur);
    }
    out.retain(|s| !s.is_empty());
    out
}

fn sampler_params(a: &args::Args, d: SamplerParams) -> anyhow::Result<SamplerParams> {
    let p = SamplerParams {
        temperature: a.num("temp", d.temperature)?,
        top_k: a.num("top-k", d.top_k)?,
        top_p: a.num("top-p", d.top_p)?,
        min_p: a.num("min-p", d.min_p)?,
        repetition_penalty: a.num("repeat-penalty", d.repetition_penalty)?,
        presence_penalty: a.num("presence-penalty", d.presence_penalty)?,
        frequency_penalty: a.num("frequency-penalty", d.frequency_penalty)?,
    };
    p.validate()?;
    Ok(p)
}

/// Writes the stream, marking reasoning: ANSI dim on a terminal, else literal tags.
struct Printer {
    out: std::io::StdoutLock<'static>,
    tty: bool,
    open: bool,
}

impl Printer {
    fn set_reasoning(&mut self, on: bool) -> std::io::Result<()> {
        if on == self.open {
            return Ok(());
        }
        self.open = on;
        let mark = match (self.tty, on) {
            (true, true) => "\x1b[2m",
            (true, false) => "\x1b[0m",
            (false, true) => "<think>",
            (false, false) => "</think>",
        };
        self.out.write_all(mark.as_bytes())
    }

    fn event(&mut self, e: Event<'_>) -> std::io::Result<()> {
        match e {
            Event::Text { text, channel } => {
                self.set_reasoning(channel == Channel::Reasoning)?;
                self.out.write_all(text.as_bytes())?;
                self.out.flush()
            }
            Event::ReasoningStart => self.set_reasoning(true),
            Event::ReasoningEnd { .. } => self.set_reasoning(false),
            Event::Token { .. } => Ok(()),
        }
    }
}

fn main() -> anyhow::Result<()> {
    let a = args::Args::parse(
        include_str!("generate.rs"),
        &["reference", "think", "no-think", "ids"],
    )?;
    let model = a.get("model").unwrap_or(lagoon::BUNDLED_MODEL);
    let max_tokens: usize = match a.get_any(&["n", "max-tokens"]) {
        Some((_, v)) => v
            .parse()
            .map_err(|_| anyhow::anyhow!("`--max-tokens {v}` is not a valid number"))?,
        None => 256,
    };
    anyhow::ensure!(max_tokens > 0, "--max-tokens must be at least 1");
    let n_prompt_flags = ["prompt", "chat", "prompt-tokens"]
        .iter()
        .filter(|f| a.get(f).is_some())
        .count();
    anyhow::ensure!(
        n_prompt_flags <= 1,
        "give at most one of --prompt, --chat, --prompt-tokens"
    );
    anyhow::ensure!(
        !(a.flag("think") && a.flag("no-think")),
        "give --think or --no-think, not both"
    );
    // The bundled toy model loops under greedy decoding: sample it unless told otherwise.
    let bundled_default = a.get("model").is_none() && n_prompt_flags == 0;
    let sampler_defaults = if bundled_default {
        SamplerParams {
            temperature: 0.7,
            top_k: 40,
            ..SamplerParams::default()
        }
    } else {
        SamplerParams::default()
    };
    let params = GenerateParams {
        sampler: sampler_params(&a, sampler_defaults)?,
        seed: a.num("seed", 0)?,
        max_tokens,
        stop: stop_strings(&a.all("stop")),
        reasoning_budget: a
            .get("reasoning-budget")
            .map(|v| {
                v.parse()
                    .map_err(|_| anyhow::anyhow!("`--reasoning-budget {v}` is not a number"))
            })
            .transpose()?,
        ..Default::default()
    };

    let tools_json: Option<serde_json::Value> = match a.get("tools") {
        Some(f) => {
            let bytes = std::fs::read(f).with_context(|| format!("reading --tools {f}"))?;
            let v: serde_json::Value =
                serde_json::from_slice(&bytes).with_context(|| format!("--tools {f}: not JSON"))?;
            Some(v)
        }
        None => None,
    };
    let parse_opts = ParseOptions {
        thinking: false,
        tools: match &tools_json {
            Some(v) => Tools::from_openai_json(v)?,
            None => Tools::new(),
        },
        tool_choice: ToolChoice::Auto,
    };

    let t_load = Instant::now();
    let ckpt = Checkpoint::open(model).with_context(|| format!("opening {model}"))?;
    let weights = lagoon::weights(&ckpt)?;
    let tokenizer = Tokenizer::from_checkpoint(&ckpt);

    // The prompt (a raw completion's text is echoed before the continuation).
    let mut echo: Option<&str> = None;
    let prompt: Vec<u32> = if let Some(ids) = a.tokens("prompt-tokens")? {
        ids
    } else {
        let tok = tokenizer
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{model}: {e}; use --prompt-tokens instead"))?;
        let own_template = ChatTemplate::from_checkpoint(&ckpt);
        let chat_text = match (a.get("prompt"), a.get("chat")) {
            (Some(_), _) => None,
            (None, None) if bundled_default => None,
            (None, Some(c)) => Some(c),
            (None, None) if own_template.is_ok() => {
                eprintln!("no prompt given: chatting with {DEFAULT_CHAT:?}");
                Some(DEFAULT_CHAT)
            }
            (None, None) => None,
        };
        if let Some(text) = chat_text {
            let template = match (a.get("chat-template"), own_template) {
                (Some(f), _) => ChatTemplate::from_str(
                    &std::fs::read_to_string(f).with_context(|| format!("reading {f}"))?,
                )?,
                (None, Ok(t)) => t,
                (None, Err(e)) => {
                    eprintln!("{e}; using the Laguna v8 chat template");
                    ChatTemplate::from_str(LAGUNA_V8_TEMPLATE)?
                }
            };
            let thinking = match (a.flag("think"), a.flag("no-think")) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            };
            let mut req = ChatRequest::user(text, a.get("system"), thinking);
            req.tools = tools_json.clone();
            encode_rendered(tok, &req.render(&template)?)
        } else {
            let text = a.get("prompt").unwrap_or_else(|| {
                let d = if bundled_default {
                    BUNDLED_COMPLETION
                } else {
                    DEFAULT_COMPLETION
                };
                eprintln!("no prompt given: completing {d:?}");
                d
            });
            echo = Some(text);
            encode_completion(tok, text)
        }
    };
    anyhow::ensure!(!prompt.is_empty(), "the prompt has no tokens");

    let n_ctx: usize = a.num("ctx", prompt.len() + max_tokens)?;
    let ubatch: usize = a.num("ubatch", 64)?;
    let device = a.device()?;
    let kv = a.kv(device, !a.flag("reference"))?;
    let mut s = match device {
        None => Backend::Cpu(Session::new(
            &ckpt.config,
            &weights,
            SessionOptions {
                n_ctx,
                ubatch,
                all_logits: false,
                n_threads: a.num("threads", 0)?,
                reference: a.flag("reference"),
                repack: None,
            },
        )),
        Some(device) => Backend::Cuda(CudaSession::new(
            &ckpt.config,
            &weights,
            CudaSessionOptions {
                n_ctx,
                ubatch,
                all_logits: false,
                device,
                cuda_graphs: true,
                quantized_activations: !a.flag("reference"),
                kv,
                ..Default::default()
            },
        )?),
    };
    eprintln!(
        "loaded {model} in {:.2} s; prompt: {} tokens",
        t_load.elapsed().as_secs_f64(),
        prompt.len()
    );

    let Ok(tok) = tokenizer.as_ref() else {
        return ids_only(&ckpt, &mut s, &prompt, &params);
    };
    let ends = end_of_generation_ids(&ckpt.config.eos_tokens, tok);
    let mut g = Generator::new(tok, ckpt.config.vocab_size, &ends, params)?;
    let mut p = Printer {
        out: std::io::stdout().lock(),
        tty: std::io::stdout().is_terminal(),
        open: false,
    };
    if let Some(text) = echo {
        p.out.write_all(text.as_bytes())?;
        p.out.flush()?;
    }
    let mut io_err = None;
    // The reply's content, for the tool-call parser (reasoning is split off by the driver).
    let mut content = String::new();
    let outcome = g.generate(&mut s, &prompt, |e| {
        if let Event::Text {
            text,
            channel: Channel::Content,
        } = &e
        {
            content.push_str(text);
        }
        if io_err.is_none()
            && let Err(err) = p.event(e)
        {
            io_err = Some(err);
        }
    })?;
    if p.tty {
        p.set_reasoning(false)?;
    }
    writeln!(p.out)?;
    if a.flag("ids") {
        let ids: Vec<String> = g.tokens().iter().map(|t| t.to_string()).collect();
        writeln!(p.out, "{}", ids.join(","))?;
    }
    p.out.flush()?;
    if let Some(e) = io_err {
        return Err(e).context("writing to stdout");
    }

    if tools_json.is_some() {
        let msg = lagoon::parse::parse(&content, &parse_opts);
        for c in &msg.tool_calls {
            eprintln!("tool_call: {} {}", c.name, c.arguments);
        }
    }

    let o = outcome;
    let prefill_s = o.prefill.as_secs_f64();
    let decode_s = o.decode.as_secs_f64();
    let n_decode = o.n_generated.saturating_sub(1);
    eprintln!(
        "prefill {} tokens: {:.1} tok/s; decode {} tokens: {:.1} tok/s ({} reasoning{})",
        o.n_prompt_tokens,
        o.n_prompt_tokens as f64 / prefill_s.max(1e-9),
        n_decode,
        n_decode as f64 / decode_s.max(1e-9),
        o.n_reasoning_tokens,
        if o.reasoning_forced {
            ", </think> forced by the budget"
        } else {
            ""
        }
    );
    eprintln!(
        "finish_reason: {}{}",
        o.finish,
        if o.in_reasoning {
            "; cut inside reasoning"
        } else {
            ""
        }
    );
    Ok(())
}

/// A checkpoint without a tokenizer: sample ids and print them.
fn ids_only(
    ckpt: &Checkpoint,
    s: &mut Backend<'_>,
    prompt: &[u32],
    params: &GenerateParams,
) -> anyhow::Result<()> {
    eprintln!("the checkpoint has no tokenizer: printing token ids");
    let mut sampler = Sampler::new(ckpt.config.vocab_size, params.sampler, params.seed)?;
    sampler.reset(prompt, params.seed);
    let t0 = Instant::now();
    let mut next = sampler.sample(s.eval_prompt(prompt)?);
    let t_prefill = t0.elapsed().as_secs_f64();
    let mut out = vec![next];
    let t1 = Instant::now();
    while out.len() < params.max_tokens && !ckpt.config.eos_tokens.contains(&next) {
        sampler.accept(next);
        next = sampler.sample(s.eval_token(next)?);
        out.push(next);
    }
    let t_decode = t1.elapsed().as_secs_f64();
    let ids: Vec<String> = out.iter().map(|t| t.to_string()).collect();
    println!("{}", ids.join(","));
    eprintln!(
        "prefill {} tokens: {:.1} tok/s; decode {} tokens: {:.1} tok/s",
        prompt.len(),
        prompt.len() as f64 / t_prefill.max(1e-9),
        out.len() - 1,
        (out.len() - 1) as f64 / t_decode.max(1e-9)
    );
    Ok(())
}

/// The CPU or the CUDA session, behind the driver's one interface (one of them exists per
/// run, so the size difference does not matter).
#[allow(clippy::large_enum_variant)]
enum Backend<'w> {
    Cpu(Session<'w>),
    Cuda(CudaSession),
}

#[derive(Debug)]
enum BackendError {
    Cpu(StepError),
    Cuda(CudaError),
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendError::Cpu(e) => e.fmt(f),
            BackendError::Cuda(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for BackendError {}

impl LogitsSource for Backend<'_> {
    type Error = BackendError;

    fn eval_prompt(&mut self, prompt: &[u32]) -> Result<&[f32], BackendError> {
        match self {
            Backend::Cpu(s) => s.eval_prompt(prompt).map_err(BackendError::Cpu),
            Backend::Cuda(s) => s.eval_prompt(prompt).map_err(BackendError::Cuda),
        }
    }

    fn eval_token(&mut self, token: u32) -> Result<&[f32], BackendError> {
        match self {
            Backend::Cpu(s) => s.eval_token(token).map_err(BackendError::Cpu),
            Backend::Cuda(s) => s.eval_token(token).map_err(BackendError::Cuda),
        }
    }

    fn room(&self) -> Option<usize> {
        match self {
            Backend::Cpu(s) => s.room(),
            Backend::Cuda(s) => s.room(),
        }
    }
}
