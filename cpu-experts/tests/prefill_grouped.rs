//! The expert layer groups a prefill step's tokens by expert and runs the several-token
//! kernels on each expert's tokens. Its result must be bit-identical to running each token
//! alone (the decode path), for ragged expert loads (experts with 0, 1, 2, 3, 4, 5 and 7
//! tokens) and for any thread count.

mod common;

use lagoon_core::dtype::GgmlType;
use lagoon_core::weights::{Encoding, MatRef};
use lagoon_cpu::exec::experts::{ExpertMats, routed_experts};
use lagoon_cpu::kernels::Kernels;
use lagoon_cpu::{Session, SessionOptions};

/// xorshift64: a deterministic byte and float source.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn byte(&mut self) -> u8 {
        (self.next() >> 32) as u8
    }
    /// Uniform in [-1, 1).
    fn f(&mut self) -> f32 {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) as f32 * 2.0 - 1.0
    }
}

/// f16 bits of 2⁻⁷ and 2⁻⁸ (exact, finite block scales).
const F16_2M7: [u8; 2] = 0x2000u16.to_le_bytes();
const F16_2M8: [u8; 2] = 0x1C00u16.to_le_bytes();

/// Random blocks of `ty` for a `rows × cols` matrix, with finite scales.
fn quant_bytes(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rows {
        match ty {
            GgmlType::F32 => {
                for _ in 0..cols {
                    out.extend_from_slice(&(0.2 * rng.f()).to_le_bytes());
                }
            }
            GgmlType::Q8_0 => {
                for _ in 0..cols / 32 {
                    out.extend_from_slice(&F16_2M7);
                    out.extend((0..32).map(|_| rng.byte()));
                }
            }
            GgmlType::Q4K => {
                for _ in 0..cols / 256 {
                    out.extend_from_slice(&F16_2M7);
                    out.extend_from_slice(&F16_2M8);
                    out.extend((0..12 + 128).map(|_| rng.byte()));
                }
            }
            GgmlType::Q6K => {
                for _ in 0..cols / 256 {
                    out.extend((0..128 + 64).map(|_| rng.byte()));
                    out.extend((0..16).map(|_| rng.byte() & 0x3F));
                    out.extend_from_slice(&F16_2M8);
                }
            }
            _ => unreachable!("no generator for {ty:?}"),
        }
    }
    out
}

/// One layer of `e` experts: gate/up `i × h` of `gu`, down `h × i` of `dn`.
struct Layer {
    gate: Vec<Vec<u8>>,
    up: Vec<Vec<u8>>,
    down: Vec<Vec<u8>>,
    gu: GgmlType,
    dn: GgmlType,
    h: usize,
    i: usize,
}

impl Layer {
    fn new(gu: GgmlType, dn: GgmlType, h: usize, i: usize, e: usize, seed: u64) -> Layer {
        let mut rng = Rng(seed);
        let mut mk = |ty, r, c| (0..e).map(|_| quant_bytes(ty, r, c, &mut rng)).collect();
        Layer {
            gate: mk(gu, i, h),
            up: mk(gu, i, h),
            down: mk(dn, h, i),
            gu,
            dn,
            h,
            i,
        }
    }

    fn mats(&self) -> [Vec<MatRef<'_>>; 3] {
        [
            mats(&self.gate, self.gu, self.i, self.h),
            mats(&self.up, self.gu, self.i, self.h),
            mats(&self.down, self.dn, self.h, self.i),
        ]
    }
}

fn mats(bufs: &[Vec<u8>], ty: GgmlType, rows: usize, cols: usize) -> Vec<MatRef<'_>> {
    bufs.iter()
        .map(|b| MatRef {
            rows,
            cols,
            enc: Encoding::Ggml { ty, data: b },
        })
        .collect()
}

const K: usize = 2;
const N: usize = 12;
const E: usize = 8;
const SCALING: f32 = 2.5;

/// Expert ids per token (two distinct per token, slot order mixed): expert 0 gets no
/// token, 1 one, 6 and 7 two, 2 three, 4 four, 5 five, 3 seven.
const IDS: [[u32; K]; N] = [
    [3, 4],
    [4, 3],
    [3, 4],
    [3, 4],
    [3, 2],
    [2, 3],
    [3, 2],
    [5, 6],
    [6, 5],
    [5, 7],
    [5, 7],
    [1, 5],
];

