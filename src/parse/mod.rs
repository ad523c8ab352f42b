//! Splitting generated text into reasoning, content and tool calls, exactly as vLLM's
//! `poolside_v1` reasoning and tool-call parsers do (spec/laguna.md §7.3), batch and
//! streaming.
//!
//! Reference: vLLM 0.33.0 (wheel, `_version.py` commit `g4ba787ec9`), the parser that
//! `vllm serve --reasoning-parser poolside_v1 --tool-call-parser poolside_v1
//! --enable-auto-tool-choice` composes (`parser/parser_manager.py` →
//! `parser/abstract_parser.py::DelegatingParser`), driven as `entrypoints/openai/
//! chat_completion/serving.py` drives it: batch = `Parser.parse` +
//! `message_assembly.assemble_chat_message_fields`, streaming = `Parser.parse_delta` per
//! chunk via `stream_processor.ChatStreamProcessor`. In 0.33.0 `PoolsideV1ToolParser`
//! subclasses `ToolParser` directly (older releases subclassed the GLM-4.7 parser); the
//! grammar it accepts is the GLM one. `tests/parse_reference.rs` checks every output
//! against `tools/reference/parse_fixtures.py`, which runs that code.
//!
//! ```text
//! text ─ reasoning.rs ─ reasoning | content ─ tool.rs ─ content | tool calls (coerce.rs)
//! ```
//!
//! Input is text decoded with special tokens kept (`<think>`, `<tool_call>`… present as
//! text; vLLM sets `skip_special_tokens=False` once tools are on), without the stop token.
//! Streaming also needs each chunk's token ids: the reference decides on ids
//! (`</think>` in the chunk ends reasoning) and cuts on text.
//!
//! Rules worth knowing (all reproduced, none invented here):
//! * thinking off ⇒ no reasoning at all, even if the model writes `<think>…</think>`;
//! * batch ignores the prompt; streaming asks it once whether reasoning already ended;
//! * batch content is only the text before the first `<tool_call>` (text between and after
//!   calls is dropped), None when blank; streaming passes all text outside calls through;
//! * arguments are the exact `json.dumps` text (`", "` / `": "` separators, NaN/Infinity,
//!   ints of any size, Python float repr);
//! * streaming never flushes text it held back as a possible `<tool_call>` prefix
//!   (see [`StreamParser::held_back`]).
//!
//! Known divergences (inputs where vLLM raises inside the streaming path, or Python-only
//! values): see `coerce.rs`, `pyliteral.rs` and [`StreamParser::push`].

mod coerce;
mod pyliteral;
mod reasoning;
mod tool;

use std::fmt;

use serde_json::Value;

use crate::tokenizer::Tokenizer;

/// Ids of the marker tokens the reasoning parser looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Markers {
    /// `<think>`
    pub think: u32,
    /// `</think>`
    pub think_end: u32,
    /// `<assistant>`: bounds the backward search of the prompt.
    pub assistant: u32,
}

impl Markers {
    /// Looks the markers up in a tokenizer's vocabulary (each must be a single token).
    pub fn from_tokenizer(tok: &Tokenizer) -> Result<Markers, ParseError> {
        let id = |token: &'static str| {
            tok.token_to_id(token)
                .ok_or(ParseError::MissingMarker { token })
        };
        Ok(Markers {
            think: id("<think>")?,
            think_end: id("</think>")?,
            assistant: id("<assistant>")?,
        })
    }
}

/// The request's `tool_choice`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// No tool parsing; tool-call markup stays in the content (OpenAI's default without tools).
    None,
    /// Parse tool calls (OpenAI's default with tools).
    #[default]
    Auto,
    /// `"required"` or a named function: parsed as `Auto` (poolside_v1 does not support
    /// either natively); blank content becomes `""`.
    Required,
}

/// The request's tools: for each, its name and JSON-Schema `parameters`, which decide
/// which arguments stay raw strings.
#[derive(Debug, Clone, Default)]
pub struct Tools {
    tools: Vec<(String, Option<Value>)>,
}

impl Tools {
    /// No tools.
    pub fn new() -> Tools {
        Tools::default()
    }

