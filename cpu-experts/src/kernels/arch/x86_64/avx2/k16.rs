//! Q6_K, Q3_K and Q2_K (16 sub-blocks of 16) × Q8_K activations.
//!
//! All three store 32-element planes: plane g (0..4) of half n (0..2) holds elements
//! `128n + 32g + l` for byte l, i.e. sub-blocks `8n + 2g` (l < 16) and `8n + 2g + 1`. The
//! quants are made unsigned (Q6_K: q + 32 in 0..63, Q3_K: q + 4 in 0..7, Q2_K: already
//! 0..3) so `maddubs` takes them directly; the offset comes back through the activation's
//! per-16 sums: `Σ_j sc_j·Σ (u − off)·q_a = Σ_j sc_j·Σ u·q_a − off·Σ_j sc_j·bsums_j`.
//!
//! Scalar, per super-block: `sumf += (d_a·d)·Σ_j sc_j·Σ_{16} q·q_a − (d_a·dmin)·Σ_j m_j·bsums_j`
//! (the min term for Q2_K only).

use core::arch::x86_64::*;

use super::{at, f16_at, hsum_ps, ld128, ld256, multi_n, q8k_rows, wrap};
use crate::kernels::act::Q8KAct;
use crate::kernels::scalar::blocks;

/// `Σ u·q_a` of one 32-element plane weighted by the scales of sub-blocks k and k + 1:
/// 8 i32 lanes (lanes 0-3 from sub-block k, 4-7 from k + 1). `sc8` holds the 16 signed
/// sub-block scales as bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn plane(u: __m256i, qa: &[i8; 32], sc8: __m128i, k: usize) -> __m256i {
    plane_dot(u, qa, plane_scales(sc8, k))
}

/// The i16 weights of [`plane`]: sub-block k's scale in words 0-7, k + 1's in 8-15.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn plane_scales(sc8: __m128i, k: usize) -> __m256i {
    let rep = 0x0101_0101_0101_0101u64;
    let mask = _mm_set_epi64x((rep * (k as u64 + 1)) as i64, (rep * k as u64) as i64);
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, mask))
}

/// [`plane`] with its scales `sc` from [`plane_scales`] (shared by a block's tokens).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn plane_dot(u: __m256i, qa: &[i8; 32], sc: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, ld256(qa)), sc)
}

/// `Σ_j sc_j · bsums_j` (signed scales) as 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn scaled_bsums(sc8: __m128i, bsums: &[[u8; 2]; 16]) -> __m256i {
    let bs = ld256(&bsums.as_flattened().as_chunks::<32>().0[0]);
    _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), bs)
}

wrap!(vec_dot_q6k_q8k => q6k_q8k(w: &[u8], a: &[u8], n: usize) -> f32);
wrap!(vec_dot_q3k_q8k => q3k_q8k(w: &[u8], a: &[u8], n: usize) -> f32);
wrap!(vec_dot_q2k_q8k => q2k_q8k(w: &[u8], a: &[u8], n: usize) -> f32);

