//! Q4_K × Q8_K for eight repacked rows at once (`kernels::x8`'s layout): lanes are rows.
//!
//! Per super-block and chunk c (sub-blocks 2c and 2c + 1): eight steps k, each one 32-byte
//! load (four quant bytes of every row), two nibble masks, two broadcasts of four activation
//! bytes, two `maddubs` and two i16 adds. The i16 sums stay exact over the eight steps
//! (`|u·a + u·a| ≤ 2·15·128 = 3840` per step, ≤ 30,720 after eight). Then per sub-block one
//! `madd` by the eight rows' scales (each in both i16 halves of its row's lane) widens and
//! scales them. The mins term is four `madd`s of the rows' (m_2p, m_2p+1) pairs by the
//! token's paired block sums. The f32 steps are the scalar reference's, one row per lane, so
//! the results are its bits.
//!
//! The kernel body is the macro [`x8_kernels!`], instantiated here for AVX2 (`maddubs` into
//! i16, then `madd` by ones) and in `avx512::x8` for AVX512-VNNI on 256 bits (`vpdpbusd`
//! straight into i32): the same exact i32 lanes, so the same bits.

use core::arch::x86_64::*;

use super::wrap;

/// Four activation bytes broadcast to the eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn bcast4(b: &[i8; 4]) -> __m256i {
    // SAFETY: `b` is 4 readable bytes; `read_unaligned` accepts any alignment.
    _mm256_set1_epi32(unsafe { core::ptr::read_unaligned(b.as_ptr().cast::<i32>()) })
}

/// `&v[o..o + N]` as an array (bounds-checked).
#[inline(always)]
pub(crate) fn arr<const N: usize>(v: &[u8], o: usize) -> &[u8; N] {
    v[o..o + N].try_into().unwrap()
}

/// How far ahead (bytes) the 8-row kernels ask for their group's weights by software
/// prefetch: about four Q4_K 8-row super-blocks (six of IQ3_XXS), since session 33; 9,472
/// before. Measured with the two steps and the spread Q4_K prefetches (BENCHMARKS.md, session
/// 33): on the 2-core AVX512-VNNI VM, XS.2 8 layers Q4_K_M tg128 53.5–54.0 against 50.9–52.3
/// t/s (14,208: 51.7–52.2) and the expert GEMV 4,736 against 9,472 (GiB/s, two rounds) Q4_K x8
/// 24.4 / 23.3 against 22.8 / 22.9, int4 24.6 / 24.6 against 22.7 / 22.5, IQ4_XS 26.4 / 25.2
/// against 24.3 / 24.7, IQ3_XXS 18.8 / 18.8 against 18.4 / 18.4; on the 16-core host level
/// (GEMV within each other's spread, XS 2.1 tg128 48.1 / 50.0 against 49.5 / 49.7).
const PREFETCH_AHEAD: usize = 4 * 1184;

/// The one-row Q8_0 kernel's distance (its measurements, [`row_prefetch_ahead`], were at
/// this), doubled on machines of at most [`FEW_CORES`] cores.
const ROW_PREFETCH_AHEAD: usize = 8 * 1184;

/// Logical CPUs up to which [`row_prefetch_ahead`]'s default distance is doubled.
const FEW_CORES: usize = 4;

/// A software prefetch's distance and form: each line `bytes` ahead (0: none), with `l2` into
/// L2 (`prefetcht1`) and again into L1 (`prefetcht0`) at half the distance, else into L1 at
/// the distance.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ahead {
    pub(crate) bytes: usize,
    l2: bool,
}

