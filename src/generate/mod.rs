//! Text generation: drives a model ([`LogitsSource`], e.g. [`Session`](crate::Session))
//! with a [`Sampler`], detokenizes as it goes and streams [`Event`]s.
//!
//! ```text
//! prompt ─ eval_prompt ─ logits ─┬─ forced `</think>` (reasoning budget spent)
//!                                └─ sample (penalties, temperature, filters)
//!        token ─ end-of-generation / stop id?   → finish: stop
//!              ─ `<think>` / `</think>`?         → switch channel (no text)
//!              ─ stream detokenizer (UTF-8 held back) ─ stop strings (prefix held back)
//!                                                  ─ Event::Text { channel }
//!              ─ max_tokens / context full?      → finish: length
//!              ─ eval_token ─ logits ─ …
//! ```
//!
//! After [`Generator::new`] (and the first call, which sizes the output list) a token costs
//! no allocation: the sampler's scratch and counts, the detokenizer's and the stop matcher's
//! buffers are all reused.

mod budget;
pub mod prompt;
mod source;
pub mod stop;

use std::fmt;
use std::time::{Duration, Instant};

use lagoon_core::sample::{Sampler, SamplerError, SamplerParams};

use crate::tokenizer::{StreamDecoder, Tokenizer};

pub use budget::{MAX_UTF8_WAIT, ThinkTokens};
pub use source::LogitsSource;
pub use stop::StopStrings;

use budget::Reasoning;

/// Settings of one generation.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateParams {
    pub sampler: SamplerParams,
    pub seed: u64,
    /// Most tokens to generate (the end token counted); at least 1.
    pub max_tokens: usize,
    /// Stop strings, matched on the decoded text of each channel; not emitted.
    pub stop: Vec<String>,
    /// Token ids that stop generation besides the checkpoint's end-of-generation ids.
    pub stop_token_ids: Vec<u32>,
    /// Reasoning tokens after which `</think>` is forced (`None`: unlimited).
    pub reasoning_budget: Option<usize>,
    /// Whether generation starts inside reasoning; `None`: from the prompt (its last
    /// marker in the current turn is `<think>`).
    pub starts_in_reasoning: Option<bool>,
    /// Leave the text of special tokens out (HF `skip_special_tokens`). Off by default so
    /// that tool-call markup stays in the text for a parser.
    pub skip_special_tokens: bool,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            sampler: SamplerParams::default(),
            seed: 0,
            max_tokens: 256,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            reasoning_budget: None,
            starts_in_reasoning: None,
            skip_special_tokens: false,
        }
    }
}

/// Which part of the answer text belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Channel {
    /// Between `<think>` and `</think>`.
    Reasoning,
    Content,
}

/// What the driver reports while generating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// A token was chosen (`forced`: by the reasoning budget, not sampled). `channel` is the
    /// channel before the token (a `</think>` comes in `Reasoning`).
    Token {
        id: u32,
        channel: Channel,
        forced: bool,
    },
    /// Decoded text, complete characters only, never part of a stop string.
    Text { text: &'a str, channel: Channel },
    /// A `<think>` token opened reasoning.
    ReasoningStart,
    /// A `</think>` token closed reasoning (`forced` by the budget).
    ReasoningEnd { forced: bool },
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop(StopReason),
    Length(LengthLimit),
}

/// Which stop ended generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// One of the checkpoint's end-of-generation ids (Laguna: EOS 2, `</assistant>` 24).
    EndOfGeneration(u32),
    /// One of [`GenerateParams::stop_token_ids`].
    StopToken(u32),
    /// [`GenerateParams::stop`]`[index]`.
    StopString(usize),
}

/// Which limit ended generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LengthLimit {
    MaxTokens,
    /// The model's context is full.
    Context,
}

impl FinishReason {
    /// The OpenAI / vLLM name: `"stop"` or `"length"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop(_) => "stop",
            FinishReason::Length(_) => "length",
        }
    }
}

impl fmt::Display for FinishReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FinishReason::Stop(StopReason::EndOfGeneration(t)) => {
                write!(f, "stop (end-of-generation token {t})")
            }
            FinishReason::Stop(StopReason::StopToken(t)) => write!(f, "stop (stop token {t})"),
            FinishReason::Stop(StopReason::StopString(i)) => write!(f, "stop (stop string #{i})"),
            FinishReason::Length(LengthLimit::MaxTokens) => write!(f, "length (max_tokens)"),
            FinishReason::Length(LengthLimit::Context) => write!(f, "length (context full)"),
        }
    }
}

/// The result of one generation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    pub finish: FinishReason,
    /// Generation ended inside reasoning (no `</think>` yet).
    pub in_reasoning: bool,
    /// The budget forced `</think>`.
    pub reasoning_forced: bool,
    pub n_prompt_tokens: usize,
    /// Tokens chosen, the final stop token included.
    pub n_generated: usize,
    /// Tokens generated inside reasoning, markers excluded.
    pub n_reasoning_tokens: usize,
    /// Time to evaluate the prompt (and sample the first token).
    pub prefill: Duration,
    /// Time for the rest.
    pub decode: Duration,
}

