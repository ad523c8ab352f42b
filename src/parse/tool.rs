//! Tool calls `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>`,
//! parsed as vLLM 0.33.0's `PoolsideV1ToolParser` (`tool_parsers/poolside_v1_tool_parser.py`)
//! does, batch (`extract_tool_calls`) and streaming (`extract_tool_calls_streaming`).
//!
//! Batch, over the content left by the reasoning split:
//! 1. calls are the non-overlapping matches of `<tool_call>.*?</tool_call>` (DOTALL);
//! 2. in each, `<tool_call>\s*([^\n<]+?)\s*\n?\s*(<arg_key>.*?)?</tool_call>` is searched:
//!    the name is the text up to the first `<` (one line, surrounding whitespace dropped),
//!    then `<arg_key>` or the end; no match skips the call;
//! 3. pairs are the matches of `<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>`
//!    (a key may run past a `</arg_key>` not followed by `<arg_value>`);
//! 4. key = key.strip(); when the tool's schema types the key `"string"` the value is kept
//!    verbatim, else it is `_deserialize(value.strip())` (coerce.rs); a later duplicate key
//!    overwrites; arguments = `json.dumps(args, ensure_ascii=False)`;
//! 5. content = the text before the first `<tool_call>`, None when blank; with no call
//!    parsed, or on any exception (coerce.rs `Fatal`), the whole text is content.
//!
//! Streaming keeps a buffer and a small state machine: text outside calls is content
//! except a trailing prefix of `<tool_call>`, held back; the name ends at the first `\n`,
//! `<arg_key>` or `</tool_call>`; string-typed values stream as JSON-escaped fragments as
//! they arrive (a trailing prefix of `</arg_value>` held back); other values are emitted
//! whole at `</arg_value>`; a repeated key is skipped (first wins, unlike batch); text
//! between `</arg_key>` and `<arg_value>` is dropped. Searches resume where the last
//! failed one stopped, so waiting on a long value is not quadratic.

use std::collections::HashSet;

use super::coerce::{self, Coerced, PyVal};
use super::{ToolCall, ToolCallDelta, Tools, py_strip};

const CALL_START: &str = "<tool_call>";
const CALL_END: &str = "</tool_call>";
const KEY_START: &str = "<arg_key>";
const KEY_END: &str = "</arg_key>";
const VAL_START: &str = "<arg_value>";
const VAL_END: &str = "</arg_value>";

/// Batch extraction: `Some((calls, content))` when at least one call was parsed (vLLM's
/// `tools_called=True`), `None` when the text stays content.
pub(crate) fn extract(text: &str, tools: &Tools) -> Option<(Vec<ToolCall>, Option<String>)> {
    let mut calls = Vec::new();
    let mut pos = 0;
    while let Some(s) = find_from(text, CALL_START, pos) {
        let Some(e) = find_from(text, CALL_END, s + CALL_START.len()) else {
            break;
        };
        let m = &text[s..e + CALL_END.len()];
        pos = e + CALL_END.len();
        let Some((name, args)) = detail(m) else {
            continue; // "Failed to parse tool call details": the match is skipped
        };
        let name = py_strip(name);
        let mut dict: Vec<(PyVal, PyVal)> = Vec::new();
        for (key, value) in args.map(arg_pairs).unwrap_or_default() {
            let key = py_strip(key);
            let v = match tools.is_string_param(name, key) {
                Err(()) => return None, // AttributeError on a malformed schema
                Ok(true) => PyVal::Str(value.to_string()),
                Ok(false) => {
                    let value = py_strip(value);
                    match coerce::deserialize(value) {
                        Coerced::Value(v) => v,
                        Coerced::Raw => PyVal::Str(value.to_string()),
                        Coerced::Fatal => return None,
                    }
                }
            };
            coerce::dict_insert(&mut dict, PyVal::Str(key.to_string()), v);
        }
        let mut arguments = String::new();
        coerce::dumps(&PyVal::Dict(dict), &mut arguments).ok()?;
        calls.push(ToolCall {
            name: name.to_string(),
            arguments,
        });
    }
    if calls.is_empty() {
        return None;
    }
    let first = text.find(CALL_START).expect("a call was matched");
    let content = &text[..first];
    let content = (!py_strip(content).is_empty()).then(|| content.to_string());
    Some((calls, content))
}

