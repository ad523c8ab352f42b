//! IQ4_XS × Q8_K for eight repacked rows at once (`kernels::x8_iq4xs`'s layout): lanes are
//! rows, as in `k4x8`.
//!
//! Per super-block, sub-block j and step k: one 32-byte load (four code bytes of every row),
//! two nibble masks, two `vpshufb` codebook lookups, then per token two broadcasts of four
//! activation bytes and the products. The codebook values are signed (−127..113), so the
//! two instances differ in how they multiply them by the signed activations:
//!
//! * AVX2: `maddubs(|v|, sign(a, v))` (both within ±127, a pair sum ≤ 32,258, no i16
//!   saturation; Q8_K's quantiser keeps activations within ±127), then `madd` by the rows'
//!   scales duplicated in both i16 halves: the scale is folded in per step.
//! * AVX512-VNNI (`avx512::x8`): the codebook shifted to unsigned (`v + 128`, 1..241) and one
//!   `vpdpbusd` per step into i32, each sub-block's sum times the rows' scales by `mullo`, and
//!   `128·Σ_j ls_j·Σa_j` taken off per super-block from the token's block sums (four `madd`s of
//!   the rows' scale pairs, as `k4x8`'s mins).
//!
//! Both give the exact integer `Σ_j ls_j·Σ v·a` per row; the f32 steps are the scalar
//! reference's per row, so the results are its bits.

use core::arch::x86_64::*;

use super::wrap;

/// Defines `iq4xs_x8` (one token) and `iq4xs_x8_multi` (several) with the target features
/// `$feat`. `$lut`: the codebook register (16 bytes in both halves); `|$v| $prep`: the weight
/// operand made from 32 looked-up codes; `|$x, $p, $a, $s| $step`: the accumulator after the
/// step's products of operand `$p` and broadcast activations `$a` (`$s`: the rows' scales as
/// i16 pairs); `|$y, $s32| $fin`: a sub-block's contribution from its accumulator (`$s32`: the
/// rows' scales as i32); `$offset`: whether `128·Σ_j ls_j·Σa_j` is to be taken off.
macro_rules! iq4x8_kernels {
    ($feat:literal, $lut:expr, |$v:ident| $prep:expr, |$x:ident, $p:ident, $a:ident, $s:ident| $step:expr,
     |$y:ident, $s32:ident| $fin:expr, $offset:literal) => {
        use $crate::kernels::act::Q8KAct;
        use $crate::kernels::arch::x86_64::avx2::k4x8 as x8b;
        use $crate::kernels::arch::x86_64::avx2::ld256;
        use $crate::kernels::x8_iq4xs::IQ4XS_X8_BLOCK;

        $crate::kernels::arch::x86_64::avx2::k4x8::x8_driver!(
            $feat,
            iq4xs_x8,
            iq4xs_x8_multi,
            iq4_tokens,
            IQ4XS_X8_BLOCK
        );

        /// The eight rows' scales of sub-block `j` as i32 lanes.
        #[inline]
        #[target_feature(enable = $feat)]
        fn iq4_scales(o: &[u8; IQ4XS_X8_BLOCK], j: usize) -> __m256i {
            _mm256_cvtepi8_epi32(x8b::lo8(o, 16 + 8 * j))
        }

        /// One pass over the group's super-blocks for T tokens; returns T.
        #[inline]
        #[target_feature(enable = $feat)]
        fn iq4_tokens<const T: usize>(
            p: &[u8],
            a: [Q8KAct<'_>; T],
            out: &mut [[f32; 8]; T],
        ) -> usize {
            let m4 = _mm256_set1_epi8(0x0F);
            let lut: __m256i = $lut;
            let mut acc = [_mm256_setzero_ps(); T];
            let pd = $crate::kernels::arch::x86_64::avx2::k4x8::prefetch_ahead();
            for (b, o) in p.as_chunks::<IQ4XS_X8_BLOCK>().0.iter().enumerate() {
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
                for j in 0..8 {
                    let s32 = iq4_scales(o, j);
                    // Each row's scale in both i16 halves of its lane.
                    #[allow(unused_variables)]
                    let s16 = _mm256_or_si256(
                        _mm256_and_si256(s32, _mm256_set1_epi32(0xFFFF)),
                        _mm256_slli_epi32::<16>(s32),
                    );
                    let mut sj = [_mm256_setzero_si256(); T];
                    for k in 0..4 {
                        let w = ld256(x8b::arr::<32>(o, 80 + 128 * j + 32 * k));
                        let vl = _mm256_shuffle_epi8(lut, _mm256_and_si256(w, m4));
                        let vh = _mm256_shuffle_epi8(
                            lut,
                            _mm256_and_si256(_mm256_srli_epi16::<4>(w), m4),
                        );
                        let pl = {
                            let $v = vl;
                            $prep
                        };
                        let ph = {
                            let $v = vh;
                            $prep
                        };
                        for t in 0..T {
                            let al = x8b::bcast4(&qa[t][8 * j + k]);
                            let ah = x8b::bcast4(&qa[t][8 * j + 4 + k]);
                            sj[t] = {
                                #[allow(unused_variables)]
                                let ($x, $p, $a, $s) = (sj[t], pl, al, s16);
                                $step
                            };
                            sj[t] = {
                                #[allow(unused_variables)]
                                let ($x, $p, $a, $s) = (sj[t], ph, ah, s16);
                                $step
                            };
                        }
                    }
                    for t in 0..T {
                        let c = {
                            #[allow(unused_variables)]
                            let ($y, $s32) = (sj[t], s32);
                            $fin
                        };
                        sumi[t] = _mm256_add_epi32(sumi[t], c);
                    }
                }
                $crate::kernels::arch::x86_64::avx2::iq4x8::iq4_finish(
                    o, &a, b, sumi, $offset, &mut acc,
                );
            }
            x8b::store_rows(out, acc);
            T
        }
    };
}
pub(crate) use iq4x8_kernels;

/// The eight rows' sub-block scales of one repacked super-block `o` as `(ls_2p, ls_2p+1)`
/// i16 pairs, `p` = 0..4 (for [`super::k4x8::pairs_dot_bsums`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scale_pairs(o: &[u8; crate::kernels::x8_iq4xs::IQ4XS_X8_BLOCK]) -> [__m256i; 4] {
    let mut lsp = [_mm256_setzero_si256(); 4];
    for (p, l) in lsp.iter_mut().enumerate() {
        let e = _mm_cvtepi8_epi16(super::k4x8::lo8(o, 16 + 16 * p));
        let f = _mm_cvtepi8_epi16(super::k4x8::lo8(o, 24 + 16 * p));
        *l = _mm256_set_m128i(_mm_unpackhi_epi16(e, f), _mm_unpacklo_epi16(e, f));
    }
    lsp
}

