//! Several-token f32 attention on 512 bits with the scores as a small matrix product: for each
//! block of 16 positions the K rows are transposed once (`kt[c·16 + i]` = dim c of position
//! i), so one query row's 16 scores are `Σ_c q[c]·kt[c]`: d FMAs of a broadcast query element
//! with a 16-position vector, no horizontal reduction. Eight query rows (token, head) go at
//! once, so each loaded K or V vector serves eight FMAs and the eight accumulators hide the
//! FMA latency; the PV sum `o += Σ_i p_i·v_i` is done the same way, 16 columns at a time.
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

use super::float::{MAX_D, exp_ps, prefetch_row};
use crate::kernels::AttnTokens;

/// Query rows (token, head) per pass.
const RQ: usize = 8;

/// Most query rows of a call: [`crate::kernels::Kernels::ATTEND_MAX_TOKENS`] tokens ×
/// [`crate::kernels::Kernels::ATTEND_MAX_HEADS`] heads.
const MAX_ROWS: usize =
    crate::kernels::Kernels::ATTEND_MAX_TOKENS * crate::kernels::Kernels::ATTEND_MAX_HEADS;

/// The kernel; the caller checked `a.fits(out, 32, MAX_D, MAX_G)`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn tokens(a: &AttnTokens<'_>, out: &mut [&mut [f32]]) {
    let (d, row, cap, off, nt, g) = (a.d, a.row, a.cap, a.off, a.n_tokens, a.n_heads);
    let nr = nt * g;
    let scale = _mm512_set1_ps(1.0 / (d as f32).sqrt());
    let first = |t: usize| (a.pos0 + t + 1).saturating_sub(a.window);
    let (start, end) = (first(0), a.pos0 + nt); // positions start..end, end exclusive
    let base = |j: usize| (j % cap) * row + off;
    let mut m = [f32::NEG_INFINITY; MAX_ROWS];
    let mut l = [0.0f32; MAX_ROWS];
    // Row r = (token r / g, head r % g): its query and its output.
    let q_of = |r: usize| &a.q[(r / g) * a.q_stride + (r % g) * d..][..d];
    // One base pointer per token's output (g heads of d), the rows' pointers derived from it.
    let mut o_ptr = [core::ptr::null_mut::<f32>(); MAX_ROWS];
    for (t, o) in out[..nt].iter_mut().enumerate() {
        let o = &mut o[..g * d];
        o.fill(0.0);
        let p = o.as_mut_ptr();
        for h in 0..g {
            // SAFETY: h·d < g·d, inside the token's output.
            o_ptr[t * g + h] = unsafe { p.add(h * d) };
        }
    }
    let mut kt = [0.0f32; MAX_D * 16];
    let mut vbuf = [0.0f32; 16 * MAX_D];
    for j0 in (start..end).step_by(16) {
        let len = 16.min(end - j0);
        // Positions past the block repeat its first (their lanes are masked off).
        for i in 0..16 {
            let b = base(if i < len { j0 + i } else { j0 });
            for (c, &x) in a.kc[b..b + d].iter().enumerate() {
                kt[c * 16 + i] = x;
            }
            vbuf[i * d..(i + 1) * d].copy_from_slice(&a.vc[b..b + d]);
        }
        if j0 + 16 < end {
            for i in 0..16.min(end - j0 - 16) {
                let b = base(j0 + 16 + i);
                prefetch_row(&a.kc[b..b + d]);
                prefetch_row(&a.vc[b..b + d]);
            }
        }
        for r0 in (0..nr).step_by(RQ) {
            let live = RQ.min(nr - r0);
            // The rows' visible lanes (0: none, or a padding row).
            let mut lo = [16usize; RQ];
            let mut hi = [0usize; RQ];
            let mut mask = [0u16; RQ];
            for k in 0..live {
                let t = (r0 + k) / g;
                let (f, p) = (first(t), a.pos0 + t);
                let (l0, h0) = (
                    f.saturating_sub(j0).min(16),
                    (p + 1).saturating_sub(j0).min(len),
                );
                if l0 < h0 {
                    (lo[k], hi[k]) = (l0, h0);
                    mask[k] = (((1u32 << h0) - 1) & !((1u32 << l0) - 1)) as u16;
                }
            }
            if mask.iter().all(|&x| x == 0) {
                continue;
            }
            // Scores: eight rows, one accumulator each, over the dims.
            let qs: [&[f32]; RQ] = core::array::from_fn(|k| q_of(r0 + k.min(live - 1)));
            let mut s = [_mm512_setzero_ps(); RQ];
            for c in 0..d {
                // SAFETY: c·16 + 16 ≤ 16·d ≤ kt.len() (d ≤ MAX_D, checked by the caller).
                let kv = unsafe { _mm512_loadu_ps(kt.as_ptr().add(c * 16)) };
                for k in 0..RQ {
                    s[k] = _mm512_fmadd_ps(_mm512_set1_ps(qs[k][c]), kv, s[k]);
                }
            }
            // Online softmax per row; weights to `pw`, output scale to `alpha`.
            let mut pw = [[0.0f32; 16]; RQ];
            let mut alpha = [1.0f32; RQ];
            for k in 0..live {
                if mask[k] == 0 {
                    continue;
                }
                let r = r0 + k;
                let sk = _mm512_mask_mov_ps(
                    _mm512_set1_ps(f32::NEG_INFINITY),
                    mask[k],
                    _mm512_mul_ps(s[k], scale),
                );
                let m_new = m[r].max(_mm512_reduce_max_ps(sk));
                let al = exp_ps(_mm512_set1_ps(m[r] - m_new));
                let pv = exp_ps(_mm512_sub_ps(sk, _mm512_set1_ps(m_new)));
                l[r] = l[r] * _mm512_cvtss_f32(al) + _mm512_reduce_add_ps(pv);
                m[r] = m_new;
                alpha[k] = _mm512_cvtss_f32(al);
                // SAFETY: `pw[k]` is 16 writable f32.
                unsafe { _mm512_storeu_ps(pw[k].as_mut_ptr(), pv) };
            }
            let (ilo, ihi) = (
                lo[..live].iter().copied().min().unwrap_or(16),
                hi[..live].iter().copied().max().unwrap_or(0),
            );
            // PV: 16 columns at a time, eight rows' accumulators.
            for c in (0..d).step_by(16) {
                let mut acc = [_mm512_setzero_ps(); RQ];
                for k in 0..live {
                    // SAFETY: row r0 + k's output has d floats and c + 16 ≤ d.
                    let o = unsafe { _mm512_loadu_ps(o_ptr[r0 + k].add(c)) };
                    acc[k] = _mm512_mul_ps(o, _mm512_set1_ps(alpha[k]));
                }
                for i in ilo..ihi {
                    // SAFETY: i·d + c + 16 ≤ 16·d ≤ vbuf.len().
                    let v = unsafe { _mm512_loadu_ps(vbuf.as_ptr().add(i * d + c)) };
                    for k in 0..RQ {
                        acc[k] = _mm512_fmadd_ps(_mm512_set1_ps(pw[k][i]), v, acc[k]);
                    }
                }
                for k in 0..live {
                    // SAFETY: as above; rows r0 + k are distinct for distinct k < live.
                    unsafe { _mm512_storeu_ps(o_ptr[r0 + k].add(c), acc[k]) };
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
