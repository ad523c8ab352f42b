//! IQ1_S and IQ1_M × Q8_K on 512 bits with AVX512-VNNI, for one to four or eight tokens.
//!
//! The AVX2 kernels (`avx2::iq`, ggml's construction) build each 8-weight run's grid point,
//! delta and scale on the scalar side and spend ~27 cycles a 32-weight sub-block on this
//! session's Zen 4 VM (XS.2 IQ1_M-like decode 4–6% behind llama.cpp's; BENCHMARKS.md, session
//! 42). Here the scalar side only fetches grid points:
//!
//! - A run's value is `g + δ/8` (g in −1, 0, 1, δ = ±1), so `Σ ls·(8g + δ)·a = 8·sumi + sumi1`
//!   in the scalar reference's terms (`sumi` the grid products, `sumi1` the delta term), and
//!   `(8·sumi + sumi1)/8` is its `sumi + sumi1/8` exactly (both below 2²³ in magnitude, so no
//!   f32 rounding on either side): one product per weight instead of two.
//! - The grid is kept as `8g + 16` (bytes 8, 16, 24, [`GRID8`]); the run's δ is added by one
//!   masked blend and add, so `u = 8g + δ + 16` (7..25) is unsigned for `vpdpbusd`, and
//!   `16·Σ_j ls_j·bsum_j` comes off per super-block (the Q8_K block sums are per 16 weights,
//!   the scale groups of IQ1_M; IQ1_S's 32-weight groups are two of them).
//! - The 32 grid indices of a super-block are computed as one vector (the 8-bit `qs` and the
//!   3-bit high parts from `qh`) and stored; eight scalar loads fill a register of 64 weights
//!   (loads and inserts cost half what `vpgatherdq` does here: `dev/uops.c`).
//! - A dword lane (4 weights) sums at most 4·25·128 in magnitude, an i16, so `vpdpwssd` with
//!   the lanes' scales `2k + 1` (low halves, zero above) adds `ls·Σ u·a` exactly.
//!
//! The block's i32 sum is reduced exactly and the scalar reference's f32 step applied
//! (`acc += (d·d_a)·s`), so every token's result is its bits.
//!
//! Measured (Zen 4 VM, XS.2 8 layers, 2 threads): IQ1_M-like tg128 44.0 → 54.8 t/s, pp512
//! 152 → 194; IQ1_S-like pp512 166 → 185, its one-token kernel left on AVX2 (52.3 against
//! 50.6 t/s here: IQ1_S's scalar side was already light).

use core::arch::x86_64::*;

use lagoon_core::quant::tables::IQ1S_GRID;

use super::{fold256, ld512, wrap_n};
use crate::kernels::act::Q8KAct;
use crate::kernels::arch::x86_64::avx2::{at, f16_at, ld128, ld256, q8k_rows};
use crate::kernels::scalar::{blocks, f16_to_f32};

/// The IQ1 grid as `8g + 16` per byte (8, 16, 24 for −1, 0, 1).
static GRID8: [u64; 2048] = grid8();

const fn grid8() -> [u64; 2048] {
    let mut t = [0u64; 2048];
    let mut e = 0;
    while e < 2048 {
        let b = IQ1S_GRID[e].to_le_bytes();
        let mut v = 0u64;
        let mut k = 0;
        while k < 8 {
            v |= ((8 * (b[k] as i8 as i32) + 16) as u64 & 0xFF) << (8 * k);
            k += 1;
        }
        t[e] = v;
        e += 1;
    }
    t
}

wrap_n!(vec_dot_iq1_m_q8k, vec_dot_iq1_m_q8k_multi => 8; iq1_m_n);
// IQ1_S: the several-token wrapper only (one token stays on the AVX2 kernel, `super::table`).
wrap_n!(multi vec_dot_iq1_s_q8k_multi => 8; iq1_s_n);

/// Eight grid points `GRID8[idx[0..8]]` as one register (qword j = point j).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn points(idx: &[u16; 8]) -> __m512i {
    let g = |j: usize| GRID8[usize::from(idx[j] & 0x7FF)] as i64;
    _mm512_set_epi64(g(7), g(6), g(5), g(4), g(3), g(2), g(1), g(0))
}

