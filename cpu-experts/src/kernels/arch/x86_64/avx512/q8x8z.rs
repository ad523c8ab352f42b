//! Q8_0 × Q8_0 for eight repacked rows (`kernels::x8_q8_0`'s layout) on 512 bits with
//! AVX512-VNNI, and the activations' preparation for it.
//!
//! Per pair of blocks and token: eight 64-byte code loads (shared by the tokens), each one
//! step of both blocks of the eight rows, met by `vpdpbusd` with an 8-byte broadcast of the
//! prepared activation (the two blocks' steps side by side); the accumulation starts at the
//! blocks' `−128·Σq` pair, so lane 2r ends at row r's exact `sumi` of the pair's first block
//! and lane 2r + 1 at its second's. Then one f32 step for the 16 lanes: the rows' scales
//! (one `vcvtph2ps` of the pair's 16, shared by the tokens) times the token's two, times the
//! converted sums, added to the even lanes first block first (the odd lanes shifted down),
//! as `ct4x8z` pairs its blocks of groups of 32. The odd lanes of the accumulators carry
//! nothing used; the even ones are narrowed at the end.
//!
//! Every lane's integer sum is exact (at most 32·255·128 before the offset) and its f32 steps
//! are the scalar reference's (`acc += sumi·(d·d_a)`, no FMA), so every output is its bits.
//!
//! Q4_0 (`g.nibbles()`): four 64-byte loads a pair instead of eight, each split by two masks
//! (a shift first for the high nibbles) into steps L and L + 4; the accumulation starts at
//! the prepared `−128·Σq` shifted right by 4 (`−8·Σq`, exact: a multiple of 128). Per pair and
//! token the same eight `vpdpbusd` and broadcasts; the unpacking (three operations a load) is
//! shared by the tokens.
//!
//! IQ4_NL: Q4_0's loads and masks, then one `vpshufb` per nibble vector into the codebook
//! stored `+ 128` (so the start is the prepared `−128·Σq`, as Q8_0's). MXFP4 likewise with the
//! doubled FP4 codebook; its scales are E8M0 bytes (a u16 each in the slot), widened and
//! shifted into `e8m0_to_fp32_half`'s f32 bits per pair.

use core::arch::x86_64::*;

use super::{Avx512Vnni, ld512};
use crate::kernels::act::Q8_0Act;
use crate::kernels::arch::x86_64::avx2::k4x8::{self as x8b, arr};
use crate::kernels::arch::x86_64::avx2::{ld128, ld256};
use crate::kernels::x8_q8_0::{Codes, DotQ80X8, PAIR_ACT, PrepQ80, Q80Geom, fits};
use lagoon_core::quant::tables::{KVALUES_FP4, KVALUES_IQ4NL};

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q8_0_x8z(p: &[u8], g: &Q80Geom, acts: &[&[u8]], out: &mut [[f32; 8]]) {
    if !fits(p, g, acts, out) {
        out.iter_mut().for_each(|o| *o = [f32::NAN; 8]);
        return;
    }
    let mut t0 = 0;
    while t0 < acts.len() {
        let (a, o) = (&acts[t0..], &mut out[t0..]);
        t0 += match g.codes {
            Codes::Q8_0 => by_tokens::<Q8>(p, g, a, o),
            Codes::Q4_0 => by_tokens::<Q4>(p, g, a, o),
            Codes::Iq4Nl => by_tokens::<NL>(p, g, a, o),
            Codes::Mxfp4 => by_tokens::<MX>(p, g, a, o),
        };
    }
}

/// One [`tokens`] pass of up to four, or eight, of `a`'s tokens; returns how many it took.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn by_tokens<const K: u8>(p: &[u8], g: &Q80Geom, a: &[&[u8]], o: &mut [[f32; 8]]) -> usize {
    match a.len() {
        1 => tokens::<1, K>(p, g, a, o),
        2 => tokens::<2, K>(p, g, a, o),
        3 => tokens::<3, K>(p, g, a, o),
        4..8 => tokens::<4, K>(p, g, a, o),
        // Eight at once: ~7% more than two passes of four (the unpacking and the scales
        // shared by twice the tokens; `prefill_*_64tok/x8`, session 43).
        _ => tokens::<8, K>(p, g, a, o),
    }
}

