//! The CPU dot-product kernel table: activation quantisers and one `vec_dot` per weight
//! encoding, scalar and AVX2, resolved once into [`Kernels`] (ggml's `type_traits_cpu`).
//!
//! Each weight type dots against one activation format ([`ActFormat`], spec §4.1): legacy
//! 32-blocks, IQ4_NL, MXFP4 and compressed-tensors int4/int8 against Q8_0, K-quants and the
//! 256-element IQ types against Q8_K (ggml's pairings), float weights against f32. Types
//! without a kernel (FP8, other ct widths, ternary TQ*, and any type core's
//! `dequantize_row` learns later) take the fallback: the row is dequantised by
//! core's reference decoder into a stack buffer, chunk by chunk, and dotted with f32
//! activations. Nothing here allocates.
//!
//! ```text
//! let k = Kernels::detect();
//! let fmt = k.act_format(&w);
//! k.quantize_act(fmt, &x, &mut act[..Kernels::act_row_bytes(fmt, w.cols)]);
//! k.dot_rows(&w, r0, &act, &mut out);      // out[i] = W[r0 + i] · x
//! ```

pub mod act;
#[cfg(target_arch = "x86_64")]
mod arch;
pub mod ct;
pub mod scalar;
pub mod x8;
pub mod x8_ct4;
pub mod x8_iq2xxs;
pub mod x8_iq3xxs;
pub mod x8_iq4xs;
pub mod x8_k23;
pub mod x8_q5k;
pub mod x8_q6k;
pub mod x8_q8_0;

use lagoon_core::dtype::GgmlType;
use lagoon_core::quant;
use lagoon_core::quant::ct::CtMatrix;
use lagoon_core::weights::{Encoding, MatRef};

/// What a weight type dots against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActFormat {
    /// f32, little-endian (float weights and the dequantising fallback).
    F32,
    /// 32-element blocks of int8 with an f32 scale (ggml Q8_0 values; layout in [`act`]).
    Q8_0,
    /// 256-element blocks of int8 with an f32 scale and per-16 sums (ggml Q8_K values).
    Q8K,
}

/// One weight row (bytes) · one activation row (bytes) over `n` elements.
pub(crate) type RowDot = fn(w: &[u8], a: &[u8], n: usize) -> f32;
/// One weight row (bytes) · up to [`MULTI_TOKENS`] activation rows at once:
/// `out[t] = w · acts[t]`, `out.len() == acts.len()`, each result bit-identical to the
/// type's [`RowDot`] on that token alone.
pub(crate) type MultiDot = fn(w: &[u8], acts: &[&[u8]], n: usize, out: &mut [f32]);
/// Several weight rows × several tokens at once (prefill), see [`GemmArgs`]. Each result
/// bit-identical to the table's [`RowDot`] on that row and token alone. Returns `false`
/// with nothing written when it does not take the call (malformed rows or activations, a
/// shape it has no room for): the caller then takes the one-row path.
pub(crate) type Gemm = fn(g: GemmArgs<'_>) -> bool;

/// One [`Gemm`] call: `out[t·out_stride + i] = W[i] · act_t` for `i < n_rows`, `t < n_act`,
/// where `w` holds the `n_rows` rows of `rb` bytes and `act_t = acts[t·act_stride..]`
/// (`cols` elements in the type's format).
pub(crate) struct GemmArgs<'a> {
    pub w: &'a [u8],
    pub rb: usize,
    pub n_rows: usize,
    pub acts: &'a [u8],
    pub act_stride: usize,
    pub n_act: usize,
    pub cols: usize,
    pub out: &'a mut [f32],
    pub out_stride: usize,
}

impl GemmArgs<'_> {
    /// The bounds every [`Gemm`] checks before it touches memory: at least one row and one
    /// token, `n_rows` rows of `rb` bytes in `w`, `n_act` activation rows of `ab` bytes
    /// `act_stride` apart in `acts` and as many output rows of `n_rows` values `out_stride`
    /// apart in `out`; then `valid` holds for every activation row (its format's own checks).
    pub(crate) fn bounds_ok(&self, ab: usize, valid: impl Fn(&[u8]) -> bool) -> bool {
        let (n_rows, n_act, act_stride) = (self.n_rows, self.n_act, self.act_stride);
        n_rows > 0
            && n_act > 0
            && self.w.len() >= n_rows * self.rb
            && (n_act - 1) * act_stride + ab <= self.acts.len()
            && (n_act - 1) * self.out_stride + n_rows <= self.out.len()
            && (0..n_act).all(|t| valid(&self.acts[t * act_stride..t * act_stride + ab]))
    }

    /// For a type of `block`-byte super-blocks paired with Q8_K activations: the
    /// super-blocks per row when `cols` is a positive multiple of 256, the rows are
    /// `block` bytes per super-block and [`Self::bounds_ok`] holds with Q8_K rows.
    pub(crate) fn q8k_blocks(&self, block: usize) -> Option<usize> {
        let (cols, nb) = (self.cols, self.cols / 256);
        (cols.is_multiple_of(256)
            && nb > 0
            && self.rb == block * nb
            && self.bounds_ok(act::q8k_row_bytes(cols), |a| {
                act::Q8KAct::new(a, cols).is_some()
            }))
        .then_some(nb)
    }
}

