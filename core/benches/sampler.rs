//! Sampler cost per token on a Laguna-sized vocabulary (100,352 logits).
//!
//! `cargo bench -p lagoon-core --bench sampler`. The logits are a fixed pseudo-random draw
//! shaped like a trained model's (a few strong candidates over a Gaussian bulk), so the
//! filters keep realistic numbers of tokens.

use criterion::{Criterion, criterion_group, criterion_main};
use lagoon_core::sample::{Sampler, SamplerParams};
use std::hint::black_box;

const VOCAB: usize = 100_352;

fn logits() -> Vec<f32> {
    let mut s = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..VOCAB)
        .map(|i| {
            // Sum of three uniforms: a bell around 0 with sd ~2, plus a few peaks.
            let bulk = (next() + next() + next() - 1.5) * 4.0;
            if i % 9973 == 0 { bulk + 14.0 } else { bulk }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let l = logits();
    let cases: [(&str, SamplerParams); 5] = [
        ("greedy", SamplerParams::default()),
        (
            "temp0.8",
            SamplerParams {
                temperature: 0.8,
                ..SamplerParams::default()
            },
        ),
        (
            "temp0.8_topk40",
            SamplerParams {
                temperature: 0.8,
                top_k: 40,
                ..SamplerParams::default()
            },
        ),
        (
            "temp1_topp0.95",
            SamplerParams {
                temperature: 1.0,
                top_p: 0.95,
                ..SamplerParams::default()
            },
        ),
        (
            "temp0.7_minp0.05_rep1.1",
            SamplerParams {
                temperature: 0.7,
                min_p: 0.05,
                repetition_penalty: 1.1,
                ..SamplerParams::default()
            },
        ),
    ];
    let mut g = c.benchmark_group("sampler_100k");
    for (name, p) in cases {
        let mut s = Sampler::new(VOCAB, p, 1).expect("valid params");
        s.reset(&[2, 100, 200, 300], 1);
        g.bench_function(name, |b| b.iter(|| black_box(s.sample(black_box(&l)))));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
