//! The CUDA kernel lab: every mat-vec kernel version on Laguna S 2.1's decode shapes, timed
//! in one device call, each against the device's measured read floor.
//!
//! `kernel_lab [--device N] [--reps N] [--types q4_K,q6_K,q8_0,bf16,ct4] [--shapes q_proj,lm_head] [--moe no]`
//! `kernel_lab --sync [--device N]`
//!
//! For each weight type (Q4_K, Q6_K, Q8_0) and shape (Q projection 9216×3072, O projection
//! 3072×9216, K/V 1024×3072, one expert's gate 1024×3072 and down 3072×1024, the lm_head
//! 100352×3072) it times, with CUDA events over `--reps` launches (default 50) after a
//! warm-up:
//! - `matmul_*`: the exact path (weights decoded to f32, f32 activations);
//! - `quantize` + `mv_*`: the quantised-activation path (the activation quantiser timed on
//!   its own, then the integer mat-vec).
//!
//! - for Q4_K, the versions in `cuda/kernels/lab.cu` (streamed through shared memory, its
//!   memory-only twin, half-warp rows, whole-warp rows with and without an L2 prefetch), and
//!   for Q6_K the four-lane whole-warp rows, each with its largest relative difference from
//!   the production `mv_*` output;
//! - with `--types bf16,ct4` (not in the default set), W4A16's products: bf16 against the f32
//!   input (`matmul_bf16`, `mv_bf16`, the lab's two-rows-per-warp `mvw2_bf16` and
//!   shared-memory-activation `mvx_bf16`) and CT4 blocks against Q8_0 (`mv_ct4`);
//! - the routed experts' gate/up at S 2.1's shape (256 experts, top 10 + shared): the
//!   production `moe_gate_up_q_q4_K` against the lab's streamed and half-warp versions, and
//!   the half-warp product on rows regrouped so each load instruction reads contiguous bytes,
//!   and `warp_gate_up_q4k_rows` with 1, 2 or 4 row pairs per warp, and the weights
//!   bulk-copied into shared memory (`gate_up_tma_q4k`, 8 or 16 rows a block, with memory-only
//!   twins), each checked bit for bit against the production kernel.
//!
//! `--sync` instead times what a chain of dependent launches costs (`lab.cu`'s `lab_empty`,
//! `lab_hop`, `lab_barrier`): 240 launches chained in a CUDA graph under programmatic launch,
//! empty or each doing a norm's work on one block, µs per launch; and one resident block per
//! SM passing 2,000 grid barriers, without and with that work between them, µs per barrier;
//! and a wide launch (1,280 blocks) alone, followed by a dependent one-block norm, and with
//! the norm done by its own last block to finish (`lab_wide`, `lab_tail`): what folding a
//! small launch into the tail of the product before it saves.
//!
//! Each launch reads a different copy of the matrix (copies rotate over ≥ 256 MB, five times
//! the H200's L2), so the figures are from DRAM. Weights are random with sane block scales.
//! Output: one markdown row per (type, shape, kernel): µs per launch, weight GB/s and the
//! fraction of the floor (a read kernel over 4 GiB, as `bench` measures it).

#[path = "common/args.rs"]
mod args;

use anyhow::Context;
use lagoon::core::dtype::GgmlType;
use lagoon::cuda_backend::cudarc::driver::{DevicePtr, sys::CUevent_flags};
use lagoon::cuda_backend::device::{Arg, Device, MvMat, blocks};
use lagoon::cuda_backend::manifest::K;
use lagoon::cuda_backend::weights::wtype;

/// Warps of the streamed mat-vec resident per SM (7 blocks of 4: its 27 KB of shared memory
/// per block).
const MVS_WARPS_PER_SM: usize = 28;