/// Q6_K × Q8_K. Block (210 B): `[0..128) ql | [128..192) qh | [192..208) scales:i8 |
/// [208..210) d`. Half n: Q0 = ql[64n..+32], Q1 = ql[64n+32..+32], H = qh[32n..+32];
/// plane 0 = Q0 low | (H bits 0-1) << 4, plane 1 = Q1 low | (H bits 2-3) << 4,
/// plane 2 = Q0 high | (H bits 4-5) << 4, plane 3 = Q1 high | (H bits 6-7) << 4; q = u − 32.
#[target_feature(enable = "avx2,fma,f16c")]
fn q6k_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (Some(a), Some(wb)) = (Q8KAct::new(a, n), blocks::<210>(w, n / 256)) else {
        return f32::NAN;
    };
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(0x30);
    let mut acc = [_mm256_setzero_ps(); 2];
    let bsums = a.bsums.as_chunks::<16>().0;
    for (b, ((blk, qa), bs)) in wb
        .iter()
        .zip(a.qs.as_chunks::<256>().0)
        .zip(bsums)
        .enumerate()
    {
        let sc8 = ld128(at::<u8, 192, 16, 210>(blk));
        let qa = qa.as_chunks::<32>().0;
        let ql = at::<u8, 0, 128, 210>(blk).as_chunks::<32>().0;
        let qh = at::<u8, 128, 64, 210>(blk).as_chunks::<32>().0;
        let mut sumi = [_mm256_setzero_si256(); 2];
        for h in 0..2 {
            let (q0, q1, hb) = (ld256(&ql[2 * h]), ld256(&ql[2 * h + 1]), ld256(&qh[h]));
            let u = [
                _mm256_or_si256(
                    _mm256_and_si256(q0, m4),
                    _mm256_and_si256(_mm256_slli_epi16::<4>(hb), m2),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(q1, m4),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(hb), m2),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(q0), m4),
                    _mm256_and_si256(hb, m2),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(q1), m4),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(hb), m2),
                ),
            ];
            for g in 0..4 {
                let p = plane(u[g], &qa[4 * h + g], sc8, 8 * h + 2 * g);
                sumi[g & 1] = _mm256_add_epi32(sumi[g & 1], p);
            }
        }
        let corr = _mm256_slli_epi32::<5>(scaled_bsums(sc8, bs)); // 32·Σ sc·bsums
        let s = _mm256_sub_epi32(_mm256_add_epi32(sumi[0], sumi[1]), corr);
        let d = _mm256_set1_ps(a.d(b) * f16_at::<208, 210>(blk));
        acc[b & 1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[b & 1]);
    }
    hsum_ps(_mm256_add_ps(acc[0], acc[1]))
}

/// The 16 Q3_K scales (biased by 32, 0..63) from 12 packed bytes: sub-block j takes its low
/// 4 bits from byte j (j < 8, low nibble) or j − 8 (high nibble), and its top 2 bits from
/// byte 8 + j%4 at bit 2·(j/4). Done on u32 words, four scales at a time.
#[inline(always)]
fn q3k_scales_biased(s: &[u8; 12]) -> [u8; 16] {
    let u = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (u0, u1, u2) = (u(0), u(1), u(2));
    let (m4, m2) = (0x0F0F_0F0Fu32, 0x0303_0303u32);
    let w = [
        (u0 & m4) | (u2 & m2) << 4,
        (u1 & m4) | ((u2 >> 2) & m2) << 4,
        ((u0 >> 4) & m4) | ((u2 >> 4) & m2) << 4,
        ((u1 >> 4) & m4) | ((u2 >> 6) & m2) << 4,
    ];
    let mut out = [0u8; 16];
    for (o, w) in out.as_chunks_mut::<4>().0.iter_mut().zip(w) {
        *o = w.to_le_bytes();
    }
    out
}

/// Q3_K × Q8_K (one token): [`q3k_q8k_n`] for N = 1.
#[target_feature(enable = "avx2,fma,f16c")]
fn q3k_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    q3k_q8k_n(w, [a], n)[0]
}

/// Q2_K × Q8_K (one token): [`q2k_q8k_n`] for N = 1.
#[target_feature(enable = "avx2,fma,f16c")]
fn q2k_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    q2k_q8k_n(w, [a], n)[0]
}

