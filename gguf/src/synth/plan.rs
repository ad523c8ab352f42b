//! The tensors of a synthetic Laguna checkpoint, format-neutral: names (GGUF spelling),
//! dims, roles and how their values are drawn.
//!
//! Weight statistics keep activations near unit RMS through any number of layers: every
//! matrix has std `WEIGHT_GAIN/√fan_in`, so a unit-RMS input gives outputs of RMS
//! ≈ `WEIGHT_GAIN`; pre-norm blocks then add O(1) per layer to the residual, which grows
//! like √layers (≈ 5 after 48 layers) and never vanishes. The router's logits have unit
//! spread so tokens spread over the experts; `router_skew` shifts the selection bias of a
//! hot set of experts.

use super::mix::Role;
use super::preset::Shape;
use super::rng::WyRand;

/// Output RMS of a matrix for a unit-RMS input (weight std × √fan_in).
pub const WEIGHT_GAIN: f32 = 0.8;
/// Router weight std × √H: unit-spread logits, so sigmoid scores spread by ≈ 0.21.
pub const ROUTER_GAIN: f32 = 1.0;
/// Standard deviation of `sigmoid(z)` for `z ~ N(0, ROUTER_GAIN²)`: the unit of
/// `router_skew`.
pub const ROUTER_SCORE_STD: f32 = 0.21;
/// Token embeddings: unit RMS rows, the residual stream's starting scale.
pub const EMBED_STD: f32 = 1.0;
/// lm_head std × √H: logits spread ≈ 1.5, as trained models' are of order 1.
pub const OUTPUT_GAIN: f32 = 1.5;
/// Norm gains: 1 with a small spread.
pub const NORM_STD: f32 = 0.02;

/// How a tensor's values are drawn.
#[derive(Clone, Debug, PartialEq)]
pub enum Init {
    /// `N(mean, std²)`; quantised types support `mean = 0` only.
    Normal { mean: f32, std: f32 },
    /// These values, in order.
    Values(Vec<f32>),
}

/// One tensor of the plan.
#[derive(Clone, Debug)]
pub struct TensorPlan {
    /// GGUF name (`blk.3.ffn_up_exps.weight`).
    pub name: String,
    pub role: Role,
    /// The layer, for per-layer roles.
    pub layer: Option<usize>,
    /// Dims in ggml order (`ne[0]` contiguous): `[in, out]` or `[in, out, experts]`.
    pub ne: Vec<u64>,
    pub init: Init,
}

impl TensorPlan {
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }
}

fn weight(fan_in: usize, gain: f32) -> Init {
    Init::Normal {
        mean: 0.0,
        std: gain / (fan_in as f32).sqrt(),
    }
}

fn norm() -> Init {
    Init::Normal {
        mean: 1.0,
        std: NORM_STD,
    }
}

/// The selection bias of one MoE layer: small noise, plus `skew · ROUTER_SCORE_STD` on
/// `n_hot` experts chosen at random (per layer, from `seed`).
pub fn router_bias(seed: u64, layer: usize, n_experts: usize, n_hot: usize, skew: f32) -> Vec<f32> {
    let mut rng = WyRand::for_chunk(seed, u64::MAX - layer as u64, 0);
    let mut bias: Vec<f32> = (0..n_experts).map(|_| 0.01 * rng.normal()).collect();
    if skew != 0.0 {
        // Partial Fisher–Yates: the first n_hot of a random permutation.
        let mut ids: Vec<usize> = (0..n_experts).collect();
        for i in 0..n_hot.min(n_experts) {
            let j = i + rng.below((n_experts - i) as u32) as usize;
            ids.swap(i, j);
            bias[ids[i]] += skew * ROUTER_SCORE_STD;
        }
    }
    bias
}

