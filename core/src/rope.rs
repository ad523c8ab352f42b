//! RoPE frequency tables: plain RoPE for sliding layers and YaRN for full layers, computed
//! exactly as transformers 5.23 does (`_compute_yarn_parameters`,
//! `compute_default_rope_parameters` in `modeling_rope_utils.py` / `modeling_laguna.py`).

use alloc::vec::Vec;

use crate::config::Rope;

/// Inverse frequencies (`rotary_dim / 2` of them) and the magnitude multiplying cos and sin.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeTable {
    pub inv_freq: Vec<f32>,
    pub scale: f32,
    pub rotary_dim: usize,
}

impl RopeTable {
    /// Builds the table for one layer kind.
    pub fn new(r: &Rope) -> RopeTable {
        let rd = r.rotary_dim;
        let half = rd / 2;
        // transformers: pos_freqs = base ** (arange(0, rd, 2).float() / rd), in f32.
        let pos_freq = |i: usize| -> f32 {
            let e = (2 * i) as f32 / rd as f32;
            libm::pow(r.theta as f64, e as f64) as f32
        };
        let Some(y) = r.yarn else {
            let inv_freq = (0..half).map(|i| 1.0 / pos_freq(i)).collect();
            return RopeTable {
                inv_freq,
                scale: 1.0,
                rotary_dim: rd,
            };
        };
        // Correction range (truncate = True: floor/ceil), spec §3.4.
        let corr = |rot: f64| -> f64 {
            rd as f64 * libm::log(y.original_context as f64 / (rot * 2.0 * core::f64::consts::PI))
                / (2.0 * libm::log(r.theta as f64))
        };
        let low = libm::floor(corr(y.beta_fast as f64)).max(0.0);
        let high = libm::ceil(corr(y.beta_slow as f64)).min(rd as f64 - 1.0);
        let (low, mut high) = (low as f32, high as f32);
        if low == high {
            high += 0.001;
        }
        let inv_freq = (0..half)
            .map(|i| {
                let pf = pos_freq(i);
                let extrap = 1.0 / pf;
                let interp = 1.0 / (y.factor * pf);
                let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                let w_ex = 1.0 - ramp;
                interp * (1.0 - w_ex) + extrap * w_ex
            })
            .collect();
        RopeTable {
            inv_freq,
            scale: y.attention_factor,
            rotary_dim: rd,
        }
    }

    /// Rotates the first `rotary_dim` dims of one head vector at position `pos`, NeoX pairing
    /// (i, i + rd/2), in place. cos/sin are evaluated in f32 as transformers does.
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let half = self.rotary_dim / 2;
        let p = pos as f32;
        for i in 0..half {
            let a = p * self.inv_freq[i];
            let (c, s) = (libm::cosf(a) * self.scale, libm::sinf(a) * self.scale);
            let (x0, x1) = (x[i], x[i + half]);
            x[i] = x0 * c - x1 * s;
            x[i + half] = x1 * c + x0 * s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Yarn;

    fn close(a: f32, b: f32) -> bool {
        (a - b).abs() <= 1e-6 * b.abs().max(1e-30)
    }

    #[test]
    fn sliding_default_matches_spec_values() {
        let t = RopeTable::new(&Rope {
            theta: 10000.0,
            rotary_dim: 128,
            yarn: None,
        });
        assert!(close(t.inv_freq[0], 1.0));
        assert!(close(t.inv_freq[1], 0.865_964_35));
        assert!(close(t.inv_freq[2], 0.749_894_2));
        assert!(close(t.inv_freq[63], 1.154_781_9e-4));
        assert_eq!(t.scale, 1.0);
    }

    #[test]
    fn yarn_matches_spec_values() {
        // Laguna S 2.1 (spec §3.4 table).
        let y = Yarn {
            factor: 128.0,
            original_context: 8192,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: 1.485_203,
        };
        let t = RopeTable::new(&Rope {
            theta: 500000.0,
            rotary_dim: 64,
            yarn: Some(y),
        });
        for (i, v) in [1.0, 0.663_601_3, 0.440_366_63, 0.292_227_83]
            .iter()
            .enumerate()
        {
            assert!(close(t.inv_freq[i], *v), "{i}: {}", t.inv_freq[i]);
        }
        assert!(close(t.inv_freq[31], 2.354_576_6e-8), "{}", t.inv_freq[31]);
        // XS 2.1: beta_fast 64, factor 32.
        let y = Yarn {
            factor: 32.0,
            beta_fast: 64.0,
            ..y
        };
        let t = RopeTable::new(&Rope {
            theta: 500000.0,
            rotary_dim: 64,
            yarn: Some(y),
        });
        assert!(close(t.inv_freq[31], 9.418_306_5e-8), "{}", t.inv_freq[31]);
    }

    #[test]
    fn rotation_preserves_norm_and_pass_through() {
        let t = RopeTable::new(&Rope {
            theta: 10000.0,
            rotary_dim: 4,
            yarn: None,
        });
        let mut x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        t.apply(&mut x, 7);
        let n: f32 = x[..4].iter().map(|v| v * v).sum();
        assert!((n - 30.0).abs() < 1e-4);
        assert_eq!(&x[4..], &[5.0, 6.0]);
        assert_ne!(x[0], 1.0);
    }
}
