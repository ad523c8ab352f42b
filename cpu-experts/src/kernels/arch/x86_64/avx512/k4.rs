//! Q4_K × Q8_K as a small GEMM on 512 bits (prefill): a block of weight rows times a block
//! of tokens per call, each result bit-identical to AVX2's one-row kernel (`avx2::k4`).
//!
//! Scalar, per super-block b of row r and token t (the one-row kernel's sums):
//! `acc[r,t] += (d_a·d)·Σ_j sc_j·Σ_{l<32} q·q_a` in 8 f32 lanes, lane i holding the
//! elements `4i..4i+4` of every sub-block j (the lanes `maddubs` + `madd` give on 256 bits),
//! and `accm[r,t] += (d_a·dmin)·mins_dot` in 4 lanes; the result is
//! `hsum(acc) − reduce(accm)`. The integer sums are exact, so any grouping of them that
//! keeps that lane partition gives the same f32 operations.
//!
//! How (learned from the register-blocked int8 micro-kernels of ggml's
//! `ggml-cpu/llamafile/sgemm.cpp` and the `vpdpwssd` scale folding of our Q6_K kernel,
//! restated for Q4_K):
//! - each weight row's super-blocks are decoded once per call into [`Dec`]: the 256 nibbles
//!   as bytes in element order, the 8 scales as i16 pairs, the mins, d and dmin;
//! - a zmm holds one sub-block for **two tokens** (token 2p in the low 256 bits, 2p+1 in the
//!   high): the weight sub-block is broadcast to both halves, so `maddubs` + `vpdpwssd` with
//!   the sub-block scale broadcast leave, in each half, exactly the one-row kernel's 8 lanes,
//!   and the f32 step (convert, `d_a·d`, FMA) runs for two (row, token) pairs at once;
//! - a micro-tile is [`R`] rows × 2 pairs (four tokens): 8 integer and 8 f32 accumulators,
//!   4 mins accumulators, in registers over the whole row.

use core::arch::x86_64::*;

use super::super::avx2::k4::scales_mins;
use super::super::avx2::{at, f16_at, hsum_ps, ld128, ld256};
use super::join256;
use crate::kernels::GemmArgs;
use crate::kernels::act::Q8KAct;

/// Rows per micro-tile.
pub(super) const R: usize = 4;
/// Token pairs per micro-tile (four tokens).
const P: usize = 2;
/// Tokens per micro-tile.
pub(super) const T: usize = 2 * P;
/// Widest row the GEMMs take (super-blocks): 12288 columns, Laguna's widest input.
pub(super) const MAX_NB: usize = 48;

/// One decoded Q4_K super-block of one row (320 bytes).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Dec {
    /// Quants 0..15 in element order.
    q: [[u8; 32]; 8],
    /// Sub-block scale j in both i16 halves (the `vpdpwssd` operand, broadcast).
    sc: [i32; 8],
    /// Sub-block mins as i16 (`mins_dot`'s operand).
    mins: [u8; 16],
    d: f32,
    dmin: f32,
}

const DEC0: Dec = Dec {
    q: [[0; 32]; 8],
    sc: [0; 8],
    mins: [0; 16],
    d: 0.0,
    dmin: 0.0,
};

/// Decodes the Q4_K block `blk` (`[0..2) d | [2..4) dmin | [4..16) scales | [16..144) qs`:
/// chunk c of 32 bytes holds sub-block 2c in its low nibbles, 2c+1 in its high).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn decode(blk: &[u8; 144], out: &mut Dec) {
    let m4 = _mm256_set1_epi8(0x0F);
    let qs = at::<u8, 16, 128, 144>(blk).as_chunks::<32>().0;
    for c in 0..4 {
        let x = ld256(&qs[c]);
        let lo = _mm256_and_si256(x, m4);
        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(x), m4);
        // SAFETY: each `q[j]` is 32 writable bytes; `storeu` accepts any alignment.
        unsafe {
            _mm256_storeu_si256(out.q[2 * c].as_mut_ptr().cast(), lo);
            _mm256_storeu_si256(out.q[2 * c + 1].as_mut_ptr().cast(), hi);
        }
    }
    let (sc, m) = scales_mins(at::<u8, 4, 12, 144>(blk));
    let sc32 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(sc)));
    let m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(m)));
    // SAFETY: `sc` is 32 writable bytes, `mins` 16; `storeu` accepts any alignment.
    unsafe {
        let sc2 = _mm256_or_si256(sc32, _mm256_slli_epi32::<16>(sc32));
        _mm256_storeu_si256(out.sc.as_mut_ptr().cast(), sc2);
        _mm_storeu_si128(out.mins.as_mut_ptr().cast(), m16);
    }
    out.d = f16_at::<0, 144>(blk);
    out.dmin = f16_at::<2, 144>(blk);
}