/// The shared per-super-block work of both types for N tokens: the 32 indices `idx`, the
/// delta mask `neg` (bit r: run r's δ is −1), the 16 scale groups' `2k + 1` (`ls16`, i16
/// lanes), then the exact i32 sum per token and the scalar reference's f32 step into `acc`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn block_n<const N: usize>(
    idx: &[u16; 32],
    neg: u32,
    ls16: __m256i,
    a: &[Q8KAct<'_>; N],
    b: usize,
    dw: f32,
    acc: &mut [f32; N],
) {
    let plus = _mm512_set1_epi8(1);
    let minus = _mm512_set1_epi8(-1);
    let ls32 = _mm512_cvtepu16_epi32(ls16);
    let mut s = [_mm512_setzero_si512(); N];
    for m in 0..4 {
        let g = points(idx[8 * m..][..8].try_into().unwrap());
        let d = _mm512_mask_blend_epi64((neg >> (8 * m)) as u8, plus, minus);
        let u = _mm512_add_epi8(g, d);
        // Dword i (weights 64m + 4i..) is in scale group 4m + i/4.
        let pick = _mm512_set_epi32(
            4 * m as i32 + 3,
            4 * m as i32 + 3,
            4 * m as i32 + 3,
            4 * m as i32 + 3,
            4 * m as i32 + 2,
            4 * m as i32 + 2,
            4 * m as i32 + 2,
            4 * m as i32 + 2,
            4 * m as i32 + 1,
            4 * m as i32 + 1,
            4 * m as i32 + 1,
            4 * m as i32 + 1,
            4 * m as i32,
            4 * m as i32,
            4 * m as i32,
            4 * m as i32,
        );
        let ls = _mm512_permutexvar_epi32(pick, ls32);
        for t in 0..N {
            let y = ld512(&a[t].qs.as_chunks::<64>().0[4 * b + m]);
            let lanes = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, y);
            s[t] = _mm512_dpwssd_epi32(s[t], lanes, ls);
        }
    }
    for t in 0..N {
        // 16·Σ_j ls_j·bsum_j: the +16 of every u.
        let bs = ld256(
            a[t].bsums.as_flattened()[32 * b..][..32]
                .try_into()
                .unwrap(),
        );
        let corr = _mm256_slli_epi32::<4>(_mm256_madd_epi16(ls16, bs));
        let v = _mm256_sub_epi32(fold256(s[t]), corr);
        let v = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b01_00_11_10>(v));
        let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b10_11_00_01>(v));
        // (8·sumi + sumi1)/8, exact; then the scalar's acc += (d·d_a)·s.
        let sf = _mm_cvtsi128_si32(v) as f32 * 0.125;
        acc[t] += (dw * a[t].d(b)) * sf;
    }
}

/// The super-block loop: `$prep` computes block b + 1's indices (stored into the other of two
/// buffers), delta mask, scales and `d` before block b's grid loads read its own buffer, so
/// that the loads never wait on the vector store just made (a 64-byte store read back as
/// 16-bit loads). A macro, so that it is expanded inside the kernels' target features.
macro_rules! pipelined {
    ($wb:expr, $prep:ident, $a:expr) => {{
        let (wb, a) = ($wb, $a);
        let mut acc = [0.0f32; N];
        let (mut i0, mut i1) = ([0u16; 32], [0u16; 32]);
        if let Some(first) = wb.first() {
            let mut cur = $prep(first, &mut i0);
            for b in 0..wb.len() {
                let (now, later) = if b % 2 == 0 {
                    (&i0, &mut i1)
                } else {
                    (&i1, &mut i0)
                };
                let next = wb.get(b + 1).map(|blk| $prep(blk, later));
                block_n(now, cur.0, cur.1, a, b, cur.2, &mut acc);
                if let Some(n) = next {
                    cur = n;
                }
            }
        }
        acc
    }};
}

/// IQ1_M × Q8_K for N tokens. Block (56 B): `[0..32) qs | [32..48) qh | [48..56)
/// scales:u16[4]`: run r (weights 8r..): index `qs[r] | (nibble r of qh & 7) << 8`, δ
/// negative where the nibble's bit 3 is set; scale group q of word m (weights 64m + 16q..)
/// `2·((w_m >> 3q) & 7) + 1`; fp16 `d` in the words' top nibbles.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn iq1_m_n<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
    let Some(wb) = blocks::<56>(w, n / 256) else {
        return [f32::NAN; N];
    };
    let a = match q8k_rows(acts, n, |a| iq1_m_n(w, [a], n)[0]) {
        Ok(a) => a,
        Err(v) => return v,
    };
    pipelined!(wb, prep_m, &a)
}

