//! A generation session on one CUDA device, mirroring `lagoon_cpu::Session`: the same graphs
//! (one for decode, one per prefill ubatch), walked node by node with one kernel launch per
//! node (two for the experts). Everything a step touches is allocated at creation: the
//! activation arena sized by the graph planner, the KV rings, the expert scratch and the step
//! parameters. A step uploads its token ids and position (a few bytes), launches, and reads
//! the logits back.

use std::cell::Cell;

use cudarc::driver::{CudaGraph, CudaSlice, DevicePtr, sys};
use lagoon_core::config::ModelConfig;
use lagoon_core::graph::{Graph, Op};
use lagoon_core::laguna::{self, ModelWeights};
use lagoon_core::rope::RopeTable;

use crate::device::{Arg, Device, KernelTime, Profiler, blocks};
use crate::error::{CudaError, DriverContext};
use crate::manifest::{
    ActQ, GEMM_H16_TILE, GEMM_THREADS, GEMM_TILE_ROWS, GEMM_TILE_TOKENS, GemmKernels, K, WType,
    gemm_rf, gemm_wg,
};
use crate::weights::{DFfn, DMat, DeviceWeights};

mod experts;
mod fused;
mod fused_prefill;
mod qk_fusion;
#[cfg(test)]
mod test_graphs;

/// Sizes fixed at session creation.
#[derive(Clone, Copy, Debug)]
pub struct CudaSessionOptions {
    /// Context length: positions `0..n_ctx`.
    pub n_ctx: usize,
    /// Largest number of tokens evaluated in one step (prefill chunk).
    pub ubatch: usize,
    /// Keep the logits of every token, not only the last one.
    pub all_logits: bool,
    /// CUDA device ordinal.
    pub device: usize,
    /// Replay decode steps as captured CUDA graphs (the node walk is captured on the first
    /// decode step of each split-K attention count, [`split_bucket`]: six at most with the
    /// default split cap; the position and token come from device memory, so a graph serves every
    /// later step of its count).
    pub cuda_graphs: bool,
    /// Keys per block of split-K (flash-decoding) attention in steps of at most
    /// [`SPLIT_MAX_TOKENS`] tokens, the split count following the keys a step reads
    /// ([`split_bucket`]); 0 = [`SPLIT_KEYS_GQA`] where decode runs `attention_decode_gqa`,
    /// else [`SPLIT_KEYS`].
    pub attn_split_keys: usize,
    /// The fast numerics. Decode steps quantise each matrix input once (Q8_K for K-quant
    /// weights, Q8_0 for Q8_0 weights, ggml's values, as the CPU's fast path) and run integer
    /// mat-vec kernels; prefill steps of at least [`GEMM_MIN_TOKENS`] tokens multiply on the
    /// tensor cores (weights decoded exactly then rounded to f16, f16 activations, f32
    /// accumulation: llama.cpp's dequantise + cuBLAS numerics). Off: every product dots the
    /// exactly dequantised weights with f32 activations (the reference numerics, matching
    /// transformers to ~1e-6).
    pub quantized_activations: bool,
    /// Decode steps launch with programmatic dependent launch ([`Device::pdl`]): each kernel
    /// is scheduled while the one before it finishes and prefetches its weights meanwhile.
    /// On by default: on the H200 it decodes S 2.1 Q4_K_M 2-5% faster (152.0 -> 155.3 t/s
    /// before this session's kernel changes, 170.1 -> 177.3 / 178.7 after; interleaved runs,
    /// BENCHMARKS.md) with logits bitwise equal to plain launches (device test).
    /// `LAGOON_CUDA_PDL=0` / `=1` overrides it.
    pub programmatic_launch: bool,
    /// The KV cache's element type ([`KvCache`]; llama.cpp's `-ctk` / `-ctv`).
    pub kv: KvCache,
    /// Keep IQ3_XXS, IQ2_XXS and IQ2_S weights in their GGUF encoding on the device
    /// (`quant.cuh`'s codebook decoders, read by the f32 and tensor-core kernels) instead of
    /// decoding them to f32 at upload, which makes a real model of these types 8-10x larger
    /// than its file. On by default (the device tests, `quant_type_models_match_llama_cpp`,
    /// check them against llama.cpp's logits on the H200); `LAGOON_CUDA_GRID_IQ=0` turns it
    /// off, `=1` on.
    pub grid_iq: bool,
    /// Decode steps run the grid IQ types' products (IQ3_XXS, IQ2_XXS, IQ2_S) on integer
    /// mat-vec kernels against Q8_K activations (`mmvq.cuh`'s `lane_part_iq`, the CPU's
    /// vec_dot_*_q8k in dp4a form) instead of the f32-activation kernels. On by default: a
    /// UD-Q3_K_M-like S 2.1 decoded at 202 t/s with them against 104 t/s without (H200,
    /// BENCHMARKS.md session 15; device tests `quantised_mat_vec_matches_the_cpu_kernels` and
    /// `quant_type_models_match_llama_cpp` cover them); `LAGOON_CUDA_GRID_IQ_MVQ=0` turns it
    /// off, `=1` on.
    pub grid_iq_mvq: bool,
    /// Decode steps run Q5_K and IQ4_XS products on integer mat-vec kernels against Q8_K
    /// activations (`mmvq.cuh`'s `lane_part_q5k` / `lane_part_iq4xs`, the CPU's
    /// vec_dot_q5k_q8k / vec_dot_iq4_xs_q8k in dp4a form) instead of the f32-activation
    /// kernels. On by default: an IQ4_XS S 2.1 (Q5_K attn_v, Q6_K output) decoded at 238 t/s
    /// with them against 70 t/s without (H200, BENCHMARKS.md session 16; the device tests
    /// `quantised_mat_vec_matches_the_cpu_kernels` and `quant_type_models_match_llama_cpp`
    /// cover them); `LAGOON_CUDA_Q5K_IQ4XS_MVQ=0` turns it off, `=1` on.
    pub q5k_iq4xs_mvq: bool,
    /// Decode steps do the QK-norm, RoPE and KV store inside the attention kernel
    /// (`attention.cu`'s `attention_decode_qk`: one launch per layer fewer) instead of in
    /// `fused.cu`'s `qk_norm_rope_store`; the results are bitwise the same (device test
    /// `qk_attention_fusion_gives_the_unfused_bits`, H200). Off by default: it is not faster.
    /// On S 2.1 W4A16 decode the fused kernel took 10.7 us against 6.0 + 4.4 for the two it
    /// replaces (the small kernels' time is their chain of dependent loads, which the fusion
    /// keeps) and tg64 fell 213.4 -> 203.9 t/s (BENCHMARKS.md, session 14); measured again in
    /// session 37, 261.3 -> 242.4 t/s. Since session 38, where decode runs the tensor-core GQA
    /// kernel with an f16 cache, the fusion is that kernel's own form
    /// (`flash.cu`'s `attention_decode_gqa_qk_f16`, device test
    /// `gqa_qk_fusion_gives_the_unfused_bits`): level on S 2.1 W4A16 (261.5 / 261.4 t/s
    /// against 261.4 / 261.6) and Q4_K_M (312.1 / 312.5 against 313.8 / 313.7), with 14 of
    /// the 48 layers fused (the others' output is placed over the raw q, which the fusion
    /// keeps apart); still off.
    /// `LAGOON_CUDA_QK_ATTN=1` turns it on, `=0` off.
    pub qk_attention: bool,
    /// Decode steps split the RMSNorm before a run of float products (a W4A16 checkpoint's
    /// bf16 Q/K/V/gate after the attention norm) between the expert down kernel that writes
    /// its input and the products (`mmvq.cu`'s `mv_rinv_multi`): the norm's own launch goes.
    /// Within the float path's bounds, not bitwise (device test
    /// `norm_epilogue_matches_the_norm_launch`). On by default: S 2.1 W4A16 tg64 260.6 ->
    /// 262.0 t/s on the H200 (BENCHMARKS.md, session 33); other checkpoints have no such
    /// norm. `LAGOON_CUDA_NORM_EPI=0` turns it off, `=1` on.
    pub norm_epilogue: bool,
    /// Decode steps of checkpoints whose routed experts' down kernel reads Q8_0 activations
    /// beside a float shared expert (W4A16 / W8A16: CT4 or CT8 experts, bf16 or f16 shared
    /// expert) quantise the routed SwiGLU rows inside the expert gate/up kernel
    /// (`mmvq.cu`'s `moe_gate_up_mixed_q8_*`: thread-block clusters of eight blocks, one 32-row
    /// Q8_0 group each, quantised after the cluster's barrier), so the quantiser launch
    /// between the gate/up and the down kernel goes. The same bits (device test
    /// `gate_up_quantiser_gives_the_launch_bits`). Off by default: not faster (S 2.1 W4A16
    /// tg64 260.2 t/s against 261.0 with the quantiser launch, H200, BENCHMARKS.md session 37:
    /// the clustered gate/up gives back what the launch cost). `LAGOON_CUDA_GU_Q8=1` turns it
    /// on, `=0` off.
    pub gate_up_q8: bool,
}

/// Prefill products over at least this many token rows use the tensor-core kernels (with
/// [`CudaSessionOptions::quantized_activations`]); smaller ones keep the f32 kernels, which
/// read each weight row once per 8 tokens anyway.
pub const GEMM_MIN_TOKENS: usize = 16;

/// Queries per block of the tensor-core prefill attention (`FA_BQ`).
const FLASH_TILE: usize = 64;
/// The one head_dim the tensor-core prefill attention takes (`FA_D`).
const FLASH_HEAD_DIM: usize = 128;
/// Most query heads per KV head `attention_decode_gqa` takes (the rows of one m16 tile).
const GQA_MAX_GROUP: usize = 16;

