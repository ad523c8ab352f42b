//! x86-64 kernels: AVX2+FMA+F16C, and AVX-512 F/BW/VL + VNNI variants of the hottest types
//! on CPUs that have them (resolved at run time; `LAGOON_FORCE_AVX2=1` keeps AVX2).

mod avx2;
mod tiles;
// The AVX-512 intrinsics and target features are stable from Rust 1.89 (the workspace's
// `rust-version`).
mod avx512;

use super::super::Table;

/// The best table this CPU supports, or `None` for the scalar one.
pub(crate) fn best_table() -> Option<Table> {
    let no512 = std::env::var_os("LAGOON_FORCE_AVX2").is_some_and(|v| v == "1");
    match avx512::Avx512Vnni::detect() {
        Some(p) if !no512 => Some(avx512::table(p)),
        _ => avx2_table(),
    }
}

/// The AVX2 table, where the CPU runs it.
pub(crate) fn avx2_table() -> Option<Table> {
    avx2::Avx2Fma::detect().map(avx2::table)
}

/// The AVX-512 VNNI table, where the CPU runs it.
pub(crate) fn avx512_table() -> Option<Table> {
    avx512::Avx512Vnni::detect().map(avx512::table)
}

/// Whether a session repacks its rows eight at a time by default on this CPU (`kernels::x8`):
/// everywhere, except on AMD CPUs whose table runs the AVX512-VNNI kernels (Zen 4 / Zen 5)
/// when the 8-row kernels' software prefetch is off (`LAGOON_CPU_X8_PREFETCH=0`). On a 2-core
/// Zen 5 VM without the prefetch the repack cost one-token decode 28% (XS.2 8 layers Q4_K_M,
/// tg128 52.8 / 52.8 t/s without it, 37.7 / 38.4 with; sessions 18 and 19): the hardware
/// prefetchers left the x8 kernel at 8.4 GiB/s from DRAM on one thread against the one-row
/// kernel's 13.0. With the prefetch (`avx2::k4x8::prefetch_ahead`, on by default)
/// the same VM decodes tg128 at 49.3-56.8 t/s with the repack against 38.8-54.1 without, and
/// prefills pp512 at 237-286 against 193-230 (session 20, BENCHMARKS.md).
pub(crate) fn x8_by_default() -> bool {
    let vnni = avx512::Avx512Vnni::detect().is_some() && !crate::kernels::x8::no_avx512();
    !(vnni && is_amd()) || avx2::k4x8::prefetch_ahead().bytes > 0
}

/// Whether the CPU's vendor string (CPUID leaf 0) is AMD's.
fn is_amd() -> bool {
    let r = core::arch::x86_64::__cpuid(0);
    let mut v = [0u8; 12];
    v[..4].copy_from_slice(&r.ebx.to_le_bytes());
    v[4..8].copy_from_slice(&r.edx.to_le_bytes());
    v[8..].copy_from_slice(&r.ecx.to_le_bytes());
    &v == b"AuthenticAMD"
}

/// The repacked 8-row Q4_K several-token kernel (`kernels::x8`): AVX512-VNNI's when `vnni`
/// and the CPU has it, else AVX2's where the CPU runs it. (The IQ4_XS and Q6_K families below
/// choose the same way.)
/// With AVX512-VNNI, the 512-bit kernel (`avx512::k4x8z`) on AMD CPUs and wherever
/// `LAGOON_CPU_X8_ZMM=1` asks (`=0`: the 256-bit one everywhere), per [`q4k_zmm`]; and where
/// the CPU and OS also allow AMX (`LAGOON_CPU_AMX=0` turns it off), the tile kernel
/// (`avx512::k4x8amx`), which hands calls of fewer tokens to that choice.
pub(crate) fn q4k_x8_multi(vnni: bool) -> Option<crate::kernels::x8::DotX8Multi> {
    if vnni && let Some(a) = avx512::k4x8amx::Amx::detect() {
        return Some(avx512::k4x8amx::q4k_x8_amx_multi_fn(a));
    }
    q4k_x8_multi_simd(vnni)
}