/// `func_detail_regex.search(m)` on one `<tool_call>…</tool_call>` match (which holds
/// exactly one `</tool_call>`, at its end): (name group, args group).
fn detail(m: &str) -> Option<(&str, Option<&str>)> {
    let body_end = m.len() - CALL_END.len();
    let mut p = 0;
    while let Some(s) = find_from(m, CALL_START, p) {
        p = s + 1;
        let rest_start = s + CALL_START.len();
        // The name part spans up to the first '<', which must open `<arg_key>` or be the end.
        let q = rest_start + m[rest_start..].find('<').expect("the end tag has a '<'");
        let args = if m[q..].starts_with(KEY_START) {
            Some(&m[q..body_end])
        } else if q == body_end {
            None
        } else {
            continue;
        };
        if let Some(name) = name_group(&m[rest_start..q]) {
            return Some((name, args));
        }
    }
    None
}

/// `\s*([^\n<]+?)\s*\n?\s*` matched against all of `seg` (which holds no '<'), leftmost-first.
fn name_group(seg: &str) -> Option<&str> {
    let x = seg.trim_start_matches(char::is_whitespace);
    if !x.is_empty() {
        let name = x.trim_end_matches(char::is_whitespace);
        return (!name.contains('\n')).then_some(name);
    }
    // All whitespace: the greedy `\s*` gives back one character at a time; the name is
    // the last character that is not '\n'.
    let (i, c) = seg.char_indices().rev().find(|&(_, c)| c != '\n')?;
    Some(&seg[i..i + c.len_utf8()])
}

/// `func_arg_regex.findall(args)`.
fn arg_pairs(args: &str) -> Vec<(&str, &str)> {
    let mut out = Vec::new();
    let mut i = 0;
    'scan: while let Some(k) = find_from(args, KEY_START, i) {
        let key_start = k + KEY_START.len();
        let mut j_from = key_start;
        while let Some(j) = find_from(args, KEY_END, j_from) {
            j_from = j + 1;
            let after = j + KEY_END.len();
            let ws =
                args[after..].len() - args[after..].trim_start_matches(char::is_whitespace).len();
            let v = after + ws;
            if !args[v..].starts_with(VAL_START) {
                continue; // the lazy key grows past this `</arg_key>`
            }
            let val_start = v + VAL_START.len();
            if let Some(e) = find_from(args, VAL_END, val_start) {
                out.push((&args[key_start..j], &args[val_start..e]));
                i = e + VAL_END.len();
                continue 'scan;
            }
            break; // no `</arg_value>` after this one means none after later ones either
        }
        i = k + 1;
    }
    out
}

fn find_from(hay: &str, pat: &str, from: usize) -> Option<usize> {
    // Patterns are ASCII, so byte matches fall on char boundaries.
    hay.as_bytes()
        .get(from..)?
        .windows(pat.len())
        .position(|w| w == pat.as_bytes())
        .map(|p| p + from)
}

/// The streaming state of `PoolsideV1ToolParser` for one response.
#[derive(Debug, Default)]
pub(crate) struct ToolStream {
    buf: String,
    /// Per pattern: no occurrence starts before this offset of `buf` (cleared on consume).
    searched: [usize; 6],
    in_call: bool,
    name_sent: bool,
    name: Option<String>,
    pending_key: Option<String>,
    in_string_value: bool,
    /// Index of the current call; calls are `0..calls.len()`.
    calls: Vec<CallState>,
}

#[derive(Debug, Default)]
struct CallState {
    args_started: bool,
    args_closed: bool,
    seen_keys: HashSet<String>,
}

const PATTERNS: [&str; 6] = [CALL_START, CALL_END, KEY_START, KEY_END, VAL_START, VAL_END];

impl ToolStream {
    /// Text the parser holds (a possible tag prefix, or a call not yet complete enough).
    pub(crate) fn held_back(&self) -> &str {
        &self.buf
    }