/// The attention of the query heads that share one KV head, for one token (see
/// [`Kernels::attend_group`]); `false` with nothing written for shapes it does not take.
pub(crate) type AttendGroup = fn(a: &AttnGroup<'_>, scores: &mut [f32], out: &mut [f32]) -> bool;

/// The attention of several consecutive tokens' query heads that share one KV head (see
/// [`Kernels::attend_tokens`]); `false` with nothing written for shapes it does not take.
pub(crate) type AttendTokens = fn(a: &AttnTokens<'_>, out: &mut [&mut [f32]]) -> bool;

/// Tokens `0..n_tokens` at positions `pos0 + t`, each attending positions
/// `(pos0 + t + 1).saturating_sub(window)..=pos0 + t`; token t's `n_heads` query rows of `d`
/// are `q[t·q_stride..][..n_heads·d]`. The cache as in [`AttnGroup`].
#[derive(Clone, Copy, Debug)]
pub struct AttnTokens<'a> {
    pub q: &'a [f32],
    pub q_stride: usize,
    pub n_tokens: usize,
    pub kc: &'a [f32],
    pub vc: &'a [f32],
    pub row: usize,
    pub cap: usize,
    pub off: usize,
    pub d: usize,
    pub n_heads: usize,
    pub pos0: usize,
    /// Positions attended back, the token's own included (`usize::MAX`: all).
    pub window: usize,
}

/// One token's query heads of one KV head, and the layer's K/V cache rows: position `p`'s
/// K for this head is `kc[(p % cap)·row + off..][..d]` — whole KV rows with the head at `off`
/// in each, or (the session's cache, `kv.rs`) the head's rows back to back, `row = d`.
#[derive(Clone, Copy, Debug)]
pub struct AttnGroup<'a> {
    /// `n_heads` query rows of `d`, consecutive.
    pub q: &'a [f32],
    pub kc: &'a [f32],
    pub vc: &'a [f32],
    pub row: usize,
    pub cap: usize,
    pub off: usize,
    pub d: usize,
    pub n_heads: usize,
    /// Positions `first..=pos` are attended.
    pub first: usize,
    pub pos: usize,
}

/// Whether the `d` floats at `(p % cap)·row + off` lie inside a buffer of `len` for every
/// position p, rows not overlapping (`row ≥ d`): the cache's rows may be whole KV rows with
/// the head at `off` in each, or one KV head's rows back to back (`row = d`) from `off`.
fn rows_in(cap: usize, row: usize, off: usize, d: usize, len: usize) -> bool {
    row >= d
        && (cap - 1)
            .checked_mul(row)
            .and_then(|x| x.checked_add(off))
            .and_then(|x| x.checked_add(d))
            .is_some_and(|end| end <= len)
}

impl AttnGroup<'_> {
    /// The number of positions attended (`pos + 1 − first`) when a kernel taking heads of a
    /// multiple of `d_mult` floats and at most `max_g` heads can run on these rows and
    /// buffers (every index it makes in bounds); `None` otherwise.
    pub(crate) fn checked(
        &self,
        scores: &[f32],
        out: &[f32],
        d_mult: usize,
        max_g: usize,
    ) -> Option<usize> {
        let (d, g) = (self.d, self.n_heads);
        let n = (self.pos + 1).saturating_sub(self.first);
        let rows_ok = self.cap > 0
            && n > 0
            && n <= self.cap
            && rows_in(
                self.cap,
                self.row,
                self.off,
                d,
                self.kc.len().min(self.vc.len()),
            );
        (d.is_multiple_of(d_mult)
            && d > 0
            && (1..=max_g).contains(&g)
            && self.q.len() >= g * d
            && out.len() >= g * d
            && scores.len() >= g * n
            && rows_ok)
            .then_some(n)
    }
}

impl AttnTokens<'_> {
    /// Whether a several-token kernel taking heads of a multiple of `d_mult` floats, at most
    /// `max_d` wide, and at most `max_g` heads can run on these rows and buffers: at most
    /// [`Kernels::ATTEND_MAX_TOKENS`] tokens, every token's window within the cache's rows,
    /// every index it makes in bounds.
    pub(crate) fn fits(
        &self,
        out: &[&mut [f32]],
        d_mult: usize,
        max_d: usize,
        max_g: usize,
    ) -> bool {
        let (d, g, nt) = (self.d, self.n_heads, self.n_tokens);
        let first0 = (self.pos0 + 1).saturating_sub(self.window);
        let last = self.pos0 + nt.max(1) - 1;
        let rows_ok = self.cap > 0
            && self.window > 0
            && last + 1 - first0 <= self.cap
            && rows_in(
                self.cap,
                self.row,
                self.off,
                d,
                self.kc.len().min(self.vc.len()),
            );
        d.is_multiple_of(d_mult)
            && d > 0
            && d <= max_d
            && (1..=max_g).contains(&g)
            && (1..=Kernels::ATTEND_MAX_TOKENS).contains(&nt)
            && out.len() >= nt
            && out[..nt].iter().all(|o| o.len() >= g * d)
            && (nt - 1) * self.q_stride + g * d <= self.q.len()
            && rows_ok
    }
}

/// Tokens from which [`Kernels::dot_rows_multi`] hands a call to the table's [`Gemm`].
const GEMM_MIN_TOKENS: usize = 2;
/// Tokens per block in [`Kernels::dot_rows_multi`] on the one-row and several-token paths
/// (a multiple of [`MULTI_TOKENS`]): 16 activation rows of 2048 columns are 34 KiB of Q8_K,
/// 128 KiB of f32.
const TOKEN_BLOCK: usize = 16;
/// Tokens one [`MultiDot`] call takes at most: eight, which the kernels that gain from it
/// take in one pass and the others in runs of four (`avx2::by_n_tokens!`).
const MULTI_TOKENS: usize = 8;
/// Dequantised f32 weights · f32 activation bytes (the fallback's inner product).
pub(crate) type F32Dot = fn(w: &[f32], a: &[[u8; 4]]) -> f32;