/// Declares the safe [`Gemm`](crate::kernels::Gemm) wrapper `$name` and its driver for a
/// Q8_K-paired type of `$B`-byte blocks: rows decoded `R` at a time by `$decode` into
/// `$dec` (zero value `$zero`), then micro-tiles of `$tile` over groups of `T` tokens.
///
/// `out[t·out_stride + i] = W[i] · act_t` for `i < n_rows`, `t < n_act`, where
/// `w = n_rows` rows of `rb` bytes and `act_t = acts[t·act_stride..][..q8k_row_bytes]`.
/// `false` (nothing written) when a row or an activation is malformed or the row is wider
/// than [`MAX_NB`] super-blocks; the caller then takes the one-row path.
macro_rules! gemm_q8k {
    ($name:ident, $B:literal, $dec:ty, $zero:expr, $decode:ident, $tile:ident) => {
        pub(super) fn $name(g: $crate::kernels::GemmArgs<'_>) -> bool {
            let Some(nb) = g.q8k_blocks($B) else {
                return false;
            };
            let $crate::kernels::GemmArgs {
                w,
                rb,
                n_rows,
                acts,
                act_stride,
                n_act,
                out,
                out_stride,
                ..
            } = g;
            // SAFETY: the driver only needs the features `Avx512Vnni::detect`
            // checks. This wrapper is reachable only through the table built by
            // `avx512::table`, which requires an `Avx512Vnni` token.
            unsafe {
                match nb {
                    ..=2 => {
                        driver::<2>(w, rb, n_rows, acts, act_stride, n_act, nb, out, out_stride)
                    }
                    ..=8 => {
                        driver::<8>(w, rb, n_rows, acts, act_stride, n_act, nb, out, out_stride)
                    }
                    ..=$crate::kernels::arch::x86_64::avx512::k4::MAX_NB => {
                        driver::<{ $crate::kernels::arch::x86_64::avx512::k4::MAX_NB }>(
                            w, rb, n_rows, acts, act_stride, n_act, nb, out, out_stride,
                        )
                    }
                    _ => return false,
                }
            }
            true
        }

        /// The driver with room for `NB ≥ nb` decoded super-blocks per row (so that the
        /// buffer zeroed per call stays near the size used). The caller checked every shape.
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        fn driver<const NB: usize>(
            w: &[u8],
            rb: usize,
            n_rows: usize,
            acts: &[u8],
            act_stride: usize,
            n_act: usize,
            nb: usize,
            out: &mut [f32],
            out_stride: usize,
        ) {
            use $crate::kernels::act::{Q8KAct, q8k_row_bytes};
            use $crate::kernels::arch::x86_64::avx512::k4::{R, T};
            let cols = 256 * nb;
            let ab = q8k_row_bytes(cols);
            let act = |t: usize| {
                Q8KAct::new(&acts[t * act_stride..t * act_stride + ab], cols)
                    .unwrap_or_else(|| unreachable!("checked by the wrapper"))
            };
            let mut dec = [[$zero; NB]; R];
            for r0 in (0..n_rows).step_by(R) {
                let nr = R.min(n_rows - r0);
                for (i, d) in dec[..nr].iter_mut().enumerate() {
                    let row = &w[(r0 + i) * rb..(r0 + i + 1) * rb];
                    let bl = row.as_chunks::<$B>().0;
                    for (blk, db) in bl[..nb].iter().zip(d.iter_mut()) {
                        $decode(blk, db);
                    }
                }
                for t0 in (0..n_act).step_by(T) {
                    let nt = T.min(n_act - t0);
                    // Short groups repeat their last token; the repeats are not written.
                    let a: [Q8KAct<'_>; T] = core::array::from_fn(|k| act(t0 + k.min(nt - 1)));
                    let res = match (nr, nt) {
                        (4, 3..) => $tile::<4, 2, NB>(&dec, nb, &a),
                        (4, _) => $tile::<4, 1, NB>(&dec, nb, &a),
                        (3, 3..) => $tile::<3, 2, NB>(&dec, nb, &a),
                        (3, _) => $tile::<3, 1, NB>(&dec, nb, &a),
                        (2, 3..) => $tile::<2, 2, NB>(&dec, nb, &a),
                        (2, _) => $tile::<2, 1, NB>(&dec, nb, &a),
                        (_, 3..) => $tile::<1, 2, NB>(&dec, nb, &a),
                        (_, _) => $tile::<1, 1, NB>(&dec, nb, &a),
                    };
                    for (i, rr) in res[..nr].iter().enumerate() {
                        for (k, &v) in rr[..nt].iter().enumerate() {
                            out[(t0 + k) * out_stride + r0 + i] = v;
                        }
                    }
                }
            }
        }
    };
}
pub(super) use gemm_q8k;

/// Rows decoded at once by the Q4_K driver: the row tiles of the callers (`exec`'s
/// `ROW_TILE`), so that each token group's operands ([`TokB`]) are formed once per call.
const ROWS: usize = 16;

/// Tokens from which rows are decoded [`ROWS`] at a time (below, [`R`] at a time).
const MIN_TOKENS_CHUNKED: usize = 4 * T;

/// The Q4_K [`Gemm`](crate::kernels::Gemm) (same contract as the [`gemm_q8k`] wrappers).
/// Unlike them, its driver forms each token group's per-super-block operands once and
/// runs every row group of up to [`ROWS`] decoded rows with them, instead of re-forming
/// them per row group; the arithmetic of each result is unchanged.
pub(super) fn q4k_q8k_gemm(g: GemmArgs<'_>) -> bool {
    let Some(nb) = g.q8k_blocks(144) else {
        return false;
    };
    let GemmArgs {
        w,
        rb,
        n_rows,
        acts,
        act_stride,
        n_act,
        out,
        out_stride,
        ..
    } = g;
    // SAFETY: the driver only needs the features `Avx512Vnni::detect` checks. This wrapper
    // is reachable only through the table built by `avx512::table`, which requires an
    // `Avx512Vnni` token.
    unsafe {
        // Few tokens: chunks of R rows (the old loop order; a smaller buffer to zero and
        // little setup to share). Measured on the 2-core VM, 16 rows of 8 super-blocks:
        // RC = 16 is 0.92x the time of RC = R at 64 tokens, 0.98x at 512, 1.15x at 8.
        let wide = n_act >= MIN_TOKENS_CHUNKED;
        match nb {
            0..=2 if wide => {
                driver4::<2, ROWS>(w, rb, n_rows, acts, act_stride, n_act, nb, out, out_stride)
            }
            0..=2 => driver4::<2, R>(w, rb, n_rows, acts, act_stride, n_act, nb, out, out_stride),
            3..=8 if wide => {
                driver4::<8, ROWS>(w, rb, n_rows, acts, act_stride, n_act, nb, out, out_stride)
            }
            3..=8 => driver4::<8, R>(w, rb, n_rows, acts, act_stride, n_act, nb, out, out_stride),
            9..=MAX_NB if wide => {
                driver4::<MAX_NB, ROWS>(w, rb, n_rows, acts, act_stride, n_act, nb, out, out_stride)
            }
            9..=MAX_NB => {
                driver4::<MAX_NB, R>(w, rb, n_rows, acts, act_stride, n_act, nb, out, out_stride)
            }
            _ => return false,
        }
    }
    true
}

/// One token group's operands for one super-block: `d_a` per pair half ([`P`] vectors), per
/// token quarter (the mins' lanes), and the four tokens' sums of adjacent `bsums` pairs.
#[derive(Clone, Copy)]
struct TokB {
    dav: [__m512; P],
    dam: __m512,
    pairs: __m512i,
}

/// [`TokB`] of super-block `b` for the four tokens `a` (as `tile` formed them).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tok_b(a: &[Q8KAct<'_>; T], b: usize) -> TokB {
    let da: [f32; T] = core::array::from_fn(|k| a[k].d(b));
    let dav: [__m512; P] = core::array::from_fn(|p| {
        _mm512_castsi512_ps(join256(
            _mm256_castps_si256(_mm256_set1_ps(da[2 * p])),
            _mm256_castps_si256(_mm256_set1_ps(da[2 * p + 1])),
        ))
    });
    let dam = _mm512_setr_ps(
        da[0], da[0], da[0], da[0], da[1], da[1], da[1], da[1], da[2], da[2], da[2], da[2], da[3],
        da[3], da[3], da[3],
    );
    let pairs: [__m128i; T] = core::array::from_fn(|k| {
        let h = a[k].bsums.as_chunks::<16>().0[b]
            .as_flattened()
            .as_chunks::<16>()
            .0;
        _mm_hadd_epi16(ld128(&h[0]), ld128(&h[1]))
    });
    let pairs = join256(
        _mm256_set_m128i(pairs[1], pairs[0]),
        _mm256_set_m128i(pairs[3], pairs[2]),
    );
    TokB { dav, dam, pairs }
}

