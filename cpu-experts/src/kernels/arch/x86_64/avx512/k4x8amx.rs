//! Q4_K × Q8_K for eight repacked rows (`kernels::x8`'s layout, unchanged) and up to 16
//! tokens on Intel AMX's int8 tiles, for prefill on CPUs that expose AMX-TILE and AMX-INT8
//! (Sapphire Rapids and later; the OS grants the tile state per process through
//! `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, asked once in [`Amx::detect`]).
//!
//! The x8 layout's 32-byte step (four bytes of each of the eight rows) is, nibble-masked,
//! exactly one row of a `tdpbssd` B tile (K/4 rows of N columns × 4 bytes). Sub-blocks 2c
//! and 2c + 1 share their steps (low and high nibbles), so their weights make one 16 × 64-byte
//! B tile — 2c's steps in rows 0..8 and columns 0..8, 2c + 1's in rows 8..16 and columns
//! 8..16, zeros elsewhere — against an A tile of the tokens' 64 activation bytes of the pair,
//! read in place from the activation rows (which the store lays out at one stride): one
//! K = 64 `tdpbssd` gives every (token, row) integer dot of both sub-blocks, apart and exact.
//! The tile is stored and multiplied by the rows' 6-bit scales on 512 bits, summed over the
//! pairs and folded onto the eight rows (exact i32, as the other kernels). The mins go
//! through the tiles too: the rows' mins, each byte duplicated, form a 4 × 32-byte B tile
//! against the tokens' sixteen 16-element sums split into low (unsigned) and high (signed)
//! bytes (`tdpbusd` and `tdpbssd`: Σ m·bsum = lo + 256·hi, exact). Then the scalar reference's
//! f32 steps per super-block (`acc += (d_a·d)·sumi; acc −= (d_a·dmin)·summ`, no FMA): the
//! same bits as every kernel of the layout.
//!
//! The layout idea is ours (the x8 step read as a VNNI-ordered B tile); the instruction
//! semantics are Intel's (tile shapes, `tdpb[su]sd`); llama.cpp has its own AMX backend
//! (`ggml-cpu/amx/`), not read for this.
//!
//! Measured on the 2-core AVX512-VNNI + AMX VM (BENCHMARKS.md, "Session 31 …"): kernel bench
//! `q4k_x8_1tok/prefill_q4k_16tok/amx` 400 GOP/s against the AVX512-VNNI kernel's 265
//! (`q4k_x8_multi_simd`'s choice, on Intel its 256-bit form; one thread, 1024 × 3072, in
//! cache; slower below ~9 tokens, see [`AMX_MIN_TOKENS`]); XS.2 8
//! layers Q4_K_M pp512 273.4 / 274.5 → 317.2 / 319.4 t/s (2 threads, `LAGOON_CPU_AMX=0`
//! against the default, alternating). Where a super-block's ~170 ns go (ablations of the
//! first, one-sub-block-a-product form, 16 tokens): the tile instructions ~73 ns, the stage
//! ~35, the epilogue ~50; pairing the sub-blocks halved the tile instructions for +2%.
//! Activation rows 64-byte aligned (they are 3,504 bytes apart at S 2.1's width, so most A
//! tile rows straddle two cache lines) measured +10% with a bench buffer made so; copying
//! them aligned inside the kernel cost more than it saved, so the executor lays prefill's
//! rows out aligned (`exec::aligned_rows`, session 32: XS.2 pp512 +7%). Slower, not kept:
//! staging the next super-block between a product and its epilogue (−12%), two groups a call
//! sharing each A tile (358 against 371 GOP/s in one run), and (session 32) every sub-block
//! scale folded into the B bytes as two 3-bit digits (`sc = 8·hi + lo`, each digit times a
//! nibble an i8 through one `vpermt2b` table), so the four pairs add up in two C tiles and
//! the epilogue shrinks to a shift and an add: 362–371 against 395–401 GOP/s, the 64-byte
//! B-row stores and table lookups (staging 29% of the time, against 20%) costing more than
//! the smaller epilogue (16%, against 29%) saved.
//!
//! Asking for the tile state enlarges the process's signal frames (the kernel's xstate
//! grows by ~8 KB): a host program with a small `sigaltstack` should set `LAGOON_CPU_AMX=0`.

use core::arch::asm;
use core::arch::x86_64::*;

use crate::kernels::act::q8k_row_bytes;
use crate::kernels::x8::{DotX8Multi, Q4K_X8_BLOCK};