/// [`q4k_x8_multi`] without the tile kernel.
pub(crate) fn q4k_x8_multi_simd(vnni: bool) -> Option<crate::kernels::x8::DotX8Multi> {
    match avx512::Avx512Vnni::detect().filter(|_| vnni) {
        Some(p) if q4k_zmm() => Some(avx512::k4x8z::q4k_x8z_multi_fn(p)),
        Some(p) => Some(avx512::x8::q4k_x8_multi_fn(p)),
        None => avx2::Avx2Fma::detect().map(avx2::q4k_x8_multi),
    }
}

/// [`q4k_x8_multi`] for calls of one token (decode), which take 512 bits as [`q4k_x8`] does.
pub(crate) fn q4k_x8_multi_one_token(vnni: bool) -> Option<crate::kernels::x8::DotX8Multi> {
    match avx512::Avx512Vnni::detect().filter(|_| vnni) {
        Some(p) if q4k_zmm_one_token() => Some(avx512::k4x8z::q4k_x8z_multi_fn(p)),
        Some(p) => Some(avx512::x8::q4k_x8_multi_fn(p)),
        None => avx2::Avx2Fma::detect().map(avx2::q4k_x8_multi),
    }
}

/// The repacked 8-row Q4_K one-token kernel: AVX512-VNNI's when `vnni` and the CPU has it,
/// on 512 bits unless `LAGOON_CPU_X8_ZMM=0` ([`q4k_zmm_one_token`]), else AVX2's.
pub(crate) fn q4k_x8(vnni: bool) -> Option<crate::kernels::x8::DotX8> {
    match avx512::Avx512Vnni::detect().filter(|_| vnni) {
        Some(p) if q4k_zmm_one_token() => Some(avx512::k4x8z::q4k_x8z_fn(p)),
        Some(p) => Some(avx512::x8::q4k_x8_fn(p)),
        None => avx2::Avx2Fma::detect().map(avx2::q4k_x8),
    }
}

/// Whether the 8-row families may take their 512-bit kernels: `LAGOON_CPU_X8_ZMM=0` keeps
/// every family on 256 bits, `=1` puts every family that has a 512-bit form on it, and
/// unset, only those measured to win (IQ4_XS, with VBMI; Q4_K on AMD, [`q4k_zmm`]).
fn zmm() -> bool {
    std::env::var_os("LAGOON_CPU_X8_ZMM").is_none_or(|v| v != "0")
}

/// Whether Q4_K's 8-row several-token (prefill) kernel takes 512 bits:
/// `LAGOON_CPU_X8_ZMM=1|0` decides, and unset, on AMD only (the one-token kernel:
/// [`q4k_zmm_one_token`]). On the 2-core Zen 5 VM they win (paired expert GEMV 81-86% of the
/// read against 68-74%, XS.2 8 layers Q4_K_M tg128 +6..+13%; one thread from cache 36 GiB/s
/// against 22-27); on the 16-core Intel host they lose a little (GEMV 68-73% against 72-74%,
/// grouped prefill -1..-4%, XS 2.1 Q4_K_M pp512 -4..-14%, tg128 level). BENCHMARKS.md,
/// "Session 23".
fn q4k_zmm() -> bool {
    match std::env::var("LAGOON_CPU_X8_ZMM").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => is_amd(),
    }
}

/// Whether Q4_K's 8-row one-token (decode) kernel takes 512 bits: `LAGOON_CPU_X8_ZMM=1|0`
/// decides, and unset, yes on every CPU with AVX512-VNNI. Decode streams the weights once,
/// and the 512-bit kernel touches each 64-byte line with one load: on a 2-core Intel VM with
/// AVX512-VNNI (session 28) the paired expert GEMV read 73.7% of the paired floor with it
/// against 57.2% on 256 bits (20.2 against 14.9 GiB/s), while one thread from cache differs
/// by 7% (26.8 against 25.0 GiB/s); on the 16-core Intel host decode was level (tg128,
/// session 23). Prefill ([`q4k_zmm`]) keeps 256 bits on Intel, where it lost there.
fn q4k_zmm_one_token() -> bool {
    std::env::var("LAGOON_CPU_X8_ZMM").as_deref() != Ok("0")
}