/// Default keys per split-K attention block of the per-query-head kernels (a decode step over
/// a 4096-key full layer runs 16 blocks per head instead of one); they stop at
/// [`SPLIT_KEYS_CAP`] splits (hq blocks per split).
pub const SPLIT_KEYS: usize = 256;
/// Most splits the per-query-head kernels take.
pub const SPLIT_KEYS_CAP: usize = 16;
/// Default keys per split of `flash.cu`'s `attention_decode_gqa` (one block per KV head and
/// split, so 8 blocks per split on Laguna): one 64-key tile per block up to 2,048 keys, then
/// [`GQA_SPLITS`] splits (256 blocks, about two per SM on the H200).
pub const SPLIT_KEYS_GQA: usize = 64;
/// Most splits `attention_decode_gqa` takes by default (`LAGOON_CUDA_MAX_SPLITS=N`, a power
/// of two up to [`MAX_SPLITS`], sets another for A/B runs).
pub const GQA_SPLITS: usize = 32;
/// Most splits of one head's keys (the partial-state buffer's size).
pub const MAX_SPLITS: usize = 64;
// The merge kernels' shared scratch holds this many splits (merge.cuh MERGE_SPLITS_MAX) of up
// to MERGE_QUANT_HEADS heads (MERGE_MAX).
const _: () = assert!(MAX_SPLITS <= 64 && MAX_SPLITS * crate::manifest::MERGE_QUANT_HEADS <= 2048);

/// The element type of a CUDA session's KV cache (llama.cpp's `-ctk` / `-ctv` f32, f16, bf16).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvCache {
    /// f32: the reference numerics.
    #[default]
    F32,
    /// f16 (llama.cpp's default): half the cache memory and half the bytes attention reads
    /// per key. Values are rounded to nearest, finite values beyond f16's range saturating;
    /// the tensor-core attention kernels round K and V so anyway, and give the same results
    /// with this cache and the f32 one.
    F16,
    /// bf16: the memory of f16 with f32's range and 8 bits of mantissa (rounded to nearest
    /// even). The tensor-core kernels copy it as they copy the f16 cache and convert it to
    /// f16 in shared memory.
    Bf16,
    /// q8_0 (llama.cpp's `-ctk q8_0 -ctv q8_0`): blocks of 32 consecutive elements of a row
    /// as 32 int8 and an f16 scale, 8.5 bits per element (53% of f16), quantised as ggml
    /// quantises Q8_0. Each layer's K and V ring is a plane of int8 quants followed by its
    /// scales (`common.cuh`'s `kv_q8`). Read by the tensor-core attention kernels only
    /// (`flash.cu`, dequantised into f16 tiles in shared memory), so it needs the quantised
    /// path, head_dim 128 and at most 16 query heads per KV head (every Laguna model); the
    /// session says so otherwise.
    Q8_0,
}

impl KvCache {
    /// Every type, in the order [`KvCache::name`] lists them.
    pub const ALL: [KvCache; 4] = [KvCache::F32, KvCache::F16, KvCache::Bf16, KvCache::Q8_0];

    /// Bytes of one K (or V) ring of `cap` rows of `row` elements (`row` a multiple of 32
    /// for q8_0): the elements, and q8_0's scales (2 bytes per 32), rounded up to 256 bytes
    /// so that every ring starts aligned for the kernels' 16-byte copies.
    pub fn plane_bytes(self, cap: usize, row: usize) -> usize {
        let n = cap * row;
        let bytes = match self {
            KvCache::F32 => 4 * n,
            KvCache::F16 | KvCache::Bf16 => 2 * n,
            KvCache::Q8_0 => n + 2 * n.div_ceil(32),
        };
        bytes.div_ceil(256) * 256
    }

    /// Bits per cached element (q8_0: 34 bytes per 32).
    pub fn bits_per_element(self) -> f64 {
        match self {
            KvCache::F32 => 32.0,
            KvCache::F16 | KvCache::Bf16 => 16.0,
            KvCache::Q8_0 => 8.5,
        }
    }

    /// `f32`, `f16`, `bf16` or `q8_0`.
    pub fn name(self) -> &'static str {
        match self {
            KvCache::F32 => "f32",
            KvCache::F16 => "f16",
            KvCache::Bf16 => "bf16",
            KvCache::Q8_0 => "q8_0",
        }
    }

    /// The type [`KvCache::name`] names, or `None`.
    pub fn parse(s: &str) -> Option<KvCache> {
        KvCache::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// Whether `flash.cu`'s tensor-core attention takes every step of this model on this path:
/// the quantised path, head_dim [`FLASH_HEAD_DIM`], and every layer's query heads a multiple
/// of the KV heads with at most [`GQA_MAX_GROUP`] per KV head (`attention_decode_gqa`'s m16
/// tile). What the q8_0 cache needs, and what `attention_decode_gqa` needs.
fn tc_attention_ok(cfg: &ModelConfig, quantized: bool) -> bool {
    quantized
        && cfg.head_dim == FLASH_HEAD_DIM
        && cfg.n_kv_heads > 0
        && cfg
            .n_heads
            .iter()
            .all(|&h| h.is_multiple_of(cfg.n_kv_heads) && h / cfg.n_kv_heads <= GQA_MAX_GROUP)
}

/// A session switch from the environment: `VAR=1` on, `VAR=0` off, anything else (or unset)
/// the option's value.
fn env_flag(var: &str, default: bool) -> bool {
    match std::env::var(var).as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => default,
    }
}

/// Tokens [`CudaSession::decode_greedy`] queues before it waits and reads them back.
pub const GREEDY_CHUNK: usize = 256;

/// Logits each `argmax_feed` block reduces (`ARGMAX_SPAN` in `sample.cu`).
const ARGMAX_SPAN: usize = 4096;

/// The split count of split-K attention for a step that reads `keys` keys: about
/// `split_keys` keys per split, rounded up to a power of two (so the decode steps of a session
/// use at most log2(MAX_SPLITS) + 1 different counts, each captured as a graph once), at most
/// [`MAX_SPLITS`]. Any count is correct at any position: the kernels divide the keys there are
/// into that many equal runs.
pub fn split_bucket(keys: usize, split_keys: usize) -> usize {
    keys.div_ceil(split_keys.max(1))
        .clamp(1, MAX_SPLITS)
        .next_power_of_two()
        .min(MAX_SPLITS)
}
/// Steps of at most this many tokens use split-K attention (decode and tiny batches); larger
/// ones have a block per (head, token) already.
pub const SPLIT_MAX_TOKENS: usize = 4;

impl Default for CudaSessionOptions {
    fn default() -> Self {
        CudaSessionOptions {
            n_ctx: 4096,
            ubatch: 512,
            all_logits: false,
            device: 0,
            cuda_graphs: true,
            attn_split_keys: 0,
            quantized_activations: true,
            programmatic_launch: true,
            kv: KvCache::F32,
            grid_iq: true,
            grid_iq_mvq: true,
            q5k_iq4xs_mvq: true,
            qk_attention: false,
            norm_epilogue: true,
            gate_up_q8: false,
        }
    }
}

/// Which prefill products take the `gemm_rf.cu` kernels (Q4_K, and Q6_K rows of a multiple
/// of four super-blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RfUse {
    /// None: `gemm.cu` for all.
    Off,
    /// All of them, on 64-token (and 64-pair) tiles only.
    Tile64,
    /// All of them; Q4_K dense products on 128-token tiles where the grid still fills the
    /// GPU twice, and expert tiles of 128 pairs where experts average more than 64 (the
    /// default).
    All,
}

/// Prefill dense products of at least this many tokens decode their matrix once into an f16
/// copy and run `gemm_h16` (`gemm_h.cu`) instead of the per-tile decoding kernels, where
/// [`h16_shape`] takes the matrix (`LAGOON_CUDA_GEMM_H16=0` turns the path off).
const GEMM_H16_MIN_TOKENS: usize = 512;

/// Fewest rows of a matrix `gemm_h16` takes by default (`LAGOON_CUDA_H16_MIN_ROWS`
/// overrides it). The router's 256 rows give a grid of only two row tiles, but its f32
/// weights on the per-tile kernels (`gemm32_f32`: each block re-reads 4-byte weights for 32
/// tokens) took 3.9 µs per token of a 2048-token S 2.1 step.
const GEMM_H16_MIN_ROWS: usize = 256;

/// Matrices `gemm_h16` takes: columns a multiple of 32 and at least `min_rows` rows
/// (smaller ones would leave most SMs idle on 128-row tiles).
fn h16_shape(rows: usize, cols: usize, min_rows: usize) -> bool {
    rows >= min_rows && cols.is_multiple_of(32)
}

/// Longest row the fused norm + quantise kernel takes (`NQ_MAX`).
const NORM_QUANT_MAX: usize = 8192;
/// Most per-block partial sums `mv_rinv_*` takes (`mmvq.cu`: 64 float4s a warp, four warps):
/// the expert down kernel's blocks for rows up to 4,096 wide.
const NORM_PART_MAX: usize = 1024;
/// Threads of the norm + quantise kernels' one block (`NQ_THREADS` in fused.cu).
const NORM_QUANT_THREADS: u32 = 1024;

/// Largest head_dim the attention kernel holds in registers (`ATT_MAX_D`).
const MAX_HEAD_DIM: usize = 256;
/// Most experts the router kernel handles (`ROUTE_MAX_EXPERTS`).
const MAX_EXPERTS: usize = 512;
/// Most experts per token: `moe_down_q` holds the ranked slots one per lane (`COMBINE_MAX_K`
/// is 64).
const MAX_EXPERTS_USED: usize = 32;
/// CUDA's limit on the second grid dimension (tokens, or token-slot pairs).
const MAX_GRID_Y: usize = 65535;

/// Pairs per tile of the f32 grouped expert kernels (`GROUP_PAIRS`).
const GROUP_PAIRS: usize = 8;

