//! The sampler's draws follow the exactly computed filtered distribution (temperature,
//! min-p, top-k, top-p, penalties), checked with a chi-square test on a fixed seed; and the
//! test has the power to reject a distribution that is only slightly off.

use lagoon::sample::{Sampler, SamplerParams};

const VOCAB: usize = 48;
const DRAWS: usize = 200_000;
/// For the 1000-token vocabulary (cells of ~100 expected draws).
const LARGE_DRAWS: usize = 60_000;

/// Fixed pseudo-random logits in about [-4, 4] (a small LCG, independent of the sampler's).
fn logits() -> Vec<f32> {
    let mut s = 0x1234_5678u64;
    (0..VOCAB)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) as f64 / (1u64 << 31) as f64 * 8.0 - 4.0) as f32
        })
        .collect()
}

/// The distribution the parameters define, computed directly in f64 from the definitions
/// (not from the sampler's code): penalties, softmax at temperature, then min-p, top-k,
/// top-p each on what the previous left, renormalised.
fn exact(logits: &[f32], p: &SamplerParams, prompt: &[u32], output: &[u32]) -> Vec<f64> {
    let mut l: Vec<f64> = logits.iter().map(|&x| x as f64).collect();
    for (i, li) in l.iter_mut().enumerate() {
        let t = i as u32;
        let count = output.iter().filter(|&&o| o == t).count() as f64;
        if prompt.contains(&t) || count > 0.0 {
            let r = p.repetition_penalty as f64;
            *li = if *li > 0.0 { *li / r } else { *li * r };
        }
        if count > 0.0 {
            *li -= p.frequency_penalty as f64 * count + p.presence_penalty as f64;
        }
    }
    let t = p.temperature as f64;
    let max = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let mut prob: Vec<f64> = l.iter().map(|x| ((x - max) / t).exp()).collect();
    let norm = |v: &mut Vec<f64>| {
        let s: f64 = v.iter().sum();
        v.iter_mut().for_each(|x| *x /= s);
    };
    norm(&mut prob);
    let pmax = prob.iter().cloned().fold(0.0, f64::max);
    for x in prob.iter_mut() {
        if *x < p.min_p as f64 * pmax {
            *x = 0.0;
        }
    }
    let mut order: Vec<usize> = (0..prob.len()).collect();
    order.sort_by(|&a, &b| prob[b].total_cmp(&prob[a]).then(a.cmp(&b)));
    if p.top_k > 0 {
        for &i in &order[p.top_k.min(order.len())..] {
            prob[i] = 0.0;
        }
    }
    norm(&mut prob);
    if p.top_p < 1.0 {
        let mut acc = 0.0;
        let mut done = false;
        for &i in &order {
            if done {
                prob[i] = 0.0;
            } else {
                acc += prob[i];
                done = acc >= p.top_p as f64;
            }
        }
        norm(&mut prob);
    }
    prob
}

/// Chi-square statistic of `counts` against `probs` (cells with an expected count below 5
/// pooled into one) and its degrees of freedom. Panics if a zero-probability cell was drawn.
fn chi_square(counts: &[usize], probs: &[f64], n: usize) -> (f64, usize) {
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut pool_o, mut pool_e) = (0.0, 0.0);
    for (i, (&c, &p)) in counts.iter().zip(probs).enumerate() {
        if p == 0.0 {
            assert_eq!(c, 0, "token {i} has probability 0 but was drawn {c} times");
            continue;
        }
        let e = p * n as f64;
        if e < 5.0 {
            pool_o += c as f64;
            pool_e += e;
        } else {
            stat += (c as f64 - e).powi(2) / e;
            cells += 1;
        }
    }
    if pool_e > 0.0 {
        stat += (pool_o - pool_e).powi(2) / pool_e;
        cells += 1;
    }
    (stat, cells.saturating_sub(1))
}

/// Upper 1e-6 quantile of chi-square(df), Wilson-Hilferty approximation.
fn critical(df: usize) -> f64 {
    let d = df.max(1) as f64;
    let z = 4.753; // one-sided normal quantile for 1e-6
    d * (1.0 - 2.0 / (9.0 * d) + z * (2.0 / (9.0 * d)).sqrt()).powi(3)
}

fn draw(logits: &[f32], p: SamplerParams, prompt: &[u32], output: &[u32], seed: u64) -> Vec<usize> {
    draw_n(logits, p, prompt, output, seed, DRAWS)
}

fn draw_n(
    logits: &[f32],
    p: SamplerParams,
    prompt: &[u32],
    output: &[u32],
    seed: u64,
    draws: usize,
) -> Vec<usize> {
    let mut s = Sampler::new(logits.len(), p, seed).unwrap();
    s.reset(prompt, seed);
    for &t in output {
        s.accept(t);
    }
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..draws {
        counts[s.sample(logits) as usize] += 1;
    }
    counts
}

