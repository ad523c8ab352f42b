//! The dot-product kernel table against independent references.
//!
//! (a) scalar integer kernels vs the f64 sum of core's reference dequantisation of the
//!     weights times the dequantised quantised activations (`Σ dequant(w)·dequant(q(x))`);
//! (b) the detected SIMD table (AVX-512 VNNI or AVX2, when this CPU has them) and the AVX2
//!     table alone vs scalar, per-type bound;
//! (c) proptest edges: ragged row counts and offsets, one block, tails, extreme scales,
//!     NaN/Inf activations (no panic, NaN propagates).
//!
//! Weights are random blocks: random bytes for every quant field, random finite fp16/bf16
//! scales written over the scale fields — every bit pattern of the quants gets exercised.

use half::{bf16, f16};
use lagoon_core::dtype::GgmlType;
use lagoon_core::quant::ct::{
    CtKind, CtLayout, CtMatrix, CtStrategy, PackOrder, ScaleDtype, ZeroPoint, ZpDtype,
};
use lagoon_core::weights::{Encoding, MatRef};
use lagoon_cpu::kernels::{ActFormat, Kernels, act};
use proptest::prelude::*;

/// SplitMix64: deterministic test data from a seed.
struct Rng(u64);

impl Rng {
    fn u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn f32(&mut self) -> f32 {
        (self.u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Uniform in [-1, 1).
    fn sym(&mut self) -> f32 {
        2.0 * self.f32() - 1.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.u64() as u8).collect()
    }
}

/// How weight scales are drawn.
#[derive(Clone, Copy, Debug)]
enum Scales {
    Normal,
    /// fp16 near its maximum.
    Huge,
    /// fp16 subnormals.
    Tiny,
}

impl Scales {
    fn draw(self, rng: &mut Rng, signed: bool) -> f32 {
        let m = match self {
            Scales::Normal => 1e-3 + 0.05 * rng.f32(),
            Scales::Huge => 30000.0 + 35000.0 * rng.f32(),
            Scales::Tiny => 6e-8 * (1.0 + 15.0 * rng.f32()),
        };
        if signed && rng.u64() & 1 == 1 { -m } else { m }
    }
}

/// A weight encoding under test.
#[derive(Clone, Copy, Debug)]
enum Wt {
    G(GgmlType),
    /// pack-quantized int (4 or 8 bit).
    Packed {
        bits: u8,
        strategy: CtStrategy,
        sym: bool,
        sd: ScaleDtype,
        plain_zero: bool,
    },
    /// naive int8.
    Int8 {
        strategy: CtStrategy,
        sd: ScaleDtype,
    },
    Fp8 {
        strategy: CtStrategy,
        sd: ScaleDtype,
    },
}

impl Wt {
    /// Columns per unit of the row (every row length is a multiple).
    /// Extra columns past the last unit for ragged tails (floats only: every other type has
    /// whole blocks).
    fn ragged(self, seed: u64) -> usize {
        match self {
            Wt::G(GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) => (seed % 32) as usize,
            _ => 0,
        }
    }