    fn find(&mut self, pat: &str) -> Option<usize> {
        if pat == "\n" {
            return self.buf.find('\n');
        }
        let slot = PATTERNS
            .iter()
            .position(|p| *p == pat)
            .expect("known pattern");
        let from = self.searched[slot];
        let hit = find_from(&self.buf, pat, from);
        if hit.is_none() {
            self.searched[slot] = self.buf.len().saturating_sub(pat.len() - 1).max(from);
        }
        hit
    }

    fn consume(&mut self, n: usize) {
        self.buf.drain(..n);
        self.searched = [0; 6];
    }

    /// Length of the shortest prefix of `tag` that `buf` ends with (the reference tries
    /// prefix lengths 1.. and stops at the first hit).
    fn partial_tail(&self, tag: &str) -> usize {
        (1..tag.len())
            .find(|&i| self.buf.ends_with(&tag[..i]))
            .unwrap_or(0)
    }

    fn cur(&mut self) -> &mut CallState {
        self.calls.last_mut().expect("inside a call")
    }

    /// One text delta; returns (content, tool-call deltas in order of first touch).
    pub(crate) fn push(
        &mut self,
        delta: &str,
        tools: &Tools,
    ) -> (Option<String>, Vec<ToolCallDelta>) {
        self.buf.push_str(delta);
        let mut content: Option<String> = None;
        let mut pending: Vec<ToolCallDelta> = Vec::new();
        loop {
            if !self.in_call {
                let Some(start) = self.find(CALL_START) else {
                    let keep = self.partial_tail(CALL_START);
                    let out = self.buf.len() - keep;
                    if out > 0 {
                        content
                            .get_or_insert_with(String::new)
                            .push_str(&self.buf[..out]);
                        self.consume(out);
                    }
                    break;
                };
                if start > 0 {
                    content
                        .get_or_insert_with(String::new)
                        .push_str(&self.buf[..start]);
                }
                self.consume(start + CALL_START.len());
                self.calls.push(CallState::default());
                self.name_sent = false;
                self.name = None;
                self.pending_key = None;
                self.in_string_value = false;
                self.in_call = true;
                continue;
            }

            if !self.name_sent {
                let nl = self.find("\n");
                let ak = self.find(KEY_START);
                let end = self.find(CALL_END);
                let Some(cut) = [nl, ak, end].into_iter().flatten().min() else {
                    break;
                };
                let name = py_strip(&self.buf[..cut]).to_string();
                if name.is_empty() && Some(cut) == end {
                    // `<tool_call></tool_call>`: consumed and forgotten.
                    self.consume(cut + CALL_END.len());
                    self.finish_call();
                    self.calls.pop();
                    continue;
                }
                self.consume(if Some(cut) == nl { cut + 1 } else { cut });
                self.name = Some(name.clone());
                self.name_sent = true;
                let d = delta_for(&mut pending, self.calls.len() - 1);
                d.name = Some(name);
                continue;
            }

            if self.in_string_value {
                if let Some(end) = self.find(VAL_END) {
                    let mut frag = String::new();
                    coerce::escape_into(&self.buf[..end], &mut frag);
                    frag.push('"');
                    self.consume(end + VAL_END.len());
                    self.in_string_value = false;
                    self.pending_key = None;
                    delta_for(&mut pending, self.calls.len() - 1)
                        .arguments
                        .push_str(&frag);
                    continue;
                }
                let safe = self.buf.len() - self.partial_tail(VAL_END);
                if safe > 0 {
                    let mut frag = String::new();
                    coerce::escape_into(&self.buf[..safe], &mut frag);
                    self.consume(safe);
                    delta_for(&mut pending, self.calls.len() - 1)
                        .arguments
                        .push_str(&frag);
                }
                break;
            }

            if let Some(raw_key) = self.pending_key.clone() {
                let Some(val_pos) = self.find(VAL_START) else {
                    break;
                };
                if val_pos > 0 {
                    self.consume(val_pos);
                }
                let key = py_strip(&raw_key).to_string();
                let name = self.name.clone().unwrap_or_default();
                // A schema the reference would raise on is taken as "not a string" here.
                if tools.is_string_param(&name, &key).unwrap_or(false) {
                    self.consume(VAL_START.len());
                    if self.cur().seen_keys.contains(&key) {
                        self.pending_key = None;
                        continue;
                    }
                    let started = std::mem::replace(&mut self.cur().args_started, true);
                    self.cur().seen_keys.insert(key.clone());
                    let mut frag = String::from(if started { ", " } else { "{" });
                    coerce::dump_str(&key, &mut frag);
                    frag.push_str(": \"");
                    self.in_string_value = true;
                    delta_for(&mut pending, self.calls.len() - 1)
                        .arguments
                        .push_str(&frag);
                    continue;
                }
                let Some(val_end) = self.find(VAL_END) else {
                    break;
                };
                let raw_val = py_strip(&self.buf[VAL_START.len()..val_end]).to_string();
                self.consume(val_end + VAL_END.len());
                self.pending_key = None;
                if let Some(frag) = self.typed_fragment(&key, &raw_val) {
                    delta_for(&mut pending, self.calls.len() - 1)
                        .arguments
                        .push_str(&frag);
                }
                continue;
            }

            let end = self.find(CALL_END);
            let key_pos = self.find(KEY_START);
            if let Some(end) = end.filter(|&e| key_pos.is_none_or(|k| e < k)) {
                self.consume(end + CALL_END.len());
                let frag = self.close_args();
                self.finish_call();
                if let Some(frag) = frag {
                    delta_for(&mut pending, self.calls.len() - 1)
                        .arguments
                        .push_str(&frag);
                }
                continue;
            }
            let Some(key_pos) = key_pos else {
                break;
            };
            if key_pos > 0 {
                self.consume(key_pos);
            }
            let Some(key_end) = self.find(KEY_END) else {
                break;
            };
            self.pending_key = Some(self.buf[KEY_START.len()..key_end].to_string());
            self.consume(key_end + KEY_END.len());
        }
        (content, pending)
    }

