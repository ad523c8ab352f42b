//! The scalar bookkeeping the several-token attention tiles share (`avx2/attn_tiles.rs`,
//! `avx512/attn_tiles.rs`): each query row's output, a block's K rows transposed and V rows
//! copied, and the positions of a block a row sees.

use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};

use crate::kernels::AttnTokens;

/// Most query rows of a call: [`crate::kernels::Kernels::ATTEND_MAX_TOKENS`] tokens ×
/// [`crate::kernels::Kernels::ATTEND_MAX_HEADS`] heads.
pub(super) const MAX_ROWS: usize =
    crate::kernels::Kernels::ATTEND_MAX_TOKENS * crate::kernels::Kernels::ATTEND_MAX_HEADS;

/// Zeroes the outputs of `a`'s tokens and returns row r's (token r / g, head r % g) output
/// pointer at `[r]`, each derived from its token's one base pointer.
pub(super) fn row_outputs(a: &AttnTokens<'_>, out: &mut [&mut [f32]]) -> [*mut f32; MAX_ROWS] {
    let (d, g) = (a.d, a.n_heads);
    let mut o_ptr = [core::ptr::null_mut::<f32>(); MAX_ROWS];
    for (t, o) in out[..a.n_tokens].iter_mut().enumerate() {
        let o = &mut o[..g * d];
        o.fill(0.0);
        let p = o.as_mut_ptr();
        for h in 0..g {
            // SAFETY: h·d < g·d, inside the token's output.
            o_ptr[t * g + h] = unsafe { p.add(h * d) };
        }
    }
    o_ptr
}

/// The call's query rows packed `RQ` at a time with their element c together:
/// `qp[(r0 / RQ)·d·RQ + c·RQ + k]` is row r0 + k's element c (row r = token r / g, head
/// r % g; rows past the last repeat it), so a score loop broadcasts from one pointer at fixed
/// offsets where reading `RQ` row slices cost a bounds check and a pointer reload per row and
/// element (the AVX-512 16-token kernel +2–8%, BENCHMARKS.md "Session 30 on the 2-core …").
pub(super) fn pack_queries<const RQ: usize>(a: &AttnTokens<'_>, qp: &mut [f32]) {
    let (d, g) = (a.d, a.n_heads);
    let nr = a.n_tokens * g;
    for gi in 0..nr.div_ceil(RQ) {
        for k in 0..RQ {
            let r = (gi * RQ + k).min(nr - 1);
            let q = &a.q[(r / g) * a.q_stride + (r % g) * d..][..d];
            for (c, &x) in q.iter().enumerate() {
                qp[(gi * d + c) * RQ + k] = x;
            }
        }
    }
}

/// Positions `j0 .. j0 + B` (`len` of them real; the rest repeat the first, to be masked
/// off): dim c of position i to `kt[c·B + i]`, V row i to `vbuf[i·d ..]`; then prefetches of
/// the next block's rows (up to `end`).
pub(super) fn gather_block<const B: usize>(
    a: &AttnTokens<'_>,
    j0: usize,
    end: usize,
    kt: &mut [f32],
    vbuf: &mut [f32],
) {
    let (d, row, cap, off) = (a.d, a.row, a.cap, a.off);
    let base = |j: usize| (j % cap) * row + off;
    let len = B.min(end - j0);
    for i in 0..B {
        let b = base(if i < len { j0 + i } else { j0 });
        for (c, &x) in a.kc[b..b + d].iter().enumerate() {
            kt[c * B + i] = x;
        }
        vbuf[i * d..(i + 1) * d].copy_from_slice(&a.vc[b..b + d]);
    }
    for j in j0 + B..end.min(j0 + 2 * B) {
        let b = base(j);
        for x in [&a.kc[b..b + d], &a.vc[b..b + d]] {
            for line in x.chunks(16) {
                // SAFETY: a prefetch reads nothing and never faults (SSE, part of x86_64).
                unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
            }
        }
    }
}

/// The positions `lo..hi` of block `j0 .. j0 + len` (offsets in the block) that token t's
/// query sees, or `None`.
pub(super) fn visible<const B: usize>(
    a: &AttnTokens<'_>,
    t: usize,
    j0: usize,
    len: usize,
) -> Option<(usize, usize)> {
    let first = (a.pos0 + t + 1).saturating_sub(a.window);
    let p = a.pos0 + t;
    let (lo, hi) = (
        first.saturating_sub(j0).min(B),
        (p + 1).saturating_sub(j0).min(len),
    );
    (lo < hi).then_some((lo, hi))
}