/// Tiles of the grouped expert kernels for `n_pairs` pairs over `n_experts` experts when each
/// expert's run of pairs is cut into tiles of `group` pairs.
fn max_tiles(n_pairs: usize, n_experts: usize, group: usize) -> usize {
    n_pairs.div_ceil(group) + n_experts
}

/// One layer's KV ring: position `p` in row `p % cap`.
#[derive(Clone, Copy, Debug)]
struct LayerKv {
    k: u64,
    v: u64,
    cap: usize,
}

/// The captured decode step.
struct DecodeGraph(CudaGraph);

impl std::fmt::Debug for DecodeGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DecodeGraph")
    }
}

/// A session on one device.
#[derive(Debug)]
pub struct CudaSession {
    cfg: ModelConfig,
    opts: CudaSessionOptions,
    decode: Graph,
    prefill: Graph,
    w: DeviceWeights,
    arena_buf: CudaSlice<f32>,
    arena: u64,
    _kv: CudaSlice<f32>,
    kv: Vec<LayerKv>,
    _act: CudaSlice<f32>,
    act: u64,
    /// The f16 activations of a tensor-core product (`to_f16`), `[ubatch, widest input]`.
    _xh: CudaSlice<u16>,
    xh: u64,
    /// Which value of the graph being walked `xh` holds (consecutive products of one input
    /// convert it once; the prefill fusions write it directly).
    xh_holds: Cell<Option<usize>>,
    /// [`GEMM_H16_MIN_ROWS`], or `LAGOON_CUDA_H16_MIN_ROWS` when set.
    h16_min_rows: usize,
    /// The f16 copy of the matrix a gemm_h.cu product is working on (0: that path is off for
    /// this session's ubatch).
    _wh: CudaSlice<u16>,
    wh: u64,
    /// Per (token, slot) pair, the expert's down-projection output `[ubatch·K, H]`.
    _ys: CudaSlice<f32>,
    ys: u64,
    /// Split-K attention partial states `[SPLIT_MAX_TOKENS · max_heads · MAX_SPLITS, d + 2]`.
    _part: CudaSlice<f32>,
    part: u64,
    /// Split count per layer for small steps: [`split_bucket`] of the step's keys, at most
    /// the layer's `max_splits`.
    splits: Vec<usize>,
    /// Split count per layer for a step over the whole context.
    max_splits: Vec<usize>,
    /// Keys per split the counts aim at.
    split_keys: usize,
    /// Streaming multiprocessors of the device (tile-size choices).
    sm_count: usize,
    /// [`CudaSessionOptions::qk_attention`], after `LAGOON_CUDA_QK_ATTN`.
    qk_attention: bool,
    /// [`CudaSessionOptions::norm_epilogue`], after `LAGOON_CUDA_NORM_EPI`.
    norm_epilogue: bool,
    /// [`CudaSessionOptions::gate_up_q8`], after `LAGOON_CUDA_GU_Q8`.
    gate_up_q8: bool,
    /// [`CudaSessionOptions::grid_iq_mvq`], after `LAGOON_CUDA_GRID_IQ_MVQ`.
    grid_iq_mvq: bool,
    /// [`CudaSessionOptions::q5k_iq4xs_mvq`], after `LAGOON_CUDA_Q5K_IQ4XS_MVQ`.
    q5k_iq4xs_mvq: bool,
    /// One-token attention on the quantised path runs `attention_decode_gqa` (one block per
    /// KV head and split) instead of `attention_decode` (one per query head and split).
    gqa_attention: bool,
    /// Prefill expert grouping: pair indices sorted by expert, then the tiles.
    _groups: CudaSlice<u32>,
    sorted: u64,
    tiles: u64,
    params_buf: CudaSlice<u32>,
    params: u64,
    _ropes: CudaSlice<f32>,
    /// Device inv_freq of the full and sliding tables, with their scale and rotary dims.
    ropes: [(u64, f32, usize); 2],
    params_host: Vec<u32>,
    logits: Vec<f32>,
    n_past: usize,
    /// Captured decode steps, one per split bucket used so far (at most log2(MAX_SPLITS) + 1).
    decode_graphs: Vec<(usize, DecodeGraph)>,
    /// The same with `argmax_feed` at the end ([`CudaSession::decode_greedy`]).
    greedy_graphs: Vec<(usize, DecodeGraph)>,
    /// `argmax_feed`'s two state words, then its token list (a count and
    /// [`GREEDY_CHUNK`] tokens, as u32 pairs packed in u64 words).
    greedy_buf: CudaSlice<u64>,
    /// Quantised copy of the current matrix input (decode), and which value/format it holds.
    _xq: CudaSlice<u8>,
    xq: u64,
    xq_holds: Cell<Option<(usize, ActQ)>>,
    /// Quantised expert activations `[K + 1, stride]` (decode).
    _actq: CudaSlice<u8>,
    actq: u64,
    /// The decode step's expert ids and weights, copied by the fused gate/up kernel.
    _route_copy: CudaSlice<f32>,
    route_copy: u64,
    /// NORM_EPI: the expert down kernel's per-block sums of x² for the products after the
    /// next norm ([`NORM_PART_MAX`] floats), and the norm node whose work that kernel took
    /// (set by the experts' fusion, taken by the norm's).
    _norm_part: CudaSlice<f32>,
    norm_part: u64,
    norm_epi: Cell<Option<usize>>,
    /// Per-kernel GPU time of the profiled steps (`Some` while profiling).
    profile: Option<Vec<KernelTime>>,
    /// How many nodes of the decode graph read each value (the fusions skip values only
    /// their fused partner reads).
    readers: Vec<u32>,
    /// The same for the prefill graph.
    prefill_readers: Vec<u32>,
    /// Multi-node decode fusions on (`LAGOON_CUDA_NO_FUSE=1` turns them off, for bisecting;
    /// the quantised products still run one node at a time).
    fuse: bool,
    /// [`CudaSessionOptions::programmatic_launch`], or `LAGOON_CUDA_PDL` when set.
    pdl: bool,
    /// Whether Q4_K / Q6_K prefill products take `gemm_rf.cu` (weights decoded into the mma
    /// fragments, a cp.async ring) instead of `gemm.cu`; `LAGOON_CUDA_GEMM_RF=0` / `=64`
    /// select the others (for A/B measurements).
    gemm_rf: RfUse,
    /// Whether the `gemm_rf.cu` products of the types `gemm_wg` takes run on the wgmma
    /// kernels (sm_90 devices, where gemm_rf.cu is compiled for sm_90a): off by default, on
    /// with `LAGOON_CUDA_GEMM_WG=1`. They are correct but not faster yet (BENCHMARKS.md:
    /// the per-lane weight decode, not the mma, bounds both mainloops).
    gemm_wg: bool,
    /// Whether Q6_K's 128-pair expert tiles run on the 96-pair `gemm_rf.cu` kernels (one pass
    /// for up to 96 pairs) instead of two 64-pair passes: off by default, on with
    /// `LAGOON_CUDA_RF96=1`. They decode each weight once instead of twice (28% fewer
    /// instructions) but are slower (S 2.1 Q6_K down 15.8 -> 26.6 µs/token; ncu: L1 hit rate
    /// 66% -> 26%, as their 227 KiB of shared memory leaves L1 too small for the 8-byte
    /// cp.async.ca row copies; BENCHMARKS.md).
    rf96: bool,
    /// Whether CT4 (W4A16) prefill products run on `gemm_rf.cu`'s CT4 kernels (the default:
    /// S 2.1 W4A16 pp4096 4,030 -> 6,901 t/s at ubatch 2048, H200, BENCHMARKS.md) or on
    /// `gemm.cu`'s (`LAGOON_CUDA_RF_CT4=0`, [`CudaSession::set_rf_ct4`]).
    rf_ct4: bool,
    /// The same for CT8 (W8A16 / W8A8): `gemm_rf.cu`'s CT8 kernels by default, `gemm.cu`'s with
    /// `LAGOON_CUDA_RF_CT8=0` ([`CudaSession::set_rf_ct8`]).
    rf_ct8: bool,
    /// Whether a decode run of products of one input in two weight types that have an
    /// `mv2_*` kernel ([`WType::mv_pair`]: Q4_K_M's Q6_K value projections) is one launch
    /// (the default) or one per type (`LAGOON_CUDA_MV_PAIRS=0`, A/B runs).
    mv_pairs: bool,
    /// Batch-1 expert down products per warp in the one-block-per-output-row kernels
    /// (`moe_down_r_*`, `mmvq.cu`'s `moe_down_rows`, `LAGOON_CUDA_DOWN_ROWS=1|2`), or 0 (the
    /// default) for `moe_down_q`'s one warp per output row. Opt-in because slower: S 2.1
    /// Q4_K_M tg64 269.3-269.5 t/s with 0 against 253.4-255.3 with 2; before the slot order
    /// moved to the gate/up kernel, 252.8-254.0 with 0, 239.7-241.0 with 2 and 205.0-207.7
    /// with 1 (H200, interleaved runs; BENCHMARKS.md "Session 18").
    down_rows: usize,

    dev: Device,
}

