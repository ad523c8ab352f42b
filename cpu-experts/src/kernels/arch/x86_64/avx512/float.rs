//! f32 attention on 512 bits: the query heads that share one KV head, for one token.
//!
//! Scalar, per query head h of the group and position j in `first..=pos`:
//! `s[h,j] = (q_h · k_j)·scale`, `p[h,j] = exp(s[h,j] − max_j s[h,·]) / Σ_j exp(..)`,
//! `o_h = Σ_j p[h,j]·v_j` (keys in ascending position order).
//!
//! Every K and V row is read once for the whole group instead of once per head (grouped
//! query attention shares them across `n_q / n_kv` heads; ggml's flash-attention CPU path
//! in `ggml-cpu/ops.cpp` also walks K/V once per group of query rows). The PV sum keeps the
//! group's outputs in registers over 32 columns at a time. Each (token, head) result is one
//! fixed sequence of operations: deterministic for any thread count; it differs from the
//! reference attention by rounding only (FMA, 16-lane partial dot products).

use core::arch::x86_64::*;

use crate::kernels::{AttnGroup, AttnTokens};

/// Most query heads per call (the PV accumulators: 2 registers per head).
const MAX_G: usize = crate::kernels::Kernels::ATTEND_MAX_HEADS;

/// Widest head [`attend_tokens`] takes (its block copies are `16·MAX_D` floats each).
pub(super) const MAX_D: usize = 256;

/// Positions per PV block: 32 V rows of a 128-wide head are 16 KiB.
const PV_BLOCK: usize = 32;