/// Q3_K × Q8_K against N activation rows. Block (110 B): `[0..32) hmask | [32..96) qs |
/// [96..108) scales | [108..110) d`. Plane k of half n: low 2 bits `(qs[32n + l] >> 2k) & 3`,
/// bit 2 = hmask[l] bit `4n + k` (set = no −4), so u = q + 4 in 0..7. Each super-block's
/// planes and scales are unpacked once for every token; per token the f32 operations and
/// their order are those of N = 1 (super-block b into accumulator b & 1), so every token's
/// result is the one-token kernel's bits.
#[target_feature(enable = "avx2,fma,f16c")]
fn q3k_q8k_n<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
    let Some(wb) = blocks::<110>(w, n / 256) else {
        return [f32::NAN; N];
    };
    let a = match q8k_rows(acts, n, |a| q3k_q8k(w, a, n)) {
        Ok(a) => a,
        Err(v) => return v,
    };
    let m3 = _mm256_set1_epi8(3);
    let m1 = _mm256_set1_epi8(1);
    let mut acc = [[_mm256_setzero_ps(); 2]; N];
    for (b, blk) in wb.iter().enumerate() {
        let scb = q3k_scales_biased(at::<u8, 96, 12, 110>(blk));
        let sc8 = _mm_sub_epi8(ld128(&scb), _mm_set1_epi8(32));
        let qs = at::<u8, 32, 64, 110>(blk).as_chunks::<32>().0;
        let hm = ld256(at::<u8, 0, 32, 110>(blk));
        let mut sumi = [_mm256_setzero_si256(); N];
        for h in 0..2 {
            let q = ld256(&qs[h]);
            for k in 0..4 {
                let low =
                    _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * k as i32)), m3);
                let hi = _mm256_and_si256(
                    _mm256_srl_epi16(hm, _mm_cvtsi32_si128((4 * h + k) as i32)),
                    m1,
                );
                let u = _mm256_or_si256(low, _mm256_slli_epi16::<2>(hi));
                let sc = plane_scales(sc8, 8 * h + 2 * k);
                for t in 0..N {
                    let qa = &a[t].qs.as_chunks::<32>().0[8 * b + 4 * h + k];
                    sumi[t] = _mm256_add_epi32(sumi[t], plane_dot(u, qa, sc));
                }
            }
        }
        let dw = f16_at::<108, 110>(blk);
        for t in 0..N {
            let bs = &a[t].bsums.as_chunks::<16>().0[b];
            let corr = _mm256_slli_epi32::<2>(scaled_bsums(sc8, bs)); // 4·Σ sc·bsums
            let s = _mm256_sub_epi32(sumi[t], corr);
            let d = _mm256_set1_ps(a[t].d(b) * dw);
            acc[t][b & 1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[t][b & 1]);
        }
    }
    acc.map(|a| hsum_ps(_mm256_add_ps(a[0], a[1])))
}

/// Q2_K × Q8_K against N activation rows. Block (84 B): `[0..16) scales (low nibble scale,
/// high nibble min) | [16..80) qs | [80..82) d | [82..84) dmin`. Plane k of half n:
/// `(qs[32n + l] >> 2k) & 3`. Unpacked once per super-block for every token; each token's
/// f32 operations are those of N = 1.
#[target_feature(enable = "avx2,fma,f16c")]
fn q2k_q8k_n<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
    let Some(wb) = blocks::<84>(w, n / 256) else {
        return [f32::NAN; N];
    };
    let a = match q8k_rows(acts, n, |a| q2k_q8k(w, a, n)) {
        Ok(a) => a,
        Err(v) => return v,
    };
    let m3 = _mm256_set1_epi8(3);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut accm = [_mm256_setzero_ps(); N];
    for (b, blk) in wb.iter().enumerate() {
        let raw = ld128(at::<u8, 0, 16, 84>(blk));
        let sc8 = _mm_and_si128(raw, _mm_set1_epi8(0x0F));
        let mins8 = _mm_and_si128(_mm_srli_epi16::<4>(raw), _mm_set1_epi8(0x0F));
        let qs = at::<u8, 16, 64, 84>(blk).as_chunks::<32>().0;
        let mut sumi = [_mm256_setzero_si256(); N];
        for h in 0..2 {
            let q = ld256(&qs[h]);
            let u = [
                _mm256_and_si256(q, m3),
                _mm256_and_si256(_mm256_srli_epi16::<2>(q), m3),
                _mm256_and_si256(_mm256_srli_epi16::<4>(q), m3),
                _mm256_and_si256(_mm256_srli_epi16::<6>(q), m3),
            ];
            for (k, &u) in u.iter().enumerate() {
                let sc = plane_scales(sc8, 8 * h + 2 * k);
                for t in 0..N {
                    let qa = &a[t].qs.as_chunks::<32>().0[8 * b + 4 * h + k];
                    sumi[t] = _mm256_add_epi32(sumi[t], plane_dot(u, qa, sc));
                }
            }
        }
        let (dw, dmw) = (f16_at::<80, 84>(blk), f16_at::<82, 84>(blk));
        for t in 0..N {
            let da = a[t].d(b);
            let d = _mm256_set1_ps(da * dw);
            let dmin = _mm256_set1_ps(da * dmw);
            // Mins are 0..15, so the signed widening is exact.
            let summ = scaled_bsums(mins8, &a[t].bsums.as_chunks::<16>().0[b]);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            accm[t] = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(summ), accm[t]);
        }
    }
    core::array::from_fn(|t| hsum_ps(acc[t]) - hsum_ps(accm[t]))
}

