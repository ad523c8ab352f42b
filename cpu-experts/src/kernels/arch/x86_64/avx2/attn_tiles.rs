//! Several-token f32 attention on 256 bits (AVX2 + FMA) as a small matrix product: the
//! 512-bit kernel's construction (`avx512/attn_tiles.rs`: each block's K rows transposed once,
//! several query rows at once, broadcast-FMAs for the scores and PV, no horizontal reduction
//! per score) with 16-position blocks in two 8-lane halves and four query rows per pass
//! (eight accumulators: the AVX2 register file has sixteen).
//!
//! The previous kernel (`attend::tokens`, kept behind `LAGOON_CPU_ATTN_TOKENS=rows`) formed
//! each query row's scores from eight dot products and one transposing reduction, one row at
//! a time. Online softmax per row as there; results agree with it up to rounding.

use core::arch::x86_64::*;

use super::super::tiles::{self, MAX_ROWS};
use super::attend::{MAX_D, exp_ps, hmax, hsum, lanes};
use crate::kernels::AttnTokens;

/// Query rows (token, head) per pass.
const RQ: usize = 4;

/// Positions per block: two 8-lane halves.
const B: usize = 16;

/// The kernel; the caller checked `a.fits(out, 16, MAX_D, MAX_G)`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn tokens(a: &AttnTokens<'_>, out: &mut [&mut [f32]]) {
    let (d, nt, g) = (a.d, a.n_tokens, a.n_heads);
    let nr = nt * g;
    let scale = _mm256_set1_ps(1.0 / (d as f32).sqrt());
    // Positions start..end, end exclusive.
    let (start, end) = ((a.pos0 + 1).saturating_sub(a.window), a.pos0 + nt);
    let mut m = [f32::NEG_INFINITY; MAX_ROWS];
    let mut l = [0.0f32; MAX_ROWS];
    // Row r = (token r / g, head r % g): its output.
    let o_ptr = tiles::row_outputs(a, out);
    // The query rows packed once per call (tiles::pack_queries).
    let mut qp = [0.0f32; MAX_ROWS * MAX_D];
    tiles::pack_queries::<RQ>(a, &mut qp);
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut kt = [0.0f32; MAX_D * B];
    let mut vbuf = [0.0f32; B * MAX_D];
    for j0 in (start..end).step_by(B) {
        let len = B.min(end - j0);
        tiles::gather_block::<B>(a, j0, end, &mut kt, &mut vbuf);
        for r0 in (0..nr).step_by(RQ) {
            let live = RQ.min(nr - r0);
            // The rows' visible positions of the block (lo ≥ hi: none, or a padding row).
            let mut lo = [B; RQ];
            let mut hi = [0usize; RQ];
            for k in 0..live {
                if let Some((l0, h0)) = tiles::visible::<B>(a, (r0 + k) / g, j0, len) {
                    (lo[k], hi[k]) = (l0, h0);
                }
            }
            if (0..live).all(|k| lo[k] >= hi[k]) {
                continue;
            }
            // Scores: four rows × two 8-position halves, so each broadcast query element
            // serves two FMAs.
            let qg = qp[r0 * d..(r0 + RQ) * d].as_ptr();
            let mut s = [[_mm256_setzero_ps(); 2]; RQ];
            for c in 0..d {
                // SAFETY: c·B + B ≤ B·d ≤ kt.len() (d ≤ MAX_D, checked by the caller); c·RQ +
                // k < d·RQ, inside this group's packed rows (the slice above).
                unsafe {
                    let p = kt.as_ptr().add(c * B);
                    let (k0, k1) = (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)));
                    let qc = qg.add(c * RQ);
                    for k in 0..RQ {
                        let w = _mm256_set1_ps(*qc.add(k));
                        s[k][0] = _mm256_fmadd_ps(w, k0, s[k][0]);
                        s[k][1] = _mm256_fmadd_ps(w, k1, s[k][1]);
                    }
                }
            }
            // Online softmax per row; weights to `pw`, output scale to `alpha`.
            let mut pw = [[0.0f32; B]; RQ];
            let mut alpha = [1.0f32; RQ];
            for k in 0..live {
                if lo[k] >= hi[k] {
                    continue;
                }
                let r = r0 + k;
                let sk = [0usize, 1].map(|h| {
                    let mask = lanes(lo[k].saturating_sub(8 * h), hi[k].saturating_sub(8 * h));
                    _mm256_blendv_ps(neg_inf, _mm256_mul_ps(s[k][h], scale), mask)
                });
                let m_new = m[r].max(hmax(_mm256_max_ps(sk[0], sk[1])));
                let al = _mm256_cvtss_f32(exp_ps(_mm256_set1_ps(m[r] - m_new)));
                let mn = _mm256_set1_ps(m_new);
                let pv = sk.map(|x| exp_ps(_mm256_sub_ps(x, mn)));
                l[r] = l[r] * al + hsum(_mm256_add_ps(pv[0], pv[1]));
                m[r] = m_new;
                alpha[k] = al;
                // SAFETY: `pw[k]` is B = 16 writable f32.
                unsafe {
                    _mm256_storeu_ps(pw[k].as_mut_ptr(), pv[0]);
                    _mm256_storeu_ps(pw[k].as_mut_ptr().add(8), pv[1]);
                }
            }
            let (ilo, ihi) = (
                lo[..live].iter().copied().min().unwrap_or(B),
                hi[..live].iter().copied().max().unwrap_or(0),
            );
            // PV: 16 columns at a time (d is a multiple of 16), four rows' accumulators, so
            // each broadcast weight serves two FMAs.
            for c in (0..d).step_by(16) {
                let mut acc = [[_mm256_setzero_ps(); 2]; RQ];
                for k in 0..live {
                    let al = _mm256_set1_ps(alpha[k]);
                    for (h, a) in acc[k].iter_mut().enumerate() {
                        // SAFETY: row r0 + k's output has d floats and c + 16 ≤ d.
                        let o = unsafe { _mm256_loadu_ps(o_ptr[r0 + k].add(c + 8 * h)) };
                        *a = _mm256_mul_ps(o, al);
                    }
                }
                for i in ilo..ihi {
                    // SAFETY: i·d + c + 16 ≤ B·d ≤ vbuf.len().
                    let (v0, v1) = unsafe {
                        let p = vbuf.as_ptr().add(i * d + c);
                        (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
                    };
                    for k in 0..RQ {
                        let w = _mm256_set1_ps(pw[k][i]);
                        acc[k][0] = _mm256_fmadd_ps(w, v0, acc[k][0]);
                        acc[k][1] = _mm256_fmadd_ps(w, v1, acc[k][1]);
                    }
                }
                for k in 0..live {
                    for (h, a) in acc[k].iter().enumerate() {
                        // SAFETY: as above; rows r0 + k are distinct for distinct k < live.
                        unsafe { _mm256_storeu_ps(o_ptr[r0 + k].add(c + 8 * h), *a) };
                    }
                }
            }
        }
    }
    for r in 0..nr {
        let inv = _mm256_set1_ps(l[r]);
        for c in (0..d).step_by(8) {
            // SAFETY: row r's output has d floats, c + 8 ≤ d.
            unsafe {
                let p = o_ptr[r].add(c);
                _mm256_storeu_ps(p, _mm256_div_ps(_mm256_loadu_ps(p), inv));
            }
        }
    }
}
