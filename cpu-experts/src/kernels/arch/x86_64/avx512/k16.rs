//! Q6_K × Q8_K on 512 bits.
//!
//! Scalar, per super-block: `sumf += (d_a·d)·Σ_j sc_j·Σ_{16} (u − 32)·q_a`, u in 0..63.
//!
//! Half h (128 elements): `ql[64h..64h+64]` is [Q0 | Q1], so its low nibbles are planes
//! 0 and 1 (elements 128h..128h+64) and its high nibbles planes 2 and 3 (the next 64), each
//! in element order; `qh[32h..]` broadcast to both halves supplies bits 4-5 (plane 0: bits
//! 0-1, plane 1: 2-3, plane 2: 4-5, plane 3: 6-7, moved with per-half variable shifts).
//! `maddubs` (u ≤ 63) then `vpdpwssd` with the four sub-block scales of the 64 elements.
//! The −32 offset comes back as `32·Σ_j sc_j·bsums_j` (AVX2's helper).

use core::arch::x86_64::*;

use super::super::avx2::k16::scaled_bsums;
use super::super::avx2::{at, f16_at, hsum_ps, ld128, ld256};
use super::{fold256, join256, ld512, rows_ok, wrap_n};
use crate::kernels::act::Q8KAct;
use crate::kernels::scalar::blocks;

wrap_n!(vec_dot_q6k_q8k, vec_dot_q6k_q8k_multi => q6k_n);

/// `vpermw` indices: words 8i..8i+8 take scale `k + i` (i < 4).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn pick4(k: i16) -> __m512i {
    join256(
        _mm256_set_m128i(_mm_set1_epi16(k + 1), _mm_set1_epi16(k)),
        _mm256_set_m128i(_mm_set1_epi16(k + 3), _mm_set1_epi16(k + 2)),
    )
}

/// See the module comment. Every token's f32 operations are those of N = 1.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q6k_n<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
    let (Some(wb), Some(a)) = (
        blocks::<210>(w, n / 256),
        rows_ok(acts, |a| Q8KAct::new(a, n)),
    ) else {
        return core::array::from_fn(|t| {
            if N == 1 {
                f32::NAN
            } else {
                q6k_n(w, [acts[t]], n)[0]
            }
        });
    };
    let qa = a.map(|a| a.qs.as_chunks::<256>().0);
    let bsums = a.map(|a| a.bsums.as_chunks::<16>().0);
    let m4 = _mm512_set1_epi8(0x0F);
    let m2 = _mm512_set1_epi8(0x30);
    let shl01 = join256(_mm256_set1_epi16(4), _mm256_set1_epi16(2));
    let shr23 = join256(_mm256_setzero_si256(), _mm256_set1_epi16(2));
    let pick: [__m512i; 4] = core::array::from_fn(|i| pick4(4 * i as i16));
    let mut acc = [_mm256_setzero_ps(); N];
    for (b, blk) in wb.iter().enumerate() {
        let sc8 = ld128(at::<u8, 192, 16, 210>(blk));
        let sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc8));
        let ql = at::<u8, 0, 128, 210>(blk).as_chunks::<64>().0;
        let qh = at::<u8, 128, 64, 210>(blk).as_chunks::<32>().0;
        let mut sumi = [_mm512_setzero_si512(); N];
        for h in 0..2 {
            let l = ld512(&ql[h]);
            let hb = _mm512_broadcast_i64x4(ld256(&qh[h]));
            let u01 = _mm512_or_si512(
                _mm512_and_si512(l, m4),
                _mm512_and_si512(_mm512_sllv_epi16(hb, shl01), m2),
            );
            let u23 = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<4>(l), m4),
                _mm512_and_si512(_mm512_srlv_epi16(hb, shr23), m2),
            );
            let s01 = _mm512_permutexvar_epi16(pick[2 * h], sc16);
            let s23 = _mm512_permutexvar_epi16(pick[2 * h + 1], sc16);
            for t in 0..N {
                let y = qa[t][b].as_chunks::<64>().0;
                let p01 = _mm512_maddubs_epi16(u01, ld512(&y[2 * h]));
                let p23 = _mm512_maddubs_epi16(u23, ld512(&y[2 * h + 1]));
                sumi[t] = _mm512_dpwssd_epi32(sumi[t], p01, s01);
                sumi[t] = _mm512_dpwssd_epi32(sumi[t], p23, s23);
            }
        }
        let dw = f16_at::<208, 210>(blk);
        for t in 0..N {
            let corr = _mm256_slli_epi32::<5>(scaled_bsums(sc8, &bsums[t][b]));
            let s = _mm256_sub_epi32(fold256(sumi[t]), corr);
            let d = _mm256_set1_ps(a[t].d(b) * dw);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[t]);
        }
    }
    core::array::from_fn(|t| hsum_ps(acc[t]))
}