/// Bytes the rotating copies of one matrix span at least.
const ROTATE_BYTES: usize = 256 << 20;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Random row bytes of `ty` (every quant bit pattern is valid; scales kept small).
fn random_matrix(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let f16b = |v: f32| half::f16::from_f32(v).to_le_bytes();
    let blocks = rows * cols / ty.block().0;
    let mut out = Vec::with_capacity(blocks * ty.block().1);
    for _ in 0..blocks {
        match ty {
            GgmlType::Q8_0 => {
                out.extend(f16b(0.01 * (1.0 + rng.f().abs())));
                (0..32).for_each(|_| out.push(rng.next() as u8));
            }
            GgmlType::Q4K => {
                out.extend(f16b(0.01 + 0.02 * rng.f().abs()));
                out.extend(f16b(0.01 + 0.02 * rng.f().abs()));
                (0..140).for_each(|_| out.push(rng.next() as u8));
            }
            GgmlType::Q6K => {
                (0..208).for_each(|_| out.push(rng.next() as u8));
                out.extend(f16b(0.001 + 0.002 * rng.f().abs()));
            }
            _ => unreachable!("the lab's types"),
        }
    }
    out
}

/// max |a − b| / max |b|: 0 when bitwise equal.
fn rel_diff(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
    let d = a
        .iter()
        .zip(b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs() as f64));
    if scale > 0.0 { d / scale } else { d }
}

/// GPU time per launch of `launch(i)` over `reps` launches (after `reps / 5 + 1` warm-ups).
fn time_us(
    dev: &Device,
    reps: usize,
    mut launch: impl FnMut(usize) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    for i in 0..reps / 5 + 1 {
        launch(i)?;
    }
    let e0 = dev.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let e1 = dev.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    e0.record(&dev.stream)?;
    for i in 0..reps {
        launch(i)?;
    }
    e1.record(&dev.stream)?;
    Ok(e0.elapsed_ms(&e1)? as f64 * 1e3 / reps as f64)
}

/// `one` uploaded as many times as it takes to span [`ROTATE_BYTES`] (so that launches over
/// the copies in turn read from DRAM, not L2): the buffer and the number of copies.
fn upload_rotating(
    dev: &Device,
    one: &[u8],
) -> anyhow::Result<(lagoon::cuda_backend::cudarc::driver::CudaSlice<u8>, usize)> {
    let copies = ROTATE_BYTES.div_ceil(one.len()).max(1);
    let mut all = Vec::with_capacity(one.len() * copies);
    for _ in 0..copies {
        all.extend_from_slice(one);
    }
    Ok((dev.stream.clone_htod(&all)?, copies))
}

/// µs per launch of the exact one-token product `kernel` (a `matmul_*`: f32 input) over the
/// rotating weight copies `at(i)`.
#[allow(clippy::too_many_arguments)]
fn time_matmul(
    dev: &Device,
    reps: usize,
    kernel: K,
    at: &dyn Fn(usize) -> u64,
    row_bytes: u64,
    (xp, op): (u64, u64),
    rows: usize,
    cols: usize,
) -> anyhow::Result<f64> {
    time_us(dev, reps, |i| {
        dev.launch(
            kernel,
            (blocks(rows, 4), 1),
            128,
            &[
                Arg::P(at(i)),
                Arg::P(row_bytes),
                Arg::P(xp),
                Arg::P(op),
                Arg::I(rows as i32),
                Arg::I(cols as i32),
                Arg::I(1),
            ],
        )?;
        Ok(())
    })
}

/// One table row: `us` per launch moving `bytes`, and that as GB/s and a share of `floor`.
fn print_row(ty: &str, shape: &str, kernel: &str, us: f64, bytes: f64, floor: f64) {
    let gb_s = bytes / (us * 1e-6) / 1e9;
    println!(
        "| {ty} | {shape} | {kernel} | {us:.1} | {gb_s:.0} | {:.1}% |",
        100.0 * gb_s / floor
    );
}