/// Every tensor of the model, in file order: `token_embd`, the layers, `output_norm`,
/// `output`.
pub fn plan(s: &Shape, seed: u64, router_skew: f32) -> Vec<TensorPlan> {
    let (h, d, kv) = (s.hidden as u64, s.head_dim as u64, s.n_kv_heads as u64);
    let mut v = Vec::new();
    let mut add = |name: String, role: Role, layer: Option<usize>, ne: Vec<u64>, init: Init| {
        v.push(TensorPlan {
            name,
            role,
            layer,
            ne,
            init,
        })
    };
    add(
        "token_embd.weight".into(),
        Role::TokenEmbd,
        None,
        vec![h, s.vocab_size as u64],
        Init::Normal {
            mean: 0.0,
            std: EMBED_STD,
        },
    );
    for l in 0..s.n_layers {
        let hq = s.n_heads(l) as u64;
        let n = |t: &str| format!("blk.{l}.{t}.weight");
        let mut lay =
            |name: String, role: Role, ne: Vec<u64>, init: Init| add(name, role, Some(l), ne, init);
        let wi = |fan_in: u64| weight(fan_in as usize, WEIGHT_GAIN);
        lay(n("attn_norm"), Role::AttnNorm, vec![h], norm());
        lay(n("attn_q"), Role::Q, vec![h, hq * d], wi(h));
        lay(n("attn_k"), Role::K, vec![h, kv * d], wi(h));
        lay(n("attn_v"), Role::V, vec![h, kv * d], wi(h));
        lay(n("attn_q_norm"), Role::QNorm, vec![d], norm());
        lay(n("attn_k_norm"), Role::KNorm, vec![d], norm());
        lay(
            n("attn_gate"),
            Role::AttnGate,
            vec![h, s.gate_rows(l) as u64],
            wi(h),
        );
        lay(n("attn_output"), Role::O, vec![hq * d, h], wi(hq * d));
        lay(n("ffn_norm"), Role::FfnNorm, vec![h], norm());
        if s.is_dense(l) {
            let f = s.dense_ffn as u64;
            lay(n("ffn_gate"), Role::DenseGate, vec![h, f], wi(h));
            lay(n("ffn_up"), Role::DenseUp, vec![h, f], wi(h));
            lay(n("ffn_down"), Role::DenseDown, vec![f, h], wi(f));
        } else {
            let (e, i) = (s.n_experts as u64, s.expert_ffn as u64);
            lay(
                n("ffn_gate_inp"),
                Role::Router,
                vec![h, e],
                weight(s.hidden, ROUTER_GAIN),
            );
            let bias = router_bias(seed, l, s.n_experts, s.n_experts_used, router_skew);
            lay(
                format!("blk.{l}.exp_probs_b.bias"),
                Role::RouterBias,
                vec![e],
                Init::Values(bias),
            );
            lay(n("ffn_gate_exps"), Role::ExpGate, vec![h, i, e], wi(h));
            lay(n("ffn_up_exps"), Role::ExpUp, vec![h, i, e], wi(h));
            lay(n("ffn_down_exps"), Role::ExpDown, vec![i, h, e], wi(i));
            if s.shared_ffn > 0 {
                let f = s.shared_ffn as u64;
                lay(n("ffn_gate_shexp"), Role::ShGate, vec![h, f], wi(h));
                lay(n("ffn_up_shexp"), Role::ShUp, vec![h, f], wi(h));
                lay(n("ffn_down_shexp"), Role::ShDown, vec![f, h], wi(f));
            }
        }
    }
    add(
        "output_norm.weight".into(),
        Role::OutputNorm,
        None,
        vec![h],
        norm(),
    );
    add(
        "output.weight".into(),
        Role::Output,
        None,
        vec![h, s.vocab_size as u64],
        weight(s.hidden, OUTPUT_GAIN),
    );
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::preset::Preset;

    #[test]
    fn plan_counts_every_parameter() {
        let s = Preset::Xs2.shape().with_layers(3).with_experts(8);
        let p = plan(&s, 1, 0.0);
        let total: u64 = p.iter().map(TensorPlan::n_elements).sum();
        assert_eq!(total, s.n_params());
    }

    #[test]
    fn skew_biases_exactly_the_hot_set() {
        let flat = router_bias(5, 2, 64, 8, 0.0);
        let hot = router_bias(5, 2, 64, 8, 3.0);
        let shifted: Vec<usize> = (0..64).filter(|&e| hot[e] != flat[e]).collect();
        assert_eq!(shifted.len(), 8);
        for e in shifted {
            assert!((hot[e] - flat[e] - 3.0 * ROUTER_SCORE_STD).abs() < 1e-6);
        }
    }
}