/// The safe wrapper: `false` (nothing written) for shapes it does not take (head width not
/// a multiple of 32, more than [`MAX_G`] heads, short buffers).
pub(super) fn attend_group(a: &AttnGroup<'_>, scores: &mut [f32], out: &mut [f32]) -> bool {
    let Some(n) = a.checked(scores, out, 32, MAX_G) else {
        return false;
    };
    let g = a.n_heads;
    // SAFETY: the kernels only need the features `Avx512Vnni::detect` checks. This wrapper is
    // reachable only through the table built by `avx512::table`, which requires an
    // `Avx512Vnni` token. The bounds they index with are checked above.
    unsafe {
        match g {
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

/// 16 f32 from `x[i..i + 16]` (bounds checked).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn ld(x: &[f32], i: usize) -> __m512 {
    let c: &[f32; 16] = x[i..i + 16].try_into().unwrap_or_else(|_| unreachable!());
    // SAFETY: `c` is 16 readable f32; `loadu` accepts any alignment.
    unsafe { _mm512_loadu_ps(c.as_ptr()) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn group<const G: usize>(a: &AttnGroup<'_>, n: usize, scores: &mut [f32], out: &mut [f32]) {
    let (d, row, cap, off, first) = (a.d, a.row, a.cap, a.off, a.first);
    let scale = 1.0 / (d as f32).sqrt();
    let base = |j: usize| ((first + j) % cap) * row + off;
    // Scores, 16 positions at a time per head: 16 accumulators, then one transposing
    // reduction (the block's K rows stay in L1 across the G heads); the tail one by one.
    let full = n / 16 * 16;
    let mut maxv = [_mm512_set1_ps(f32::NEG_INFINITY); G];
    let scale_v = _mm512_set1_ps(scale);
    let kp = a.kc.as_ptr();
    for j0 in (0..full).step_by(16) {
        let kb: [usize; 16] = core::array::from_fn(|i| base(j0 + i));
        // With whole KV rows (n_kv·d floats a position) each position's head is in its own
        // page, which the hardware prefetchers do not cross: ask for the next block's K rows
        // now. (The session's cache is head-major, kv.rs, where they are back to back.)
        if j0 + 32 <= n {
            for i in 0..16 {
                prefetch_row(&a.kc[base(j0 + 16 + i)..][..d]);
            }
        }
        for h in 0..G {
            let qh = &a.q[h * d..(h + 1) * d];
            let mut acc = [_mm512_setzero_ps(); 16];
            for c in (0..d).step_by(16) {
                let qv = ld(qh, c);
                for i in 0..16 {
                    // SAFETY: kb[i] + c + 16 ≤ (cap − 1)·row + off + d ≤ cap·row ≤ kc.len()
                    // (checked by the wrapper; c + 16 ≤ d).
                    let kv = unsafe { _mm512_loadu_ps(kp.add(kb[i] + c)) };
                    acc[i] = _mm512_fmadd_ps(qv, kv, acc[i]);
                }
            }
            let s = _mm512_mul_ps(reduce16(acc), scale_v);
            let dst: &mut [f32; 16] = (&mut scores[h * n + j0..h * n + j0 + 16])
                .try_into()
                .unwrap_or_else(|_| unreachable!());
            // SAFETY: `dst` is 16 writable f32; `storeu` accepts any alignment.
            unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), s) };
            maxv[h] = _mm512_max_ps(maxv[h], s);
        }
    }
    let mut max: [f32; G] = core::array::from_fn(|h| _mm512_reduce_max_ps(maxv[h]));
    for j in full..n {
        let kb = base(j);
        let k = &a.kc[kb..kb + d];
        for h in 0..G {
            let qh = &a.q[h * d..(h + 1) * d];
            let mut acc = _mm512_mul_ps(ld(qh, 0), ld(k, 0));
            for c in (16..d).step_by(16) {
                acc = _mm512_fmadd_ps(ld(qh, c), ld(k, c), acc);
            }
            let s = _mm512_reduce_add_ps(acc) * scale;
            scores[h * n + j] = s;
            max[h] = max[h].max(s);
        }
    }
    // Softmax weights in place, 16 at a time (the tail under a lane mask).
    for h in 0..G {
        let s = &mut scores[h * n..(h + 1) * n];
        let mx = _mm512_set1_ps(max[h]);
        let mut sum = _mm512_setzero_ps();
        for c in s.chunks_mut(16) {
            let m: __mmask16 = ((1u32 << c.len()) - 1) as u16;
            // SAFETY: lanes under `m` are the c.len() ≤ 16 elements of `c`; masked-off lanes
            // are neither read nor written.
            unsafe {
                let x = _mm512_maskz_loadu_ps(m, c.as_ptr());
                let e = exp_ps(_mm512_sub_ps(x, mx));
                _mm512_mask_storeu_ps(c.as_mut_ptr(), m, e);
                sum = _mm512_mask_add_ps(sum, m, sum, e);
            }
        }
        let sum = _mm512_set1_ps(_mm512_reduce_add_ps(sum));
        for c in s.chunks_mut(16) {
            let m: __mmask16 = ((1u32 << c.len()) - 1) as u16;
            // SAFETY: as above.
            unsafe {
                let x = _mm512_maskz_loadu_ps(m, c.as_ptr());
                _mm512_mask_storeu_ps(c.as_mut_ptr(), m, _mm512_div_ps(x, sum));
            }
        }
    }
    // PV: 32 output columns of all G heads in registers; positions in blocks of
    // `PV_BLOCK` so that a block's V rows stay in L1 across the column passes (the running
    // sums go through `out` between blocks, the order of additions is unchanged).
    for jb in (0..n).step_by(PV_BLOCK) {
        let je = n.min(jb + PV_BLOCK);
        for j in jb..je {
            prefetch_row(&a.vc[base(j)..][..d]);
        }
        for c in (0..d).step_by(32) {
            let mut acc = [[_mm512_setzero_ps(); 2]; G];
            if jb > 0 {
                for (h, acc) in acc.iter_mut().enumerate() {
                    *acc = [ld(out, h * d + c), ld(out, h * d + c + 16)];
                }
            }
            for j in jb..je {
                let vb = base(j) + c;
                let (v0, v1) = (ld(a.vc, vb), ld(a.vc, vb + 16));
                for h in 0..G {
                    let p = _mm512_set1_ps(scores[h * n + j]);
                    acc[h][0] = _mm512_fmadd_ps(p, v0, acc[h][0]);
                    acc[h][1] = _mm512_fmadd_ps(p, v1, acc[h][1]);
                }
            }
            for h in 0..G {
                let o: &mut [f32; 32] = (&mut out[h * d + c..h * d + c + 32])
                    .try_into()
                    .unwrap_or_else(|_| unreachable!());
                // SAFETY: `o` is 32 writable f32; `storeu` accepts any alignment.
                unsafe {
                    _mm512_storeu_ps(o.as_mut_ptr(), acc[h][0]);
                    _mm512_storeu_ps(o.as_mut_ptr().add(16), acc[h][1]);
                }
            }
        }
    }
}

/// `e^x` per lane, within about 2 ulp for the x ≤ 0 that softmax feeds it (−inf gives 0,
/// NaN stays NaN): `x = k·ln2 + r` with |r| ≤ ln2/2 (ln2 split in two for an exact
/// product), a degree-6 Taylor polynomial for `e^r` (truncation below 2⁻²³ there), then
/// `vscalefps` multiplies by 2^k, going to 0 (through subnormals) below −87.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn exp_ps(x: __m512) -> __m512 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Below −104 the result is 0 after scaling. `vmaxps` returns its second operand when
    // one is NaN, so a NaN x passes through.
    let x = _mm512_max_ps(_mm512_set1_ps(-104.0), x);
    let k = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(core::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(k, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(k, _mm512_set1_ps(LN2_LO), r);
    let c = |v: f32| _mm512_set1_ps(v);
    let mut p = c(1.0 / 720.0);
    p = _mm512_fmadd_ps(p, r, c(1.0 / 120.0));
    p = _mm512_fmadd_ps(p, r, c(1.0 / 24.0));
    p = _mm512_fmadd_ps(p, r, c(1.0 / 6.0));
    p = _mm512_fmadd_ps(p, r, c(0.5));
    p = _mm512_fmadd_ps(p, r, c(1.0));
    p = _mm512_fmadd_ps(p, r, c(1.0));
    _mm512_scalef_ps(p, k)
}

/// `prefetcht0` on every 64-byte line of `x`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn prefetch_row(x: &[f32]) {
    for line in x.chunks(16) {
        _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast());
    }
}

