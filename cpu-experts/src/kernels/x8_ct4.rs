//! compressed-tensors int4 rows (pack-quantized, symmetric, group or channel scales) repacked
//! eight at a time: [`super::x8`]'s layout idea for issue #5's int4-g32 decode bar, where the
//! one-row 512-bit kernel (`avx512::ct`) reaches 73% of the 16-core host's read floor
//! (BENCHMARKS.md, session 19). Per 32-column block the one-row kernel re-reads 32 activation
//! bytes and regroups them with two shuffles for 16 weight bytes; here one 64-byte load holds
//! two steps of eight rows, met by an 8-byte activation broadcast per token.
//!
//! Layout of one group of 8 rows ([`Ct4Geom::group_bytes`]): units of `L` scale groups
//! (`L` = [`Ct4Geom::line_groups`], the groups whose eight rows' scales fill one 64-byte line:
//! 4 for 16-bit scales, 2 for f32), unit j covering scale groups `Lj .. Lj + L` and their
//! blocks (`B` = [`Ct4Geom::unit_blocks`] a unit, the last one possibly fewer), each unit one
//! 64-byte line of scales and then 128 bytes of codes per 32-column block (`U = 64 + 128B`
//! bytes a full unit):
//!
//! | bytes | what |
//! |---|---|
//! | `[Uj, Uj + 64)` | scale of group gi, row r, at `Uj + slot(gi, r)·size` (the checkpoint's dtype), then zeros |
//! | `[Uj + 64 + 128i, + 128)` | block b = Bj + i: byte `4k + m` of row r's re-ordered codes at `64(k / 2) + 8r + 4(k % 2) + m` |
//!
//! `slot(gi, r)` is `8(gi − Lj) + r`, except with groups of 32 columns, where groups 2p and
//! 2p + 1 (a full pair, never split: L is even) interleave: `16(p − Lj/2) + 2r + gi % 2`, so
//! one 16-scale load puts row r's two scales in lanes 2r and 2r + 1, where the 512-bit
//! kernel's two blocks of a pair meet them (until session 40 the pairs lay group after group
//! and each took a `vpermd`). A last, unpaired group stays at `8(gi − Lj) + r`.
//!
//! The scales lie in the stream just before the codes they scale, so a thread reads one run
//! front to back (since session 41). Until then they came first in a group, one run of their
//! own (and until session 23 after the codes, worse): a second stream inside each group, and
//! on the Zen 4 VM the one-thread GEMV beside a read reached 57.5% with it against 73.5% for
//! the IQ4_XS 8-row kernel, whose scales are inline; the same move took the Q8_0 8-row kernel
//! (`x8_q8_0`) from 68% to 80% (BENCHMARKS.md, session 41).
//!
//! Re-ordered codes: byte i (0..16) of a block holds element i in its low nibble and element
//! 16 + i in its high one (compressed-tensors packs column c as nibble c, low first). Each
//! 64-byte half of a block holds two 4-byte steps (k = 2h, 2h + 1) of all eight rows with the
//! steps interleaved, row r's in dwords 2r and 2r + 1: one plain 64-byte load puts row r in
//! lanes 2r and 2r + 1, elements `8h .. 8h + 8` in the low nibbles and `16 + 8h ..` in the
//! high ones. (Until session 39 the steps lay one after the other, as in the IQ4_XS layout,
//! and every load took a `vpermd` to interleave them.)
//!
//! Numerics: lanes are rows, and each lane does `kernels::ct`'s scalar row kernel's steps
//! (per block the exact `sumi = Σ (c − 8)·q`, `gsum += d_b·sumi` over the group's blocks from
//! 0, `acc += s_g·gsum`; no FMA), so every kernel here gives its bits. The `8·Σq` term comes
//! from the caller's per-block activation sums ([`Ct4Act::bsum`], [`block_sums`]), computed
//! once per token and call instead of per row group.

use lagoon_core::quant::QK;
use lagoon_core::quant::ct::ScaleDtype;

use super::act::Q8_0Act;

/// Shape of a repacked int4 matrix's rows: columns, columns per scale group (a multiple of
/// 32; `cols` for channel scales), the scales' dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ct4Geom {
    pub cols: usize,
    pub run: usize,
    pub sd: ScaleDtype,
}

impl Ct4Geom {
    /// `None` unless `cols` and `run` are non-zero multiples of 32.
    pub fn new(cols: usize, run: usize, sd: ScaleDtype) -> Option<Self> {
        (cols > 0 && run > 0 && cols.is_multiple_of(QK) && run.is_multiple_of(QK))
            .then_some(Ct4Geom { cols, run, sd })
    }

