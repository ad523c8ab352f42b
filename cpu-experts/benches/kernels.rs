//! One-token expert GEMV per weight type, single thread, weights not in cache; and the
//! machine's streaming-read bandwidth measured in the same run, for the ratio.
//!
//! Shape: Laguna S 2.1 routed experts, `gate`/`up` 1024 × 3072 (rows × input columns) and
//! `down` 3072 × 1024, ten experts per token (top-10). Each iteration dots one token against
//! all thirty matrices of one expert set; the sets are copied until about 1 GiB is
//! allocated and iterations rotate through the copies, so every weight byte comes from DRAM
//! (the L3 of the development VM is 260 MiB). Throughput is weight bytes per second.
//!
//! Prefill: `prefill_*_64tok` (one matrix × 64 tokens, one thread, weights in cache) and
//! `prefill_experts_512tok_*` (512 tokens through 256 routed experts grouped by expert, all
//! threads; see [`bench_prefill_experts`]), in FLOP/s.
//!
//! `cargo bench -p lagoon-cpu --bench kernels -- --warm-up-time 1 --measurement-time 3`
//! (filter with a type name, e.g. `-- q4_K`; `LAGOON_FORCE_SCALAR=1` benches scalar,
//! `LAGOON_FORCE_AVX2=1` AVX2 without AVX-512). `simd_cmp_*` times single-thread work in
//! thread CPU time (robust on a shared machine) and runs AVX-512 and AVX2 side by side on
//! the types that have both.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use lagoon_core::dtype::GgmlType;
use lagoon_core::quant::ct::{CtKind, CtLayout, CtMatrix, CtStrategy, PackOrder, ScaleDtype};
use lagoon_core::weights::{Encoding, MatRef};
use lagoon_cpu::kernels::Kernels;
use lagoon_cpu::pool::{Dynamic, SharedOut, ThreadPool, chunk};
use std::sync::atomic::{AtomicU64, Ordering};

const HIDDEN: usize = 3072;
const FFN: usize = 1024;
const EXPERTS: usize = 10;
/// Bytes of weights to spread the copies over (well past the last-level cache).
/// `LAGOON_BENCH_MIB` overrides it (a small value measures the kernels from cache, with
/// [`set_experts`] small enough that one set fits there).
fn target_bytes() -> usize {
    std::env::var("LAGOON_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(1 << 30, |m| m << 20)
}

/// Experts in the one-token GEMV's set: [`EXPERTS`] (the model's top-k), or
/// `LAGOON_BENCH_SET_EXPERTS` (1..=EXPERTS). One ten-expert set is 36–100 MB, past a VM's
/// last-level cache, so a kernel's compute rate from cache takes e.g.
/// `LAGOON_BENCH_SET_EXPERTS=1 LAGOON_BENCH_MIB=1` (one copy of one expert, 3.6–10 MB).
fn set_experts() -> usize {
    std::env::var("LAGOON_BENCH_SET_EXPERTS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(EXPERTS, |e| e.clamp(1, EXPERTS))
}

/// xorshift64*: cheap reproducible bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn fill(&mut self, b: &mut [u8]) {
        for c in b.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
    /// A normal f16 scale in ±[2⁻¹⁰, 2⁻⁶).
    fn f16_scale(&mut self) -> [u8; 2] {
        let bits = (self.next() as u16 & 0x83FF) | (0x18 << 10);
        bits.to_le_bytes()
    }
}

/// One weight encoding to bench.
#[derive(Clone, Copy)]
enum Kind {
    G(GgmlType),
    /// pack-quantized int4, symmetric, bf16 scales, group size.
    CtInt4(u32),
}

impl Kind {
    fn name(self) -> String {
        match self {
            Kind::G(t) => format!("{t}"),
            Kind::CtInt4(g) => format!("ct-int4-g{g}"),
        }
    }
}

/// Bytes of one matrix's weights, scales of ct formats kept apart.
#[derive(Clone)]
struct Mat {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
    scale: Vec<u8>,
    layout: Option<CtLayout>,
}

impl Mat {
    fn build(kind: Kind, rows: usize, cols: usize, rng: &mut Rng) -> Mat {
        match kind {
            Kind::G(ty) => {
                let (be, bb) = ty.block();
                let mut data = vec![0u8; rows * cols / be * bb];
                rng.fill(&mut data);
                // Finite, normal scales in every block's f16 fields.
                let fields: &[usize] = match ty {
                    GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => &[0],
                    GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
                    GgmlType::Q2K => &[80, 82],
                    GgmlType::Q3K => &[108],
                    GgmlType::Q6K => &[208],
                    GgmlType::IQ4XS
                    | GgmlType::IQ4NL
                    | GgmlType::IQ3XXS
                    | GgmlType::IQ3S
                    | GgmlType::IQ2XXS
                    | GgmlType::IQ2XS
                    | GgmlType::IQ2S
                    | GgmlType::IQ1S => &[0],
                    _ => &[],
                };
                if ty == GgmlType::F16 || ty == GgmlType::BF16 {
                    for c in data.chunks_mut(2) {
                        c.copy_from_slice(&rng.f16_scale()); // finite values (f16 or bf16)
                    }
                } else if ty == GgmlType::F32 {
                    for c in data.chunks_mut(4) {
                        c.copy_from_slice(
                            &((rng.next() % 2000) as f32 / 1000.0 - 1.0).to_le_bytes(),
                        );
                    }
                }
                for blk in data.chunks_mut(bb) {
                    for &o in fields {
                        blk[o..o + 2].copy_from_slice(&rng.f16_scale());
                    }
                    match ty {
                        // E8M0 exponent near 2^0 (random bytes give subnormal/huge scales,
                        // whose FP assists would be timed instead of the kernel).
                        GgmlType::MXFP4 => blk[0] = 120 + (rng.next() % 16) as u8,
                        // IQ1_M keeps its fp16 scale in the top nibbles of 4 scale words.
                        GgmlType::IQ1M => {
                            let h = u16::from_le_bytes(rng.f16_scale());
                            for k in 0..4 {
                                let nib = ((h >> (4 * k)) & 0xF) as u8;
                                blk[49 + 2 * k] = (blk[49 + 2 * k] & 0x0F) | (nib << 4);
                            }
                        }
                        _ => {}
                    }
                }
                Mat {
                    ty,
                    rows,
                    cols,
                    data,
                    scale: vec![],
                    layout: None,
                }
            }
            Kind::CtInt4(g) => {
                let layout = CtLayout {
                    kind: CtKind::packed_int(4, CtStrategy::Group(g), true, PackOrder::Dense),
                    rows,
                    cols,
                    scale_dtype: ScaleDtype::Bf16,
                    zero: None,
                };
                let mut data = vec![0u8; layout.weight_bytes()];
                rng.fill(&mut data);
                let mut scale = vec![0u8; layout.scale_bytes()];
                for c in scale.chunks_mut(2) {
                    c.copy_from_slice(&(0x3C00u16 | (rng.next() as u16 & 0x7F)).to_le_bytes());
                }
                Mat {
                    ty: GgmlType::I32, // unused: the ct layout describes the bytes
                    rows,
                    cols,
                    data,
                    scale,
                    layout: Some(layout),
                }
            }
        }
    }

    fn bytes(&self) -> usize {
        self.data.len() + self.scale.len()
    }

    fn view(&self) -> MatRef<'_> {
        let enc = match self.layout {
            Some(l) => {
                Encoding::Ct(CtMatrix::new(l, &self.data, &self.scale, &[]).expect("layout"))
            }
            None => Encoding::Ggml {
                ty: self.ty,
                data: &self.data,
            },
        };
        MatRef {
            rows: self.rows,
            cols: self.cols,
            enc,
        }
    }
}

