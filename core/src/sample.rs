//! Token samplers: greedy, temperature, min-p, top-k, top-p, repetition / presence /
//! frequency penalties, seeded. The caller owns the scratch buffer and the token counts, so
//! sampling allocates nothing.
//!
//! Order of operations, as vLLM's v1 sampler (`vllm/v1/sample/sampler.py`, `Sampler`
//! docstring and `forward`; penalties in `vllm/model_executor/layers/utils.py`
//! `apply_penalties`):
//!
//! ```text
//! logits ─ penalties ─┬─ greedy (temperature < 1e-5 or top_k == 1): argmax
//!   repetition          └─ / temperature ─ min-p ─ top-k ─ top-p ─ draw ∝ softmax
//!   frequency
//!   presence
//! ```
//!
//! * repetition (`r`, 1 = off) on every token seen in the prompt **or** the output:
//!   a positive logit is divided by `r`, a negative one multiplied by it;
//! * frequency (`f`, 0 = off): `logit -= f * count` with `count` the token's occurrences in
//!   the **output** only;
//! * presence (`p`, 0 = off): `logit -= p` once for a token present in the **output**;
//! * min-p: keep the tokens whose probability (at this temperature) is at least
//!   `min_p * max probability`;
//! * top-k: keep the `k` most likely of those (ties broken by lower id);
//! * top-p: keep the smallest most-likely-first prefix whose mass, renormalised over what
//!   survived the filters above, reaches `p` (the token crossing `p` is kept).
//!
//! The window is the whole prompt plus output, as in vLLM; llama.cpp instead penalises
//! only the last `penalty_last_n` tokens and applies all three penalties to that window
//! (`src/llama-sampler.cpp`, `llama_sampler_penalties_apply`); the formulas are the same.

#[cfg(feature = "alloc")]
mod penalty;

#[cfg(feature = "alloc")]
pub use penalty::TokenCounts;