/// Whether the kernels' software prefetches go in two steps, into L2 (`prefetcht1`) at the
/// distance and into L1 (`prefetcht0`) at half of it: the default; `LAGOON_CPU_PREFETCH_L1=1`
/// asks for the one step into L1 (the choice before session 32). Measured on the 2-core
/// AVX512-VNNI VM (session 32, BENCHMARKS.md; expert GEMV beside a streaming read, two
/// threads, GiB/s): L1 alone Q4_K x8 22.2 / 20.7, int4 x8 20.2 / 20.6, IQ4_XS x8 22.0 / 22.3,
/// IQ3_XXS x8 16.0 / 16.9; L2 alone 22.6 / 22.6, 22.3 / 22.1, 23.3 / 23.0, 16.8 / 16.8; in a
/// later lab switch over the forms, L2 alone Q4_K x8 21.9 / 21.3 and IQ3_XXS x8 17.1 / 16.8,
/// L2 then L1 at a quarter of the distance 23.6 / 23.6 and 18.6 / 18.3, and in the runs that
/// chose the split, L1 at half of it (this) 22.6 / 21.9 and 18.3 / 18.0. A line asked into L1
/// takes one of the core's few L1 miss buffers until it arrives, as the kernel's own loads do,
/// for the whole distance; asked into L2 first it holds one only for the last, short hop
/// (inferred; this VM exposes no counters to show it).
fn prefetch_l2() -> bool {
    static L2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *L2.get_or_init(|| std::env::var("LAGOON_CPU_PREFETCH_L1").as_deref() != Ok("1"))
}

/// The 8-row kernels' prefetch distance in bytes, 0 for none: `LAGOON_CPU_X8_PREFETCH=0|1`
/// (off, or [`PREFETCH_AHEAD`]) or `=N` (N bytes ahead, N ≥ 64: for measuring distances),
/// else [`PREFETCH_AHEAD`]; in the two steps of [`prefetch_l2`] by default. Why: on a 2-core
/// Zen 5 VM the hardware prefetchers left the x8
/// Q4_K kernel at 8.4 GiB/s from DRAM on one thread against the one-row kernel's 13.0
/// (expert GEMV bench); prefetching 4,736 bytes ahead gave 13.4-13.5, and with two threads
/// 24.0 against 12.3 (one-row: 23.7). On the GPU machine's 16-core Intel host (session 21,
/// 16 threads, pairs of runs in one call) 9,472 bytes ahead against none: Q4_K x8 70.4 / 77.9
/// against 65.3 / 70.1 GiB/s, int4 61.5 / 62.1 against 51.5 / 52.2, IQ3_XXS 61.7 / 66.4
/// against 52.1 / 49.7 (4,736: 59.4, 53.4, 60.6; 18,944: 74.9, 61.8, 58.4); on the VM, one
/// thread, IQ3_XXS x8 21.2 GiB/s at 9,472 against 19.3 at 4,736 (two threads: level).
pub(crate) fn prefetch_ahead() -> Ahead {
    static D: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let bytes = *D.get_or_init(
        || match std::env::var("LAGOON_CPU_X8_PREFETCH").as_deref() {
            Ok("0") => 0,
            Ok(n) => match n.parse::<usize>() {
                Ok(n) if n >= 64 => n,
                _ => PREFETCH_AHEAD,
            },
            _ => PREFETCH_AHEAD,
        },
    );
    Ahead {
        bytes,
        l2: prefetch_l2(),
    }
}

