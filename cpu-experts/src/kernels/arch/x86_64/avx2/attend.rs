//! f32 attention on 256 bits: the query heads that share one KV head, for one token
//! ([`attend_group`], decode) or for up to `ATTEND_MAX_TOKENS` consecutive tokens
//! ([`attend_tokens`], prefill). The AVX-512 kernels of `avx512/float.rs` restated on eight
//! lanes, for the CPUs that have AVX2 and FMA only (before this, such CPUs ran the
//! executor's per-head loop, compiled for baseline x86-64: SSE, four lanes, no FMA).
//!
//! Scalar, per query head h of the group and position j in `first..=pos`:
//! `s[h,j] = (q_h · k_j)·scale`, `p[h,j] = exp(s[h,j] − max_j s[h,·]) / Σ_j exp(..)`,
//! `o_h = Σ_j p[h,j]·v_j` (keys in ascending position order).
//!
//! Every K and V row is read once for the whole group (and, in `attend_tokens`, once per
//! block of positions for all the call's tokens). Each (token, head) result is one fixed
//! sequence of operations: deterministic for any thread count; it differs from the
//! reference attention by rounding only (FMA, 8-lane partial dot products, the polynomial
//! `exp`).

use core::arch::x86_64::*;

use crate::kernels::{AttnGroup, AttnTokens, Kernels};

/// Most query heads per call.
const MAX_G: usize = Kernels::ATTEND_MAX_HEADS;

/// Widest head [`attend_tokens`] takes (its block copies are `8·MAX_D` floats each).
pub(super) const MAX_D: usize = 256;

/// Positions per PV block of [`attend_group`]: 32 V rows of a 128-wide head are 16 KiB.
const PV_BLOCK: usize = 32;

/// The safe wrapper: `false` (nothing written) for shapes it does not take (head width not
/// a multiple of 16, more than [`MAX_G`] heads, short buffers).
pub(super) fn attend_group(a: &AttnGroup<'_>, scores: &mut [f32], out: &mut [f32]) -> bool {
    let Some(n) = a.checked(scores, out, 16, MAX_G) else {
        return false;
    };
    // SAFETY: the kernels only need the features `Avx2Fma::detect` checks. This wrapper is
    // reachable only through the table built by `avx2::table`, which requires an `Avx2Fma`
    // token. The bounds they index with are checked above.
    unsafe {
        match a.n_heads {
            1 => group::<1>(a, n, scores, out),
            2 => group::<2>(a, n, scores, out),
            3 => group::<3>(a, n, scores, out),
            4 => group::<4>(a, n, scores, out),
            5 => group::<5>(a, n, scores, out),
            6 => group::<6>(a, n, scores, out),
            7 => group::<7>(a, n, scores, out),
            _ => group::<8>(a, n, scores, out),
        }
    }
    true
}

/// 8 f32 from `x[i..i + 8]` (bounds checked).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn ld(x: &[f32], i: usize) -> __m256 {
    let c: &[f32; 8] = x[i..i + 8].try_into().unwrap_or_else(|_| unreachable!());
    // SAFETY: `c` is 8 readable f32; `loadu` accepts any alignment.
    unsafe { _mm256_loadu_ps(c.as_ptr()) }
}

/// Stores `v` at `x[i..i + 8]` (bounds checked).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn st(x: &mut [f32], i: usize, v: __m256) {
    let c: &mut [f32; 8] = (&mut x[i..i + 8])
        .try_into()
        .unwrap_or_else(|_| unreachable!());
    // SAFETY: `c` is 8 writable f32; `storeu` accepts any alignment.
    unsafe { _mm256_storeu_ps(c.as_mut_ptr(), v) }
}

/// Sum of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Largest of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hmax(v: __m256) -> f32 {
    let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)))
}

/// Lane i of the result is the sum of the 8 lanes of `a[i]` (pairs interleaved and added,
/// then the two 128-bit halves: 15 operations for 8 sums).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce8(a: [__m256; 8]) -> __m256 {
    // Per 128-bit half: [x0+x2, y0+y2, x1+x3, y1+y3] of the pair (x, y).
    let l1: [__m256; 4] = core::array::from_fn(|i| {
        let (x, y) = (a[2 * i], a[2 * i + 1]);
        _mm256_add_ps(_mm256_unpacklo_ps(x, y), _mm256_unpackhi_ps(x, y))
    });
    // Per 128-bit half: the half's sums of a[4i..4i + 4].
    let l2: [__m256; 2] = core::array::from_fn(|i| {
        let (x, y) = (l1[2 * i], l1[2 * i + 1]);
        _mm256_add_ps(
            _mm256_shuffle_ps::<0x44>(x, y),
            _mm256_shuffle_ps::<0xEE>(x, y),
        )
    });
    _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(l2[0], l2[1]),
        _mm256_permute2f128_ps::<0x31>(l2[0], l2[1]),
    )
}