/// Settings that cannot work.
#[derive(Clone, Debug, PartialEq)]
pub enum ConfigError {
    Sampler(SamplerError),
    MaxTokensZero,
    /// A reasoning budget needs a `</think>` token to force.
    NoThinkEnd,
    /// The vocabulary size given for the logits is 0.
    NoVocabulary,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Sampler(e) => e.fmt(f),
            ConfigError::MaxTokensZero => write!(f, "max_tokens must be at least 1"),
            ConfigError::NoThinkEnd => write!(
                f,
                "a reasoning budget was set but the tokenizer has no `</think>` token; drop the budget"
            ),
            ConfigError::NoVocabulary => write!(f, "the model's vocabulary size is 0"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Why a generation failed.
#[derive(Debug)]
pub enum GenerateError<E> {
    EmptyPrompt,
    /// The model returned logits of another length than the sampler was built for.
    VocabMismatch {
        logits: usize,
        expected: usize,
    },
    /// The model failed (e.g. [`StepError`](crate::StepError): prompt too long for the
    /// context, token outside the vocabulary).
    Source(E),
}

impl<E: fmt::Display> fmt::Display for GenerateError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GenerateError::EmptyPrompt => write!(f, "the prompt has no tokens; give some text"),
            GenerateError::VocabMismatch { logits, expected } => write!(
                f,
                "the model returned {logits} logits but the generator was built for a vocabulary of {expected}"
            ),
            GenerateError::Source(e) => write!(f, "model: {e}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for GenerateError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GenerateError::Source(e) => Some(e),
            _ => None,
        }
    }
}

/// The ids that end generation: the checkpoint's `eos_tokens` (GGUF eos + eot, HF's
/// `eos_token_id` list) and the tokenizer's EOS and end of turn, deduplicated.
pub fn end_of_generation_ids(config_eos: &[u32], tokenizer: &Tokenizer) -> Vec<u32> {
    let mut ids: Vec<u32> = config_eos.to_vec();
    for t in [tokenizer.eos(), tokenizer.eot()].into_iter().flatten() {
        if !ids.contains(&t) {
            ids.push(t);
        }
    }
    ids
}

/// A reusable generator: one tokenizer, one set of parameters, buffers sized once.
#[derive(Clone, Debug)]
pub struct Generator<'t> {
    tokenizer: &'t Tokenizer,
    params: GenerateParams,
    end_ids: Vec<u32>,
    think: ThinkTokens,
    sampler: Sampler,
    decoder: StreamDecoder,
    stop: StopStrings,
    tokens: Vec<u32>,
}

/// Per-call state of [`Generator::generate`].
struct Run {
    reasoning: Reasoning,
}