/// `--sync`: µs per dependent launch (graph-replayed, programmatic launch) and per grid
/// barrier of a persistent kernel, each without and with a norm's work per step.
fn sync_lab(dev: &Device) -> anyhow::Result<()> {
    use lagoon::cuda_backend::cudarc::driver::sys;
    let s = &dev.stream;
    let n = 3072usize;
    let mut bufs = s.alloc_zeros::<f32>(3 * n)?;
    s.memcpy_htod(&vec![1.0f32; 3 * n], &mut bufs)?;
    let bp = bufs.device_ptr(s).0;
    let count = s.alloc_zeros::<u32>(1)?;
    let cp = count.device_ptr(s).0;
    let event = || dev.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
    println!("| what | µs each |");
    println!("|---|---:|");
    let hops = 240usize;
    let replays = 20usize;
    // A product-like launch: as many 128-thread blocks as S 2.1's Q/K/V rows at four a block.
    let wide = 1280u32;
    let hop = |i: usize| -> [Arg; 3] {
        [
            Arg::P(bp + 4 * ((i % 2) * n) as u64),
            Arg::P(bp + 4 * (((i + 1) % 2) * n) as u64),
            Arg::I(n as i32),
        ]
    };
    let chains: [(&str, &[K]); 5] = [
        (
            "dependent launch, empty (graph, programmatic launch)",
            &[K::LabEmpty],
        ),
        ("dependent launch, a norm's work on one block", &[K::LabHop]),
        ("wide launch (1,280 blocks), trivial work", &[K::LabWide]),
        (
            "wide launch then a dependent one-block norm",
            &[K::LabWide, K::LabHop],
        ),
        ("wide launch whose last block does the norm", &[K::LabTail]),
    ];
    for (name, ks) in chains {
        dev.pdl.set(true);
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let mut captured = Ok(());
        'cap: for i in 0..hops {
            for &k in ks {
                let r = match k {
                    K::LabEmpty => dev.launch(k, (1, 1), 128, &[]),
                    K::LabWide => dev.launch(k, (wide, 1), 128, &[Arg::P(bp), Arg::I(n as i32)]),
                    K::LabTail => dev.launch(
                        k,
                        (wide, 1),
                        128,
                        &[Arg::P(cp), Arg::P(bp), Arg::I(n as i32)],
                    ),
                    _ => dev.launch(k, (1, 1), 1024, &hop(i)),
                };
                if r.is_err() {
                    captured = r;
                    break 'cap;
                }
            }
        }
        let g = s.end_capture(sys::CUgraphInstantiate_flags(0))?;
        dev.pdl.set(false);
        captured?;
        let g = g.context("an empty graph")?;
        g.launch()?;
        let (e0, e1) = (event()?, event()?);
        e0.record(s)?;
        for _ in 0..replays {
            g.launch()?;
        }
        e1.record(s)?;
        let us = e0.elapsed_ms(&e1)? as f64 * 1e3 / (replays * hops) as f64;
        println!("| {name} | {us:.2} |");
    }
    let sms = dev.sm_count()?;
    let mut bar = s.alloc_zeros::<u32>(2)?;
    let barp = bar.device_ptr(s).0;
    let rounds = 2000usize;
    for hop in [0, 1] {
        let mut launch = || -> anyhow::Result<()> {
            s.memset_zeros(&mut bar)?;
            dev.launch(
                K::LabBarrier,
                (sms, 1),
                1024,
                &[
                    Arg::P(barp),
                    Arg::P(bp),
                    Arg::I(n as i32),
                    Arg::I(rounds as i32),
                    Arg::I(hop),
                ],
            )?;
            Ok(())
        };
        launch()?;
        let (e0, e1) = (event()?, event()?);
        e0.record(s)?;
        launch()?;
        e1.record(s)?;
        let us = e0.elapsed_ms(&e1)? as f64 * 1e3 / rounds as f64;
        let what = if hop == 0 {
            format!("grid barrier, {sms} blocks (one per SM)")
        } else {
            format!("grid barrier, {sms} blocks, a norm's work on one block between barriers")
        };
        println!("| {what} | {us:.2} |");
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let a = args::Args::parse(include_str!("kernel_lab.rs"), &["sync"])?;
    let ordinal: usize = a.num("device", 0)?;
    let reps: usize = a.num("reps", 50)?;
    anyhow::ensure!(reps > 0, "--reps must be at least 1");
    let dev = Device::new(ordinal).context("opening the CUDA device")?;
    if a.flag("sync") {
        return sync_lab(&dev);
    }
    let floor = dev.read_bandwidth(4 << 30)?;
    println!(
        "device {ordinal} ({}), read floor {floor:.0} GB/s, {reps} launches per figure\n",
        dev.arch
    );
    println!("| type | shape | kernel | µs | GB/s | of floor |");
    println!("|---|---|---|---:|---:|---:|");
    let shapes = [
        ("q_proj", 9216usize, 3072usize),
        ("o_proj", 3072, 9216),
        ("kv_proj", 1024, 3072),
        ("expert gate", 1024, 3072),
        ("expert down", 3072, 1024),
        ("lm_head", 100_352, 3072),
    ];
    let mut rng = Rng(0x1ab_5eed);
    let s = &dev.stream;
    let want_shapes = a.get("shapes").unwrap_or("");
    let want_types = a.get("types").unwrap_or("q4_K,q6_K,q8_0");
    for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q8_0] {
        if !want_types.split(',').any(|t| t == ty.to_string()) {
            continue;
        }
        let wt = wtype(ty).context("a device type")?;
        let fmt = wt.act().context("a quantised type")?;
        let mvq = wt.mvq().context("a quantised type")?;
        for (name, rows, cols) in shapes {
            if !want_shapes.is_empty() && !want_shapes.split(',').any(|w| name.contains(w)) {
                continue;
            }
            let one = random_matrix(&mut rng, ty, rows, cols);
            let (w, copies) = upload_rotating(&dev, &one)?;
            let wp = w.device_ptr(s).0;
            let row_bytes = ty.row_bytes(cols as u64).context("row bytes")?;
            let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
            let xb = s.clone_htod(&x)?;
            let xp = xb.device_ptr(s).0;
            let stride = fmt.row_stride(cols);
            let qb = s.alloc_zeros::<u8>(stride)?;
            let qp = qb.device_ptr(s).0;
            let ob = s.alloc_zeros::<f32>(rows)?;
            let op = ob.device_ptr(s).0;
            let at = |i: usize| wp + ((i % copies) * one.len()) as u64;
            let bytes = one.len() as f64;
            let shape = format!("{name} {rows}×{cols}");
            let row = |kernel: &str, us: f64, b: f64| {
                print_row(&ty.to_string(), &shape, kernel, us, b, floor)
            };
            let exact = time_matmul(
                &dev,
                reps,
                wt.matmul(),
                &at,
                row_bytes,
                (xp, op),
                rows,
                cols,
            )?;
            row(&format!("{:?} (exact)", wt.matmul()), exact, bytes);
            let quant = time_us(&dev, reps, |_| {
                dev.quantize_act(fmt, xp, qp, cols, stride, 1)?;
                Ok(())
            })?;
            row(&format!("{:?}", fmt.kernel()), quant, 4.0 * cols as f64);
            let mv = time_us(&dev, reps, |i| {
                let one = MvMat {
                    w: at(i),
                    row_bytes,
                    rows,
                    out: op,
                    res: 0,
                };
                dev.mv(mvq.mv, qp, cols, &[one])?;
                Ok(())
            })?;
            row(&format!("{:?}", mvq.mv), mv, bytes);
            if ty == GgmlType::Q6K || ty == GgmlType::Q4K {
                dev.mv(
                    mvq.mv,
                    qp,
                    cols,
                    &[MvMat {
                        w: wp,
                        row_bytes,
                        rows,
                        out: op,
                        res: 0,
                    }],
                )?;
                let want = s.clone_dtoh(&ob)?;
                let max_warps = dev.sm_count()? as usize * MVS_WARPS_PER_SM;
                let auto = rows.div_ceil(max_warps);
                let variants = if ty == GgmlType::Q6K {
                    vec![(K::LabMvwQ6K, vec![1])]
                } else {
                    vec![
                        (K::LabMvsQ4K, vec![1, 2, auto]),
                        (K::LabMvsMemOnlyQ4K, vec![1, 2]),
                        (K::LabMvhQ4K, vec![2]),
                        (K::LabMvwQ4K, vec![1]),
                        (K::LabMvwpQ4K, vec![1]),
                    ]
                };
                for (kernel, rpws) in variants {
                    for rpw in rpws {
                        let launch = |w: u64| {
                            dev.launch(
                                kernel,
                                (blocks(rows, 4 * rpw), 1),
                                128,
                                &[
                                    Arg::P(w),
                                    Arg::P(row_bytes),
                                    Arg::P(qp),
                                    Arg::I(cols as i32),
                                    Arg::P(op),
                                    Arg::P(0),
                                    Arg::I(rows as i32),
                                    Arg::I(rpw as i32),
                                ],
                            )
                        };
                        launch(wp)?;
                        let got = s.clone_dtoh(&ob)?;
                        let d = rel_diff(&got, &want);
                        let us = time_us(&dev, reps, |i| Ok(launch(at(i))?))?;
                        row(
                            &format!("{} rpw {rpw} (vs mv: {d:.1e})", kernel.name()),
                            us,
                            bytes,
                        );
                    }
                }
            }
            s.synchronize()?;
        }
    }
    if want_types.split(',').any(|t| t == "bf16" || t == "ct4") {
        w4a16_lab(
            &dev,
            reps,
            floor,
            &mut rng,
            &shapes,
            want_shapes,
            want_types,
        )?;
    }
    if a.get("moe") != Some("no") {
        moe_lab(&dev, reps, floor, &mut rng)?;
    }
    Ok(())
}