    fn col_unit(self) -> usize {
        match self {
            Wt::G(t) => t.block().0.max(32),
            Wt::Packed {
                strategy: CtStrategy::Group(g),
                ..
            } if g % 32 != 0 => 96,
            _ => 32,
        }
    }
}

fn all_types() -> Vec<Wt> {
    let mut v: Vec<Wt> = {
        use GgmlType::*;
        [
            Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2K, Q3K, Q4K, Q5K, Q6K, F32, F16, BF16, IQ4XS, IQ3XXS,
            IQ3S, IQ2XXS, IQ2XS, IQ2S, IQ1S, IQ1M, IQ4NL, MXFP4,
        ]
        .into_iter()
        .map(Wt::G)
        .collect()
    };
    let p = |bits, strategy, sym, sd, plain_zero| Wt::Packed {
        bits,
        strategy,
        sym,
        sd,
        plain_zero,
    };
    use CtStrategy::*;
    use ScaleDtype::*;
    v.extend([
        p(4, Group(32), true, Bf16, false),
        p(4, Group(128), true, Bf16, false),
        p(4, Group(32), true, F16, false),
        p(4, Group(64), true, F32, false),
        p(4, Group(256), true, Bf16, false),
        p(4, Channel, true, Bf16, false),
        p(4, Tensor, true, F32, false),
        p(4, Block { rows: 2, cols: 64 }, true, Bf16, false),
        p(4, Group(32), false, Bf16, false),
        p(4, Group(128), false, F16, false),
        p(4, Channel, false, Bf16, false),
        p(4, Group(32), false, Bf16, true),
        p(8, Group(32), true, Bf16, false),
        p(8, Channel, false, Bf16, false),
        p(4, Group(48), true, Bf16, false), // not a multiple of 32: f32 fallback
        p(2, Group(32), true, Bf16, false), // no integer kernel: f32 fallback
        Wt::Int8 {
            strategy: Channel,
            sd: Bf16,
        },
        Wt::Fp8 {
            strategy: Channel,
            sd: F32,
        },
        Wt::Fp8 {
            strategy: Block { rows: 2, cols: 64 },
            sd: Bf16,
        },
    ]);
    v
}

/// Owned bytes of a matrix; [`Owned::mat`] borrows them.
struct Owned {
    wt: Wt,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
    scale: Vec<u8>,
    zero: Vec<u8>,
    layout: Option<CtLayout>,
}

impl Owned {
    fn ct(&self) -> Option<CtMatrix<'_>> {
        self.layout
            .map(|l| CtMatrix::new(l, &self.data, &self.scale, &self.zero).expect("valid layout"))
    }
}

