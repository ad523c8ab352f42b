//! Causal (optionally sliding-window) GQA attention for one query token over a KV cache.

/// Attention of one query token at absolute position `pos`.
///
/// `q` is `[n_heads, d]`; keys/values of position `j` are fetched by `kv(j)`, which returns
/// `([n_kv, d], [n_kv, d])` slices; positions `first..=pos` are visible (the caller derives
/// `first` from the window: `pos + 1 - W` for sliding layers, clamped at 0). Query head `h`
/// reads KV head `h / (n_heads / n_kv)` (transformers' `repeat_kv`). `scores` is scratch of
/// at least `pos + 1 - first`. Softmax scale is `1/sqrt(d)`.
pub fn attend<'a>(
    q: &[f32],
    n_heads: usize,
    n_kv: usize,
    d: usize,
    first: usize,
    pos: usize,
    kv: impl Fn(usize) -> (&'a [f32], &'a [f32]),
    scores: &mut [f32],
    out: &mut [f32],
) {
    let group = n_heads / n_kv;
    for h in 0..n_heads {
        let (qh, oh) = (&q[h * d..(h + 1) * d], &mut out[h * d..(h + 1) * d]);
        attend_head(qh, h / group, d, first, pos, &kv, scores, oh);
    }
}

/// One query head against KV head `kvh`: see [`attend`].
pub fn attend_head<'a>(
    qh: &[f32],
    kvh: usize,
    d: usize,
    first: usize,
    pos: usize,
    kv: &impl Fn(usize) -> (&'a [f32], &'a [f32]),
    scores: &mut [f32],
    oh: &mut [f32],
) {
    let scale = 1.0 / libm::sqrtf(d as f32);
    let n = pos + 1 - first;
    {
        let mut max = f32::NEG_INFINITY;
        for (i, s) in scores[..n].iter_mut().enumerate() {
            let (k, _) = kv(first + i);
            *s = super::dot(qh, &k[kvh * d..(kvh + 1) * d]) * scale;
            max = max.max(*s);
        }
        let mut sum = 0.0f32;
        for s in scores[..n].iter_mut() {
            *s = libm::expf(*s - max);
            sum += *s;
        }
        oh.fill(0.0);
        for (i, &s) in scores[..n].iter().enumerate() {
            let (_, v) = kv(first + i);
            let p = s / sum;
            for (o, &vv) in oh.iter_mut().zip(&v[kvh * d..(kvh + 1) * d]) {
                *o += p * vv;
            }
        }
    }
}