/// Both AVX-512 Q4_K 8-row several-token kernels where the CPU runs them, whatever
/// `LAGOON_CPU_X8_ZMM` says (tests).
#[cfg(test)]
pub(crate) fn q4k_x8_avx512_multi() -> Vec<(&'static str, crate::kernels::x8::DotX8Multi)> {
    avx512::Avx512Vnni::detect().map_or_else(Vec::new, |p| {
        let mut k = vec![
            ("vnni256", avx512::x8::q4k_x8_multi_fn(p)),
            ("zmm", avx512::k4x8z::q4k_x8z_multi_fn(p)),
        ];
        k.extend(q4k_x8_amx_multi().map(|f| ("amx", f)));
        k
    })
}

/// The AMX Q4_K 8-row several-token kernel (`avx512::k4x8amx`) where the CPU and OS allow
/// it and `LAGOON_CPU_AMX` is not `0`.
pub(crate) fn q4k_x8_amx_multi() -> Option<crate::kernels::x8::DotX8Multi> {
    avx512::k4x8amx::Amx::detect().map(avx512::k4x8amx::q4k_x8_amx_multi_fn)
}

/// The repacked 8-row IQ4_XS several-token kernel (`kernels::x8_iq4xs`), as
/// [`q4k_x8_multi`] chooses.
/// Where the CPU also has AVX512-VBMI, the 512-bit kernels (`avx512::iq4x8z`) unless
/// `LAGOON_CPU_X8_ZMM=0`.
pub(crate) fn iq4xs_x8_multi(vnni: bool) -> Option<crate::kernels::x8::DotX8Multi> {
    match avx512::Avx512Vnni::detect().filter(|_| vnni) {
        Some(p) => Some(match iq4_zmm(p) {
            Some(z) => avx512::iq4x8z::iq4xs_x8z_multi_fn(z),
            None => avx512::x8::iq4xs_x8_multi_fn(p),
        }),
        None => avx2::Avx2Fma::detect().map(avx2::iq4xs_x8_multi),
    }
}

/// The 512-bit IQ4_XS 8-row kernels' proof, where the CPU has VBMI and `LAGOON_CPU_X8_ZMM`
/// is not `0`.
fn iq4_zmm(p: avx512::Avx512Vnni) -> Option<avx512::iq4x8z::Vbmi> {
    avx512::iq4x8z::Vbmi::detect(p).filter(|_| zmm())
}

/// Both AVX-512 IQ4_XS 8-row several-token kernels where the CPU runs them, whatever
/// `LAGOON_CPU_X8_ZMM` says (tests).
#[cfg(test)]
pub(crate) fn iq4xs_x8_avx512_multi() -> Vec<(&'static str, crate::kernels::x8::DotX8Multi)> {
    let Some(p) = avx512::Avx512Vnni::detect() else {
        return Vec::new();
    };
    let mut k = vec![("vnni256", avx512::x8::iq4xs_x8_multi_fn(p))];
    k.extend(
        avx512::iq4x8z::Vbmi::detect(p).map(|z| ("vbmi512", avx512::iq4x8z::iq4xs_x8z_multi_fn(z))),
    );
    k
}

/// The repacked 8-row IQ4_XS one-token kernel (as [`q4k_x8_multi`] chooses).
pub(crate) fn iq4xs_x8(vnni: bool) -> Option<crate::kernels::x8::DotX8> {
    match avx512::Avx512Vnni::detect().filter(|_| vnni) {
        Some(p) => Some(match iq4_zmm(p) {
            Some(z) => avx512::iq4x8z::iq4xs_x8z_fn(z),
            None => avx512::x8::iq4xs_x8_fn(p),
        }),
        None => avx2::Avx2Fma::detect().map(avx2::iq4xs_x8),
    }
}

