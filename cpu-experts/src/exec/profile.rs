//! Where a CPU step's time goes: the wall time of each graph node, summed by what the node
//! does (its role in the layer and, for products, the weights' type), while
//! [`crate::Session::set_profiling`] is on. The CPU counterpart of the CUDA session's kernel
//! profile (`bench --profile N`).
//!
//! Every node runs to completion before the next starts (the pool joins at the end of each
//! dispatch), so the time from one node's start to the next one's is that node's time, the
//! dispatch and the join included. Two clock reads per node (through the vDSO) and a short
//! search of the kinds seen: by estimate tens of µs on a decode step of ~1,000 nodes (not
//! measured apart; the profiled steps' totals sit within `bench`'s own tg spread).

use alloc::vec::Vec;
use std::time::Instant;

use lagoon_core::graph::{LayerWeight as L, Op, Weight};
use lagoon_core::weights::TypeName;

/// One line of a profile: a kind of node, how many ran, and their total wall time.
#[derive(Clone, Debug, PartialEq)]
pub struct OpTime {
    /// What the nodes did, e.g. `"matmul attn q/k/v/gate (x4) q8_0"` or `"attention sliding"`.
    pub op: String,
    /// Nodes of this kind that ran.
    pub calls: usize,
    /// Their wall time, milliseconds.
    pub ms: f64,
    /// Weight bytes they read (0 where not counted: nodes without weights, and the routed
    /// experts of a step of several tokens).
    pub bytes: usize,
}

/// A node's kind: what it does, the weights' type where it has weights, and how many
/// products of one input ran as one dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Key {
    what: &'static str,
    ty: Option<TypeName>,
    fused: usize,
}

impl Key {
    /// The kind of `op`: `fused` products of one input run together from it (1 otherwise),
    /// `sliding` whether its layer is a sliding-window one, `ty` its weights' type.
    pub(crate) fn of(op: &Op, fused: usize, sliding: bool, ty: Option<TypeName>) -> Key {
        let what = match *op {
            Op::Embed { .. } => "embed",
            Op::RmsNorm { .. } => "rms_norm",
            Op::MatMul { w, .. } => matmul_role(w),
            Op::Rope { .. } => "rope",
            Op::KvStore { .. } => "kv store",
            Op::Attention { .. } if sliding => "attention sliding",
            Op::Attention { .. } => "attention full",
            Op::GateMul { .. } => "attn output gate",
            Op::SwiGlu { .. } => "swiglu",
            Op::Add { .. } => "add",
            Op::Route { .. } => "route (top-k)",
            Op::Experts { .. } => "experts (routed + shared)",
            Op::LastRow { .. } => "last row",
        };
        Key { what, ty, fused }
    }
}

/// What a product's weight is for.
fn matmul_role(w: Weight) -> &'static str {
    match w {
        Weight::Output => "matmul lm_head",
        Weight::TokenEmbd | Weight::OutputNorm => "matmul other",
        Weight::Layer(_, lw) => match lw {
            L::Q | L::K | L::V | L::Gate => "matmul attn q/k/v/gate",
            L::O => "matmul attn o",
            L::FfnGate | L::FfnUp => "matmul dense gate/up",
            L::FfnDown => "matmul dense down",
            L::Router => "matmul router",
            L::GateShexp | L::UpShexp => "matmul shared gate/up",
            L::DownShexp => "matmul shared down",
            _ => "matmul other",
        },
    }
}

/// Totals per node kind, and the node now running.
#[derive(Debug, Default)]
pub(crate) struct Profile {
    lines: Vec<Line>,
    open: Option<(Key, usize, Instant)>,
}

/// A kind's totals: runs, seconds, bytes.
#[derive(Debug)]
struct Line {
    key: Key,
    calls: usize,
    secs: f64,
    bytes: usize,
}

impl Profile {
    /// Gives the running node another kind (a fused run of products that fell back to
    /// running one by one), keeping its start.
    pub(crate) fn retag(&mut self, key: Key, bytes: usize) {
        if let Some(o) = &mut self.open {
            (o.0, o.1) = (key, bytes);
        }
    }

    /// Ends the running node (if any) and starts `key`'s, which reads `bytes` of weights.
    pub(crate) fn start(&mut self, key: Key, bytes: usize) {
        let now = Instant::now();
        self.close(now);
        self.open = Some((key, bytes, now));
    }

    /// Adds `bytes` to the running node's weight bytes.
    pub(crate) fn add_bytes(&mut self, bytes: usize) {
        if let Some(o) = &mut self.open {
            o.1 += bytes;
        }
    }

    /// Ends the running node (at the end of a step).
    pub(crate) fn stop(&mut self) {
        self.close(Instant::now());
    }

    fn close(&mut self, now: Instant) {
        let Some((key, bytes, t0)) = self.open.take() else {
            return;
        };
        let secs = now.duration_since(t0).as_secs_f64();
        match self.lines.iter_mut().find(|l| l.key == key) {
            Some(l) => {
                l.calls += 1;
                l.secs += secs;
                l.bytes += bytes;
            }
            None => self.lines.push(Line {
                key,
                calls: 1,
                secs,
                bytes,
            }),
        }
    }

    /// The totals, largest first.
    pub(crate) fn report(&self) -> Vec<OpTime> {
        let mut v: Vec<OpTime> = self
            .lines
            .iter()
            .map(|l| {
                let mut op = l.key.what.to_string();
                if l.key.fused > 1 {
                    op += &format!(" (x{})", l.key.fused);
                }
                if let Some(t) = l.key.ty {
                    op += &format!(" {t}");
                }
                OpTime {
                    op,
                    calls: l.calls,
                    ms: 1e3 * l.secs,
                    bytes: l.bytes,
                }
            })
            .collect();
        v.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_by_kind_largest_first() {
        let mut p = Profile::default();
        let k = |what, ty, fused| Key { what, ty, fused };
        let q8 = Some(TypeName::Ggml(lagoon_core::dtype::GgmlType::Q8_0));
        p.start(k("rms_norm", None, 1), 0);
        p.start(k("matmul attn q/k/v/gate", q8, 3), 1000);
        std::thread::sleep(std::time::Duration::from_millis(2));
        p.start(k("rms_norm", None, 1), 0);
        p.stop();
        p.stop();
        let r = p.report();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].op, "matmul attn q/k/v/gate (x3) q8_0");
        assert_eq!((r[0].calls, r[0].bytes), (1, 1000));
        assert!(r[0].ms >= 2.0, "{}", r[0].ms);
        assert_eq!((r[1].op.as_str(), r[1].calls), ("rms_norm", 2));
    }
}