impl CudaSession {
    /// Opens the device, uploads the weights and allocates everything a step needs.
    pub fn new(
        cfg: &ModelConfig,
        w: &ModelWeights<'_>,
        opts: CudaSessionOptions,
    ) -> Result<CudaSession, CudaError> {
        let opts = CudaSessionOptions {
            ubatch: opts.ubatch.max(1),
            n_ctx: opts.n_ctx.max(1),
            ..opts
        };
        let unsupported = |what: String| Err(CudaError::Unsupported { what });
        if cfg.head_dim > MAX_HEAD_DIM {
            return unsupported(format!(
                "head_dim {} (at most {MAX_HEAD_DIM})",
                cfg.head_dim
            ));
        }
        if cfg.n_experts > MAX_EXPERTS {
            return unsupported(format!("{} experts (at most {MAX_EXPERTS})", cfg.n_experts));
        }
        if cfg.n_experts_used > MAX_EXPERTS_USED {
            return unsupported(format!(
                "{} experts per token (at most {MAX_EXPERTS_USED})",
                cfg.n_experts_used
            ));
        }
        if opts.ubatch > MAX_GRID_Y
            || max_tiles(opts.ubatch * cfg.n_experts_used, cfg.n_experts, GROUP_PAIRS) > MAX_GRID_Y
        {
            return unsupported(format!(
                "ubatch {} with {} experts per token (grids are limited to {MAX_GRID_Y} tokens and {MAX_GRID_Y} expert tiles); use a smaller ubatch",
                opts.ubatch, cfg.n_experts_used
            ));
        }
        if opts.kv == KvCache::Q8_0 && !tc_attention_ok(cfg, opts.quantized_activations) {
            return unsupported(format!(
                "a q8_0 KV cache for head_dim {} and up to {} query heads over {} KV heads{}: only the tensor-core attention kernels read it, which need the quantised path (not the reference path), head_dim {FLASH_HEAD_DIM} and at most {GQA_MAX_GROUP} query heads per KV head; use an f16 or bf16 cache (--kv f16)",
                cfg.head_dim,
                cfg.n_heads.iter().max().copied().unwrap_or(0),
                cfg.n_kv_heads,
                if opts.quantized_activations {
                    ""
                } else {
                    " on the reference path"
                }
            ));
        }
        let dev = Device::new(opts.device)?;
        let grid_iq = env_flag("LAGOON_CUDA_GRID_IQ", opts.grid_iq);
        // `LAGOON_CUDA_GRAPHS=0` replays nothing: every decode step walks its kernels (A/B runs).
        let opts = CudaSessionOptions {
            cuda_graphs: env_flag("LAGOON_CUDA_GRAPHS", opts.cuda_graphs),
            ..opts
        };
        let weights = DeviceWeights::upload(&dev, w, grid_iq)?;
        let decode = laguna::build(cfg, &w.gates, 1, opts.all_logits);
        let prefill = laguna::build(cfg, &w.gates, opts.ubatch, opts.all_logits);
        let s = &dev.stream;
        let arena_buf = s
            .alloc_zeros::<f32>(decode.arena_len.max(prefill.arena_len).max(1))
            .during("allocating the activation arena")?;
        let row = cfg.n_kv_heads * cfg.head_dim;
        let caps: Vec<usize> = (0..cfg.n_layers)
            .map(|l| {
                if cfg.is_sliding(l) {
                    opts.n_ctx.min(cfg.sliding_window - 1 + opts.ubatch)
                } else {
                    opts.n_ctx
                }
            })
            .collect();
        // Every layer's K and V planes (each 256-byte aligned); the buffer is allocated as f32
        // words whatever the element type.
        let kv_bytes: usize = caps
            .iter()
            .map(|&c| 2 * opts.kv.plane_bytes(c, row))
            .sum::<usize>()
            .max(4);
        // Checked before allocating: a context too long for what the weights left says so.
        let (free, total) = dev
            .ctx
            .mem_get_info()
            .during("reading the device's free memory")?;
        if kv_bytes > free {
            let full = cfg.n_layers - (0..cfg.n_layers).filter(|&l| cfg.is_sliding(l)).count();
            return Err(CudaError::OutOfMemory {
                what: "the KV cache",
                need: kv_bytes as u64,
                free: free as u64,
                total: total as u64,
                hint: format!(
                    "n_ctx {} takes {} KiB per token in each of the {full} full-attention layers{}",
                    opts.n_ctx,
                    (2.0 * row as f64 * opts.kv.bits_per_element() / 8.0 / 1024.0).ceil(),
                    match opts.kv {
                        KvCache::F32 => {
                            "; use a smaller n_ctx or a 16-bit cache (KvCache::F16, half the bytes)"
                        }
                        KvCache::F16 | KvCache::Bf16 => {
                            "; use a smaller n_ctx or a q8_0 cache (KvCache::Q8_0, 53% of the bytes)"
                        }
                        KvCache::Q8_0 => "; use a smaller n_ctx",
                    }
                ),
            });
        }
        let kv_buf = s
            .alloc_zeros::<f32>(kv_bytes / 4)
            .during("allocating the KV cache")?;
        let act_buf = s
            .alloc_zeros::<f32>((opts.ubatch.max(2) * cfg.n_experts_used * cfg.expert_ffn).max(1))
            .during("allocating the expert scratch")?;
        // The widest input of a tensor-core product: the matrices' inputs and the experts'.
        let widest = prefill
            .nodes
            .iter()
            .filter_map(|op| match *op {
                Op::MatMul { x, .. } => Some(prefill.values[x].cols),
                _ => None,
            })
            .chain([cfg.hidden_size])
            .max()
            .unwrap_or(0);
        let xh_buf = s
            .alloc_zeros::<u16>((opts.ubatch * widest).max(1))
            .during("allocating the f16 activation scratch")?;
        // The largest matrix gemm_h.cu takes (an f16 copy per product; none when the ubatch
        // is too small for that path).
        let h16_min_rows = std::env::var("LAGOON_CUDA_H16_MIN_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(GEMM_H16_MIN_ROWS);
        let wh_len = if opts.quantized_activations
            && opts.ubatch >= GEMM_H16_MIN_TOKENS
            && std::env::var_os("LAGOON_CUDA_GEMM_H16").is_none_or(|v| v != "0")
        {
            prefill
                .nodes
                .iter()
                .filter_map(|op| match *op {
                    // Products over the step's tokens (not the last-token lm_head).
                    Op::MatMul { x, w, .. }
                        if prefill.values[x].rows(opts.ubatch) >= GEMM_H16_MIN_TOKENS =>
                    {
                        let m = weights.mat(w);
                        h16_shape(m.rows, m.cols, h16_min_rows).then_some(m.rows * m.cols)
                    }
                    _ => None,
                })
                .max()
                .unwrap_or(0)
        } else {
            0
        };
        let wh_buf = s
            .alloc_zeros::<u16>(wh_len.max(1))
            .during("allocating the f16 weight scratch")?;
        let ys_buf = s
            .alloc_zeros::<f32>((opts.ubatch * cfg.n_experts_used * cfg.hidden_size).max(1))
            .during("allocating the expert outputs")?;
        let part_buf = s
            .alloc_zeros::<f32>(
                SPLIT_MAX_TOKENS * cfg.max_heads() * MAX_SPLITS * (cfg.head_dim + 2),
            )
            .during("allocating the attention partials")?;
        // Decode attention on the tensor cores, one block per KV head and split
        // (`attention_decode_gqa`): the quantised path's one-token steps, head_dim 128 and at
        // most 16 query heads per KV head. `LAGOON_CUDA_ATT_GQA=0` keeps the per-query-head
        // kernel (A/B runs); the reference path keeps it and its split counts.
        // The q8_0 cache has no other decode kernel, so `LAGOON_CUDA_ATT_GQA=0` leaves it on.
        let gqa_attention = (opts.kv == KvCache::Q8_0 || env_flag("LAGOON_CUDA_ATT_GQA", true))
            && tc_attention_ok(cfg, opts.quantized_activations);
        let split_keys = match (opts.attn_split_keys, gqa_attention) {
            (0, true) => SPLIT_KEYS_GQA,
            (0, false) => SPLIT_KEYS,
            (k, _) => k,
        };
        let split_cap = match std::env::var("LAGOON_CUDA_MAX_SPLITS").map(|v| v.parse::<usize>()) {
            Ok(Ok(n)) if n.is_power_of_two() && n <= MAX_SPLITS => n,
            _ if gqa_attention => GQA_SPLITS,
            _ => SPLIT_KEYS_CAP,
        };
        let sm_count = dev.sm_count()? as usize;
        let max_splits: Vec<usize> = (0..cfg.n_layers)
            .map(|l| {
                let keys = if cfg.is_sliding(l) {
                    cfg.sliding_window.min(opts.n_ctx)
                } else {
                    opts.n_ctx
                };
                keys.div_ceil(split_keys).clamp(1, split_cap)
            })
            .collect();
        let max_pairs = opts.ubatch * cfg.n_experts_used;
        let groups_buf = s
            .alloc_zeros::<u32>(
                max_pairs + 3 * max_tiles(max_pairs, cfg.n_experts, GROUP_PAIRS) + 1,
            )
            .during("allocating the expert grouping")?;
        let params_buf = s
            .alloc_zeros::<u32>(2 + opts.ubatch)
            .during("allocating the step parameters")?;
        let greedy_buf = s
            .alloc_zeros::<u64>(2 + (1 + GREEDY_CHUNK).div_ceil(2))
            .during("allocating the greedy decoder's state")?;
        let tables = [
            RopeTable::new(&cfg.rope_full),
            RopeTable::new(&cfg.rope_sliding),
        ];
        let mut freqs = tables[0].inv_freq.clone();
        freqs.extend_from_slice(&tables[1].inv_freq);
        let mut ropes_buf = s
            .alloc_zeros::<f32>(freqs.len().max(1))
            .during("allocating the RoPE tables")?;
        if !freqs.is_empty() {
            s.memcpy_htod(&freqs, &mut ropes_buf)
                .during("copying the RoPE tables")?;
        }
        // Raw addresses for kernel arguments; the slices stay owned by the session. (Event
        // tracking is off, so `device_ptr` records nothing.)
        let arena = arena_buf.device_ptr(s).0;
        let kv_base = kv_buf.device_ptr(s).0;
        let act = act_buf.device_ptr(s).0;
        let xh = xh_buf.device_ptr(s).0;
        let ys = ys_buf.device_ptr(s).0;
        let sorted = groups_buf.device_ptr(s).0;
        let part = part_buf.device_ptr(s).0;
        let tiles = sorted + 4 * max_pairs as u64;
        let params = params_buf.device_ptr(s).0;
        let ropes_base = ropes_buf.device_ptr(s).0;
        let mut kv = Vec::with_capacity(cfg.n_layers);
        let mut off = 0u64;
        for &cap in &caps {
            let bytes = opts.kv.plane_bytes(cap, row) as u64;
            kv.push(LayerKv {
                k: kv_base + off,
                v: kv_base + off + bytes,
                cap,
            });
            off += 2 * bytes;
        }
        let ropes = [
            (ropes_base, tables[0].scale, tables[0].rotary_dim),
            (
                ropes_base + 4 * tables[0].inv_freq.len() as u64,
                tables[1].scale,
                tables[1].rotary_dim,
            ),
        ];
        let out_len = prefill.values[prefill.output].capacity(opts.ubatch);
        let (xq_len, actq_len) = quant_scratch(cfg, &decode, &weights);
        let readers = graph_readers(&decode);
        let prefill_readers = graph_readers(&prefill);
        let xq_buf = s
            .alloc_zeros::<u8>(xq_len.max(1))
            .during("allocating the activation quantisation scratch")?;
        let actq_buf = s
            .alloc_zeros::<u8>(actq_len.max(1))
            .during("allocating the expert activation quantisation scratch")?;
        let route_buf = s
            .alloc_zeros::<f32>(3 * cfg.n_experts_used.max(1))
            .during("allocating the expert route copy")?;
        let xq = xq_buf.device_ptr(s).0;
        let actq = actq_buf.device_ptr(s).0;
        let route_copy = route_buf.device_ptr(s).0;
        let norm_part_buf = s
            .alloc_zeros::<f32>(NORM_PART_MAX)
            .during("allocating the norm's partial sums")?;
        let norm_part = norm_part_buf.device_ptr(s).0;
        s.synchronize().during("finishing session set-up")?;
        Ok(CudaSession {
            cfg: cfg.clone(),
            opts,
            decode,
            prefill,
            w: weights,
            arena_buf,
            arena,
            _kv: kv_buf,
            kv,
            _act: act_buf,
            act,
            _xh: xh_buf,
            xh,
            xh_holds: Cell::new(None),
            h16_min_rows,
            wh: if wh_len > 0 {
                wh_buf.device_ptr(s).0
            } else {
                0
            },
            _wh: wh_buf,
            _ys: ys_buf,
            ys,
            _part: part_buf,
            part,
            splits: vec![1; max_splits.len()],
            max_splits,
            split_keys,
            sm_count,
            qk_attention: env_flag("LAGOON_CUDA_QK_ATTN", opts.qk_attention),
            norm_epilogue: env_flag("LAGOON_CUDA_NORM_EPI", opts.norm_epilogue),
            gate_up_q8: env_flag("LAGOON_CUDA_GU_Q8", opts.gate_up_q8),
            grid_iq_mvq: env_flag("LAGOON_CUDA_GRID_IQ_MVQ", opts.grid_iq_mvq),
            q5k_iq4xs_mvq: env_flag("LAGOON_CUDA_Q5K_IQ4XS_MVQ", opts.q5k_iq4xs_mvq),
            gqa_attention,
            _groups: groups_buf,
            sorted,
            tiles,
            params_buf,
            params,
            _ropes: ropes_buf,
            ropes,
            params_host: vec![0; 2 + opts.ubatch],
            logits: vec![0.0; out_len],
            n_past: 0,
            decode_graphs: Vec::new(),
            greedy_graphs: Vec::new(),
            greedy_buf,
            _xq: xq_buf,
            xq,
            xq_holds: Cell::new(None),
            _actq: actq_buf,
            actq,
            _route_copy: route_buf,
            route_copy,
            _norm_part: norm_part_buf,
            norm_part,
            norm_epi: Cell::new(None),
            profile: None,
            readers,
            prefill_readers,
            fuse: std::env::var_os("LAGOON_CUDA_NO_FUSE").is_none_or(|v| v != "1"),
            gemm_rf: match std::env::var_os("LAGOON_CUDA_GEMM_RF") {
                Some(v) if v == "0" => RfUse::Off,
                Some(v) if v == "64" => RfUse::Tile64,
                _ => RfUse::All,
            },
            gemm_wg: dev.arch == "sm_90"
                && std::env::var_os("LAGOON_CUDA_GEMM_WG").is_some_and(|v| v == "1"),
            rf96: std::env::var_os("LAGOON_CUDA_RF96").is_some_and(|v| v == "1"),
            rf_ct4: std::env::var_os("LAGOON_CUDA_RF_CT4").is_none_or(|v| v != "0"),
            rf_ct8: std::env::var_os("LAGOON_CUDA_RF_CT8").is_none_or(|v| v != "0"),
            mv_pairs: env_flag("LAGOON_CUDA_MV_PAIRS", true),
            down_rows: match std::env::var("LAGOON_CUDA_DOWN_ROWS").as_deref() {
                Ok("1") => 1,
                Ok("2") => 2,
                _ => 0,
            },
            pdl: match std::env::var_os("LAGOON_CUDA_PDL") {
                Some(v) if v == "0" => false,
                Some(v) if v == "1" => true,
                _ => opts.programmatic_launch,
            },

            dev,
        })
    }

    /// Tokens evaluated so far (the next token's position).
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Forgets the context.
    pub fn reset(&mut self) {
        self.n_past = 0;
    }

    /// The options the session was created with.
    pub fn options(&self) -> CudaSessionOptions {
        self.opts
    }

    /// Bytes of weights on the device, and how many matrices were decoded to f32 at upload.
    pub fn weight_bytes(&self) -> (usize, usize) {
        (self.w.n_bytes, self.w.n_decoded)
    }

    /// The device's streaming-read bandwidth in GB/s ([`Device::read_bandwidth`] over a
    /// `bytes` buffer, allocated for the measurement and freed).
    pub fn read_bandwidth(&self, bytes: usize) -> Result<f64, CudaError> {
        self.dev.read_bandwidth(bytes)
    }

    /// The device's architecture (`sm_90`).
    pub fn arch(&self) -> &str {
        &self.dev.arch
    }

    /// Evaluates up to `ubatch` tokens at the next positions. Returns the logits: one row
    /// per token with `all_logits`, else the last token's row.
    pub fn step(&mut self, tokens: &[u32]) -> Result<&[f32], CudaError> {
        let n = tokens.len();
        if n == 0 || n > self.opts.ubatch {
            return Err(CudaError::BadBatch {
                n_tokens: n,
                ubatch: self.opts.ubatch,
            });
        }
        if self.n_past + n > self.opts.n_ctx {
            return Err(CudaError::ContextFull {
                n_past: self.n_past,
                n_tokens: n,
                n_ctx: self.opts.n_ctx,
            });
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            return Err(CudaError::BadToken {
                token: t,
                vocab: self.cfg.vocab_size,
            });
        }
        self.params_host[0] = self.n_past as u32;
        self.params_host[1] = n as u32;
        self.params_host[2..2 + n].copy_from_slice(tokens);
        let s = &self.dev.stream;
        let mut pv = self.params_buf.slice_mut(..2 + n);
        s.memcpy_htod(&self.params_host[..2 + n], &mut pv)
            .during("uploading the step's tokens")?;
        self.dev.pdl.set(self.pdl && n == 1);
        // Split-K attention sized for the keys this step reads, not for the whole context.
        // (With the whole context's count, S 2.1 W4A16 decoded 3% slower at depth 0 in a 32k
        // context than in a short one; sized per step, 220.7 t/s there against 219.2-221.5:
        // BENCHMARKS.md sessions 14 and 15.)
        let bucket = split_bucket(self.n_past + n, self.split_keys);
        for (s, &m) in self.splits.iter_mut().zip(&self.max_splits) {
            *s = bucket.min(m);
        }
        if self.profile.is_some() {
            // Queue the whole step behind a spin kernel, so the kernels then run back to back
            // and the events between them time the kernels, not the host's launch rate.
            let graph = if n == 1 { &self.decode } else { &self.prefill };
            let cycles = 40_000i64 * (graph.nodes.len() as i64 + 8);
            self.dev
                .launch(K::Spin, (1, 1), 1, &[Arg::P(cycles as u64)])?;
            let mut p = Profiler::default();
            p.mark("", &self.dev.ctx, &self.dev.stream)?;
            *self.dev.profiler.borrow_mut() = Some(p);
            let walked = self.run(graph, n);
            let p = self.dev.profiler.borrow_mut().take();
            walked?;
            if let (Some(mut p), Some(acc)) = (p, self.profile.as_mut()) {
                p.collect(acc)?;
            }
        } else if n == 1 && self.opts.cuda_graphs {
            if !self.decode_graphs.iter().any(|(b, _)| *b == bucket) {
                let g = self.capture_decode(false)?;
                self.decode_graphs.push((bucket, g));
            }
            if let Some((_, g)) = self.decode_graphs.iter().find(|(b, _)| *b == bucket) {
                g.0.launch().during("replaying the decode graph")?;
            }
        } else {
            let graph = if n == 1 { &self.decode } else { &self.prefill };
            self.run(graph, n)?;
        }
        let graph = if n == 1 { &self.decode } else { &self.prefill };
        let s = &self.dev.stream;
        let out = graph.values[graph.output];
        let len = out.rows(n) * out.cols;
        let view = self.arena_buf.slice(out.offset..out.offset + len);
        s.memcpy_dtoh(&view, &mut self.logits[..len])
            .during("reading the logits back")?;
        s.synchronize().during("finishing the step")?;
        self.n_past += n;
        Ok(&self.logits[..len])
    }

    /// Greedy decoding on the device: feeds `token` and then each chosen token back, `n`
    /// steps in all, and returns the `n` tokens chosen (each the argmax of its step's logits,
    /// as [`lagoon_core::sample::argmax`] picks it). The decode graph ends with
    /// `argmax_feed` (`sample.cu`), which writes the token where the next step reads it, so
    /// the steps are queued back to back and the host waits once per [`GREEDY_CHUNK`]
    /// tokens instead of copying every step's logits back and choosing on the CPU. The
    /// tokens are those [`CudaSession::step`] plus a host argmax would give; the steps'
    /// logits are not read back. Without CUDA graphs or while profiling it runs exactly
    /// that loop instead.
    pub fn decode_greedy(&mut self, token: u32, n: usize) -> Result<Vec<u32>, CudaError> {
        if self.n_past + n > self.opts.n_ctx {
            return Err(CudaError::ContextFull {
                n_past: self.n_past,
                n_tokens: n,
                n_ctx: self.opts.n_ctx,
            });
        }
        if token as usize >= self.cfg.vocab_size {
            return Err(CudaError::BadToken {
                token,
                vocab: self.cfg.vocab_size,
            });
        }
        let mut out = Vec::with_capacity(n);
        if !self.opts.cuda_graphs || self.profile.is_some() {
            let mut t = token;
            for _ in 0..n {
                t = lagoon_core::sample::argmax(self.step(&[t])?);
                out.push(t);
            }
            return Ok(out);
        }
        let mut t = token;
        while out.len() < n {
            let m = (n - out.len()).min(GREEDY_CHUNK);
            self.params_host[0] = self.n_past as u32;
            self.params_host[1] = 1;
            self.params_host[2] = t;
            let s = &self.dev.stream;
            let mut pv = self.params_buf.slice_mut(..3);
            s.memcpy_htod(&self.params_host[..3], &mut pv)
                .during("uploading the step's token")?;
            let mut count = self.greedy_buf.slice_mut(2..3);
            s.memset_zeros(&mut count)
                .during("clearing the greedy token list")?;
            self.dev.pdl.set(self.pdl);
            for i in 0..m {
                let bucket = split_bucket(self.n_past + i + 1, self.split_keys);
                if !self.greedy_graphs.iter().any(|(b, _)| *b == bucket) {
                    for (sp, &mx) in self.splits.iter_mut().zip(&self.max_splits) {
                        *sp = bucket.min(mx);
                    }
                    let g = self.capture_decode(true)?;
                    self.greedy_graphs.push((bucket, g));
                }
                if let Some((_, g)) = self.greedy_graphs.iter().find(|(b, _)| *b == bucket) {
                    g.0.launch().during("replaying the greedy decode graph")?;
                }
            }
            let words = (1 + m).div_ceil(2);
            let view = self.greedy_buf.slice(2..2 + words);
            let mut list = vec![0u64; words];
            let s = &self.dev.stream;
            s.memcpy_dtoh(&view, &mut list)
                .during("reading the greedy tokens back")?;
            s.synchronize().during("finishing the greedy steps")?;
            let toks: Vec<u32> = list
                .iter()
                .flat_map(|w| [*w as u32, (*w >> 32) as u32])
                .collect();
            if toks[0] as usize != m {
                return Err(CudaError::Unsupported {
                    what: format!("a greedy decode that chose {} tokens in {m} steps", toks[0]),
                });
            }
            out.extend_from_slice(&toks[1..1 + m]);
            self.n_past += m;
            t = *out.last().unwrap_or(&t);
        }
        Ok(out)
    }

    /// Launches `argmax_feed` over the decode step's logits (the end of a greedy graph).
    fn argmax_feed(&self) -> Result<(), CudaError> {
        let g = &self.decode;
        let out = g.values[g.output];
        let v = self.cfg.vocab_size;
        let state = self.greedy_buf.device_ptr(&self.dev.stream).0;
        self.dev.launch(
            K::ArgmaxFeed,
            (v.div_ceil(ARGMAX_SPAN) as u32, 1),
            256,
            &[
                Arg::P(self.arena + 4 * out.offset as u64),
                Arg::I(v as i32),
                Arg::P(state),
                Arg::P(self.params),
                Arg::P(state + 16),
            ],
        )
    }

    /// Evaluates any number of tokens in ubatch chunks, calling `f` with each chunk's logits.
    pub fn prefill(&mut self, tokens: &[u32], mut f: impl FnMut(&[f32])) -> Result<(), CudaError> {
        if self.n_past + tokens.len() > self.opts.n_ctx {
            return Err(CudaError::ContextFull {
                n_past: self.n_past,
                n_tokens: tokens.len(),
                n_ctx: self.opts.n_ctx,
            });
        }
        for chunk in tokens.chunks(self.opts.ubatch) {
            f(self.step(chunk)?);
        }
        Ok(())
    }

    /// Turns the multi-node fusions of both step kinds on (the default) or off, for
    /// bisecting and for tests that compare the two (the environment's
    /// `LAGOON_CUDA_NO_FUSE=1` sets the same at creation). The decode graphs are captured
    /// again from the next decode step.
    pub fn set_fusions(&mut self, on: bool) {
        if self.fuse != on {
            self.fuse = on;
            self.decode_graphs.clear();
            self.greedy_graphs.clear();
        }
    }

    /// Runs CT4 prefill products on `gemm_rf.cu`'s CT4 kernels (`true`, the default) or
    /// `gemm.cu`'s (`LAGOON_CUDA_RF_CT4=0` sets `false` at creation): for A/B runs and tests.
    pub fn set_rf_ct4(&mut self, on: bool) {
        self.rf_ct4 = on;
    }

    /// Runs CT8 prefill products on `gemm_rf.cu`'s CT8 kernels (`true`, the default) or
    /// `gemm.cu`'s (`LAGOON_CUDA_RF_CT8=0` sets `false` at creation).
    pub fn set_rf_ct8(&mut self, on: bool) {
        self.rf_ct8 = on;
    }

    /// Starts (`true`) or stops timing every kernel of the following steps (which then run
    /// without CUDA graphs, each queued behind a spin kernel). Stopping returns the totals.
    pub fn set_profiling(&mut self, on: bool) -> Option<Vec<KernelTime>> {
        let prev = self.profile.take();
        if on {
            self.profile = Some(Vec::new());
        }
        prev
    }

    /// Captures the decode graph's launches into a CUDA graph (nothing runs while capturing).
    fn capture_decode(&self, greedy: bool) -> Result<DecodeGraph, CudaError> {
        let s = &self.dev.stream;
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .during("starting the decode-graph capture")?;
        let walked = self
            .run(&self.decode, 1)
            .and_then(|()| if greedy { self.argmax_feed() } else { Ok(()) });
        // End the capture even when a launch failed, so the stream is usable again.
        let ended = s.end_capture(sys::CUgraphInstantiate_flags(0));
        walked?;
        match ended.during("instantiating the decode graph")? {
            Some(g) => Ok(DecodeGraph(g)),
            None => Err(CudaError::Unsupported {
                what: "an empty decode graph".into(),
            }),
        }
    }

    /// The arguments `attention` and `attention_decode` (and `attention_decode_qk`'s first
    /// ones) take: queries at `q`, output (or split states in `part`) at `out`, the fused
    /// output gate of `attention_decode` (values, columns; None: none).
    fn attention_args(
        &self,
        layer: usize,
        q: u64,
        out: u64,
        gate: Option<(u64, usize)>,
    ) -> [Arg; 13] {
        use Arg::{I, P};
        let c = &self.cfg;
        let kv = self.kv[layer];
        let window = if c.is_sliding(layer) {
            c.sliding_window
        } else {
            0
        };
        [
            P(q),
            P(kv.k),
            P(kv.v),
            P(out),
            P(self.part),
            I(kv.cap as i32),
            I(c.n_heads[layer] as i32),
            I(c.n_kv_heads as i32),
            I(c.head_dim as i32),
            I(window as i32),
            P(self.params),
            P(gate.map_or(0, |g| g.0)),
            I(gate.map_or(0, |g| g.1 as i32)),
        ]
    }

    /// Launches the attention kernel of `layer` for `n` tokens: queries at `q`, output at
    /// `out` (`split` = 1) or split-K partial states in `part` (`split` > 1).
    fn attention(
        &self,
        layer: usize,
        q: u64,
        out: u64,
        n: usize,
        split: usize,
        gate: Option<(u64, usize)>,
        oh: u64,
    ) -> Result<(), CudaError> {
        use Arg::{I, P};
        let c = &self.cfg;
        let kv = self.kv[layer];
        let window = if c.is_sliding(layer) {
            c.sliding_window
        } else {
            0
        };
        if self.prefill_attention(n, split) {
            return self.dev.launch(
                self.kv_kernel(
                    K::AttentionPrefill,
                    K::AttentionPrefillF16,
                    K::AttentionPrefillBf16,
                    Some(K::AttentionPrefillQ8_0),
                )?,
                (c.n_heads[layer] as u32, n.div_ceil(FLASH_TILE) as u32),
                128,
                &[
                    P(q),
                    P(kv.k),
                    P(kv.v),
                    P(out),
                    I(kv.cap as i32),
                    I(c.n_heads[layer] as i32),
                    I(c.n_kv_heads as i32),
                    I(window as i32),
                    I(n as i32),
                    P(self.params),
                    // The fused epilogue: gate (null: none) and f16 output (null: f32 out).
                    P(gate.map_or(0, |g| g.0)),
                    I(gate.map_or(0, |g| g.1 as i32)),
                    P(oh),
                ],
            );
        }
        // One token on the quantised path: the key-per-lane decode kernel (same outputs).
        let decode = self.decode_attention(n);
        let args = self.attention_args(layer, q, out, gate);
        if decode && self.gqa_attention {
            // The position and the gate before the kernel's wait when the launch before it
            // waited before it triggered (flash.cu's `early`).
            let early = self.dev.last_launch().is_some_and(K::waits_then_triggers);
            let mut a = [Arg::I(0); 14];
            a[..13].copy_from_slice(&args);
            a[13] = Arg::I(early as i32);
            return self.dev.launch3(
                self.kv_kernel(
                    K::AttentionDecodeGqa,
                    K::AttentionDecodeGqaF16,
                    K::AttentionDecodeGqaBf16,
                    Some(K::AttentionDecodeGqaQ8_0),
                )?,
                (c.n_kv_heads as u32, 1, split as u32),
                128,
                &a,
            );
        }
        let (kernel, n_args) = if decode {
            (
                self.kv_kernel(
                    K::AttentionDecode,
                    K::AttentionDecodeF16,
                    K::AttentionDecodeBf16,
                    None,
                )?,
                args.len(),
            )
        } else {
            (
                self.kv_kernel(K::Attention, K::AttentionF16, K::AttentionBf16, None)?,
                args.len() - 2,
            )
        };
        self.dev.launch3(
            kernel,
            (c.n_heads[layer] as u32, n as u32, split as u32),
            128,
            &args[..n_args],
        )
    }

    /// The tensor-core prefill kernels for weights of type `ty` (rows of `cols`) on token
    /// tiles of `tile`.
    fn gemm(&self, ty: WType, cols: usize, tile: usize) -> GemmKernels {
        // Q6_K's 128-pair expert tiles run on the 64-pair kernels (two passes) unless
        // `rf96` ([`CudaSession::rf96`]).
        let tile = if ty == WType::Q6K && tile == 128 && !self.rf96 {
            64
        } else {
            tile
        };
        if let Some(k) = self.rf(ty, cols, tile) {
            if self.gemm_wg
                && let Some(w) = gemm_wg(ty, tile)
            {
                return w;
            }
            return k;
        }
        ty.gemm(tile)
    }

    /// [`gemm_rf`] as this session uses it: none with `LAGOON_CUDA_GEMM_RF=0`, CT4 only with
    /// `rf_ct4`, CT8 only with `rf_ct8`.
    fn rf(&self, ty: WType, cols: usize, tile: usize) -> Option<GemmKernels> {
        if self.gemm_rf == RfUse::Off
            || (ty == WType::Ct4 && !self.rf_ct4)
            || (ty == WType::Ct8 && !self.rf_ct8)
        {
            return None;
        }
        gemm_rf(ty, cols, tile)
    }

    /// RMSNorm (`norm.cu`) of `groups` groups of `g.len` values at `x` into `out`; with `oh`
    /// (`rms_norm_h`) each output is also written there rounded to f16.
    fn rms_norm(
        &self,
        x: u64,
        g: crate::weights::DVec,
        out: u64,
        oh: Option<u64>,
        groups: usize,
    ) -> Result<(), CudaError> {
        use Arg::{F, I, P};
        let (glen, n, eps) = (I(g.len as i32), I(groups as i32), F(self.cfg.rms_eps));
        let grid = (blocks(groups, 4), 1);
        match oh {
            None => self.dev.launch(
                K::RmsNorm,
                grid,
                128,
                &[P(x), P(g.ptr), P(out), glen, n, eps],
            ),
            Some(h) => self.dev.launch(
                K::RmsNormH,
                grid,
                128,
                &[P(x), P(g.ptr), P(out), P(h), glen, n, eps],
            ),
        }
    }

    /// The kernel for the session's KV cache element type: `f32` or its `_f16`, `_bf16` or
    /// `_q8_0` twin (`q8`: None where there is none; the session's options keep the q8_0
    /// cache off those paths, and say so if one is reached).
    fn kv_kernel(&self, f32: K, f16: K, bf16: K, q8: Option<K>) -> Result<K, CudaError> {
        Ok(match self.opts.kv {
            KvCache::F32 => f32,
            KvCache::F16 => f16,
            KvCache::Bf16 => bf16,
            KvCache::Q8_0 => q8.ok_or_else(|| CudaError::Unsupported {
                what: format!(
                    "{}'s q8_0 KV cache twin (no kernel but flash.cu's attention reads that cache)",
                    f32.name()
                ),
            })?,
        })
    }

    /// Rounds the `len` f32 values of value `v` (at `x`) to f16 into the activation scratch
    /// (`to_f16`; `len` is a multiple of 4, as every tensor-core product's input is), unless
    /// the scratch holds `v` already.
    fn to_f16(&self, v: usize, x: u64, len: usize) -> Result<(), CudaError> {
        if self.xh_holds.get() == Some(v) {
            return Ok(());
        }
        self.xh_holds.set(Some(v));
        let len4 = len / 4;
        self.dev.launch(
            K::ToF16,
            (blocks(len4, 256), 1),
            256,
            &[Arg::P(x), Arg::P(self.xh), Arg::P(len4 as u64)],
        )
    }

    /// Steps of `n` tokens on the fast path multiply on the tensor cores (products whose
    /// rows are a multiple of 32 wide: [`Self::tc_product`]).
    fn tc_step(&self, n: usize) -> bool {
        self.opts.quantized_activations && n >= GEMM_MIN_TOKENS
    }

    /// A product of `cols`-wide rows over `nt` token rows takes the tensor-core kernels
    /// (with f16 activations from `xh`).
    fn tc_product(&self, cols: usize, nt: usize) -> bool {
        self.tc_step(nt) && cols.is_multiple_of(32)
    }

    /// Whether the product of `m` over `nt` token rows runs on `gemm_h.cu` (a per-step f16
    /// copy of the matrix, then `gemm_h16`).
    fn h16_takes(&self, m: &DMat, nt: usize) -> bool {
        self.wh != 0 && nt >= GEMM_H16_MIN_TOKENS && h16_shape(m.rows, m.cols, self.h16_min_rows)
    }

    /// `out = xh · m` over `nt` token rows through the f16 copy of `m` (the caller checked
    /// [`Self::h16_takes`] and filled `xh`).
    fn h16_product(&self, m: &DMat, nt: usize, out: u64) -> Result<(), CudaError> {
        use Arg::{I, P};
        let len = m.rows * m.cols;
        self.dev.launch(
            m.ty.dequant_f16(),
            (blocks(len / 32, 256), 1),
            256,
            &[
                P(m.ptr),
                P(m.row_bytes),
                P(self.wh),
                I(m.rows as i32),
                I(m.cols as i32),
            ],
        )?;
        self.dev.launch(
            K::GemmH16,
            (blocks(nt, GEMM_H16_TILE), blocks(m.rows, GEMM_H16_TILE)),
            GEMM_THREADS,
            &[
                P(self.wh),
                P(self.xh),
                P(out),
                I(m.rows as i32),
                I(m.cols as i32),
                I(nt as i32),
            ],
        )
    }

    /// Prefill steps on the fast path take the tensor-core attention (`flash.cu`, head_dim
    /// 128 only; f16 operands, f32 softmax and accumulation); with the q8_0 cache, which no
    /// other kernel reads, every step of more than one token.
    fn prefill_attention(&self, n: usize, split: usize) -> bool {
        (n >= GEMM_MIN_TOKENS || (n > 1 && self.opts.kv == KvCache::Q8_0))
            && split == 1
            && self.opts.quantized_activations
            && self.cfg.head_dim == FLASH_HEAD_DIM
    }

    /// One token on the quantised path takes the key-per-lane decode attention kernel.
    fn decode_attention(&self, n: usize) -> bool {
        n == 1 && self.opts.quantized_activations && self.cfg.head_dim.is_multiple_of(4)
    }

    /// Launches every node of `graph` for `n` tokens (parameters already uploaded).
    fn run(&self, graph: &Graph, n: usize) -> Result<(), CudaError> {
        use Arg::{F, I, P};
        let c = &self.cfg;
        let vals = &graph.values;
        let at = |v: usize| self.arena + 4 * vals[v].offset as u64;
        let rows = |v: usize| vals[v].rows(n);
        let dev = &self.dev;
        let d = c.head_dim;
        let params = self.params;
        let fast = n == 1 && self.opts.quantized_activations;
        let fast_prefill = self.fuse && self.tc_step(n);
        self.xq_holds.set(None);
        self.xh_holds.set(None);
        self.norm_epi.set(None);
        let mut i = 0;
        while i < graph.nodes.len() {
            let used = if fast {
                self.fused_decode(graph, i)?
            } else if fast_prefill {
                self.fused_prefill(graph, i, n)?
            } else {
                0
            };
            if used > 0 {
                i += used;
                continue;
            }
            let op = &graph.nodes[i];
            i += 1;
            match *op {
                Op::Embed { out } => {
                    let m = self.w.token_embd;
                    let chunks = m.cols.div_ceil(32);
                    dev.launch(
                        m.ty.embed(),
                        (blocks(chunks, 128), n as u32),
                        128,
                        &[
                            P(m.ptr),
                            P(m.row_bytes),
                            P(params),
                            P(at(out)),
                            I(m.cols as i32),
                        ],
                    )?;
                }
                Op::RmsNorm { x, w, out } => {
                    let g = self.w.vector(w);
                    let groups = rows(x) * vals[x].cols / g.len;
                    self.rms_norm(at(x), g, at(out), None, groups)?;
                }
                Op::MatMul { x, w, out } => {
                    let m = self.w.mat(w);
                    let nt = rows(x);
                    if self.tc_product(m.cols, nt) {
                        // gemm_rf.cu where it takes the type, on 128-token tiles (Q4_K) where
                        // the grid still fills the GPU twice; gemm.cu on half-width token tiles
                        // where 64-token ones would not fill two blocks per SM (K/V
                        // projections, the shared expert at pp512).
                        let rows_b = m.rows.div_ceil(GEMM_TILE_ROWS);
                        let rf = self.rf(m.ty, m.cols, GEMM_TILE_TOKENS).is_some();
                        let tile = if rf {
                            let wide = 2 * GEMM_TILE_TOKENS;
                            if self.gemm_rf == RfUse::All
                                && m.ty == WType::Q4K
                                && rows_b * nt.div_ceil(wide) >= 2 * self.sm_count
                            {
                                wide
                            } else {
                                GEMM_TILE_TOKENS
                            }
                        } else if rows_b * nt.div_ceil(GEMM_TILE_TOKENS) < 2 * self.sm_count {
                            GEMM_TILE_TOKENS / 2
                        } else {
                            GEMM_TILE_TOKENS
                        };
                        self.to_f16(x, at(x), nt * m.cols)?;
                        if self.h16_takes(&m, nt) {
                            self.h16_product(&m, nt, at(out))?;
                            continue;
                        }
                        dev.launch(
                            self.gemm(m.ty, m.cols, tile).dense,
                            (blocks(m.rows, GEMM_TILE_ROWS), blocks(nt, tile)),
                            GEMM_THREADS,
                            &[
                                P(m.ptr),
                                P(m.row_bytes),
                                P(self.xh),
                                P(at(out)),
                                I(m.rows as i32),
                                I(m.cols as i32),
                                I(nt as i32),
                            ],
                        )?;
                        continue;
                    }
                    dev.launch(
                        m.ty.matmul(),
                        (blocks(m.rows, 4), blocks(nt, 8)),
                        128,
                        &[
                            P(m.ptr),
                            P(m.row_bytes),
                            P(at(x)),
                            P(at(out)),
                            I(m.rows as i32),
                            I(m.cols as i32),
                            I(nt as i32),
                        ],
                    )?;
                }
                Op::Rope { x, sliding, out } => {
                    let (freq, scale, rd) = self.ropes[sliding as usize];
                    let cols = vals[x].cols;
                    dev.launch(
                        K::Rope,
                        (blocks(n * cols, 256), 1),
                        256,
                        &[
                            P(at(x)),
                            P(at(out)),
                            P(freq),
                            F(scale),
                            I(rd as i32),
                            I(d as i32),
                            I(cols as i32),
                            I(n as i32),
                            P(params),
                        ],
                    )?;
                }
                Op::KvStore { layer, k, v } => {
                    let kv = self.kv[layer];
                    let row = c.n_kv_heads * d;
                    dev.launch(
                        self.kv_kernel(
                            K::KvStore,
                            K::KvStoreF16,
                            K::KvStoreBf16,
                            Some(K::KvStoreQ8_0),
                        )?,
                        (blocks(n * row, 256), 1),
                        256,
                        &[
                            P(at(k)),
                            P(at(v)),
                            P(kv.k),
                            P(kv.v),
                            I(kv.cap as i32),
                            I(row as i32),
                            I(n as i32),
                            P(params),
                        ],
                    )?;
                }
                Op::Attention { layer, q, out } => {
                    // The q8_0 cache's steps of several tokens take the tensor-core prefill
                    // kernel, which does not split.
                    let split =
                        if n == 1 || (n <= SPLIT_MAX_TOKENS && self.opts.kv != KvCache::Q8_0) {
                            self.splits[layer]
                        } else {
                            1
                        };
                    self.attention(layer, at(q), at(out), n, split, None, 0)?;
                    if split > 1 {
                        dev.launch(
                            K::AttentionMerge,
                            (c.n_heads[layer] as u32, n as u32),
                            128,
                            &[
                                P(self.part),
                                P(at(out)),
                                I(c.n_heads[layer] as i32),
                                I(d as i32),
                                I(split as i32),
                            ],
                        )?;
                    }
                }
                Op::GateMul { o, g, out } => {
                    let len = n * vals[o].cols;
                    dev.launch(
                        K::GateMul,
                        (blocks(len, 256), 1),
                        256,
                        &[
                            P(at(o)),
                            P(at(g)),
                            P(at(out)),
                            I(vals[o].cols as i32),
                            I(vals[g].cols as i32),
                            P(len as u64),
                        ],
                    )?;
                }
                Op::SwiGlu { gate, up, out } => {
                    let len = n * vals[gate].cols;
                    dev.launch(
                        K::SwiGlu,
                        (blocks(len, 256), 1),
                        256,
                        &[P(at(gate)), P(at(up)), P(at(out)), P(len as u64)],
                    )?;
                }
                Op::Add { a, b, out } => {
                    let len = rows(a) * vals[a].cols;
                    dev.launch(
                        K::Add,
                        (blocks(len, 256), 1),
                        256,
                        &[P(at(a)), P(at(b)), P(at(out)), P(len as u64)],
                    )?;
                }
                Op::Route {
                    layer,
                    z,
                    ids,
                    weights,
                } => {
                    let DFfn::Moe { bias, .. } = &self.w.layers[layer].ffn else {
                        unreachable!("route on a dense layer")
                    };
                    dev.launch(
                        K::RouteBlock,
                        (n as u32, 1),
                        256,
                        &[
                            P(at(z)),
                            P(bias.ptr),
                            P(at(ids)),
                            P(at(weights)),
                            I(c.n_experts as i32),
                            I(c.n_experts_used as i32),
                            I(c.norm_topk_prob as i32),
                            I(n as i32),
                        ],
                    )?;
                }
                Op::Experts {
                    layer,
                    x,
                    ids,
                    weights,
                    out,
                } => self.experts(layer, x, at(x), at(ids), at(weights), at(out), n)?,
                Op::LastRow { x, out } => {
                    let cols = vals[x].cols;
                    dev.launch(
                        K::Copy,
                        (blocks(cols, 256), 1),
                        256,
                        &[
                            P(at(x) + 4 * ((n - 1) * cols) as u64),
                            P(at(out)),
                            P(cols as u64),
                        ],
                    )?;
                }
            }
        }
        Ok(())
    }
}

/// How many nodes of `graph` read each value (the graph's output counts as one more).
fn graph_readers(graph: &Graph) -> Vec<u32> {
    let mut readers = vec![0u32; graph.values.len()];
    for op in &graph.nodes {
        for v in op.inputs() {
            readers[v] += 1;
        }
    }
    readers[graph.output] += 1;
    readers
}

/// Bytes of the decode path's quantisation scratch: the widest quantised matrix input, and
/// the K expert activation rows.
fn quant_scratch(cfg: &ModelConfig, decode: &Graph, w: &DeviceWeights) -> (usize, usize) {
    let (mut xq, mut actq) = (0usize, 0usize);
    for op in &decode.nodes {
        match *op {
            Op::MatMul { x, w: wid, .. } => {
                // (`WType::act`, not the session's: the grid IQ types, Q5_K and IQ4_XS count
                // even when their integer kernels are off, a few KB more scratch.)
                if let Some(f) = w.mat(wid).ty.act() {
                    xq = xq.max(f.row_stride(decode.values[x].cols));
                }
            }
            Op::Experts { layer, .. } => {
                if let DFfn::Moe { gate, down, .. } = &w.layers[layer].ffn {
                    if let Some(f) = gate.ty.act() {
                        xq = xq.max(f.row_stride(cfg.hidden_size));
                    }
                    if let Some(f) = down.ty.act() {
                        // K routed slots and the shared expert's.
                        actq = actq.max((cfg.n_experts_used + 1) * f.row_stride(cfg.expert_ffn));
                    }
                }
            }
            _ => {}
        }
    }
    (xq, actq)
}

#[cfg(test)]
mod kv_cache_tests {
    use super::KvCache;

