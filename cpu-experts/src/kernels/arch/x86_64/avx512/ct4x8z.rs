//! compressed-tensors int4 × Q8_0 for eight repacked rows (`kernels::x8_ct4`'s layout) on 512
//! bits with AVX512-VNNI.
//!
//! Per 32-column block: two 64-byte loads, each two steps of the eight rows, interleaved at
//! repack (row r's dwords in lanes 2r and 2r + 1), a nibble mask and a shift with a mask (no
//! codebook: the codes are the values plus 8), and per token two
//! `vpdpbusd` against 8-byte activation broadcasts (`iq4x8z::bcast8`; the re-ordered codes
//! meet the activation in Q8_0 order, so no shuffle per token). The unsigned codes' `8·Σq`
//! comes off the row sums per block from the caller's block sums. The pairs of lanes are
//! added (exact i32) but not narrowed: the f32 steps run on 16 lanes whose even ones are the
//! rows (the scales loaded into the even lanes), and the even lanes are narrowed once at the
//! end. With groups of 32 columns two blocks share one f32 step instead, block b in the even
//! lanes and b + 1 in the odd ones (`tokens`).
//!
//! The per-row integer `sumi` is exact and the f32 steps are `kernels::ct`'s scalar ones per
//! row (`gsum += d_b·sumi`, `acc += s·gsum`, no FMA), so every output is its bits.

use core::arch::x86_64::*;

use lagoon_core::quant::ct::ScaleDtype;

use super::iq4x8z::bcast8;
use super::{Avx512Vnni, ld512};
use crate::kernels::act::Q8_0Act;
use crate::kernels::arch::x86_64::avx2::k4x8::{self as x8b, arr};
use crate::kernels::x8_ct4::{BlockSums, Ct4Act, Ct4Geom, DotCt4X8, fits};

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn ct4_x8z(p: &[u8], g: &Ct4Geom, acts: &[Ct4Act<'_>], out: &mut [[f32; 8]]) {
    if !fits(p, g, acts, out) {
        out.iter_mut().for_each(|o| *o = [f32::NAN; 8]);
        return;
    }
    let mut t0 = 0;
    while t0 < acts.len() {
        let (a, o) = (&acts[t0..], &mut out[t0..]);
        t0 += match a.len() {
            1 => tokens::<1>(p, g, a, o),
            2 => tokens::<2>(p, g, a, o),
            3 => tokens::<3>(p, g, a, o),
            _ => tokens::<4>(p, g, a, o),
        };
    }
}

/// The eight rows' scales of a group as f32 in the even lanes (odd lanes zero), from byte `o`
/// (`Ct4Geom::scale_byte(gi, 0)` of any group but a paired one of 32 columns).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn scales16(p: &[u8], g: &Ct4Geom, o: usize) -> __m512 {
    let bits = match g.sd {
        ScaleDtype::Bf16 => {
            // SAFETY: `arr` gives 16 readable bytes; `loadu` accepts any alignment.
            let v = unsafe { _mm_loadu_si128(arr::<16>(p, o).as_ptr().cast()) };
            _mm512_slli_epi64::<16>(_mm512_cvtepu16_epi64(v))
        }
        ScaleDtype::F16 => {
            // SAFETY: as above.
            let v = unsafe { _mm_loadu_si128(arr::<16>(p, o).as_ptr().cast()) };
            _mm512_cvtepu32_epi64(_mm256_castps_si256(_mm256_cvtph_ps(v)))
        }
        ScaleDtype::F32 => {
            // SAFETY: `arr` gives 32 readable bytes; `loadu` accepts any alignment.
            let v = unsafe { _mm256_loadu_si256(arr::<32>(p, o).as_ptr().cast()) };
            _mm512_cvtepu32_epi64(v)
        }
    };
    _mm512_castsi512_ps(bits)
}