impl<'t> Generator<'t> {
    /// `vocab_size`: the length of the model's logits rows. `end_ids`: ids that end
    /// generation (see [`end_of_generation_ids`]).
    pub fn new(
        tokenizer: &'t Tokenizer,
        vocab_size: usize,
        end_ids: &[u32],
        params: GenerateParams,
    ) -> Result<Generator<'t>, ConfigError> {
        if params.max_tokens == 0 {
            return Err(ConfigError::MaxTokensZero);
        }
        if vocab_size == 0 {
            return Err(ConfigError::NoVocabulary);
        }
        let think = ThinkTokens::from_tokenizer(tokenizer);
        if params.reasoning_budget.is_some() && think.end.is_none() {
            return Err(ConfigError::NoThinkEnd);
        }
        let sampler =
            Sampler::new(vocab_size, params.sampler, params.seed).map_err(ConfigError::Sampler)?;
        Ok(Generator {
            tokenizer,
            stop: StopStrings::new(&params.stop),
            end_ids: end_ids.to_vec(),
            think,
            sampler,
            decoder: StreamDecoder::new(),
            tokens: Vec::new(),
            params,
        })
    }

    pub fn params(&self) -> &GenerateParams {
        &self.params
    }

    /// The reasoning markers found in the vocabulary.
    pub fn think_tokens(&self) -> ThinkTokens {
        self.think
    }

    /// The tokens of the last generation, the final stop token included.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Evaluates `prompt` after whatever `source` holds, then generates until a stop or a
    /// limit, calling `on_event` as tokens and text come. Same seed and source, same output.
    pub fn generate<S: LogitsSource>(
        &mut self,
        source: &mut S,
        prompt: &[u32],
        mut on_event: impl FnMut(Event<'_>),
    ) -> Result<Outcome, GenerateError<S::Error>> {
        if prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        let t0 = Instant::now();
        self.sampler.reset(prompt, self.params.seed);
        self.decoder.reset();
        self.stop.clear();
        self.tokens.clear();
        self.tokens.reserve(self.params.max_tokens.min(1 << 20));
        let inside = self
            .params
            .starts_in_reasoning
            .unwrap_or_else(|| self.think.prompt_ends_in_reasoning(prompt));
        let mut run = Run {
            reasoning: Reasoning::new(self.think, inside, self.params.reasoning_budget),
        };

        let mut logits = source.eval_prompt(prompt).map_err(GenerateError::Source)?;
        let expected = self.sampler.vocab_size();
        if logits.len() != expected {
            return Err(GenerateError::VocabMismatch {
                logits: logits.len(),
                expected,
            });
        }
        let mut t_first: Option<Instant> = None;
        let finish = loop {
            let forced = run.reasoning.forced_token(self.decoder.has_pending());
            let token = forced.unwrap_or_else(|| self.sampler.sample(logits));
            if t_first.is_none() {
                t_first = Some(Instant::now());
            }
            self.sampler.accept(token);
            self.tokens.push(token);
            if let Some(stop) = self.on_token(&mut run, token, forced.is_some(), &mut on_event) {
                break FinishReason::Stop(stop);
            }
            if self.tokens.len() >= self.params.max_tokens {
                break FinishReason::Length(LengthLimit::MaxTokens);
            }
            if source.room() == Some(0) {
                break FinishReason::Length(LengthLimit::Context);
            }
            logits = source.eval_token(token).map_err(GenerateError::Source)?;
        };
        if let FinishReason::Length(_) = finish {
            let ch = channel(run.reasoning.inside);
            // The stream ended: a partial character becomes U+FFFD, held text is released
            // (unless, completed by that, it is a stop string).
            let text = self.decoder.finish();
            if let Some(i) = self.stop.push(text, |s| {
                on_event(Event::Text {
                    text: s,
                    channel: ch,
                })
            }) {
                return Ok(self.outcome(
                    &run,
                    FinishReason::Stop(StopReason::StopString(i)),
                    prompt.len(),
                    t0,
                    t_first,
                ));
            }
            self.stop.flush(|s| {
                on_event(Event::Text {
                    text: s,
                    channel: ch,
                })
            });
        }
        Ok(self.outcome(&run, finish, prompt.len(), t0, t_first))
    }

    fn outcome(
        &self,
        run: &Run,
        finish: FinishReason,
        n_prompt_tokens: usize,
        t0: Instant,
        t_first: Option<Instant>,
    ) -> Outcome {
        let t_first = t_first.unwrap_or(t0);
        Outcome {
            finish,
            in_reasoning: run.reasoning.inside,
            reasoning_forced: run.reasoning.forced,
            n_prompt_tokens,
            n_generated: self.tokens.len(),
            n_reasoning_tokens: run.reasoning.n_tokens,
            prefill: t_first - t0,
            decode: t_first.elapsed(),
        }
    }

    /// Handles one chosen token; returns the stop it causes.
    fn on_token(
        &mut self,
        run: &mut Run,
        token: u32,
        forced: bool,
        on_event: &mut impl FnMut(Event<'_>),
    ) -> Option<StopReason> {
        let r = &mut run.reasoning;
        let ch = channel(r.inside);
        on_event(Event::Token {
            id: token,
            channel: ch,
            forced,
        });
        let stop = if self.end_ids.contains(&token) {
            Some(StopReason::EndOfGeneration(token))
        } else if self.params.stop_token_ids.contains(&token) {
            Some(StopReason::StopToken(token))
        } else {
            None
        };
        let opens = Some(token) == self.think.start && !r.inside;
        let closes = Some(token) == self.think.end && r.inside;
        if stop.is_some() || opens || closes {
            // Text cannot continue across this token: release what was held back.
            let text = self.decoder.finish();
            if let Some(i) = self.stop.push(text, |s| {
                on_event(Event::Text {
                    text: s,
                    channel: ch,
                })
            }) {
                return Some(StopReason::StopString(i));
            }
            self.stop.flush(|s| {
                on_event(Event::Text {
                    text: s,
                    channel: ch,
                })
            });
        }
        if stop.is_some() {
            return stop;
        }
        if opens {
            r.inside = true;
            on_event(Event::ReasoningStart);
            return None;
        }
        if closes {
            r.inside = false;
            r.forced |= forced;
            on_event(Event::ReasoningEnd { forced });
            return None;
        }
        if r.inside {
            r.n_tokens += 1;
        }
        // A stray marker (`</think>` outside reasoning) carries no text either.
        if self.think.is_marker(token)
            || self.params.skip_special_tokens && self.tokenizer.is_special(token)
        {
            return None;
        }
        let text = self.decoder.push(self.tokenizer, token);
        self.stop
            .push(text, |s| {
                on_event(Event::Text {
                    text: s,
                    channel: ch,
                })
            })
            .map(StopReason::StopString)
    }
}

fn channel(inside: bool) -> Channel {
    if inside {
        Channel::Reasoning
    } else {
        Channel::Content
    }
}