    /// 32-column blocks per row.
    pub fn blocks(&self) -> usize {
        self.cols / QK
    }

    /// Scale groups per row.
    pub fn groups(&self) -> usize {
        self.cols.div_ceil(self.run)
    }

    /// Scale groups whose eight rows' scales fill one 64-byte line (the module's `L`).
    pub fn line_groups(&self) -> usize {
        64 / (8 * self.sd.size())
    }

    /// 32-column blocks of a full unit (the module's `B`).
    pub fn unit_blocks(&self) -> usize {
        self.line_groups() * self.run / QK
    }

    /// Bytes of a full unit (the module's `U`): a line of scales and its blocks' codes.
    pub fn unit_bytes(&self) -> usize {
        64 + 128 * self.unit_blocks()
    }

    /// Offset of block `b`'s 128 bytes of codes in a group of 8 rows.
    pub fn code_at(&self, b: usize) -> usize {
        let ub = self.unit_blocks();
        (b / ub) * self.unit_bytes() + 64 + 128 * (b % ub)
    }

    /// Bytes of one group of 8 rows.
    pub fn group_bytes(&self) -> usize {
        64 * self.groups().div_ceil(self.line_groups()) + 128 * self.blocks()
    }

    /// Where row `r`'s scale of group `gi` lies in a repacked group, in bytes (the unit's
    /// start plus the module's `slot` times the scale's size).
    pub(crate) fn scale_byte(&self, gi: usize, r: usize) -> usize {
        let (j, l) = (gi / self.line_groups(), self.line_groups());
        let slot = if self.run == QK && gi < (self.groups() & !1) {
            16 * ((gi - l * j) / 2) + 2 * r + gi % 2
        } else {
            8 * (gi - l * j) + r
        };
        j * self.unit_bytes() + slot * self.sd.size()
    }

    /// Blocks `[b0, b1)` of scale group `gi`.
    pub(crate) fn group_blocks(&self, gi: usize) -> (usize, usize) {
        (
            gi * self.run / QK,
            ((gi + 1) * self.run).min(self.cols) / QK,
        )
    }
}

/// One token's activation for the kernels: its Q8_0 row and the exact `Σ q` of each block.
#[derive(Clone, Copy)]
pub struct Ct4Act<'a> {
    pub a: Q8_0Act<'a>,
    pub bsum: &'a [i32],
}

