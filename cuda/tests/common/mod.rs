//! Helpers shared by the device test binaries: a deterministic generator, uploads and
//! downloads, random weight rows of every device type, and the error measure.
#![allow(dead_code)]

use cudarc::driver::{CudaSlice, DevicePtr};
use lagoon_core::dtype::GgmlType;
use lagoon_cuda::device::{Arg, Device};
use lagoon_cuda::manifest::K;

/// A small deterministic generator (xorshift64*), so failures reproduce.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    pub fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn byte(&mut self) -> u8 {
        (self.next() >> 56) as u8
    }
}

pub fn device() -> Device {
    Device::new(0).unwrap_or_else(|e| panic!("{e}"))
}

pub fn upload<T: cudarc::driver::DeviceRepr>(dev: &Device, v: &[T]) -> (CudaSlice<T>, u64) {
    let buf = dev.stream.clone_htod(v).unwrap();
    let p = buf.device_ptr(&dev.stream).0;
    (buf, p)
}

pub fn download(dev: &Device, b: &CudaSlice<f32>) -> Vec<f32> {
    let v = dev.stream.clone_dtoh(b).unwrap();
    dev.stream.synchronize().unwrap();
    v
}

/// A random 4-bit group-32 compressed-tensors matrix: its layout and its weight, scale and
/// zero-point buffers (asymmetric with packed zero points when `asym`; scales in
/// 0.002 .. 0.012 in the scale dtype `sd`). `CtMatrix::new(layout, &w, &s, &z)` views it.
pub fn random_ct4(
    rng: &mut Rng,
    rows: usize,
    cols: usize,
    asym: bool,
    sd: lagoon_core::quant::ct::ScaleDtype,
) -> (lagoon_core::quant::ct::CtLayout, [Vec<u8>; 3]) {
    use lagoon_core::quant::ct::{CtKind, CtStrategy, PackOrder};
    let kind = CtKind::packed_int(4, CtStrategy::Group(32), !asym, PackOrder::Dense);
    random_ct(rng, kind, rows, cols, sd)
}

/// A random compressed-tensors matrix of `kind` (zero points packed for pack-quantized kinds,
/// plain `I8` for int-quantized ones, when asymmetric), scales in 0.002 .. 0.012 in `sd`.
pub fn random_ct(
    rng: &mut Rng,
    kind: lagoon_core::quant::ct::CtKind,
    rows: usize,
    cols: usize,
    sd: lagoon_core::quant::ct::ScaleDtype,
) -> (lagoon_core::quant::ct::CtLayout, [Vec<u8>; 3]) {
    use lagoon_core::quant::ct::{CtKind, CtLayout, ScaleDtype, ZeroPoint, ZpDtype};
    let zero = match kind {
        _ if kind.symmetric() => None,
        CtKind::PackedInt { .. } => Some(ZeroPoint::Packed),
        _ => Some(ZeroPoint::Plain(ZpDtype::I8)),
    };
    let layout = CtLayout {
        kind,
        rows,
        cols,
        scale_dtype: sd,
        zero,
    };
    let weight: Vec<u8> = (0..layout.weight_bytes()).map(|_| rng.byte()).collect();
    let scale: Vec<u8> = (0..layout.scale_bytes() / 2)
        .flat_map(|_| {
            let v = 0.002 + 0.01 * rng.f().abs();
            match sd {
                ScaleDtype::F16 => half::f16::from_f32(v).to_le_bytes(),
                _ => half::bf16::from_f32(v).to_le_bytes(),
            }
        })
        .collect();
    let zero: Vec<u8> = (0..layout.zero_bytes()).map(|_| rng.byte()).collect();
    (layout, [weight, scale, zero])
}

