//! The reasoning split of vLLM 0.33.0's `poolside_v1` reasoning parser
//! (`reasoning/poolside_v1_reasoning_parser.py`): `DeepSeekV3ReasoningParser`, which is
//! `DeepSeekR1ReasoningParser` (`reasoning/deepseek_r1_reasoning_parser.py` over
//! `reasoning/basic_parsers.py`) when the request's chat-template kwargs turn thinking on
//! (`thinking` or `enable_thinking` truthy) and `IdentityReasoningParser` (everything is
//! content) otherwise, with one override:
//!
//! `is_reasoning_end(prompt_ids)` — asked once, on the prompt, before streaming — walks the
//! prompt backwards: `<think>` → not ended, `</think>` → ended, `<assistant>` → not ended
//! (the walk stops at the start of the current assistant turn, so a `</think>` in earlier
//! turns or in tool descriptions does not count), start of prompt → not ended. With
//! thinking off it is always "ended".
//!
//! Batch (`extract_reasoning`, text only, the prompt is not consulted): drop everything up
//! to the first `<think>` if there is one; without `</think>` all of it is reasoning and
//! content is None; else split at the first `</think>` (empty content → None).
//!
//! Streaming (`extract_reasoning_streaming`, while reasoning is not ended) decides on token
//! ids and splits on text: a delta of exactly one `<think>` or `</think>` token emits
//! nothing; a delta holding `</think>` splits at the first `</think>` in its text and ends
//! reasoning; see [`ReasoningStream::step`] for the `<think>`-in-output branches.

use super::Delta;

pub(crate) const THINK: &str = "<think>";
pub(crate) const THINK_END: &str = "</think>";

/// Batch split with thinking on: (reasoning, content).
pub(crate) fn split(text: &str) -> (Option<String>, Option<String>) {
    let text = match text.find(THINK) {
        Some(i) => &text[i + THINK.len()..],
        None => text,
    };
    match text.find(THINK_END) {
        None => (Some(text.to_string()), None),
        Some(i) => {
            let content = &text[i + THINK_END.len()..];
            (
                Some(text[..i].to_string()),
                (!content.is_empty()).then(|| content.to_string()),
            )
        }
    }
}

/// `PoolsideV1ReasoningParser.is_reasoning_end` on the prompt (thinking on).
pub(crate) fn prompt_ends_reasoning(
    prompt_ids: &[u32],
    think: u32,
    think_end: u32,
    assistant: u32,
) -> bool {
    for &id in prompt_ids.iter().rev() {
        if id == think || id == assistant {
            return false;
        }
        if id == think_end {
            return true;
        }
    }
    false
}

/// Streaming state of `DeepSeekR1ReasoningParser`: whether `<think>` / `</think>` occurred
/// in earlier output (the reference rescans all previous ids; two flags suffice).
#[derive(Debug, Default)]
pub(crate) struct ReasoningStream {
    start_seen: bool,
    end_seen: bool,
}

impl ReasoningStream {
    /// One delta while reasoning is open.
    pub(crate) fn step(
        &mut self,
        text: &str,
        ids: &[u32],
        think: u32,
        think_end: u32,
    ) -> Option<Delta> {
        let start_prev = self.start_seen;
        let end_prev = self.end_seen;
        let start_delta = ids.contains(&think);
        let end_delta = ids.contains(&think_end);
        self.start_seen |= start_delta;
        self.end_seen |= end_delta;

        if ids.len() == 1 && (ids[0] == think || ids[0] == think_end) {
            return None;
        }
        // Before / after the first `</think>` of the text, Python slicing semantics
        // (`find` may give -1 when the id is there but the text is not).
        let split_end = |from: i64| -> Delta {
            let e = py_find(text, THINK_END);
            let content = py_slice(text, Some(e + THINK_END.chars().count() as i64), None);
            reasoning_content(py_slice(text, Some(from), Some(e)), content)
        };
        Some(if start_prev {
            // BaseThinkingReasoningParser, start token seen before.
            if end_delta {
                split_end(0)
            } else if end_prev {
                content_only(text)
            } else {
                reasoning_only(text)
            }
        } else if start_delta {
            if end_delta {
                let s = py_find(text, THINK);
                split_end(s + THINK.chars().count() as i64)
            } else {
                reasoning_only(text)
            }
        } else {
            // DeepSeekR1's override: no `<think>` anywhere (the template opened it).
            if end_delta {
                split_end(0)
            } else if end_prev {
                content_only(text)
            } else {
                reasoning_only(text)
            }
        })
    }
}

fn reasoning_content(reasoning: String, content: String) -> Delta {
    Delta {
        reasoning: Some(reasoning),
        content: (!content.is_empty()).then_some(content),
        tool_calls: Vec::new(),
    }
}

fn reasoning_only(text: &str) -> Delta {
    Delta {
        reasoning: Some(text.to_string()),
        ..Delta::default()
    }
}

fn content_only(text: &str) -> Delta {
    Delta {
        content: Some(text.to_string()),
        ..Delta::default()
    }
}

/// `str.find` in characters (-1 when absent).
fn py_find(s: &str, pat: &str) -> i64 {
    s.find(pat).map_or(-1, |b| s[..b].chars().count() as i64)
}

/// `s[start:stop]` with Python's index rules (characters, negatives from the end).
fn py_slice(s: &str, start: Option<i64>, stop: Option<i64>) -> String {
    let n = s.chars().count() as i64;
    let norm = |i: i64| if i < 0 { (i + n).max(0) } else { i.min(n) };
    let a = start.map_or(0, norm);
    let b = stop.map_or(n, norm);
    if a >= b {
        return String::new();
    }
    s.chars().skip(a as usize).take((b - a) as usize).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_slicing() {
        assert_eq!(py_slice("abcdé", Some(1), Some(-1)), "bcd");
        assert_eq!(py_slice("abc", Some(7), None), "");
        assert_eq!(py_slice("abc", None, Some(-1)), "ab");
        assert_eq!(py_find("é</think>", THINK_END), 1);
    }

    #[test]
    fn prompt_scan_stops_at_assistant() {
        // ... </think> ... <assistant> x  → not ended; ... <assistant></think> → ended
        assert!(!prompt_ends_reasoning(&[12, 23, 5], 10, 12, 23));
        assert!(prompt_ends_reasoning(&[23, 12], 10, 12, 23));
        assert!(!prompt_ends_reasoning(&[23, 12, 10], 10, 12, 23));
        assert!(!prompt_ends_reasoning(&[], 10, 12, 23));
    }
}