/// One decoded Q6_K super-block of one row (576 bytes), for the GEMM.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Dec6 {
    /// `u` (0..63, q + 32) in element order.
    q: [[u8; 32]; 8],
    /// Per 32 elements s: 16 i16 words, 0-7 the scale of elements 32s..32s+16, 8-15 that of
    /// the next 16 (the `vpdpwssd` operand, broadcast to both halves).
    sc: [[u8; 32]; 8],
    /// The 16 scales as i8 (for the −32 correction).
    sc8: [u8; 16],
    d: f32,
}

const DEC6_0: Dec6 = Dec6 {
    q: [[0; 32]; 8],
    sc: [[0; 32]; 8],
    sc8: [0; 16],
    d: 0.0,
};

/// Decodes one Q6_K block (layout in the module comment).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn decode6(blk: &[u8; 210], out: &mut Dec6) {
    let m4 = _mm512_set1_epi8(0x0F);
    let m2 = _mm512_set1_epi8(0x30);
    let shl01 = join256(_mm256_set1_epi16(4), _mm256_set1_epi16(2));
    let shr23 = join256(_mm256_setzero_si256(), _mm256_set1_epi16(2));
    let ql = at::<u8, 0, 128, 210>(blk).as_chunks::<64>().0;
    let qh = at::<u8, 128, 64, 210>(blk).as_chunks::<32>().0;
    for h in 0..2 {
        let l = ld512(&ql[h]);
        let hb = _mm512_broadcast_i64x4(ld256(&qh[h]));
        let u01 = _mm512_or_si512(
            _mm512_and_si512(l, m4),
            _mm512_and_si512(_mm512_sllv_epi16(hb, shl01), m2),
        );
        let u23 = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16::<4>(l), m4),
            _mm512_and_si512(_mm512_srlv_epi16(hb, shr23), m2),
        );
        // SAFETY: q[4h..4h+4] are 128 contiguous writable bytes; `storeu` takes any
        // alignment.
        unsafe {
            let q = out.q[4 * h..].as_mut_ptr().cast::<u8>();
            _mm512_storeu_si512(q.cast(), u01);
            _mm512_storeu_si512(q.add(64).cast(), u23);
        }
    }
    let sc8 = ld128(at::<u8, 192, 16, 210>(blk));
    let sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc8));
    for s in 0..4 {
        // Words 0-7: scale 4s, 8-15: 4s+1, 16-23: 4s+2, 24-31: 4s+3 (segments 2s, 2s+1).
        let v = _mm512_permutexvar_epi16(pick4(4 * s as i16), sc16);
        // SAFETY: sc[2s..2s+2] are 64 contiguous writable bytes.
        unsafe { _mm512_storeu_si512(out.sc[2 * s..].as_mut_ptr().cast(), v) };
    }
    out.sc8 = *at::<u8, 192, 16, 210>(blk);
    out.d = f16_at::<208, 210>(blk);
}