/// The repacked 8-row Q6_K several-token kernel (`kernels::x8_q6k`), as [`iq4xs_x8_multi`]
/// chooses.
pub(crate) fn q6k_x8_multi(vnni: bool) -> Option<crate::kernels::x8::DotX8Multi> {
    match avx512::Avx512Vnni::detect().filter(|_| vnni) {
        Some(p) => Some(avx512::x8::q6k_x8_multi_fn(p)),
        None => avx2::Avx2Fma::detect().map(avx2::q6k_x8_multi),
    }
}

/// The repacked 8-row Q6_K one-token kernel, as [`q4k_x8_multi`] chooses.
pub(crate) fn q6k_x8(vnni: bool) -> Option<crate::kernels::x8::DotX8> {
    match avx512::Avx512Vnni::detect().filter(|_| vnni) {
        Some(p) => Some(avx512::x8::q6k_x8_fn(p)),
        None => avx2::Avx2Fma::detect().map(avx2::q6k_x8),
    }
}

/// The repacked 8-row IQ3_XXS several-token kernel (`kernels::x8_iq3xxs`): the 512-bit grid
/// form (`avx512::iq3x8z`) when `vnni` and the CPU has AVX512-VNNI, VBMI, BITALG and GFNI; no
/// other vector form (the one-row table kernels serve other CPUs).
pub(crate) fn iq3xxs_x8_multi(vnni: bool) -> Option<crate::kernels::x8::DotX8Multi> {
    iq3_grid(vnni).map(avx512::iq3x8z::iq3xxs_x8z_multi_fn)
}

/// The repacked 8-row IQ3_XXS one-token kernel, as [`iq3xxs_x8_multi`] chooses.
pub(crate) fn iq3xxs_x8(vnni: bool) -> Option<crate::kernels::x8::DotX8> {
    iq3_grid(vnni).map(avx512::iq3x8z::iq3xxs_x8z_fn)
}

/// The repacked 8-row IQ2_XXS several-token kernel (`kernels::x8_iq2xxs`): the 512-bit grid
/// form (`avx512::iq2x8z`) on the CPUs [`iq3xxs_x8_multi`] takes; no other vector form.
pub(crate) fn iq2xxs_x8_multi(vnni: bool) -> Option<crate::kernels::x8::DotX8Multi> {
    iq3_grid(vnni).map(avx512::iq2x8z::iq2xxs_x8z_multi_fn)
}

/// The repacked 8-row IQ2_XXS one-token kernel, as [`iq2xxs_x8_multi`] chooses.
pub(crate) fn iq2xxs_x8(vnni: bool) -> Option<crate::kernels::x8::DotX8> {
    iq3_grid(vnni).map(avx512::iq2x8z::iq2xxs_x8z_fn)
}

fn iq3_grid(vnni: bool) -> Option<avx512::iq3x8z::Grid> {
    avx512::Avx512Vnni::detect()
        .filter(|_| vnni)
        .and_then(avx512::iq3x8z::Grid::detect)
}

/// The repacked 8-row int4 kernel (`kernels::x8_ct4`): AVX512-VNNI's on 512 bits
/// (`avx512::ct4x8z`) when `vnni` and the CPU has it; no AVX2 form.
pub(crate) fn ct4_x8(vnni: bool) -> Option<crate::kernels::x8_ct4::DotCt4X8> {
    avx512::Avx512Vnni::detect()
        .filter(|_| vnni)
        .map(avx512::ct4x8z::ct4_x8z_fn)
}

/// The int4 kernels' per-block activation sums on 512 bits (`avx512::ct4x8z`), where
/// [`ct4_x8`] gives a kernel.
pub(crate) fn ct4_sums(vnni: bool) -> Option<crate::kernels::x8_ct4::BlockSums> {
    avx512::Avx512Vnni::detect()
        .filter(|_| vnni)
        .map(avx512::ct4x8z::ct4_sums_fn)
}