/// The one-row Q8_0 kernel's prefetch distance in bytes, 0 for none:
/// `LAGOON_CPU_ROW_PREFETCH=0|1|N` as [`prefetch_ahead`] reads its variable (`1` or unset: the
/// default below); [`ROW_PREFETCH_AHEAD`] since session 32 (none before). On the 16-core host (session 22, one
/// step into L1) 9,472 bytes ahead was not established either way: expert GEMV 93.0 / 73.4
/// GiB/s against 76.1 / 78.2 without, tg128 +3..+5% in two runs and −5% in a third, all within
/// that machine's run-to-run spread (BENCHMARKS.md, "Session 22"). On the 2-core AVX512-VNNI
/// VM with the two steps of [`prefetch_l2`] (session 32): 22.3 / 22.7 GiB/s against 21.6 /
/// 21.8 without, alternating (94% of the paired read against 74–77%); on the 16-core host
/// 93–96% of the paired read at 9,472 (session 36).
///
/// On machines of at most [`FEW_CORES`] cores the default is twice as far: each core there
/// draws a larger share of the memory bandwidth (15–24 GB/s a thread on the 2-core Zen 4 VM
/// against ~5–6 on the 16-core host), so a line must be asked for earlier to arrive in time.
/// Measured on the 2-core Zen 4 VM (session 37, expert GEMV beside a read, 2 threads, three
/// alternating rounds of 15): 18,944 bytes 93.2 / 93.5 / 91.6% of the paired read against
/// 85.1 / 79.9 / 79.0% at 9,472 (BENCHMARKS.md).
pub(crate) fn row_prefetch_ahead() -> Ahead {
    static D: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let bytes = *D.get_or_init(|| {
        let few = std::thread::available_parallelism().is_ok_and(|n| n.get() <= FEW_CORES);
        let default = if few {
            2 * ROW_PREFETCH_AHEAD
        } else {
            ROW_PREFETCH_AHEAD
        };
        match std::env::var("LAGOON_CPU_ROW_PREFETCH").as_deref() {
            Ok("0") => 0,
            Ok(n) => match n.parse::<usize>() {
                Ok(n) if n >= 64 => n,
                _ => default,
            },
            _ => default,
        }
    });
    Ahead {
        bytes,
        l2: prefetch_l2(),
    }
}

/// Software prefetches of `o`'s bytes `ahead.bytes` further on (one per 64-byte line), into
/// the cache `ahead` names (and, into L2, a second into L1 half as far on); nothing when the
/// distance is 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn prefetch(o: &[u8], ahead: Ahead) {
    if ahead.bytes == 0 {
        return;
    }
    let base = o.as_ptr().wrapping_add(ahead.bytes);
    // A prefetch reads nothing and never faults, whatever the address.
    if ahead.l2 {
        let near = o.as_ptr().wrapping_add(ahead.bytes / 2);
        for l in (0..o.len()).step_by(64) {
            _mm_prefetch::<_MM_HINT_T1>(base.wrapping_add(l).cast());
            _mm_prefetch::<_MM_HINT_T0>(near.wrapping_add(l).cast());
        }
    } else {
        for l in (0..o.len()).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(l).cast());
        }
    }
}

/// [`prefetch`] of share `k` of `n` of `o`'s 64-byte lines (line-aligned from `o`'s start):
/// a kernel issues one share per step of its loop over a super-block instead of every line at
/// the top of it. The Q4_K 8-row kernels do this at one token (decode): their burst of 36
/// prefetches (two per line of 1,152 bytes) at the top of each super-block, then the
/// arithmetic, gave way to nine per sub-block pair. Measured on the 2-core AVX512-VNNI VM
/// (session 33, BENCHMARKS.md; alternating binaries): XS.2 8 layers Q4_K_M tg128 50.0 / 50.5
/// → 52.2 / 52.9 t/s, pp512 level (the several-token form keeps the burst: sharing cost it
/// ~3%); the S 2.1-shape Q4_K x8 GEMV level to +8%. Tried on IQ4_XS x8 (eight shares):
/// −12% in the GEMV; on IQ3_XXS x8 level to −6%; on Q6_K x8 (four shares) tg128 −1 to −3%;
/// not kept there.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn prefetch_share(o: &[u8], ahead: Ahead, k: usize, n: usize) {
    let lines = o.len().div_ceil(64);
    let (a, b) = (
        64 * (lines * k / n),
        (64 * (lines * (k + 1) / n)).min(o.len()),
    );
    if a < b {
        prefetch(&o[a..b], ahead);
    }
}

/// Bytes `o..o + 8` of `v` in the low half of a vector (a row group's eight scale bytes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn lo8(v: &[u8], o: usize) -> __m128i {
    _mm_cvtsi64_si128(i64::from_le_bytes(*arr::<8>(v, o)))
}

