//! compressed-tensors pack-quantized int4 × Q8_0 activations (symmetric part; the zero
//! point term is added by `kernels::ct::dot_row`).
//!
//! Scalar: `Σ_g s_g · Σ_{b∈g} d_b · Σ_{l<32} (nib − 8)·q_a`.
//!
//! Bit layout: a row is little-endian int32 words, column c is nibble c of the byte stream,
//! low nibble first (byte c/2, bits 4·(c%2)..). So 32 bytes hold columns 0..64 with even
//! columns in the low nibbles: `unpacklo/hi_epi8(lo, hi)` restores element order per 128-bit
//! lane, giving lanes {0..16, 32..48} and {16..32, 48..64}; the activations are permuted the
//! same way (`vperm2i128`), so each 128-bit lane of the products belongs to one 32-block.
//!
//! Eight blocks (256 columns) per step: the per-block sums of `nib·q_a` are reduced to one
//! i32 per block with three `hadd`s, then
//! `acc += S ⊙ (D ⊙ B − 8·DS)` on 8 f32 lanes, with `S` the per-block weight scale, `D` the
//! activation scales, `DS = d·Σ q_a` — the −8 offset comes back through `DS`, which is why
//! the nibbles can go to `maddubs` unsigned (pair sums ≤ 2·15·127).

use core::arch::x86_64::*;

use lagoon_core::quant::ct::ScaleDtype;

use super::{hsum_ps, ld_ps, ld128, ld256, st256, wrap};
use crate::kernels::act::Q8_0Act;
use crate::kernels::ct::load_scale;

wrap!(vec_dot_ct_nib4_q8_0 => ct_nib4(row: &[u8], scales: &[u8], sd: ScaleDtype, run: usize, a: &[u8], n: usize) -> f32);
wrap!(vec_dot_ct_nib4_perm_q8_0 => ct_nib4_perm(row: &[u8], scales: &[u8], sd: ScaleDtype, run: usize, qperm: &[i8], a: &[u8], n: usize) -> f32);
wrap!(nib4_act_order => nib4_order(qs: &[i8], out: &mut [i8]) -> ());

/// Eight per-block weight scales for blocks `8k..8k+8` (`run` columns per scale, so
/// `per = run/32` blocks share one): one vector load when `per == 1`, a broadcast when a
/// scale spans all eight, else the `8/per` scales loaded and spread with `vpermps`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn block_scales(scales: &[u8], sd: ScaleDtype, per: usize, k: usize) -> __m256 {
    match per {
        1 => match sd {
            ScaleDtype::Bf16 => {
                let s = &scales[16 * k..16 * k + 16].as_chunks::<16>().0[0];
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(ld128(s))))
            }
            ScaleDtype::F16 => {
                _mm256_cvtph_ps(ld128(&scales[16 * k..16 * k + 16].as_chunks::<16>().0[0]))
            }
            ScaleDtype::F32 => ld_ps(&scales[32 * k..32 * k + 32].as_chunks::<32>().0[0]),
        },
        2 | 4 => {
            let g0 = 8 * k / per;
            let s = |i: usize| load_scale(sd, scales, g0 + i);
            let (v, idx) = if per == 2 {
                (
                    _mm256_setr_ps(s(0), s(1), s(2), s(3), 0.0, 0.0, 0.0, 0.0),
                    _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3),
                )
            } else {
                (
                    _mm256_setr_ps(s(0), s(1), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
                    _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
                )
            };
            _mm256_permutevar8x32_ps(v, idx)
        }
        p if p.is_multiple_of(8) => _mm256_set1_ps(load_scale(sd, scales, 8 * k / per)),
        _ => {
            let s: [f32; 8] = core::array::from_fn(|i| load_scale(sd, scales, (8 * k + i) / per));
            _mm256_setr_ps(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7])
        }
    }
}