/// `e^x` per lane, within about 2 ulp for the x ≤ 0 that softmax feeds it (−inf gives 0,
/// NaN stays NaN): `x = k·ln2 + r` with |r| ≤ ln2/2 (ln2 split in two for an exact
/// product), a degree-6 Taylor polynomial for `e^r`, then 2^k built in the exponent field.
/// x is first raised to −88 (so k ≥ −127, whose 2^k is built as 0: results below 2⁻¹²⁶ are
/// flushed to 0, where `avx512/float.rs`'s `vscalefps` keeps subnormals).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn exp_ps(x: __m256) -> __m256 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // `vmaxps` returns its second operand when one is NaN, so a NaN x passes through.
    let x = _mm256_max_ps(_mm256_set1_ps(-88.0), x);
    let k = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(core::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_HI), x);
    let r = _mm256_fnmadd_ps(k, _mm256_set1_ps(LN2_LO), r);
    let c = |v: f32| _mm256_set1_ps(v);
    let mut p = c(1.0 / 720.0);
    p = _mm256_fmadd_ps(p, r, c(1.0 / 120.0));
    p = _mm256_fmadd_ps(p, r, c(1.0 / 24.0));
    p = _mm256_fmadd_ps(p, r, c(1.0 / 6.0));
    p = _mm256_fmadd_ps(p, r, c(0.5));
    p = _mm256_fmadd_ps(p, r, c(1.0));
    p = _mm256_fmadd_ps(p, r, c(1.0));
    // k in −127..=128: 2^k's exponent field is k + 127 (0 gives +0; 255 gives +inf).
    let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(k),
        _mm256_set1_epi32(127),
    ));
    _mm256_mul_ps(p, _mm256_castsi256_ps(e))
}

/// `prefetcht0` on every 64-byte line of `x`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn prefetch_row(x: &[f32]) {
    for line in x.chunks(16) {
        _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast());
    }
}

/// A lane mask selecting lanes `lo..hi` (all-ones 32-bit lanes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn lanes(lo: usize, hi: usize) -> __m256 {
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let ge_lo = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(lo as i32 - 1));
    let lt_hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(hi as i32), idx);
    _mm256_castsi256_ps(_mm256_and_si256(ge_lo, lt_hi))
}