/// Stores each token's eight row results.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn store_rows<const T: usize>(out: &mut [[f32; 8]; T], acc: [__m256; T]) {
    for (o, v) in out.iter_mut().zip(acc) {
        // SAFETY: `o` is 8 writable f32 (32 bytes); `storeu` accepts any alignment.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), v) };
    }
}

/// The end of a Q4_K group's super-block `$b` (`$o`, its repacked bytes) for the tokens `$a`,
/// given each token's exact `$sumi` (Σ_j sc_j·Σ q·a per row): the mins term from the rows'
/// (m_2p, m_2p+1) pairs and the token's block sums, then the scalar reference's f32 steps,
/// `acc += (d_a·d)·sumi; acc −= (d_a·dmin)·summ`, into `$acc`. A macro, not a function, so
/// that it is inlined into every kernel instance (a `#[target_feature]` function cannot be
/// `#[inline(always)]`, and as one it stayed a call in two of them).
macro_rules! q4k_finish {
    ($o:expr, $a:expr, $b:expr, $sumi:expr, $acc:expr) => {{
        use $crate::kernels::arch::x86_64::avx2::k4x8 as x8f;
        use $crate::kernels::arch::x86_64::avx2::ld128 as ld128f;
        let (o, b) = ($o, $b);
        // (Closures do not inherit the target features: an intrinsic inside
        // `array::from_fn`'s closure became a call per element.)
        let mut m = [_mm256_setzero_si256(); 4];
        for (pi, mp) in m.iter_mut().enumerate() {
            *mp = _mm256_cvtepu8_epi16(ld128f(x8f::arr::<16>(o, 96 + 16 * pi)));
        }
        let d = _mm256_cvtph_ps(ld128f(x8f::arr::<16>(o, 0)));
        let dmin = _mm256_cvtph_ps(ld128f(x8f::arr::<16>(o, 16)));
        for (t, (acc, sumi)) in $acc.iter_mut().zip($sumi).enumerate() {
            let at = &$a[t];
            let summ = x8f::pairs_dot_bsums(&m, at, b);
            let da = _mm256_set1_ps(at.d(b));
            *acc = _mm256_add_ps(
                *acc,
                _mm256_mul_ps(_mm256_mul_ps(da, d), _mm256_cvtepi32_ps(sumi)),
            );
            *acc = _mm256_sub_ps(
                *acc,
                _mm256_mul_ps(_mm256_mul_ps(da, dmin), _mm256_cvtepi32_ps(summ)),
            );
        }
    }};
}
pub(crate) use q4k_finish;

/// Each row's `Σ_j x_j·Σa_j` over the eight sub-blocks j of super-block `b` of the token `a`
/// (`Σa_j`: its two block sums of 16 added, as i16), where `pairs[p]` holds the eight rows'
/// `(x_2p, x_2p+1)` as i16 pairs: four `madd`s. Exact in i32 for 6-bit `x`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn pairs_dot_bsums(
    pairs: &[__m256i; 4],
    a: &crate::kernels::act::Q8KAct<'_>,
    b: usize,
) -> __m256i {
    // bs_j = bsum[2j] + bsum[2j + 1] as i16, the pair (bs_2p, bs_2p+1) in i32 lane p.
    let bsums = a.bsums.as_flattened().as_chunks::<16>().0;
    let bsp = _mm_hadd_epi16(super::ld128(&bsums[2 * b]), super::ld128(&bsums[2 * b + 1]));
    let lanes = [
        _mm_extract_epi32::<0>(bsp),
        _mm_extract_epi32::<1>(bsp),
        _mm_extract_epi32::<2>(bsp),
        _mm_extract_epi32::<3>(bsp),
    ];
    let mut m = _mm256_setzero_si256();
    for (p, &pair) in pairs.iter().zip(&lanes) {
        m = _mm256_add_epi32(m, _mm256_madd_epi16(*p, _mm256_set1_epi32(pair)));
    }
    m
}