/// Block b's code dots (its codes at byte `o`) for the first T tokens of `a`: row r's two
/// halves in lanes 2r and 2r + 1 (before `8·Σq` comes off).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn block_dots<const T: usize>(
    p: &[u8],
    o: usize,
    b: usize,
    a: &[Ct4Act<'_>],
    pd: x8b::Ahead,
) -> [__m512i; T] {
    let m4 = _mm512_set1_epi8(0x0F);
    x8b::prefetch(&p[o..][..128], pd);
    let mut s = [_mm512_setzero_si512(); T];
    for kp in 0..2 {
        let w = ld512(arr::<64>(p, o + 64 * kp));
        let lo = _mm512_and_si512(w, m4);
        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(w), m4);
        for t in 0..T {
            let q = &a[t].a.qs[32 * b..];
            s[t] = _mm512_dpbusd_epi32(s[t], lo, bcast8(&q[8 * kp..]));
            s[t] = _mm512_dpbusd_epi32(s[t], hi, bcast8(&q[16 + 8 * kp..]));
        }
    }
    s
}

/// The eight rows' scales of a full pair of groups gi (even) and gi + 1 from byte `o`
/// (`Ct4Geom::scale_byte(gi, 0)`): row r's in lanes 2r and 2r + 1, as the repack interleaves
/// them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn scales_pair(p: &[u8], g: &Ct4Geom, o: usize) -> __m512 {
    match g.sd {
        ScaleDtype::Bf16 => {
            // SAFETY: `arr` gives 32 readable bytes; `loadu` accepts any alignment.
            let v = unsafe { _mm256_loadu_si256(arr::<32>(p, o).as_ptr().cast()) };
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(v)))
        }
        ScaleDtype::F16 => {
            // SAFETY: as above.
            let v = unsafe { _mm256_loadu_si256(arr::<32>(p, o).as_ptr().cast()) };
            _mm512_cvtph_ps(v)
        }
        ScaleDtype::F32 => {
            // SAFETY: `arr` gives 64 readable bytes; `loadu` accepts any alignment.
            unsafe { _mm512_loadu_ps(arr::<64>(p, o).as_ptr().cast()) }
        }
    }
}

/// Two adjacent 4-byte values as one 64-bit lane pattern (`x` low, `y` high).
#[inline]
fn pair64(x: [u8; 4], y: [u8; 4]) -> i64 {
    i64::from(u32::from_le_bytes(x)) | (i64::from(u32::from_le_bytes(y)) << 32)
}

/// One pass over the group for the first T tokens of `a`; returns T. With groups of 32
/// columns (one block each), two blocks share one 16-lane f32 step ([`pairs32`]); other
/// group sizes take [`groups`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tokens<const T: usize>(p: &[u8], g: &Ct4Geom, a: &[Ct4Act<'_>], out: &mut [[f32; 8]]) -> usize {
    let pd = x8b::prefetch_ahead();
    let mut acc = [_mm512_setzero_ps(); T];
    match (g.run, g.line_groups()) {
        (32, 4) => pairs32::<T, 2>(p, g, a, pd, &mut acc),
        (32, _) => pairs32::<T, 1>(p, g, a, pd, &mut acc),
        _ => groups::<T>(p, g, a, pd, &mut acc),
    }
    for (o, v) in out.iter_mut().zip(acc) {
        // The even lanes (the rows) narrowed to eight.
        let rows = _mm512_cvtepi64_epi32(_mm512_castps_si512(v));
        // SAFETY: `o` is 8 writable f32 (32 bytes); `storeu` accepts any alignment.
        unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), rows) };
    }
    T
}

/// Groups of 32 columns, unit by unit (`x8_ct4`'s layout: a line of scales, then the codes
/// they scale): `PPU` full pairs a unit (2 with 16-bit scales, 1 with f32), each [`pair`]; an
/// odd last group alone ([`group`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn pairs32<const T: usize, const PPU: usize>(
    p: &[u8],
    g: &Ct4Geom,
    a: &[Ct4Act<'_>],
    pd: x8b::Ahead,
    acc: &mut [__m512; T],
) {
    let (ub, npairs) = (g.unit_bytes(), g.groups() / 2);
    // A pair's 16 scales take 64 / PPU bytes.
    let sb = 64 / PPU;
    let mut unit = 0;
    for u in 0..npairs / PPU {
        for k in 0..PPU {
            pair::<T>(
                p,
                g,
                unit + sb * k,
                unit + 64 + 256 * k,
                2 * (PPU * u + k),
                a,
                pd,
                acc,
            );
        }
        unit += ub;
    }
    if npairs % PPU == 1 {
        pair::<T>(p, g, unit, unit + 64, 2 * (npairs - 1), a, pd, acc);
    }
    if g.groups() % 2 == 1 {
        let gi = g.groups() - 1;
        group::<T>(p, g, gi, g.scale_byte(gi, 0), g.code_at(gi), a, pd, acc);
    }
}