/// Whether the row's codes and scales cover `n` columns in scale runs of `run` (a multiple
/// of 32).
fn buffers_fit(row: &[u8], scales: &[u8], sd: ScaleDtype, run: usize, n: usize) -> bool {
    row.len() >= n / 2
        && run != 0
        && run.is_multiple_of(32)
        && scales.len() >= n.div_ceil(run) * sd.size()
}

/// `acc + S ⊙ (D ⊙ B − 8·DS)` for the eight blocks of one 256-column step (module comment):
/// `v[p]` holds blocks 2p (lanes 0-3) and 2p + 1 (lanes 4-7) as i32 partial sums, `d` and
/// `ds` the blocks' activation scales, `s` their weight scales.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn eight_blocks(v: [__m256i; 4], d: &[u8; 32], ds: &[u8; 32], s: __m256, acc: __m256) -> __m256 {
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    let bsum = _mm256_cvtepi32_ps(_mm256_permutevar8x32_epi32(h, order));
    let t = _mm256_fmsub_ps(
        ld_ps(d),
        bsum,
        _mm256_mul_ps(_mm256_set1_ps(8.0), ld_ps(ds)),
    );
    _mm256_fmadd_ps(s, t, acc)
}

/// See the module comment. Rows whose block count is not a multiple of 8 finish their last
/// `nb % 8` blocks one by one in scalar code.
#[target_feature(enable = "avx2,fma,f16c")]
fn ct_nib4(row: &[u8], scales: &[u8], sd: ScaleDtype, run: usize, a: &[u8], n: usize) -> f32 {
    let Some(act) = Q8_0Act::new(a, n) else {
        return f32::NAN;
    };
    let nb = n / 32;
    if !buffers_fit(row, scales, sd, run, n) {
        return f32::NAN;
    }
    let n8 = nb / 8;
    let m4 = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let w8 = row.as_chunks::<128>().0;
    let q8 = act.qs.as_chunks::<256>().0;
    let d8 = act.d.as_flattened().as_chunks::<32>().0;
    let ds8 = act.ds.as_flattened().as_chunks::<32>().0;
    let mut acc = _mm256_setzero_ps();
    for k in 0..n8 {
        let (w, q) = (w8[k].as_chunks::<32>().0, q8[k].as_chunks::<32>().0);
        let mut v = [_mm256_setzero_si256(); 4];
        for p in 0..4 {
            let x = ld256(&w[p]);
            let lo = _mm256_and_si256(x, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(x), m4);
            let e1 = _mm256_unpacklo_epi8(lo, hi); // columns 0..16 | 32..48
            let e2 = _mm256_unpackhi_epi8(lo, hi); // columns 16..32 | 48..64
            let (a0, a1) = (ld256(&q[2 * p]), ld256(&q[2 * p + 1]));
            let p1 = _mm256_permute2x128_si256::<0x20>(a0, a1);
            let p2 = _mm256_permute2x128_si256::<0x31>(a0, a1);
            let s16 = _mm256_add_epi16(_mm256_maddubs_epi16(e1, p1), _mm256_maddubs_epi16(e2, p2));
            v[p] = _mm256_madd_epi16(s16, ones); // lanes 0-3: block 2p, 4-7: block 2p+1
        }
        acc = eight_blocks(
            v,
            &d8[k],
            &ds8[k],
            block_scales(scales, sd, run / 32, k),
            acc,
        );
    }
    let mut sum = hsum_ps(acc);
    if n8 * 8 < nb {
        // Tail blocks, one at a time as in the scalar kernel.
        for b in n8 * 8..nb {
            let g = 32 * b / run;
            let s = load_scale(sd, scales, g);
            let qa = &act.qs[32 * b..32 * b + 32];
            let wb = &row[16 * b..16 * b + 16];
            let sumi: i32 = (0..32)
                .map(|c| (i32::from((wb[c / 2] >> (4 * (c % 2))) & 0xF) - 8) * i32::from(qa[c]))
                .sum();
            sum += s * (act.d(b) * sumi as f32);
        }
    }
    sum
}

