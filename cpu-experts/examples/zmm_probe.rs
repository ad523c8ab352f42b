//! Throughput of single zmm operations on this CPU: eight independent chains of one
//! operation, 20 M iterations each, ns per operation (and cycles at a clock given as the first
//! argument, GHz; default 3.7). What the IQ3_XXS 8-row kernel (`avx512/iq3x8z.rs`) is made of,
//! to tell whether it is bound by its operations (BENCHMARKS.md, session 39's Zen 4 section).
//!
//! `cargo run --release -p lagoon-cpu --example zmm_probe [GHz]`; needs AVX-512 VBMI, VNNI,
//! BITALG and GFNI (says so and exits otherwise).

#[cfg(target_arch = "x86_64")]
mod probe {
    use core::arch::x86_64::*;
    use std::time::Instant;

    const N: usize = 20_000_000;

    /// Proof that the CPU has the features the probes are compiled for.
    #[derive(Clone, Copy)]
    pub struct Feat(());

    impl Feat {
        fn detect() -> Option<Self> {
            (is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vbmi")
                && is_x86_feature_detected!("avx512vnni")
                && is_x86_feature_detected!("avx512bitalg")
                && is_x86_feature_detected!("gfni"))
            .then_some(Feat(()))
        }
    }

    /// `$name(feat, n)`: `op` over eight chains for `n` iterations; the xor of the chains'
    /// sums keeps the work from being removed.
    macro_rules! chains {
        ($name:ident, |$x:ident, $t:ident| $op:expr) => {
            fn $name(_: Feat, n: usize) -> i64 {
                #[target_feature(
                    enable = "avx512f,avx512bw,avx512vbmi,avx512vnni,avx512bitalg,gfni"
                )]
                fn inner(n: usize) -> i64 {
                    let $t = _mm512_set1_epi8(3);
                    let mut v: [__m512i; 8] =
                        core::array::from_fn(|i| _mm512_set1_epi8(1 + i as i8));
                    for _ in 0..n {
                        for c in v.iter_mut() {
                            let $x = *c;
                            *c = $op;
                        }
                    }
                    let s = v
                        .iter()
                        .fold(_mm512_setzero_si512(), |a, &b| _mm512_xor_si512(a, b));
                    _mm512_reduce_add_epi64(s)
                }
                // SAFETY: a `Feat` exists only once every feature `inner` enables was detected.
                unsafe { inner(n) }
            }
        };
    }

    chains!(vpermb, |x, t| _mm512_permutexvar_epi8(x, t));
    chains!(vpermt2b, |x, t| _mm512_permutex2var_epi8(t, x, t));
    chains!(vpshufb, |x, t| _mm512_shuffle_epi8(t, x));
    chains!(vpdpbusd, |x, t| _mm512_dpbusd_epi32(x, t, t));
    chains!(vpmulld, |x, t| _mm512_mullo_epi32(x, t));
    chains!(vpaddd, |x, t| _mm512_add_epi32(x, t));
    chains!(gf2p8affine, |x, t| _mm512_gf2p8affine_epi64_epi8::<0>(x, t));
    chains!(multishift, |x, t| _mm512_multishift_epi64_epi8(t, x));
    chains!(shufbitqmb_msub, |x, t| _mm512_mask_sub_epi8(
        t,
        _mm512_bitshuffle_epi64_mask(x, t),
        x,
        t
    ));
    chains!(testmb_msub, |x, t| _mm512_mask_sub_epi8(
        t,
        _mm512_test_epi8_mask(x, t),
        x,
        t
    ));
    chains!(xor_sub, |x, t| _mm512_sub_epi8(_mm512_xor_si512(x, t), t));

    type Probe = fn(Feat, usize) -> i64;

    pub fn run(ghz: f64) {
        let Some(feat) = Feat::detect() else {
            println!("this CPU lacks AVX-512 BW / VBMI / VNNI / BITALG / GFNI: nothing to probe");
            return;
        };
        let probes: [(&str, Probe); 11] = [
            ("vpermb", vpermb),
            ("vpermt2b", vpermt2b),
            ("vpshufb", vpshufb),
            ("vpdpbusd", vpdpbusd),
            ("vpmulld", vpmulld),
            ("vpaddd", vpaddd),
            ("gf2p8affineqb", gf2p8affine),
            ("vpmultishiftqb", multishift),
            ("vpshufbitqmb + masked vpsubb", shufbitqmb_msub),
            ("vptestmb + masked vpsubb", testmb_msub),
            ("vpxor + vpsubb", xor_sub),
        ];
        for (name, f) in probes {
            f(feat, 1000);
            let t = Instant::now();
            let r = f(feat, N);
            let ns = t.elapsed().as_nanos() as f64 / (N as f64 * 8.0);
            println!(
                "{name:30} {ns:.3} ns  {:.2} cycles at {ghz} GHz  [{}]",
                ns * ghz,
                r & 1
            );
        }
    }
}

fn main() {
    let ghz = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3.7);
    #[cfg(target_arch = "x86_64")]
    probe::run(ghz);
    #[cfg(not(target_arch = "x86_64"))]
    println!("x86-64 only (asked at {ghz} GHz)");
}
