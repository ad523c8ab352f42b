//! Several-token f32 attention on 512 bits with the scores as a small matrix product: for each
//! block of 32 positions the K rows are transposed once (`kt[c·32 + i]` = dim c of position
//! i, `tiles::gather_block`), so one query row's scores are `Σ_c q[c]·kt[c]`: FMAs of a
//! broadcast query element with two 16-position vectors, no horizontal reduction. Eight query
//! rows (token, head) go at once, so each loaded K or V vector serves eight FMAs and each
//! broadcast two; the PV sum `o += Σ_i p_i·v_i` is done the same way, 32 columns at a time.
//!
//! The previous kernel (`float::tokens`, kept behind `LAGOON_CPU_ATTN_TOKENS=rows`) formed
//! each query row's scores from 16 dot products and one transposing reduction, one row at a
//! time: on the 2-core Zen 5 VM it ran a 16-token block at 365 µs per token over 512
//! positions (one thread, `simd_cmp_attention`), slower than the one-token kernel's 306.
//!
//! Online softmax per query row as in `float::tokens` (running max m, sum l, output o; per
//! block `m' = max(m, max s)`, `o ← o·e^(m−m') + Σ e^(s−m')·v`, `l ← l·e^(m−m') + Σ e^(s−m')`;
//! at the end `o / l`); positions a row does not see are −∞ (weight 0), and a row that sees
//! none of a block is left as it is. The same operations per row in another order than the
//! one-token kernel's, so results agree with it up to rounding.

use core::arch::x86_64::*;

use super::super::tiles::{self, MAX_ROWS};
use super::float::{MAX_D, exp_ps};
use crate::kernels::AttnTokens;

/// Query rows (token, head) per pass.
const RQ: usize = 8;

/// Positions per block: two 16-lane halves.
const B: usize = 32;

