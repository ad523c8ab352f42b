//! The generation driver on a scripted logits source: stop strings across token
//! boundaries, stop tokens, the reasoning budget, finish reasons, UTF-8 held back, seeds.

use std::convert::Infallible;
use std::path::PathBuf;

use lagoon::generate::{
    Channel, Event, FinishReason, GenerateParams, Generator, LengthLimit, LogitsSource, StopReason,
};
use lagoon::sample::SamplerParams;
use lagoon::tokenizer::Tokenizer;

const THINK: u32 = 10;
const END_THINK: u32 = 12;
const ASSISTANT: u32 = 23;
const EOT: u32 = 24;
const EOS: u32 = 2;
const FILLER: u32 = 3;

fn tokenizer() -> Tokenizer {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer");
    Tokenizer::from_hf_dir(dir).unwrap()
}

/// Greedy source: after the prompt and after each fed token, the logits peak at the next
/// token of `script` (then at `FILLER`). Records what it was fed.
struct Script {
    script: Vec<u32>,
    pos: usize,
    logits: Vec<f32>,
    fed: Vec<u32>,
    room: Option<usize>,
    /// Add these pseudo-random values to every logit (for sampling tests).
    noise: bool,
}

impl Script {
    fn new(vocab: usize, script: Vec<u32>) -> Script {
        Script {
            script,
            pos: 0,
            logits: vec![0.0; vocab],
            fed: Vec::new(),
            room: None,
            noise: false,
        }
    }

    fn fill(&mut self) {
        let next = self.script.get(self.pos).copied().unwrap_or(FILLER);
        let mut s = self.pos as u64 * 7919 + 1;
        for (i, l) in self.logits.iter_mut().enumerate() {
            *l = if self.noise {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0
            } else {
                0.0
            };
            if i as u32 == next {
                *l += if self.noise { 1.5 } else { 10.0 };
            }
        }
    }
}

impl LogitsSource for Script {
    type Error = Infallible;

    fn eval_prompt(&mut self, prompt: &[u32]) -> Result<&[f32], Infallible> {
        self.fed.extend_from_slice(prompt);
        if let Some(r) = &mut self.room {
            *r -= prompt.len();
        }
        self.fill();
        Ok(&self.logits)
    }

    fn eval_token(&mut self, token: u32) -> Result<&[f32], Infallible> {
        self.fed.push(token);
        if let Some(r) = &mut self.room {
            *r -= 1;
        }
        self.pos += 1;
        self.fill();
        Ok(&self.logits)
    }

    fn room(&self) -> Option<usize> {
        self.room
    }
}

#[derive(Default, Debug)]
struct Collected {
    reasoning: String,
    content: String,
    tokens: Vec<(u32, Channel, bool)>,
    ends: Vec<bool>,
    starts: usize,
    /// Text events in order, for checking what was released when.
    deltas: Vec<String>,
}

fn run(
    tok: &Tokenizer,
    params: GenerateParams,
    prompt: &[u32],
    source: &mut Script,
) -> (lagoon::generate::Outcome, Collected) {
    let mut g = Generator::new(tok, source.logits.len(), &[EOS, EOT], params).unwrap();
    let mut c = Collected::default();
    let out = g
        .generate(source, prompt, |e| match e {
            Event::Token {
                id,
                channel,
                forced,
            } => c.tokens.push((id, channel, forced)),
            Event::Text { text, channel } => {
                assert!(!text.is_empty());
                c.deltas.push(text.to_string());
                match channel {
                    Channel::Reasoning => c.reasoning.push_str(text),
                    Channel::Content => c.content.push_str(text),
                }
            }
            Event::ReasoningStart => c.starts += 1,
            Event::ReasoningEnd { forced } => c.ends.push(forced),
        })
        .unwrap();
    assert_eq!(g.tokens().len(), out.n_generated);
    (out, c)
}

/// Ids of `text`, one token at a time when `split` (each byte-level token of the text).
fn ids(tok: &Tokenizer, text: &str) -> Vec<u32> {
    tok.encode(text.as_bytes(), false)
}