    /// `_append_arg_fragment` for a non-string value.
    fn typed_fragment(&mut self, key: &str, raw_val: &str) -> Option<String> {
        if key.is_empty() || self.cur().seen_keys.contains(key) {
            return None;
        }
        let mut val_json = String::new();
        let ok = match coerce::deserialize(raw_val) {
            Coerced::Value(v) => coerce::dumps(&v, &mut val_json).is_ok(),
            Coerced::Raw | Coerced::Fatal => false,
        };
        if !ok {
            // Raw strings, and (divergence) values the reference raises TypeError on.
            val_json.clear();
            coerce::dump_str(raw_val, &mut val_json);
        }
        let started = std::mem::replace(&mut self.cur().args_started, true);
        let mut frag = String::from(if started { ", " } else { "{" });
        coerce::dump_str(key, &mut frag);
        frag.push_str(": ");
        frag.push_str(&val_json);
        self.cur().seen_keys.insert(key.to_string());
        Some(frag)
    }

    fn close_args(&mut self) -> Option<String> {
        let c = self.cur();
        if std::mem::replace(&mut c.args_closed, true) {
            return None;
        }
        Some(if c.args_started { "}" } else { "{}" }.to_string())
    }

    fn finish_call(&mut self) {
        self.in_call = false;
        self.name = None;
        self.pending_key = None;
        self.in_string_value = false;
    }

    /// `get_remaining_unstreamed_args()`: what closes the last call's arguments, as
    /// `json.dumps` of their partial-JSON completion minus what was streamed.
    pub(crate) fn remaining_args(&self) -> &'static str {
        match self.calls.last() {
            None => "",
            Some(c) if c.args_closed => "",
            Some(c) if !c.args_started => "{}",
            Some(_) if self.in_call && self.in_string_value => "\"}",
            Some(_) => "}",
        }
    }
}

/// The pending delta of call `index`, created on first touch.
fn delta_for(pending: &mut Vec<ToolCallDelta>, index: usize) -> &mut ToolCallDelta {
    let pos = match pending.iter().position(|d| d.index == index) {
        Some(p) => p,
        None => {
            pending.push(ToolCallDelta {
                index,
                name: None,
                arguments: String::new(),
            });
            pending.len() - 1
        }
    };
    &mut pending[pos]
}
