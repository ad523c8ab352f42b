//! What the driver needs from a model: logits after a prompt and after each token.

use lagoon_cpu::{Session, StepError};
use lagoon_cuda::{CudaError, CudaSession};

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

/// Evaluates `prompt` (not empty) in `ubatch`-sized steps and returns the last token's
/// logits; the shared body of the CPU and CUDA sessions' `eval_prompt`. `step` evaluates one
/// chunk and returns its logits (every row when `all_logits`).
fn chunked_prompt<'s, T, E>(
    s: &'s mut T,
    prompt: &[u32],
    ubatch: usize,
    all_logits: bool,
    step: for<'a, 'b> fn(&'a mut T, &'b [u32]) -> Result<&'a [f32], E>,
) -> Result<&'s [f32], E> {
    let n = prompt.len();
    let last = (n - 1) / ubatch * ubatch;
    for chunk in prompt[..last].chunks(ubatch) {
        step(s, chunk)?;
    }
    let rows = n - last;
    let logits = step(s, &prompt[last..])?;
    // With `all_logits` every row comes back; keep the last.
    let vocab = logits.len() / if all_logits { rows } else { 1 };
    Ok(&logits[logits.len() - vocab..])
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
        chunked_prompt(self, prompt, opts.ubatch, opts.all_logits, Session::step)
    }

    fn eval_token(&mut self, token: u32) -> Result<&[f32], StepError> {
        self.step(&[token])
    }

    fn room(&self) -> Option<usize> {
        Some(self.options().n_ctx.saturating_sub(self.n_past()))
    }
}

impl LogitsSource for CudaSession {
    type Error = CudaError;

    fn eval_prompt(&mut self, prompt: &[u32]) -> Result<&[f32], CudaError> {
        let opts = self.options();
        let n = prompt.len();
        if n == 0 {
            return Err(CudaError::BadBatch {
                n_tokens: 0,
                ubatch: opts.ubatch,
            });
        }
        if self.n_past() + n > opts.n_ctx {
            return Err(CudaError::ContextFull {
                n_past: self.n_past(),
                n_tokens: n,
                n_ctx: opts.n_ctx,
            });
        }
        chunked_prompt(
            self,
            prompt,
            opts.ubatch,
            opts.all_logits,
            CudaSession::step,
        )
    }

    fn eval_token(&mut self, token: u32) -> Result<&[f32], CudaError> {
        self.step(&[token])
    }

    fn room(&self) -> Option<usize> {
        Some(self.options().n_ctx.saturating_sub(self.n_past()))
    }
}
