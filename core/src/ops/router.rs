//! The Laguna router (spec §5.2): sigmoid scores, selection on `score + bias`, weights from
//! the unbiased scores, normalised over the chosen k.

/// For one token: fills `ids[..k]` and `weights[..k]` from router logits `z[..E]`.
/// Ties resolve to the lower expert id (torch.topk on CPU returns the first maximum).
/// `sel` is scratch of `E` values.
pub fn route(
    z: &[f32],
    bias: &[f32],
    norm: bool,
    ids: &mut [u32],
    weights: &mut [f32],
    sel: &mut [f32],
) {
    let k = ids.len();
    for ((s, &zi), &b) in sel.iter_mut().zip(z).zip(bias) {
        *s = super::sigmoid(zi) + b;
    }
    for slot in 0..k {
        let mut best = usize::MAX;
        let mut best_v = f32::NEG_INFINITY;
        for (e, &v) in sel.iter().enumerate() {
            // `>` keeps the first of equal values; NaN never wins.
            if v > best_v || (best == usize::MAX && !v.is_nan() && v == best_v) {
                best = e;
                best_v = v;
            }
        }
        if best == usize::MAX {
            best = slot; // all NaN: any valid id keeps compute in bounds.
        }
        ids[slot] = best as u32;
        sel[best] = f32::NEG_INFINITY;
    }
    let mut sum = 0.0f32;
    for (w, &e) in weights.iter_mut().zip(ids.iter()) {
        *w = super::sigmoid(z[e as usize]);
        sum += *w;
    }
    if norm {
        for w in weights.iter_mut() {
            *w /= sum;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn bias_selects_but_does_not_weight() {
        let z = [2.0f32, 0.0, 1.0, -1.0];
        let bias = [0.0f32, 0.0, 0.0, 5.0];
        let (mut ids, mut w, mut sel) = ([0u32; 2], [0f32; 2], [0f32; 4]);
        super::route(&z, &bias, true, &mut ids, &mut w, &mut sel);
        assert_eq!(ids, [3, 0]);
        let (s3, s0) = (super::super::sigmoid(-1.0), super::super::sigmoid(2.0));
        assert!((w[0] - s3 / (s3 + s0)).abs() < 1e-7);
        assert!((w[0] + w[1] - 1.0).abs() < 1e-6);
    }
}