/// Random row bytes of `ty` with sane scales (every bit pattern of the quants is valid).
pub fn random_rows(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let f16b = |v: f32| half::f16::from_f32(v).to_le_bytes();
    let mut out = Vec::new();
    for _ in 0..rows {
        match ty {
            GgmlType::F32 => (0..cols).for_each(|_| out.extend(rng.f().to_le_bytes())),
            GgmlType::F16 => (0..cols).for_each(|_| out.extend(f16b(rng.f()))),
            GgmlType::BF16 => {
                (0..cols).for_each(|_| out.extend(half::bf16::from_f32(rng.f()).to_le_bytes()))
            }
            GgmlType::Q8_0 => {
                let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
                let mut b = vec![0u8; cols / 32 * 34];
                lagoon_core::quant::quantize_row_q8_0(&x, &mut b);
                out.extend(b);
            }
            GgmlType::Q4K => {
                for _ in 0..cols / 256 {
                    out.extend(f16b(0.01 + 0.02 * rng.f().abs()));
                    out.extend(f16b(0.01 + 0.02 * rng.f().abs()));
                    (0..140).for_each(|_| out.push(rng.byte()));
                }
            }
            GgmlType::Q6K => {
                for _ in 0..cols / 256 {
                    (0..208).for_each(|_| out.push(rng.byte()));
                    out.extend(f16b(0.001 + 0.002 * rng.f().abs()));
                }
            }
            GgmlType::Q5K => {
                for _ in 0..cols / 256 {
                    out.extend(f16b(0.005 + 0.01 * rng.f().abs()));
                    out.extend(f16b(0.01 + 0.02 * rng.f().abs()));
                    (0..172).for_each(|_| out.push(rng.byte()));
                }
            }
            GgmlType::IQ4XS => {
                for _ in 0..cols / 256 {
                    out.extend(f16b(0.0002 + 0.0004 * rng.f().abs()));
                    (0..134).for_each(|_| out.push(rng.byte()));
                }
            }
            // The grid IQ types: a scale, then random grid indices, sign indices, scales.
            GgmlType::IQ3XXS | GgmlType::IQ2XXS | GgmlType::IQ2S => {
                let bytes = ty.row_bytes(256).unwrap() as usize;
                for _ in 0..cols / 256 {
                    out.extend(f16b(0.0002 + 0.0004 * rng.f().abs()));
                    (2..bytes).for_each(|_| out.push(rng.byte()));
                }
            }
            _ => unreachable!(),
        }
    }
    out
}

/// Whether two outputs are equal bit for bit (and of one length).
#[allow(dead_code)] // not every test binary that includes this module uses it
pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Relative L2 distance of `a` from `b` (the whole-model logits measure).
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut n, mut d) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        n += (x as f64 - y as f64).powi(2);
        d += (y as f64).powi(2);
    }
    (n / d).sqrt()
}

pub fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-30);
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs() / scale))
}

/// The f32 attention kernel's output for `n` queries at positions `pos0..` (grid (hq, n)),
/// head_dim `d`.
#[allow(clippy::too_many_arguments)]
pub fn attention_f32(
    dev: &Device,
    q: u64,
    kc: u64,
    vc: u64,
    cap: usize,
    hq: usize,
    n_kv: usize,
    d: usize,
    window: usize,
    n: usize,
    params: u64,
) -> Vec<f32> {
    let ob = dev.stream.alloc_zeros::<f32>(n * hq * d).unwrap();
    dev.launch(
        K::Attention,
        (hq as u32, n as u32),
        128,
        &[
            Arg::P(q),
            Arg::P(kc),
            Arg::P(vc),
            Arg::P(ob.device_ptr(&dev.stream).0),
            Arg::P(0),
            Arg::I(cap as i32),
            Arg::I(hq as i32),
            Arg::I(n_kv as i32),
            Arg::I(d as i32),
            Arg::I(window as i32),
            Arg::P(params),
        ],
    )
    .unwrap();
    download(dev, &ob)
}

/// A q8_0 KV plane (`common.cuh`'s `kv_q8`, `KvCache::Q8_0`) of the ring `x` (`cap` rows of
/// `row`, `row` a multiple of 32), quantised as ggml's quantize_row_q8_0_ref (d = amax / 127,
/// q = round(x / d) through id = 1 / d, d stored as f16): the plane's bytes (quants, then
/// the f16 scales) and the values it reads back as (f16(d) · q).
pub fn q8_plane(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    assert!(x.len().is_multiple_of(32));
    let mut quants = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(x.len() / 32 * 2);
    let mut back = Vec::with_capacity(x.len());
    for b in x.chunks(32) {
        let amax = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let dh = half::f16::from_f32(d);
        scales.extend_from_slice(&dh.to_bits().to_le_bytes());
        for &v in b {
            let q = (v * id).round().clamp(-128.0, 127.0) as i8;
            quants.push(q as u8);
            back.push(dh.to_f32() * q as f32);
        }
    }
    quants.extend_from_slice(&scales);
    (quants, back)
}
