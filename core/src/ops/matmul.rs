//! `y = x · Wᵀ` for any weight encoding, one decoded row at a time.
//!
//! Each weight row is decoded once into `row` (f32) and dotted with every token, so the
//! decode cost is amortised over the batch and nothing the size of the matrix is allocated.

use crate::weights::MatRef;

/// `out[t, r] = Σ_k x[t, k] · W[r, k]` for `t < n_tokens`; `x` is `[n_tokens, cols]`,
/// `out` is `[n_tokens, rows]`, `row` is scratch of at least `cols`.
pub fn matmul(w: &MatRef<'_>, x: &[f32], n_tokens: usize, out: &mut [f32], row: &mut [f32]) {
    let (rows, cols) = (w.rows, w.cols);
    debug_assert!(x.len() >= n_tokens * cols && out.len() >= n_tokens * rows);
    let row = &mut row[..cols];
    for r in 0..rows {
        w.dequant_row(r, row);
        for t in 0..n_tokens {
            out[t * rows + r] = super::dot(&x[t * cols..(t + 1) * cols], row);
        }
    }
}