/// Every kernel of one instruction set. Built by [`scalar_table`] or by the AVX2 / AVX-512
/// modules from a proof token; copied into [`Kernels`] once.
#[derive(Clone, Copy)]
pub(crate) struct Table {
    pub name: &'static str,
    /// Send every type through the dequantising fallback (a test and debugging oracle).
    pub force_fallback: bool,
    pub q8_0: RowDot,
    pub q4_0: RowDot,
    pub q4_1: RowDot,
    pub q5_0: RowDot,
    pub q5_1: RowDot,
    pub q2k: RowDot,
    pub q3k: RowDot,
    pub q4k: RowDot,
    pub q5k: RowDot,
    pub q6k: RowDot,
    /// Codebook types and MXFP4 (ggml's pairings: IQ4_NL and MXFP4 with Q8_0, the rest
    /// with Q8_K).
    pub iq4xs: RowDot,
    pub iq3xxs: RowDot,
    pub iq3s: RowDot,
    pub iq2xxs: RowDot,
    pub iq2xs: RowDot,
    pub iq2s: RowDot,
    pub iq1s: RowDot,
    pub iq1m: RowDot,
    pub iq4nl: RowDot,
    pub mxfp4: RowDot,
    /// Several tokens per weight row (prefill); `None`: the [`RowDot`] per token.
    pub q4k_multi: Option<MultiDot>,
    pub q8_0_multi: Option<MultiDot>,
    pub q6k_multi: Option<MultiDot>,
    pub q2k_multi: Option<MultiDot>,
    pub q4_0_multi: Option<MultiDot>,
    pub q4_1_multi: Option<MultiDot>,
    pub q5_0_multi: Option<MultiDot>,
    pub q5_1_multi: Option<MultiDot>,
    pub q3k_multi: Option<MultiDot>,
    pub iq4xs_multi: Option<MultiDot>,
    /// The grid types (each block's grid lookups and signs decoded once for the tokens).
    pub iq2xxs_multi: Option<MultiDot>,
    pub iq2xs_multi: Option<MultiDot>,
    pub iq2s_multi: Option<MultiDot>,
    pub iq3xxs_multi: Option<MultiDot>,
    pub iq3s_multi: Option<MultiDot>,
    pub iq1s_multi: Option<MultiDot>,
    pub iq1m_multi: Option<MultiDot>,
    /// Rows × tokens at once (prefill); `None`: [`MultiDot`] or [`RowDot`] per row.
    pub q4k_gemm: Option<Gemm>,
    pub q6k_gemm: Option<Gemm>,
    pub q8_0_gemm: Option<Gemm>,
    /// F32 weights (the router).
    pub f32_gemm: Option<Gemm>,
    /// F16 and BF16 weights (× f32 activations, as their one-row kernels).
    pub f16_gemm: Option<Gemm>,
    pub bf16_gemm: Option<Gemm>,
    /// Grouped-query attention of one token and KV head; `None`: the caller's per-head loop.
    pub attend: Option<AttendGroup>,
    /// The same for several tokens at once, K/V rows read once per block of positions.
    pub attend_tokens: Option<AttendTokens>,
    pub f32: RowDot,
    pub f16: RowDot,
    pub bf16: RowDot,
    pub dot_f32: F32Dot,
    pub ct_nib4: ct::CtRowDot,
    /// `ct_nib4` reading the activation quants in a kernel-specific order, written once per
    /// activation row (`None`: `ct_nib4` for every row).
    pub ct_nib4_perm: Option<(ct::CtActOrder, ct::CtRowDotPerm)>,
    pub ct_u8: ct::CtRowDot,
    pub ct_i8: ct::CtRowDot,
    /// Hints the caches to fetch these bytes (a no-op where there is no such hint).
    pub prefetch: fn(&[u8]),
}