/// The activation quants in the weights' nibble order, for [`ct_nib4_perm`]: per 64 columns
/// `c0..c0 + 64`, first the 32 even columns (`out[c0 + j] = qs[c0 + 2j]`), then the 32 odd
/// ones (`out[c0 + 32 + j] = qs[c0 + 2j + 1]`). A 32-byte load of a row's codes then pairs
/// its low nibbles with the first half and its high nibbles with the second, with no unpack
/// of the codes and no lane permute of the activations. Written once per activation row
/// and reused for every weight row. `qs.len()` and `out.len()` are equal multiples of 64.
#[target_feature(enable = "avx2,fma,f16c")]
fn nib4_order(qs: &[i8], out: &mut [i8]) {
    // Per 128-bit lane: the 8 even bytes, then the 8 odd ones.
    let split = _mm256_setr_epi8(
        0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5,
        7, 9, 11, 13, 15,
    );
    for (o, q) in out
        .as_chunks_mut::<64>()
        .0
        .iter_mut()
        .zip(qs.as_chunks::<64>().0)
    {
        let q = q.as_chunks::<32>().0;
        // Quadwords: even 0-15, odd 0-15, even 16-31, odd 16-31 → even 0-31, odd 0-31.
        let p =
            |v: __m256i| _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(v, split));
        let (a, b) = (p(ld256(&q[0])), p(ld256(&q[1])));
        let [o0, o1] = o.as_chunks_mut::<32>().0 else {
            unreachable!("64 bytes are two halves of 32")
        };
        st256(o0, _mm256_permute2x128_si256::<0x20>(a, b));
        st256(o1, _mm256_permute2x128_si256::<0x31>(a, b));
    }
}

/// [`ct_nib4`] with the activation quants already in [`nib4_order`] (`qperm`; `a` still
/// gives the block scales). Same lanes, same i32 block sums (maddubs pairs the products
/// differently, but each block's sum is exact), same f32 steps: bit-identical results.
/// Rows whose block count is not a multiple of 8 take [`ct_nib4`].
#[target_feature(enable = "avx2,fma,f16c")]
fn ct_nib4_perm(
    row: &[u8],
    scales: &[u8],
    sd: ScaleDtype,
    run: usize,
    qperm: &[i8],
    a: &[u8],
    n: usize,
) -> f32 {
    let nb = n / 32;
    let Some(act) = Q8_0Act::new(a, n) else {
        return f32::NAN;
    };
    if !nb.is_multiple_of(8) || qperm.len() != n {
        return ct_nib4(row, scales, sd, run, a, n);
    }
    if !buffers_fit(row, scales, sd, run, n) {
        return f32::NAN;
    }
    let m4 = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let w8 = row.as_chunks::<128>().0;
    let q8 = qperm.as_chunks::<256>().0;
    let d8 = act.d.as_flattened().as_chunks::<32>().0;
    let ds8 = act.ds.as_flattened().as_chunks::<32>().0;
    let mut acc = _mm256_setzero_ps();
    for k in 0..nb / 8 {
        let (w, q) = (w8[k].as_chunks::<32>().0, q8[k].as_chunks::<32>().0);
        let mut v = [_mm256_setzero_si256(); 4];
        for p in 0..4 {
            let x = ld256(&w[p]);
            let lo = _mm256_and_si256(x, m4); // even columns: block 2p | block 2p + 1
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(x), m4); // odd columns
            let s16 = _mm256_add_epi16(
                _mm256_maddubs_epi16(lo, ld256(&q[2 * p])),
                _mm256_maddubs_epi16(hi, ld256(&q[2 * p + 1])),
            );
            v[p] = _mm256_madd_epi16(s16, ones); // lanes 0-3: block 2p, 4-7: block 2p+1
        }
        acc = eight_blocks(
            v,
            &d8[k],
            &ds8[k],
            block_scales(scales, sd, run / 32, k),
            acc,
        );
    }
    hsum_ps(acc)
}