/// The streaming-read buffer: [`target_bytes`] of random u64s.
fn stream_buffer() -> Vec<u64> {
    let mut buf = vec![0u64; target_bytes() / 8];
    let mut rng = Rng(7);
    for v in buf.iter_mut() {
        *v = rng.next();
    }
    buf
}

/// Sums `buf` as u64 lanes (eight accumulators; the compiler vectorises it).
fn stream_sum(buf: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    for ch in buf.as_chunks::<8>().0 {
        for k in 0..8 {
            acc[k] = acc[k].wrapping_add(ch[k]);
        }
    }
    acc.iter().fold(0, |a, &v| a.wrapping_add(v))
}

/// Streaming read: sum of a 1 GiB buffer. The reference every kernel's GB/s is divided by.
fn bench_bandwidth(c: &mut Criterion) {
    let buf = stream_buffer();
    let mut g = c.benchmark_group("stream_read");
    g.throughput(Throughput::Bytes(8 * buf.len() as u64));
    g.bench_function("sum_u64", |b| b.iter(|| black_box(stream_sum(&buf))));
    g.finish();
}

/// Copies of one ten-expert set (gate, up, down each) spread over [`target_bytes`], and one
/// token's activations quantised for the gate/up and the down matrices.
struct Experts {
    sets: Vec<Vec<Mat>>,
    set_bytes: usize,
    act_in: Vec<u8>,
    act_down: Vec<u8>,
}

impl Experts {
    fn build(k: &Kernels, kind: Kind) -> Experts {
        let mut rng = Rng(0x5EED);
        let set: Vec<Mat> = (0..set_experts())
            .flat_map(|_| {
                [
                    Mat::build(kind, FFN, HIDDEN, &mut rng),
                    Mat::build(kind, FFN, HIDDEN, &mut rng),
                    Mat::build(kind, HIDDEN, FFN, &mut rng),
                ]
            })
            .collect();
        let set_bytes: usize = set.iter().map(Mat::bytes).sum();
        let copies = target_bytes().div_ceil(set_bytes).max(1);
        let sets: Vec<Vec<Mat>> = (0..copies).map(|_| set.clone()).collect();
        // Activations quantised once (per-token quantisation is O(cols), not timed).
        let (fmt_in, fmt_down) = (
            k.act_format(&sets[0][0].view()),
            k.act_format(&sets[0][2].view()),
        );
        let x: Vec<f32> = (0..HIDDEN)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect();
        let h: Vec<f32> = (0..FFN)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
            .collect();
        let mut act_in = vec![0u8; Kernels::act_row_bytes(fmt_in, HIDDEN)];
        let mut act_down = vec![0u8; Kernels::act_row_bytes(fmt_down, FFN)];
        k.quantize_act(fmt_in, &x, &mut act_in);
        k.quantize_act(fmt_down, &h, &mut act_down);
        Experts {
            sets,
            set_bytes,
            act_in,
            act_down,
        }
    }
}

/// One token through one expert set (gate, up, down per expert) with the table's kernels.
fn one_token(
    k: &Kernels,
    set: &[Mat],
    act_in: &[u8],
    act_down: &[u8],
    out_ffn: &mut [f32],
    out_hidden: &mut [f32],
) {
    for e in set.chunks_exact(3) {
        k.dot_rows(&e[0].view(), 0, act_in, out_ffn);
        k.dot_rows(&e[1].view(), 0, act_in, out_ffn);
        k.dot_rows(&e[2].view(), 0, act_down, out_hidden);
    }
    black_box((out_ffn, out_hidden));
}

fn bench_experts(c: &mut Criterion) {
    let k = Kernels::detect();
    let kinds = [
        Kind::G(GgmlType::Q4K),
        Kind::G(GgmlType::Q8_0),
        Kind::G(GgmlType::Q4_0),
        Kind::CtInt4(32),
        Kind::CtInt4(128),
        Kind::G(GgmlType::Q5K),
        Kind::G(GgmlType::Q6K),
        Kind::G(GgmlType::Q3K),
        Kind::G(GgmlType::Q2K),
        Kind::G(GgmlType::Q4_1),
        Kind::G(GgmlType::Q5_0),
        Kind::G(GgmlType::Q5_1),
        Kind::G(GgmlType::BF16),
        Kind::G(GgmlType::F16),
        Kind::G(GgmlType::IQ4XS),
        Kind::G(GgmlType::IQ3XXS),
        Kind::G(GgmlType::IQ2XXS),
        Kind::G(GgmlType::IQ2S),
        Kind::G(GgmlType::IQ3S),
        Kind::G(GgmlType::IQ2XS),
        Kind::G(GgmlType::IQ4NL),
        Kind::G(GgmlType::IQ1S),
        Kind::G(GgmlType::IQ1M),
        Kind::G(GgmlType::MXFP4),
    ];
    let mut group = c.benchmark_group(format!("expert_gemv_1tok_{}", k.name()));
    for kind in kinds {
        let Experts {
            sets,
            set_bytes,
            act_in,
            act_down,
        } = Experts::build(&k, kind);
        let copies = sets.len();
        let mut out_ffn = vec![0f32; FFN];
        let mut out_hidden = vec![0f32; HIDDEN];
        let mut next = 0usize;
        group.throughput(Throughput::Bytes(set_bytes as u64));
        group.bench_function(kind.name(), |b| {
            b.iter(|| {
                let s = &sets[next % copies];
                next += 1;
                one_token(&k, s, &act_in, &act_down, &mut out_ffn, &mut out_hidden);
            })
        });
    }
    group.finish();
}

/// This thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`) as a criterion measurement: time the
/// thread was descheduled does not count, so single-thread figures stay comparable on a
/// shared machine (the development VM's 2 cores carry several builds). Memory stalls still
/// count. Formatted like wall time.
#[cfg(target_os = "linux")]
struct ThreadCpu;