fn with_mat<R>(o: &Owned, f: impl FnOnce(&MatRef<'_>) -> R) -> R {
    let ct = o.ct();
    let enc = match (o.wt, &ct) {
        (Wt::G(ty), _) => Encoding::Ggml { ty, data: &o.data },
        (_, Some(m)) => Encoding::Ct(*m),
        _ => unreachable!(),
    };
    f(&MatRef {
        rows: o.rows,
        cols: o.cols,
        enc,
    })
}

fn put_f16(b: &mut [u8], o: usize, v: f32) {
    b[o..o + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

fn scale_bytes(sd: ScaleDtype, v: f32) -> Vec<u8> {
    match sd {
        ScaleDtype::Bf16 => bf16::from_f32(v).to_le_bytes().to_vec(),
        ScaleDtype::F16 => f16::from_f32(v).to_le_bytes().to_vec(),
        ScaleDtype::F32 => v.to_le_bytes().to_vec(),
    }
}

fn build(wt: Wt, rows: usize, cols: usize, scales: Scales, seed: u64) -> Owned {
    let mut rng = Rng(seed);
    let mut o = Owned {
        wt,
        rows,
        cols,
        data: vec![],
        scale: vec![],
        zero: vec![],
        layout: None,
    };
    match wt {
        Wt::G(ty) => {
            let (be, bb) = ty.block();
            let nb = rows * cols / be;
            match ty {
                GgmlType::F32 => {
                    for _ in 0..nb {
                        o.data.extend(rng.sym().to_le_bytes());
                    }
                }
                GgmlType::F16 => {
                    for _ in 0..nb {
                        o.data.extend(f16::from_f32(rng.sym()).to_le_bytes());
                    }
                }
                GgmlType::BF16 => {
                    for _ in 0..nb {
                        o.data.extend(bf16::from_f32(rng.sym()).to_le_bytes());
                    }
                }
                GgmlType::MXFP4 => {
                    // E8M0 exponents around 2^0 (Normal), 2^100 (Huge), 2^-100 (Tiny).
                    let e0 = match scales {
                        Scales::Normal => 118,
                        Scales::Huge => 220,
                        Scales::Tiny => 20,
                    };
                    for _ in 0..nb {
                        let mut b = rng.bytes(bb);
                        b[0] = e0 + (rng.u64() % 16) as u8;
                        o.data.extend(b);
                    }
                }
                GgmlType::IQ1M => {
                    // The fp16 scale lives in the top nibbles of the four scale words.
                    for _ in 0..nb {
                        let mut b = rng.bytes(bb);
                        let h = f16::from_f32(scales.draw(&mut rng, true)).to_bits();
                        for k in 0..4 {
                            let nib = ((h >> (4 * k)) & 0xF) as u8;
                            b[49 + 2 * k] = (b[49 + 2 * k] & 0x0F) | nib << 4;
                        }
                        o.data.extend(b);
                    }
                }
                _ => {
                    // (offset of d, offset of the min/dmin if any)
                    let (d, m): (usize, Option<usize>) = match ty {
                        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => (0, None),
                        GgmlType::Q4_1 | GgmlType::Q5_1 => (0, Some(2)),
                        GgmlType::Q4K | GgmlType::Q5K => (0, Some(2)),
                        GgmlType::Q2K => (80, Some(82)),
                        GgmlType::Q3K => (108, None),
                        GgmlType::Q6K => (208, None),
                        GgmlType::IQ4XS
                        | GgmlType::IQ3XXS
                        | GgmlType::IQ3S
                        | GgmlType::IQ2XXS
                        | GgmlType::IQ2XS
                        | GgmlType::IQ2S
                        | GgmlType::IQ1S
                        | GgmlType::IQ4NL => (0, None),
                        _ => unreachable!("{ty:?}"),
                    };
                    for _ in 0..nb {
                        let mut b = rng.bytes(bb);
                        put_f16(&mut b, d, scales.draw(&mut rng, true));
                        if let Some(m) = m {
                            put_f16(&mut b, m, scales.draw(&mut rng, true));
                        }
                        o.data.extend(b);
                    }
                }
            }
        }
        Wt::Packed {
            bits,
            strategy,
            sym,
            sd,
            plain_zero,
        } => {
            let zero = match (sym, plain_zero) {
                (true, _) => None,
                (false, false) => Some(ZeroPoint::Packed),
                (false, true) => Some(ZeroPoint::Plain(ZpDtype::I8)),
            };
            let l = CtLayout {
                kind: CtKind::packed_int(bits, strategy, sym, PackOrder::Dense),
                rows,
                cols,
                scale_dtype: sd,
                zero,
            };
            o.data = rng.bytes(l.weight_bytes());
            let (gr, gc) = l.scale_grid();
            for _ in 0..gr * gc {
                o.scale
                    .extend(scale_bytes(sd, scales.draw(&mut rng, false)));
            }
            o.zero = match zero {
                Some(ZeroPoint::Plain(_)) => (0..l.zero_bytes())
                    .map(|_| ((rng.u64() % 9) as i8 - 4) as u8)
                    .collect(),
                _ => rng.bytes(l.zero_bytes()),
            };
            o.layout = Some(l);
        }
        Wt::Int8 { strategy, sd } | Wt::Fp8 { strategy, sd } => {
            let kind = match wt {
                Wt::Int8 { .. } => CtKind::Int8 {
                    symmetric: true,
                    strategy,
                },
                _ => CtKind::Fp8 { strategy },
            };
            let l = CtLayout {
                kind,
                rows,
                cols,
                scale_dtype: sd,
                zero: None,
            };
            o.data = rng.bytes(l.weight_bytes());
            if matches!(wt, Wt::Fp8 { .. }) {
                for b in &mut o.data {
                    if *b & 0x7F == 0x7F {
                        *b ^= 1; // no NaN codes
                    }
                }
            }
            let (gr, gc) = l.scale_grid();
            for _ in 0..gr * gc {
                o.scale
                    .extend(scale_bytes(sd, scales.draw(&mut rng, false)));
            }
            o.layout = Some(l);
        }
    }
    o
}

/// The same matrix with its scales widened to f32 (exactly): core's decoder then computes
/// `(q − z)·s` without rounding the product to the scale dtype — the value the integer
/// kernels implement.
fn exact_twin(o: &Owned) -> Option<Owned> {
    let l = o.layout?;
    let sz = l.scale_dtype.size();
    let scale = o
        .scale
        .chunks(sz)
        .flat_map(|c| {
            let v = match l.scale_dtype {
                ScaleDtype::Bf16 => bf16::from_le_bytes([c[0], c[1]]).to_f32(),
                ScaleDtype::F16 => f16::from_le_bytes([c[0], c[1]]).to_f32(),
                ScaleDtype::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            };
            v.to_le_bytes()
        })
        .collect();
    Some(Owned {
        wt: o.wt,
        rows: o.rows,
        cols: o.cols,
        data: o.data.clone(),
        scale,
        zero: o.zero.clone(),
        layout: Some(CtLayout {
            scale_dtype: ScaleDtype::F32,
            ..l
        }),
    })
}

/// A random activation row (values in ±`amp`).
fn act_row(cols: usize, amp: f32, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed ^ 0xA5A5_5A5A);
    (0..cols).map(|_| amp * rng.sym()).collect()
}

/// The quantised activation row for `k`'s format, and its dequantised values.
fn quantise(k: &Kernels, fmt: ActFormat, x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut q = vec![0u8; Kernels::act_row_bytes(fmt, x.len())];
    k.quantize_act(fmt, x, &mut q);
    let mut deq = vec![0f32; x.len()];
    match fmt {
        ActFormat::F32 => deq.copy_from_slice(x),
        ActFormat::Q8_0 => act::dequantize_row_q8_0(&q, &mut deq),
        ActFormat::Q8K => act::dequantize_row_q8k(&q, &mut deq),
    }
    (q, deq)
}

/// `(Σ w·a, Σ |w·a|)` in f64 over row r of `m` (dequantised by core) and `a`.
fn reference(m: &MatRef<'_>, r: usize, a: &[f32]) -> (f64, f64) {
    let mut w = vec![0f32; m.cols];
    m.dequant_row(r, &mut w);
    w.iter().zip(a).fold((0.0, 0.0), |(s, sa), (&w, &a)| {
        let t = f64::from(w) * f64::from(a);
        (s + t, sa + t.abs())
    })
}

fn dots(k: &Kernels, m: &MatRef<'_>, r0: usize, n: usize, act: &[u8]) -> Vec<f32> {
    let mut out = vec![f32::INFINITY; n];
    k.dot_rows(m, r0, act, &mut out);
    out
}

fn check_close(what: &str, got: f32, want: f64, scale: f64, rel: f64) {
    let err = (f64::from(got) - want).abs();
    assert!(
        err <= rel * scale + 1e-30,
        "{what}: got {got}, want {want}, |err| {err:.3e} > {rel:.1e} · Σ|w·a| ({scale:.3e})"
    );
}

/// The matrix whose f64 reference the kernels for `fmt` are held to: for a
/// compressed-tensors integer kernel (Q8_0 activations) the exact-product twin, otherwise the
/// matrix itself (the fallback decodes through core, rounding included).
fn reference_owned(o: &Owned, fmt: ActFormat) -> Option<Owned> {
    if fmt == ActFormat::F32 {
        None
    } else {
        exact_twin(o)
    }
}

/// (a) for one type and shape.
fn check_scalar_vs_reference(wt: Wt, rows: usize, cols: usize, scales: Scales, seed: u64) {
    let o = build(wt, rows, cols, scales, seed);
    let sk = Kernels::scalar();
    let x = act_row(cols, 1.0, seed);
    with_mat(&o, |m| {
        let fmt = sk.act_format(m);
        let twin = reference_owned(&o, fmt);
        let (q, deq) = quantise(&sk, fmt, &x);
        let got = dots(&sk, m, 0, rows, &q);
        with_mat(twin.as_ref().unwrap_or(&o), |rm| {
            for r in 0..rows {
                let (want, scale) = reference(rm, r, &deq);
                check_close(
                    &format!("{wt:?} row {r} ({fmt:?})"),
                    got[r],
                    want,
                    scale,
                    1e-5,
                );
                // Against compressed-tensors' own weights, rounded to the scale dtype: within
                // that rounding of each product (skipped where the dtype overflows).
                let (want, scale) = reference(m, r, &deq);
                if twin.is_some() && scale.is_finite() {
                    check_close(
                        &format!("{wt:?} row {r} vs ct ref"),
                        got[r],
                        want,
                        scale,
                        2e-3,
                    );
                }
            }
        });
    });
}

#[test]
fn scalar_kernels_match_dequantised_reference() {
    for (i, wt) in all_types().into_iter().enumerate() {
        let unit = wt.col_unit();
        for (cols, rows) in [(unit, 3), (12 * unit, 5), (3072 / unit * unit, 4)] {
            check_scalar_vs_reference(wt, rows, cols, Scales::Normal, 17 + i as u64);
        }
    }
}

#[test]
fn k_quant_act_paths_match_formats() {
    let k = Kernels::scalar();
    let o = build(Wt::G(GgmlType::Q4K), 2, 512, Scales::Normal, 3);
    with_mat(&o, |m| assert_eq!(k.act_format(m), ActFormat::Q8K));
    let o = build(Wt::G(GgmlType::Q5_1), 2, 64, Scales::Normal, 3);
    with_mat(&o, |m| assert_eq!(k.act_format(m), ActFormat::Q8_0));
    let o = build(Wt::G(GgmlType::BF16), 2, 64, Scales::Normal, 3);
    with_mat(&o, |m| assert_eq!(k.act_format(m), ActFormat::F32));
    let fp8 = Wt::Fp8 {
        strategy: CtStrategy::Channel,
        sd: ScaleDtype::F32,
    };
    let o = build(fp8, 2, 64, Scales::Normal, 3);
    with_mat(&o, |m| assert_eq!(k.act_format(m), ActFormat::F32));
    assert_eq!(Kernels::scalar().name(), "scalar");
}

/// The dequantising fallback for every type (ggml chunking included: 4352 columns are two
/// chunks) vs the f64 reference with unquantised activations.
#[test]
fn dequant_fallback_matches_reference() {
    let k = Kernels::dequant_fallback();
    for (i, wt) in all_types().into_iter().enumerate() {
        let unit = wt.col_unit();
        let cols = 4352usize.div_ceil(unit) * unit;
        let o = build(wt, 3, cols, Scales::Normal, 99 + i as u64);
        with_mat(&o, |m| {
            assert_eq!(k.act_format(m), ActFormat::F32);
            let x = act_row(cols, 1.0, i as u64);
            let (q, _) = quantise(&k, ActFormat::F32, &x);
            let got = dots(&k, m, 0, 3, &q);
            for r in 0..3 {
                let (want, scale) = reference(m, r, &x);
                check_close(
                    &format!("{wt:?} fallback row {r}"),
                    got[r],
                    want,
                    scale,
                    1e-5,
                );
            }
        });
    }
}

/// Per-type bound of (b), relative to Σ|w·a|: the integer parts are exact, only the f32
/// summation order differs.
fn simd_bound(wt: Wt) -> f64 {
    match wt {
        Wt::G(GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) => 1e-6,
        _ => 2e-6,
    }
}

/// The tables (b) holds to scalar: every SIMD table this CPU runs (AVX-512 and AVX2 both,
/// where present) and whatever `detect` picks under the environment.
fn fast_tables() -> Vec<Kernels> {
    let mut v: Vec<Kernels> = Kernels::simd_tables().collect();
    v.push(Kernels::detect());
    v
}

/// (b) and (c) for one case: every kernel table agrees with scalar, nothing panics, NaN
/// propagates.
fn check_fast_vs_scalar(
    wt: Wt,
    n_units: usize,
    rows: usize,
    r0: usize,
    scales: Scales,
    poison: u8,
    seed: u64,
) {
    for fast in fast_tables() {
        check_one_vs_scalar(&fast, wt, n_units, rows, r0, scales, poison, seed);
    }
}

#[allow(clippy::too_many_arguments)]
fn check_one_vs_scalar(
    fast: &Kernels,
    wt: Wt,
    n_units: usize,
    rows: usize,
    r0: usize,
    scales: Scales,
    poison: u8,
    seed: u64,
) {
    let sk = Kernels::scalar();
    let cols = n_units * wt.col_unit() + wt.ragged(seed);
    let o = build(wt, r0 + rows, cols, scales, seed);
    let mut x = act_row(cols, if poison == 3 { 3e4 } else { 1.0 }, seed);
    let pos = (seed as usize) % cols;
    match poison {
        1 => x[pos] = f32::NAN,
        2 => x[pos] = f32::INFINITY,
        _ => {}
    }
    with_mat(&o, |m| {
        let fmt = sk.act_format(m);
        assert_eq!(fast.act_format(m), fmt);
        let (q, deq) = quantise(&sk, fmt, &x);
        let (qf, _) = quantise(fast, fmt, &x);
        assert_eq!(q, qf, "activation quantisers differ");
        let s = dots(&sk, m, r0, rows, &q);
        let f = dots(fast, m, r0, rows, &q);
        for i in 0..rows {
            let what = format!("{wt:?} {} vs scalar, row {}", fast.name(), r0 + i);
            match poison {
                1 => assert!(
                    s[i].is_nan() && f[i].is_nan(),
                    "{what}: NaN lost ({}, {})",
                    s[i],
                    f[i]
                ),
                2 => assert!(
                    !s[i].is_finite() && !f[i].is_finite(),
                    "{what}: Inf lost ({}, {})",
                    s[i],
                    f[i]
                ),
                _ => {
                    let twin = reference_owned(&o, fmt);
                    let (_, scale) = with_mat(twin.as_ref().unwrap_or(&o), |rm| {
                        reference(rm, r0 + i, &deq)
                    });
                    check_close(&what, f[i], f64::from(s[i]), scale, simd_bound(wt));
                }
            }
        }
        // Several tokens at once: identical to one at a time, with ragged strides.
        let ab = q.len();
        let stride = ab + 7;
        let mut acts = vec![0u8; 2 * stride + ab];
        let toks: Vec<Vec<f32>> = (0..3)
            .map(|t| act_row(cols, 1.0, seed + 1000 * t))
            .collect();
        for (t, xt) in toks.iter().enumerate() {
            let (qt, _) = quantise(fast, fmt, xt);
            acts[t * stride..t * stride + ab].copy_from_slice(&qt);
        }
        let out_stride = rows + 2;
        let mut out = vec![0f32; 3 * out_stride];
        fast.dot_rows_multi(m, r0, rows, &acts, stride, 3, &mut out, out_stride);
        for t in 0..3 {
            let one = dots(fast, m, r0, rows, &acts[t * stride..t * stride + ab]);
            for i in 0..rows {
                assert_eq!(
                    out[t * out_stride + i].to_bits(),
                    one[i].to_bits(),
                    "{wt:?} multi token {t} row {i}"
                );
            }
        }
    });
}

#[test]
fn fast_kernels_match_scalar_on_expert_shapes() {
    if Kernels::detect().name() == "scalar" {
        eprintln!(
            "no SIMD kernels on this CPU (or LAGOON_FORCE_SCALAR=1): comparing scalar to itself"
        );
    }
    for (i, wt) in all_types().into_iter().enumerate() {
        let units = 3072 / wt.col_unit();
        check_fast_vs_scalar(wt, units, 6, 1, Scales::Normal, 0, 7 + i as u64);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, ..ProptestConfig::default() })]

    #[test]
    fn fast_kernels_match_scalar_edges(
        ty in 0usize..64,
        n_units in prop_oneof![Just(1usize), 1usize..20],
        rows in 1usize..6,
        r0 in 0usize..3,
        scales in prop_oneof![
            6 => Just(Scales::Normal),
            1 => Just(Scales::Huge),
            1 => Just(Scales::Tiny)
        ],
        poison in prop_oneof![6 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8)],
        seed in any::<u64>(),
    ) {
        let types = all_types();
        let wt = types[ty % types.len()];
        check_fast_vs_scalar(wt, n_units, rows, r0, scales, poison, seed);
    }

    #[test]
    fn scalar_kernels_match_reference_edges(
        ty in 0usize..64,
        n_units in 1usize..10,
        rows in 1usize..4,
        scales in prop_oneof![Just(Scales::Normal), Just(Scales::Huge), Just(Scales::Tiny)],
        seed in any::<u64>(),
    ) {
        let types = all_types();
        let wt = types[ty % types.len()];
        check_scalar_vs_reference(wt, rows, n_units * wt.col_unit() + wt.ragged(seed), scales, seed);
    }
}