/// The scalar kernels.
pub(crate) fn scalar_table() -> Table {
    use scalar::*;
    Table {
        name: "scalar",
        force_fallback: false,
        q8_0: vec_dot_q8_0_q8_0,
        q4_0: vec_dot_q4_0_q8_0,
        q4_1: vec_dot_q4_1_q8_0,
        q5_0: vec_dot_q5_0_q8_0,
        q5_1: vec_dot_q5_1_q8_0,
        q2k: vec_dot_q2k_q8k,
        q3k: vec_dot_q3k_q8k,
        q4k: vec_dot_q4k_q8k,
        q5k: vec_dot_q5k_q8k,
        q6k: vec_dot_q6k_q8k,
        iq4xs: vec_dot_iq4_xs_q8k,
        iq3xxs: vec_dot_iq3_xxs_q8k,
        iq3s: vec_dot_iq3_s_q8k,
        iq2xxs: vec_dot_iq2_xxs_q8k,
        iq2xs: vec_dot_iq2_xs_q8k,
        iq2s: vec_dot_iq2_s_q8k,
        iq1s: vec_dot_iq1_s_q8k,
        iq1m: vec_dot_iq1_m_q8k,
        iq4nl: vec_dot_iq4_nl_q8_0,
        mxfp4: vec_dot_mxfp4_q8_0,
        q4k_multi: None,
        q8_0_multi: None,
        q6k_multi: None,
        q2k_multi: None,
        q4_0_multi: None,
        q4_1_multi: None,
        q5_0_multi: None,
        q5_1_multi: None,
        q3k_multi: None,
        iq4xs_multi: None,
        iq2xxs_multi: None,
        iq2xs_multi: None,
        iq2s_multi: None,
        iq3xxs_multi: None,
        iq3s_multi: None,
        iq1s_multi: None,
        iq1m_multi: None,
        q4k_gemm: None,
        q6k_gemm: None,
        q8_0_gemm: None,
        f32_gemm: None,
        f16_gemm: None,
        bf16_gemm: None,
        attend: None,
        attend_tokens: None,
        f32: vec_dot_f32_f32,
        f16: vec_dot_f16_f32,
        bf16: vec_dot_bf16_f32,
        dot_f32: dot_f32_act,
        ct_nib4: ct::vec_dot_ct_nib4_q8_0,
        ct_nib4_perm: None,
        ct_u8: ct::vec_dot_ct_u8_q8_0,
        ct_i8: ct::vec_dot_ct_i8_q8_0,
        prefetch: |_| {},
    }
}

/// Widest int4 compressed-tensors row whose activation `dot_rows_multi` rearranges for a
/// table's `ct_nib4_perm` (4 KiB of stack; S 2.1's experts are 3072 and 1024 wide).
const CT_PERM_MAX_COLS: usize = 4096;

/// Widest compressed-tensors row the fallback decodes (its whole-row decoder needs the row
/// in one buffer): 64 KiB of stack. Laguna's widest input is 12288 (S 2.1 dense `down`).
pub const MAX_CT_FALLBACK_COLS: usize = 16384;

/// Elements per fallback chunk for ggml types (decoded block-aligned, any row width).
const FALLBACK_CHUNK: usize = 4096;

/// The resolved kernel table. Cheap to clone; resolve once at load.
#[derive(Clone)]
pub struct Kernels {
    t: Table,
    /// Repacked Q4_K matrices whose products go to the 8-row kernels ([`Kernels::with_x8`]).
    x8: Option<std::sync::Arc<x8::X8Store>>,
}

impl core::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Kernels")
            .field("name", &self.t.name)
            .finish()
    }
}

/// How a matrix is dotted.
enum Plan<'m> {
    /// A ggml type with an integer or float kernel: row `r` is `data[r·rb..(r+1)·rb]`.
    Ggml {
        f: RowDot,
        /// The several-token kernel, where the table has one for this type.
        fm: Option<MultiDot>,
        /// The rows × tokens kernel, where the table has one for this type.
        gemm: Option<Gemm>,
        data: &'m [u8],
        rb: usize,
    },
    /// A compressed-tensors integer matrix.
    CtInt {
        f: ct::CtRowDot,
        m: &'m CtMatrix<'m>,
        p: ct::CtIntPlan,
    },
    /// A ggml type decoded chunk by chunk (`blk` elements in `blk_bytes`).
    GgmlFallback {
        ty: GgmlType,
        data: &'m [u8],
        rb: usize,
        blk: usize,
        blk_bytes: usize,
    },
    /// A compressed-tensors matrix decoded whole-row.
    CtFallback(&'m CtMatrix<'m>),
    /// Nothing can decode it: NaN.
    Invalid,
}

impl Kernels {
    /// The best kernels this CPU runs (AVX-512 F/BW/VL+VNNI, else AVX2+FMA+F16C, when
    /// detected), unless the environment sets `LAGOON_FORCE_SCALAR=1` (scalar) or
    /// `LAGOON_FORCE_AVX2=1` (no AVX-512).
    pub fn detect() -> Kernels {
        if std::env::var_os("LAGOON_FORCE_SCALAR").is_some_and(|v| v == "1") {
            return Kernels::scalar();
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = arch::x86_64::best_table() {
            return Kernels { t, x8: None };
        }
        Kernels::scalar()
    }

    /// Every SIMD table this CPU runs, best first (AVX-512 VNNI, AVX2), whatever the
    /// environment says; empty without SIMD. For tests that hold each one to scalar.
    #[doc(hidden)]
    pub fn simd_tables() -> impl Iterator<Item = Kernels> {
        #[cfg(target_arch = "x86_64")]
        let t = [arch::x86_64::avx512_table(), arch::x86_64::avx2_table()];
        #[cfg(not(target_arch = "x86_64"))]
        let t: [Option<Table>; 0] = [];
        t.into_iter().flatten().map(|t| Kernels { t, x8: None })
    }

    /// This table with the products of the matrices `store` holds on its 8-row kernels
    /// (results: the scalar reference's bits for those matrices).
    pub fn with_x8(self, store: std::sync::Arc<x8::X8Store>) -> Kernels {
        Kernels {
            x8: Some(store),
            ..self
        }
    }

    /// Bytes of the repacked copies this table's store holds (0 without one).
    pub fn x8_bytes(&self) -> usize {
        self.x8.as_ref().map_or(0, |s| s.bytes())
    }

    /// The scalar reference kernels.
    pub fn scalar() -> Kernels {
        Kernels {
            t: scalar_table(),
            x8: None,
        }
    }

    /// Every weight type through the dequantising fallback: core's reference decoder, then an
    /// f32 dot with unquantised activations (`act_format` is always F32). Slow; an oracle for
    /// tests and for debugging a suspect kernel.
    #[doc(hidden)]
    pub fn dequant_fallback() -> Kernels {
        let mut t = scalar_table();
        t.name = "dequant-fallback";
        t.force_fallback = true;
        Kernels { t, x8: None }
    }

    /// `"avx512vnni"`, `"avx2"`, `"scalar"` (or `"dequant-fallback"`).
    pub fn name(&self) -> &'static str {
        self.t.name
    }

