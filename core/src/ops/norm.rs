//! RMSNorm: `y = x / sqrt(mean(x²) + eps) · w` over each group of `w.len()` values.

/// Normalises each consecutive group of `w.len()` elements of `x` into `out`.
/// Used with the hidden size (layer norms) and with the head size (QK-norm, one gain vector
/// shared by every head).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for (xg, og) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let mut ss = 0.0f32;
        for &v in xg {
            ss += v * v;
        }
        let r = 1.0 / libm::sqrtf(ss / n as f32 + eps);
        for ((o, &v), &g) in og.iter_mut().zip(xg).zip(w) {
            *o = g * (v * r);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn unit_rms_after_norm() {
        let x = [3.0f32, -4.0, 0.0, 5.0, 1.0, 2.0, 2.0, 1.0];
        let w = [1.0f32; 4];
        let mut y = [0.0; 8];
        super::rms_norm(&x, &w, 0.0, &mut y);
        for g in y.chunks(4) {
            let ms: f32 = g.iter().map(|v| v * v).sum::<f32>() / 4.0;
            assert!((ms - 1.0).abs() < 1e-5);
        }
        assert!((y[0] - 3.0 / (50.0f32 / 4.0).sqrt()).abs() < 1e-6);
    }
}