#[test]
fn stop_string_split_across_tokens_holds_back_and_cuts() {
    let tok = tokenizer();
    let vocab = tok.vocab_size();
    // Stop on "STOP" where the text reaches it as "... ST" + "OP ...".
    let mut script = ids(&tok, "first line ST");
    script.extend(ids(&tok, "OP never shown"));
    let mut src = Script::new(vocab, script.clone());
    let params = GenerateParams {
        max_tokens: 100,
        stop: vec!["nope".into(), "STOP".into()],
        ..Default::default()
    };
    let (out, c) = run(&tok, params, &[EOS], &mut src);
    assert_eq!(
        out.finish,
        FinishReason::Stop(StopReason::StopString(1)),
        "{c:?}"
    );
    assert_eq!(c.content, "first line ");
    assert!(c.reasoning.is_empty());
    assert!(!out.in_reasoning);
    // Generation stopped at the token completing the stop string.
    let n_stop = (1..=script.len())
        .find(|&n| String::from_utf8_lossy(&tok.decode(&script[..n])).contains("STOP"))
        .unwrap();
    assert!(n_stop > ids(&tok, "first line ST").len());
    assert_eq!(out.n_generated, n_stop, "{:?}", c.tokens);

    // A prefix that does not complete is released once it cannot: "ST" + "OX".
    let mut script = ids(&tok, "a ST");
    script.extend(ids(&tok, "OX b"));
    script.push(EOT);
    let mut src = Script::new(vocab, script);
    let params = GenerateParams {
        max_tokens: 100,
        stop: vec!["STOP".into()],
        ..Default::default()
    };
    let (out, c) = run(&tok, params, &[EOS], &mut src);
    assert_eq!(
        out.finish,
        FinishReason::Stop(StopReason::EndOfGeneration(EOT))
    );
    assert_eq!(c.content, "a STOX b");
    // No delta ever ended inside the held prefix "ST" before "OX" arrived.
    let mut acc = String::new();
    for d in &c.deltas {
        acc.push_str(d);
        assert!(
            !acc.ends_with("ST") && !acc.ends_with('S'),
            "released {acc:?} early"
        );
    }
}

#[test]
fn stop_tokens_and_lengths() {
    let tok = tokenizer();
    let vocab = tok.vocab_size();
    let text = ids(&tok, "hello there");

    // EOS id 2 ends generation; its text is not emitted.
    let mut script = text.clone();
    script.push(EOS);
    let (out, c) = run(
        &tok,
        GenerateParams::default(),
        &[EOS],
        &mut Script::new(vocab, script),
    );
    assert_eq!(
        out.finish,
        FinishReason::Stop(StopReason::EndOfGeneration(EOS))
    );
    assert_eq!(out.finish.as_str(), "stop");
    assert_eq!(c.content, "hello there");
    assert_eq!(out.n_generated, text.len() + 1);

    // A user stop id.
    let params = GenerateParams {
        stop_token_ids: vec![text[1]],
        ..Default::default()
    };
    let (out, c) = run(&tok, params, &[EOS], &mut Script::new(vocab, text.clone()));
    assert_eq!(
        out.finish,
        FinishReason::Stop(StopReason::StopToken(text[1]))
    );
    assert_eq!(c.content.as_bytes(), tok.decode(&text[..1]));

    // max_tokens.
    let params = GenerateParams {
        max_tokens: 2,
        ..Default::default()
    };
    let (out, c) = run(&tok, params, &[EOS], &mut Script::new(vocab, text.clone()));
    assert_eq!(out.finish, FinishReason::Length(LengthLimit::MaxTokens));
    assert_eq!(out.finish.as_str(), "length");
    assert_eq!(c.content.as_bytes(), tok.decode(&text[..2]));
    assert!(!out.in_reasoning);

    // The context: room for the prompt and 3 fed tokens = 4 generated.
    let mut src = Script::new(vocab, vec![FILLER; 20]);
    src.room = Some(4);
    let (out, _) = run(&tok, GenerateParams::default(), &[EOS], &mut src);
    assert_eq!(out.finish, FinishReason::Length(LengthLimit::Context));
    assert_eq!(out.n_generated, 4);
    assert_eq!(src.fed.len(), 4);
}