/// Other group sizes, unit by unit, each group by [`group`] (its blocks' codes in a run).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn groups<const T: usize>(
    p: &[u8],
    g: &Ct4Geom,
    a: &[Ct4Act<'_>],
    pd: x8b::Ahead,
    acc: &mut [__m512; T],
) {
    let (l, ub, sz) = (g.line_groups(), g.unit_bytes(), g.sd.size());
    let (mut unit, mut gi) = (0, 0);
    while gi < g.groups() {
        // The unit's groups gi .. gi + l: group gi + k's scales at `unit + 8k·size`, its
        // first block's codes at `unit + 64 + 128·(its first block − the unit's)`.
        let b0 = g.group_blocks(gi).0;
        for k in 0..l.min(g.groups() - gi) {
            let gb0 = g.group_blocks(gi + k).0;
            let co = unit + 64 + 128 * (gb0 - b0);
            group::<T>(p, g, gi + k, unit + 8 * k * sz, co, a, pd, acc);
        }
        gi += l;
        unit += ub;
    }
}

/// A full pair of groups of 32 columns, gi (even; block b = gi) and gi + 1, their scales at
/// byte `so` and codes at `co`: block b in the even lanes, b + 1 in the odd ones, their terms
/// added to the rows' sums in order (b's, then b + 1's shifted down), so each row's f32 steps
/// are still the scalar kernel's.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn pair<const T: usize>(
    p: &[u8],
    g: &Ct4Geom,
    so: usize,
    co: usize,
    b: usize,
    a: &[Ct4Act<'_>],
    pd: x8b::Ahead,
    acc: &mut [__m512; T],
) {
    let c = b + 1;
    let s0 = block_dots::<T>(p, co, b, a, pd);
    let s1 = block_dots::<T>(p, co + 128, c, a, pd);
    let sc = scales_pair(p, g, so);
    for t in 0..T {
        // Row r's sums: block b's into lane 2r, block c's into lane 2r + 1. Each lane pair's
        // halves are swapped in one operand (`vpshufd`), so one add makes both: [b even, c
        // odd] + [b odd, c even] (exact i32, 4 operations where two shifts, two adds and a
        // blend took 5).
        let u = _mm512_mask_blend_epi32(0xAAAA, s0[t], s1[t]);
        let w =
            _mm512_shuffle_epi32::<0b10_11_00_01>(_mm512_mask_blend_epi32(0xAAAA, s1[t], s0[t]));
        let v = _mm512_add_epi32(u, w);
        let at = &a[t];
        let q = _mm512_slli_epi32::<3>(_mm512_set1_epi64(pair64(
            at.bsum[b].to_le_bytes(),
            at.bsum[c].to_le_bytes(),
        )));
        let d = _mm512_castsi512_ps(_mm512_set1_epi64(pair64(at.a.d[b], at.a.d[c])));
        let x = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(v, q)));
        // The scalar kernel's gsum = 0 + d·sumi, then acc += s·gsum, b before c. The `0 +` is
        // left out: it changes only a −0 to +0, and the sums start at +0, so adding s·(−0)
        // or s·(+0) gives the same bits (a sum is −0 only when both of its terms are).
        let y = _mm512_mul_ps(sc, x);
        let r = _mm512_add_ps(acc[t], y);
        acc[t] = _mm512_add_ps(
            r,
            _mm512_castsi512_ps(_mm512_srli_epi64::<32>(_mm512_castps_si512(y))),
        );
    }
}

