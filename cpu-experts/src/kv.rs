//! The KV cache: per layer, K (post-norm, post-RoPE) and V rows of `n_kv · head_dim` f32.
//! Full layers hold the whole context; sliding layers a ring of `window − 1 + max_ubatch`
//! rows, enough for the oldest query of a chunk to still see its whole window.

use alloc::vec;
use alloc::vec::Vec;

use lagoon_core::config::ModelConfig;

/// One layer's cache. Position `p` lives in row `p % cap`.
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
    /// Row width: `n_kv_heads · head_dim`.
    pub row: usize,
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
                    k: vec![0.0; cap * row],
                    v: vec![0.0; cap * row],
                }
            })
            .collect();
        KvCache {
            layers,
            row,
            n_ctx,
            window: c.sliding_window,
        }
    }

    /// Bytes held.
    pub fn n_bytes(&self) -> usize {
        self.layers.iter().map(|l| 2 * l.k.len() * 4).sum()
    }
}

impl LayerKv {
    /// Stores position `pos`'s K and V rows.
    pub fn store(&mut self, pos: usize, k: &[f32], v: &[f32]) {
        let row = k.len();
        let s = (pos % self.cap) * row;
        self.k[s..s + row].copy_from_slice(k);
        self.v[s..s + row].copy_from_slice(v);
    }

    /// K and V rows of position `pos` (which must still be held).
    pub fn get(&self, pos: usize, row: usize) -> (&[f32], &[f32]) {
        let s = (pos % self.cap) * row;
        (&self.k[s..s + row], &self.v[s..s + row])
    }
}