    /// The activation format `w` is dotted against.
    pub fn act_format(&self, w: &MatRef<'_>) -> ActFormat {
        if self.t.force_fallback {
            return ActFormat::F32;
        }
        match &w.enc {
            Encoding::Ggml { ty, .. } => match ty {
                GgmlType::Q8_0
                | GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::IQ4NL
                | GgmlType::MXFP4
                    if w.cols.is_multiple_of(quant::QK) =>
                {
                    ActFormat::Q8_0
                }
                GgmlType::Q2K
                | GgmlType::Q3K
                | GgmlType::Q4K
                | GgmlType::Q5K
                | GgmlType::Q6K
                | GgmlType::IQ4XS
                | GgmlType::IQ3XXS
                | GgmlType::IQ3S
                | GgmlType::IQ2XXS
                | GgmlType::IQ2XS
                | GgmlType::IQ2S
                | GgmlType::IQ1S
                | GgmlType::IQ1M
                    if w.cols.is_multiple_of(quant::QK_K) =>
                {
                    ActFormat::Q8K
                }
                _ => ActFormat::F32,
            },
            Encoding::Ct(m) => match ct::plan(m) {
                Some(_) => ActFormat::Q8_0,
                None => ActFormat::F32,
            },
        }
    }

    /// Attention of the `a.n_heads` query heads sharing one KV head, one token: for each
    /// head h, `out[h·d..][..d] = Σ_j softmax_j(q_h·k_j / √d)·v_j` over positions
    /// `a.first..=a.pos` (`scores`: at least `n_heads · (pos + 1 − first)` floats of
    /// scratch). `false`, with nothing written, when the table has no such kernel or it does
    /// not take this shape: the caller then runs its per-head loop.
    pub fn attend_group(&self, a: &AttnGroup<'_>, scores: &mut [f32], out: &mut [f32]) -> bool {
        self.t.attend.is_some_and(|f| f(a, scores, out))
    }

    /// [`Kernels::attend_group`] for `a.n_tokens ≤` [`Kernels::ATTEND_MAX_TOKENS`]
    /// consecutive tokens at once (`out[t]`: token t's `n_heads · d` outputs), with an
    /// online softmax over blocks of positions, each K/V block read once for all the
    /// tokens' heads. `false`, with nothing written, when the table has no such kernel or it
    /// does not take this shape.
    pub fn attend_tokens(&self, a: &AttnTokens<'_>, out: &mut [&mut [f32]]) -> bool {
        self.t.attend_tokens.is_some_and(|f| f(a, out))
    }

    /// Tokens [`Kernels::attend_tokens`] takes per call at most: each block of K/V rows is
    /// copied once per call and reused by every token of it. 16 rather than 4: prefill
    /// attention 206 → 189 ms per pp512 step (XS 2.1 shape, 4 layers, 2 threads on the
    /// AVX-512 VM; 8 gave 196).
    pub const ATTEND_MAX_TOKENS: usize = 16;

    /// Query heads [`Kernels::attend_group`] takes per call at most.
    pub const ATTEND_MAX_HEADS: usize = 8;

    /// Bytes of one activation row of `cols` elements in `fmt`.
    pub fn act_row_bytes(fmt: ActFormat, cols: usize) -> usize {
        match fmt {
            ActFormat::F32 => 4 * cols,
            ActFormat::Q8_0 => act::q8_0_row_bytes(cols),
            ActFormat::Q8K => act::q8k_row_bytes(cols),
        }
    }

    /// Quantises one activation row `x` (`cols` elements) into `out`
    /// (exactly [`Kernels::act_row_bytes`]`(fmt, cols)` bytes).
    pub fn quantize_act(&self, fmt: ActFormat, x: &[f32], out: &mut [u8]) {
        match fmt {
            ActFormat::F32 => {
                debug_assert_eq!(out.len(), 4 * x.len());
                for (o, v) in out.as_chunks_mut::<4>().0.iter_mut().zip(x) {
                    *o = v.to_le_bytes();
                }
            }
            ActFormat::Q8_0 => act::quantize_row_q8_0(x, out),
            ActFormat::Q8K => act::quantize_row_q8k(x, out),
        }
    }

    /// `out[i] = W[r0 + i] · act` for `i < out.len()`; `act` is one activation row in
    /// `self.act_format(w)`. Rows past the matrix or a wrong-sized `act` give NaN.
    pub fn dot_rows(&self, w: &MatRef<'_>, r0: usize, act: &[u8], out: &mut [f32]) {
        let n = out.len();
        self.dot_rows_multi(w, r0, n, act, act.len(), 1, out, n);
    }

