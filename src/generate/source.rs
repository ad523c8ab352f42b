//! What the driver needs from a model: logits after a prompt and after each token.

use lagoon_cpu::{Session, StepError};

/// A model evaluated token by token. [`Session`] implements it; tests use scripted fakes.
pub trait LogitsSource {
    type Error: std::error::Error;

    /// Evaluates `prompt` (at least one token) after whatever was evaluated before and
    /// returns the logits of its last token.
    fn eval_prompt(&mut self, prompt: &[u32]) -> Result<&[f32], Self::Error>;

    /// Evaluates one more token and returns its logits.
    fn eval_token(&mut self, token: u32) -> Result<&[f32], Self::Error>;

    /// How many more tokens can be evaluated (`None`: no limit).
    fn room(&self) -> Option<usize> {
        None
    }
}

impl LogitsSource for Session<'_> {
    type Error = StepError;

    fn eval_prompt(&mut self, prompt: &[u32]) -> Result<&[f32], StepError> {
        let opts = self.options();
        let n = prompt.len();
        if n == 0 {
            return Err(StepError::BadBatch {
                n_tokens: 0,
                ubatch: opts.ubatch,
            });
        }
        // Checked up front so that a prompt that does not fit changes nothing.
        if self.n_past() + n > opts.n_ctx {
            return Err(StepError::ContextFull {
                n_past: self.n_past(),
                n_tokens: n,
                n_ctx: opts.n_ctx,
            });
        }
        let last = (n - 1) / opts.ubatch * opts.ubatch;
        for chunk in prompt[..last].chunks(opts.ubatch) {
            self.step(chunk)?;
        }
        let rows = n - last;
        let logits = self.step(&prompt[last..])?;
        // With `all_logits` every row comes back; keep the last.
        let vocab = logits.len() / if opts.all_logits { rows } else { 1 };
        Ok(&logits[logits.len() - vocab..])
    }

    fn eval_token(&mut self, token: u32) -> Result<&[f32], StepError> {
        self.step(&[token])
    }

    fn room(&self) -> Option<usize> {
        Some(self.options().n_ctx.saturating_sub(self.n_past()))
    }
}