/// The Q4_K driver: rows in chunks of `RC` (a multiple of [`R`]) decoded once; per group of [`T`] tokens,
/// the operands of every super-block formed once, then every row group of the chunk.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn driver4<const NB: usize, const RC: usize>(
    w: &[u8],
    rb: usize,
    n_rows: usize,
    acts: &[u8],
    act_stride: usize,
    n_act: usize,
    nb: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    use crate::kernels::act::q8k_row_bytes;
    let cols = 256 * nb;
    let ab = q8k_row_bytes(cols);
    let act = |t: usize| {
        Q8KAct::new(&acts[t * act_stride..t * act_stride + ab], cols)
            .unwrap_or_else(|| unreachable!("checked by the wrapper"))
    };
    let mut dec = [[DEC0; NB]; RC];
    let zero = TokB {
        dav: [_mm512_setzero_ps(); P],
        dam: _mm512_setzero_ps(),
        pairs: _mm512_setzero_si512(),
    };
    let mut tb = [zero; NB];
    for c0 in (0..n_rows).step_by(RC) {
        let nc = RC.min(n_rows - c0);
        for (i, d) in dec[..nc].iter_mut().enumerate() {
            let row = &w[(c0 + i) * rb..(c0 + i + 1) * rb];
            for (blk, db) in row.as_chunks::<144>().0[..nb].iter().zip(d.iter_mut()) {
                decode(blk, db);
            }
        }
        for t0 in (0..n_act).step_by(T) {
            let nt = T.min(n_act - t0);
            // Short groups repeat their last token; the repeats are not written.
            let a: [Q8KAct<'_>; T] = core::array::from_fn(|k| act(t0 + k.min(nt - 1)));
            for (b, x) in tb[..nb].iter_mut().enumerate() {
                *x = tok_b(&a, b);
            }
            for r0 in (0..nc).step_by(R) {
                let nr = R.min(nc - r0);
                let dec: &[[Dec; NB]; R] = dec[r0..r0 + R]
                    .try_into()
                    .unwrap_or_else(|_| unreachable!("RC is a multiple of R"));
                let res = match (nr, nt) {
                    (4, 3..) => tile::<4, 2, NB>(dec, nb, &a, &tb),
                    (4, _) => tile::<4, 1, NB>(dec, nb, &a, &tb),
                    (3, 3..) => tile::<3, 2, NB>(dec, nb, &a, &tb),
                    (3, _) => tile::<3, 1, NB>(dec, nb, &a, &tb),
                    (2, 3..) => tile::<2, 2, NB>(dec, nb, &a, &tb),
                    (2, _) => tile::<2, 1, NB>(dec, nb, &a, &tb),
                    (_, 3..) => tile::<1, 2, NB>(dec, nb, &a, &tb),
                    (_, _) => tile::<1, 1, NB>(dec, nb, &a, &tb),
                };
                for (i, rr) in res[..nr].iter().enumerate() {
                    for (k, &v) in rr[..nt].iter().enumerate() {
                        out[(t0 + k) * out_stride + c0 + r0 + i] = v;
                    }
                }
            }
        }
    }
}