/// IQ1_M block `blk`'s 32 grid indices into `idx`; its delta mask, scale groups' `2k + 1` and
/// `d`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn prep_m(blk: &[u8; 56], idx: &mut [u16; 32]) -> (u32, __m256i, f32) {
    let m4 = _mm_set1_epi8(0x0F);
    let m7 = _mm256_set1_epi8(7);
    // Lane g of the scale words: word g/4 shifted by 3(g%4).
    let word_of = _mm256_setr_epi16(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    let shift = _mm256_setr_epi16(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9);
    // The 32 nibbles in run order (byte k: low nibble run 2k, high 2k + 1).
    let qh = ld128(at::<u8, 32, 16, 56>(blk));
    let (lo, hi) = (
        _mm_and_si128(qh, m4),
        _mm_and_si128(_mm_srli_epi16::<4>(qh), m4),
    );
    let nib = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
    let neg = _mm256_movepi8_mask(_mm256_slli_epi16::<4>(nib));
    let qs = ld256(at::<u8, 0, 32, 56>(blk));
    let ix = _mm512_or_si512(
        _mm512_cvtepu8_epi16(qs),
        _mm512_slli_epi16::<8>(_mm512_cvtepu8_epi16(_mm256_and_si256(nib, m7))),
    );
    // SAFETY: `idx` is 64 writable bytes; `storeu` accepts any alignment.
    unsafe { _mm512_storeu_si512(idx.as_mut_ptr().cast(), ix) };
    let sw = u64::from_le_bytes(*at::<u8, 48, 8, 56>(blk));
    let words = _mm256_permutexvar_epi16(word_of, _mm256_set1_epi64x(sw as i64));
    let k = _mm256_and_si256(_mm256_srlv_epi16(words, shift), _mm256_set1_epi16(7));
    let ls16 = _mm256_or_si256(_mm256_slli_epi16::<1>(k), _mm256_set1_epi16(1));
    let sc: [u16; 4] = core::array::from_fn(|k| (sw >> (16 * k)) as u16);
    let d = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
    (neg, ls16, f16_to_f32(d))
}

/// IQ1_S × Q8_K for N tokens. Block (50 B): `[0..2) d | [2..34) qs | [34..50) qh:u16[8]`: run
/// l of sub-block ib: index `qs[4ib + l] | ((h >> 3l) & 7) << 8` (h = qh[ib]), scale
/// `2((h >> 12) & 7) + 1` for the sub-block's 32 weights (two groups of 16), δ negative where
/// h's bit 15 is set.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn iq1_s_n<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
    let Some(wb) = blocks::<50>(w, n / 256) else {
        return [f32::NAN; N];
    };
    let a = match q8k_rows(acts, n, |a| iq1_s_n(w, [a], n)[0]) {
        Ok(a) => a,
        Err(v) => return v,
    };
    pipelined!(wb, prep_s, &a)
}

/// IQ1_S run r's `qh` word (r / 4) and the shift of its index bits (3·(r % 4)).
static RUN_WORD: [i16; 32] = run_tab(false);
static RUN_SHIFT: [i16; 32] = run_tab(true);

const fn run_tab(shift: bool) -> [i16; 32] {
    let mut t = [0i16; 32];
    let mut r = 0;
    while r < 32 {
        t[r] = if shift { 3 * (r % 4) } else { r / 4 } as i16;
        r += 1;
    }
    t
}

