//! The tensor graph: a straight-line list of nodes from a closed [`Op`] set over
//! per-token activations, with every intermediate placed in one arena by [`plan`].
//!
//! Every value is a `[max_tokens, cols]` f32 matrix (routing ids are stored as their u32
//! bits). A graph is built once per ubatch size and executed for any `n_tokens ≤
//! max_tokens`, so nothing is allocated while it runs.

pub mod plan;

use alloc::vec::Vec;

/// Index of a value in [`Graph::values`].
pub type ValueId = usize;

/// A weight the graph reads, by model role. Backends map it to their own storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Weight {
    TokenEmbd,
    OutputNorm,
    Output,
    Layer(usize, LayerWeight),
}

/// The per-layer weights of a Laguna block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerWeight {
    AttnNorm,
    Q,
    K,
    V,
    QNorm,
    KNorm,
    Gate,
    O,
    FfnNorm,
    FfnGate,
    FfnUp,
    FfnDown,
    Router,
    RouterBias,
    GateExps,
    UpExps,
    DownExps,
    GateShexp,
    UpShexp,
    DownShexp,
}

/// One node. Inputs and outputs are value ids; `out` is always a fresh value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// `out[t] = TokenEmbd[token t]`.
    Embed { out: ValueId },
    /// RMSNorm over groups of the weight's length.
    RmsNorm { x: ValueId, w: Weight, out: ValueId },
    /// `out = x · Wᵀ`.
    MatMul { x: ValueId, w: Weight, out: ValueId },
    /// Rotary embedding of each `head_dim` group of `x` at the token's absolute position,
    /// with the full- or sliding-layer table.
    Rope {
        x: ValueId,
        sliding: bool,
        out: ValueId,
    },
    /// Writes the tokens' K and V rows into layer `layer`'s cache at their positions.
    KvStore {
        layer: usize,
        k: ValueId,
        v: ValueId,
    },
    /// Causal attention of `q` over layer `layer`'s cache (windowed on sliding layers).
    Attention {
        layer: usize,
        q: ValueId,
        out: ValueId,
    },
    /// `out = o ⊙ softplus(g)`, `g` per head (broadcast over head_dim) or per element.
    GateMul {
        o: ValueId,
        g: ValueId,
        out: ValueId,
    },
    /// `out = silu(gate) ⊙ up`.
    SwiGlu {
        gate: ValueId,
        up: ValueId,
        out: ValueId,
    },
    /// `out = a + b`.
    Add {
        a: ValueId,
        b: ValueId,
        out: ValueId,
    },
    /// Router of layer `layer`: from router logits `z`, top-k expert ids (`ids`, u32 bits)
    /// and normalised weights (`weights`).
    Route {
        layer: usize,
        z: ValueId,
        ids: ValueId,
        weights: ValueId,
    },
    /// `out = scale · Σ_k weights[k] · expert_{ids[k]}(x)` over layer `layer`'s experts.
    Experts {
        layer: usize,
        x: ValueId,
        ids: ValueId,
        weights: ValueId,
        out: ValueId,
    },
    /// `out` (a one-row value) = the last token's row of `x`.
    LastRow { x: ValueId, out: ValueId },
}

impl Op {
    /// The values this node reads.
    pub fn inputs(&self) -> impl Iterator<Item = ValueId> + '_ {
        let (a, b, c): (Option<ValueId>, Option<ValueId>, Option<ValueId>) = match *self {
            Op::Embed { .. } => (None, None, None),
            Op::RmsNorm { x, .. } | Op::MatMul { x, .. } | Op::Rope { x, .. } => {
                (Some(x), None, None)
            }
            Op::KvStore { k, v, .. } => (Some(k), Some(v), None),
            Op::Attention { q, .. } => (Some(q), None, None),
            Op::GateMul { o, g, .. } => (Some(o), Some(g), None),
            Op::SwiGlu { gate, up, .. } => (Some(gate), Some(up), None),
            Op::Add { a, b, .. } => (Some(a), Some(b), None),
            Op::Route { z, .. } | Op::LastRow { x: z, .. } => (Some(z), None, None),
            Op::Experts {
                x, ids, weights, ..
            } => (Some(x), Some(ids), Some(weights)),
        };
        a.into_iter().chain(b).chain(c)
    }

    /// The values this node writes.
    pub fn outputs(&self) -> impl Iterator<Item = ValueId> + '_ {
        let (a, b) = match *self {
            Op::Embed { out }
            | Op::RmsNorm { out, .. }
            | Op::MatMul { out, .. }
            | Op::Rope { out, .. }
            | Op::Attention { out, .. }
            | Op::GateMul { out, .. }
            | Op::SwiGlu { out, .. }
            | Op::Add { out, .. }
            | Op::Experts { out, .. }
            | Op::LastRow { out, .. } => (Some(out), None),
            Op::KvStore { .. } => (None, None),
            Op::Route { ids, weights, .. } => (Some(ids), Some(weights)),
        };
        a.into_iter().chain(b)
    }
}

/// A value: `cols` f32 per token (or a single row when `one_row`), at `offset` (in f32
/// elements) in the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Value {
    pub cols: usize,
    pub one_row: bool,
    pub offset: usize,
}

impl Value {
    /// Rows this value holds when the graph runs `n_tokens` tokens.
    pub fn rows(&self, n_tokens: usize) -> usize {
        if self.one_row { 1 } else { n_tokens }
    }

    /// Elements reserved in the arena.
    pub fn capacity(&self, max_tokens: usize) -> usize {
        self.cols * self.rows(max_tokens)
    }
}

/// A planned graph.
#[derive(Clone, Debug)]
pub struct Graph {
    pub max_tokens: usize,
    pub nodes: Vec<Op>,
    pub values: Vec<Value>,
    /// The final output (logits), which stays live to the end.
    pub output: ValueId,
    /// Arena length in f32 elements.
    pub arena_len: usize,
}

/// Incremental graph construction; [`Builder::finish`] runs the planner.
#[derive(Debug)]
pub struct Builder {
    max_tokens: usize,
    nodes: Vec<Op>,
    cols: Vec<(usize, bool)>,
}

impl Builder {
    pub fn new(max_tokens: usize) -> Builder {
        Builder {
            max_tokens,
            nodes: Vec::new(),
            cols: Vec::new(),
        }
    }

    /// A new value of `cols` per token.
    pub fn value(&mut self, cols: usize) -> ValueId {
        self.cols.push((cols, false));
        self.cols.len() - 1
    }

    /// A new single-row value of `cols`.
    pub fn row_value(&mut self, cols: usize) -> ValueId {
        self.cols.push((cols, true));
        self.cols.len() - 1
    }

    /// Columns of a value.
    pub fn cols(&self, v: ValueId) -> usize {
        self.cols[v].0
    }

    pub fn push(&mut self, op: Op) {
        self.nodes.push(op);
    }

    /// Plans the arena and returns the graph with `output` kept live to the end.
    pub fn finish(self, output: ValueId) -> Graph {
        let (values, arena_len) = plan::plan(&self.nodes, &self.cols, self.max_tokens, output);
        Graph {
            max_tokens: self.max_tokens,
            nodes: self.nodes,
            values,
            output,
            arena_len,
        }
    }
}