    /// `out[t·out_stride + i] = W[r0 + i] · act_t` for `i < n_rows`, `t < n_act`, where
    /// `act_t = acts[t·act_stride ..][..act_row_bytes]`. Each weight row is read from memory
    /// once and dotted with every token while it is in L1. Where the table has a
    /// several-token kernel for the type and `n_act ≥ 2`, tokens go in groups of up to
    /// eight (`MULTI_TOKENS`; the kernel takes them in one pass or in runs of four) so each
    /// weight block is unpacked once per group; the results are bit-identical to one token at
    /// a time.
    pub fn dot_rows_multi(
        &self,
        w: &MatRef<'_>,
        r0: usize,
        n_rows: usize,
        acts: &[u8],
        act_stride: usize,
        n_act: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        if let Some(s) = &self.x8
            && s.dot_rows_multi(w, r0, n_rows, acts, act_stride, n_act, out, out_stride)
        {
            return;
        }
        let cols = w.cols;
        let fmt = self.act_format(w);
        let ab = Self::act_row_bytes(fmt, cols);
        debug_assert!(r0 + n_rows <= w.rows, "rows {r0}+{n_rows} of {}", w.rows);
        debug_assert!(n_act == 0 || (n_act - 1) * act_stride + ab <= acts.len());
        debug_assert!(n_act == 0 || (n_act - 1) * out_stride + n_rows <= out.len());
        let act_t = |t: usize| acts.get(t * act_stride..t * act_stride + ab);
        let plan = self.plan(w);
        if let Plan::Ggml {
            gemm: Some(g),
            data,
            rb,
            ..
        } = &plan
            && n_act >= GEMM_MIN_TOKENS
            && let Some(wd) = data.get(r0 * rb..(r0 + n_rows) * rb)
            && g(GemmArgs {
                w: wd,
                rb: *rb,
                n_rows,
                acts,
                act_stride,
                n_act,
                cols,
                out: &mut out[..],
                out_stride,
            })
        {
            return;
        }
        // Many tokens: in blocks, so that a block's activation rows stay in L1/L2 while the
        // tile's weight rows are dotted with them (each row read once per block from L2,
        // instead of every token row streamed from L3 once per weight row).
        if n_act > TOKEN_BLOCK {
            for c0 in (0..n_act).step_by(TOKEN_BLOCK) {
                let nc = TOKEN_BLOCK.min(n_act - c0);
                // Out-of-contract short buffers: missing activations give NaN, missing
                // outputs are skipped, as below.
                let a = acts.get(c0 * act_stride..).unwrap_or(&[]);
                let o = out.get_mut(c0 * out_stride..).unwrap_or(&mut []);
                self.dot_rows_multi(w, r0, n_rows, a, act_stride, nc, o, out_stride);
            }
            return;
        }
        let mut put = |t: usize, i: usize, v: f32| {
            if let Some(o) = out.get_mut(t * out_stride + i) {
                *o = v;
            }
        };
        // Int4 compressed-tensors rows at one token, where the table has `ct_nib4_perm`: the
        // activation quants rearranged once here for all the rows (rows of at most
        // CT_PERM_MAX_COLS; the buffer is only zeroed on this path).
        let mut perm_store: Option<[i8; CT_PERM_MAX_COLS]> = None;
        let perm = match (&plan, self.t.ct_nib4_perm) {
            (Plan::CtInt { p, .. }, Some((order, f)))
                if p.codes == ct::Codes::Nib4
                    && n_act == 1
                    && cols <= CT_PERM_MAX_COLS
                    && cols.is_multiple_of(64) =>
            {
                act_t(0)
                    .and_then(|a| act::Q8_0Act::new(a, cols))
                    .map(|act| {
                        let buf = &mut perm_store.insert([0; CT_PERM_MAX_COLS])[..cols];
                        order(act.qs, buf);
                        (f, &*buf)
                    })
            }
            _ => None,
        };
        for i in 0..n_rows {
            let r = r0 + i;
            if r >= w.rows {
                (0..n_act).for_each(|t| put(t, i, f32::NAN));
                continue;
            }
            match &plan {
                Plan::Ggml {
                    f, fm, data, rb, ..
                } => {
                    if let Some(next) =
                        data.get((r + PREFETCH_ROWS) * rb..(r + PREFETCH_ROWS + 1) * rb)
                    {
                        (self.t.prefetch)(next);
                    }
                    let row = data.get(r * rb..(r + 1) * rb);
                    let mut t0 = 0;
                    if let (Some(fm), Some(row), 2..) = (fm, row, n_act) {
                        // Groups of up to MULTI_TOKENS; a last group of one takes `f`.
                        while n_act - t0 >= 2 {
                            let nt = (n_act - t0).min(MULTI_TOKENS);
                            let mut a: [&[u8]; MULTI_TOKENS] = [&[]; MULTI_TOKENS];
                            let mut ok = true;
                            for (k, slot) in a[..nt].iter_mut().enumerate() {
                                match act_t(t0 + k) {
                                    Some(x) => *slot = x,
                                    None => ok = false,
                                }
                            }
                            if !ok {
                                break;
                            }
                            let mut v = [0.0f32; MULTI_TOKENS];
                            fm(row, &a[..nt], cols, &mut v[..nt]);
                            for (k, &v) in v[..nt].iter().enumerate() {
                                put(t0 + k, i, v);
                            }
                            t0 += nt;
                        }
                    }
                    for t in t0..n_act {
                        let v = match (row, act_t(t)) {
                            (Some(row), Some(a)) => f(row, a, cols),
                            _ => f32::NAN,
                        };
                        put(t, i, v);
                    }
                }
                Plan::CtInt { f, m, p } => {
                    let (ahead, rb) = (r + PREFETCH_ROWS, p.weight_row_bytes);
                    if let Some(next) = m.weight.get(ahead * rb..(ahead + 1) * rb) {
                        (self.t.prefetch)(next);
                    }
                    if let (Some((fp, qperm)), Some(a)) = (perm, act_t(0)) {
                        put(0, i, ct::dot_row_perm(fp, m, p, r, qperm, a));
                        continue;
                    }
                    for t in 0..n_act {
                        let v = act_t(t).map_or(f32::NAN, |a| ct::dot_row(*f, m, p, r, a));
                        put(t, i, v);
                    }
                }
                Plan::GgmlFallback {
                    ty,
                    data,
                    rb,
                    blk,
                    blk_bytes,
                } => {
                    let mut acc = [0.0f32; MAX_FALLBACK_TOKENS];
                    let row = data.get(r * rb..(r + 1) * rb);
                    // Tokens in groups so that each chunk is decoded once per group.
                    for t0 in (0..n_act).step_by(MAX_FALLBACK_TOKENS) {
                        let nt = (n_act - t0).min(MAX_FALLBACK_TOKENS);
                        acc[..nt].fill(0.0);
                        let mut buf = [0.0f32; FALLBACK_CHUNK];
                        let per = FALLBACK_CHUNK / blk * blk;
                        let mut c0 = 0;
                        while c0 < cols {
                            let c1 = (c0 + per).min(cols);
                            let dec = &mut buf[..c1 - c0];
                            match row.and_then(|r| {
                                r.get(c0 / blk * blk_bytes..c1.div_ceil(*blk) * blk_bytes)
                            }) {
                                Some(src) => quant::dequantize_row(*ty, src, dec),
                                None => dec.fill(f32::NAN),
                            }
                            for (k, a) in acc[..nt].iter_mut().enumerate() {
                                *a += match act_t(t0 + k) {
                                    Some(a) => (self.t.dot_f32)(dec, &a.as_chunks::<4>().0[c0..c1]),
                                    None => f32::NAN,
                                };
                            }
                            c0 = c1;
                        }
                        for (k, &a) in acc[..nt].iter().enumerate() {
                            put(t0 + k, i, a);
                        }
                    }
                }
                Plan::CtFallback(m) => {
                    let mut buf = [0.0f32; MAX_CT_FALLBACK_COLS];
                    let ok = cols <= MAX_CT_FALLBACK_COLS;
                    if ok {
                        m.dequant_row(r, &mut buf[..cols]);
                    }
                    for t in 0..n_act {
                        let v = match act_t(t) {
                            Some(a) if ok => (self.t.dot_f32)(&buf[..cols], a.as_chunks::<4>().0),
                            _ => f32::NAN,
                        };
                        put(t, i, v);
                    }
                }
                Plan::Invalid => (0..n_act).for_each(|t| put(t, i, f32::NAN)),
            }
        }
    }