super::k4::gemm_q8k!(q6k_q8k_gemm, 210, Dec6, DEC6_0, decode6, tile6);

/// One micro-tile of the Q6_K GEMM: rows `0..RR` × token pairs `0..PP` (a zmm holds one
/// 32-element segment of two tokens, the weight segment broadcast to both halves, so each
/// half holds exactly [`q6k_n`]'s folded lanes); every f32 operation is `q6k_n`'s.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tile6<const RR: usize, const PP: usize, const NB: usize>(
    dec: &[[Dec6; NB]; super::k4::R],
    nb: usize,
    a: &[Q8KAct<'_>; super::k4::T],
) -> [[f32; super::k4::T]; super::k4::R] {
    use super::k4::{R, T};
    let mut facc = [[_mm512_setzero_ps(); PP]; RR];
    let qa: [&[[i8; 256]]; T] = core::array::from_fn(|k| &a[k].qs.as_chunks::<256>().0[..nb]);
    let bs: [&[[[u8; 2]; 16]]; T] = core::array::from_fn(|k| &a[k].bsums.as_chunks::<16>().0[..nb]);
    for b in 0..nb {
        let mut acc = [[_mm512_setzero_si512(); PP]; RR];
        for s in 0..8 {
            let av: [__m512i; PP] = core::array::from_fn(|p| {
                let lo = &qa[2 * p][b].as_chunks::<32>().0[s];
                let hi = &qa[2 * p + 1][b].as_chunks::<32>().0[s];
                join256(ld256(lo), ld256(hi))
            });
            for r in 0..RR {
                let d = &dec[r][b];
                let wv = _mm512_broadcast_i64x4(ld256(&d.q[s]));
                let sv = _mm512_broadcast_i64x4(ld256(&d.sc[s]));
                for p in 0..PP {
                    let prod = _mm512_maddubs_epi16(wv, av[p]);
                    acc[r][p] = _mm512_dpwssd_epi32(acc[r][p], prod, sv);
                }
            }
        }
        let da: [f32; T] = core::array::from_fn(|k| a[k].d(b));
        let dav: [__m512; PP] = core::array::from_fn(|p| {
            _mm512_castsi512_ps(join256(
                _mm256_castps_si256(_mm256_set1_ps(da[2 * p])),
                _mm256_castps_si256(_mm256_set1_ps(da[2 * p + 1])),
            ))
        });
        // The tokens' bsums, two per register (`scaled_bsums`' operand).
        let bsv: [__m512i; PP] = core::array::from_fn(|p| {
            let f = |k: usize| ld256(&bs[k][b].as_flattened().as_chunks::<32>().0[0]);
            join256(f(2 * p), f(2 * p + 1))
        });
        for r in 0..RR {
            let d = &dec[r][b];
            let sc16 = _mm512_broadcast_i64x4(_mm256_cvtepi8_epi16(ld128(&d.sc8)));
            let dw = _mm512_set1_ps(d.d);
            for p in 0..PP {
                let corr = _mm512_slli_epi32::<5>(_mm512_madd_epi16(sc16, bsv[p]));
                let sv = _mm512_sub_epi32(acc[r][p], corr);
                let dd = _mm512_mul_ps(dav[p], dw);
                facc[r][p] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(sv), facc[r][p]);
            }
        }
    }
    let mut res = [[0.0f32; T]; R];
    for r in 0..RR {
        for p in 0..PP {
            let mut f = [0.0f32; 16];
            // SAFETY: `f` is 16 writable f32; `storeu` accepts any alignment.
            unsafe { _mm512_storeu_ps(f.as_mut_ptr(), facc[r][p]) };
            for h in 0..2 {
                // SAFETY: 8 f32 inside the 16 of `f`.
                let acc = unsafe { _mm256_loadu_ps(f.as_ptr().add(8 * h)) };
                res[r][2 * p + h] = hsum_ps(acc);
            }
        }
    }
    res
}
