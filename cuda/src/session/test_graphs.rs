//! Test helpers for the session's graph matchers (`qk_fusion`, `fused`): the tiny fixture
//! models' Laguna graphs and the arena ranges the planner gave their values.

use lagoon_core::config::ModelConfig;
use lagoon_core::graph::{Graph, ValueId};
use lagoon_core::laguna::{self, ModelWeights};
use lagoon_gguf::Checkpoint;

/// Calls `f(model, config, build)` for each fixture model, `build(max_tokens)` making its
/// graph for steps of at most that many tokens.
pub(super) fn each_fixture(mut f: impl FnMut(&str, &ModelConfig, &dyn Fn(usize) -> Graph)) {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/models");
    for model in ["xs2_style/model-q8_0.gguf", "hybrid_perhead/model-f16.gguf"] {
        let ckpt = Checkpoint::open(format!("{root}/{model}")).unwrap();
        let c = &ckpt.config;
        let w = ModelWeights::resolve(c, |name| ckpt.tensor(name).ok().map(|t| t.parts)).unwrap();
        f(model, c, &|max| laguna::build(c, &w.gates, max, false));
    }
}

/// Elements `[offset, offset + len)` of value `v` of `g` for `n` tokens.
pub(super) fn span(g: &Graph, v: ValueId, n: usize) -> (usize, usize) {
    let r = &g.values[v];
    (r.offset, r.offset + r.capacity(n))
}

/// Whether values `a` and `b` of `g` share arena elements for `n` tokens.
pub(super) fn overlap(g: &Graph, a: ValueId, b: ValueId, n: usize) -> bool {
    let ((a0, a1), (b0, b1)) = (span(g, a, n), span(g, b, n));
    a0 < b1 && b0 < a1
}