    /// From an OpenAI `tools` array: `[{"type": "function", "function": {"name": …,
    /// "parameters": {…}}}, …]` (a flat `{"name", "parameters"}` entry is accepted too).
    pub fn from_openai_json(tools: &Value) -> Result<Tools, ParseError> {
        let bad = |what: String| ParseError::BadTools { what };
        let list = tools
            .as_array()
            .ok_or_else(|| bad("`tools` must be a JSON array".into()))?;
        let mut out = Vec::with_capacity(list.len());
        for (i, t) in list.iter().enumerate() {
            let f = t.get("function").unwrap_or(t);
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("tools[{i}] has no string `name`")))?;
            let params = match f.get("parameters") {
                None | Some(Value::Null) => None,
                Some(p @ Value::Object(_)) => Some(p.clone()),
                Some(_) => {
                    return Err(bad(format!(
                        "tools[{i}].parameters must be an object or null"
                    )));
                }
            };
            out.push((name.to_string(), params));
        }
        Ok(Tools { tools: out })
    }

    /// Whether there are no tools.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// `_is_string_type`: the first tool of that name types the argument `"string"`.
    /// `Err` where the reference raises (`properties` or the property not an object).
    fn is_string_param(&self, tool: &str, arg: &str) -> Result<bool, ()> {
        let Some((_, params)) = self.tools.iter().find(|(n, _)| n == tool) else {
            return Ok(false);
        };
        let Some(params) = params else {
            return Ok(false);
        };
        let prop = match params.get("properties") {
            None => return Ok(false),
            Some(Value::Object(props)) => match props.get(arg) {
                None => return Ok(false),
                Some(p @ Value::Object(_)) => p,
                Some(_) => return Err(()),
            },
            Some(_) => return Err(()),
        };
        Ok(prop.get("type").and_then(Value::as_str) == Some("string"))
    }
}

/// What the request asks of the parsers.
#[derive(Debug, Clone, Default)]
pub struct ParseOptions {
    /// Chat-template `enable_thinking` (or `thinking`): off means no reasoning parsing.
    pub thinking: bool,
    /// The request's tools (empty: no tool parsing, as OpenAI's API implies `"none"`).
    pub tools: Tools,
    /// The request's `tool_choice`.
    pub tool_choice: ToolChoice,
}

impl ParseOptions {
    fn tools_enabled(&self) -> bool {
        !self.tools.is_empty() && self.tool_choice != ToolChoice::None
    }
}

/// One parsed tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// Function name.
    pub name: String,
    /// The arguments object exactly as vLLM serialises it (Python `json.dumps`).
    pub arguments: String,
}

impl ToolCall {
    /// The arguments as JSON; `None` when they hold `NaN` / `Infinity` (valid for Python's
    /// json, not for JSON).
    pub fn arguments_json(&self) -> Option<Value> {
        serde_json::from_str(&self.arguments).ok()
    }
}

/// A whole response, split (vLLM's non-streaming `message` fields).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Message {
    /// `reasoning_content`.
    pub reasoning: Option<String>,
    /// `content`.
    pub content: Option<String>,
    /// `tool_calls`.
    pub tool_calls: Vec<ToolCall>,
}

/// Parses a complete response (batch).
pub fn parse(text: &str, opts: &ParseOptions) -> Message {
    let (reasoning, content) = if opts.thinking {
        reasoning::split(text)
    } else {
        (None, Some(text.to_string()))
    };
    if !opts.tools_enabled() {
        return Message {
            reasoning,
            content,
            tool_calls: Vec::new(),
        };
    }
    let (tool_calls, mut content) =
        match tool::extract(content.as_deref().unwrap_or(""), &opts.tools) {
            Some((calls, content)) => (calls, content),
            None if opts.tool_choice == ToolChoice::Required
                && content.as_deref().is_none_or(|c| py_strip(c).is_empty()) =>
            {
                (Vec::new(), None)
            }
            None => (Vec::new(), content),
        };
    if opts.tool_choice == ToolChoice::Required && content.is_none() {
        content = Some(String::new());
    }
    Message {
        reasoning,
        content,
        tool_calls,
    }
}

/// One streamed step (vLLM's `DeltaMessage`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delta {
    /// Reasoning text of this step.
    pub reasoning: Option<String>,
    /// Content text of this step.
    pub content: Option<String>,
    /// Tool-call pieces, in order of first touch in this step.
    pub tool_calls: Vec<ToolCallDelta>,
}

/// A piece of one tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallDelta {
    /// Which call (0, 1, … in the response).
    pub index: usize,
    /// Set once per call, on its first piece (where vLLM also assigns the call id).
    pub name: Option<String>,
    /// The next fragment of the arguments JSON text (may be empty).
    pub arguments: String,
}

/// Incremental parser for one response: feed each decoded chunk with its token ids.
#[derive(Debug)]
pub struct StreamParser {
    opts: ParseOptions,
    markers: Markers,
    reasoning_ended: bool,
    reasoning: reasoning::ReasoningStream,
    tools: tool::ToolStream,
    /// Index of the last tool-call piece in the last returned delta.
    last_call_index: Option<usize>,
}