    /// Whether `w` can be dotted by this table (a ggml type core decodes, or any
    /// compressed-tensors matrix of at most [`MAX_CT_FALLBACK_COLS`] columns or with an
    /// integer kernel). Call at load; [`Kernels::dot_rows`] gives NaN for the others.
    pub fn supports(&self, w: &MatRef<'_>) -> bool {
        !matches!(self.plan(w), Plan::Invalid)
    }

    /// Picks the kernel for `w` (once per call, never per row).
    fn plan<'m>(&self, w: &'m MatRef<'m>) -> Plan<'m> {
        let t = &self.t;
        match &w.enc {
            Encoding::Ggml { ty, data } => {
                let Some(rb) = ty.row_bytes(w.cols as u64).map(|b| b as usize) else {
                    return Plan::Invalid;
                };
                let f = match (ty, self.act_format(w)) {
                    _ if t.force_fallback => None,
                    (GgmlType::Q8_0, ActFormat::Q8_0) => Some(t.q8_0),
                    (GgmlType::Q4_0, ActFormat::Q8_0) => Some(t.q4_0),
                    (GgmlType::Q4_1, ActFormat::Q8_0) => Some(t.q4_1),
                    (GgmlType::Q5_0, ActFormat::Q8_0) => Some(t.q5_0),
                    (GgmlType::Q5_1, ActFormat::Q8_0) => Some(t.q5_1),
                    (GgmlType::Q2K, ActFormat::Q8K) => Some(t.q2k),
                    (GgmlType::Q3K, ActFormat::Q8K) => Some(t.q3k),
                    (GgmlType::Q4K, ActFormat::Q8K) => Some(t.q4k),
                    (GgmlType::Q5K, ActFormat::Q8K) => Some(t.q5k),
                    (GgmlType::Q6K, ActFormat::Q8K) => Some(t.q6k),
                    (GgmlType::IQ4XS, ActFormat::Q8K) => Some(t.iq4xs),
                    (GgmlType::IQ3XXS, ActFormat::Q8K) => Some(t.iq3xxs),
                    (GgmlType::IQ3S, ActFormat::Q8K) => Some(t.iq3s),
                    (GgmlType::IQ2XXS, ActFormat::Q8K) => Some(t.iq2xxs),
                    (GgmlType::IQ2XS, ActFormat::Q8K) => Some(t.iq2xs),
                    (GgmlType::IQ2S, ActFormat::Q8K) => Some(t.iq2s),
                    (GgmlType::IQ1S, ActFormat::Q8K) => Some(t.iq1s),
                    (GgmlType::IQ1M, ActFormat::Q8K) => Some(t.iq1m),
                    (GgmlType::IQ4NL, ActFormat::Q8_0) => Some(t.iq4nl),
                    (GgmlType::MXFP4, ActFormat::Q8_0) => Some(t.mxfp4),
                    (GgmlType::F32, _) => Some(t.f32),
                    (GgmlType::F16, _) => Some(t.f16),
                    (GgmlType::BF16, _) => Some(t.bf16),
                    _ => None,
                };
                let fm = match ty {
                    GgmlType::Q4K => t.q4k_multi,
                    GgmlType::Q8_0 => t.q8_0_multi,
                    GgmlType::Q6K => t.q6k_multi,
                    GgmlType::Q2K => t.q2k_multi,
                    GgmlType::Q4_0 => t.q4_0_multi,
                    GgmlType::Q4_1 => t.q4_1_multi,
                    GgmlType::Q5_0 => t.q5_0_multi,
                    GgmlType::Q5_1 => t.q5_1_multi,
                    GgmlType::Q3K => t.q3k_multi,
                    GgmlType::IQ4XS => t.iq4xs_multi,
                    GgmlType::IQ2XXS => t.iq2xxs_multi,
                    GgmlType::IQ2XS => t.iq2xs_multi,
                    GgmlType::IQ2S => t.iq2s_multi,
                    GgmlType::IQ3XXS => t.iq3xxs_multi,
                    GgmlType::IQ3S => t.iq3s_multi,
                    GgmlType::IQ1S => t.iq1s_multi,
                    GgmlType::IQ1M => t.iq1m_multi,
                    _ => None,
                };
                let gemm = match ty {
                    GgmlType::Q4K => t.q4k_gemm,
                    GgmlType::Q6K => t.q6k_gemm,
                    GgmlType::Q8_0 => t.q8_0_gemm,
                    GgmlType::F32 => t.f32_gemm,
                    GgmlType::F16 => t.f16_gemm,
                    GgmlType::BF16 => t.bf16_gemm,
                    _ => None,
                };
                match f {
                    Some(f) => Plan::Ggml {
                        f,
                        fm,
                        gemm,
                        data,
                        rb,
                    },
                    None if quant::supported(*ty) => {
                        let (blk, blk_bytes) = ty.block();
                        Plan::GgmlFallback {
                            ty: *ty,
                            data,
                            rb,
                            blk,
                            blk_bytes,
                        }
                    }
                    None => Plan::Invalid,
                }
            }
            Encoding::Ct(m) => match ct::plan(m).filter(|_| !t.force_fallback) {
                Some(p) => Plan::CtInt {
                    f: match p.codes {
                        ct::Codes::Nib4 => t.ct_nib4,
                        ct::Codes::U8 => t.ct_u8,
                        ct::Codes::I8 => t.ct_i8,
                    },
                    m,
                    p,
                },
                None if w.cols <= MAX_CT_FALLBACK_COLS && m.layout.check().is_ok() => {
                    Plan::CtFallback(m)
                }
                None => Plan::Invalid,
            },
        }
    }
}