/// Group gi alone, its scales at byte `so` and its blocks' codes from `co` on, 128 bytes each.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn group<const T: usize>(
    p: &[u8],
    g: &Ct4Geom,
    gi: usize,
    so: usize,
    co: usize,
    a: &[Ct4Act<'_>],
    pd: x8b::Ahead,
    acc: &mut [__m512; T],
) {
    let (b0, b1) = g.group_blocks(gi);
    let mut gsum = [_mm512_setzero_ps(); T];
    for b in b0..b1 {
        let s = block_dots::<T>(p, co + 128 * (b - b0), b, a, pd);
        for t in 0..T {
            // Row r's lanes 2r and 2r + 1 added into lane 2r, less 8·Σq: the exact sumi.
            let pair = _mm512_add_epi32(s[t], _mm512_srli_epi64::<32>(s[t]));
            let sumi = _mm512_sub_epi32(pair, _mm512_set1_epi32(8 * a[t].bsum[b]));
            let x = _mm512_mul_ps(_mm512_set1_ps(a[t].a.d(b)), _mm512_cvtepi32_ps(sumi));
            gsum[t] = _mm512_add_ps(gsum[t], x);
        }
    }
    let sc = scales16(p, g, so);
    for t in 0..T {
        acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(sc, gsum[t]));
    }
}

/// `x8_ct4::block_sums` by `vpsadbw`: each 64-byte load is two blocks, their bytes flipped to
/// `q + 128` (unsigned) and summed in 8-byte runs, four runs a block, less `32·128`: exact,
/// about 8 ops a block. The scalar form's division and checks took ~5.5 ns a block on the Zen
/// 5 VM (527 ns for a 3,072-column row, once per call of the 8-row kernels: ~40% of a 16-row
/// tile's kernel time).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn ct4_sums_z(a: &Q8_0Act<'_>, out: &mut [i32]) {
    let flip = _mm512_set1_epi8(-128);
    let zero = _mm512_setzero_si512();
    // The four 8-byte sums of one block (u64 lanes) to one i32, less the flip's 32·128.
    let block = |v: __m256i| {
        let s = _mm_add_epi64(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        (_mm_cvtsi128_si64(s) + _mm_extract_epi64::<1>(s)) as i32 - 32 * 128
    };
    let (pairs, _) = a.qs.as_chunks::<64>();
    let (outs, tail) = out.as_chunks_mut::<2>();
    for (o, c) in outs.iter_mut().zip(pairs) {
        let s = _mm512_sad_epu8(_mm512_xor_si512(ld512(c), flip), zero);
        *o = [
            block(_mm512_castsi512_si256(s)),
            block(_mm512_extracti64x4_epi64::<1>(s)),
        ];
    }
    if let [t] = tail {
        *t = a.qs[64 * outs.len()..][..32]
            .iter()
            .map(|&q| i32::from(q))
            .sum();
    }
}

fn ct4_sums(a: &Q8_0Act<'_>, out: &mut [i32]) {
    if a.qs.len() != 32 * out.len() {
        // The scalar form checks the shapes its own way.
        return crate::kernels::x8_ct4::block_sums(a, out);
    }
    // SAFETY: as for `dot_ct4_x8z` (reachable only through `ct4_sums_fn`).
    unsafe { ct4_sums_z(a, out) }
}

/// The block sums' vector form, for a CPU with AVX512-VNNI (the kernel's set).
pub(crate) fn ct4_sums_fn(_proof: Avx512Vnni) -> BlockSums {
    ct4_sums
}

fn dot_ct4_x8z(p: &[u8], g: &Ct4Geom, acts: &[Ct4Act<'_>], out: &mut [[f32; 8]]) {
    // SAFETY: `ct4_x8z` only needs the features `Avx512Vnni::detect` checks; this function is
    // reachable only through `ct4_x8z_fn`, which requires an `Avx512Vnni` token.
    unsafe { ct4_x8z(p, g, acts, out) }
}

/// The kernel, for a CPU with AVX512-VNNI.
pub(crate) fn ct4_x8z_fn(_proof: Avx512Vnni) -> DotCt4X8 {
    dot_ct4_x8z
}