#[cfg(target_os = "linux")]
fn thread_cpu_now() -> std::time::Duration {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` (glibc/musl, always linked on Linux) writes one `timespec`
    // (two 64-bit fields on 64-bit Linux, as declared) to the valid pointer we pass.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(target_os = "linux")]
impl criterion::measurement::Measurement for ThreadCpu {
    type Intermediate = std::time::Duration;
    type Value = std::time::Duration;
    fn start(&self) -> Self::Intermediate {
        thread_cpu_now()
    }
    fn end(&self, i: Self::Intermediate) -> Self::Value {
        thread_cpu_now().saturating_sub(i)
    }
    fn add(&self, a: &Self::Value, b: &Self::Value) -> Self::Value {
        *a + *b
    }
    fn zero(&self) -> Self::Value {
        std::time::Duration::ZERO
    }
    fn to_f64(&self, v: &Self::Value) -> f64 {
        v.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn criterion::measurement::ValueFormatter {
        static WALL: criterion::measurement::WallTime = criterion::measurement::WallTime;
        criterion::measurement::Measurement::formatter(&WALL)
    }
}

/// Kinds whose AVX-512 kernel differs from AVX2's (benched with both tables).
const AVX512_KINDS: [&str; 8] = [
    "q6_K",
    "iq4_xs",
    "ct-int4-g32",
    "iq2_xxs",
    "iq2_xs",
    "iq2_s",
    "iq3_xxs",
    "iq3_s",
];

/// One-token expert GEMV of every kind, single thread, timed in thread CPU time
/// ([`ThreadCpu`]) with the streaming-read floor measured the same way: the figures to
/// quote from a shared machine. Kinds with an AVX-512 kernel run with every SIMD table this
/// CPU has (AVX-512 VNNI, then AVX2), back to back; the others with the best table only.
#[cfg(target_os = "linux")]
fn bench_simd_cmp(c: &mut Criterion<ThreadCpu>) {
    let tables: Vec<Kernels> = Kernels::simd_tables().collect();
    if tables.is_empty() {
        return;
    }
    {
        let buf = stream_buffer();
        let mut g = c.benchmark_group("simd_cmp_stream_read");
        g.throughput(Throughput::Bytes(8 * buf.len() as u64));
        g.bench_function("sum_u64", |b| b.iter(|| black_box(stream_sum(&buf))));
        g.finish();
    }
    let kinds = [
        Kind::G(GgmlType::Q4K),
        Kind::G(GgmlType::Q8_0),
        Kind::G(GgmlType::Q6K),
        Kind::G(GgmlType::IQ4XS),
        Kind::CtInt4(32),
        Kind::G(GgmlType::Q5K),
        Kind::G(GgmlType::IQ3XXS),
        Kind::G(GgmlType::IQ2XXS),
        Kind::G(GgmlType::IQ2S),
        Kind::G(GgmlType::IQ3S),
        Kind::G(GgmlType::IQ2XS),
        Kind::G(GgmlType::IQ4NL),
        Kind::G(GgmlType::IQ1S),
        Kind::G(GgmlType::IQ1M),
        Kind::G(GgmlType::MXFP4),
    ];
    let mut group = c.benchmark_group("simd_cmp_1tok");
    for kind in kinds {
        let Experts {
            sets,
            set_bytes,
            act_in,
            act_down,
        } = Experts::build(&tables[0], kind);
        let copies = sets.len();
        let mut out_ffn = vec![0f32; FFN];
        let mut out_hidden = vec![0f32; HIDDEN];
        let mut next = 0usize;
        group.throughput(Throughput::Bytes(set_bytes as u64));
        let n_tables = match AVX512_KINDS.contains(&kind.name().as_str()) {
            true => tables.len(),
            false => 1,
        };
        for k in &tables[..n_tables] {
            group.bench_function(format!("{}/{}", kind.name(), k.name()), |b| {
                b.iter(|| {
                    let s = &sets[next % copies];
                    next += 1;
                    one_token(k, s, &act_in, &act_down, &mut out_ffn, &mut out_hidden);
                })
            });
        }
    }
    group.finish();
    // 64 tokens (a dense matmul's tile) and 16 (about one expert's share of a 512-token
    // ubatch on Laguna XS.2: 512 · 8 / 256): the AVX-512 table's Q4_K/Q6_K GEMM against
    // AVX2's several-token kernels.
    let mut group = c.benchmark_group("simd_cmp_prefill");
    for (ty, tok) in [
        (GgmlType::Q4K, 64),
        (GgmlType::Q4K, 16),
        (GgmlType::Q6K, 64),
        (GgmlType::Q6K, 16),
        (GgmlType::IQ4XS, 64),
    ] {
        for k in &tables {
            prefill_one(k, &mut group, ty, tok, true);
        }
    }
    group.finish();
    bench_attention(c, &tables);
}

/// One gate matrix (`FFN` × `HIDDEN`) of `ty` repacked by `repack`, and `tok` quantised
/// activation rows for it (row bytes `ab`): the 8-row prefill entries' inputs.
#[cfg(target_os = "linux")]
fn x8_prefill_case(
    k: &Kernels,
    ty: GgmlType,
    repack: fn(&[u8], usize, usize) -> Option<Vec<u8>>,
    tok: usize,
    seed: u64,
) -> (Vec<u8>, Vec<u8>, usize) {
    let mut rng = Rng(seed);
    let m = Mat::build(Kind::G(ty), FFN, HIDDEN, &mut rng);
    let p = repack(&m.data, FFN, HIDDEN).expect("8-row groups");
    let fmt = k.act_format(&m.view());
    let ab = Kernels::act_row_bytes(fmt, HIDDEN);
    let mut acts = vec![0u8; tok * ab];
    for a in acts.chunks_exact_mut(ab) {
        let x: Vec<f32> = (0..HIDDEN)
            .map(|_| (rng.next() % 2000) as f32 / 1000.0 - 1.0)
            .collect();
        k.quantize_act(fmt, &x, a);
    }
    (p, acts, ab)
}

/// The repacked 8-row Q4_K layout (`lagoon_cpu::kernels::x8`, a session's `LAGOON_CPU_X8=1`)
/// against the table's one-row kernel: one token through the same ten S 2.1 expert sets,
/// single thread, thread CPU time, weights from DRAM (the repacked copies are as many as the
/// plain ones). Throughput is Q4_K weight bytes (the repacked layout reads 148/144 of them).
#[cfg(target_os = "linux")]
fn bench_q4k_x8(c: &mut Criterion<ThreadCpu>) {
    use lagoon_cpu::kernels::x8::{Q4K_X8_BLOCK, dot_q4k_x8, repack_q4k_x8};
    let k = Kernels::detect();
    let Experts {
        sets,
        set_bytes,
        act_in,
        act_down,
    } = Experts::build(&k, Kind::G(GgmlType::Q4K));
    let packed: Vec<Vec<Vec<u8>>> = sets
        .iter()
        .map(|s| {
            s.iter()
                .map(|m| repack_q4k_x8(&m.data, m.rows, m.cols).expect("8-row groups"))
                .collect()
        })
        .collect();
    let copies = sets.len();
    let f = dot_q4k_x8();
    let mut out_ffn = vec![0f32; FFN];
    let mut out_hidden = vec![0f32; HIDDEN];
    let mut g = c.benchmark_group("q4k_x8_1tok");
    g.throughput(Throughput::Bytes(set_bytes as u64));
    let mut next = 0usize;
    g.bench_function(format!("one_row/{}", k.name()), |b| {
        b.iter(|| {
            let s = &sets[next % copies];
            next += 1;
            one_token(&k, s, &act_in, &act_down, &mut out_ffn, &mut out_hidden);
        })
    });
    let dots = |p: &[u8], a: &[u8], cols: usize, out: &mut [f32]| {
        let group = cols / 256 * Q4K_X8_BLOCK;
        for (pg, o) in p.chunks_exact(group).zip(out.as_chunks_mut::<8>().0) {
            f(pg, a, cols, o);
        }
    };
    g.bench_function("x8/repacked", |b| {
        b.iter(|| {
            let s = &packed[next % copies];
            next += 1;
            for e in s.chunks_exact(3) {
                dots(&e[0], &act_in, HIDDEN, &mut out_ffn);
                dots(&e[1], &act_in, HIDDEN, &mut out_ffn);
                dots(&e[2], &act_down, FFN, &mut out_hidden);
            }
            black_box((&out_ffn, &out_hidden));
        })
    });
    // Prefill: one gate matrix (1024 × 3072) × 64 and 16 tokens, weights in cache, against
    // the table's several-token path (`dot_rows_multi`, 16-row tiles).
    use lagoon_cpu::kernels::x8::dot_q4k_x8_multi;
    let fm = dot_q4k_x8_multi();
    for tok in [64usize, 16, 8] {
        prefill_one(&k, &mut g, GgmlType::Q4K, tok, true);
        let (p, acts, ab) = x8_prefill_case(&k, GgmlType::Q4K, repack_q4k_x8, tok, 11);
        let refs: Vec<&[u8]> = acts.chunks_exact(ab).collect();
        let mut out = vec![[0f32; 8]; tok];
        let group = HIDDEN / 256 * Q4K_X8_BLOCK;
        g.throughput(Throughput::Elements((2 * FFN * HIDDEN * tok) as u64));
        g.bench_function(format!("prefill_q4k_{tok}tok/x8"), |b| {
            b.iter(|| {
                for pg in p.chunks_exact(group) {
                    fm(pg, &refs, HIDDEN, &mut out);
                    black_box(&out);
                }
            })
        });
        // (On a CPU with AMX the `x8` entry above is the tile kernel too, which hands calls of
        // more than 16 tokens to the AVX512-VNNI kernel: run with LAGOON_CPU_AMX=0 for that
        // kernel at every size.) The AMX kernel alone, 16 tokens a call (the store's
        // chunks).
        if let Some(fa) = lagoon_cpu::kernels::x8::dot_q4k_x8_multi_amx() {
            g.bench_function(format!("prefill_q4k_{tok}tok/amx"), |b| {
                b.iter(|| {
                    for pg in p.chunks_exact(group) {
                        for (r, o) in refs.chunks(16).zip(out.chunks_mut(16)) {
                            fa(pg, r, HIDDEN, o);
                        }
                        black_box(&out);
                    }
                })
            });
        }
    }
    // Q6_K's 8-row layout (`kernels::x8_q6k`, the store's for every Q6_K matrix but the
    // output) at 16 tokens a call, the same shape, against the Q4_K entries above.
    {
        use lagoon_cpu::kernels::x8_q6k::{Q6K_X8_BLOCK, dot_q6k_x8_multi, repack_q6k_x8};
        const TOK: usize = 16;
        let f6 = dot_q6k_x8_multi();
        let (p, acts, ab) = x8_prefill_case(&k, GgmlType::Q6K, repack_q6k_x8, TOK, 12);
        let refs: Vec<&[u8]> = acts.chunks_exact(ab).collect();
        let mut out = vec![[0f32; 8]; TOK];
        let group = HIDDEN / 256 * Q6K_X8_BLOCK;
        g.throughput(Throughput::Elements((2 * FFN * HIDDEN * TOK) as u64));
        g.bench_function("prefill_q6k_16tok/x8", |b| {
            b.iter(|| {
                for pg in p.chunks_exact(group) {
                    f6(pg, &refs, HIDDEN, &mut out);
                    black_box(&out);
                }
            })
        });
    }
    g.finish();
}

/// Grouped-query attention of one token at position 511 (512 positions) for each of the 8
/// KV heads of Laguna XS.2 (8 query heads each, head width 128), over a 512-row f32 cache
/// (2 × 2 MiB, as one layer during a 512-token prefill); the tables that have the kernel.
/// Throughput in elements is FLOP (QK and PV: 4·heads·positions·d). `LAGOON_BENCH_ATTN_G`
/// sets the query heads per KV head (default 8; XS.2's full-attention layers have 6).
#[cfg(target_os = "linux")]
fn bench_attention(c: &mut Criterion<ThreadCpu>, tables: &[Kernels]) {
    use lagoon_cpu::kernels::AttnGroup;
    const D: usize = 128;
    const KV: usize = 8;
    let g_heads: usize = std::env::var("LAGOON_BENCH_ATTN_G")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|g| (1..=Kernels::ATTEND_MAX_HEADS).contains(g))
        .unwrap_or(8);
    #[allow(non_snake_case)]
    let G = g_heads;
    // LAGOON_BENCH_ATTN_CAP: positions (and cache rows), default 512;
    // LAGOON_BENCH_ATTN_HEAD_MAJOR=1: each KV head's rows back to back (row = D) instead of
    // whole KV rows with the head at its offset.
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
    #[allow(non_snake_case)]
    let CAP = env("LAGOON_BENCH_ATTN_CAP")
        .filter(|&c| c >= 16)
        .unwrap_or(512);
    let head_major = env("LAGOON_BENCH_ATTN_HEAD_MAJOR") == Some(1);
    let (row, off) = if head_major {
        (D, CAP * D)
    } else {
        (KV * D, D)
    };
    let row_all = KV * D;
    let mut rng = Rng(5);
    let mut f = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| (rng.next() % 2000) as f32 / 1000.0 - 1.0)
            .collect()
    };
    let (kc, vc, q) = (f(CAP * row_all), f(CAP * row_all), f(KV * G * D));
    let mut scores = vec![0f32; G * CAP];
    let mut out = vec![0f32; KV * G * D];
    let mut group = c.benchmark_group("simd_cmp_attention");
    group.throughput(Throughput::Elements((4 * KV * G * CAP * D) as u64));
    for k in tables {
        let a = |kvh: usize| AttnGroup {
            q: &q[kvh * G * D..(kvh + 1) * G * D],
            kc: &kc,
            vc: &vc,
            row,
            cap: CAP,
            off: kvh * off,
            d: D,
            n_heads: G,
            first: 0,
            pos: CAP - 1,
        };
        if !k.attend_group(&a(0), &mut scores, &mut out[..G * D]) {
            continue;
        }
        group.bench_function(format!("gqa{G}_d128_{CAP}pos/{}", k.name()), |b| {
            b.iter(|| {
                for (kvh, o) in out.chunks_exact_mut(G * D).enumerate() {
                    k.attend_group(&a(kvh), &mut scores, o);
                }
                black_box(&out);
            })
        });
        // The last ATTEND_MAX_TOKENS positions through the several-token kernel, per token.
        const TB: usize = Kernels::ATTEND_MAX_TOKENS;
        let qt = f(TB * KV * G * D);
        let mut ot = vec![0f32; TB * KV * G * D];
        let at = |kvh: usize| lagoon_cpu::kernels::AttnTokens {
            q: &qt[kvh * G * D..],
            q_stride: KV * G * D,
            n_tokens: TB,
            kc: &kc,
            vc: &vc,
            row,
            cap: CAP,
            off: kvh * off,
            d: D,
            n_heads: G,
            pos0: CAP - TB,
            window: usize::MAX,
        };
        group.bench_function(
            format!("gqa{G}_d128_{CAP}pos_per_token_of_{TB}/{}", k.name()),
            |b| {
                b.iter(|| {
                    for kvh in 0..KV {
                        let mut outs: Vec<&mut [f32]> = ot
                            .chunks_exact_mut(KV * G * D)
                            .map(|o| &mut o[kvh * G * D..(kvh + 1) * G * D])
                            .collect();
                        k.attend_tokens(&at(kvh), &mut outs);
                    }
                    black_box(&ot);
                })
            },
        );
    }
    group.finish();
}

/// Whether `kind` is to be benched in the multi-threaded groups: every kind unless
/// `LAGOON_BENCH_KINDS` lists names (comma-separated, e.g. `q4_K,q8_0`): each kind's expert
/// sets are built before criterion's name filter applies, so a filter alone still pays every
/// kind's setup.
fn kind_selected(kind: Kind) -> bool {
    kind_name_selected(&kind.name())
}

/// [`kind_selected`] by name.
fn kind_name_selected(name: &str) -> bool {
    std::env::var("LAGOON_BENCH_KINDS")
        .map_or(true, |v| v.is_empty() || v.split(',').any(|n| n == name))
}

/// Threads for the multi-threaded groups: `LAGOON_BENCH_THREADS`, else every core.
fn bench_threads() -> usize {
    std::env::var("LAGOON_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Rows per kernel call in the multi-threaded one-token GEMV: `LAGOON_BENCH_TILE` (a multiple
/// of 16 dividing 1,024), else 64, the decode tile `lagoon-cpu`'s executor uses at these
/// shapes with up to 16 threads (`exec::row_tile`; until session 23 the bench used 16, which
/// charged the int4 kernels' per-call activation sums four times as often as a session does).
fn bench_tile() -> usize {
    std::env::var("LAGOON_BENCH_TILE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&t| t >= 16 && t.is_multiple_of(16) && FFN.is_multiple_of(t))
        .unwrap_or(64)
}

/// Streaming read with every thread of the pool, each summing its own slice.
fn bench_bandwidth_mt(c: &mut Criterion) {
    let pool = ThreadPool::new(bench_threads());
    let nt = pool.n_threads();
    let buf = stream_buffer();
    let mut g = c.benchmark_group(format!("stream_read_{nt}t"));
    g.throughput(Throughput::Bytes(8 * buf.len() as u64));
    let total = AtomicU64::new(0);
    g.bench_function("sum_u64", |b| {
        b.iter(|| {
            pool.run(&|ti| {
                let sum = stream_sum(&buf[chunk(buf.len(), nt, ti)]);
                total.fetch_add(sum, Ordering::Relaxed);
            });
            black_box(total.load(Ordering::Relaxed))
        })
    });
    g.finish();
}

/// The decode expert layer with all threads: one pool dispatch per token for gate/up of the
/// ten experts (rows split across threads) and one for down, as `lagoon-cpu`'s expert layer
/// does.
fn bench_experts_mt(c: &mut Criterion) {
    let k = Kernels::detect();
    let pool = ThreadPool::new(bench_threads());
    let nt = pool.n_threads();
    let mut group = c.benchmark_group(format!("expert_gemv_1tok_{}_{nt}t", k.name()));
    for kind in MT_KINDS.into_iter().filter(|&k| kind_selected(k)) {
        let mut mt = MtExperts::build(&k, kind);
        let copies = mt.ex.sets.len();
        group.throughput(Throughput::Bytes(mt.ex.set_bytes as u64));
        let x8 = mt.x8(&k, kind);
        for (name, kk) in [(kind.name(), &k)]
            .into_iter()
            .chain(x8.as_ref().map(|k8| (format!("{}/x8", kind.name()), k8)))
        {
            let mut next = 0usize;
            group.bench_function(name, |b| {
                b.iter(|| {
                    mt.token(kk, &pool, next % copies);
                    next += 1;
                })
            });
        }
    }
    group.finish();
}

/// Median and the 10th / 90th percentiles of `v` (sorted in place).
fn spread(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.1), at(0.9))
}

/// The one-token GEMV against a floor measured beside it: with `LAGOON_BENCH_PAIRS=N` (else
/// nothing runs), N rounds per kind, each one streaming read of the [`target_bytes`] buffer on
/// every thread and then, per arm (the table's kernels, the 8-row ones where the kind has
/// them), one token through each copy of the expert set ([`experts_mt_token`], about the same
/// bytes), each timed. Prints per arm the medians of the GiB/s and of the per-round ratio to
/// that round's read, with the ratio's 10th–90th percentiles. The 16-core host's read
/// bandwidth drifts by ±20% over seconds (BENCHMARKS.md, session 23), more than the kernels
/// differ, so a kernel is divided by a floor read within the same ~50 ms, not by one criterion
/// took minutes earlier. The process ends after it (the other groups' setup would build every
/// selected kind's 1 GiB of sets again, whatever the name filter).
fn bench_floor_pairs(_c: &mut Criterion) {
    let Some(rounds) = std::env::var("LAGOON_BENCH_PAIRS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
    else {
        return;
    };
    let k = Kernels::detect();
    let pool = ThreadPool::new(bench_threads());
    let nt = pool.n_threads();
    let buf = stream_buffer();
    let total = AtomicU64::new(0);
    let stream = || {
        let t = std::time::Instant::now();
        pool.run(&|ti| {
            let sum = stream_sum(&buf[chunk(buf.len(), nt, ti)]);
            total.fetch_add(sum, Ordering::Relaxed);
        });
        black_box(total.load(Ordering::Relaxed));
        (8 * buf.len()) as f64 / t.elapsed().as_secs_f64() / f64::from(1u32 << 30)
    };
    for kind in MT_KINDS.into_iter().filter(|&k| kind_selected(k)) {
        let mut mt = MtExperts::build(&k, kind);
        let x8 = mt.x8(&k, kind);
        let arms: Vec<(String, &Kernels)> = [(kind.name(), &k)]
            .into_iter()
            .chain(x8.as_ref().map(|k8| (format!("{}/x8", kind.name()), k8)))
            .collect();
        let (copies, pass_bytes) = (mt.ex.sets.len(), mt.ex.sets.len() * mt.ex.set_bytes);
        // [floor, then per arm GiB/s and ratio] per round; one warm-up round first.
        let mut floor = Vec::with_capacity(rounds);
        let mut gib = vec![Vec::with_capacity(rounds); arms.len()];
        let mut ratio = vec![Vec::with_capacity(rounds); arms.len()];
        for round in 0..=rounds {
            let f = stream();
            let speeds: Vec<f64> = arms
                .iter()
                .map(|(_, kk)| {
                    let t = std::time::Instant::now();
                    for set in 0..copies {
                        mt.token(kk, &pool, set);
                    }
                    pass_bytes as f64 / t.elapsed().as_secs_f64() / f64::from(1u32 << 30)
                })
                .collect();
            if round == 0 {
                continue;
            }
            floor.push(f);
            for (a, v) in speeds.into_iter().enumerate() {
                gib[a].push(v);
                ratio[a].push(v / f);
            }
        }
        let (fm, f10, f90) = spread(&mut floor);
        println!("pairs {nt}t floor: {fm:.1} GiB/s (p10-p90 {f10:.1}-{f90:.1}), {rounds} rounds");
        for (a, (name, _)) in arms.iter().enumerate() {
            let (g, _, _) = spread(&mut gib[a]);
            let (r, r10, r90) = spread(&mut ratio[a]);
            println!(
                "pairs {nt}t {name}: {g:.1} GiB/s, {:.1}% of the paired read (p10-p90 {:.1}-{:.1}%)",
                100.0 * r,
                100.0 * r10,
                100.0 * r90
            );
        }
    }
    std::process::exit(0);
}

/// The kinds of the multi-threaded one-token GEMV ([`bench_experts_mt`], [`bench_floor_pairs`]).
const MT_KINDS: [Kind; 13] = [
    Kind::G(GgmlType::Q4K),
    Kind::G(GgmlType::Q8_0),
    Kind::CtInt4(32),
    Kind::G(GgmlType::Q6K),
    Kind::G(GgmlType::IQ4XS),
    Kind::G(GgmlType::IQ3XXS),
    Kind::G(GgmlType::IQ2XXS),
    Kind::G(GgmlType::IQ2S),
    Kind::G(GgmlType::Q3K),
    Kind::G(GgmlType::Q2K),
    Kind::G(GgmlType::Q4_0),
    Kind::G(GgmlType::IQ4NL),
    Kind::G(GgmlType::MXFP4),
];

/// One kind's expert sets with the output buffers of the multi-threaded one-token GEMV
/// ([`bench_experts_mt`], [`bench_floor_pairs`]).
struct MtExperts {
    ex: Experts,
    out_gu: Vec<f32>,
    out_hidden: Vec<f32>,
}

impl MtExperts {
    fn build(k: &Kernels, kind: Kind) -> MtExperts {
        MtExperts {
            ex: Experts::build(k, kind),
            out_gu: vec![0f32; 2 * set_experts() * FFN],
            out_hidden: vec![0f32; set_experts() * HIDDEN],
        }
    }

    /// `k` with the sets' rows repacked for the 8-row kernels (`kernels::x8`, what a session
    /// uses where the copy fits) for Q4_K, IQ4_XS, Q6_K, IQ3_XXS, IQ2_XXS, Q2_K, Q3_K, Q8_0,
    /// Q4_0, IQ4_NL and MXFP4 (those eight only where their vector kernels run, else the store is empty and the arm
    /// repeats the table's) and int4; `None` for other kinds. Throughput still counts the stored
    /// type's bytes (the copies hold 148/144, 138/136, 210/210, 98/98, 66/66, 84/84, 114/110,
    /// 34/34, 18/18 (Q4_0, IQ4_NL), 18/17 (MXFP4) and, int4 g32, 144/144 of them, the scales padded to a line).
    fn x8(&self, k: &Kernels, kind: Kind) -> Option<Kernels> {
        matches!(
            kind,
            Kind::G(
                GgmlType::Q4K
                    | GgmlType::IQ4XS
                    | GgmlType::Q6K
                    | GgmlType::IQ3XXS
                    | GgmlType::IQ2XXS
                    | GgmlType::Q2K
                    | GgmlType::Q3K
                    | GgmlType::Q8_0
                    | GgmlType::Q4_0
                    | GgmlType::IQ4NL
                    | GgmlType::MXFP4
            ) | Kind::CtInt4(_)
        )
        .then(|| {
            let views: Vec<MatRef<'_>> = self.ex.sets.iter().flatten().map(Mat::view).collect();
            k.clone().with_x8(std::sync::Arc::new(
                lagoon_cpu::kernels::x8::X8Store::build(&views),
            ))
        })
    }

    /// One token through copy `set` of the experts with kernels `kk`.
    fn token(&mut self, kk: &Kernels, pool: &ThreadPool, set: usize) {
        experts_mt_token(
            kk,
            pool,
            &self.ex.sets[set],
            &self.ex.act_in,
            &self.ex.act_down,
            &mut self.out_gu,
            &mut self.out_hidden,
        );
    }
}

/// One token through one expert set on every pool thread (`bench_experts_mt`'s iteration).
fn experts_mt_token(
    k: &Kernels,
    pool: &ThreadPool,
    s: &[Mat],
    act_in: &[u8],
    act_down: &[u8],
    out_gu: &mut [f32],
    out_hidden: &mut [f32],
) {
    let nt = pool.n_threads();
    let rt = bench_tile();
    let gu = SharedOut::new(out_gu);
    pool.run(&|ti| {
        // Work item: (matrix m of the gate/up matrices, two per expert, rt-row tile).
        let tiles = FFN / rt;
        for f in chunk(2 * (s.len() / 3) * tiles, nt, ti) {
            let (m, r0) = (f / tiles, (f % tiles) * rt);
            let mat = &s[(m / 2) * 3 + m % 2];
            // SAFETY: each (matrix, tile) is one work item.
            let o = unsafe { gu.slice(m * FFN + r0..m * FFN + r0 + rt) };
            k.dot_rows(&mat.view(), r0, act_in, o);
        }
    });
    let hid = SharedOut::new(out_hidden);
    pool.run(&|ti| {
        let tiles = HIDDEN / rt;
        for tile in chunk(tiles, nt, ti) {
            for e in 0..s.len() / 3 {
                // SAFETY: each (expert, tile) is written by the tile's owner only.
                let o = unsafe { hid.slice(e * HIDDEN + tile * rt..e * HIDDEN + (tile + 1) * rt) };
                k.dot_rows(&s[e * 3 + 2].view(), tile * rt, act_down, o);
            }
        }
    });
    black_box((out_gu, out_hidden));
}

/// Prefill: one 1024 × 3072 matrix (Q4_K, Q8_0, Q6_K, IQ4_XS) × 64 tokens through
/// `dot_rows_multi` in tiles of 16 rows (as `matmul_fast`), single thread, weights in cache.
/// Throughput in elements is FLOP (2·rows·cols·tokens).
fn prefill_64tok(c: &mut Criterion) {
    let k = Kernels::detect();
    let mut group = c.benchmark_group(format!("prefill_{}", k.name()));
    for ty in [
        GgmlType::Q4K,
        GgmlType::Q8_0,
        GgmlType::Q6K,
        GgmlType::IQ4XS,
        GgmlType::Q5K,
        GgmlType::IQ2XXS,
        GgmlType::IQ2XS,
        GgmlType::IQ2S,
        GgmlType::IQ3XXS,
        GgmlType::IQ3S,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::IQ1S,
        GgmlType::IQ1M,
        GgmlType::Q4_0,
        GgmlType::IQ4NL,
        GgmlType::MXFP4,
        GgmlType::BF16,
        GgmlType::F32,
    ] {
        prefill_one(&k, &mut group, ty, 64, false);
    }
    group.finish();
}

fn prefill_one<M: criterion::measurement::Measurement>(
    k: &Kernels,
    group: &mut criterion::BenchmarkGroup<'_, M>,
    ty: GgmlType,
    tok: usize,
    group_is_cmp: bool,
) {
    const TILE: usize = 16;
    let mut rng = Rng(11);
    let m = Mat::build(Kind::G(ty), FFN, HIDDEN, &mut rng);
    let w = m.view();
    let fmt = k.act_format(&w);
    let ab = Kernels::act_row_bytes(fmt, HIDDEN);
    let mut acts = vec![0u8; tok * ab];
    for t in 0..tok {
        let x: Vec<f32> = (0..HIDDEN)
            .map(|_| (rng.next() % 2000) as f32 / 1000.0 - 1.0)
            .collect();
        k.quantize_act(fmt, &x, &mut acts[t * ab..(t + 1) * ab]);
    }
    let mut tile = vec![0f32; tok * TILE];
    group.throughput(Throughput::Elements((2 * FFN * HIDDEN * tok) as u64));
    let name = match ty {
        GgmlType::Q4K => format!("prefill_q4k_{tok}tok"),
        _ => format!("prefill_{ty}_{tok}tok"),
    };
    let name = match group_is_cmp {
        true => format!("{name}/{}", k.name()),
        false => name,
    };
    // The table's kernels, then (outside the comparison groups) the 8-row ones where the
    // store takes the type, as a session runs it.
    let store = lagoon_cpu::kernels::x8::X8Store::build(std::slice::from_ref(&w));
    let k8 =
        (!group_is_cmp && !store.is_empty()).then(|| k.clone().with_x8(std::sync::Arc::new(store)));
    for (kk, name) in [(k, name.clone())]
        .into_iter()
        .chain(k8.as_ref().map(|k8| (k8, format!("{name}/x8"))))
    {
        group.bench_function(name, |b| {
            b.iter(|| {
                for r0 in (0..FFN).step_by(TILE) {
                    kk.dot_rows_multi(&w, r0, TILE, &acts, ab, tok, &mut tile, TILE);
                    black_box(&tile);
                }
            })
        });
    }
}

/// Prefill through the routed experts: 512 tokens routed top-10 over 256 experts of Laguna
/// S 2.1 shape (gate/up 1024 × 3072, down 3072 × 1024), tokens grouped by expert so each
/// weight tile is dotted with all of its expert's tokens at once (`dot_rows_multi`: the
/// several-token kernels and GEMMs), all threads, as `lagoon-cpu`'s expert layer does: one
/// pool dispatch over (expert, gate or up, 16-row tile), one over (expert, 16-row tile of
/// down), claimed dynamically. Routing is uniform (xorshift, ten distinct experts per token;
/// ~20 tokens per expert). Down's inputs are quantised random rows (SwiGLU and its
/// quantisation are not timed). Throughput in elements is FLOP (2·3·1024·3072 per pair).
fn bench_prefill_experts(c: &mut Criterion) {
    const TOKENS: usize = 512;
    const E: usize = 256;
    const TILE: usize = 16;
    let k = Kernels::detect();
    let pool = ThreadPool::new(bench_threads());
    let nt = pool.n_threads();
    let mut group = c.benchmark_group(format!("prefill_experts_512tok_{}_{nt}t", k.name()));
    group.sample_size(10);
    for kind in [
        Kind::G(GgmlType::Q4K),
        Kind::G(GgmlType::Q8_0),
        Kind::G(GgmlType::IQ4XS),
        Kind::G(GgmlType::Q6K),
        Kind::G(GgmlType::IQ3XXS),
    ]
    .into_iter()
    .filter(|&k| kind_selected(k))
    {
        let mut rng = Rng(7);
        let experts: Vec<[Mat; 3]> = (0..E)
            .map(|_| {
                [
                    Mat::build(kind, FFN, HIDDEN, &mut rng),
                    Mat::build(kind, FFN, HIDDEN, &mut rng),
                    Mat::build(kind, HIDDEN, FFN, &mut rng),
                ]
            })
            .collect();
        // Tokens of each expert, ascending.
        let mut tokens: Vec<Vec<usize>> = vec![Vec::new(); E];
        for t in 0..TOKENS {
            let mut chosen = [usize::MAX; EXPERTS];
            let mut n = 0;
            while n < EXPERTS {
                let e = (rng.next() % E as u64) as usize;
                if !chosen[..n].contains(&e) {
                    chosen[n] = e;
                    n += 1;
                }
            }
            for e in chosen {
                tokens[e].push(t);
            }
        }
        let pairs: usize = tokens.iter().map(Vec::len).sum();
        let max_m = tokens.iter().map(Vec::len).max().unwrap_or(1);
        let fmt_in = k.act_format(&experts[0][0].view());
        let ab_in = Kernels::act_row_bytes(fmt_in, HIDDEN);
        let fmt_d = k.act_format(&experts[0][2].view());
        let ab_d = Kernels::act_row_bytes(fmt_d, FFN);
        let row = |rng: &mut Rng, n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| (rng.next() % 2000) as f32 / 1000.0 - 1.0)
                .collect()
        };
        let mut q_in = vec![0u8; TOKENS * ab_in];
        for t in 0..TOKENS {
            k.quantize_act(
                fmt_in,
                &row(&mut rng, HIDDEN),
                &mut q_in[t * ab_in..(t + 1) * ab_in],
            );
        }
        // Per expert: its tokens' rows gathered contiguous, and its down inputs.
        let mut act_in: Vec<Vec<u8>> = Vec::with_capacity(E);
        let mut act_d: Vec<Vec<u8>> = Vec::with_capacity(E);
        for toks in &tokens {
            let mut a = vec![0u8; toks.len() * ab_in];
            for (j, &t) in toks.iter().enumerate() {
                a[j * ab_in..(j + 1) * ab_in].copy_from_slice(&q_in[t * ab_in..(t + 1) * ab_in]);
            }
            act_in.push(a);
            let mut d = vec![0u8; toks.len() * ab_d];
            for j in 0..toks.len() {
                k.quantize_act(fmt_d, &row(&mut rng, FFN), &mut d[j * ab_d..(j + 1) * ab_d]);
            }
            act_d.push(d);
        }
        let active: Vec<usize> = (0..E).filter(|&e| !tokens[e].is_empty()).collect();
        // One scratch tile per thread (results are not kept).
        let mut scratch = vec![0f32; nt * max_m * TILE];
        group.throughput(Throughput::Elements((2 * 3 * FFN * HIDDEN * pairs) as u64));
        let x8 = matches!(
            kind,
            Kind::G(GgmlType::Q4K | GgmlType::IQ4XS | GgmlType::Q6K | GgmlType::IQ3XXS)
                | Kind::CtInt4(_)
        )
        .then(|| {
            let views: Vec<MatRef<'_>> = experts.iter().flatten().map(Mat::view).collect();
            k.clone().with_x8(std::sync::Arc::new(
                lagoon_cpu::kernels::x8::X8Store::build(&views),
            ))
        });
        for (name, kk) in [(kind.name(), &k)]
            .into_iter()
            .chain(x8.as_ref().map(|k8| (format!("{}/x8", kind.name()), k8)))
        {
            group.bench_function(name, |b| {
                b.iter(|| {
                    let sc = SharedOut::new(&mut scratch);
                    let gu_tiles = FFN / TILE;
                    let work = Dynamic::new(active.len() * 2 * gu_tiles, 1);
                    pool.run(&|ti| {
                        // SAFETY: thread ti alone uses scratch block ti.
                        let o = unsafe { sc.slice(ti * max_m * TILE..(ti + 1) * max_m * TILE) };
                        for f in work.items() {
                            let (e, rest) = (active[f / (2 * gu_tiles)], f % (2 * gu_tiles));
                            let (m, r0) = (rest / gu_tiles, (rest % gu_tiles) * TILE);
                            let n = tokens[e].len();
                            let w = experts[e][m].view();
                            kk.dot_rows_multi(&w, r0, TILE, &act_in[e], ab_in, n, o, TILE);
                        }
                    });
                    let d_tiles = HIDDEN / TILE;
                    let work = Dynamic::new(active.len() * d_tiles, 1);
                    pool.run(&|ti| {
                        // SAFETY: as above.
                        let o = unsafe { sc.slice(ti * max_m * TILE..(ti + 1) * max_m * TILE) };
                        for f in work.items() {
                            let (e, r0) = (active[f / d_tiles], (f % d_tiles) * TILE);
                            let n = tokens[e].len();
                            let w = experts[e][2].view();
                            kk.dot_rows_multi(&w, r0, TILE, &act_d[e], ab_d, n, o, TILE);
                        }
                    });
                    black_box(&scratch);
                })
            });
        }
    }
    group.finish();
}

/// The 8-row kernels with their weights in cache: one token through a 64 × 3072 matrix
/// (75–104 KB, inside L2) per iteration, single thread, thread CPU time, so the figure is
/// the kernel's compute rate, not the memory system's (the DRAM-fed groups above). Per
/// family the fastest kernel this CPU runs ([`lagoon_cpu::kernels::x8`]'s pickers);
/// throughput counts the stored type's bytes. A lab for the kernels' instruction counts.
#[cfg(target_os = "linux")]
fn bench_x8_incache(c: &mut Criterion<ThreadCpu>) {
    use lagoon_cpu::kernels::ActFormat;
    use lagoon_cpu::kernels::x8::{DotX8, dot_q4k_x8, repack_q4k_x8};
    use lagoon_cpu::kernels::x8_iq3xxs::{dot_iq3xxs_x8, repack_iq3xxs_x8};
    use lagoon_cpu::kernels::x8_iq4xs::{dot_iq4xs_x8, repack_iq4xs_x8};
    use lagoon_cpu::kernels::x8_q5k::{dot_q5k_x8, repack_q5k_x8};
    type Repack = fn(&[u8], usize, usize) -> Option<Vec<u8>>;
    const ROWS: usize = 64;
    let k = Kernels::detect();
    let mut rng = Rng(0x1bc3);
    let x: Vec<f32> = (0..HIDDEN)
        .map(|_| (rng.next() % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let mut a = vec![0u8; Kernels::act_row_bytes(ActFormat::Q8K, HIDDEN)];
    k.quantize_act(ActFormat::Q8K, &x, &mut a);
    let mut g = c.benchmark_group("x8_incache_1tok");
    let fams: [(&str, usize, Repack, DotX8); 4] = [
        ("q4_K", 144, repack_q4k_x8, dot_q4k_x8()),
        ("q5_K", 176, repack_q5k_x8, dot_q5k_x8()),
        ("iq4_xs", 136, repack_iq4xs_x8, dot_iq4xs_x8()),
        ("iq3_xxs", 98, repack_iq3xxs_x8, dot_iq3xxs_x8()),
    ];
    for (name, blk, repack, f) in fams {
        if !kind_name_selected(name) {
            continue;
        }
        let mut w = vec![0u8; ROWS * HIDDEN / 256 * blk];
        rng.fill(&mut w);
        for b in w.chunks_exact_mut(blk) {
            // Finite scales (Q4_K's dmin too).
            b[0..2].copy_from_slice(&rng.f16_scale());
            b[2..4].copy_from_slice(&rng.f16_scale());
        }
        let p = repack(&w, ROWS, HIDDEN).expect("8-row groups");
        let group = p.len() / (ROWS / 8);
        let mut out = [[0f32; 8]; ROWS / 8];
        g.throughput(Throughput::Bytes(w.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                for (pg, o) in p.chunks_exact(group).zip(out.iter_mut()) {
                    f(pg, &a, HIDDEN, o);
                }
                black_box(&out);
            })
        });
    }
    // Q8_0 (`kernels::x8_q8_0`), where its kernel runs: the token prepared once, as a call
    // of the store prepares it.
    if kind_name_selected("q8_0") && lagoon_cpu::kernels::x8_q8_0::simd() {
        use lagoon_cpu::kernels::act::Q8_0Act;
        use lagoon_cpu::kernels::x8_q8_0::{Q80Geom, dot_q8_0_x8, prepare_fn, repack_q8_0_x8};
        let geom = Q80Geom::new(HIDDEN).expect("Q8_0 shape");
        let mut w = vec![0u8; ROWS * HIDDEN / 32 * 34];
        rng.fill(&mut w);
        for b in w.chunks_exact_mut(34) {
            b[0..2].copy_from_slice(&rng.f16_scale());
        }
        let p = repack_q8_0_x8(&w, ROWS, HIDDEN).expect("8-row groups");
        let mut a8 = vec![0u8; Kernels::act_row_bytes(ActFormat::Q8_0, HIDDEN)];
        k.quantize_act(ActFormat::Q8_0, &x, &mut a8);
        let qa = Q8_0Act::new(&a8, HIDDEN).expect("a Q8_0 row");
        let mut pa = vec![0u8; geom.act_bytes()];
        assert!(prepare_fn()(&qa, &geom, &mut pa));
        let f = dot_q8_0_x8();
        let group = geom.group_bytes();
        let mut out = [[0f32; 8]; ROWS / 8];
        g.throughput(Throughput::Bytes(w.len() as u64));
        g.bench_function("q8_0", |b| {
            b.iter(|| {
                for (pg, o) in p.chunks_exact(group).zip(out.iter_mut()) {
                    f(pg, &geom, &[&pa], core::slice::from_mut(o));
                }
                black_box(&out);
            })
        });
    }
    // Symmetric int4, group 32, bf16 scales (`kernels::x8_ct4`), where its kernel runs.
    if kind_name_selected("ct-int4-g32") && lagoon_cpu::kernels::x8_ct4::simd() {
        use lagoon_cpu::kernels::act::Q8_0Act;
        use lagoon_cpu::kernels::x8_ct4::{Ct4Act, Ct4Geom, block_sums, dot_ct4_x8, repack_ct4_x8};
        let geom = Ct4Geom::new(HIDDEN, 32, ScaleDtype::Bf16).expect("g32 shape");
        let mut w = vec![0u8; ROWS * HIDDEN / 2];
        rng.fill(&mut w);
        let sc: Vec<u8> = (0..ROWS * HIDDEN / 32)
            .flat_map(|_| half::bf16::from_f32((rng.next() % 200 + 1) as f32 * 1e-4).to_le_bytes())
            .collect();
        let p = repack_ct4_x8(&w, &sc, ROWS, &geom).expect("8-row groups");
        let mut a8 = vec![0u8; Kernels::act_row_bytes(ActFormat::Q8_0, HIDDEN)];
        k.quantize_act(ActFormat::Q8_0, &x, &mut a8);
        let qa = Q8_0Act::new(&a8, HIDDEN).expect("a Q8_0 row");
        let mut sums = vec![0i32; geom.blocks()];
        block_sums(&qa, &mut sums);
        let acts = [Ct4Act { a: qa, bsum: &sums }];
        let f = dot_ct4_x8();
        let group = geom.group_bytes();
        let mut out = [[0f32; 8]; ROWS / 8];
        g.throughput(Throughput::Bytes((w.len() + sc.len()) as u64));
        g.bench_function("ct-int4-g32", |b| {
            b.iter(|| {
                for (pg, o) in p.chunks_exact(group).zip(out.iter_mut()) {
                    f(pg, &geom, &acts, core::slice::from_mut(o));
                }
                black_box(&out);
            })
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_floor_pairs,
    bench_bandwidth,
    bench_experts,
    bench_bandwidth_mt,
    bench_experts_mt,
    prefill_64tok,
    bench_prefill_experts
);
#[cfg(target_os = "linux")]
criterion_group! {
    name = simd_cmp;
    config = Criterion::default().with_measurement(ThreadCpu);
    targets = bench_simd_cmp, bench_q4k_x8, bench_x8_incache
}
#[cfg(target_os = "linux")]
criterion_main!(benches, simd_cmp);
#[cfg(not(target_os = "linux"))]
criterion_main!(benches);
