//! wyrand: a 64-bit PRNG (one add and one 64×64→128 multiply per draw, passes PractRand
//! and BigCrush), fast enough that generating random quant blocks costs less than writing
//! them. Every chunk of every tensor gets its own stream, derived from the seed and the
//! chunk's coordinates, so output does not depend on the number of threads.

/// wyrand state.
#[derive(Clone, Debug)]
pub struct WyRand {
    state: u64,
}

/// splitmix64's finaliser: a bijective 64-bit mix, used to derive stream seeds.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl WyRand {
    pub fn new(seed: u64) -> WyRand {
        WyRand { state: mix64(seed) }
    }

    /// The stream of chunk `chunk` of tensor `tensor` under `seed`.
    pub fn for_chunk(seed: u64, tensor: u64, chunk: u64) -> WyRand {
        WyRand::new(mix64(
            seed ^ mix64(tensor.wrapping_mul(0x1_0000_0001) ^ mix64(chunk)),
        ))
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.state) * u128::from(self.state ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) as u64) ^ (t as u64)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; bias below 2^-32, irrelevant here).
    #[inline]
    pub fn below(&mut self, n: u32) -> u32 {
        (((self.next_u64() >> 32) * u64::from(n)) >> 32) as u32
    }

    /// Uniform in `lo..=hi`.
    #[inline]
    pub fn range(&mut self, lo: i32, hi: i32) -> i32 {
        lo + self.below((hi - lo + 1) as u32) as i32
    }

    /// Uniform in [0, 1).
    #[inline]
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Approximately N(0, 1): the Irwin–Hall sum of the four 16-bit halves of one draw,
    /// centred and scaled to unit variance (tails end at ±3.46, which random weights do
    /// not miss).
    #[inline]
    pub fn normal(&mut self) -> f32 {
        // Each u16 has variance 65536²/12, so the sum of four has standard deviation
        // 65536/√3.
        const MEAN: f32 = 2.0 * 65535.0;
        const INV_STD: f32 = 1.732_050_8 / 65536.0;
        let x = self.next_u64();
        let s = (x & 0xFFFF) + ((x >> 16) & 0xFFFF) + ((x >> 32) & 0xFFFF) + (x >> 48);
        (s as f32 - MEAN) * INV_STD
    }

    /// Fills `out` with random bytes.
    #[inline]
    pub fn fill(&mut self, out: &mut [u8]) {
        let mut it = out.chunks_exact_mut(8);
        for c in &mut it {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = it.into_remainder();
        if !rest.is_empty() {
            let b = self.next_u64().to_le_bytes();
            rest.copy_from_slice(&b[..rest.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_has_unit_variance_and_zero_mean() {
        let mut r = WyRand::new(7);
        let n = 200_000;
        let (mut s, mut s2) = (0.0f64, 0.0f64);
        for _ in 0..n {
            let x = f64::from(r.normal());
            s += x;
            s2 += x * x;
        }
        let mean = s / n as f64;
        let var = s2 / n as f64 - mean * mean;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "variance {var}");
    }

    #[test]
    fn chunk_streams_differ_and_repeat() {
        let a = WyRand::for_chunk(1, 2, 3).next_u64();
        assert_eq!(a, WyRand::for_chunk(1, 2, 3).next_u64());
        assert_ne!(a, WyRand::for_chunk(1, 2, 4).next_u64());
        assert_ne!(a, WyRand::for_chunk(1, 3, 3).next_u64());
        assert_ne!(a, WyRand::for_chunk(2, 2, 3).next_u64());
    }

    #[test]
    fn range_is_inclusive_and_bounded() {
        let mut r = WyRand::new(1);
        let mut seen = [false; 5];
        for _ in 0..1000 {
            let x = r.range(3, 7);
            assert!((3..=7).contains(&x));
            seen[(x - 3) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }
}