/// The 8 positions' scores `q_h · k_i` of one head (rows at `kp + kb[i]`, `d` floats each),
/// unscaled: eight accumulators, then one transposing reduction.
///
/// # Safety
/// `kp.add(kb[i] + d)` stays within one allocation for every i; `q.len() ≥ d`, d % 8 == 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores8(q: &[f32], kp: *const f32, kb: &[usize; 8], d: usize) -> __m256 {
    let mut acc = [_mm256_setzero_ps(); 8];
    for c in (0..d).step_by(8) {
        let qv = ld(q, c);
        for i in 0..8 {
            // SAFETY: the caller's contract (c + 8 ≤ d).
            let kv = unsafe { _mm256_loadu_ps(kp.add(kb[i] + c)) };
            acc[i] = _mm256_fmadd_ps(qv, kv, acc[i]);
        }
    }
    reduce8(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn group<const G: usize>(a: &AttnGroup<'_>, n: usize, scores: &mut [f32], out: &mut [f32]) {
    let (d, row, cap, off, first) = (a.d, a.row, a.cap, a.off, a.first);
    let scale = 1.0 / (d as f32).sqrt();
    let base = |j: usize| ((first + j) % cap) * row + off;
    // Scores, 8 positions at a time per head (the block's K rows stay in L1 across the G
    // heads); the tail one by one.
    let full = n / 8 * 8;
    let mut maxv = [_mm256_set1_ps(f32::NEG_INFINITY); G];
    let scale_v = _mm256_set1_ps(scale);
    let kp = a.kc.as_ptr();
    for j0 in (0..full).step_by(8) {
        let kb: [usize; 8] = core::array::from_fn(|i| base(j0 + i));
        // With whole KV rows (n_kv·d floats a position) each position's head is in its own
        // page, which the hardware prefetchers do not cross: ask for the next block's K rows
        // now. (The session's cache is head-major, kv.rs, where they are back to back.)
        if j0 + 16 <= n {
            for i in 0..8 {
                prefetch_row(&a.kc[base(j0 + 8 + i)..][..d]);
            }
        }
        for h in 0..G {
            // SAFETY: kb[i] + d ≤ (cap − 1)·row + off + d ≤ cap·row ≤ kc.len() (checked by
            // the wrapper).
            let s = _mm256_mul_ps(unsafe { scores8(&a.q[h * d..], kp, &kb, d) }, scale_v);
            st(scores, h * n + j0, s);
            maxv[h] = _mm256_max_ps(maxv[h], s);
        }
    }
    let mut max: [f32; G] = core::array::from_fn(|h| hmax(maxv[h]));
    for j in full..n {
        let kb = base(j);
        let k = &a.kc[kb..kb + d];
        for h in 0..G {
            let qh = &a.q[h * d..(h + 1) * d];
            let mut acc = _mm256_mul_ps(ld(qh, 0), ld(k, 0));
            for c in (8..d).step_by(8) {
                acc = _mm256_fmadd_ps(ld(qh, c), ld(k, c), acc);
            }
            let s = hsum(acc) * scale;
            scores[h * n + j] = s;
            max[h] = max[h].max(s);
        }
    }
    // Softmax weights in place, 8 at a time, the tail one by one.
    for h in 0..G {
        let s = &mut scores[h * n..(h + 1) * n];
        let mx = _mm256_set1_ps(max[h]);
        let mut sum = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= n {
            let e = exp_ps(_mm256_sub_ps(ld(s, i), mx));
            st(s, i, e);
            sum = _mm256_add_ps(sum, e);
            i += 8;
        }
        let mut total = hsum(sum);
        for x in s[i..].iter_mut() {
            *x = _mm256_cvtss_f32(exp_ps(_mm256_set1_ps(*x - max[h])));
            total += *x;
        }
        let inv = _mm256_set1_ps(total);
        let mut i = 0;
        while i + 8 <= n {
            st(s, i, _mm256_div_ps(ld(s, i), inv));
            i += 8;
        }
        for x in s[i..].iter_mut() {
            *x /= total;
        }
    }
    // PV: 16 output columns of all G heads in registers; positions in blocks of
    // `PV_BLOCK` so that a block's V rows stay in L1 across the column passes (the running
    // sums go through `out` between blocks, the order of additions is unchanged).
    for jb in (0..n).step_by(PV_BLOCK) {
        let je = n.min(jb + PV_BLOCK);
        for j in jb..je {
            prefetch_row(&a.vc[base(j)..][..d]);
        }
        for c in (0..d).step_by(16) {
            let mut acc = [[_mm256_setzero_ps(); 2]; G];
            if jb > 0 {
                for (h, acc) in acc.iter_mut().enumerate() {
                    *acc = [ld(out, h * d + c), ld(out, h * d + c + 8)];
                }
            }
            for j in jb..je {
                let vb = base(j) + c;
                let (v0, v1) = (ld(a.vc, vb), ld(a.vc, vb + 8));
                for h in 0..G {
                    let p = _mm256_set1_ps(scores[h * n + j]);
                    acc[h][0] = _mm256_fmadd_ps(p, v0, acc[h][0]);
                    acc[h][1] = _mm256_fmadd_ps(p, v1, acc[h][1]);
                }
            }
            for (h, acc) in acc.iter().enumerate() {
                st(out, h * d + c, acc[0]);
                st(out, h * d + c + 8, acc[1]);
            }
        }
    }
}

/// The safe wrapper of the several-token kernel: `false` (nothing written) for shapes it
/// does not take (as [`attend_group`], or more than `ATTEND_MAX_TOKENS` tokens, a head
/// wider than [`MAX_D`], or a window reaching past the cache's rows).
pub(super) fn attend_tokens(a: &AttnTokens<'_>, out: &mut [&mut [f32]]) -> bool {
    if !a.fits(out, 16, MAX_D, MAX_G) {
        return false;
    }
    if !super::super::rows_attention() {
        // SAFETY: as in `attend_group`; the bounds are checked above.
        unsafe { super::attn_tiles::tokens(a, out) };
        return true;
    }
    // SAFETY: as in `attend_group`; the bounds are checked above.
    unsafe {
        match a.n_heads {
            1 => tokens::<1>(a, out),
            2 => tokens::<2>(a, out),
            3 => tokens::<3>(a, out),
            4 => tokens::<4>(a, out),
            5 => tokens::<5>(a, out),
            6 => tokens::<6>(a, out),
            7 => tokens::<7>(a, out),
            _ => tokens::<8>(a, out),
        }
    }
    true
}

/// Online softmax over blocks of 8 positions, as `avx512/float.rs`'s `tokens` (learned from
/// the FlashAttention papers and ggml's `ggml_compute_forward_flash_attn_ext_f16` in
/// `ggml-cpu/ops.cpp`, restated): per query row a running max m, sum l and output o; per
/// block, scores s, `m' = max(m, max s)`, `o ← o·e^(m−m') + Σ e^(s−m')·v`,
/// `l ← l·e^(m−m') + Σ e^(s−m')`; at the end `o / l`. The block's K and V rows are copied
/// together first (in the cache they are a whole KV row apart, so they would share L1 sets).
#[target_feature(enable = "avx2,fma,f16c")]
fn tokens<const G: usize>(a: &AttnTokens<'_>, out: &mut [&mut [f32]]) {
    const TM: usize = Kernels::ATTEND_MAX_TOKENS;
    let (d, row, cap, off, nt) = (a.d, a.row, a.cap, a.off, a.n_tokens);
    let scale = _mm256_set1_ps(1.0 / (d as f32).sqrt());
    let first = |t: usize| (a.pos0 + t + 1).saturating_sub(a.window);
    let (start, end) = (first(0), a.pos0 + nt); // positions start..end, end exclusive
    let base = |j: usize| (j % cap) * row + off;
    let mut m = [[f32::NEG_INFINITY; G]; TM];
    let mut l = [[0.0f32; G]; TM];
    for o in out[..nt].iter_mut() {
        o[..G * d].fill(0.0);
    }
    let mut kbuf = [0.0f32; 8 * MAX_D];
    let mut vbuf = [0.0f32; 8 * MAX_D];
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    for j0 in (start..end).step_by(8) {
        let len = 8.min(end - j0);
        // Rows past the block repeat its first (masked off below).
        for i in 0..8 {
            let b = base(if i < len { j0 + i } else { j0 });
            kbuf[i * d..(i + 1) * d].copy_from_slice(&a.kc[b..b + d]);
            vbuf[i * d..(i + 1) * d].copy_from_slice(&a.vc[b..b + d]);
        }
        if j0 + 8 < end {
            for i in 0..8.min(end - j0 - 8) {
                let b = base(j0 + 8 + i);
                prefetch_row(&a.kc[b..b + d]);
                prefetch_row(&a.vc[b..b + d]);
            }
        }
        let kb: [usize; 8] = core::array::from_fn(|i| i * d);
        let (kp, vbuf) = (kbuf.as_ptr(), &vbuf);
        for t in 0..nt {
            let (f, p) = (first(t), a.pos0 + t);
            // Lanes i with f ≤ j0 + i ≤ p (and i < len).
            let lo = f.saturating_sub(j0).min(8);
            let hi = (p + 1).saturating_sub(j0).min(len);
            if lo >= hi {
                continue;
            }
            let mask = lanes(lo, hi);
            for h in 0..G {
                let qh = &a.q[t * a.q_stride + h * d..t * a.q_stride + (h + 1) * d];
                // SAFETY: kb[i] + d ≤ 8·d ≤ kbuf.len() (d ≤ MAX_D, checked by the wrapper);
                // nothing writes `kbuf` while `kp` is used.
                let raw = unsafe { scores8(qh, kp, &kb, d) };
                let s = _mm256_blendv_ps(neg_inf, _mm256_mul_ps(raw, scale), mask);
                let m_new = m[t][h].max(hmax(s));
                let alpha = _mm256_cvtss_f32(exp_ps(_mm256_set1_ps(m[t][h] - m_new)));
                let pv = exp_ps(_mm256_sub_ps(s, _mm256_set1_ps(m_new)));
                l[t][h] = l[t][h] * alpha + hsum(pv);
                m[t][h] = m_new;
                let mut pw = [0.0f32; 8];
                st(&mut pw, 0, pv);
                let alpha = _mm256_set1_ps(alpha);
                let o = &mut out[t][h * d..(h + 1) * d];
                // 16 columns at a time, the positions split over four independent sums per
                // 8 columns (one FMA chain would wait on its own latency).
                for c in (0..d).step_by(16) {
                    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
                    acc[0] = [
                        _mm256_mul_ps(ld(o, c), alpha),
                        _mm256_mul_ps(ld(o, c + 8), alpha),
                    ];
                    let mut i = lo;
                    while i < hi {
                        let n4 = 4.min(hi - i);
                        for (k, acc) in acc[..n4].iter_mut().enumerate() {
                            let p = _mm256_set1_ps(pw[i + k]);
                            let vb = kb[i + k] + c;
                            acc[0] = _mm256_fmadd_ps(p, ld(vbuf, vb), acc[0]);
                            acc[1] = _mm256_fmadd_ps(p, ld(vbuf, vb + 8), acc[1]);
                        }
                        i += n4;
                    }
                    for k in 0..2 {
                        let sum = _mm256_add_ps(
                            _mm256_add_ps(acc[0][k], acc[1][k]),
                            _mm256_add_ps(acc[2][k], acc[3][k]),
                        );
                        st(o, c + 8 * k, sum);
                    }
                }
            }
        }
    }
    for t in 0..nt {
        for h in 0..G {
            let inv = _mm256_set1_ps(l[t][h]);
            let o = &mut out[t][h * d..(h + 1) * d];
            for c in (0..d).step_by(8) {
                st(o, c, _mm256_div_ps(ld(o, c), inv));
            }
        }
    }
}
