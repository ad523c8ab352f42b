//! Reasoning state: which channel generation is in (tracked by the `<think>` / `</think>`
//! token ids) and the reasoning budget that forces `</think>`.
//!
//! The budget follows llama.cpp's reasoning-budget sampler (`common/reasoning-budget.cpp`):
//! once the budget is spent, the end token is forced, but not in the middle of a UTF-8
//! character: up to [`MAX_UTF8_WAIT`] more tokens are sampled while the detokenizer holds
//! an incomplete character.

use crate::tokenizer::Tokenizer;

/// Tokens sampled past the budget, at most, to finish a split character.
pub const MAX_UTF8_WAIT: usize = 4;

/// The ids of the chat markers that delimit reasoning.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThinkTokens {
    /// `<think>`.
    pub start: Option<u32>,
    /// `</think>`.
    pub end: Option<u32>,
    /// `<assistant>`: the start of the current turn bounds the search for an open
    /// `<think>` in the prompt (as vLLM's `poolside_v1` reasoning parser bounds its search).
    pub turn_start: Option<u32>,
}

impl ThinkTokens {
    /// Looks the markers up in the tokenizer's vocabulary (Laguna spellings).
    pub fn from_tokenizer(tok: &Tokenizer) -> ThinkTokens {
        ThinkTokens {
            start: tok.token_to_id("<think>"),
            end: tok.token_to_id("</think>"),
            turn_start: tok.token_to_id("<assistant>"),
        }
    }

    /// Whether `prompt` leaves generation inside reasoning: its last marker, after the
    /// last `<assistant>`, is `<think>` (the Laguna template with thinking on ends its
    /// generation prompt with `<assistant><think>`).
    pub fn prompt_ends_in_reasoning(&self, prompt: &[u32]) -> bool {
        for &t in prompt.iter().rev() {
            if Some(t) == self.start {
                return true;
            }
            if Some(t) == self.end || Some(t) == self.turn_start {
                return false;
            }
        }
        false
    }

    pub fn is_marker(&self, t: u32) -> bool {
        Some(t) == self.start || Some(t) == self.end
    }
}

/// Per-generation reasoning state.
#[derive(Clone, Debug)]
pub(crate) struct Reasoning {
    pub think: ThinkTokens,
    pub inside: bool,
    /// Tokens generated inside reasoning (markers excluded).
    pub n_tokens: usize,
    pub budget: Option<usize>,
    /// `</think>` was forced by the budget.
    pub forced: bool,
}

impl Reasoning {
    pub fn new(think: ThinkTokens, inside: bool, budget: Option<usize>) -> Reasoning {
        Reasoning {
            think,
            inside,
            n_tokens: 0,
            budget,
            forced: false,
        }
    }

    /// The token to force next instead of sampling, if the budget is spent.
    /// `utf8_pending`: the detokenizer holds part of a character.
    pub fn forced_token(&self, utf8_pending: bool) -> Option<u32> {
        let budget = self.budget?;
        if !self.inside || self.n_tokens < budget {
            return None;
        }
        if utf8_pending && self.n_tokens < budget + MAX_UTF8_WAIT {
            return None;
        }
        self.think.end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_state_is_bounded_by_the_turn() {
        let t = ThinkTokens {
            start: Some(10),
            end: Some(12),
            turn_start: Some(23),
        };
        assert!(t.prompt_ends_in_reasoning(&[2, 5, 23, 10]));
        assert!(t.prompt_ends_in_reasoning(&[2, 23, 10, 40, 41]));
        assert!(!t.prompt_ends_in_reasoning(&[2, 23, 12]));
        assert!(!t.prompt_ends_in_reasoning(&[2, 23, 10, 40, 12, 50]));
        // A `<think>` of an earlier turn does not count.
        assert!(!t.prompt_ends_in_reasoning(&[10, 40, 23, 50]));
        assert!(!t.prompt_ends_in_reasoning(&[]));
    }

    #[test]
    fn budget_waits_for_a_whole_character() {
        let t = ThinkTokens {
            start: Some(10),
            end: Some(12),
            turn_start: None,
        };
        let mut r = Reasoning::new(t, true, Some(2));
        r.n_tokens = 1;
        assert_eq!(r.forced_token(false), None);
        r.n_tokens = 2;
        assert_eq!(r.forced_token(false), Some(12));
        assert_eq!(r.forced_token(true), None);
        r.n_tokens = 2 + MAX_UTF8_WAIT;
        assert_eq!(r.forced_token(true), Some(12));
        r.inside = false;
        assert_eq!(r.forced_token(false), None);
    }
}