/// Eight bytes of `v` at `o` broadcast to every 64-bit lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn bcast8(v: &[u8; PAIR_ACT], o: usize) -> __m512i {
    _mm512_set1_epi64(i64::from_le_bytes(*arr::<8>(v, o)))
}

/// [`tokens`]' code kinds.
const Q8: u8 = 0;
const Q4: u8 = 1;
const NL: u8 = 2;
const MX: u8 = 3;

/// A 16-value codebook `+ 128`, as unsigned bytes.
const fn book_u8(kv: &[i8; 16]) -> [u8; 16] {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (kv[i] as i16 + 128) as u8;
        i += 1;
    }
    t
}
const NL_U8: [u8; 16] = book_u8(&KVALUES_IQ4NL);
const MX_U8: [u8; 16] = book_u8(&KVALUES_FP4);

/// One pass over the group for the first T tokens of `a` (K: [`Q8`], [`Q4`] or [`NL`]
/// codes); returns T.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tokens<const T: usize, const K: u8>(
    p: &[u8],
    g: &Q80Geom,
    a: &[&[u8]],
    out: &mut [[f32; 8]],
) -> usize {
    let pd = x8b::prefetch_ahead();
    let mut acc = [_mm512_setzero_ps(); T];
    let acts: [&[u8]; T] = core::array::from_fn(|t| a[t]);
    let low4 = _mm512_set1_epi8(15);
    let book = _mm512_broadcast_i32x4(ld128(if K == MX { &MX_U8 } else { &NL_U8 }));
    for pr in 0..g.pairs() {
        // The pair's scales and codes, one run (the scales only at an even pair).
        let (so, co) = (g.scale_at(pr), g.code_at(pr));
        x8b::prefetch(&p[if pr % 2 == 0 { so } else { co }..co + g.code()], pd);
        let pa: [&[u8; PAIR_ACT]; T] =
            core::array::from_fn(|t| arr::<PAIR_ACT>(acts[t], PAIR_ACT * pr));
        let mut s: [__m512i; T];
        if K != Q8 {
            let c = arr::<256>(p, co);
            s = core::array::from_fn(|t| match K {
                Q4 => _mm512_srai_epi32::<4>(bcast8(pa[t], 64)),
                _ => bcast8(pa[t], 64),
            });
            for l in 0..4 {
                let w = ld512(arr::<64>(c, 64 * l));
                let mut lo = _mm512_and_si512(w, low4);
                let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(w), low4);
                if K == NL || K == MX {
                    lo = _mm512_shuffle_epi8(book, lo);
                    hi = _mm512_shuffle_epi8(book, hi);
                }
                for t in 0..T {
                    s[t] = _mm512_dpbusd_epi32(s[t], lo, bcast8(pa[t], 8 * l));
                    s[t] = _mm512_dpbusd_epi32(s[t], hi, bcast8(pa[t], 8 * (l + 4)));
                }
            }
        } else {
            let c = arr::<512>(p, co);
            s = core::array::from_fn(|t| bcast8(pa[t], 64));
            for k in 0..8 {
                let w = ld512(arr::<64>(c, 64 * k));
                for t in 0..T {
                    s[t] = _mm512_dpbusd_epi32(s[t], w, bcast8(pa[t], 8 * k));
                }
            }
        }
        let dw = if K == MX {
            // E8M0 (a u16 each) to `e8m0_to_fp32_half`'s f32: bits (e − 1) << 23, or
            // 0x200000 << e for e < 2.
            let e = _mm512_cvtepu16_epi32(ld256(arr::<32>(p, so)));
            let bits = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, _mm512_set1_epi32(1)));
            let tiny = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
            let bits = _mm512_mask_sllv_epi32(bits, tiny, _mm512_set1_epi32(0x0020_0000), e);
            _mm512_castsi512_ps(bits)
        } else {
            _mm512_cvtph_ps(ld256(arr::<32>(p, so)))
        };
        for t in 0..T {
            let da = _mm512_castsi512_ps(bcast8(pa[t], 72));
            let x = _mm512_mul_ps(_mm512_cvtepi32_ps(s[t]), _mm512_mul_ps(dw, da));
            // acc += first block's term, then the second's (the odd lanes, shifted down).
            let r = _mm512_add_ps(acc[t], x);
            let hi = _mm512_castsi512_ps(_mm512_srli_epi64::<32>(_mm512_castps_si512(x)));
            acc[t] = _mm512_add_ps(r, hi);
        }
    }
    for (o, v) in out.iter_mut().zip(acc) {
        // The even lanes (the rows) narrowed to eight.
        let rows = _mm512_cvtepi64_epi32(_mm512_castps_si512(v));
        // SAFETY: `o` is 8 writable f32 (32 bytes); `storeu` accepts any alignment.
        unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), rows) };
    }
    T
}

