//! Q6_K × Q8_K for eight repacked rows at once (`kernels::x8_q6k`'s layout): lanes are rows,
//! as in `k4x8`.
//!
//! Per super-block and sub-block j (16 elements): three 32-byte loads (two of low nibbles,
//! one of high bit pairs) and masks and shifts give four vectors of unsigned 6-bit values
//! `u = q + 32`, four consecutive elements of every row each; per token four broadcasts of
//! four activation bytes and the products. Then per super-block `32·Σ_j sc_j·Σa_j` is taken
//! off (eight `madd`s of the rows' scale pairs by the token's block-sum pairs), since
//! `Σ q·a = Σ u·a − 32·Σa`. The two instances differ in the products:
//!
//! * AVX2: `maddubs` (u ≤ 63, |a| ≤ 127: a pair ≤ 16,002, two pairs added in i16 ≤ 32,004),
//!   then `madd` by the rows' scales duplicated in both i16 halves (the scale folded in).
//! * AVX512-VNNI (`avx512::x8`): one `vpdpbusd` per vector into i32, each sub-block's sum
//!   times the rows' scales by `mullo`.
//!
//! Both give the exact integer `Σ_j sc_j·Σ q·a` per row; the f32 steps are the scalar
//! reference's per row, so the results are its bits.

use core::arch::x86_64::*;

use super::wrap;

