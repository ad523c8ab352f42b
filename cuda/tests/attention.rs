//! The decode attention kernels (`#[ignore = "needs a CUDA device"]`; run on the GPU machine
//! with `.device/run-tests.sh`): `attention_decode` (one key per lane, the quantised decode
//! path's kernel), the generic `attention` and `flash.cu`'s `attention_decode_gqa`, for the
//! f32, f16 and bf16 KV caches, with and without split-K (then `attention_merge`), against
//! the f32 `attention` kernel on the same rings (itself checked against the CPU reference
//! through whole models). A 16-bit ring is compared with the f32 kernel on the same values
//! widened to f32, so (but for the tensor-core kernel's f16 operands) only the summation
//! order differs (~1e-6 of the output scale); a wrong row, head, window or split gives O(1).

use cudarc::driver::DevicePtr;
use lagoon_cuda::device::{Arg, Device};
use lagoon_cuda::manifest::K;

mod common;

use common::{Rng, attention_f32, device, download, max_rel, q8_plane, same_bits, upload};

/// Relative to the largest output: f32 sums over ≤ a few thousand keys.
const BOUND: f32 = 1e-5;

/// `attention_merge` of `split` > 1 partial states at `part` into `out` (one token, `hq`
/// heads of `d`); nothing for one split, whose kernel wrote `out` itself.
fn merge_splits(dev: &Device, part: u64, out: u64, hq: usize, d: usize, split: usize) {
    if split > 1 {
        dev.launch(
            K::AttentionMerge,
            (hq as u32, 1),
            128,
            &[
                Arg::P(part),
                Arg::P(out),
                Arg::I(hq as i32),
                Arg::I(d as i32),
                Arg::I(split as i32),
            ],
        )
        .unwrap();
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn decode_attention_matches_the_f32_kernel_for_every_cache() {
    let dev = device();
    let mut rng = Rng(0x6e33_0011);
    let (hq, n_kv) = (6usize, 2usize);
    // (head_dim, window, position): full attention at the start and at depth, sliding
    // windows before and after the ring (cap = window at one token per step) wraps; the
    // tiny fixtures' head_dim 16 and S 2.1's 128.
    for (d, window, pos) in [
        (128usize, 0usize, 0usize),
        (128, 0, 5),
        (128, 0, 1000),
        (128, 40, 10),
        (128, 40, 700),
        (16, 0, 3),
        (16, 0, 39),
        (16, 16, 39),
    ] {
        let row = n_kv * d;
        let cap = if window == 0 { pos + 1 } else { window };
        let kc: Vec<f32> = (0..cap * row).map(|_| rng.f()).collect();
        let vc: Vec<f32> = (0..cap * row).map(|_| rng.f()).collect();
        let q: Vec<f32> = (0..hq * d).map(|_| 2.0 * rng.f()).collect();
        let params: Vec<u32> = vec![pos as u32, 1, 0];
        let (_q, qp) = upload(&dev, &q);
        let (_p, pp) = upload(&dev, &params);
        // 0: f32, 1: f16, 2: bf16.
        for cache in 0..3 {
            // A 16-bit cache holds the values rounded to nearest (even); the reference reads
            // the same values as f32.
            let round = |x: &[f32]| -> Vec<f32> {
                x.iter()
                    .map(|&v| match cache {
                        1 => half::f16::from_f32(v).to_f32(),
                        2 => half::bf16::from_f32(v).to_f32(),
                        _ => v,
                    })
                    .collect()
            };
            let (kr, vr) = (round(&kc), round(&vc));
            let (_kr, krp) = upload(&dev, &kr);
            let (_vr, vrp) = upload(&dev, &vr);
            let want = attention_f32(&dev, qp, krp, vrp, cap, hq, n_kv, d, window, 1, pp);
            let bits = |x: &[f32]| -> Vec<u16> {
                x.iter()
                    .map(|&v| {
                        if cache == 2 {
                            half::bf16::from_f32(v).to_bits()
                        } else {
                            half::f16::from_f32(v).to_bits()
                        }
                    })
                    .collect()
            };
            let (_k16, k16p) = upload(&dev, &bits(&kc));
            let (_v16, v16p) = upload(&dev, &bits(&vc));
            let (kp, vp) = if cache > 0 { (k16p, v16p) } else { (krp, vrp) };
            let (decode, generic) = match cache {
                1 => (K::AttentionDecodeF16, K::AttentionF16),
                2 => (K::AttentionDecodeBf16, K::AttentionBf16),
                _ => (K::AttentionDecode, K::Attention),
            };
            for split in [1usize, 3, 8] {
                let part = dev.stream.alloc_zeros::<f32>(hq * split * (d + 2)).unwrap();
                let partp = part.device_ptr(&dev.stream).0;
                for (kernel, fused_gate) in [(decode, true), (generic, false)] {
                    let ob = dev.stream.alloc_zeros::<f32>(hq * d).unwrap();
                    let op = ob.device_ptr(&dev.stream).0;
                    let mut args = vec![
                        Arg::P(qp),
                        Arg::P(kp),
                        Arg::P(vp),
                        Arg::P(op),
                        Arg::P(partp),
                        Arg::I(cap as i32),
                        Arg::I(hq as i32),
                        Arg::I(n_kv as i32),
                        Arg::I(d as i32),
                        Arg::I(window as i32),
                        Arg::P(pp),
                    ];
                    if fused_gate {
                        // No gate.
                        args.extend([Arg::P(0), Arg::I(0)]);
                    }
                    dev.launch3(kernel, (hq as u32, 1, split as u32), 128, &args)
                        .unwrap();
                    merge_splits(&dev, partp, op, hq, d, split);
                    let got = download(&dev, &ob);
                    let e = max_rel(&got, &want);
                    println!(
                        "{kernel:?} d {d} window {window} pos {pos} split {split}: max rel err {e:.2e}"
                    );
                    assert!(
                        e < BOUND,
                        "{kernel:?} d {d} window {window} pos {pos} split {split}: {e:.2e}"
                    );
                }
            }
        }
    }
}

/// `flash.cu`'s `attention_decode_gqa` (tensor cores, one block per KV head and split, the
/// group's query heads as the rows of one tile) against the f32 `attention` kernel on the
/// same rings, for the f32, f16, bf16 and q8_0 caches: groups of 3, 6, 9 (S 2.1's full and sliding
/// layers) and 16 query heads; full layers at the start, inside the first tile, across
/// partial tiles and at depth; sliding windows narrower than a tile and S 2.1's 512 with a
/// wrapped ring; one split (with and without the per-head softplus gate) and 3, 8 and 32
/// (merged by `attention_merge`; 32 splits of a short context leave some empty). Queries,
/// keys, values and P are f16 in the kernel, so the bound is the tensor-core prefill's.
#[test]
#[ignore = "needs a CUDA device"]
fn gqa_decode_attention_matches_the_f32_kernel() {
    let dev = device();
    let mut rng = Rng(0x6e33_0a71);
    let d = 128usize;
    for (hq, n_kv, window, pos) in [
        (6usize, 2usize, 0usize, 0usize),
        (6, 2, 0, 37),
        (48, 8, 0, 200),
        (48, 8, 0, 3000),
        (72, 8, 40, 10),
        (72, 8, 40, 300),
        (72, 8, 512, 2000),
        (16, 1, 0, 129),
    ] {
        let row = n_kv * d;
        let cap = if window == 0 { pos + 1 } else { window };
        // bf16-exact values (so f16-exact too), so the three caches hold the same numbers as
        // the reference's rings.
        let r16 = |v: f32| half::bf16::from_f32(v).to_f32();
        let kc: Vec<f32> = (0..cap * row).map(|_| r16(rng.f())).collect();
        let vc: Vec<f32> = (0..cap * row).map(|_| r16(rng.f())).collect();
        let q: Vec<f32> = (0..hq * d).map(|_| 2.0 * rng.f()).collect();
        let gate: Vec<f32> = (0..hq).map(|_| 3.0 * rng.f()).collect();
        let params: Vec<u32> = vec![pos as u32, 1, 0];
        let (_q, qp) = upload(&dev, &q);
        let (_g, gp) = upload(&dev, &gate);
        let (_p, pp) = upload(&dev, &params);
        let (_k, kp) = upload(&dev, &kc);
        let (_v, vp) = upload(&dev, &vc);
        let bits = |x: &[f32]| -> Vec<u16> {
            x.iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect()
        };
        let (_k16, k16p) = upload(&dev, &bits(&kc));
        let (_v16, v16p) = upload(&dev, &bits(&vc));
        let bbits = |x: &[f32]| -> Vec<u16> {
            x.iter()
                .map(|&v| half::bf16::from_f32(v).to_bits())
                .collect()
        };
        let (_kb, kbp) = upload(&dev, &bbits(&kc));
        let (_vb, vbp) = upload(&dev, &bbits(&vc));
        // The q8_0 cache of the same rings, and the values it reads back as (f32 rings).
        let (kq8, kback) = q8_plane(&kc);
        let (vq8, vback) = q8_plane(&vc);
        let (_kq, kq8p) = upload(&dev, &kq8);
        let (_vq, vq8p) = upload(&dev, &vq8);
        let (_kbk, kbackp) = upload(&dev, &kback);
        let (_vbk, vbackp) = upload(&dev, &vback);
        let softplus = |x: f32| if x > 20.0 { x } else { x.exp().ln_1p() };
        let gated = |w: &[f32]| -> Vec<f32> {
            w.iter()
                .enumerate()
                .map(|(i, &v)| v * softplus(gate[i / d]))
                .collect()
        };
        let want = attention_f32(&dev, qp, kp, vp, cap, hq, n_kv, d, window, 1, pp);
        let want_gated = gated(&want);
        let want_q8 = attention_f32(&dev, qp, kbackp, vbackp, cap, hq, n_kv, d, window, 1, pp);
        let want_q8_gated = gated(&want_q8);
        // The three 16/32-bit caches hold the same (bf16-exact) values and every kernel stages
        // them as the same f16, so their outputs must agree bitwise: the f32 cache's per
        // split. The q8_0 cache's must be the f32 kernel's on the rings it reads back as.
        let mut first: Vec<Vec<f32>> = Vec::new();
        let mut first_q8: Vec<Vec<f32>> = Vec::new();
        for (ki, (kernel, kp, vp)) in [
            (K::AttentionDecodeGqa, kp, vp),
            (K::AttentionDecodeGqaF16, k16p, v16p),
            (K::AttentionDecodeGqaBf16, kbp, vbp),
            (K::AttentionDecodeGqa, kbackp, vbackp),
            (K::AttentionDecodeGqaQ8_0, kq8p, vq8p),
        ]
        .into_iter()
        .enumerate()
        {
            let q8 = ki >= 3;
            let (want, want_gated) = if q8 {
                (&want_q8, &want_q8_gated)
            } else {
                (&want, &want_gated)
            };
            // early: the position and the gate read before the kernel's wait (the same
            // values here, launched without programmatic launch).
            for (si, (split, gated, early)) in [
                (1usize, false, 0),
                (1, true, 0),
                (1, true, 1),
                (3, false, 1),
                (8, false, 0),
                (32, false, 1),
            ]
            .into_iter()
            .enumerate()
            {
                let part = dev.stream.alloc_zeros::<f32>(hq * split * (d + 2)).unwrap();
                let partp = part.device_ptr(&dev.stream).0;
                let ob = dev.stream.alloc_zeros::<f32>(hq * d).unwrap();
                let op = ob.device_ptr(&dev.stream).0;
                let args = [
                    Arg::P(qp),
                    Arg::P(kp),
                    Arg::P(vp),
                    Arg::P(op),
                    Arg::P(partp),
                    Arg::I(cap as i32),
                    Arg::I(hq as i32),
                    Arg::I(n_kv as i32),
                    Arg::I(d as i32),
                    Arg::I(window as i32),
                    Arg::P(pp),
                    Arg::P(if gated { gp } else { 0 }),
                    Arg::I(if gated { hq as i32 } else { 0 }),
                    Arg::I(early),
                ];
                dev.launch3(kernel, (n_kv as u32, 1, split as u32), 128, &args)
                    .unwrap();
                merge_splits(&dev, partp, op, hq, d, split);
                let got = download(&dev, &ob);
                let e = max_rel(&got, if gated { want_gated } else { want });
                println!(
                    "{kernel:?} hq {hq} n_kv {n_kv} window {window} pos {pos} split {split} gate {gated}: max rel err {e:.2e}"
                );
                assert!(
                    e < 4e-3,
                    "{kernel:?} hq {hq} n_kv {n_kv} window {window} pos {pos} split {split} gate {gated}: {e:.2e}"
                );
                match ki {
                    0 => first.push(got),
                    3 => first_q8.push(got),
                    _ => assert!(
                        same_bits(&got, if q8 { &first_q8[si] } else { &first[si] }),
                        "{kernel:?} hq {hq} n_kv {n_kv} window {window} pos {pos} split {split}: not the f32 kernel's bits on the same values"
                    ),
                }
            }
        }
    }
}

/// The split-K merge with the output gate and the O projection's quantiser fused
/// (`attention_merge_gate_q8_K` / `_q8_0`): bitwise `attention_merge_gate` then
/// `quantize_q8_K` / `quantize_q8_0`, the f32 output and every byte of the quantised row,
/// for head_dims 128 (S 2.1: two heads per Q8_K block) and 16 (the tiny fixtures), per-head
/// and per-element gates, splits with no visible key (max -inf).
#[test]
#[ignore = "needs a CUDA device"]
fn merge_gate_quantise_equals_the_unfused_kernels() {
    use lagoon_cuda::manifest::{ActQ, MERGE_QUANT_THREADS};
    let dev = device();
    let mut rng = Rng(0x6e33_0012);
    for (fmt, d, hq) in [
        (ActQ::Q8K, 128usize, 72usize),
        (ActQ::Q8_0, 128, 6),
        (ActQ::Q8K, 16, 32),
        (ActQ::Q8_0, 16, 6),
    ] {
        let heads = fmt.merge_heads(d).unwrap();
        let cols = hq * d;
        for (n_split, gcols) in [(16usize, hq), (3, cols)] {
            // Split states: unnormalised sums, max and sum of exponentials; some splits see
            // no key.
            let mut part = Vec::with_capacity(hq * n_split * (d + 2));
            for _ in 0..hq * n_split {
                part.extend((0..d).map(|_| 3.0 * rng.f()));
                let empty = rng.next().is_multiple_of(5);
                part.push(if empty {
                    f32::NEG_INFINITY
                } else {
                    4.0 * rng.f()
                });
                part.push(if empty {
                    0.0
                } else {
                    1.0 + rng.f().abs() * 30.0
                });
            }
            // Keep at least split 0 of every head visible.
            for h in 0..hq {
                let i = h * n_split * (d + 2);
                part[i + d] = rng.f();
                part[i + d + 1] = 2.0;
            }
            let g: Vec<f32> = (0..gcols).map(|_| 3.0 * rng.f()).collect();
            let (_p, pp) = upload(&dev, &part);
            let (_g, gp) = upload(&dev, &g);
            let stride = fmt.row_stride(cols);
            let out_ref = dev.stream.alloc_zeros::<f32>(cols).unwrap();
            let out_new = dev.stream.alloc_zeros::<f32>(cols).unwrap();
            let q_ref = dev.stream.alloc_zeros::<u8>(stride).unwrap();
            let q_new = dev.stream.alloc_zeros::<u8>(stride).unwrap();
            let ptr = |b: &cudarc::driver::CudaSlice<f32>| b.device_ptr(&dev.stream).0;
            let ptr8 = |b: &cudarc::driver::CudaSlice<u8>| b.device_ptr(&dev.stream).0;
            dev.launch(
                K::AttentionMergeGate,
                (hq as u32, 1),
                128,
                &[
                    Arg::P(pp),
                    Arg::P(gp),
                    Arg::P(ptr(&out_ref)),
                    Arg::I(hq as i32),
                    Arg::I(d as i32),
                    Arg::I(n_split as i32),
                    Arg::I(gcols as i32),
                ],
            )
            .unwrap();
            dev.quantize_act(fmt, ptr(&out_ref), ptr8(&q_ref), cols, stride, 1)
                .unwrap();
            dev.launch(
                fmt.merge_gate_kernel(),
                ((hq / heads) as u32, 1),
                MERGE_QUANT_THREADS,
                &[
                    Arg::P(pp),
                    Arg::P(gp),
                    Arg::P(ptr(&out_new)),
                    Arg::P(ptr8(&q_new)),
                    Arg::I(hq as i32),
                    Arg::I(d as i32),
                    Arg::I(n_split as i32),
                    Arg::I(gcols as i32),
                    Arg::I(heads as i32),
                ],
            )
            .unwrap();
            let (a, b) = (download(&dev, &out_ref), download(&dev, &out_new));
            let qa: Vec<u8> = dev.stream.clone_dtoh(&q_ref).unwrap();
            let qb: Vec<u8> = dev.stream.clone_dtoh(&q_new).unwrap();
            dev.stream.synchronize().unwrap();
            println!(
                "merge+gate+quantise {fmt:?} d {d} hq {hq} splits {n_split} gcols {gcols}: {} heads per block",
                heads
            );
            assert!(same_bits(&a, &b), "{fmt:?} d {d}: merged output differs");
            assert!(qa == qb, "{fmt:?} d {d}: quantised row differs");
        }
    }
}

/// The q8_0 cache's writers (`kv_store_q8_0`; `qk_norm_rope_store_q8_0`, the decode and
/// prefill steps' fused QK-norm, RoPE and store) write exactly the planes ggml's Q8_0
/// quantiser makes of what the f32 writers write: every quant and scale byte, rows wrapped
/// around the ring, rows not written left alone; the fused kernel's rotated queries are the
/// f32 kernel's bits.
#[test]
#[ignore = "needs a CUDA device"]
fn q8_0_cache_writers_store_ggml_blocks() {
    let dev = device();
    let mut rng = Rng(0x6e33_0c08);
    let (hq, n_kv, d, cap, pos0, n) = (6usize, 2usize, 128usize, 7usize, 4usize, 5usize);
    let row = n_kv * d;
    let plane_len = cap * row + cap * row / 32 * 2;
    let params: Vec<u32> = [pos0 as u32, n as u32]
        .into_iter()
        .chain((0..n).map(|_| 0))
        .collect();
    let (_p, pp) = upload(&dev, &params);
    // Planes start as random bytes; the rows a step does not write must keep them.
    let junk: Vec<u8> = (0..plane_len).map(|_| rng.byte()).collect();
    let fresh = |v: &[u8]| {
        let b = dev.stream.clone_htod(v).unwrap();
        let p = b.device_ptr(&dev.stream).0;
        (b, p)
    };
    let read = |b: &cudarc::driver::CudaSlice<u8>| {
        let v = dev.stream.clone_dtoh(b).unwrap();
        dev.stream.synchronize().unwrap();
        v
    };
    // The planes a q8_0 writer must leave: `ring` (cap x row f32, rows `written` set)
    // quantised, other rows' bytes (quants and scales) as they were.
    let expect = |ring: &[f32], written: &[usize]| -> Vec<u8> {
        let (q, _) = q8_plane(ring);
        let mut want = junk.clone();
        for &r in written {
            want[r * row..(r + 1) * row].copy_from_slice(&q[r * row..(r + 1) * row]);
            let (s0, s1) = (cap * row + r * row / 16, cap * row + (r + 1) * row / 16);
            want[s0..s1].copy_from_slice(&q[s0..s1]);
        }
        want
    };
    let written: Vec<usize> = (0..n).map(|t| (pos0 + t) % cap).collect();

    // kv_store_q8_0: the step's K and V rows, one block per 32 values. Values spread over
    // magnitudes, one block all zeros, one of ties.
    let mut k: Vec<f32> = (0..n * row).map(|_| 4.0 * rng.f()).collect();
    let v: Vec<f32> = (0..n * row).map(|_| rng.f() * rng.f()).collect();
    k[32..64].fill(0.0);
    // amax 127: d = 1, and every other value of the block is a tie (j - 15.5).
    for (j, x) in k[64..96].iter_mut().enumerate() {
        *x = j as f32 - 15.5;
    }
    k[64] = 127.0;
    let (_k, kp) = upload(&dev, &k);
    let (_v, vp) = upload(&dev, &v);
    let (kcb, kcp) = fresh(&junk);
    let (vcb, vcp) = fresh(&junk);
    dev.launch(
        K::KvStoreQ8_0,
        ((n * row).div_ceil(256) as u32, 1),
        256,
        &[
            Arg::P(kp),
            Arg::P(vp),
            Arg::P(kcp),
            Arg::P(vcp),
            Arg::I(cap as i32),
            Arg::I(row as i32),
            Arg::I(n as i32),
            Arg::P(pp),
        ],
    )
    .unwrap();
    let ring_of = |x: &[f32]| {
        let mut ring = vec![0.0f32; cap * row];
        for t in 0..n {
            let r = (pos0 + t) % cap;
            ring[r * row..(r + 1) * row].copy_from_slice(&x[t * row..(t + 1) * row]);
        }
        ring
    };
    assert!(
        read(&kcb) == expect(&ring_of(&k), &written),
        "kv_store_q8_0: K plane"
    );
    assert!(
        read(&vcb) == expect(&ring_of(&v), &written),
        "kv_store_q8_0: V plane"
    );

    // qk_norm_rope_store_q8_0 against qk_norm_rope_store (f32 rings): partial RoPE (rd 64).
    let q: Vec<f32> = (0..n * hq * d).map(|_| rng.f()).collect();
    let qw: Vec<f32> = (0..d).map(|_| 1.0 + 0.5 * rng.f()).collect();
    let kw: Vec<f32> = (0..d).map(|_| 1.0 + 0.5 * rng.f()).collect();
    let rd = 64usize;
    let freq: Vec<f32> = (0..rd / 2)
        .map(|i| 10000f32.powf(-2.0 * i as f32 / rd as f32))
        .collect();
    let (_q, qp) = upload(&dev, &q);
    let (_qw, qwp) = upload(&dev, &qw);
    let (_kw, kwp) = upload(&dev, &kw);
    let (_f, fp) = upload(&dev, &freq);
    let run = |kernel: K, kc: u64, vc: u64| {
        let qo = dev.stream.alloc_zeros::<f32>(n * hq * d).unwrap();
        dev.launch(
            kernel,
            ((hq + n_kv).div_ceil(4) as u32, n as u32),
            128,
            &[
                Arg::P(qp),
                Arg::P(kp),
                Arg::P(vp),
                Arg::P(qwp),
                Arg::P(kwp),
                Arg::P(qo.device_ptr(&dev.stream).0),
                Arg::P(kc),
                Arg::P(vc),
                Arg::I(cap as i32),
                Arg::P(fp),
                Arg::F(1.0),
                Arg::I(rd as i32),
                Arg::I(d as i32),
                Arg::I(hq as i32),
                Arg::I(n_kv as i32),
                Arg::F(1e-6),
                Arg::P(pp),
            ],
        )
        .unwrap();
        download(&dev, &qo)
    };
    let kf = dev.stream.alloc_zeros::<f32>(cap * row).unwrap();
    let vf = dev.stream.alloc_zeros::<f32>(cap * row).unwrap();
    let q_f32 = run(
        K::QkNormRopeStore,
        kf.device_ptr(&dev.stream).0,
        vf.device_ptr(&dev.stream).0,
    );
    let (kcb, kcp) = fresh(&junk);
    let (vcb, vcp) = fresh(&junk);
    let q_q8 = run(K::QkNormRopeStoreQ8_0, kcp, vcp);
    assert!(same_bits(&q_q8, &q_f32), "rotated queries differ");
    assert!(
        read(&kcb) == expect(&download(&dev, &kf), &written),
        "qk_norm_rope_store_q8_0: K plane"
    );
    assert!(
        read(&vcb) == expect(&download(&dev, &vf), &written),
        "qk_norm_rope_store_q8_0: V plane"
    );
}