    /// `--kv` names round-trip, and the plane sizes are the cache's bytes: elements, q8_0's
    /// f16 scale per 32, each plane rounded up to 256 bytes.
    #[test]
    fn kv_cache_names_and_sizes() {
        for k in KvCache::ALL {
            assert_eq!(KvCache::parse(k.name()), Some(k));
        }
        assert_eq!(KvCache::parse("q4_0"), None);
        assert_eq!(KvCache::default(), KvCache::F32);
        // S 2.1: 8 KV heads of 128, a 4,096-key ring.
        let (cap, row) = (4096, 1024);
        assert_eq!(
            KvCache::ALL.map(|k| k.plane_bytes(cap, row)),
            [16 << 20, 8 << 20, 8 << 20, (4 << 20) + (256 << 10)]
        );
        // Odd sizes round up: 3 rows of 32 are 96 quants and 3 scales (102 bytes).
        assert_eq!(KvCache::Q8_0.plane_bytes(3, 32), 256);
        assert_eq!(KvCache::F32.plane_bytes(3, 32), 512);
        for k in KvCache::ALL {
            let bits = k.plane_bytes(1 << 16, 1024) as f64 * 8.0 / (1u64 << 26) as f64;
            assert_eq!(bits, k.bits_per_element(), "{k:?}");
        }
    }
}

#[cfg(test)]
mod split_tests {
    use super::{MAX_SPLITS, SPLIT_KEYS, SPLIT_KEYS_GQA, split_bucket};

