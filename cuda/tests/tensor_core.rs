//! The tensor-core prefill kernels (`#[ignore = "needs a CUDA device"]`; run on the GPU
//! machine with `.device/run-tests.sh`).
//!
//! - `gemm.cu` against a CPU product of the same f16-rounded operands: the kernels decode
//!   each weight exactly, round weights and activations to f16 and accumulate in f32, so the
//!   reference does exactly that in f64; what remains is the f32 summation order (~1e-6 of
//!   the output scale).
//! - `flash.cu` against the f32 attention kernel (itself tested against the CPU reference
//!   through whole models) on the same KV rings, within f16 rounding.
//!
//! A wrong fragment layout, tile edge, mask or expert grouping gives O(1).

use cudarc::driver::DevicePtr;
use lagoon_core::dtype::GgmlType;
use lagoon_core::weights::{Encoding, MatRef};
use lagoon_cuda::device::{Arg, Device};
use lagoon_cuda::manifest::WType;
use lagoon_cuda::manifest::{
    GEMM_H16_TILE, GEMM_THREADS, GEMM_TILE_ROWS, GEMM_TILE_TOKENS, GemmKernels, K, gemm_rf, gemm_wg,
};
use lagoon_cuda::weights::wtype;

mod common;

use common::{
    Rng, attention_f32, device, download, max_rel, q8_plane, random_rows, same_bits, upload,
};

/// Relative to the largest output: f32 accumulation over ≤ 3072 terms.
const BOUND: f32 = 2e-5;
/// The SwiGLU activations gate/up stores in f16 for down: half an f16 ulp (2^-11 of the value)
/// on top of BOUND.
const ACT_BOUND: f32 = 5.1e-4;

const TYPES: [GgmlType; 8] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q6K,
    GgmlType::Q5K,
    GgmlType::IQ4XS,
];

fn f16r(v: f32) -> f64 {
    f64::from(half::f16::from_f32(v).to_f32())
}

/// Row `r` of `m`, decoded exactly and rounded to f16.
fn row_f16(m: &MatRef<'_>, r: usize) -> Vec<f64> {
    let mut w = vec![0.0f32; m.cols];
    m.dequant_row(r, &mut w);
    w.into_iter().map(f16r).collect()
}

fn dot(w: &[f64], x: &[f32]) -> f64 {
    w.iter().zip(x).map(|(a, &b)| a * f16r(b)).sum()
}

/// `x` rounded to f16 on the device by `to_f16` (the tensor-core products' input path).
fn to_f16_on_device(dev: &Device, x: &[f32]) -> (cudarc::driver::CudaSlice<u16>, u64) {
    assert!(x.len().is_multiple_of(4));
    let (_xb, xp) = upload(dev, x);
    let out = dev.stream.alloc_zeros::<u16>(x.len()).unwrap();
    let op = out.device_ptr(&dev.stream).0;
    let len4 = x.len() / 4;
    dev.launch(
        K::ToF16,
        (len4.div_ceil(256) as u32, 1),
        256,
        &[Arg::P(xp), Arg::P(op), Arg::P(len4 as u64)],
    )
    .unwrap();
    dev.stream.synchronize().unwrap();
    (out, op)
}

fn f16_bits(x: &[f32]) -> Vec<u16> {
    x.iter()
        .map(|&v| half::f16::from_f32(v).to_bits())
        .collect()
}

#[test]
#[ignore = "needs a CUDA device"]
fn to_f16_rounds_to_nearest_and_saturates_finite_values() {
    let dev = device();
    let mut rng = Rng(0x6e33_0004);
    let mut x: Vec<f32> = (0..4096).map(|_| 70000.0 * rng.f()).collect();
    x.extend([
        65504.0,
        65519.0,
        65520.0,
        1e9,
        -1e9,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-8,
        -0.0,
        6.1e-5,
        3.0e-7,
    ]);
    let (ob, _) = to_f16_on_device(&dev, &x);
    let got = dev.stream.clone_dtoh(&ob).unwrap();
    for (&v, &g) in x.iter().zip(&got) {
        let want = if v.is_finite() && v.abs() > 65504.0 {
            half::f16::from_f32(65504.0f32.copysign(v))
        } else {
            half::f16::from_f32(v)
        };
        if v.is_nan() {
            assert!(half::f16::from_bits(g).is_nan(), "{v}");
        } else {
            assert_eq!(g, want.to_bits(), "{v}: got {}", half::f16::from_bits(g));
        }
    }
}

/// Widths that are a multiple of 32 for `ty` (block types need whole blocks); the second is
/// an odd number of 32-chunks where the type allows, so the last K stage is half empty.
/// For the super-block types a third width of nine super-blocks wraps gemm_rf.cu's
/// three-stage Q4_K ring three times; Q6_K's widths of four and twelve super-blocks are
/// those its gemm_rf.cu kernels take (every super-block offset 0, 2, 4, 6 past an 8-byte
/// boundary, and its two-stage ring wrapped).
fn widths(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q6K => &[256, 768, 1024, 3072],
        GgmlType::Q4K | GgmlType::Q5K | GgmlType::IQ4XS => &[256, 768, 2304],
        _ => &[256, 544],
    }
}