/// One micro-tile: rows `0..RR` of `dec` × token pairs `0..PP` of `a` over `nb`
/// super-blocks; `res[r][t]` for `t < 2·PP`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tile<const RR: usize, const PP: usize, const NB: usize>(
    dec: &[[Dec; NB]; R],
    nb: usize,
    a: &[Q8KAct<'_>; T],
    tb: &[TokB; NB],
) -> [[f32; T]; R] {
    let mut facc = [[_mm512_setzero_ps(); PP]; RR];
    let mut macc = [_mm512_setzero_ps(); RR];
    let qa: [&[[i8; 256]]; T] = core::array::from_fn(|k| &a[k].qs.as_chunks::<256>().0[..nb]);
    for b in 0..nb {
        let mut acc = [[_mm512_setzero_si512(); PP]; RR];
        for j in 0..8 {
            let av: [__m512i; PP] = core::array::from_fn(|p| {
                let lo = &qa[2 * p][b].as_chunks::<32>().0[j];
                let hi = &qa[2 * p + 1][b].as_chunks::<32>().0[j];
                join256(ld256(lo), ld256(hi))
            });
            for r in 0..RR {
                let d = &dec[r][b];
                let wv = _mm512_broadcast_i64x4(ld256(&d.q[j]));
                let s = _mm512_set1_epi32(d.sc[j]);
                for p in 0..PP {
                    let prod = _mm512_maddubs_epi16(wv, av[p]);
                    acc[r][p] = _mm512_dpwssd_epi32(acc[r][p], prod, s);
                }
            }
        }
        let TokB { dav, dam, pairs } = tb[b];
        for r in 0..RR {
            let d = &dec[r][b];
            let dw = _mm512_set1_ps(d.d);
            for p in 0..PP {
                let dd = _mm512_mul_ps(dav[p], dw);
                facc[r][p] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(acc[r][p]), facc[r][p]);
            }
            let m = _mm512_broadcast_i32x4(ld128(&d.mins));
            let md = _mm512_madd_epi16(m, pairs);
            let dmin = _mm512_mul_ps(dam, _mm512_set1_ps(d.dmin));
            macc[r] = _mm512_fmadd_ps(dmin, _mm512_cvtepi32_ps(md), macc[r]);
        }
    }
    let mut res = [[0.0f32; T]; R];
    for r in 0..RR {
        let mut m = [0.0f32; 16];
        // SAFETY: `m` is 16 writable f32; `storeu` accepts any alignment.
        unsafe { _mm512_storeu_ps(m.as_mut_ptr(), macc[r]) };
        for p in 0..PP {
            let mut f = [0.0f32; 16];
            // SAFETY: as above.
            unsafe { _mm512_storeu_ps(f.as_mut_ptr(), facc[r][p]) };
            for h in 0..2 {
                let k = 2 * p + h;
                // SAFETY: 8 (resp. 4) f32 inside the 16 of `f` (resp. `m`).
                let (acc, accm) = unsafe {
                    (
                        _mm256_loadu_ps(f.as_ptr().add(8 * h)),
                        _mm_loadu_ps(m.as_ptr().add(4 * k)),
                    )
                };
                // The one-row kernel's final reduction, operation for operation.
                let mm = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
                let mm = _mm_add_ss(mm, _mm_movehdup_ps(mm));
                res[r][k] = hsum_ps(acc) - _mm_cvtss_f32(mm);
            }
        }
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::act::{q8k_row_bytes, quantize_row_q8k};

    /// xorshift64 bytes.
    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 32) as u8
            })
            .collect()
    }

    /// Every result of one call over many rows and tokens (several row chunks, ragged
    /// groups, narrow and wide rows) equals the one-row, one-token call bit for bit.
    #[test]
    fn chunked_driver_matches_one_by_one() {
        if !std::is_x86_feature_detected!("avx512vnni")
            || !std::is_x86_feature_detected!("avx512bw")
            || !std::is_x86_feature_detected!("avx512vl")
        {
            eprintln!("skipped: needs AVX-512 VNNI");
            return;
        }
        for (nb, rows, toks, seed) in [
            (2, 37, 21, 1u64),
            (9, 35, 19, 2),
            (9, 18, 3, 3),
            (8, 16, 9, 4),
        ] {
            let (cols, rb) = (256 * nb, 144 * nb);
            let mut w = bytes(rows * rb, seed);
            for blk in w.chunks_exact_mut(144) {
                // Finite f16 d and dmin (small normal values).
                blk[..4].copy_from_slice(&[0x00, 0x20, 0x00, 0x1c]);
            }
            let ab = q8k_row_bytes(cols);
            let mut acts = vec![0u8; toks * ab];
            for (t, a) in acts.chunks_exact_mut(ab).enumerate() {
                let x: Vec<f32> = bytes(cols, seed * 100 + t as u64)
                    .iter()
                    .map(|&b| (b as f32 - 128.0) / 64.0)
                    .collect();
                quantize_row_q8k(&x, a);
            }
            let mut all = vec![f32::NAN; toks * rows];
            assert!(q4k_q8k_gemm(GemmArgs {
                w: &w,
                rb,
                n_rows: rows,
                acts: &acts,
                act_stride: ab,
                n_act: toks,
                cols,
                out: &mut all,
                out_stride: rows,
            }));
            assert!(all.iter().all(|x| x.is_finite()) && all.iter().any(|&x| x != 0.0));
            for r in 0..rows {
                for t in 0..toks {
                    let mut one = [f32::NAN];
                    let wr = &w[r * rb..(r + 1) * rb];
                    let a = &acts[t * ab..(t + 1) * ab];
                    assert!(q4k_q8k_gemm(GemmArgs {
                        w: wr,
                        rb,
                        n_rows: 1,
                        acts: a,
                        act_stride: ab,
                        n_act: 1,
                        cols,
                        out: &mut one,
                        out_stride: 1,
                    }));
                    assert_eq!(
                        all[t * rows + r].to_bits(),
                        one[0].to_bits(),
                        "nb {nb} row {r} token {t}: {} vs {}",
                        all[t * rows + r],
                        one[0]
                    );
                }
            }
        }
    }
}