use super::Avx512Vnni;

/// Most tokens one call takes (a tile's rows).
pub(crate) const AMX_TOKENS: usize = 16;
/// Fewest tokens a call takes to the tiles; fewer go to the AVX512-VNNI kernels
/// (`q4k_x8_multi_simd`). Measured on the 2-core AVX512-VNNI VM (kernel bench
/// `q4k_x8_1tok/prefill_q4k_*tok`, one thread, 1024 × 3072, in cache), GOP/s tiles against
/// `dot_q4k_x8_multi`'s other choice: 4 tokens 143 / 258, 8 tokens 253 / 269, 16 tokens 392
/// / 265 (the first, one-product-per-sub-block form; the paired form 400 at 16; the per-call
/// staging and the per-pair epilogue cost the same for 4 tokens as for 16).
const AMX_MIN_TOKENS: usize = 10;

/// Proof that this CPU runs AMX-TILE and AMX-INT8 with the OS's permission, and the
/// AVX-512 the epilogue needs.
#[derive(Clone, Copy)]
pub(crate) struct Amx(Avx512Vnni);

impl Amx {
    /// Some where CPUID reports AMX-TILE and AMX-INT8 (leaf 7, EDX bits 24 and 25), the
    /// AVX-512 token exists, `LAGOON_CPU_AMX` is not `0`, and the kernel grants the tile
    /// data state (asked once per process).
    pub(crate) fn detect() -> Option<Amx> {
        static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let v = Avx512Vnni::detect()?;
        let ok = *OK.get_or_init(|| {
            if std::env::var_os("LAGOON_CPU_AMX").is_some_and(|v| v == "0") {
                return false;
            }
            // (CPUID leaf 7 exists on every CPU with AVX-512: the token above.)
            let edx = __cpuid_count(7, 0).edx;
            if edx & (3 << 24) != 3 << 24 {
                return false;
            }
            request_tile_state()
        });
        ok.then_some(Amx(v))
    }
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: whether Linux lets this process
/// use the tile data state (without it the first tile instruction faults).
#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const SYS_ARCH_PRCTL: usize = 158;
    const ARCH_REQ_XCOMP_PERM: usize = 0x1023;
    const XFEATURE_XTILEDATA: usize = 18;
    let ret: isize;
    // SAFETY: the x86-64 Linux system call convention (number in rax, arguments in rdi and
    // rsi, rcx and r11 clobbered); the call only changes the process's permitted xstate.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL as isize => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

/// The kernel, for a detected CPU.
pub(crate) fn q4k_x8_amx_multi_fn(_: Amx) -> DotX8Multi {
    q4k_x8_amx_multi
}

/// [`DotX8Multi`] on the tiles: `out[t][r] = row r · acts[t]`. Activation rows not at one
/// stride, fewer than [`AMX_MIN_TOKENS`] or more than [`AMX_TOKENS`] of them go to the
/// AVX512-VNNI kernels instead (`q4k_x8_multi_simd`; the same bits).
fn q4k_x8_amx_multi(p: &[u8], acts: &[&[u8]], cols: usize, out: &mut [[f32; 8]]) {
    let n = acts.len();
    let nb = cols / 256;
    let ab = q8k_row_bytes(cols);
    let stride = if n > 1 {
        (acts[1].as_ptr() as usize).wrapping_sub(acts[0].as_ptr() as usize)
    } else {
        ab
    };
    let uniform = (AMX_MIN_TOKENS..=AMX_TOKENS).contains(&n)
        && out.len() == n
        && cols.is_multiple_of(256)
        && nb > 0
        && p.len() == nb * Q4K_X8_BLOCK
        && stride >= ab
        && acts.iter().enumerate().all(|(t, a)| {
            a.len() == ab
                && a.as_ptr() as usize == (acts[0].as_ptr() as usize).wrapping_add(t * stride)
        });
    if !uniform {
        // What this CPU runs without the tiles (the AMX token implies AVX512-VNNI).
        static OTHER: std::sync::OnceLock<DotX8Multi> = std::sync::OnceLock::new();
        let f = OTHER.get_or_init(|| {
            super::super::q4k_x8_multi_simd(true)
                .unwrap_or(crate::kernels::x8::dot_q4k_x8_multi_scalar)
        });
        return f(p, acts, cols, out);
    }
    // SAFETY: the AMX token exists (the only way here is q4k_x8_amx_multi_fn), so the CPU
    // has AMX and AVX-512 and the OS granted the tile state; the checks above bound every
    // read: n rows of ab bytes at `stride`, nb super-blocks of p.
    unsafe { tiles(p, acts[0].as_ptr(), stride, n, cols, out) }
}

/// Palette-1 tile configuration for `n` tokens: tmm0 the activations of a sub-block pair
/// (n × 64 bytes), tmm1 the pair's weights (16 × 64), tmm2/tmm3 pair products (n × 16 i32),
/// tmm4 the bsums' bytes (n × 16), tmm5 the mins (4 × 32), tmm6/tmm7 the min products
/// (n × 8 i32).
#[repr(C, align(64))]
struct TileCfg([u8; 64]);

fn config(n: usize) -> TileCfg {
    let mut c = [0u8; 64];
    c[0] = 1;
    for (t, (rows, colsb)) in [
        (n, 64u16),
        (16, 64),
        (n, 64),
        (n, 64),
        (n, 16),
        (4, 32),
        (n, 32),
        (n, 32),
    ]
    .into_iter()
    .enumerate()
    {
        c[16 + 2 * t..18 + 2 * t].copy_from_slice(&colsb.to_le_bytes());
        c[48 + t] = rows as u8;
    }
    TileCfg(c)
}

#[repr(C, align(64))]
struct Stage {
    /// Sub-blocks 2c and 2c + 1's weights, nibble-masked, as one 16 × 64-byte B tile: rows
    /// 0..8 hold sub-block 2c's steps in columns 0..8 (bytes 0..32) and zeros beside them,
    /// rows 8..16 zeros then sub-block 2c + 1's steps in columns 8..16, so one K = 64
    /// product against the pair's 64 activation bytes gives both sub-blocks' dots apart.
    w: [[[u8; 64]; 16]; 4],
    /// The rows' mins with each byte doubled: the 4 × 32-byte B tile.
    mins: [u8; 128],
    /// The tokens' 16 bsums of the super-block, low and high bytes (A tiles, 16 bytes a row).
    bs_lo: [[u8; 16]; AMX_TOKENS],
    bs_hi: [[u8; 16]; AMX_TOKENS],
    /// Pair products (token-major: sub-block 2c's eight rows, then 2c + 1's) and the min
    /// products.
    c: [[[i32; 16]; AMX_TOKENS]; 4],
    c_lo: [[i32; 8]; AMX_TOKENS],
    c_hi: [[i32; 8]; AMX_TOKENS],
}

/// The tile kernel proper. Safety: the CPU has AMX-TILE, AMX-INT8 and AVX-512 F/BW/VL and
/// the OS granted the tile state; `n` in 1..=16 activation rows of `q8k_row_bytes(cols)`
/// bytes start at `a0 + t·stride`; `p` holds `cols / 256` super-blocks of one group;
/// `out.len() == n`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn tiles(
    p: &[u8],
    a0: *const u8,
    stride: usize,
    n: usize,
    cols: usize,
    out: &mut [[f32; 8]],
) {
    let nb = cols / 256;
    let cfg = config(n);
    let mut st = Stage {
        w: [[[0; 64]; 16]; 4],
        mins: [0; 128],
        bs_lo: [[0; 16]; AMX_TOKENS],
        bs_hi: [[0; 16]; AMX_TOKENS],
        c: [[[0; 16]; AMX_TOKENS]; 4],
        c_lo: [[0; 8]; AMX_TOKENS],
        c_hi: [[0; 8]; AMX_TOKENS],
    };
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); AMX_TOKENS / 2];
    let pairs = n.div_ceil(2);
    // Token t's row, its super-block b's scale and bsums (Q8_K: qs, d, bsums).
    let row = |t: usize| a0.wrapping_add(t * stride);
    let da = |t: usize, b: usize| {
        // SAFETY: t < n and b < nb: inside token t's row (the caller's contract).
        f32::from_le_bytes(unsafe { *(row(t).add(cols + 4 * b) as *const [u8; 4]) })
    };
    // SAFETY: cfg is a valid palette-1 configuration (every tile's rows ≤ 16, bytes ≤ 64).
    unsafe { asm!("ldtilecfg [{c}]", c = in(reg) cfg.0.as_ptr(), options(nostack, readonly)) };
    for (b, o) in p.as_chunks::<Q4K_X8_BLOCK>().0.iter().enumerate() {
        // SAFETY: this block's loads and stores: every weight offset is inside the
        // super-block's Q4K_X8_BLOCK bytes, every stage offset inside its array (aligned
        // stores at multiples of 64 or 16 bytes of a 64-aligned struct), and token t's bsums
        // of super-block b inside its row (t < n, b < nb).
        unsafe {
            // The weights: low nibbles of step chunk c are sub-block 2c (tile rows 0..8, bytes
            // 0..32), high ones 2c + 1 (rows 8..16, bytes 32..64); the other halves stay zero.
            for c in 0..4 {
                for k in 0..8 {
                    let w = _mm256_loadu_si256(o.as_ptr().add(160 + 256 * c + 32 * k).cast());
                    let lo = _mm256_and_si256(w, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(w), m4);
                    _mm256_store_si256(st.w[c][k].as_mut_ptr().cast(), lo);
                    _mm256_store_si256(st.w[c][8 + k].as_mut_ptr().add(32).cast(), hi);
                }
            }
            // The mins' tile: row kk holds, for row r, the mins of sub-blocks 2kk, 2kk,
            // 2kk + 1, 2kk + 1 (the bsums' order: two 16-sums per sub-block).
            for kk in 0..4 {
                let x = _mm_loadu_si128(o.as_ptr().add(96 + 16 * kk).cast());
                _mm_store_si128(
                    st.mins.as_mut_ptr().add(32 * kk).cast(),
                    _mm_unpacklo_epi8(x, x),
                );
                _mm_store_si128(
                    st.mins.as_mut_ptr().add(32 * kk + 16).cast(),
                    _mm_unpackhi_epi8(x, x),
                );
            }
            // The tokens' bsums of this super-block split into bytes (bs = lo + 256·hi).
            for t in 0..n {
                let bs = _mm256_loadu_si256(row(t).add(cols + 4 * nb + 32 * b).cast());
                _mm_storeu_si128(st.bs_lo[t].as_mut_ptr().cast(), _mm256_cvtepi16_epi8(bs));
                let hi = _mm256_cvtepi16_epi8(_mm256_srai_epi16::<8>(bs));
                _mm_storeu_si128(st.bs_hi[t].as_mut_ptr().cast(), hi);
            }
        }
        let qa = row(0).wrapping_add(256 * b);
        for c in (0..4).step_by(2) {
            // SAFETY: the A tiles read n rows of 64 bytes at qa + 64c (+ 64) and `stride`,
            // inside the tokens' quants; B reads 16 × 64 bytes of st.w; C stores n × 64 bytes
            // into st.c (16 rows).
            unsafe {
                asm!(
                    "tilezero tmm2",
                    "tileloadd tmm0, [{a} + {s}*1]",
                    "tileloadd tmm1, [{w0} + {ws}*1]",
                    "tdpbssd tmm2, tmm0, tmm1",
                    "tilezero tmm3",
                    "tileloadd tmm0, [{a1} + {s}*1]",
                    "tileloadd tmm1, [{w1} + {ws}*1]",
                    "tdpbssd tmm3, tmm0, tmm1",
                    "tilestored [{c0} + {cs}*1], tmm2",
                    "tilestored [{c1} + {cs}*1], tmm3",
                    a = in(reg) qa.wrapping_add(64 * c),
                    a1 = in(reg) qa.wrapping_add(64 * c + 64),
                    s = in(reg) stride,
                    w0 = in(reg) st.w[c].as_ptr(),
                    w1 = in(reg) st.w[c + 1].as_ptr(),
                    ws = in(reg) 64usize,
                    c0 = in(reg) st.c[c].as_mut_ptr(),
                    c1 = in(reg) st.c[c + 1].as_mut_ptr(),
                    cs = in(reg) 64usize,
                    options(nostack),
                );
            }
        }
        // SAFETY: the tiles read st.mins (4 × 32), st.bs_lo / st.bs_hi (n × 16) and store
        // n × 32 bytes into st.c_lo / st.c_hi.
        unsafe {
            asm!(
                "tilezero tmm6",
                "tilezero tmm7",
                "tileloadd tmm5, [{m} + {ms}*1]",
                "tileloadd tmm4, [{lo} + {bs}*1]",
                "tdpbusd tmm6, tmm4, tmm5",
                "tileloadd tmm4, [{hi} + {bs}*1]",
                "tdpbssd tmm7, tmm4, tmm5",
                "tilestored [{cl} + {cs}*1], tmm6",
                "tilestored [{ch} + {cs}*1], tmm7",
                m = in(reg) st.mins.as_ptr(),
                ms = in(reg) 32usize,
                lo = in(reg) st.bs_lo.as_ptr(),
                hi = in(reg) st.bs_hi.as_ptr(),
                bs = in(reg) 16usize,
                cl = in(reg) st.c_lo.as_mut_ptr(),
                ch = in(reg) st.c_hi.as_mut_ptr(),
                cs = in(reg) 32usize,
                options(nostack),
            );
        }
        // SAFETY: the loads below: the rows' d, dmin and sub-block scales lie in the
        // super-block's first 96 bytes; st.c[c][t], st.c[c][t + 1] and st.c_lo/hi[t] with t
        // even are 64-byte aligned and t + 1 < 16.
        unsafe {
            // d, dmin and the sub-block scales over both halves of a register (two tokens).
            let d = both_ps(_mm256_cvtph_ps(_mm_loadu_si128(o.as_ptr().cast())));
            let dmin = both_ps(_mm256_cvtph_ps(_mm_loadu_si128(o.as_ptr().add(16).cast())));
            // Sub-blocks 2c and 2c + 1's scales of the eight rows: the 16 bytes at 32 + 16c.
            let mut sc = [_mm512_setzero_si512(); 4];
            for (c, s) in sc.iter_mut().enumerate() {
                *s = _mm512_cvtepu8_epi32(_mm_loadu_si128(o.as_ptr().add(32 + 16 * c).cast()));
            }
            for (q, acc) in acc.iter_mut().enumerate().take(pairs) {
                let t = 2 * q;
                // Each token's Σ_j sc_j·dot_j: the pair products' lanes (2c's rows, then
                // 2c + 1's) scaled and summed over c, the two halves folded onto the rows.
                let (mut s0, mut s1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for (c, s) in sc.iter().enumerate() {
                    let c0 = _mm512_load_si512(st.c[c][t].as_ptr().cast());
                    let c1 = _mm512_load_si512(st.c[c][t + 1].as_ptr().cast());
                    s0 = _mm512_add_epi32(s0, _mm512_mullo_epi32(c0, *s));
                    s1 = _mm512_add_epi32(s1, _mm512_mullo_epi32(c1, *s));
                }
                let f0 = _mm256_add_epi32(
                    _mm512_castsi512_si256(s0),
                    _mm512_extracti64x4_epi64::<1>(s0),
                );
                let f1 = _mm256_add_epi32(
                    _mm512_castsi512_si256(s1),
                    _mm512_extracti64x4_epi64::<1>(s1),
                );
                let sumi = both_halves(f0, f1);
                let lo = _mm512_load_si512(st.c_lo[t].as_ptr().cast());
                let hi = _mm512_load_si512(st.c_hi[t].as_ptr().cast());
                let summ = _mm512_add_epi32(lo, _mm512_slli_epi32::<8>(hi));
                // d_a of the two tokens (the second 0 past the end).
                let da1 = if t + 1 < n { da(t + 1, b) } else { 0.0 };
                let da =
                    _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(da(t, b)), _mm512_set1_ps(da1));
                let x = _mm512_mul_ps(_mm512_mul_ps(da, d), _mm512_cvtepi32_ps(sumi));
                *acc = _mm512_add_ps(*acc, x);
                let y = _mm512_mul_ps(_mm512_mul_ps(da, dmin), _mm512_cvtepi32_ps(summ));
                *acc = _mm512_sub_ps(*acc, y);
            }
        }
    }
    // SAFETY: releases the tile state this function configured.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
    for (q, acc) in acc.iter().enumerate().take(pairs) {
        let mut v = [0f32; 16];
        // SAFETY: v holds 16 f32.
        unsafe { _mm512_storeu_ps(v.as_mut_ptr(), *acc) };
        out[2 * q].copy_from_slice(&v[..8]);
        if 2 * q + 1 < n {
            out[2 * q + 1].copy_from_slice(&v[8..]);
        }
    }
}

/// `x` in both halves of a 512-bit register.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
fn both_ps(x: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castpd256_pd512(_mm256_castps_pd(x)),
        _mm256_castps_pd(x),
    ))
}

/// `lo` and `hi` as the two halves of a 512-bit register.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
fn both_halves(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}