/// The kernel; the caller checked `a.fits(out, 32, MAX_D, MAX_G)`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn tokens(a: &AttnTokens<'_>, out: &mut [&mut [f32]]) {
    let (d, nt, g) = (a.d, a.n_tokens, a.n_heads);
    let nr = nt * g;
    let scale = _mm512_set1_ps(1.0 / (d as f32).sqrt());
    // Positions start..end, end exclusive.
    let (start, end) = ((a.pos0 + 1).saturating_sub(a.window), a.pos0 + nt);
    let mut m = [f32::NEG_INFINITY; MAX_ROWS];
    let mut l = [0.0f32; MAX_ROWS];
    // Row r = (token r / g, head r % g): its output.
    let o_ptr = tiles::row_outputs(a, out);
    // The query rows packed once per call (tiles::pack_queries).
    let mut qp = [0.0f32; MAX_ROWS * MAX_D];
    tiles::pack_queries::<RQ>(a, &mut qp);
    let mut kt = [0.0f32; MAX_D * B];
    let mut vbuf = [0.0f32; B * MAX_D];
    for j0 in (start..end).step_by(B) {
        let len = B.min(end - j0);
        tiles::gather_block::<B>(a, j0, end, &mut kt, &mut vbuf);
        for r0 in (0..nr).step_by(RQ) {
            let live = RQ.min(nr - r0);
            // The rows' visible positions of the block (mask 0: none, or a padding row).
            let mut lo = [B; RQ];
            let mut hi = [0usize; RQ];
            let mut mask = [0u32; RQ];
            for k in 0..live {
                if let Some((l0, h0)) = tiles::visible::<B>(a, (r0 + k) / g, j0, len) {
                    (lo[k], hi[k]) = (l0, h0);
                    let upto = |n: usize| if n >= 32 { u32::MAX } else { (1u32 << n) - 1 };
                    mask[k] = upto(h0) & !upto(l0);
                }
            }
            if mask.iter().all(|&x| x == 0) {
                continue;
            }
            // Scores: eight rows × two 16-position halves, so each broadcast query element
            // serves two FMAs.
            let qg = qp[r0 * d..(r0 + RQ) * d].as_ptr();
            let mut s = [[_mm512_setzero_ps(); 2]; RQ];
            for c in 0..d {
                // SAFETY: c·B + B ≤ B·d ≤ kt.len() (d ≤ MAX_D, checked by the caller); c·RQ +
                // k < d·RQ, inside this group's packed rows (the slice above).
                unsafe {
                    let p = kt.as_ptr().add(c * B);
                    let (k0, k1) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
                    let qc = qg.add(c * RQ);
                    for k in 0..RQ {
                        let w = _mm512_set1_ps(*qc.add(k));
                        s[k][0] = _mm512_fmadd_ps(w, k0, s[k][0]);
                        s[k][1] = _mm512_fmadd_ps(w, k1, s[k][1]);
                    }
                }
            }
            // Online softmax per row; weights to `pw`, output scale to `alpha`.
            let mut pw = [[0.0f32; B]; RQ];
            let mut alpha = [1.0f32; RQ];
            let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
            for k in 0..live {
                if mask[k] == 0 {
                    continue;
                }
                let r = r0 + k;
                let sk = [0, 1].map(|h| {
                    let mh = (mask[k] >> (16 * h)) as u16;
                    _mm512_mask_mov_ps(ninf, mh, _mm512_mul_ps(s[k][h], scale))
                });
                let mx = _mm512_reduce_max_ps(_mm512_max_ps(sk[0], sk[1]));
                let m_new = m[r].max(mx);
                let al = exp_ps(_mm512_set1_ps(m[r] - m_new));
                let mn = _mm512_set1_ps(m_new);
                let pv = sk.map(|x| exp_ps(_mm512_sub_ps(x, mn)));
                let sum = _mm512_reduce_add_ps(_mm512_add_ps(pv[0], pv[1]));
                l[r] = l[r] * _mm512_cvtss_f32(al) + sum;
                m[r] = m_new;
                alpha[k] = _mm512_cvtss_f32(al);
                // SAFETY: `pw[k]` is B = 32 writable f32.
                unsafe {
                    _mm512_storeu_ps(pw[k].as_mut_ptr(), pv[0]);
                    _mm512_storeu_ps(pw[k].as_mut_ptr().add(16), pv[1]);
                }
            }
            let (ilo, ihi) = (
                lo[..live].iter().copied().min().unwrap_or(B),
                hi[..live].iter().copied().max().unwrap_or(0),
            );
            // PV: 32 columns at a time (d is a multiple of 32), eight rows' accumulators, so
            // each broadcast weight serves two FMAs.
            for c in (0..d).step_by(32) {
                let mut acc = [[_mm512_setzero_ps(); 2]; RQ];
                for k in 0..live {
                    let al = _mm512_set1_ps(alpha[k]);
                    for (h, a) in acc[k].iter_mut().enumerate() {
                        // SAFETY: row r0 + k's output has d floats and c + 32 ≤ d.
                        let o = unsafe { _mm512_loadu_ps(o_ptr[r0 + k].add(c + 16 * h)) };
                        *a = _mm512_mul_ps(o, al);
                    }
                }
                for i in ilo..ihi {
                    // SAFETY: i·d + c + 32 ≤ B·d ≤ vbuf.len().
                    let (v0, v1) = unsafe {
                        let p = vbuf.as_ptr().add(i * d + c);
                        (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)))
                    };
                    for k in 0..RQ {
                        let w = _mm512_set1_ps(pw[k][i]);
                        acc[k][0] = _mm512_fmadd_ps(w, v0, acc[k][0]);
                        acc[k][1] = _mm512_fmadd_ps(w, v1, acc[k][1]);
                    }
                }
                for k in 0..live {
                    for (h, a) in acc[k].iter().enumerate() {
                        // SAFETY: as above; rows r0 + k are distinct for distinct k < live.
                        unsafe { _mm512_storeu_ps(o_ptr[r0 + k].add(c + 16 * h), *a) };
                    }
                }
            }
        }
    }
    for r in 0..nr {
        let inv = _mm512_set1_ps(l[r]);
        for c in (0..d).step_by(16) {
            // SAFETY: row r's output has d floats, c + 16 ≤ d.
            unsafe {
                let p = o_ptr[r].add(c);
                _mm512_storeu_ps(p, _mm512_div_ps(_mm512_loadu_ps(p), inv));
            }
        }
    }
}