/// Tokens one pass takes (register budget: two 16-bit or 32-bit and one f32 accumulator
/// each).
pub(crate) const X8_TOKENS: usize = 4;

/// Defines the one-token kernel `$one` and the several-token `$multi` of an 8-row layout
/// whose groups are `$block` bytes per super-block, around its T-token pass `$tokens` (one
/// pass over the group for T tokens, returning T), with the target features `$feat`. `$multi`
/// gives NaN in every output when `p` or an activation is not of `cols` columns, or the
/// lengths differ, and otherwise takes the tokens up to `X8_TOKENS` at a time (each weight
/// load and unpacking shared by them; each token's result that of the one-token pass).
macro_rules! x8_driver {
    ($feat:literal, $one:ident, $multi:ident, $tokens:ident, $block:expr) => {
        #[target_feature(enable = $feat)]
        fn $one(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) {
            $multi(p, &[a], cols, core::slice::from_mut(out));
        }

        #[target_feature(enable = $feat)]
        fn $multi(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
            use $crate::kernels::act::Q8KAct;
            let nb = cols / 256;
            let ok = p.len() == nb * $block
                && acts.len() == out.len()
                && acts.iter().all(|a| Q8KAct::new(a, cols).is_some());
            if !ok {
                out.iter_mut().for_each(|o| *o = [f32::NAN; 8]);
                return;
            }
            let mut t0 = 0;
            while t0 < acts.len() {
                let (a, o) = (&acts[t0..], &mut out[t0..]);
                let act = |t: usize| Q8KAct::new(a[t], cols).unwrap();
                t0 += match a.len() {
                    1 => $tokens::<1>(p, [act(0)], o.first_chunk_mut().unwrap()),
                    2 => $tokens::<2>(p, [act(0), act(1)], o.first_chunk_mut().unwrap()),
                    3 => $tokens::<3>(p, core::array::from_fn(act), o.first_chunk_mut().unwrap()),
                    _ => $tokens::<{ $crate::kernels::arch::x86_64::avx2::k4x8::X8_TOKENS }>(
                        p,
                        core::array::from_fn(act),
                        o.first_chunk_mut().unwrap(),
                    ),
                };
            }
        }
    };
}
pub(crate) use x8_driver;