/// `x8_q8_0::prepare` on 512 bits: per full pair one `vpermd` interleaves the two blocks'
/// steps and one `vpsadbw` (over the bytes flipped to `q + 128`) gives their sums.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn prep_z(a: &Q8_0Act<'_>, g: &Q80Geom, out: &mut [u8]) -> bool {
    if a.qs.len() != 32 * g.blocks || out.len() != g.act_bytes() {
        return false;
    }
    let inter = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    let flip = _mm512_set1_epi8(-128);
    let zero = _mm512_setzero_si512();
    // A block's four 8-byte sums (u64 lanes) to `−128·Σq` (less the flip's 32·128 first).
    let corr = |v: __m256i| {
        let s = _mm_add_epi64(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let sum = (_mm_cvtsi128_si64(s) + _mm_extract_epi64::<1>(s)) as i32 - 32 * 128;
        -128 * sum
    };
    let (pairs, _) = a.qs.as_chunks::<64>();
    let (dpairs, _) = a.d.as_chunks::<2>();
    let (outs, _) = out.as_chunks_mut::<PAIR_ACT>();
    for ((o, c), d) in outs.iter_mut().zip(pairs).zip(dpairs) {
        let v = ld512(c);
        // SAFETY: `o` is 80 writable bytes; `storeu` accepts any alignment.
        unsafe { _mm512_storeu_si512(o.as_mut_ptr().cast(), _mm512_permutexvar_epi32(inter, v)) };
        let s = _mm512_sad_epu8(_mm512_xor_si512(v, flip), zero);
        let (c0, c1) = (
            corr(_mm512_castsi512_si256(s)),
            corr(_mm512_extracti64x4_epi64::<1>(s)),
        );
        o[64..68].copy_from_slice(&c0.to_le_bytes());
        o[68..72].copy_from_slice(&c1.to_le_bytes());
        o[72..76].copy_from_slice(&d[0]);
        o[76..80].copy_from_slice(&d[1]);
    }
    if g.blocks % 2 == 1 {
        // The last block, alone in its pair: as the scalar form writes it.
        let b = g.blocks - 1;
        let o = &mut outs[b / 2];
        o.fill(0);
        let q = &a.qs[32 * b..][..32];
        for (k, step) in q.as_chunks::<4>().0.iter().enumerate() {
            for (i, &x) in step.iter().enumerate() {
                o[8 * k + i] = x as u8;
            }
        }
        let sum: i32 = q.iter().map(|&x| i32::from(x)).sum();
        o[64..68].copy_from_slice(&(-128 * sum).to_le_bytes());
        o[72..76].copy_from_slice(&a.d[b]);
    }
    true
}

fn dot_q8_0_x8z(p: &[u8], g: &Q80Geom, acts: &[&[u8]], out: &mut [[f32; 8]]) {
    // SAFETY: `q8_0_x8z` only needs the features `Avx512Vnni::detect` checks; this function
    // is reachable only through `q8_0_x8z_fn`, which requires an `Avx512Vnni` token.
    unsafe { q8_0_x8z(p, g, acts, out) }
}

fn prep(a: &Q8_0Act<'_>, g: &Q80Geom, out: &mut [u8]) -> bool {
    // SAFETY: as for `dot_q8_0_x8z` (reachable only through `q8_0_prep_fn`).
    unsafe { prep_z(a, g, out) }
}

/// The kernel, for a CPU with AVX512-VNNI.
pub(crate) fn q8_0_x8z_fn(_proof: Avx512Vnni) -> DotQ80X8 {
    dot_q8_0_x8z
}

/// The activations' preparation, for a CPU with AVX512-VNNI.
pub(crate) fn q8_0_prep_fn(_proof: Avx512Vnni) -> PrepQ80 {
    prep
}