/// The 8-row int4 kernels: `out[t][r]` = row r of the group `p` dotted with token t.
pub type DotCt4X8 = fn(p: &[u8], g: &Ct4Geom, acts: &[Ct4Act<'_>], out: &mut [[f32; 8]]);

/// `out[b] = Σ qs[32b .. 32b + 32]` (exact) for the blocks of `a`. The quantiser stores
/// `ds_b = d_b · Σq` exactly (`act.rs`: an f16 scale times at most 13 bits), so the sum is
/// `ds_b / d_b` wherever that is an integer `S` with `S · d_b == ds_b`: one division per
/// block instead of 32 byte adds (which took ~18% of the 8-row int4 GEMV's time on one
/// thread, perf). Blocks where that fails (a zero or non-finite scale, most rows not from
/// the quantiser) are summed byte by byte. A row not from the quantiser whose `ds` happens to
/// be another integer multiple of `d` gets that integer: the kernels take activation rows
/// from `Kernels::quantize_act` only.
pub fn block_sums(a: &Q8_0Act<'_>, out: &mut [i32]) {
    for (b, (o, q)) in out.iter_mut().zip(a.qs.as_chunks::<QK>().0).enumerate() {
        let (d, ds) = (a.d(b), a.ds(b));
        let s = ds / d;
        *o = if d.is_finite() && d != 0.0 && s.abs() <= 4096.0 && s == s.trunc() && s * d == ds {
            s as i32
        } else {
            q.iter().map(|&x| i32::from(x)).sum()
        };
    }
}

/// A [`block_sums`] implementation.
pub type BlockSums = fn(a: &Q8_0Act<'_>, out: &mut [i32]);

/// The fastest [`BlockSums`] this CPU runs (`x8::x8_pick!`): `vpsadbw` on 512 bits where the
/// vector int4 kernel runs, else [`block_sums`].
pub fn block_sums_fn() -> BlockSums {
    super::x8::x8_pick!(ct4_sums, block_sums)
}

/// Repacks `rows` int4 rows (`weight`: `cols / 2` bytes per row; `scales`: `g.groups()`
/// scales of `g.sd` per row, row after row) into groups of 8 rows. `None` unless `rows` is a
/// multiple of 8 and both buffers are exactly that size.
pub fn repack_ct4_x8(weight: &[u8], scales: &[u8], rows: usize, g: &Ct4Geom) -> Option<Vec<u8>> {
    let (ng, sz) = (g.groups(), g.sd.size());
    let (rb, sb) = (g.cols / 2, ng * sz);
    if rows == 0
        || !rows.is_multiple_of(8)
        || weight.len() != rows * rb
        || scales.len() != rows * sb
    {
        return None;
    }
    let mut out = vec![0u8; rows / 8 * g.group_bytes()];
    for (gr, dst) in out.chunks_exact_mut(g.group_bytes()).enumerate() {
        for r in 0..8 {
            let row = &weight[(8 * gr + r) * rb..][..rb];
            for (b, src) in row.as_chunks::<16>().0.iter().enumerate() {
                let blk = &mut dst[g.code_at(b)..][..128];
                let nib = |c: usize| (src[c / 2] >> (4 * (c % 2))) & 0xF;
                for i in 0..16 {
                    blk[code_byte(r, i)] = nib(i) | (nib(16 + i) << 4);
                }
            }
            let srow = &scales[(8 * gr + r) * sb..][..sb];
            for gi in 0..ng {
                dst[g.scale_byte(gi, r)..][..sz].copy_from_slice(&srow[gi * sz..][..sz]);
            }
        }
    }
    Some(out)
}

/// Where byte i (0..16) of row r's re-ordered codes lies in a repacked block: step k = i / 4
/// in half k / 2, row r's dword pair, the pair's dword k % 2.
const fn code_byte(r: usize, i: usize) -> usize {
    let k = i / 4;
    64 * (k / 2) + 8 * r + 4 * (k % 2) + i % 4
}

/// Scale of group `gi`, row `r` of a repacked group.
fn scale_at(p: &[u8], g: &Ct4Geom, gi: usize, r: usize) -> f32 {
    super::ct::load_scale(g.sd, &p[g.scale_byte(gi, r)..], 0)
}

/// Whether `p`, `acts` and `out` fit `g` (the kernels write NaN everywhere otherwise).
pub(crate) fn fits(p: &[u8], g: &Ct4Geom, acts: &[Ct4Act<'_>], out: &[[f32; 8]]) -> bool {
    p.len() == g.group_bytes()
        && acts.len() == out.len()
        && acts.iter().all(|a| {
            a.a.qs.len() == g.cols && a.a.d.len() == g.blocks() && a.bsum.len() == g.blocks()
        })
}

/// The scalar kernel: each row and token in `kernels::ct`'s scalar order.
pub fn dot_ct4_x8_scalar(p: &[u8], g: &Ct4Geom, acts: &[Ct4Act<'_>], out: &mut [[f32; 8]]) {
    if !fits(p, g, acts, out) {
        out.iter_mut().for_each(|o| *o = [f32::NAN; 8]);
        return;
    }
    for (at, o) in acts.iter().zip(out.iter_mut()) {
        for (r, y) in o.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for gi in 0..g.groups() {
                let (b0, b1) = g.group_blocks(gi);
                let mut gsum = 0.0f32;
                for b in b0..b1 {
                    let blk = &p[g.code_at(b)..][..128];
                    let qa = &at.a.qs[QK * b..][..QK];
                    let mut sumi = 0i32;
                    for i in 0..16 {
                        let byte = blk[code_byte(r, i)];
                        sumi += (i32::from(byte & 0xF) - 8) * i32::from(qa[i])
                            + (i32::from(byte >> 4) - 8) * i32::from(qa[16 + i]);
                    }
                    gsum += at.a.d(b) * sumi as f32;
                }
                acc += scale_at(p, g, gi, r) * gsum;
            }
            *y = acc;
        }
    }
}

/// The fastest [`DotCt4X8`] this CPU runs (`x8::x8_pick!`): the 512-bit VNNI kernel
/// (`avx512::ct4x8z`) where there is one, else the scalar kernel (there is no AVX2 form, so
/// the store repacks int4 only where [`simd`] says there is a vector kernel).
pub fn dot_ct4_x8() -> DotCt4X8 {
    super::x8::x8_pick!(ct4_x8, dot_ct4_x8_scalar)
}

/// Whether this CPU runs a vector [`DotCt4X8`] (unless `LAGOON_FORCE_AVX2=1` keeps AVX-512
/// out).
pub fn simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::kernels::arch::x86_64::ct4_x8(!super::x8::no_avx512()).is_some();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::ct::vec_dot_ct_nib4_q8_0;
    use crate::kernels::x8::testing::{act_q8_0 as act, rng};
    use crate::kernels::{ActFormat, Kernels};

    fn scales(seed: &mut u64, n: usize, sd: ScaleDtype) -> Vec<u8> {
        let mut s = Vec::with_capacity(n * sd.size());
        for _ in 0..n {
            let v = ((rng(seed) % 2000) as f32 - 1000.0) * 1e-5;
            match sd {
                ScaleDtype::Bf16 => s.extend(half::bf16::from_f32(v).to_le_bytes()),
                ScaleDtype::F16 => s.extend(half::f16::from_f32(v).to_le_bytes()),
                ScaleDtype::F32 => s.extend(v.to_le_bytes()),
            }
        }
        s
    }

    fn kernels() -> Vec<(&'static str, DotCt4X8)> {
        #[allow(unused_mut)]
        let mut k: Vec<(&'static str, DotCt4X8)> = vec![("scalar", dot_ct4_x8_scalar)];
        #[cfg(target_arch = "x86_64")]
        k.extend(crate::kernels::arch::x86_64::ct4_x8(true).map(|f| ("avx512", f)));
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            k.len() == 2,
            crate::kernels::arch::x86_64::avx512_table().is_some(),
            "the 512-bit kernel is tested wherever the CPU runs it"
        );
        k
    }

    /// Every kernel, 1..5 tokens at once, group 32 (an even and an odd number of groups: the
    /// 512-bit kernel's paired blocks and its lone last one) / 64 / 128 / channel scales in
    /// each dtype, gives each row and token `vec_dot_ct_nib4_q8_0`'s bits.
    #[test]
    fn ct4_x8_kernels_give_the_scalar_row_kernels_bits() {
        let mut seed = 0x6c8e_9cf5_7a3b_1d27u64;
        for sd in [ScaleDtype::Bf16, ScaleDtype::F16, ScaleDtype::F32] {
            for (rows, cols, run) in [
                (8usize, 32usize, 32usize),
                (16, 1024, 32),
                (8, 3072, 128),
                (24, 512, 512),
                (8, 96, 64),
                (8, 96, 32),
            ] {
                let g = Ct4Geom::new(cols, run, sd).unwrap();
                let w: Vec<u8> = (0..rows * cols / 2).map(|_| rng(&mut seed) as u8).collect();
                let s = scales(&mut seed, rows * g.groups(), sd);
                let p = repack_ct4_x8(&w, &s, rows, &g).unwrap();
                let acts: Vec<Vec<u8>> = [1e-3f32, 1.0, 1e4, 0.5, 2.0]
                    .iter()
                    .map(|&x| act(&mut seed, cols, x))
                    .collect();
                let sums: Vec<Vec<i32>> = acts
                    .iter()
                    .map(|a| {
                        let mut b = vec![0; g.blocks()];
                        block_sums(&Q8_0Act::new(a, cols).unwrap(), &mut b);
                        b
                    })
                    .collect();
                let ca: Vec<Ct4Act<'_>> = acts
                    .iter()
                    .zip(&sums)
                    .map(|(a, b)| Ct4Act {
                        a: Q8_0Act::new(a, cols).unwrap(),
                        bsum: b,
                    })
                    .collect();
                for (name, f) in kernels() {
                    for n in 1..=ca.len() {
                        for (gr, pg) in p.chunks_exact(g.group_bytes()).enumerate() {
                            let mut out = vec![[0.0f32; 8]; n];
                            f(pg, &g, &ca[..n], &mut out);
                            for (t, o) in out.iter().enumerate() {
                                for (r, &y) in o.iter().enumerate() {
                                    let row = 8 * gr + r;
                                    let sb = g.groups() * sd.size();
                                    let want = vec_dot_ct_nib4_q8_0(
                                        &w[row * cols / 2..][..cols / 2],
                                        &s[row * sb..][..sb],
                                        sd,
                                        run,
                                        &acts[t],
                                        cols,
                                    );
                                    assert_eq!(
                                        y.to_bits(),
                                        want.to_bits(),
                                        "{name} {sd:?} {rows}x{cols} run {run} n={n} t={t} row {row}: {y} vs {want}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The block sums from `ds / d` equal the bytes' sums, including a zero block, a NaN
    /// block and a row whose `ds` does not match its quants.
    #[test]
    fn block_sums_are_the_exact_byte_sums() {
        let mut seed = 0x05ee_d0b5_u64;
        let cols = 256;
        let mut x: Vec<f32> = (0..cols)
            .map(|_| ((rng(&mut seed) % 2001) as f32 - 1000.0) * 0.37)
            .collect();
        x[32..64].fill(0.0);
        x[70] = f32::NAN;
        let mut a = act(&mut seed, cols, 1.0);
        Kernels::scalar().quantize_act(ActFormat::Q8_0, &x, &mut a);
        let want = |a: &[u8]| -> Vec<i32> {
            Q8_0Act::new(a, cols)
                .unwrap()
                .qs
                .chunks(32)
                .map(|q| q.iter().map(|&v| i32::from(v)).sum())
                .collect()
        };
        let mut got = vec![0; cols / 32];
        block_sums(&Q8_0Act::new(&a, cols).unwrap(), &mut got);
        assert_eq!(got, want(&a));
        // A tampered ds that is no integer multiple of d: summed byte by byte.
        let nb = cols / 32;
        let at = cols + 4 * nb + 4 * 5;
        let v = f32::from_le_bytes(a[at..at + 4].try_into().unwrap()) + 1.0;
        a[at..at + 4].copy_from_slice(&v.to_le_bytes());
        block_sums(&Q8_0Act::new(&a, cols).unwrap(), &mut got);
        assert_eq!(got, want(&a));
    }

    /// The picked block sums (`vpsadbw` where this CPU has it, else the scalar form) are the
    /// byte sums of the quantiser's rows: odd and even block counts, bytes at their extremes
    /// (every one −128; one −128 a block and the rest 127), zero rows.
    #[test]
    fn fast_block_sums_are_the_byte_sums() {
        let mut seed = 0x51d5_0b5e_u64;
        let f = block_sums_fn();
        for cols in [32, 64, 96, 256, 1024, 3072 + 32] {
            let nb = cols / 32;
            let rows: [Vec<f32>; 4] = [
                (0..cols)
                    .map(|_| ((rng(&mut seed) % 2001) as f32 - 1000.0) * 0.01)
                    .collect(),
                vec![1.0; cols],
                (0..cols)
                    .map(|i| if i % 32 == 0 { -1.0 } else { 1.0 })
                    .collect(),
                vec![0.0; cols],
            ];
            for (k, x) in rows.iter().enumerate() {
                let mut a = vec![0u8; Kernels::act_row_bytes(ActFormat::Q8_0, cols)];
                Kernels::scalar().quantize_act(ActFormat::Q8_0, x, &mut a);
                let qa = Q8_0Act::new(&a, cols).unwrap();
                let want: Vec<i32> = qa
                    .qs
                    .chunks(32)
                    .map(|q| q.iter().map(|&v| i32::from(v)).sum())
                    .collect();
                if k == 1 {
                    assert!(want.iter().all(|&s| s.abs() == 32 * 127 || s == -32 * 128));
                }
                let mut got = vec![i32::MIN; nb];
                f(&qa, &mut got);
                assert_eq!(got, want, "{cols} columns, row {k}");
            }
        }
    }

    #[test]
    fn ct4_repack_refuses_bad_shapes_and_kernels_flag_bad_input() {
        let g = Ct4Geom::new(64, 32, ScaleDtype::Bf16).unwrap();
        assert!(Ct4Geom::new(48, 32, ScaleDtype::Bf16).is_none());
        assert!(Ct4Geom::new(64, 48, ScaleDtype::Bf16).is_none());
        assert!(repack_ct4_x8(&[0; 7 * 32], &[0; 7 * 4], 7, &g).is_none());
        assert!(repack_ct4_x8(&[0; 8 * 32], &[0; 8 * 4 - 1], 8, &g).is_none());
        let p = repack_ct4_x8(&[0; 8 * 32], &[0; 8 * 4], 8, &g).unwrap();
        let a = vec![0u8; Kernels::act_row_bytes(ActFormat::Q8_0, 64)];
        let bs = [0i32; 2];
        let at = Ct4Act {
            a: Q8_0Act::new(&a, 64).unwrap(),
            bsum: &bs,
        };
        for (name, f) in kernels() {
            let mut out = vec![[0.0f32; 8]; 1];
            f(&p[..p.len() - 1], &g, &[at], &mut out);
            assert!(out[0].iter().all(|v| v.is_nan()), "{name}: short group");
            let mut out = vec![[0.0f32; 8]; 2];
            f(&p, &g, &[at], &mut out);
            assert!(
                out.iter().flatten().all(|v| v.is_nan()),
                "{name}: lengths differ"
            );
            let short = Ct4Act {
                a: at.a,
                bsum: &bs[..1],
            };
            let mut out = vec![[0.0f32; 8]; 1];
            f(&p, &g, &[short], &mut out);
            assert!(
                out[0].iter().all(|v| v.is_nan()),
                "{name}: short block sums"
            );
        }
    }
}