/// `dot_rows_multi` with n_act tokens (1..=9, so every group size of the several-token
/// kernels and every remainder) is bit-identical to `dot_rows` one token at a time, for
/// ragged row counts, offsets and strides; a NaN in one token stays in that token.
#[test]
fn multi_token_matches_one_token() {
    for fast in fast_tables() {
        multi_token_matches_one_token_with(&fast);
    }
}

fn multi_token_matches_one_token_with(fast: &Kernels) {
    let types = [
        Wt::G(GgmlType::Q4K),
        Wt::G(GgmlType::Q8_0),
        Wt::G(GgmlType::Q6K),
        Wt::G(GgmlType::Q5K),
        Wt::G(GgmlType::Q3K),
        Wt::G(GgmlType::Q2K),
        Wt::G(GgmlType::Q4_0),
        Wt::G(GgmlType::Q4_1),
        Wt::G(GgmlType::Q5_0),
        Wt::G(GgmlType::Q5_1),
        Wt::G(GgmlType::IQ4XS),
        Wt::G(GgmlType::IQ2XXS),
        Wt::G(GgmlType::IQ2XS),
        Wt::G(GgmlType::IQ2S),
        Wt::G(GgmlType::IQ3XXS),
        Wt::G(GgmlType::IQ3S),
        Wt::G(GgmlType::IQ1S),
        Wt::G(GgmlType::IQ1M),
        // The float GEMMs (router, and F16 / BF16 attention of W4A16 checkpoints), with
        // ragged tails past their 32-element steps.
        Wt::G(GgmlType::F32),
        Wt::G(GgmlType::F16),
        Wt::G(GgmlType::BF16),
    ];
    for (ti, wt) in types.into_iter().enumerate() {
        for (ci, (units, rows, r0)) in [(12, 17, 3), (1, 5, 0), (3, 1, 2)].into_iter().enumerate() {
            let seed = 100 + 10 * ti as u64 + ci as u64;
            let cols = units * wt.col_unit() + wt.ragged(seed);
            let scales = if ci == 2 {
                Scales::Tiny
            } else {
                Scales::Normal
            };
            let o = build(wt, r0 + rows, cols, scales, seed);
            with_mat(&o, |m| {
                let fmt = fast.act_format(m);
                let ab = Kernels::act_row_bytes(fmt, cols);
                let stride = ab + 5;
                for n_act in 1..=9usize {
                    let mut acts = vec![0u8; (n_act - 1) * stride + ab];
                    for t in 0..n_act {
                        let mut x = act_row(cols, 1.0, seed * 31 + t as u64);
                        if t == 5 {
                            x[t % cols] = f32::NAN;
                        }
                        let (q, _) = quantise(fast, fmt, &x);
                        acts[t * stride..t * stride + ab].copy_from_slice(&q);
                    }
                    let out_stride = rows + 3;
                    let mut out = vec![f32::INFINITY; (n_act - 1) * out_stride + rows];
                    fast.dot_rows_multi(m, r0, rows, &acts, stride, n_act, &mut out, out_stride);
                    for t in 0..n_act {
                        let one = dots(fast, m, r0, rows, &acts[t * stride..t * stride + ab]);
                        for i in 0..rows {
                            let got = out[t * out_stride + i];
                            assert_eq!(
                                got.to_bits(),
                                one[i].to_bits(),
                                "{wt:?} n_act {n_act} token {t} row {i}: {got} vs {}",
                                one[i]
                            );
                            assert_eq!(got.is_nan(), t == 5, "{wt:?} token {t} row {i}");
                        }
                    }
                }
            });
        }
    }
}