// Q3_K and Q2_K × Q8_K for up to 4 tokens at once (`out[t] = w · acts[t]`).
multi_n!(vec_dot_q3k_q8k_multi => q3k_q8k_n);
multi_n!(vec_dot_q2k_q8k_multi => q2k_q8k_n);

// Q6_K × Q8_K for up to 4 tokens at once (`out[t] = w · acts[t]`); see [`q6k_q8k_n`].
multi_n!(vec_dot_q6k_q8k_multi => q6k_q8k_n);

/// Q6_K × Q8_K against N activation rows: each super-block's planes and scales are unpacked
/// once and dotted with every token. Per token, the f32 operations and their order are
/// those of [`q6k_q8k`] (only exact i32 sums are grouped differently), so each result is
/// bit-identical to the one-row kernel.
#[target_feature(enable = "avx2,fma,f16c")]
fn q6k_q8k_n<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
    let acts_q = acts.map(|a| Q8KAct::new(a, n));
    let (Some(wb), true) = (
        blocks::<210>(w, n / 256),
        acts_q.iter().all(Option::is_some),
    ) else {
        return acts.map(|a| q6k_q8k(w, a, n));
    };
    let a = acts_q.map(|a| a.unwrap_or_else(|| unreachable!()));
    let qa = a.map(|a| a.qs.as_chunks::<256>().0);
    let bsums = a.map(|a| a.bsums.as_chunks::<16>().0);
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(0x30);
    let mut acc = [[_mm256_setzero_ps(); 2]; N];
    // Super-block b into accumulator b & 1 of every token.
    let mut step = |b: usize, blk: &[u8; 210], h1: usize| {
        let sc8 = ld128(at::<u8, 192, 16, 210>(blk));
        let ql = at::<u8, 0, 128, 210>(blk).as_chunks::<32>().0;
        let qh = at::<u8, 128, 64, 210>(blk).as_chunks::<32>().0;
        let mut sumi = [_mm256_setzero_si256(); N];
        for h in 0..2 {
            let (q0, q1, hb) = (ld256(&ql[2 * h]), ld256(&ql[2 * h + 1]), ld256(&qh[h]));
            let u = [
                _mm256_or_si256(
                    _mm256_and_si256(q0, m4),
                    _mm256_and_si256(_mm256_slli_epi16::<4>(hb), m2),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(q1, m4),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(hb), m2),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(q0), m4),
                    _mm256_and_si256(hb, m2),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(q1), m4),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(hb), m2),
                ),
            ];
            for (g, &u) in u.iter().enumerate() {
                let sc = plane_scales(sc8, 8 * h + 2 * g);
                for t in 0..N {
                    let q = qa[t][b].as_chunks::<32>().0;
                    sumi[t] = _mm256_add_epi32(sumi[t], plane_dot(u, &q[4 * h + g], sc));
                }
            }
        }
        let dw = f16_at::<208, 210>(blk);
        for t in 0..N {
            let corr = _mm256_slli_epi32::<5>(scaled_bsums(sc8, &bsums[t][b]));
            let s = _mm256_sub_epi32(sumi[t], corr);
            let d = _mm256_set1_ps(a[t].d(b) * dw);
            acc[t][h1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[t][h1]);
        }
    };
    let (wp, wt) = wb.as_chunks::<2>();
    for (k, w2) in wp.iter().enumerate() {
        step(2 * k, &w2[0], 0);
        step(2 * k + 1, &w2[1], 1);
    }
    if let [blk] = wt {
        step(wb.len() - 1, blk, 0);
    }
    core::array::from_fn(|t| hsum_ps(_mm256_add_ps(acc[t][0], acc[t][1])))
}