/// W4A16's batch-1 products (`--types bf16,ct4`): bf16 matrices against the f32 input
/// (`matmul_bf16`, the production `mv_bf16`, and the lab's `mvw2_bf16` / `mvx_bf16`, each
/// with its largest relative difference from `mv_bf16`), and CT4 blocks (compressed-tensors
/// int4, group 32, bf16 scales) against Q8_0 (`quantize_q8_0` + `mv_ct4`).
#[allow(clippy::too_many_arguments)]
fn w4a16_lab(
    dev: &Device,
    reps: usize,
    floor: f64,
    rng: &mut Rng,
    shapes: &[(&str, usize, usize)],
    want_shapes: &str,
    want_types: &str,
) -> anyhow::Result<()> {
    use lagoon::cuda_backend::manifest::WType;
    use lagoon::cuda_backend::weights::CT4_BLOCK_BYTES;
    let s = &dev.stream;
    for ty in ["bf16", "ct4"] {
        if !want_types.split(',').any(|t| t == ty) {
            continue;
        }
        for &(name, rows, cols) in shapes {
            if !want_shapes.is_empty() && !want_shapes.split(',').any(|w| name.contains(w)) {
                continue;
            }
            // bf16 weights near ±0.02; CT4 blocks: a bf16 scale near 0.002, zero point 0,
            // random codes.
            let row_bytes = if ty == "bf16" {
                2 * cols
            } else {
                cols / 32 * CT4_BLOCK_BYTES
            };
            let mut one = Vec::with_capacity(rows * row_bytes);
            if ty == "bf16" {
                for _ in 0..rows * cols {
                    one.extend(half::bf16::from_f32(0.02 * rng.f()).to_le_bytes());
                }
            } else {
                for _ in 0..rows * cols / 32 {
                    one.extend(half::bf16::from_f32(0.002 * (1.0 + rng.f().abs())).to_le_bytes());
                    one.extend([0u8, 2]);
                    (0..16).for_each(|_| one.push(rng.next() as u8));
                }
            }
            let (w, copies) = upload_rotating(dev, &one)?;
            let wp = w.device_ptr(s).0;
            let at = |i: usize| wp + ((i % copies) * one.len()) as u64;
            let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
            let xb = s.clone_htod(&x)?;
            let xp = xb.device_ptr(s).0;
            let ob = s.alloc_zeros::<f32>(rows)?;
            let op = ob.device_ptr(s).0;
            let bytes = one.len() as f64;
            let shape = format!("{name} {rows}×{cols}");
            let row = |kernel: &str, us: f64, b: f64| print_row(ty, &shape, kernel, us, b, floor);
            let mv_one = |kernel: K, src: u64, w: u64| {
                let m = MvMat {
                    w,
                    row_bytes: row_bytes as u64,
                    rows,
                    out: op,
                    res: 0,
                };
                dev.mv(kernel, src, cols, &[m])
            };
            if ty == "ct4" {
                let fmt = WType::Ct4.act().context("CT4 pairs with Q8_0")?;
                let mv = WType::Ct4.mvq().context("CT4 mat-vec")?.mv;
                let stride = fmt.row_stride(cols);
                let qb = s.alloc_zeros::<u8>(stride)?;
                let qp = qb.device_ptr(s).0;
                let quant = time_us(dev, reps, |_| {
                    dev.quantize_act(fmt, xp, qp, cols, stride, 1)?;
                    Ok(())
                })?;
                row(&format!("{:?}", fmt.kernel()), quant, 4.0 * cols as f64);
                let us = time_us(dev, reps, |i| Ok(mv_one(mv, qp, at(i))?))?;
                row(&format!("{mv:?}"), us, bytes);
                s.synchronize()?;
                continue;
            }
            let (mv, _) = WType::Bf16.mvh().context("bf16 mat-vec")?;
            let exact = time_matmul(
                dev,
                reps,
                WType::Bf16.matmul(),
                &at,
                row_bytes as u64,
                (xp, op),
                rows,
                cols,
            )?;
            row(
                &format!("{:?} (generic)", WType::Bf16.matmul()),
                exact,
                bytes,
            );
            let us = time_us(dev, reps, |i| Ok(mv_one(mv, xp, at(i))?))?;
            row(&format!("{mv:?}"), us, bytes);
            mv_one(mv, xp, wp)?;
            let want = s.clone_dtoh(&ob)?;
            for (kernel, per_block) in [
                (K::LabMvw2Bf16, 8),
                (K::LabMvxBf16, 4),
                (K::LabMvb4Bf16, 4),
                (K::LabMvb16Bf16, 4),
                (K::LabMvb8csBf16, 4),
                (K::LabMvkBf16, 1),
            ] {
                let launch = |w: u64| {
                    dev.launch(
                        kernel,
                        (blocks(rows, per_block), 1),
                        128,
                        &[
                            Arg::P(w),
                            Arg::P(row_bytes as u64),
                            Arg::P(xp),
                            Arg::P(op),
                            Arg::I(rows as i32),
                            Arg::I(cols as i32),
                        ],
                    )
                };
                launch(wp)?;
                let d = rel_diff(&s.clone_dtoh(&ob)?, &want);
                let us = time_us(dev, reps, |i| Ok(launch(at(i))?))?;
                row(&format!("{} (vs mv: {d:.1e})", kernel.name()), us, bytes);
            }
            s.synchronize()?;
        }
    }
    Ok(())
}