/// Defines `q6k_x8` (one token) and `q6k_x8_multi` (several) with the target features
/// `$feat`. Per sub-block and token, `|$x, $u, $a, $s| $step` adds the products of two value
/// vectors `$u` (u8) and their broadcast activations `$a` (i8) to the accumulator `$x`
/// (`$s`: the rows' scales as i16 pairs); `|$y, $s32| $fin` turns the accumulator into the
/// sub-block's contribution (`$s32`: the rows' scales as i32).
macro_rules! k6x8_kernels {
    ($feat:literal, |$x:ident, $u:ident, $a:ident, $s:ident| $step:expr, |$y:ident, $s32:ident| $fin:expr) => {
        use $crate::kernels::act::Q8KAct;
        use $crate::kernels::arch::x86_64::avx2::k4x8 as x8b;
        use $crate::kernels::arch::x86_64::avx2::{ld128, ld256};
        use $crate::kernels::x8_q6k::Q6K_X8_BLOCK;

        $crate::kernels::arch::x86_64::avx2::k4x8::x8_driver!(
            $feat,
            q6k_x8,
            q6k_x8_multi,
            k6_tokens,
            Q6K_X8_BLOCK
        );

        /// The eight rows' scales of sub-block `j` as i8 → i16 (8 lanes of 128 bits).
        #[inline]
        #[target_feature(enable = $feat)]
        fn k6_scales16(o: &[u8; Q6K_X8_BLOCK], j: usize) -> __m128i {
            _mm_cvtepi8_epi16(x8b::lo8(o, 16 + 8 * j))
        }

        /// One pass over the group's super-blocks for T tokens; returns T.
        #[inline]
        #[target_feature(enable = $feat)]
        fn k6_tokens<const T: usize>(
            p: &[u8],
            a: [Q8KAct<'_>; T],
            out: &mut [[f32; 8]; T],
        ) -> usize {
            let m4 = _mm256_set1_epi8(0x0F);
            let (m03, m0c, m30, mc0) = (
                _mm256_set1_epi8(0x03),
                _mm256_set1_epi8(0x0C),
                _mm256_set1_epi8(0x30),
                _mm256_set1_epi8(0xC0u8 as i8),
            );
            let mut acc = [_mm256_setzero_ps(); T];
            let pd = $crate::kernels::arch::x86_64::avx2::k4x8::prefetch_ahead();
            for (b, o) in p.as_chunks::<Q6K_X8_BLOCK>().0.iter().enumerate() {
                $crate::kernels::arch::x86_64::avx2::k4x8::prefetch(o, pd);
                let mut qa: [&[[i8; 4]; 64]; T] = [&[[0; 4]; 64]; T];
                for (q, at) in qa.iter_mut().zip(&a) {
                    *q = at.qs[256 * b..][..256]
                        .as_chunks::<4>()
                        .0
                        .try_into()
                        .unwrap();
                }
                let mut sumi = [_mm256_setzero_si256(); T];
                for j in 0..16 {
                    let s32 = _mm256_cvtepi16_epi32(k6_scales16(o, j));
                    // Each row's scale in both i16 halves of its lane.
                    #[allow(unused_variables)]
                    let s16 = _mm256_or_si256(
                        _mm256_and_si256(s32, _mm256_set1_epi32(0xFFFF)),
                        _mm256_slli_epi32::<16>(s32),
                    );
                    let la = ld256(x8b::arr::<32>(o, 144 + 64 * j));
                    let lb = ld256(x8b::arr::<32>(o, 176 + 64 * j));
                    let h = ld256(x8b::arr::<32>(o, 1168 + 32 * j));
                    // Elements 0-3, 4-7, 8-11, 12-15 of the sub-block, every row.
                    let u0 = _mm256_or_si256(
                        _mm256_and_si256(la, m4),
                        _mm256_slli_epi16::<4>(_mm256_and_si256(h, m03)),
                    );
                    let u1 = _mm256_or_si256(
                        _mm256_and_si256(lb, m4),
                        _mm256_slli_epi16::<2>(_mm256_and_si256(h, m0c)),
                    );
                    let u2 = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(la), m4),
                        _mm256_and_si256(h, m30),
                    );
                    let u3 = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(lb), m4),
                        _mm256_srli_epi16::<2>(_mm256_and_si256(h, mc0)),
                    );
                    for t in 0..T {
                        let a0 = x8b::bcast4(&qa[t][4 * j]);
                        let a1 = x8b::bcast4(&qa[t][4 * j + 1]);
                        let a2 = x8b::bcast4(&qa[t][4 * j + 2]);
                        let a3 = x8b::bcast4(&qa[t][4 * j + 3]);
                        let mut x = _mm256_setzero_si256();
                        x = {
                            #[allow(unused_variables)]
                            let ($x, $u, $a, $s) = (x, (u0, u1), (a0, a1), s16);
                            $step
                        };
                        x = {
                            #[allow(unused_variables)]
                            let ($x, $u, $a, $s) = (x, (u2, u3), (a2, a3), s16);
                            $step
                        };
                        let c = {
                            #[allow(unused_variables)]
                            let ($y, $s32) = (x, s32);
                            $fin
                        };
                        sumi[t] = _mm256_add_epi32(sumi[t], c);
                    }
                }
                // 32·Σ_j sc_j·Σa_j per row: the rows' (sc_2p, sc_2p+1) as i16 pairs against
                // the token's (bsum_2p, bsum_2p+1), which are i32 lane p of its block sums.
                let mut scp = [_mm256_setzero_si256(); 8];
                for (pi, l) in scp.iter_mut().enumerate() {
                    let (e, f) = (k6_scales16(o, 2 * pi), k6_scales16(o, 2 * pi + 1));
                    *l = _mm256_set_m128i(_mm_unpackhi_epi16(e, f), _mm_unpacklo_epi16(e, f));
                }
                for t in 0..T {
                    let bs = a[t].bsums.as_flattened();
                    let mut m = _mm256_setzero_si256();
                    for (pi, l) in scp.iter().enumerate() {
                        let pair = i32::from_le_bytes(*x8b::arr::<4>(bs, 32 * b + 4 * pi));
                        m = _mm256_add_epi32(m, _mm256_madd_epi16(*l, _mm256_set1_epi32(pair)));
                    }
                    sumi[t] = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32::<5>(m));
                }
                let d = _mm256_cvtph_ps(ld128(x8b::arr::<16>(o, 0)));
                let zero = _mm256_setzero_ps();
                for t in 0..T {
                    let da = _mm256_set1_ps(a[t].d(b));
                    acc[t] = _mm256_add_ps(
                        acc[t],
                        _mm256_mul_ps(_mm256_mul_ps(da, d), _mm256_cvtepi32_ps(sumi[t])),
                    );
                    // The scalar reference's `acc −= (d_a·dmin)·summ` with both zero.
                    acc[t] = _mm256_sub_ps(acc[t], _mm256_mul_ps(_mm256_mul_ps(da, zero), zero));
                }
            }
            x8b::store_rows(out, acc);
            T
        }
    };
}
pub(crate) use k6x8_kernels;

k6x8_kernels!(
    "avx2,fma,f16c",
    |x, u, a, s| _mm256_add_epi32(
        x,
        _mm256_madd_epi16(
            _mm256_add_epi16(
                _mm256_maddubs_epi16(u.0, a.0),
                _mm256_maddubs_epi16(u.1, a.1)
            ),
            s
        )
    ),
    |y, s32| y
);

wrap!(dot_q6k_x8 => q6k_x8(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) -> ());
wrap!(dot_q6k_x8_multi => q6k_x8_multi(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) -> ());