/// The end of an IQ4_XS group's super-block `b` for T tokens, given each token's exact
/// `sumi` (Σ_j ls_j·Σ v·a per row, with the codebook shifted by 128 when `offset`): the
/// shift's `128·Σ_j ls_j·Σa_j` taken off when `offset`, then the scalar reference's f32 step
/// `acc += (d·d_a)·sumi`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn iq4_finish<const T: usize>(
    o: &[u8; crate::kernels::x8_iq4xs::IQ4XS_X8_BLOCK],
    a: &[crate::kernels::act::Q8KAct<'_>; T],
    b: usize,
    mut sumi: [__m256i; T],
    offset: bool,
    acc: &mut [__m256; T],
) {
    if offset {
        let lsp = scale_pairs(o);
        for t in 0..T {
            let m = super::k4x8::pairs_dot_bsums(&lsp, &a[t], b);
            sumi[t] = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32::<7>(m));
        }
    }
    let d = _mm256_cvtph_ps(super::ld128(super::k4x8::arr::<16>(o, 0)));
    for t in 0..T {
        let da = _mm256_set1_ps(a[t].d(b));
        acc[t] = _mm256_add_ps(
            acc[t],
            _mm256_mul_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(sumi[t])),
        );
    }
}

/// The IQ4_NL codebook in both 128-bit halves, shifted by `add` (0: signed values; 128: the
/// unsigned form `vpdpbusd` takes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn iq4nl_lut256(add: i8) -> __m256i {
    let t = super::iq::iq4nl_lut();
    let t = _mm_add_epi8(t, _mm_set1_epi8(add));
    _mm256_set_m128i(t, t)
}

iq4x8_kernels!(
    "avx2,fma,f16c",
    iq4nl_lut256(0),
    |v| (_mm256_sign_epi8(v, v), v),
    |x, p, a, s| _mm256_add_epi32(
        x,
        _mm256_madd_epi16(_mm256_maddubs_epi16(p.0, _mm256_sign_epi8(a, p.1)), s)
    ),
    |y, s32| y,
    false
);

wrap!(dot_iq4xs_x8 => iq4xs_x8(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) -> ());
wrap!(dot_iq4xs_x8_multi => iq4xs_x8_multi(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) -> ());