/// IQ1_S block `blk`'s 32 grid indices into `idx`; its delta mask, scale groups' `2k + 1` and
/// `d`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn prep_s(blk: &[u8; 50], idx: &mut [u16; 32]) -> (u32, __m256i, f32) {
    // Run r: word r/4 of qh, shifted by 3(r%4); group g: word g/2.
    // SAFETY: both tables are 64 readable bytes; `loadu` accepts any alignment.
    let run_word = unsafe { _mm512_loadu_si512(RUN_WORD.as_ptr().cast()) };
    // SAFETY: as above.
    let run_shift = unsafe { _mm512_loadu_si512(RUN_SHIFT.as_ptr().cast()) };
    let group_word = _mm256_setr_epi16(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    let qh = ld128(at::<u8, 34, 16, 50>(blk));
    let hw = _mm512_permutexvar_epi16(run_word, _mm512_castsi128_si512(qh));
    let hi = _mm512_and_si512(_mm512_srlv_epi16(hw, run_shift), _mm512_set1_epi16(7));
    let qs = ld256(at::<u8, 2, 32, 50>(blk));
    let ix = _mm512_or_si512(_mm512_cvtepu8_epi16(qs), _mm512_slli_epi16::<8>(hi));
    // SAFETY: `idx` is 64 writable bytes; `storeu` accepts any alignment.
    unsafe { _mm512_storeu_si512(idx.as_mut_ptr().cast(), ix) };
    // Bit 15 of each word is sub-block ib's δ sign: runs 4ib..4ib + 4.
    let sub_neg = _mm_movepi16_mask(qh);
    let neg = (0..8).fold(0u32, |m, ib| {
        m | (u32::from((sub_neg >> ib) & 1) * 0xF) << (4 * ib)
    });
    let gw = _mm256_permutexvar_epi16(group_word, _mm256_castsi128_si256(qh));
    let k = _mm256_and_si256(_mm256_srli_epi16::<12>(gw), _mm256_set1_epi16(7));
    let ls16 = _mm256_or_si256(_mm256_slli_epi16::<1>(k), _mm256_set1_epi16(1));
    (neg, ls16, f16_at::<0, 50>(blk))
}

#[cfg(test)]
mod tests {
    use crate::kernels::scalar;
    use crate::kernels::x8::testing::{act, extreme, rng};

    /// Random IQ1_S / IQ1_M rows with small finite `d` (IQ1_M: in the scale words' top
    /// nibbles), every other bit random.
    fn rows(seed: &mut u64, nb: usize, m: bool) -> Vec<u8> {
        let bs = if m { 56 } else { 50 };
        let mut w = vec![0u8; nb * bs];
        for blk in w.chunks_exact_mut(bs) {
            for b in blk.iter_mut() {
                *b = rng(seed) as u8;
            }
            let d = half::f16::from_f32((rng(seed) % 1000) as f32 * 1e-5 + 1e-6).to_bits();
            if m {
                for k in 0..4 {
                    let v = u16::from_le_bytes([blk[48 + 2 * k], blk[49 + 2 * k]]);
                    let v = (v & 0x0FFF) | ((d >> (4 * k)) & 0xF) << 12;
                    blk[48 + 2 * k..50 + 2 * k].copy_from_slice(&v.to_le_bytes());
                }
            } else {
                blk[0..2].copy_from_slice(&d.to_le_bytes());
            }
        }
        w
    }

    /// One to four tokens give the scalar reference's bits on random blocks, random and
    /// extreme activations (all −128; 127 but one −128 a block).
    #[test]
    fn iq1_kernels_give_the_scalar_reference_bits() {
        if super::super::Avx512Vnni::detect().is_none() {
            return;
        }
        let mut seed = 0x1111_abcd_u64;
        for cols in [256usize, 1024, 3072] {
            let mut acts: Vec<Vec<u8>> = [1e-3f32, 1.0, 1e4]
                .iter()
                .map(|&s| act(&mut seed, cols, s))
                .collect();
            acts.extend([extreme(cols, 1.0), extreme(cols, -1.0)]);
            for m in [false, true] {
                let w = rows(&mut seed, cols / 256, m);
                type Multi = fn(&[u8], &[&[u8]], usize, &mut [f32]);
                type Row = fn(&[u8], &[u8], usize) -> f32;
                let (multi, reference): (Multi, Row) = if m {
                    (super::vec_dot_iq1_m_q8k_multi, scalar::vec_dot_iq1_m_q8k)
                } else {
                    (super::vec_dot_iq1_s_q8k_multi, scalar::vec_dot_iq1_s_q8k)
                };
                for a in acts.iter().filter(|_| m) {
                    let got = super::vec_dot_iq1_m_q8k(&w, a, cols);
                    let want = reference(&w, a, cols);
                    assert_eq!(got.to_bits(), want.to_bits(), "IQ1_M cols {cols}");
                }
                for nt in 1..=4 {
                    let refs: Vec<&[u8]> = acts[..nt].iter().map(Vec::as_slice).collect();
                    let mut out = vec![0.0f32; nt];
                    multi(&w, &refs, cols, &mut out);
                    for (t, o) in out.iter().enumerate() {
                        let want = reference(&w, refs[t], cols);
                        assert_eq!(o.to_bits(), want.to_bits(), "m {m} cols {cols} token {t}");
                    }
                }
            }
        }
    }
}