/// How many rows ahead `dot_rows` asks the caches for weight bytes. One core streams from
/// DRAM faster when it prefetches explicitly; measured on the GPU host's Xeon, single
/// thread, 10 experts of Laguna S 2.1 shape (see benches/kernels.rs).
const PREFETCH_ROWS: usize = 4;

/// Tokens the ggml fallback dots per decoded chunk (stack accumulators).
const MAX_FALLBACK_TOKENS: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;

    /// The F32 several-token path (the router in prefill) is bit-identical to one token at a
    /// time, for every group size and remainder, a ragged width (32-, 8- and 1-element
    /// steps) and a NaN confined to its token.
    #[test]
    fn f32_multi_token_matches_one_token() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut f = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        for k in Kernels::simd_tables().chain([Kernels::scalar()]) {
            for cols in [2048, 77, 5] {
                let rows = 5;
                let w: Vec<u8> = (0..rows * cols).flat_map(|_| f().to_le_bytes()).collect();
                let m = MatRef {
                    rows,
                    cols,
                    enc: Encoding::Ggml {
                        ty: GgmlType::F32,
                        data: &w,
                    },
                };
                assert_eq!(k.act_format(&m), ActFormat::F32);
                let ab = 4 * cols;
                let stride = ab + 8;
                for n_act in 1..=9usize {
                    let mut acts = vec![0u8; (n_act - 1) * stride + ab];
                    for t in 0..n_act {
                        let x: Vec<f32> = (0..cols)
                            .map(|i| {
                                if t == 5 && i == cols / 2 {
                                    f32::NAN
                                } else {
                                    f()
                                }
                            })
                            .collect();
                        k.quantize_act(ActFormat::F32, &x, &mut acts[t * stride..t * stride + ab]);
                    }
                    let (r0, nr, os) = (1, rows - 1, rows + 2);
                    let mut out = vec![f32::INFINITY; (n_act - 1) * os + nr];
                    k.dot_rows_multi(&m, r0, nr, &acts, stride, n_act, &mut out, os);
                    for t in 0..n_act {
                        let mut one = vec![0.0; nr];
                        k.dot_rows(&m, r0, &acts[t * stride..t * stride + ab], &mut one);
                        for (i, &want) in one.iter().enumerate() {
                            let got = out[t * os + i];
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{} cols {cols} n_act {n_act} token {t} row {i}",
                                k.name()
                            );
                            assert_eq!(got.is_nan(), t == 5);
                        }
                    }
                }
            }
        }
    }
}