/// The kernel sets that take `ty` with rows of `cols` on token tiles of `tile`: `gemm.cu`'s
/// (tiles of 32 and 64), and where `gemm_rf` takes them `gemm_rf.cu`'s (same arguments and
/// block; tiles of 64 and 128, the latter for Q4_K dense products and any grouped tile), and
/// on sm_90 devices their wgmma twins where `gemm_wg` has them.
fn kernel_sets(
    arch: &str,
    wt: WType,
    cols: usize,
    tile: usize,
) -> Vec<(&'static str, GemmKernels)> {
    let mut sets = Vec::new();
    if tile <= GEMM_TILE_TOKENS {
        sets.push(("gemm.cu", wt.gemm(tile)));
    }
    if tile >= GEMM_TILE_TOKENS
        && let Some(k) = gemm_rf(wt, cols, tile)
    {
        sets.push(("gemm_rf.cu", k));
        // The same products on Hopper's wgmma (gemm_rf.cu compiled for sm_90a).
        if arch == "sm_90"
            && let Some(w) = gemm_wg(wt, tile)
        {
            sets.push(("gemm_rf.cu wgmma", w));
        }
    }
    sets
}

#[test]
#[ignore = "needs a CUDA device"]
fn dense_gemm_matches_f16_rounded_reference() {
    let dev = device();
    let mut rng = Rng(0x6e33_0001);
    for ty in TYPES {
        for &cols in widths(ty) {
            // Rows past one tile and not a multiple of it.
            let rows = GEMM_TILE_ROWS + 45;
            let data = random_rows(&mut rng, ty, rows, cols);
            let m = MatRef {
                rows,
                cols,
                enc: Encoding::Ggml { ty, data: &data },
            };
            let wr: Vec<Vec<f64>> = (0..rows).map(|r| row_f16(&m, r)).collect();
            let (_wb, wp) = upload(&dev, &data);
            for (n, tile) in [
                (16usize, 64usize),
                (64, 64),
                (133, 64),
                (16, 32),
                (77, 32),
                (16, 128),
                (133, 128),
                // A last tile of 92 live tokens: the wgmma kernels' n96 width.
                (220, 128),
                (300, 128),
            ] {
                // Dense products on 128-token tiles: Q4_K's gemm_rf.cu kernels only.
                if tile == 128 && ty != GgmlType::Q4K {
                    continue;
                }
                let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
                let want: Vec<f32> = (0..n)
                    .flat_map(|t| {
                        let xt = &x[t * cols..(t + 1) * cols];
                        wr.iter().map(move |w| dot(w, xt) as f32)
                    })
                    .collect();
                let (_xb, xp) = to_f16_on_device(&dev, &x);
                for (src, kern) in kernel_sets(&dev.arch, wtype(ty).unwrap(), cols, tile) {
                    let ob = dev.stream.alloc_zeros::<f32>(n * rows).unwrap();
                    dev.launch(
                        kern.dense,
                        (
                            rows.div_ceil(GEMM_TILE_ROWS) as u32,
                            n.div_ceil(tile) as u32,
                        ),
                        GEMM_THREADS,
                        &[
                            Arg::P(wp),
                            Arg::P(ty.row_bytes(cols as u64).unwrap()),
                            Arg::P(xp),
                            Arg::P(ob.device_ptr(&dev.stream).0),
                            Arg::I(rows as i32),
                            Arg::I(cols as i32),
                            Arg::I(n as i32),
                        ],
                    )
                    .unwrap();
                    let got = download(&dev, &ob);
                    let e = max_rel(&got, &want);
                    println!(
                        "{src} gemm {ty} {rows}x{cols} n={n} tile {tile}: max rel err {e:.2e}"
                    );
                    assert!(
                        e < BOUND,
                        "{src} gemm {ty} {rows}x{cols} n={n} tile {tile}: {e:.2e}"
                    );
                }
                // gemm_h.cu: the matrix decoded once into an f16 copy, then gemm_h16 (its own
                // 128 x 128 tiles; once per token count).
                if tile != 32 {
                    let wh = dev.stream.alloc_zeros::<u16>(rows * cols).unwrap();
                    let whp = wh.device_ptr(&dev.stream).0;
                    dev.launch(
                        wtype(ty).unwrap().dequant_f16(),
                        ((rows * cols / 32).div_ceil(256) as u32, 1),
                        256,
                        &[
                            Arg::P(wp),
                            Arg::P(ty.row_bytes(cols as u64).unwrap()),
                            Arg::P(whp),
                            Arg::I(rows as i32),
                            Arg::I(cols as i32),
                        ],
                    )
                    .unwrap();
                    // The copy is each weight exactly decoded, then rounded to f16.
                    let whost: Vec<u16> = dev.stream.clone_dtoh(&wh).unwrap();
                    for (r, wrow) in wr.iter().enumerate() {
                        for (c, &v) in wrow.iter().enumerate() {
                            let h = half::f16::from_bits(whost[r * cols + c]);
                            assert_eq!(
                                f64::from(h.to_f32()),
                                v,
                                "dequant_f16 {ty} row {r} col {c}"
                            );
                        }
                    }
                    let h16 = |out: u64| {
                        dev.launch(
                            K::GemmH16,
                            (
                                n.div_ceil(GEMM_H16_TILE) as u32,
                                rows.div_ceil(GEMM_H16_TILE) as u32,
                            ),
                            GEMM_THREADS,
                            &[
                                Arg::P(whp),
                                Arg::P(xp),
                                Arg::P(out),
                                Arg::I(rows as i32),
                                Arg::I(cols as i32),
                                Arg::I(n as i32),
                            ],
                        )
                        .unwrap();
                    };
                    let ob = dev.stream.alloc_zeros::<f32>(n * rows).unwrap();
                    h16(ob.device_ptr(&dev.stream).0);
                    let got = download(&dev, &ob);
                    let e = max_rel(&got, &want);
                    println!("gemm_h.cu gemm {ty} {rows}x{cols} n={n}: max rel err {e:.2e}");
                    assert!(
                        e < BOUND,
                        "gemm_h.cu gemm {ty} {rows}x{cols} n={n}: {e:.2e}"
                    );
                }
            }
        }
    }
}