/// A small, seedable generator (xorshift64*): same seed, same tokens.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeds through splitmix64, so that nearby seeds give unrelated streams (and no seed
    /// gives the all-zero state xorshift cannot leave).
    pub fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Rng(if z == 0 { 0x9E37_79B9_7F4A_7C15 } else { z })
    }

    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[0, 1)` (24 random bits).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `[0, 1)` (53 random bits).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Below this temperature sampling is greedy (vLLM's `_SAMPLING_EPS`): dividing by a
/// smaller one would overflow the logits.
pub const GREEDY_TEMPERATURE: f32 = 1e-5;

/// Top-p first selects this many of the heaviest tokens and sorts only them when they
/// hold the target mass (else it sorts all survivors).
pub const TOP_P_PRESELECT: usize = 256;

/// Sampling parameters; [`Default`] is greedy with every filter and penalty off.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerParams {
    /// `< 1e-5` means greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1.0 = off; in `(0, 1]`.
    pub top_p: f32,
    /// 0.0 = off; in `[0, 1]`.
    pub min_p: f32,
    /// 1.0 = off; `> 0`. Prompt and output tokens.
    pub repetition_penalty: f32,
    /// 0.0 = off. Output tokens.
    pub presence_penalty: f32,
    /// 0.0 = off. Output tokens, times their count.
    pub frequency_penalty: f32,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
        }
    }
}

/// A sampling parameter out of its range.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerError {
    pub param: &'static str,
    pub value: f32,
    pub expected: &'static str,
}

impl core::fmt::Display for SamplerError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "sampling parameter {} = {} is out of range: expected {}",
            self.param, self.value, self.expected
        )
    }
}

impl core::error::Error for SamplerError {}

impl SamplerParams {
    /// Checks every parameter's range.
    pub fn validate(&self) -> Result<(), SamplerError> {
        let err = |param, value, expected| {
            Err(SamplerError {
                param,
                value,
                expected,
            })
        };
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return err("temperature", self.temperature, "a finite value >= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return err("top_p", self.top_p, "a value in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return err("min_p", self.min_p, "a value in [0, 1]");
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return err(
                "repetition_penalty",
                self.repetition_penalty,
                "a finite value > 0 (1 = off)",
            );
        }
        if !self.presence_penalty.is_finite() {
            return err("presence_penalty", self.presence_penalty, "a finite value");
        }
        if !self.frequency_penalty.is_finite() {
            return err(
                "frequency_penalty",
                self.frequency_penalty,
                "a finite value",
            );
        }
        Ok(())
    }

    /// Whether sampling reduces to the argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature < GREEDY_TEMPERATURE || self.top_k == 1
    }

    /// Whether any penalty is on.
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }
}

/// Index of the largest logit (the first one on ties; NaN never wins unless all are NaN).
pub fn argmax(logits: &[f32]) -> u32 {
    // Two passes that the compiler vectorises: the maximum over 16 independent lanes, then
    // the first position holding it. (One pass tracking the index is a serial dependency
    // chain: ~7x slower on a 100k vocabulary.)
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = logits.chunks_exact(LANES);
    for c in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            // `>` is false for NaN, so NaN never displaces a number.
            *m = if v > *m { v } else { *m };
        }
    }
    let mut max = f32::NEG_INFINITY;
    for &v in lanes.iter().chain(chunks.remainder()) {
        if v > max {
            max = v;
        }
    }
    logits.iter().position(|&v| v == max).unwrap_or(0) as u32
}

/// `exp(x)` for `x <= 0`, the weights' only domain (`x = logit - max`): Cody-Waite range
/// reduction to `r` in [-ln2/2, ln2/2] and a degree-6 Taylor polynomial (relative error
/// < 3e-7, a few ulp), 0 below -87 where f32 leaves the normal range. Branch-free so
/// that a loop over a vocabulary vectorises; `libm::expf` is ~10x slower here.
#[inline(always)]
fn exp_nonpos(x: f32) -> f32 {
    const LOG2E: f32 = core::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75; // ln 2 split so that n * LN2_HI is exact
    const LN2_LO: f32 = 1.428_606_8e-6;
    let tiny = x <= -87.0; // also -inf (a masked token): weight 0 (NaN is gone by now)
    let x = if tiny { -87.0 } else { x };
    // Round x·log2(e) (<= 0) to the nearest integer: truncation of a positive value floors.
    let n = -((0.5 - x * LOG2E) as i32);
    let nf = n as f32;
    let r = (x - nf * LN2_HI) - nf * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // 2^n by building the exponent field; n >= -126 here, so the result is normal.
    let v = p * f32::from_bits(((n + 127) as u32) << 23);
    if tiny { 0.0 } else { v }
}

/// Draws a token without penalties. `scratch` must hold `logits.len()` pairs.
pub fn sample(logits: &[f32], p: &SamplerParams, rng: &mut Rng, scratch: &mut [(f32, u32)]) -> u32 {
    if p.is_greedy() {
        return argmax(logits);
    }
    let cand = &mut scratch[..logits.len()];
    for (i, (c, &l)) in cand.iter_mut().zip(logits).enumerate() {
        *c = (l, i as u32);
    }
    sample_candidates(cand, p, rng)
}

/// Draws a token from `cand`, pairs of (logit after penalties, id), which it reorders and
/// overwrites. Greedy when [`SamplerParams::is_greedy`]; penalties are the caller's.
pub fn sample_candidates(cand: &mut [(f32, u32)], p: &SamplerParams, rng: &mut Rng) -> u32 {
    if cand.is_empty() {
        return 0;
    }
    // NaN logits never win: treat them as -inf.
    for c in cand.iter_mut() {
        if c.0.is_nan() {
            c.0 = f32::NEG_INFINITY;
        }
    }
    if p.is_greedy() {
        return greedy(cand);
    }
    let inv_t = 1.0 / p.temperature;
    let mut max = f32::NEG_INFINITY;
    for c in cand.iter_mut() {
        c.0 *= inv_t;
        max = max.max(c.0);
    }
    if !max.is_finite() {
        // All -inf (or +inf after scaling): no distribution to draw from.
        return greedy(cand);
    }
    let mut n = cand.len();
    let desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));

    // min-p and top-k are applied to the scaled logits, before any exp: both keep a set
    // defined by the order (top-k) or by the ratio to the best token (min-p: p_i >=
    // min_p * p_max <=> l_i - max >= ln(min_p)), so they commute with each other and with
    // the exp, and the exp then runs over the survivors only.
    if p.top_k > 0 && p.top_k < n {
        cand[..n].select_nth_unstable_by(p.top_k - 1, desc);
        n = p.top_k;
    }
    if p.min_p > 0.0 {
        let floor = max + libm::logf(p.min_p);
        let mut kept = 0;
        for i in 0..n {
            if cand[i].0 >= floor {
                cand.swap(kept, i);
                kept += 1;
            }
        }
        n = kept;
    }
    // Weights relative to the best token: w = exp(l - max) <= 1, the best has 1.
    for c in cand[..n].iter_mut() {
        c.0 = exp_nonpos(c.0 - max);
    }

    if p.top_p < 1.0 {
        let total: f64 = cand[..n].iter().map(|c| c.0 as f64).sum();
        let target = p.top_p as f64 * total;
        // Sorting a whole vocabulary costs milliseconds: when the heaviest
        // TOP_P_PRESELECT tokens already hold the target mass, the kept prefix lies among
        // them and only they are sorted.
        let mut m = n;
        if n > TOP_P_PRESELECT {
            cand[..n].select_nth_unstable_by(TOP_P_PRESELECT - 1, desc);
            let head: f64 = cand[..TOP_P_PRESELECT].iter().map(|c| c.0 as f64).sum();
            if head >= target {
                m = TOP_P_PRESELECT;
            }
        }
        cand[..m].sort_unstable_by(desc);
        let mut acc = 0.0f64;
        n = m;
        for (i, c) in cand[..m].iter().enumerate() {
            acc += c.0 as f64;
            if acc >= target {
                n = i + 1;
                break;
            }
        }
    }

    let total: f64 = cand[..n].iter().map(|c| c.0 as f64).sum();
    let mut r = rng.next_f64() * total;
    for c in &cand[..n] {
        let w = c.0 as f64;
        if r < w {
            return c.1;
        }
        r -= w;
    }
    // Rounding left `r` just above the last weight: take the last token with weight.
    cand[..n]
        .iter()
        .rev()
        .find(|c| c.0 > 0.0)
        .map_or(cand[0].1, |c| c.1)
}

fn greedy(cand: &[(f32, u32)]) -> u32 {
    let mut best = cand[0];
    for &c in &cand[1..] {
        if c.0 > best.0 || (c.0 == best.0 && c.1 < best.1) {
            best = c;
        }
    }
    best.1
}

/// A sampler with its own scratch, token counts and generator, all sized at construction:
/// [`sample`](Sampler::sample) and [`accept`](Sampler::accept) allocate nothing.
#[cfg(feature = "alloc")]
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplerParams,
    rng: Rng,
    scratch: alloc::vec::Vec<(f32, u32)>,
    counts: TokenCounts,
}

#[cfg(feature = "alloc")]
impl Sampler {
    /// A sampler over a vocabulary of `vocab_size` logits.
    pub fn new(
        vocab_size: usize,
        params: SamplerParams,
        seed: u64,
    ) -> Result<Sampler, SamplerError> {
        params.validate()?;
        Ok(Sampler {
            params,
            rng: Rng::new(seed),
            scratch: alloc::vec![(0.0, 0); vocab_size],
            counts: TokenCounts::new(vocab_size),
        })
    }

    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    pub fn vocab_size(&self) -> usize {
        self.scratch.len()
    }

    pub fn counts(&self) -> &TokenCounts {
        &self.counts
    }

    /// Starts a new sequence: forgets the counts, records the prompt's tokens (for the
    /// repetition penalty) and reseeds.
    pub fn reset(&mut self, prompt: &[u32], seed: u64) {
        self.rng = Rng::new(seed);
        self.counts.clear();
        self.counts.add_prompt(prompt);
    }

    /// Records an output token (sampled or forced) for the penalties.
    pub fn accept(&mut self, token: u32) {
        self.counts.add_output(token);
    }

    /// Draws the next token from `logits` (`vocab_size` of them; extra ones are ignored,
    /// missing ones never drawn).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        if p.is_greedy() && !p.has_penalties() {
            return argmax(&logits[..logits.len().min(self.scratch.len())]);
        }
        let n = logits.len().min(self.scratch.len());
        let cand = &mut self.scratch[..n];
        for (i, (c, &l)) in cand.iter_mut().zip(logits).enumerate() {
            *c = (l, i as u32);
        }
        if p.has_penalties() {
            self.counts.apply(p, cand);
        }
        sample_candidates(cand, p, &mut self.rng)
    }
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
            ..Default::default()
        };
        assert_eq!(sample(&logits, &p, &mut Rng::new(1), &mut scratch), 1);
        let p = SamplerParams {
            temperature: 1.0,
            ..Default::default()
        };
        let a: [u32; 16] =
            core::array::from_fn(|i| sample(&logits, &p, &mut Rng::new(i as u64), &mut scratch));
        let b: [u32; 16] =
            core::array::from_fn(|i| sample(&logits, &p, &mut Rng::new(i as u64), &mut scratch));
        assert_eq!(a, b);
        // Different seeds do not all agree (4 tokens of similar weight), and seeds that
        // differ in the lowest bit give different streams.
        assert!(a.iter().any(|&t| t != a[0]), "{a:?}");
        let (mut r42, mut r43) = (Rng::new(42), Rng::new(43));
        assert_ne!(r42.next_f64(), r43.next_f64());
    }

    #[test]
    fn frequencies_follow_softmax_of_top_two() {
        // top_k 2 over logits [ln 3, ln 1, -10]: P(0) = 0.75.
        let logits = [libm::logf(3.0), 0.0, -10.0];
        let p = SamplerParams {
            temperature: 1.0,
            top_k: 2,
            ..Default::default()
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

    #[test]
    fn filters_keep_the_right_sets() {
        // Weights at T = 1 relative to the best: 1, 0.5, 0.25, 0.125, 0.0625.
        let logits: [f32; 5] = core::array::from_fn(|i| -(i as f32) * core::f32::consts::LN_2);
        let support = |p: SamplerParams| {
            let mut seen = [false; 5];
            let mut rng = Rng::new(3);
            let mut scratch = [(0.0, 0); 5];
            for _ in 0..4000 {
                seen[sample(&logits, &p, &mut rng, &mut scratch) as usize] = true;
            }
            seen
        };
        let t1 = SamplerParams {
            temperature: 1.0,
            ..Default::default()
        };
        assert_eq!(support(t1), [true; 5]);
        // min_p 0.2 keeps weights >= 0.2: ids 0..=2.
        let s = support(SamplerParams { min_p: 0.2, ..t1 });
        assert_eq!(s, [true, true, true, false, false]);
        // top_p: masses 16/31, 8/31, ...; p = 0.7 needs 16+8 = 24/31 = 0.774: ids 0, 1.
        let s = support(SamplerParams { top_p: 0.7, ..t1 });
        assert_eq!(s, [true, true, false, false, false]);
        // top_k 3 then top_p over the renormalised three (4/7, 2/7, 1/7): p = 0.6 keeps 0, 1.
        let s = support(SamplerParams {
            top_k: 3,
            top_p: 0.6,
            ..t1
        });
        assert_eq!(s, [true, true, false, false, false]);
        // Temperature 0.5 squares the weights (1, .25, .0625, ...): min_p 0.1 keeps 0, 1.
        let s = support(SamplerParams {
            temperature: 0.5,
            min_p: 0.1,
            ..t1
        });
        assert_eq!(s, [true, true, false, false, false]);
    }

    #[test]
    fn exp_nonpos_matches_libm() {
        assert_eq!(exp_nonpos(0.0), 1.0);
        assert_eq!(exp_nonpos(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpos(-90.0), 0.0);
        let mut worst = 0.0f64;
        let mut x = 0.0f32;
        while x > -87.0 {
            let want = libm::exp(x as f64);
            let got = exp_nonpos(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x -= 0.000_731;
        }
        assert!(worst < 3e-7, "worst relative error {worst:e}");
    }

    #[test]
    fn argmax_finds_first_max_in_every_lane_position() {
        for n in [1usize, 15, 16, 17, 33, 100] {
            for at in 0..n {
                let mut v = alloc::vec![0.5f32; n];
                v[at] = 2.0;
                if at + 1 < n {
                    v[n - 1] = 2.0; // a later tie never wins
                }
                assert_eq!(argmax(&v), at as u32, "n {n} at {at}");
            }
        }
        assert_eq!(argmax(&[f32::NAN; 20]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NAN, f32::NEG_INFINITY]), 0);
    }

    #[test]
    fn greedy_ignores_nan_and_prefers_low_ids_on_ties() {
        assert_eq!(argmax(&[f32::NAN, 1.0, 2.0, 2.0]), 2);
        let mut cand = [(1.0, 4), (f32::NAN, 0), (1.0, 2)];
        assert_eq!(
            sample_candidates(&mut cand, &SamplerParams::default(), &mut Rng::new(0)),
            2
        );
    }

    #[test]
    fn rejects_out_of_range_params() {
        let bad = [
            SamplerParams {
                top_p: 0.0,
                ..Default::default()
            },
            SamplerParams {
                min_p: 1.5,
                ..Default::default()
            },
            SamplerParams {
                temperature: f32::NAN,
                ..Default::default()
            },
            SamplerParams {
                repetition_penalty: 0.0,
                ..Default::default()
            },
            SamplerParams {
                presence_penalty: f32::INFINITY,
                ..Default::default()
            },
        ];
        for p in bad {
            assert!(p.validate().is_err(), "{p:?}");
        }
        assert!(SamplerParams::default().validate().is_ok());
    }
}
