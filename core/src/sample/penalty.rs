//! Token counts for the repetition / presence / frequency penalties, sized once for the
//! vocabulary. Applying them touches only the distinct tokens seen, not the vocabulary.
//!
//! Formulas and windows as vLLM (`vllm/model_executor/layers/utils.py`, `apply_penalties`):
//! repetition on prompt ∪ output, presence and frequency on the output only.

use alloc::vec;
use alloc::vec::Vec;

use super::SamplerParams;

const IN_PROMPT: u8 = 1;
const IN_OUTPUT: u8 = 2;

/// Which tokens were seen in the prompt and how often each occurred in the output.
#[derive(Clone, Debug)]
pub struct TokenCounts {
    /// Per id: [`IN_PROMPT`] | [`IN_OUTPUT`] bits.
    flags: Vec<u8>,
    /// Per id: occurrences in the output.
    output: Vec<u32>,
    /// The ids with a flag set, each once (capacity: the vocabulary, so pushes never
    /// reallocate).
    seen: Vec<u32>,
}

impl TokenCounts {
    pub fn new(vocab_size: usize) -> TokenCounts {
        TokenCounts {
            flags: vec![0; vocab_size],
            output: vec![0; vocab_size],
            seen: Vec::with_capacity(vocab_size),
        }
    }

    /// Forgets everything (costs the number of distinct tokens seen).
    pub fn clear(&mut self) {
        for &t in &self.seen {
            self.flags[t as usize] = 0;
            self.output[t as usize] = 0;
        }
        self.seen.clear();
    }

    fn mark(&mut self, token: u32, bit: u8) -> bool {
        let Some(f) = self.flags.get_mut(token as usize) else {
            return false; // outside the vocabulary: never sampled, nothing to penalise
        };
        if *f == 0 {
            self.seen.push(token);
        }
        *f |= bit;
        true
    }

    /// Records prompt tokens (repetition penalty only).
    pub fn add_prompt(&mut self, tokens: &[u32]) {
        for &t in tokens {
            self.mark(t, IN_PROMPT);
        }
    }

    /// Records one output token.
    pub fn add_output(&mut self, token: u32) {
        if self.mark(token, IN_OUTPUT) {
            self.output[token as usize] += 1;
        }
    }

    /// Occurrences of `token` in the output.
    pub fn output_count(&self, token: u32) -> u32 {
        self.output.get(token as usize).copied().unwrap_or(0)
    }

    /// Whether `token` occurred in the prompt.
    pub fn in_prompt(&self, token: u32) -> bool {
        self.flags
            .get(token as usize)
            .is_some_and(|f| f & IN_PROMPT != 0)
    }

    /// Applies the penalties of `p` to `cand`, which must still be in id order
    /// (`cand[i].1 == i`), as the samplers fill it.
    pub fn apply(&self, p: &SamplerParams, cand: &mut [(f32, u32)]) {
        for &t in &self.seen {
            let Some(c) = cand.get_mut(t as usize) else {
                continue;
            };
            debug_assert_eq!(c.1, t);
            let count = self.output[t as usize];
            if p.repetition_penalty != 1.0 {
                c.0 = if c.0 > 0.0 {
                    c.0 / p.repetition_penalty
                } else {
                    c.0 * p.repetition_penalty
                };
            }
            if count > 0 {
                c.0 -= p.frequency_penalty * count as f32 + p.presence_penalty;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(counts: &TokenCounts, p: &SamplerParams, logits: &[f32]) -> Vec<f32> {
        let mut cand: Vec<(f32, u32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (l, i as u32))
            .collect();
        counts.apply(p, &mut cand);
        cand.iter().map(|c| c.0).collect()
    }

    #[test]
    fn hand_computed_penalties() {
        let mut c = TokenCounts::new(6);
        c.add_prompt(&[1, 2, 2]);
        for t in [2, 3, 3, 3] {
            c.add_output(t);
        }
        c.add_output(99); // outside the vocabulary: ignored
        let logits = [1.0, 2.0, -1.0, 4.0, 0.5, -3.0];
        let p = SamplerParams {
            repetition_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..Default::default()
        };
        // 0: unseen. 1: prompt only: 2.0 / 2. 2: prompt + output once: -1 * 2 - 0.25 - 0.5.
        // 3: output three times: 4 / 2 - 0.75 - 0.5. 4, 5: unseen.
        assert_eq!(apply(&c, &p, &logits), [1.0, 1.0, -2.75, 0.75, 0.5, -3.0]);
        // Presence and frequency ignore the prompt.
        let p2 = SamplerParams {
            presence_penalty: 1.0,
            frequency_penalty: 1.0,
            ..Default::default()
        };
        assert_eq!(apply(&c, &p2, &logits), [1.0, 2.0, -3.0, 0.0, 0.5, -3.0]);
        // Zero logit counts as "not positive": multiplied (stays 0), as in vLLM/llama.cpp.
        let p3 = SamplerParams {
            repetition_penalty: 1.5,
            ..Default::default()
        };
        assert_eq!(apply(&c, &p3, &[0.0; 6])[1], 0.0);
        assert_eq!(c.output_count(3), 3);
        assert!(c.in_prompt(1) && !c.in_prompt(3));

        c.clear();
        assert_eq!(apply(&c, &p, &logits), logits);
        assert_eq!(c.output_count(3), 0);
    }
}