/// Groups the pairs on the device into tiles of `tile` pairs and returns the buffers.
fn group(
    dev: &Device,
    ids: &[u32],
    n_experts: usize,
    tile: usize,
) -> (cudarc::driver::CudaSlice<u32>, u64, u64, usize) {
    let pairs = ids.len();
    let max_tiles = pairs.div_ceil(tile) + n_experts;
    let idf: Vec<f32> = ids.iter().map(|&e| f32::from_bits(e)).collect();
    let (idb, idp) = upload(dev, &idf);
    let buf = dev
        .stream
        .alloc_zeros::<u32>(pairs + 3 * max_tiles + 1)
        .unwrap();
    let sorted = buf.device_ptr(&dev.stream).0;
    let tiles = sorted + 4 * pairs as u64;
    dev.launch(
        K::MoeGroup,
        (1, 1),
        1024,
        &[
            Arg::P(idp),
            Arg::P(sorted),
            Arg::P(tiles),
            Arg::I(pairs as i32),
            Arg::I(n_experts as i32),
            Arg::I(max_tiles as i32),
            Arg::I(tile as i32),
        ],
    )
    .unwrap();
    dev.stream.synchronize().unwrap();
    drop(idb);
    (buf, sorted, tiles, max_tiles)
}

/// The weight encodings of the grouped test: a ggml type, or compressed-tensors int4 / int8
/// repacked into the device's CT4 / CT8 blocks.
#[derive(Clone, Copy, PartialEq)]
enum ExpertType {
    Ggml(GgmlType),
    Ct4,
    Ct8,
}

/// `n` random expert matrices of `rows x cols`, stacked: their device bytes, row stride and
/// each row decoded and rounded to f16. CT4: group 32, odd experts asymmetric; CT8: channel
/// scales (int-quantized I8), odd experts with zero points; every third expert of either with
/// f16 scales, the others bf16.
struct ExpertMats {
    bytes: Vec<u8>,
    row_bytes: u64,
    rows_f16: Vec<Vec<Vec<f64>>>,
}

fn expert_mats(rng: &mut Rng, ty: ExpertType, n: usize, rows: usize, cols: usize) -> ExpertMats {
    use lagoon_core::quant::ct::{CtKind, CtMatrix, CtStrategy, ScaleDtype};
    let mut m = ExpertMats {
        bytes: Vec::new(),
        row_bytes: 0,
        rows_f16: Vec::new(),
    };
    for e in 0..n {
        let f16_rows = match ty {
            ExpertType::Ggml(ty) => {
                let data = random_rows(rng, ty, rows, cols);
                let mr = MatRef {
                    rows,
                    cols,
                    enc: Encoding::Ggml { ty, data: &data },
                };
                m.row_bytes = ty.row_bytes(cols as u64).unwrap();
                m.bytes.extend_from_slice(&data);
                (0..rows).map(|r| row_f16(&mr, r)).collect()
            }
            ExpertType::Ct4 | ExpertType::Ct8 => {
                // Every third expert's scales in f16: the kernels pick the decode by each
                // expert's scale dtype, read from its own first block.
                let sd = if e % 3 == 2 {
                    ScaleDtype::F16
                } else {
                    ScaleDtype::Bf16
                };
                let (layout, [w, s, z]) = if ty == ExpertType::Ct4 {
                    common::random_ct4(rng, rows, cols, e % 2 == 1, sd)
                } else {
                    let kind = CtKind::Int8 {
                        symmetric: e % 2 == 0,
                        strategy: CtStrategy::Channel,
                    };
                    common::random_ct(rng, kind, rows, cols, sd)
                };
                let mr = MatRef {
                    rows,
                    cols,
                    enc: Encoding::Ct(CtMatrix::new(layout, &w, &s, &z).unwrap()),
                };
                let (blocks, bb) = if ty == ExpertType::Ct4 {
                    let b = lagoon_cuda::weights::ct4_blocks(&mr).expect("a CT4-repackable matrix");
                    (b, lagoon_cuda::weights::CT4_BLOCK_BYTES)
                } else {
                    let b = lagoon_cuda::weights::ct8_blocks(&mr).expect("a CT8-repackable matrix");
                    (b, lagoon_cuda::weights::CT8_BLOCK_BYTES)
                };
                m.row_bytes = (cols / 32 * bb) as u64;
                m.bytes.extend_from_slice(&blocks);
                (0..rows).map(|r| row_f16(&mr, r)).collect()
            }
        };
        m.rows_f16.push(f16_rows);
    }
    m
}

