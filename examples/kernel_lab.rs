//! The CUDA kernel lab: every mat-vec kernel version on Laguna S 2.1's decode shapes, timed
//! in one device call, each against the device's measured read floor.
//!
//! `kernel_lab [--device N] [--reps N]`
//!
//! For each weight type (Q4_K, Q6_K, Q8_0) and shape (Q projection 9216×3072, O projection
//! 3072×9216, K/V 1024×3072, one expert's gate 1024×3072 and down 3072×1024, the lm_head
//! 100352×3072) it times, with CUDA events over `--reps` launches (default 50) after a
//! warm-up:
//! - `matmul_*`: the exact path (weights decoded to f32, f32 activations);
//! - `quantize` + `mv_*`: the quantised-activation path (the activation quantiser timed on
//!   its own, then the integer mat-vec).
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
use lagoon::cuda_backend::weights::wtype;

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

fn main() -> anyhow::Result<()> {
    let a = args::Args::parse(include_str!("kernel_lab.rs"), &[])?;
    let ordinal: usize = a.num("device", 0)?;
    let reps: usize = a.num("reps", 50)?;
    anyhow::ensure!(reps > 0, "--reps must be at least 1");
    let dev = Device::new(ordinal).context("opening the CUDA device")?;
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
    for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q8_0] {
        let wt = wtype(ty).context("a device type")?;
        let fmt = wt.act().context("a quantised type")?;
        let mvq = wt.mvq().context("a quantised type")?;
        for (name, rows, cols) in shapes {
            let one = random_matrix(&mut rng, ty, rows, cols);
            let copies = ROTATE_BYTES.div_ceil(one.len()).max(1);
            let mut all = Vec::with_capacity(one.len() * copies);
            for _ in 0..copies {
                all.extend_from_slice(&one);
            }
            let w = s.clone_htod(&all)?;
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
            let row = |kernel: &str, us: f64, b: f64| {
                let gb_s = b / (us * 1e-6) / 1e9;
                println!(
                    "| {ty} | {name} {rows}×{cols} | {kernel} | {us:.1} | {gb_s:.0} | {:.1}% |",
                    100.0 * gb_s / floor
                );
            };
            let exact = time_us(&dev, reps, |i| {
                dev.launch(
                    wt.matmul(),
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
            })?;
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
            s.synchronize()?;
        }
    }
    Ok(())
}