impl StreamParser {
    /// A parser for a response to `prompt_ids` (the prompt decides whether generation
    /// starts inside reasoning).
    pub fn new(opts: ParseOptions, markers: Markers, prompt_ids: &[u32]) -> StreamParser {
        let reasoning_ended = !opts.thinking
            || reasoning::prompt_ends_reasoning(
                prompt_ids,
                markers.think,
                markers.think_end,
                markers.assistant,
            );
        StreamParser {
            opts,
            markers,
            reasoning_ended,
            reasoning: reasoning::ReasoningStream::default(),
            tools: tool::ToolStream::default(),
            last_call_index: None,
        }
    }

    /// Whether output is past reasoning (content / tool calls).
    pub fn reasoning_ended(&self) -> bool {
        self.reasoning_ended
    }

    /// Text held back at the end as a possible start of a tag, or an incomplete tool call.
    /// The reference never emits it; a caller may show it after [`StreamParser::finish`].
    pub fn held_back(&self) -> &str {
        self.tools.held_back()
    }

    /// One chunk: its decoded text (possibly empty) and its token ids. `None` when there
    /// is nothing to emit yet.
    ///
    /// Divergence: where vLLM raises mid-stream (a non-string argument whose value JSON
    /// cannot hold, such as a Python set; a schema whose `properties` is not an object),
    /// this emits the raw value as a JSON string / treats the argument as non-string.
    pub fn push(&mut self, text: &str, token_ids: &[u32]) -> Option<Delta> {
        let mut delta: Option<Delta> = None;
        let mut text = text;
        let transition_content;
        if !self.reasoning_ended {
            let m = self.markers;
            delta = self.reasoning.step(text, token_ids, m.think, m.think_end);
            if token_ids.contains(&m.think_end) {
                self.reasoning_ended = true;
                transition_content = delta
                    .as_ref()
                    .and_then(|d| d.content.clone())
                    .unwrap_or_default();
                text = &transition_content;
            } else {
                return self.record(delta);
            }
        }
        let reasoning = delta.and_then(|d| d.reasoning).filter(|r| !r.is_empty());
        let mut out = if self.opts.tools_enabled() {
            let (content, calls) = self.tools.push(text, &self.opts.tools);
            (content.is_some() || !calls.is_empty()).then_some(Delta {
                reasoning: None,
                content,
                tool_calls: calls,
            })
        } else {
            (!text.is_empty()).then(|| Delta {
                content: Some(text.to_string()),
                ..Delta::default()
            })
        };
        if let Some(r) = reasoning {
            match out.as_mut() {
                None => {
                    out = Some(Delta {
                        reasoning: Some(r),
                        ..Delta::default()
                    })
                }
                Some(d) if d.reasoning.as_deref().is_none_or(str::is_empty) => {
                    d.reasoning = Some(r)
                }
                Some(_) => {}
            }
        }
        self.record(out)
    }

    fn record(&mut self, delta: Option<Delta>) -> Option<Delta> {
        self.last_call_index = delta
            .as_ref()
            .and_then(|d| d.tool_calls.last())
            .map(|c| c.index);
        delta
    }

    /// End of the response: what vLLM appends to the last chunk's delta (the closing
    /// `"}` / `}` / `{}` of a tool call cut off mid-way, when that delta carried tool-call
    /// pieces), as a piece of the same call.
    pub fn finish(&mut self) -> Option<Delta> {
        let index = self.last_call_index.take()?;
        let rest = self.tools.remaining_args();
        (!rest.is_empty()).then(|| Delta {
            tool_calls: vec![ToolCallDelta {
                index,
                name: None,
                arguments: rest.to_string(),
            }],
            ..Delta::default()
        })
    }
}

/// Why the parsers could not be set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// The tokenizer has no single token for a marker.
    MissingMarker {
        /// The marker.
        token: &'static str,
    },
    /// The tools definition is malformed.
    BadTools {
        /// What is wrong.
        what: String,
    },
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::MissingMarker { token } => write!(
                f,
                "the tokenizer has no single token {token:?}; the poolside_v1 reasoning parser \
                 needs it (use the model's own tokenizer)"
            ),
            ParseError::BadTools { what } => {
                write!(
                    f,
                    "bad tools definition: {what}; pass the request's OpenAI `tools` array"
                )
            }
        }
    }
}

impl std::error::Error for ParseError {}

/// Python's `str.strip()` (whitespace per `str.isspace`, which adds U+001C..U+001F to
/// Unicode White_Space).
fn py_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}