/// Out-of-contract calls: debug builds assert; release builds give NaN, never a panic.
#[test]
fn rows_past_the_matrix_and_bad_acts_give_nan() {
    if cfg!(debug_assertions) {
        return;
    }
    let k = Kernels::detect();
    let o = build(Wt::G(GgmlType::Q4_0), 4, 64, Scales::Normal, 5);
    with_mat(&o, |m| {
        let (q, _) = quantise(&k, ActFormat::Q8_0, &act_row(64, 1.0, 5));
        let got = dots(&k, m, 3, 2, &q);
        assert!(got[0].is_finite() && got[1].is_nan());
        let got = dots(&k, m, 0, 1, &q[..q.len() - 1]);
        assert!(got[0].is_nan());
    });
}

#[test]
fn f16_conversion_is_exact() {
    for h in 0..=u16::MAX {
        let want = f16::from_bits(h).to_f32();
        let got = lagoon_cpu::kernels::scalar::f16_to_f32(h);
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "{h:#06x}: {got} vs {want}"
        );
    }
}

#[test]
fn q8_0_activation_is_cores_quantiser() {
    let x = act_row(96, 2.0, 11);
    let mut ours = vec![0u8; act::q8_0_row_bytes(96)];
    act::quantize_row_q8_0(&x, &mut ours);
    let mut core_blocks = vec![0u8; 3 * 34];
    lagoon_core::quant::quantize_row_q8_0(&x, &mut core_blocks);
    let a = act::Q8_0Act::new(&ours, 96).unwrap();
    for b in 0..3 {
        let blk = &core_blocks[34 * b..34 * b + 34];
        assert_eq!(a.d(b), f16::from_le_bytes([blk[0], blk[1]]).to_f32());
        for j in 0..32 {
            assert_eq!(a.qs[32 * b + j], blk[2 + j] as i8);
        }
    }
}