fn inputs(h: usize) -> (Vec<f32>, Vec<u32>, Vec<f32>) {
    let mut rng = Rng(0x5EED);
    let xs = (0..N * h).map(|_| rng.f()).collect();
    let ids = IDS.iter().flatten().copied().collect();
    let ws = (0..N * K).map(|_| 0.25 + 0.5 * (rng.f() + 1.0)).collect();
    (xs, ids, ws)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every token alone (the decode path), one thread.
fn per_token(
    k: Option<Kernels>,
    mats: ExpertMats<'_>,
    xs: &[f32],
    ids: &[u32],
    ws: &[f32],
) -> Vec<f32> {
    let h = mats.gate[0].cols;
    let mut out = Vec::new();
    for t in 0..N {
        out.extend(routed_experts(
            k.clone(),
            1,
            mats,
            &xs[t * h..(t + 1) * h],
            &ids[t * K..(t + 1) * K],
            &ws[t * K..(t + 1) * K],
            K,
            SCALING,
            1,
        ));
    }
    out
}

fn check(layer: &Layer, kernels: Option<Kernels>) {
    let [g, u, d] = layer.mats();
    let mats = ExpertMats {
        gate: &g,
        up: &u,
        down: &d,
    };
    let (xs, ids, ws) = inputs(layer.h);
    let alone = per_token(kernels.clone(), mats, &xs, &ids, &ws);
    assert!(alone.iter().all(|v| v.is_finite()));
    assert!(alone.iter().any(|&v| v != 0.0));
    for threads in [1, 2, 3] {
        let grouped = routed_experts(
            kernels.clone(),
            threads,
            mats,
            &xs,
            &ids,
            &ws,
            K,
            SCALING,
            N,
        );
        assert_eq!(
            bits(&grouped),
            bits(&alone),
            "{:?}/{:?} {}: grouped prefill with {threads} threads differs from per-token",
            layer.gu,
            layer.dn,
            kernels.as_ref().map_or("reference", |k| k.name()),
        );
    }
    // The test can fail: another routing weight changes the result.
    let mut ws2 = ws.clone();
    ws2[5] *= 1.5;
    let moved = routed_experts(kernels, 2, mats, &xs, &ids, &ws2, K, SCALING, N);
    assert_ne!(bits(&moved), bits(&alone));
}

/// Relative L2 distance.
fn rel(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

#[test]
fn grouped_equals_per_token_q4k_gate_up_q8_0_down() {
    let layer = Layer::new(GgmlType::Q4K, GgmlType::Q8_0, 256, 64, E, 1);
    check(&layer, Some(Kernels::detect()));
    check(&layer, Some(Kernels::scalar()));
}

#[test]
fn grouped_equals_per_token_q8_0_gate_up_q6k_down() {
    let layer = Layer::new(GgmlType::Q8_0, GgmlType::Q6K, 64, 256, E, 2);
    check(&layer, Some(Kernels::detect()));
    check(&layer, Some(Kernels::scalar()));
}

#[test]
fn grouped_equals_per_token_f32_and_reference() {
    let layer = Layer::new(GgmlType::F32, GgmlType::F32, 48, 40, E, 3);
    check(&layer, Some(Kernels::detect()));
    check(&layer, None);
}

#[test]
fn fast_path_is_close_to_the_reference() {
    // Quantised activations move the result a little, never a lot.
    for layer in [
        Layer::new(GgmlType::Q4K, GgmlType::Q8_0, 256, 64, E, 4),
        Layer::new(GgmlType::Q8_0, GgmlType::Q6K, 64, 256, E, 5),
    ] {
        let [g, u, d] = layer.mats();
        let mats = ExpertMats {
            gate: &g,
            up: &u,
            down: &d,
        };
        let (xs, ids, ws) = inputs(layer.h);
        let fast = routed_experts(
            Some(Kernels::detect()),
            2,
            mats,
            &xs,
            &ids,
            &ws,
            K,
            SCALING,
            N,
        );
        let reference = routed_experts(None, 2, mats, &xs, &ids, &ws, K, SCALING, N);
        let e = rel(&fast, &reference);
        assert!(e < 0.03, "{:?}/{:?}: rel L2 {e}", layer.gu, layer.dn);
    }
}

/// A whole prefill step gives the same logits, bit for bit, on 1, 2 and 3 threads.
#[test]
fn prefill_is_identical_across_thread_counts() {
    let c = common::config();
    let store = common::Store::new(&c, Some(2));
    let w = store.weights(&c);
    let toks: Vec<u32> = (0..19)
        .map(|i| (i * 29 + 7) % c.vocab_size as u32)
        .collect();
    let run = |threads, reference| {
        let mut s = Session::new(
            &c,
            &w,
            SessionOptions {
                n_ctx: 32,
                ubatch: 19,
                all_logits: true,
                n_threads: threads,
                reference,
                repack: None,
            },
        );
        let mut out = Vec::new();
        s.prefill(&toks, |l| out.extend_from_slice(l)).unwrap();
        out
    };
    for reference in [false, true] {
        let one = run(1, reference);
        assert!(one.iter().all(|v| v.is_finite()));
        for threads in [2, 3] {
            assert_eq!(
                bits(&run(threads, reference)),
                bits(&one),
                "{threads} threads"
            );
        }
    }
}