fn params(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplerParams {
    SamplerParams {
        temperature,
        top_k,
        top_p,
        min_p,
        ..Default::default()
    }
}

#[test]
fn draws_follow_the_filtered_distribution() {
    let l = logits();
    let pen = SamplerParams {
        temperature: 0.9,
        top_p: 0.95,
        repetition_penalty: 1.3,
        presence_penalty: 0.4,
        frequency_penalty: 0.2,
        ..Default::default()
    };
    let cases: [(&str, SamplerParams); 9] = [
        ("t1", params(1.0, 0, 1.0, 0.0)),
        ("t0.6", params(0.6, 0, 1.0, 0.0)),
        ("t1.5 k10", params(1.5, 10, 1.0, 0.0)),
        ("t1 p0.8", params(1.0, 0, 0.8, 0.0)),
        ("t0.7 p0.9", params(0.7, 0, 0.9, 0.0)),
        ("t1 minp0.05", params(1.0, 0, 1.0, 0.05)),
        ("t1.2 k20 p0.9 minp0.02", params(1.2, 20, 0.9, 0.02)),
        ("t0.8 k5 p0.7", params(0.8, 5, 0.7, 0.0)),
        ("penalties t0.9 p0.95", pen),
    ];
    let prompt = [3u32, 7, 7, 11, 40];
    let output = [7u32, 12, 12, 12, 30, 3];
    for (seed, (name, p)) in cases.iter().enumerate() {
        let (pr, out): (&[u32], &[u32]) = if p.repetition_penalty != 1.0 {
            (&prompt, &output)
        } else {
            (&[], &[])
        };
        let probs = exact(&l, p, pr, out);
        let support = probs.iter().filter(|&&x| x > 0.0).count();
        assert!(support > 1, "{name}: degenerate case");
        let counts = draw(&l, *p, pr, out, 100 + seed as u64);
        let (stat, df) = chi_square(&counts, &probs, DRAWS);
        assert!(
            stat < critical(df),
            "{name}: chi2 {stat:.1} with {df} dof exceeds {:.1}",
            critical(df)
        );
        // Total variation as a second, scale-free check.
        let tv: f64 = counts
            .iter()
            .zip(&probs)
            .map(|(&c, &q)| (c as f64 / DRAWS as f64 - q).abs())
            .sum::<f64>()
            / 2.0;
        assert!(tv < 0.01, "{name}: total variation {tv:.4}");
    }
}

#[test]
fn top_p_over_a_large_vocabulary_both_paths() {
    // 1000 tokens. Peaked: the heaviest 256 hold the mass, only they are sorted. Flat: they
    // do not, and all survivors are sorted.
    let n = 1000;
    let peaked: Vec<f32> = (0..n).map(|i| -0.05 * ((i * 37) % n) as f32).collect();
    let mut s = 0x9E37u64;
    let flat: Vec<f32> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) as f32
        })
        .collect();
    for (name, l, p) in [
        ("peaked p0.9", &peaked, params(1.0, 0, 0.9, 0.0)),
        ("flat p0.5", &flat, params(1.0, 0, 0.5, 0.0)),
        ("flat t0.5 k800 p0.7", &flat, params(0.5, 800, 0.7, 0.0)),
    ] {
        let probs = exact(l, &p, &[], &[]);
        let support = probs.iter().filter(|&&x| x > 0.0).count();
        let counts = draw_n(l, p, &[], &[], 77, LARGE_DRAWS);
        let (stat, df) = chi_square(&counts, &probs, LARGE_DRAWS);
        assert!(
            stat < critical(df),
            "{name} (support {support}): chi2 {stat:.1} with {df} dof exceeds {:.1}",
            critical(df)
        );
    }
    let support = |l: &[f32], p| exact(l, &p, &[], &[]).iter().filter(|&&x| x > 0.0).count();
    assert!(support(&peaked, params(1.0, 0, 0.9, 0.0)) < lagoon::sample::TOP_P_PRESELECT);
    assert!(support(&flat, params(1.0, 0, 0.5, 0.0)) > lagoon::sample::TOP_P_PRESELECT);
}

#[test]
fn the_test_rejects_slightly_wrong_distributions() {
    // Draws at temperature 1.0 against the distribution of 1.05; top-p 0.8 against 0.85.
    let l = logits();
    let counts = draw(&l, params(1.0, 0, 1.0, 0.0), &[], &[], 1);
    let (stat, df) = chi_square(
        &counts,
        &exact(&l, &params(1.05, 0, 1.0, 0.0), &[], &[]),
        DRAWS,
    );
    assert!(stat > critical(df), "temperature: chi2 {stat:.1} dof {df}");

    let counts = draw(&l, params(1.0, 0, 0.85, 0.0), &[], &[], 2);
    let probs = exact(&l, &params(1.0, 0, 0.8, 0.0), &[], &[]);
    let off_support = counts.iter().zip(&probs).any(|(&c, &q)| q == 0.0 && c > 0);
    assert!(
        off_support,
        "top-p 0.85 draws stayed inside the top-p 0.8 set"
    );
}

#[test]
fn greedy_applies_penalties_and_same_seed_repeats() {
    let l = logits();
    let best = lagoon::sample::argmax(&l);
    // A strong presence penalty on the best token moves greedy to the runner-up.
    let p = SamplerParams {
        presence_penalty: 100.0,
        ..Default::default()
    };
    let mut s = Sampler::new(VOCAB, p, 0).unwrap();
    assert_eq!(s.sample(&l), best);
    s.accept(best);
    let second = s.sample(&l);
    assert_ne!(second, best);
    let mut rest = l.clone();
    rest[best as usize] = f32::NEG_INFINITY;
    assert_eq!(second, lagoon::sample::argmax(&rest));

    let p = params(1.0, 0, 0.9, 0.0);
    let run = |seed| {
        let mut s = Sampler::new(VOCAB, p, seed).unwrap();
        (0..64).map(|_| s.sample(&l)).collect::<Vec<_>>()
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6));
}