/// Q4_K rows (`row_bytes` each, a multiple of four 144-byte super-blocks) regrouped as
/// `moe_gate_up_g4_q4_K` (lab.cu) reads them: per run of four super-blocks, the four
/// 16-byte headers, then bytes 16 + 32g .. 32 + 32g of super-block j for (j, g) in order,
/// then bytes 32 + 32g .. 48 + 32g likewise.
fn g4_layout(m: &[u8], row_bytes: usize) -> Vec<u8> {
    assert_eq!(
        row_bytes % 576,
        0,
        "rows of whole runs of four super-blocks"
    );
    let mut out = vec![0u8; m.len()];
    for (src, dst) in m.chunks_exact(576).zip(out.chunks_exact_mut(576)) {
        for j in 0..4 {
            let blk = &src[144 * j..144 * (j + 1)];
            dst[16 * j..16 * (j + 1)].copy_from_slice(&blk[..16]);
            for g in 0..4 {
                let p = 16 * (4 * j + g);
                dst[64 + p..80 + p].copy_from_slice(&blk[16 + 32 * g..32 + 32 * g]);
                dst[320 + p..336 + p].copy_from_slice(&blk[32 + 32 * g..48 + 32 * g]);
            }
        }
    }
    out
}

/// The routed experts' gate/up at S 2.1's shape (256 experts of 1024×3072 Q4_K, top 10 +
/// the shared expert): `moe_gate_up_q_q4_K` against the streamed `moe_gate_up_s_q4_K`, the
/// half-warp and regrouped forms and the row-pairs-per-warp forms, each launch with another
/// of 32 random expert selections.
fn moe_lab(dev: &Device, reps: usize, floor: f64, rng: &mut Rng) -> anyhow::Result<()> {
    let (e, i_dim, h, k) = (256usize, 1024usize, 3072usize, 10usize);
    let ty = GgmlType::Q4K;
    let s = &dev.stream;
    let row_bytes = ty.row_bytes(h as u64).context("row bytes")?;
    let expert_bytes = row_bytes * i_dim as u64;
    // Each matrix in the plain layout and regrouped for moe_gate_up_g4_q4_K (g4_layout).
    let mut upload = |n: usize| -> anyhow::Result<_> {
        let one = random_matrix(rng, ty, i_dim, h);
        let g4 = g4_layout(&one, row_bytes as usize);
        let rep = |m: &[u8]| -> anyhow::Result<_> {
            let mut all = Vec::with_capacity(m.len() * n);
            for _ in 0..n {
                all.extend_from_slice(m);
            }
            Ok(s.clone_htod(&all)?)
        };
        Ok((rep(&one)?, rep(&g4)?))
    };
    let ((wg, wg4), (wu, wu4)) = (upload(e)?, upload(e)?);
    let ((sg, sg4), (su, su4)) = (upload(1)?, upload(1)?);
    let fmt = wtype(ty).context("q4_K")?.act().context("act")?;
    let x: Vec<f32> = (0..h).map(|_| rng.f()).collect();
    let xb = s.clone_htod(&x)?;
    let stride = fmt.row_stride(h);
    let qb = s.alloc_zeros::<u8>(stride)?;
    dev.quantize_act(fmt, xb.device_ptr(s).0, qb.device_ptr(s).0, h, stride, 1)?;
    const SETS: usize = 32;
    let mut ids = Vec::with_capacity(SETS * k);
    let mut wts = Vec::with_capacity(SETS * k);
    for _ in 0..SETS {
        let mut set: Vec<u32> = Vec::new();
        while set.len() < k {
            let id = (rng.next() % e as u64) as u32;
            if !set.contains(&id) {
                set.push(id);
            }
        }
        ids.extend(set.iter().map(|&v| f32::from_bits(v)));
        wts.extend((0..k).map(|_| 0.1 + 0.05 * rng.f()));
    }
    let idb = s.clone_htod(&ids)?;
    let wb = s.clone_htod(&wts)?;
    let rc = s.alloc_zeros::<f32>(2 * k)?;
    let act = s.alloc_zeros::<f32>((k + 1) * i_dim)?;
    let (wgp, wup) = (wg.device_ptr(s).0, wu.device_ptr(s).0);
    let (sgp, sup) = (sg.device_ptr(s).0, su.device_ptr(s).0);
    let (qp, idp, wp, rcp, actp) = (
        qb.device_ptr(s).0,
        idb.device_ptr(s).0,
        wb.device_ptr(s).0,
        rc.device_ptr(s).0,
        act.device_ptr(s).0,
    );
    let bytes = (2 * (k + 1)) as f64 * expert_bytes as f64;
    let row = |kernel: &str, us: f64| {
        let gb_s = bytes / (us * 1e-6) / 1e9;
        println!(
            "| q4_K | moe gate+up {k}+1 of {e}×{i_dim}×{h} | {kernel} | {us:.1} | {gb_s:.0} | {:.1}% |",
            100.0 * gb_s / floor
        );
    };
    let common = |set: usize| {
        [
            Arg::P(wgp),
            Arg::P(wup),
            Arg::P(expert_bytes),
            Arg::P(row_bytes),
            Arg::P(sgp),
            Arg::P(sup),
            Arg::P(qp),
            Arg::P(idp + (4 * k * set) as u64),
            Arg::P(wp + (4 * k * set) as u64),
            Arg::P(rcp),
            Arg::P(actp),
            Arg::I(i_dim as i32),
            Arg::I(h as i32),
            Arg::I(k as i32),
        ]
    };
    // The kernels with moe_gate_up_q's grid and arguments.
    let per_row = |kernel: K, set: usize| {
        // (the production kernel's `early`: 0, its shared expert waits like the routed slots)
        let mut a = common(set).to_vec();
        if kernel == K::GateUpQQ4K {
            a.push(Arg::I(0));
        }
        dev.launch(kernel, (blocks(i_dim, 4), k as u32 + 1), 128, &a)
    };
    let old = |set: usize| per_row(K::GateUpQQ4K, set);
    old(0)?;
    let want = s.clone_dtoh(&act)?;
    let us = time_us(dev, reps, |i| Ok(old(i % SETS)?))?;
    row("moe_gate_up_q_q4_K", us);
    let pairs = (k + 1) * i_dim;
    let max_warps = dev.sm_count()? as usize * MVS_WARPS_PER_SM;
    for ppw in [1, 2, pairs.div_ceil(max_warps)] {
        let new = |set: usize| {
            let mut a = common(set).to_vec();
            a.push(Arg::I(ppw as i32));
            dev.launch(K::LabGateUpSQ4K, (blocks(pairs, 4 * ppw), 1), 128, &a)
        };
        new(0)?;
        let got = s.clone_dtoh(&act)?;
        let d = rel_diff(&got, &want);
        let us = time_us(dev, reps, |i| Ok(new(i % SETS)?))?;
        row(
            &format!("moe_gate_up_s_q4_K ppw {ppw} (vs old: {d:.1e})"),
            us,
        );
    }
    let half = |set: usize| per_row(K::LabGateUpHQ4K, set);
    half(0)?;
    let want_h = s.clone_dtoh(&act)?;
    let d = rel_diff(&want_h, &want);
    let us = time_us(dev, reps, |i| Ok(half(i % SETS)?))?;
    row(&format!("moe_gate_up_h_q4_K (vs old: {d:.1e})"), us);
    // The same half-warp product on the regrouped copies: its output must be the half-warp
    // kernel's bit for bit.
    let g4 = |set: usize| {
        let mut a = common(set).to_vec();
        a[0] = Arg::P(wg4.device_ptr(s).0);
        a[1] = Arg::P(wu4.device_ptr(s).0);
        a[4] = Arg::P(sg4.device_ptr(s).0);
        a[5] = Arg::P(su4.device_ptr(s).0);
        dev.launch(K::LabGateUpG4Q4K, (blocks(i_dim, 4), k as u32 + 1), 128, &a)
    };
    g4(0)?;
    let got = s.clone_dtoh(&act)?;
    let same = got
        .iter()
        .zip(&want_h)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    let us = time_us(dev, reps, |i| Ok(g4(i % SETS)?))?;
    row(
        &format!("moe_gate_up_g4_q4_K (regrouped rows; bits equal to h: {same})"),
        us,
    );
    // Row pairs per warp with the activation pieces in registers (lab.cu gate_up_rows_q4k),
    // and the weights bulk-copied into shared memory (gate_up_tma_q4k: four warps of PPW rows
    // a block): each kernel takes 4 · n rows a block, and its output is the production
    // kernel's bit for bit (the loads-only forms excepted).
    const REGS: &str = "activation in registers";
    const BULK: &str = "bulk copies to shared memory";
    for (kernel, n, name, how, memonly) in [
        (K::LabGateUpR1Q4K, 1, "r1", REGS, false),
        (K::LabGateUpR2Q4K, 2, "r2", REGS, false),
        (K::LabGateUpR4Q4K, 4, "r4", REGS, false),
        (K::LabGateUpR2pQ4K, 2, "r2p", REGS, false),
        (K::LabGateUpR4pQ4K, 4, "r4p", REGS, false),
        (K::LabGateUpT4Q4K, 4, "t4", BULK, false),
        (K::LabGateUpT4mQ4K, 4, "t4m", BULK, true),
        (K::LabGateUpT2Q4K, 2, "t2", BULK, false),
        (K::LabGateUpT2mQ4K, 2, "t2m", BULK, true),
    ] {
        let run = |set: usize| {
            dev.launch(
                kernel,
                (blocks(i_dim, 4 * n), k as u32 + 1),
                128,
                &common(set),
            )
        };
        run(0)?;
        let got = s.clone_dtoh(&act)?;
        let same = got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let us = time_us(dev, reps, |i| Ok(run(i % SETS)?))?;
        let what = if memonly {
            "loads only".to_string()
        } else {
            format!("bits equal to q: {same}")
        };
        row(&format!("moe_gate_up_{name}_q4_K ({how}; {what})"), us);
    }
    s.synchronize()?;
    Ok(())
}