/// Defines the 8-row kernels `q4k_x8` (one token) and `q4k_x8_multi` (several) with the
/// target features `$feat`. Per weight load and token, `|$x, $w, $a| $step` adds the
/// products of the eight rows' four nibbles `$w` (u8) and the token's four broadcast bytes
/// `$a` (i8) to the accumulator `$x`; per sub-block `|$sum, $y, $s| $scaled` adds to the
/// i32 row sums `$sum` the accumulator `$y` times the rows' scales `$s`, which hold each
/// row's 6-bit scale in both i16 halves of its i32 lane when `$dup` is true, in the low half
/// (zero above) otherwise. Both must give the exact integer sums.
macro_rules! x8_kernels {
    ($feat:literal, |$x:ident, $w:ident, $a:ident| $step:expr,
     |$sum:ident, $y:ident, $s:ident| $scaled:expr, $dup:expr) => {
        use $crate::kernels::act::Q8KAct;
        use $crate::kernels::arch::x86_64::avx2::k4x8 as x8b;
        use $crate::kernels::arch::x86_64::avx2::ld256;
        use $crate::kernels::x8::Q4K_X8_BLOCK;

        $crate::kernels::arch::x86_64::avx2::k4x8::x8_driver!(
            $feat,
            q4k_x8,
            q4k_x8_multi,
            tokens,
            Q4K_X8_BLOCK
        );

        /// The eight rows' scales of sub-block `j` as i32 lanes, each in both i16 halves
        /// when `$dup` (see the macro's doc).
        #[inline]
        #[target_feature(enable = $feat)]
        fn scales(o: &[u8; Q4K_X8_BLOCK], j: usize) -> __m256i {
            let s8 = x8b::lo8(o, 32 + 8 * j);
            if $dup {
                _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(s8, s8))
            } else {
                _mm256_cvtepu8_epi32(s8)
            }
        }

        /// One pass over the group's super-blocks for T tokens; returns T.
        #[inline]
        #[target_feature(enable = $feat)]
        fn tokens<const T: usize>(p: &[u8], a: [Q8KAct<'_>; T], out: &mut [[f32; 8]; T]) -> usize {
            let m4 = _mm256_set1_epi8(0x0F);
            let mut acc = [_mm256_setzero_ps(); T];
            let pd = x8b::prefetch_ahead();
            for (b, o) in p.as_chunks::<Q4K_X8_BLOCK>().0.iter().enumerate() {
                // One token spreads its prefetches over the sub-block pairs (prefetch_share's
                // measurements); several keep them at the top.
                if T > 1 {
                    x8b::prefetch(o, pd);
                }
                // Each token's quants of this super-block in groups of four.
                let mut qa: [&[[i8; 4]; 64]; T] = [&[[0; 4]; 64]; T];
                for (q, at) in qa.iter_mut().zip(&a) {
                    *q = at.qs[256 * b..][..256]
                        .as_chunks::<4>()
                        .0
                        .try_into()
                        .unwrap();
                }
                let mut sumi = [_mm256_setzero_si256(); T];
                for c in 0..4 {
                    if T == 1 {
                        x8b::prefetch_share(o, pd, c, 4);
                    }
                    let mut lo = [_mm256_setzero_si256(); T];
                    let mut hi = [_mm256_setzero_si256(); T];
                    for k in 0..8 {
                        let w = ld256(x8b::arr::<32>(o, 160 + 256 * c + 32 * k));
                        let wl = _mm256_and_si256(w, m4);
                        let wh = _mm256_and_si256(_mm256_srli_epi16::<4>(w), m4);
                        for t in 0..T {
                            let al = x8b::bcast4(&qa[t][16 * c + k]);
                            let ah = x8b::bcast4(&qa[t][16 * c + 8 + k]);
                            lo[t] = {
                                let ($x, $w, $a) = (lo[t], wl, al);
                                $step
                            };
                            hi[t] = {
                                let ($x, $w, $a) = (hi[t], wh, ah);
                                $step
                            };
                        }
                    }
                    let (sl, sh) = (scales(o, 2 * c), scales(o, 2 * c + 1));
                    for t in 0..T {
                        let ($sum, $y, $s) = (sumi[t], lo[t], sl);
                        let with_lo = $scaled;
                        let ($sum, $y, $s) = (with_lo, hi[t], sh);
                        sumi[t] = $scaled;
                    }
                }
                $crate::kernels::arch::x86_64::avx2::k4x8::q4k_finish!(o, a, b, sumi, acc);
            }
            x8b::store_rows(out, acc);
            T
        }
    };
}
pub(crate) use x8_kernels;

// AVX2: the eight steps of a chunk add `maddubs` pairs into i16 lanes, exact: |u·a + u·a| ≤
// 2·15·128 = 3840 per step, ≤ 30,720 after eight; then one `madd` by the scales, each in
// both halves of its row's lane, gives (y0 + y1)·s in i32 (≤ 2·30,720·63 in magnitude), the
// widening and the scaling in one instruction where they had taken a `madd` by ones and a
// `mullo` (two uops on Intel).
x8_kernels!(
    "avx2,fma,f16c",
    |x, w, a| _mm256_add_epi16(x, _mm256_maddubs_epi16(w, a)),
    |sum, y, s| _mm256_add_epi32(sum, _mm256_madd_epi16(y, s)),
    true
);

wrap!(dot_q4k_x8 => q4k_x8(p: &[u8], a: &[u8], cols: usize, out: &mut [f32; 8]) -> ());
wrap!(dot_q4k_x8_multi => q4k_x8_multi(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) -> ());
