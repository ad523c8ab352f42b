//! The KV cache: per layer, K (post-norm, post-RoPE) and V of `n_kv` heads of `head_dim`
//! f32 per position. Full layers hold the whole context; sliding layers a ring of
//! `window − 1 + max_ubatch` rows, enough for the oldest query of a chunk to still see its
//! whole window.
//!
//! Head-major: KV head h's rows are back to back, position p's at `(h·cap + p % cap)·d`. The
//! attention kernels read one KV head's rows at a time; laid out as whole KV rows
//! (`n_kv·d` floats a position) they were `n_kv·d·4` bytes apart (4 KiB for Laguna's eight
//! heads of 128), so every position's head fell in the same few L1/L2 sets and in its own
//! page. Measured on the 2-core AVX512-VNNI VM (`kernels-bench simd_cmp_attention`, one
//! thread, 512 positions, eight query heads a KV head): the one-token kernel 28.3 → 48.7
//! GFLOP/s, the 16-token kernel 87.9 → 99.5 (BENCHMARKS.md, "Session 30 on the 2-core …").

use alloc::vec;
use alloc::vec::Vec;

use lagoon_core::config::ModelConfig;

/// One layer's cache. Position `p` of KV head `h` lives at `(h·cap + p % cap)·d`.
#[derive(Debug)]
pub struct LayerKv {
    pub cap: usize,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// The whole cache.
#[derive(Debug)]
pub struct KvCache {
    pub layers: Vec<LayerKv>,
    /// `head_dim`: one head's rows are this far apart.
    pub d: usize,
    pub n_ctx: usize,
    pub window: usize,
}

impl KvCache {
    pub fn new(c: &ModelConfig, n_ctx: usize, max_ubatch: usize) -> KvCache {
        let row = c.n_kv_heads * c.head_dim;
        let layers = (0..c.n_layers)
            .map(|l| {
                let cap = if c.is_sliding(l) {
                    n_ctx.min(c.sliding_window - 1 + max_ubatch)
                } else {
                    n_ctx
                };
                LayerKv {
                    cap,
                    k: committed(cap * row),
                    v: committed(cap * row),
                }
            })
            .collect();
        KvCache {
            layers,
            d: c.head_dim,
            n_ctx,
            window: c.sliding_window,
        }
    }

    /// Bytes held.
    pub fn n_bytes(&self) -> usize {
        self.layers.iter().map(|l| 2 * l.k.len() * 4).sum()
    }
}

/// `n` zeros whose pages are committed now: a zeroed allocation of this size is mapped
/// lazily, and each page's first write (the KV store of a new position, on the step's
/// critical path) would fault. One write per 4 KiB page. Measured on the 2-core KVM VM
/// (BENCHMARKS.md, "Session 31 …"): the prefill profile's `kv store` node 29–147 µs a token
/// with first-touch faults against 5.1–6.5 committed. It also makes the cache's memory the
/// session's from its creation, as llama.cpp's cleared KV buffer is, instead of a fault that
/// may find no memory mid-generation.
fn committed(n: usize) -> Vec<f32> {
    let mut v = vec![0.0f32; n];
    for x in v.iter_mut().step_by(1024) {
        // SAFETY: x is a valid, aligned, exclusive reference into v; the volatile write
        // keeps the compiler from dropping a store of the value already there.
        unsafe { core::ptr::write_volatile(x, 0.0) };
    }
    v
}

impl LayerKv {
    /// Where KV head `h`'s rows start (`d` wide heads).
    pub fn head_off(&self, h: usize, d: usize) -> usize {
        h * self.cap * d
    }

    /// Stores position `pos`'s K and V (all heads, `d` wide each, heads in order).
    pub fn store(&mut self, pos: usize, k: &[f32], v: &[f32], d: usize) {
        let p = pos % self.cap;
        for (h, (kh, vh)) in k.chunks_exact(d).zip(v.chunks_exact(d)).enumerate() {
            let s = (h * self.cap + p) * d;
            self.k[s..s + d].copy_from_slice(kh);
            self.v[s..s + d].copy_from_slice(vh);
        }
    }

    /// KV head `h`'s K and V at position `pos` (which must still be held).
    pub fn head(&self, pos: usize, h: usize, d: usize) -> (&[f32], &[f32]) {
        let s = (h * self.cap + pos % self.cap) * d;
        (&self.k[s..s + d], &self.v[s..s + d])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Positions wrap on the ring and heads stay apart: what `store` put is what `head`
    /// gives back, for every head of every held position.
    #[test]
    fn stored_heads_come_back() {
        let (d, n_kv, cap) = (4, 3, 5);
        let mut l = LayerKv {
            cap,
            k: vec![0.0; cap * n_kv * d],
            v: vec![0.0; cap * n_kv * d],
        };
        let val = |pos: usize, i: usize, kv: f32| (pos * 100 + i) as f32 + kv;
        for pos in 0..12 {
            let k: Vec<f32> = (0..n_kv * d).map(|i| val(pos, i, 0.0)).collect();
            let v: Vec<f32> = (0..n_kv * d).map(|i| val(pos, i, 0.5)).collect();
            l.store(pos, &k, &v, d);
        }
        for pos in 12 - cap..12 {
            for h in 0..n_kv {
                let (k, v) = l.head(pos, h, d);
                for i in 0..d {
                    assert_eq!(k[i], val(pos, h * d + i, 0.0));
                    assert_eq!(v[i], val(pos, h * d + i, 0.5));
                }
                assert_eq!(
                    k.as_ptr(),
                    l.k[l.head_off(h, d) + (pos % cap) * d..].as_ptr()
                );
            }
        }
    }
}