    /// The split count follows the keys a step reads, in powers of two up to MAX_SPLITS:
    /// one split for a short context however large n_ctx is, the whole-context count only
    /// once the keys call for it.
    #[test]
    fn split_counts_follow_the_keys_in_powers_of_two() {
        assert_eq!(split_bucket(1, SPLIT_KEYS), 1);
        assert_eq!(split_bucket(SPLIT_KEYS, SPLIT_KEYS), 1);
        assert_eq!(split_bucket(SPLIT_KEYS + 1, SPLIT_KEYS), 2);
        assert_eq!(split_bucket(3 * SPLIT_KEYS, SPLIT_KEYS), 4);
        assert_eq!(split_bucket(4096, SPLIT_KEYS), 16);
        assert_eq!(split_bucket(4096, SPLIT_KEYS_GQA), 64);
        assert_eq!(split_bucket(1 << 20, SPLIT_KEYS), MAX_SPLITS);
        assert_eq!(split_bucket(0, SPLIT_KEYS), 1);
        assert_eq!(split_bucket(5, 0), 8);
        let mut seen: Vec<usize> = (1..100_000).map(|k| split_bucket(k, 8)).collect();
        seen.dedup();
        assert_eq!(seen, [1, 2, 4, 8, 16, 32, 64]);
    }
}