/// The repacked 8-row Q5_K several-token kernel (`kernels::x8_q5k`): AVX512-VNNI's on 512
/// bits (`avx512::k5x8z`) when `vnni` and the CPU has it; no AVX2 form.
pub(crate) fn q5k_x8_multi(vnni: bool) -> Option<crate::kernels::x8::DotX8Multi> {
    avx512::Avx512Vnni::detect()
        .filter(|_| vnni)
        .map(avx512::k5x8z::q5k_x8z_multi_fn)
}

/// The repacked 8-row Q2_K several-token kernel (`kernels::x8_k23`): AVX512-VNNI's on 512
/// bits (`avx512::k23x8z`); no AVX2 form (the store repacks Q2_K only where this is `Some`).
pub(crate) fn q2k_x8_multi(vnni: bool) -> Option<crate::kernels::x8::DotX8Multi> {
    avx512::Avx512Vnni::detect()
        .filter(|_| vnni)
        .map(avx512::k23x8z::q2k_x8z_multi_fn)
}

/// The repacked 8-row Q2_K one-token kernel, as [`q2k_x8_multi`] chooses.
pub(crate) fn q2k_x8(vnni: bool) -> Option<crate::kernels::x8::DotX8> {
    avx512::Avx512Vnni::detect()
        .filter(|_| vnni)
        .map(avx512::k23x8z::q2k_x8z_fn)
}

/// The repacked 8-row Q3_K several-token kernel, as [`q2k_x8_multi`] chooses.
pub(crate) fn q3k_x8_multi(vnni: bool) -> Option<crate::kernels::x8::DotX8Multi> {
    avx512::Avx512Vnni::detect()
        .filter(|_| vnni)
        .map(avx512::k23x8z::q3k_x8z_multi_fn)
}

/// The repacked 8-row Q3_K one-token kernel, as [`q2k_x8_multi`] chooses.
pub(crate) fn q3k_x8(vnni: bool) -> Option<crate::kernels::x8::DotX8> {
    avx512::Avx512Vnni::detect()
        .filter(|_| vnni)
        .map(avx512::k23x8z::q3k_x8z_fn)
}

/// The repacked 8-row Q5_K one-token kernel, as [`q5k_x8_multi`] chooses.
pub(crate) fn q5k_x8(vnni: bool) -> Option<crate::kernels::x8::DotX8> {
    avx512::Avx512Vnni::detect()
        .filter(|_| vnni)
        .map(avx512::k5x8z::q5k_x8z_fn)
}

/// The repacked 8-row Q8_0 kernel (`kernels::x8_q8_0`): AVX512-VNNI's on 512 bits
/// (`avx512::q8x8z`) when `vnni` and the CPU has it; no AVX2 form.
pub(crate) fn q8_0_x8(vnni: bool) -> Option<crate::kernels::x8_q8_0::DotQ80X8> {
    avx512::Avx512Vnni::detect()
        .filter(|_| vnni)
        .map(avx512::q8x8z::q8_0_x8z_fn)
}

/// The Q8_0 8-row kernel's activation preparation on 512 bits, where [`q8_0_x8`] gives a
/// kernel.
pub(crate) fn q8_0_x8_prep(vnni: bool) -> Option<crate::kernels::x8_q8_0::PrepQ80> {
    avx512::Avx512Vnni::detect()
        .filter(|_| vnni)
        .map(avx512::q8x8z::q8_0_prep_fn)
}

/// Whether `LAGOON_CPU_ATTN_TOKENS=rows` sends several-token attention to the kernels that
/// take one query row at a time (`avx512/float.rs`, `avx2/attend.rs` `tokens`) instead of
/// the `attn_tiles` ones, for measuring.
pub(crate) fn rows_attention() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var_os("LAGOON_CPU_ATTN_TOKENS").is_some_and(|v| v == "rows"))
}