#[test]
fn reasoning_channels_and_budget() {
    let tok = tokenizer();
    let vocab = tok.vocab_size();
    let prompt = [EOS, 5, 40, 8, ASSISTANT, THINK];
    let thought = ids(&tok, "let me think about it");
    let answer = ids(&tok, "the answer");
    let mut script = thought.clone();
    script.push(END_THINK);
    script.extend(&answer);
    script.push(EOT);

    // Natural end of reasoning.
    let (out, c) = run(
        &tok,
        GenerateParams::default(),
        &prompt,
        &mut Script::new(vocab, script.clone()),
    );
    assert_eq!(c.reasoning, "let me think about it");
    assert_eq!(c.content, "the answer");
    assert_eq!(c.ends, [false]);
    assert_eq!(out.n_reasoning_tokens, thought.len());
    assert!(!out.in_reasoning && !out.reasoning_forced);
    assert_eq!(
        out.finish,
        FinishReason::Stop(StopReason::EndOfGeneration(EOT))
    );
    // The `</think>` token is reported in the reasoning channel.
    assert!(c.tokens.contains(&(END_THINK, Channel::Reasoning, false)));

    // Budget of 3: `</think>` is forced after three reasoning tokens and fed to the model.
    let params = GenerateParams {
        reasoning_budget: Some(3),
        ..Default::default()
    };
    let mut src = Script::new(vocab, script.clone());
    let (out, c) = run(&tok, params.clone(), &prompt, &mut src);
    assert_eq!(c.reasoning.as_bytes(), tok.decode(&thought[..3]));
    assert_eq!(c.ends, [true]);
    assert!(out.reasoning_forced && !out.in_reasoning);
    assert_eq!(out.n_reasoning_tokens, 3);
    assert_eq!(c.tokens[3], (END_THINK, Channel::Reasoning, true));
    assert_eq!(src.fed[prompt.len() + 3], END_THINK);
    // After the forced end the script continues at its 5th entry, as content; the
    // script's own `</think>` is then a stray marker and carries no text.
    let rest: Vec<u32> = script[4..]
        .iter()
        .copied()
        .filter(|&t| t != END_THINK && t != EOT)
        .collect();
    assert_eq!(c.content.as_bytes(), tok.decode(&rest));

    // Budget 0: the first token is the forced end.
    let (out, c) = run(
        &tok,
        GenerateParams {
            reasoning_budget: Some(0),
            max_tokens: 1,
            ..Default::default()
        },
        &prompt,
        &mut Script::new(vocab, script.clone()),
    );
    assert_eq!(c.tokens, [(END_THINK, Channel::Reasoning, true)]);
    assert!(!out.in_reasoning);

    // Cut by max_tokens inside reasoning: flagged.
    let (out, c) = run(
        &tok,
        GenerateParams {
            max_tokens: 2,
            ..Default::default()
        },
        &prompt,
        &mut Script::new(vocab, script.clone()),
    );
    assert_eq!(out.finish, FinishReason::Length(LengthLimit::MaxTokens));
    assert!(out.in_reasoning);
    assert!(c.content.is_empty());

    // A prompt whose turn closed reasoning (thinking off) starts in content; a `<think>`
    // from the model opens reasoning.
    let prompt_off = [EOS, 5, 40, 8, ASSISTANT, END_THINK];
    let mut s2 = vec![THINK];
    s2.extend(&thought);
    s2.push(EOS);
    let (out, c) = run(
        &tok,
        GenerateParams::default(),
        &prompt_off,
        &mut Script::new(vocab, s2),
    );
    assert_eq!(c.starts, 1);
    assert_eq!(c.reasoning, "let me think about it");
    assert!(c.content.is_empty());
    assert!(out.in_reasoning);
    assert_eq!(
        out.finish,
        FinishReason::Stop(StopReason::EndOfGeneration(EOS))
    );

    // A stop string inside reasoning ends generation there, flagged as in reasoning.
    let (out, c) = run(
        &tok,
        GenerateParams {
            stop: vec!["think".into()],
            ..Default::default()
        },
        &prompt,
        &mut Script::new(vocab, script),
    );
    assert_eq!(out.finish, FinishReason::Stop(StopReason::StopString(0)));
    assert!(out.in_reasoning);
    assert_eq!(c.reasoning, "let me ");
}