/// Both x86 SIMD tables are exercised wherever the CPU has them (so (b) covers each).
#[test]
fn simd_tables_match_cpu_features() {
    let names: Vec<&str> = Kernels::simd_tables().map(|k| k.name()).collect();
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c");
        let avx512 = avx2
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni");
        assert_eq!(names.contains(&"avx2"), avx2, "{names:?}");
        assert_eq!(names.contains(&"avx512vnni"), avx512, "{names:?}");
    }
    eprintln!("SIMD tables checked against scalar: {names:?}");
}

/// The codebook types and MXFP4 take integer kernels with ggml's activation pairing.
#[test]
fn iq_types_pair_like_ggml() {
    use GgmlType::*;
    for k in [Kernels::scalar(), Kernels::detect()] {
        for (ty, fmt) in [
            (IQ4XS, ActFormat::Q8K),
            (IQ3XXS, ActFormat::Q8K),
            (IQ3S, ActFormat::Q8K),
            (IQ2XXS, ActFormat::Q8K),
            (IQ2XS, ActFormat::Q8K),
            (IQ2S, ActFormat::Q8K),
            (IQ1S, ActFormat::Q8K),
            (IQ1M, ActFormat::Q8K),
            (IQ4NL, ActFormat::Q8_0),
            (MXFP4, ActFormat::Q8_0),
        ] {
            let o = build(Wt::G(ty), 2, 512, Scales::Normal, 3);
            with_mat(&o, |m| {
                assert_eq!(k.act_format(m), fmt, "{ty:?} {}", k.name())
            });
        }
    }
}