/// Lane i of the result is the sum of the 16 lanes of `a[i]`: pairs of registers are
/// interleaved and added until one register is left (45 operations for 16 sums instead of
/// 16 horizontal reductions).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn reduce16(a: [__m512; 16]) -> __m512 {
    // Per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] of the pair (a, b).
    let l1: [__m512; 8] = core::array::from_fn(|i| {
        let (x, y) = (a[2 * i], a[2 * i + 1]);
        _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y))
    });
    // Per 128-bit lane: the lane's sums of a[4i..4i + 4].
    let l2: [__m512; 4] = core::array::from_fn(|i| {
        let (x, y) = (l1[2 * i], l1[2 * i + 1]);
        _mm512_add_ps(
            _mm512_shuffle_ps::<0x44>(x, y),
            _mm512_shuffle_ps::<0xEE>(x, y),
        )
    });
    // Across 128-bit lanes: [x.L0+x.L1, x.L2+x.L3, y.L0+y.L1, y.L2+y.L3].
    let pair = |x: __m512, y: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
        )
    };
    pair(pair(l2[0], l2[1]), pair(l2[2], l2[3]))
}

/// The safe wrapper of the several-token kernel: `false` (nothing written) for shapes it
/// does not take (as [`attend_group`], or more than `ATTEND_MAX_TOKENS` tokens, or a
/// window reaching past the cache's rows).
pub(super) fn attend_tokens(a: &AttnTokens<'_>, out: &mut [&mut [f32]]) -> bool {
    if !a.fits(out, 32, MAX_D, MAX_G) {
        return false;
    }
    let g = a.n_heads;
    if !super::super::rows_attention() {
        // SAFETY: as in `attend_group`; the bounds are checked above.
        unsafe { super::attn_tiles::tokens(a, out) };
        return true;
    }
    // SAFETY: as above.
    unsafe {
        match g {
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

/// Online softmax (learned from the FlashAttention papers and ggml's
/// `ggml_compute_forward_flash_attn_ext_f16` in `ggml-cpu/ops.cpp`, restated): per query
/// row a running max m, sum l and output o; for each block of 16 positions, scores s (one
/// transposing reduction), `m' = max(m, max s)`, `o ← o·e^(m−m') + Σ e^(s−m')·v`,
/// `l ← l·e^(m−m') + Σ e^(s−m')`; at the end `o / l`. The block's K and V rows (16 KiB at
/// d = 128) stay in L1 for every token and head of the call.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tokens<const G: usize>(a: &AttnTokens<'_>, out: &mut [&mut [f32]]) {
    const TM: usize = crate::kernels::Kernels::ATTEND_MAX_TOKENS;
    let (d, row, cap, off, nt) = (a.d, a.row, a.cap, a.off, a.n_tokens);
    let scale = _mm512_set1_ps(1.0 / (d as f32).sqrt());
    let first = |t: usize| (a.pos0 + t + 1).saturating_sub(a.window);
    let (start, end) = (first(0), a.pos0 + nt); // positions start..end, end exclusive
    let base = |j: usize| (j % cap) * row + off;
    let mut m = [[f32::NEG_INFINITY; G]; TM];
    let mut l = [[0.0f32; G]; TM];
    for o in out[..nt].iter_mut() {
        o[..G * d].fill(0.0);
    }
    // The block's K and V rows, copied together: in the cache they are a whole KV row
    // (n_kv·d floats, 4 KiB on XS.2) apart, so 16 of them map to the same L1 sets and
    // evict each other before the next query row can reuse them.
    let mut kbuf = [0.0f32; 16 * MAX_D];
    let mut vbuf = [0.0f32; 16 * MAX_D];
    let (kp, vp) = (kbuf.as_ptr(), vbuf.as_ptr());
    for j0 in (start..end).step_by(16) {
        let len = 16.min(end - j0);
        // Rows past the block repeat its first (masked off below).
        for i in 0..16 {
            let b = base(if i < len { j0 + i } else { j0 });
            kbuf[i * d..(i + 1) * d].copy_from_slice(&a.kc[b..b + d]);
            vbuf[i * d..(i + 1) * d].copy_from_slice(&a.vc[b..b + d]);
        }
        let kb: [usize; 16] = core::array::from_fn(|i| i * d);
        if j0 + 16 < end {
            for i in 0..16.min(end - j0 - 16) {
                let b = base(j0 + 16 + i);
                prefetch_row(&a.kc[b..b + d]);
                prefetch_row(&a.vc[b..b + d]);
            }
        }
        for t in 0..nt {
            let (f, p) = (first(t), a.pos0 + t);
            // Lanes i with f ≤ j0 + i ≤ p (and i < len).
            let lo = f.saturating_sub(j0).min(16);
            let hi = (p + 1).saturating_sub(j0).min(len);
            if lo >= hi {
                continue;
            }
            let mask: __mmask16 = (((1u32 << hi) - 1) & !((1u32 << lo) - 1)) as u16;
            for h in 0..G {
                let qh = &a.q[t * a.q_stride + h * d..t * a.q_stride + (h + 1) * d];
                let mut acc = [_mm512_setzero_ps(); 16];
                for c in (0..d).step_by(16) {
                    let qv = ld(qh, c);
                    for i in 0..16 {
                        // SAFETY: kb[i] + c + 16 ≤ 16·d ≤ kbuf.len() (d ≤ MAX_D, checked by the
                        // wrapper); nothing writes `kbuf` while `kp` is used.
                        let kv = unsafe { _mm512_loadu_ps(kp.add(kb[i] + c)) };
                        acc[i] = _mm512_fmadd_ps(qv, kv, acc[i]);
                    }
                }
                let s = _mm512_mask_mov_ps(
                    _mm512_set1_ps(f32::NEG_INFINITY),
                    mask,
                    _mm512_mul_ps(reduce16(acc), scale),
                );
                let m_new = m[t][h].max(_mm512_reduce_max_ps(s));
                let alpha = exp_ps(_mm512_set1_ps(m[t][h] - m_new));
                let pv = exp_ps(_mm512_sub_ps(s, _mm512_set1_ps(m_new)));
                l[t][h] = l[t][h] * _mm512_cvtss_f32(alpha) + _mm512_reduce_add_ps(pv);
                m[t][h] = m_new;
                let mut pw = [0.0f32; 16];
                // SAFETY: `pw` is 16 writable f32.
                unsafe { _mm512_storeu_ps(pw.as_mut_ptr(), pv) };
                let o = &mut out[t][h * d..(h + 1) * d];
                // 32 columns at a time, the positions split over four independent sums per
                // 16 columns (one FMA chain would wait on its own latency).
                for c in (0..d).step_by(32) {
                    let mut acc = [[_mm512_setzero_ps(); 2]; 4];
                    acc[0] = [
                        _mm512_mul_ps(ld(o, c), alpha),
                        _mm512_mul_ps(ld(o, c + 16), alpha),
                    ];
                    // SAFETY: as for K, for `vbuf` (c + 32 ≤ d).
                    let v = |i: usize, k: usize| unsafe { _mm512_loadu_ps(vp.add(kb[i] + c + k)) };
                    let mut i = lo;
                    while i < hi {
                        let n4 = 4.min(hi - i);
                        for (k, acc) in acc[..n4].iter_mut().enumerate() {
                            let p = _mm512_set1_ps(pw[i + k]);
                            acc[0] = _mm512_fmadd_ps(p, v(i + k, 0), acc[0]);
                            acc[1] = _mm512_fmadd_ps(p, v(i + k, 16), acc[1]);
                        }
                        i += n4;
                    }
                    for (k, dst) in o[c..c + 32].chunks_exact_mut(16).enumerate() {
                        let sum = _mm512_add_ps(
                            _mm512_add_ps(acc[0][k], acc[1][k]),
                            _mm512_add_ps(acc[2][k], acc[3][k]),
                        );
                        // SAFETY: `dst` is 16 writable f32.
                        unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), sum) };
                    }
                }
            }
        }
    }
    for t in 0..nt {
        for h in 0..G {
            let inv = _mm512_set1_ps(l[t][h]);
            let o = &mut out[t][h * d..(h + 1) * d];
            for c in (0..d).step_by(16) {
                let v = _mm512_div_ps(ld(o, c), inv);
                let dst: &mut [f32; 16] = (&mut o[c..c + 16])
                    .try_into()
                    .unwrap_or_else(|_| unreachable!());
                // SAFETY: `dst` is 16 writable f32.
                unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), v) };
            }
        }
    }
}
