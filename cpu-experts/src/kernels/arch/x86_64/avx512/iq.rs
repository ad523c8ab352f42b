//! IQ4_XS × Q8_K on 512 bits.
//!
//! Scalar, per super-block: `sumf += (d·d_a)·Σ_ib (ls_ib − 32)·Σ_{l<32} kv[nib]·q_a`.
//!
//! Sub-blocks 2k and 2k+1 are 32 bytes of `qs` (16 each: low nibbles elements 0..16, high
//! 16..32) and 64 contiguous activation bytes. The 32 bytes are spread to 128-bit lanes
//! [q₂ₖ, q₂ₖ, q₂ₖ₊₁, q₂ₖ₊₁], shifted right by 0/4/0/4 and masked, then `vpshufb` maps the
//! nibbles through the codebook: 64 signed values in element order. Sign trick (|v| and a
//! byte-mask negation of q_a), `maddubs` (pair sums ≤ 2·127·127), `vpdpwssd` with the two
//! sub-block scales.

use core::arch::x86_64::*;

use super::super::avx2::iq::{iq4nl_lut, iq4xs_scales};
use super::super::avx2::{at, f16_at, hsum_ps, ld256};
use super::{fold256, ld512, pick2, rows_ok, wrap_n};
use crate::kernels::act::Q8KAct;
use crate::kernels::scalar::blocks;

wrap_n!(vec_dot_iq4_xs_q8k, vec_dot_iq4_xs_q8k_multi => iq4_xs_n);

/// See the module comment. Every token's f32 operations are those of N = 1.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn iq4_xs_n<const N: usize>(w: &[u8], acts: [&[u8]; N], n: usize) -> [f32; N] {
    let (Some(wb), Some(a)) = (
        blocks::<136>(w, n / 256),
        rows_ok(acts, |a| Q8KAct::new(a, n)),
    ) else {
        return core::array::from_fn(|t| {
            if N == 1 {
                f32::NAN
            } else {
                iq4_xs_n(w, [acts[t]], n)[0]
            }
        });
    };
    let qa = a.map(|a| a.qs.as_chunks::<256>().0);
    let lut = _mm512_broadcast_i32x4(iq4nl_lut());
    let m4 = _mm512_set1_epi8(0x0F);
    let four = 0x0004_0004_0004_0004i64;
    let shift = _mm512_set_epi64(four, four, 0, 0, four, four, 0, 0);
    let zero = _mm512_setzero_si512();
    let pick: [__m512i; 4] = core::array::from_fn(|k| pick2(2 * k as i16, 2 * k as i16 + 1));
    let mut acc = [_mm256_setzero_ps(); N];
    for (b, blk) in wb.iter().enumerate() {
        let sc = iq4xs_scales(at::<u8, 2, 6, 136>(blk));
        let sc16 = _mm512_castsi128_si512(_mm_setr_epi16(
            sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6], sc[7],
        ));
        let qs = at::<u8, 8, 128, 136>(blk).as_chunks::<32>().0;
        let mut sumi = [_mm512_setzero_si512(); N];
        for k in 0..4 {
            let x = _mm512_castsi256_si512(ld256(&qs[k]));
            let x = _mm512_shuffle_i64x2::<0b01_01_00_00>(x, x);
            let v = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srlv_epi16(x, shift), m4));
            let av = _mm512_abs_epi8(v);
            let neg = _mm512_movepi8_mask(v);
            let s = _mm512_permutexvar_epi16(pick[k], sc16);
            for t in 0..N {
                let y = ld512(&qa[t][b].as_chunks::<64>().0[k]);
                let sy = _mm512_mask_sub_epi8(y, neg, zero, y);
                sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(av, sy), s);
            }
        }
        let dw = f16_at::<0, 136>(blk);
        for t in 0..N {
            let d = _mm256_set1_ps(dw * a[t].d(b));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(fold256(sumi[t])), acc[t]);
        }
    }
    core::array::from_fn(|t| hsum_ps(acc[t]))
}