/// Types core decodes but no kernel covers (ternary) run through the dequantising fallback
/// automatically, against f32 activations.
#[test]
fn types_without_kernels_use_the_fallback() {
    use GgmlType::*;
    let k = Kernels::detect();
    let mut covered = 0;
    for (i, ty) in [TQ1_0, TQ2_0].into_iter().enumerate() {
        if !lagoon_core::quant::supported(ty) {
            continue;
        }
        covered += 1;
        let (be, bb) = ty.block();
        let cols = 4352usize.div_ceil(be) * be; // two fallback chunks
        let rows = 3;
        let mut rng = Rng(1234 + i as u64);
        let mut data = Vec::new();
        for _ in 0..rows * cols / be {
            let mut b = rng.bytes(bb);
            match ty {
                IQ1M => {}
                MXFP4 => b[0] = 120 + (rng.u64() % 16) as u8,
                TQ1_0 | TQ2_0 => put_f16(&mut b, bb - 2, Scales::Normal.draw(&mut rng, true)),
                _ => put_f16(&mut b, 0, Scales::Normal.draw(&mut rng, true)),
            }
            data.extend(b);
        }
        let m = MatRef {
            rows,
            cols,
            enc: Encoding::Ggml { ty, data: &data },
        };
        assert!(k.supports(&m), "{ty:?}");
        assert_eq!(k.act_format(&m), ActFormat::F32, "{ty:?}");
        let x = act_row(cols, 1.0, i as u64);
        let (q, _) = quantise(&k, ActFormat::F32, &x);
        let got = dots(&k, &m, 0, rows, &q);
        for r in 0..rows {
            let (want, scale) = reference(&m, r, &x);
            if scale.is_finite() {
                check_close(&format!("{ty:?} row {r}"), got[r], want, scale, 1e-5);
            }
        }
    }
    assert!(
        covered > 0,
        "core decodes none of the types without kernels"
    );
}