#[test]
#[ignore = "needs a CUDA device"]
fn grouped_expert_gemms_match_f16_rounded_reference() {
    let dev = device();
    let mut rng = Rng(0x6e33_0002);
    let (n_experts, k, n) = (6usize, 3usize, 150usize);
    // Expert 0 gets no pair, expert 1 more than two tiles (of 64 pairs; four of 32).
    let ids: Vec<u32> = (0..n * k)
        .map(|p| {
            if p % k == 0 {
                1
            } else {
                2 + (rng.next() % (n_experts as u64 - 2)) as u32
            }
        })
        .collect();
    // Every ggml type of TYPES, and compressed-tensors int4 and int8 in CT4 and CT8 blocks.
    let cases: Vec<ExpertType> = TYPES
        .iter()
        .map(|&t| ExpertType::Ggml(t))
        .chain([ExpertType::Ct4, ExpertType::Ct8])
        .collect();
    for (ty, tile) in cases.iter().flat_map(|&ty| {
        [
            (ty, GEMM_TILE_TOKENS),
            (ty, GEMM_TILE_TOKENS / 2),
            (ty, 2 * GEMM_TILE_TOKENS),
        ]
    }) {
        let (_gb, sorted, tiles, max_tiles) = group(&dev, &ids, n_experts, tile);
        let (h, i) = match ty {
            // Rows of four super-blocks, so gemm_rf.cu's Q6_K kernels take them too.
            ExpertType::Ggml(GgmlType::Q6K) => (1024usize, 1024usize),
            ExpertType::Ggml(GgmlType::Q4K | GgmlType::Q5K | GgmlType::IQ4XS)
            | ExpertType::Ct4
            | ExpertType::Ct8 => (512, 256),
            ExpertType::Ggml(_) => (288, 160),
        };
        let (wt, name) = match ty {
            ExpertType::Ggml(t) => (wtype(t).unwrap(), t.to_string()),
            ExpertType::Ct4 => (WType::Ct4, "ct4".to_string()),
            ExpertType::Ct8 => (WType::Ct8, "ct8".to_string()),
        };
        let silu = |z: f64| z / (1.0 + (-z).exp());
        let (g, u, d) = (
            expert_mats(&mut rng, ty, n_experts, i, h),
            expert_mats(&mut rng, ty, n_experts, i, h),
            expert_mats(&mut rng, ty, n_experts, h, i),
        );
        let (gr, ur, dr) = (&g.rows_f16, &u.rows_f16, &d.rows_f16);
        let x: Vec<f32> = (0..n * h).map(|_| rng.f()).collect();
        let a_in: Vec<f32> = (0..n * k * i).map(|_| rng.f()).collect();
        let (_g, gp) = upload(&dev, &g.bytes);
        let (_u, up) = upload(&dev, &u.bytes);
        let (_d, dp) = upload(&dev, &d.bytes);
        let (_x, xp) = to_f16_on_device(&dev, &x);
        let (_a, ap) = upload(&dev, &f16_bits(&a_in));
        let (row_g, row_d) = (g.row_bytes, d.row_bytes);
        let rf_cols = if ty != ExpertType::Ggml(GgmlType::Q6K)
            || (h.is_multiple_of(1024) && i.is_multiple_of(1024))
        {
            h
        } else {
            // A width gemm_rf does not take for Q6_K: gemm.cu's set alone.
            256
        };
        for (src, kern) in kernel_sets(&dev.arch, wt, rf_cols, tile) {
            // Fresh (zeroed) outputs per kernel set, so a set that skips an entry cannot pass on
            // the previous set's results.
            let act = dev.stream.alloc_zeros::<u16>(n * k * i).unwrap();
            let ys = dev.stream.alloc_zeros::<f32>(n * k * h).unwrap();
            dev.launch(
                kern.gate_up,
                (i.div_ceil(GEMM_TILE_ROWS / 2) as u32, max_tiles as u32),
                GEMM_THREADS,
                &[
                    Arg::P(gp),
                    Arg::P(up),
                    Arg::P(row_g * i as u64),
                    Arg::P(row_g),
                    Arg::P(xp),
                    Arg::P(sorted),
                    Arg::P(tiles),
                    Arg::P(act.device_ptr(&dev.stream).0),
                    Arg::I(i as i32),
                    Arg::I(h as i32),
                    Arg::I(k as i32),
                ],
            )
            .unwrap();
            dev.launch(
                kern.down,
                (h.div_ceil(GEMM_TILE_ROWS) as u32, max_tiles as u32),
                GEMM_THREADS,
                &[
                    Arg::P(dp),
                    Arg::P(row_d * h as u64),
                    Arg::P(row_d),
                    Arg::P(ap),
                    Arg::P(sorted),
                    Arg::P(tiles),
                    Arg::P(ys.device_ptr(&dev.stream).0),
                    Arg::I(h as i32),
                    Arg::I(i as i32),
                ],
            )
            .unwrap();
            let got_act: Vec<f32> = dev
                .stream
                .clone_dtoh(&act)
                .unwrap()
                .into_iter()
                .map(|b| half::f16::from_bits(b).to_f32())
                .collect();
            let got_ys = download(&dev, &ys);
            let mut want_act = vec![0.0f32; n * k * i];
            let mut want_ys = vec![0.0f32; n * k * h];
            for (p, &e) in ids.iter().enumerate() {
                let (e, xt) = (e as usize, &x[(p / k) * h..(p / k + 1) * h]);
                for r in 0..i {
                    // Stored in f16 for down: finite values beyond its range saturate.
                    let v = (silu(dot(&gr[e][r], xt)) * dot(&ur[e][r], xt)) as f32;
                    want_act[p * i + r] = v.clamp(-65504.0, 65504.0);
                }
                let at = &a_in[p * i..(p + 1) * i];
                for r in 0..h {
                    want_ys[p * h + r] = dot(&dr[e][r], at) as f32;
                }
            }
            let (ea, ed) = (max_rel(&got_act, &want_act), max_rel(&got_ys, &want_ys));
            println!(
                "{src} grouped {name} tile {tile}: gate/up+SwiGLU {ea:.2e}, down {ed:.2e} (max rel)"
            );
            assert!(
                ea < ACT_BOUND,
                "{src} gemm_gate_up {name} tile {tile}: {ea:.2e}"
            );
            assert!(ed < BOUND, "{src} gemm_down {name} tile {tile}: {ed:.2e}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn prefill_attention_matches_the_f32_kernel() {
    let dev = device();
    let mut rng = Rng(0x6e33_0003);
    let (hq, n_kv, d) = (6usize, 2usize, 128usize);
    // (window, cap, pos0, n): full attention from 0 and at depth; sliding windows smaller
    // and larger than a tile, with the ring wrapped (cap = window - 1 + ubatch).
    for (window, pos0, n) in [
        (0usize, 0usize, 150usize),
        (0, 77, 64),
        (40, 0, 150),
        (40, 300, 133),
        (200, 500, 70),
    ] {
        let cap = if window == 0 {
            pos0 + n
        } else {
            window - 1 + n
        };
        let row = n_kv * d;
        // Ring contents: any value at rows the step cannot see (they must not matter).
        let kc: Vec<f32> = (0..cap * row).map(|_| rng.f()).collect();
        let vc: Vec<f32> = (0..cap * row).map(|_| rng.f()).collect();
        let q: Vec<f32> = (0..n * hq * d).map(|_| 2.0 * rng.f()).collect();
        let params: Vec<u32> = [pos0 as u32, n as u32]
            .into_iter()
            .chain((0..n).map(|_| 0))
            .collect();
        let (_k, kp) = upload(&dev, &kc);
        let (_v, vp) = upload(&dev, &vc);
        let (_q, qp) = upload(&dev, &q);
        let (_p, pp) = upload(&dev, &params);
        let want = attention_f32(&dev, qp, kp, vp, cap, hq, n_kv, d, window, n, pp);
        // The kernel (f32 or f16 cache) on the rings at kp / vp; `epi`: the fused gate
        // (g, gcols) and f16 output pointer (0 / 0 / 0: none).
        let run_epi = |kernel: K, kp: u64, vp: u64, epi: (u64, usize, u64)| {
            let ob = dev.stream.alloc_zeros::<f32>(n * hq * d).unwrap();
            dev.launch(
                kernel,
                (hq as u32, n.div_ceil(64) as u32),
                128,
                &[
                    Arg::P(qp),
                    Arg::P(kp),
                    Arg::P(vp),
                    Arg::P(ob.device_ptr(&dev.stream).0),
                    Arg::I(cap as i32),
                    Arg::I(hq as i32),
                    Arg::I(n_kv as i32),
                    Arg::I(window as i32),
                    Arg::I(n as i32),
                    Arg::P(pp),
                    Arg::P(epi.0),
                    Arg::I(epi.1 as i32),
                    Arg::P(epi.2),
                ],
            )
            .unwrap();
            download(&dev, &ob)
        };
        let run = |kernel: K, kp: u64, vp: u64| run_epi(kernel, kp, vp, (0, 0, 0));
        let got = run(K::AttentionPrefill, kp, vp);
        let e = max_rel(&got, &want);
        println!("attention_prefill window {window} pos0 {pos0} n {n}: max rel err {e:.2e}");
        // f16 queries, keys, values and probabilities: ~1e-3 of the output scale.
        assert!(e < 4e-3, "window {window} pos0 {pos0} n {n}: {e:.2e}");
        // The same rings stored as an f16 cache (the session's KvCache::F16; round to nearest,
        // as the kernel rounds what it stages): bitwise the f32 cache's result.
        let h16 = |x: &[f32]| -> Vec<u16> {
            x.iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect()
        };
        let (_k16, kp16) = upload(&dev, &h16(&kc));
        let (_v16, vp16) = upload(&dev, &h16(&vc));
        let got16 = run(K::AttentionPrefillF16, kp16, vp16);
        assert!(
            same_bits(&got16, &got),
            "attention_prefill_f16 differs from the f32 cache's result (window {window} pos0 {pos0} n {n})"
        );
        // The rings as a bf16 cache (KvCache::Bf16; copied by cp.async, converted to f16 in
        // shared memory): bitwise the f32 kernel on the same rings rounded to bf16, which
        // converts the same values to f16 on the way in.
        let b16 = |x: &[f32]| -> Vec<u16> {
            x.iter()
                .map(|&v| half::bf16::from_f32(v).to_bits())
                .collect()
        };
        let rb = |x: &[f32]| -> Vec<f32> {
            x.iter()
                .map(|&v| half::bf16::from_f32(v).to_f32())
                .collect()
        };
        let (_kb, kpb) = upload(&dev, &b16(&kc));
        let (_vb, vpb) = upload(&dev, &b16(&vc));
        let (_kr, kpr) = upload(&dev, &rb(&kc));
        let (_vr, vpr) = upload(&dev, &rb(&vc));
        assert!(
            same_bits(
                &run(K::AttentionPrefillBf16, kpb, vpb),
                &run(K::AttentionPrefill, kpr, vpr)
            ),
            "attention_prefill_bf16 differs from the f32 kernel on bf16-rounded rings (window {window} pos0 {pos0} n {n})"
        );
        // The rings as a q8_0 cache (KvCache::Q8_0; quants and scales by cp.async, dequantised
        // into the f16 tile): bitwise the f32 kernel on the values the planes read back as.
        let (kq8, kback) = q8_plane(&kc);
        let (vq8, vback) = q8_plane(&vc);
        let (_kq, kq8p) = upload(&dev, &kq8);
        let (_vq, vq8p) = upload(&dev, &vq8);
        let (_kbk, kbackp) = upload(&dev, &kback);
        let (_vbk, vbackp) = upload(&dev, &vback);
        let q8_got = run(K::AttentionPrefillQ8_0, kq8p, vq8p);
        assert!(
            same_bits(&q8_got, &run(K::AttentionPrefill, kbackp, vbackp)),
            "attention_prefill_q8_0 differs from the f32 kernel on the rings it reads back as (window {window} pos0 {pos0} n {n})"
        );
        println!(
            "attention_prefill_q8_0 window {window} pos0 {pos0} n {n}: max rel err vs the unquantised rings {:.2e}",
            max_rel(&q8_got, &want)
        );
        // The fused epilogue (softplus gate per head and per element, f16 output): bitwise
        // gate_mul then to_f16 on the unfused output.
        for gcols in [hq, hq * d] {
            let g: Vec<f32> = (0..n * gcols).map(|_| 4.0 * rng.f()).collect();
            let (_g, gp) = upload(&dev, &g);
            let len = n * hq * d;
            let (_o, op) = upload(&dev, &got);
            let gated = dev.stream.alloc_zeros::<f32>(len).unwrap();
            let gated_p = gated.device_ptr(&dev.stream).0;
            let want_h = dev.stream.alloc_zeros::<u16>(len).unwrap();
            let got_h = dev.stream.alloc_zeros::<u16>(len).unwrap();
            let (want_hp, got_hp) = (
                want_h.device_ptr(&dev.stream).0,
                got_h.device_ptr(&dev.stream).0,
            );
            dev.launch(
                K::GateMul,
                (len.div_ceil(256) as u32, 1),
                256,
                &[
                    Arg::P(op),
                    Arg::P(gp),
                    Arg::P(gated_p),
                    Arg::I((hq * d) as i32),
                    Arg::I(gcols as i32),
                    Arg::P(len as u64),
                ],
            )
            .unwrap();
            dev.launch(
                K::ToF16,
                ((len / 4).div_ceil(256) as u32, 1),
                256,
                &[Arg::P(gated_p), Arg::P(want_hp), Arg::P((len / 4) as u64)],
            )
            .unwrap();
            for (kernel, kp, vp) in [
                (K::AttentionPrefill, kp, vp),
                (K::AttentionPrefillF16, kp16, vp16),
            ] {
                let untouched = run_epi(kernel, kp, vp, (gp, gcols, got_hp));
                let a = dev.stream.clone_dtoh(&want_h).unwrap();
                let b = dev.stream.clone_dtoh(&got_h).unwrap();
                dev.stream.synchronize().unwrap();
                assert!(
                    a == b,
                    "{} gate ({gcols} per token) + f16 epilogue differs from gate_mul + to_f16 (window {window} pos0 {pos0} n {n})",
                    kernel.name()
                );
                assert!(
                    untouched.iter().all(|&v| v == 0.0),
                    "f16 epilogue wrote the f32 output"
                );
            }
        }
    }
}

/// The products of a compressed-tensors matrix `m` repacked into the device's blocks
/// (`blocks`, `block_bytes` each, weight type `ty`) against the CPU's decoding of it, for
/// `n` random tokens: the exact f32 product (`matmul`, max rel 1e-5); `gemm.cu`'s
/// tensor-core products on 64- and 32-token tiles and, where `rf`, `gemm_rf.cu`'s on 64-
/// and 128-token tiles (the f16-rounded decoded weights, [`BOUND`]); and `gemm_h.cu`'s f16
/// copy of the matrix, every weight as the CPU decodes it rounded to f16.
fn check_ct_products(
    dev: &Device,
    rng: &mut Rng,
    m: &MatRef<'_>,
    blocks: &[u8],
    block_bytes: usize,
    ty: WType,
    rf: bool,
    n: usize,
    label: &str,
) {
    let (rows, cols) = (m.rows, m.cols);
    let row_bytes = (cols / 32 * block_bytes) as u64;
    let (_wb, wp) = upload(dev, blocks);
    let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
    // Exact: f32 weights as the CPU decodes them, f32 activations.
    let mut want = vec![0.0f32; n * rows];
    let mut scratch = vec![0.0; cols];
    lagoon_core::ops::matmul::matmul(m, &x, n, &mut want, &mut scratch);
    let (_xb, xp) = upload(dev, &x);
    let args = |xp: u64, op: u64| {
        [
            Arg::P(wp),
            Arg::P(row_bytes),
            Arg::P(xp),
            Arg::P(op),
            Arg::I(rows as i32),
            Arg::I(cols as i32),
            Arg::I(n as i32),
        ]
    };
    let ob = dev.stream.alloc_zeros::<f32>(n * rows).unwrap();
    dev.launch(
        ty.matmul(),
        (rows.div_ceil(4) as u32, n.div_ceil(8) as u32),
        128,
        &args(xp, ob.device_ptr(&dev.stream).0),
    )
    .unwrap();
    let e = max_rel(&download(dev, &ob), &want);
    println!("{label} matmul {rows}x{cols} n={n}: max rel err {e:.2e}");
    assert!(e < 1e-5, "{label} matmul: {e:.2e}");
    // Tensor cores: the f16-rounded decoded weights.
    let wr: Vec<Vec<f64>> = (0..rows).map(|r| row_f16(m, r)).collect();
    let want: Vec<f32> = (0..n)
        .flat_map(|t| {
            let xt = &x[t * cols..(t + 1) * cols];
            wr.iter().map(move |w| dot(w, xt) as f32)
        })
        .collect();
    let (_hb, hp) = to_f16_on_device(dev, &x);
    let mut sets: Vec<(&str, K, usize)> = [GEMM_TILE_TOKENS, 32]
        .into_iter()
        .map(|tile| ("gemm.cu", ty.gemm(tile).dense, tile))
        .collect();
    if rf {
        // CT8 has 64-token kernels only (its 128-tile set is the same kernels).
        let tiles: &[usize] = if ty == WType::Ct8 {
            &[GEMM_TILE_TOKENS]
        } else {
            &[GEMM_TILE_TOKENS, 2 * GEMM_TILE_TOKENS]
        };
        for &tile in tiles {
            let k = gemm_rf(ty, cols, tile).expect("gemm_rf takes these rows");
            sets.push(("gemm_rf.cu", k.dense, tile));
        }
    }
    for (src, kern, tile) in sets {
        let ob = dev.stream.alloc_zeros::<f32>(n * rows).unwrap();
        dev.launch(
            kern,
            (
                rows.div_ceil(GEMM_TILE_ROWS) as u32,
                n.div_ceil(tile) as u32,
            ),
            GEMM_THREADS,
            &args(hp, ob.device_ptr(&dev.stream).0),
        )
        .unwrap();
        let e = max_rel(&download(dev, &ob), &want);
        println!("{label} {src} tile {tile} {rows}x{cols} n={n}: max rel err {e:.2e}");
        assert!(e < BOUND, "{label} {src} tile {tile}: {e:.2e}");
    }
    // gemm_h.cu's decoder into an f16 copy of the matrix.
    let hb = dev.stream.alloc_zeros::<u16>(rows * cols).unwrap();
    dev.launch(
        ty.dequant_f16(),
        ((rows * cols / 32).div_ceil(256) as u32, 1),
        256,
        &[
            Arg::P(wp),
            Arg::P(row_bytes),
            Arg::P(hb.device_ptr(&dev.stream).0),
            Arg::I(rows as i32),
            Arg::I(cols as i32),
        ],
    )
    .unwrap();
    let h = dev.stream.clone_dtoh(&hb).unwrap();
    dev.stream.synchronize().unwrap();
    for (r, wrow) in wr.iter().enumerate() {
        for (c, &w) in wrow.iter().enumerate() {
            assert_eq!(
                half::f16::from_bits(h[r * cols + c]).to_f64(),
                w,
                "{label} f16 copy r{r} c{c}"
            );
        }
    }
}

/// Random 8-bit compressed-tensors matrices repacked into the device's CT8 blocks — W8A16
/// (pack-quantized 8-bit, group 64, packed zero points, f16 scales) and W8A8 (int-quantized
/// I8, channel scales, bf16; symmetric and with plain zero points) — against the CPU's
/// decoding (`check_ct_products`, `gemm_rf.cu`'s CT8 kernels of both scale dtypes included).
#[test]
#[ignore = "needs a CUDA device"]
fn ct8_blocks_decode_as_compressed_tensors() {
    use lagoon_core::quant::ct::{CtKind, CtMatrix, CtStrategy, PackOrder, ScaleDtype};
    let dev = device();
    let mut rng = Rng(0x6e33_0c78);
    let (rows, n, cols) = (GEMM_TILE_ROWS + 45, 77usize, 768usize);
    let i8ch = |symmetric| CtKind::Int8 {
        symmetric,
        strategy: CtStrategy::Channel,
    };
    for (kind, sd) in [
        (
            CtKind::packed_int(8, CtStrategy::Group(64), false, PackOrder::Dense),
            ScaleDtype::F16,
        ),
        (i8ch(true), ScaleDtype::Bf16),
        (i8ch(false), ScaleDtype::Bf16),
    ] {
        let (layout, [weight, scale, zero]) = common::random_ct(&mut rng, kind, rows, cols, sd);
        let m = MatRef {
            rows,
            cols,
            enc: Encoding::Ct(CtMatrix::new(layout, &weight, &scale, &zero).unwrap()),
        };
        let blocks = lagoon_cuda::weights::ct8_blocks(&m).expect("a CT8-repackable matrix");
        let bb = lagoon_cuda::weights::CT8_BLOCK_BYTES;
        let label = kind.to_string();
        check_ct_products(&dev, &mut rng, &m, &blocks, bb, WType::Ct8, true, n, &label);
    }
}

/// A random 4-bit compressed-tensors matrix (group 32, bf16 or f16 scales; asymmetric with
/// packed zero points when `asym`), repacked into the device's CT4 blocks, against the CPU's
/// decoding (`check_ct_products`, `gemm_rf.cu`'s CT4 kernels of both scale dtypes included).
#[test]
#[ignore = "needs a CUDA device"]
fn ct4_blocks_decode_as_compressed_tensors() {
    use lagoon_core::quant::ct::{CtMatrix, ScaleDtype};
    let dev = device();
    let mut rng = Rng(0x6e33_0005);
    let (rows, n) = (GEMM_TILE_ROWS + 45, 77usize);
    // 2304 columns: nine 256-column units, gemm_rf.cu's three-stage ring wrapped three times.
    for (asym, cols, sd) in [
        (false, 512usize, ScaleDtype::Bf16),
        (true, 512, ScaleDtype::Bf16),
        (false, 2304, ScaleDtype::Bf16),
        (true, 2304, ScaleDtype::Bf16),
        (false, 512, ScaleDtype::F16),
        (true, 2304, ScaleDtype::F16),
    ] {
        let (layout, [weight, scale, zero]) = common::random_ct4(&mut rng, rows, cols, asym, sd);
        let m = MatRef {
            rows,
            cols,
            enc: Encoding::Ct(CtMatrix::new(layout, &weight, &scale, &zero).unwrap()),
        };
        let blocks = lagoon_cuda::weights::ct4_blocks(&m).expect("a CT4-repackable matrix");
        let bb = lagoon_cuda::weights::CT4_BLOCK_BYTES;
        let label = format!("ct4 (asym {asym}, {sd:?} scales)");
        check_ct_products(&dev, &mut rng, &m, &blocks, bb, WType::Ct4, true, n, &label);
    }
}