#[test]
fn split_characters_are_held_back_and_the_budget_waits_for_them() {
    let tok = tokenizer();
    let vocab = tok.vocab_size();
    // One byte-level token per byte of "é€" (the fixture vocabulary has no merges for them).
    let bytes = "é€".as_bytes();
    let per_byte: Vec<u32> = bytes
        .iter()
        .map(|&b| {
            let id = tok
                .token_to_id(&lagoon::tokenizer::bytelevel::BYTE_TO_CHAR[b as usize].to_string());
            id.unwrap()
        })
        .collect();
    assert_eq!(per_byte.len(), 5);
    let mut script = per_byte.clone();
    script.push(EOT);
    let (_, c) = run(
        &tok,
        GenerateParams::default(),
        &[EOS],
        &mut Script::new(vocab, script.clone()),
    );
    assert_eq!(c.content, "é€");
    assert_eq!(c.deltas, ["é", "€"]);

    // Reasoning budget 3 falls inside "€" (bytes 3..5): two more tokens finish it first.
    let prompt = [EOS, ASSISTANT, THINK];
    let (out, c) = run(
        &tok,
        GenerateParams {
            reasoning_budget: Some(3),
            ..Default::default()
        },
        &prompt,
        &mut Script::new(vocab, script),
    );
    assert_eq!(c.reasoning, "é€");
    assert_eq!(out.n_reasoning_tokens, 5);
    assert_eq!(c.ends, [true]);

    // Cut by max_tokens mid-character: the partial character becomes U+FFFD.
    let (_, c) = run(
        &tok,
        GenerateParams {
            max_tokens: 3,
            ..Default::default()
        },
        &[EOS],
        &mut Script::new(vocab, per_byte),
    );
    assert_eq!(c.content, "é\u{FFFD}");
}

#[test]
fn same_seed_same_text_and_skip_special() {
    let tok = tokenizer();
    let vocab = tok.vocab_size();
    let params = GenerateParams {
        sampler: SamplerParams {
            temperature: 1.0,
            top_p: 0.95,
            ..Default::default()
        },
        seed: 42,
        max_tokens: 40,
        ..Default::default()
    };
    let sample = |p: GenerateParams| {
        let mut src = Script::new(vocab, vec![]);
        src.noise = true;
        let (_, c) = run(&tok, p, &[EOS], &mut src);
        c.tokens.iter().map(|t| t.0).collect::<Vec<_>>()
    };
    let a = sample(params.clone());
    assert_eq!(a, sample(params.clone()));
    assert_ne!(
        a,
        sample(GenerateParams {
            seed: 43,
            ..params.clone()
        })
    );
    // The generator is reusable: a second call repeats the first.
    let mut g = Generator::new(&tok, vocab, &[EOS, EOT], params).unwrap();
    let mut runs = Vec::new();
    for _ in 0..2 {
        let mut src = Script::new(vocab, vec![]);
        src.noise = true;
        g.generate(&mut src, &[EOS], |_| {}).unwrap();
        runs.push(g.tokens().to_vec());
    }
    assert_eq!(runs[0], runs[1]);
    assert_eq!(runs[0], a);

    // Special tokens' text is kept by default and dropped with skip_special_tokens.
    let script = vec![13, 14, EOT]; // <tool_call></tool_call>
    let (_, c) = run(
        &tok,
        GenerateParams::default(),
        &[EOS],
        &mut Script::new(vocab, script.clone()),
    );
    assert_eq!(c.content, "<tool_call></tool_call>");
    let (_, c) = run(
        &tok,
        GenerateParams {
            skip_special_tokens: true,
            ..Default::default()
        },
        &[EOS],
        &mut Script::new(vocab, script),
    );
    assert_eq!(c.content, "");
}

#[test]
fn bad_settings_are_typed_errors() {
    let tok = tokenizer();
    let e = Generator::new(
        &tok,
        tok.vocab_size(),
        &[EOS],
        GenerateParams {
            max_tokens: 0,
            ..Default::default()
        },
    );
    assert!(matches!(
        e,
        Err(lagoon::generate::ConfigError::MaxTokensZero)
    ));
    let e = Generator::new(
        &tok,
        tok.vocab_size(),
        &[EOS],
        GenerateParams {
            sampler: SamplerParams {
                top_p: 2.0,
                ..Default::default()
            },
            ..Default::default()
        },
    );
    assert!(matches!(e, Err(lagoon::generate::ConfigError::Sampler(_))));
    let mut g = Generator::new(&tok, 7, &[EOS], GenerateParams::default()).unwrap();
    let mut src = Script::new(tok.vocab_size(), vec![]);
    assert!(matches!(
        g.generate(&mut src, &[EOS], |_| {}),
        Err(lagoon::generate::GenerateError::VocabMismatch { .. })
    ));
    assert!(matches!(
        g.generate(&mut src, &[], |_| {}),
        Err(lagoon::generate::GenerateError::EmptyPrompt)
    ));
}
