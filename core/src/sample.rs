//! Token samplers: greedy, temperature, top-k, top-p, seeded. The caller owns the scratch
//! buffer, so sampling allocates nothing.

/// A small, seedable generator (xorshift64*): same seed, same tokens.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15 | 1)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (x >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Sampling parameters. `temperature <= 0` means greedy.
#[derive(Clone, Copy, Debug)]
pub struct SamplerParams {
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1.0 = off.
    pub top_p: f32,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
        }
    }
}

/// Index of the largest logit (the first one on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Draws a token. `scratch` must hold `logits.len()` pairs.
pub fn sample(logits: &[f32], p: &SamplerParams, rng: &mut Rng, scratch: &mut [(f32, u32)]) -> u32 {
    if p.temperature <= 0.0 || p.top_k == 1 {
        return argmax(logits);
    }
    let n = logits.len();
    let cand = &mut scratch[..n];
    for (i, (c, &l)) in cand.iter_mut().zip(logits).enumerate() {
        *c = (l / p.temperature, i as u32);
    }
    // Descending by logit, ties by id.
    cand.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut k = if p.top_k == 0 { n } else { p.top_k.min(n) };
    let max = cand[0].0;
    let mut sum = 0.0f32;
    for c in cand[..k].iter_mut() {
        c.0 = libm::expf(c.0 - max);
        sum += c.0;
    }
    if p.top_p < 1.0 {
        let mut acc = 0.0;
        for (i, c) in cand[..k].iter().enumerate() {
            acc += c.0 / sum;
            if acc >= p.top_p {
                k = i + 1;
                break;
            }
        }
        sum = cand[..k].iter().map(|c| c.0).sum();
    }
    let mut r = rng.next_f32() * sum;
    for c in &cand[..k] {
        if r < c.0 {
            return c.1;
        }
        r -= c.0;
    }
    cand[k - 1].1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_one_is_greedy_and_seed_repeats() {
        let logits = [0.1f32, 3.0, 2.9, -1.0];
        let mut scratch = [(0.0, 0); 4];
        let p = SamplerParams {
            temperature: 1.0,
            top_k: 1,
            top_p: 1.0,
        };
        assert_eq!(sample(&logits, &p, &mut Rng::new(1), &mut scratch), 1);
        let p = SamplerParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
        };
        let a: [u32; 16] =
            core::array::from_fn(|i| sample(&logits, &p, &mut Rng::new(i as u64), &mut scratch));
        let b: [u32; 16] =
            core::array::from_fn(|i| sample(&logits, &p, &mut Rng::new(i as u64), &mut scratch));
        assert_eq!(a, b);
    }

    #[test]
    fn frequencies_follow_softmax_of_top_two() {
        // top_k 2 over logits [ln 3, ln 1, -inf-ish]: P(0) = 0.75.
        let logits = [libm::logf(3.0), 0.0, -10.0];
        let p = SamplerParams {
            temperature: 1.0,
            top_k: 2,
            top_p: 1.0,
        };
        let mut scratch = [(0.0, 0); 3];
        let mut rng = Rng::new(7);
        let n = 20000;
        let mut c = [0usize; 3];
        for _ in 0..n {
            c[sample(&logits, &p, &mut rng, &mut scratch) as usize] += 1;
        }
        assert_eq!(c[2], 0);
        let f = c[0] as f32 / n as f32;
        // 4 sigma of a binomial(20000, 0.75) is ~0.012.
        assert!((f - 0.75).abs() < 0.012, "{f}");
    }
}
