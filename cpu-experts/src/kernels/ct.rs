//! compressed-tensors integer weights × Q8_0 activations (spec §7.3, §7.4).
//!
//! A pack-quantized int4/int8 (or naive `I8`) matrix whose scale runs (group, channel,
//! tensor or block width) are whole multiples of 32 columns is dotted in the integer
//! domain: per 32-column block `Σ c·q_a` (exact i32, `c` the stored code), then
//!
//! `dot = Σ_g s_g · ( Σ_{b∈g} d_b·Σ c·q_a  −  (off + z_g) · Σ_{b∈g} ds_b )`
//!
//! with `off` the code offset (8 for int4, 0 once int8 codes are re-centred), `z_g` the zero
//! point (0 when symmetric) and `ds_b = d_b·Σ q_a` from the activation row. The row kernels
//! (`CtRowDot`) compute the symmetric part; the asymmetric zero-point term is added here in
//! scalar code (one multiply per 32 columns).
//!
//! Numerics: compressed-tensors' reference (`CtMatrix::dequant_row`) rounds every weight
//! `(q − z)·s` to the scale dtype (bf16: 8 significant bits). The integer kernel uses the
//! exact product instead, so it is the dot of the *unrounded* quantised weights: against the
//! bf16-rounded reference it differs by up to 2⁻⁹ of Σ|w·a| (f16 scales: 2⁻¹²).

use lagoon_core::quant::QK;
use lagoon_core::quant::ct::{
    CtKind, CtMatrix, CtStrategy, PackOrder, ScaleDtype, ZeroPoint, ZpDtype,
};

use super::act::Q8_0Act;

/// How a weight row stores its integer codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Codes {
    /// pack-quantized 4-bit: column c is nibble c of the little-endian byte stream (low
    /// nibble first), stored `q + 8`.
    Nib4,
    /// pack-quantized 8-bit: one byte per column, stored `q + 128`.
    U8,
    /// naive / int-quantized `I8`: one signed byte per column, not offset.
    I8,
}

/// One row of the symmetric part: `Σ_g s_g · Σ_{b∈g} d_b · Σ (code − off)·q_a` where group
/// `g` covers columns `[g·run, (g+1)·run)` (the last one may be shorter, still a multiple of
/// 32) and `s_g` is element g of `scales` (in `sd`).
pub(crate) type CtRowDot =
    fn(row: &[u8], scales: &[u8], sd: ScaleDtype, run: usize, a: &[u8], n: usize) -> f32;

/// A `CtRowDot` for int4 codes that takes the activation quants already rearranged by its
/// [`CtActOrder`] (`qperm`), beside the activation row `a` (for its block scales); same
/// results as the kernel table's `ct_nib4`.
pub(crate) type CtRowDotPerm = fn(
    row: &[u8],
    scales: &[u8],
    sd: ScaleDtype,
    run: usize,
    qperm: &[i8],
    a: &[u8],
    n: usize,
) -> f32;

/// Rearranges an activation row's quants for a [`CtRowDotPerm`] (lengths: equal multiples
/// of 64).
pub(crate) type CtActOrder = fn(qs: &[i8], out: &mut [i8]);

/// What [`dot_row`] needs to know about a matrix, worked out once per call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CtIntPlan {
    pub codes: Codes,
    /// Columns per scale cell (a multiple of 32).
    pub run: usize,
    /// Output rows per scale-grid row (1 for group/channel, the block height for block).
    pub rows_per_grid_row: usize,
    /// Scale-grid columns.
    pub grid_cols: usize,
    pub tensor: bool,
    pub weight_row_bytes: usize,
}

/// The integer plan for `m`, or `None` if it needs the f32 fallback (other widths, FP8,
/// scale runs that are not multiples of 32, the per-word 3/5/6/7-bit order).
pub(crate) fn plan(m: &CtMatrix<'_>) -> Option<CtIntPlan> {
    let l = &m.layout;
    let codes = match l.kind {
        CtKind::PackedInt {
            bits: 4,
            order: PackOrder::Dense,
            ..
        } => Codes::Nib4,
        CtKind::PackedInt {
            bits: 8,
            order: PackOrder::Dense,
            ..
        } => Codes::U8,
        CtKind::Int8 { .. } => Codes::I8,
        _ => return None,
    };
    let (run, rows_per_grid_row, tensor) = match l.kind.strategy() {
        CtStrategy::Tensor => (l.cols, 1, true),
        CtStrategy::Channel => (l.cols, 1, false),
        CtStrategy::Group(g) => (g as usize, 1, false),
        CtStrategy::Block { rows, cols } => (cols as usize, rows as usize, false),
    };
    if l.cols == 0 || !l.cols.is_multiple_of(QK) || run == 0 || !run.is_multiple_of(QK) {
        return None;
    }
    if l.check().is_err() {
        return None;
    }
    Some(CtIntPlan {
        codes,
        run,
        rows_per_grid_row: rows_per_grid_row.max(1),
        grid_cols: l.scale_grid().1,
        tensor,
        weight_row_bytes: l.weight_row_bytes(),
    })
}

/// Row `r` of `m` dotted with the Q8_0 activation row `a`, through `f` for the symmetric
/// part. NaN if a buffer is short (never panics).
pub(crate) fn dot_row(f: CtRowDot, m: &CtMatrix<'_>, p: &CtIntPlan, r: usize, a: &[u8]) -> f32 {
    let (sd, cols) = (m.layout.scale_dtype, m.layout.cols);
    dot_row_by(m, p, r, a, |row, scales| f(row, scales, sd, p.run, a, cols))
}

/// [`dot_row`] through a [`CtRowDotPerm`], `qperm` being `a`'s quants in its order.
pub(crate) fn dot_row_perm(
    f: CtRowDotPerm,
    m: &CtMatrix<'_>,
    p: &CtIntPlan,
    r: usize,
    qperm: &[i8],
    a: &[u8],
) -> f32 {
    let (sd, cols) = (m.layout.scale_dtype, m.layout.cols);
    dot_row_by(m, p, r, a, |row, scales| {
        f(row, scales, sd, p.run, qperm, a, cols)
    })
}

/// [`dot_row`]'s body: `sym(row, scales)` gives the symmetric part of row `r`.
fn dot_row_by(
    m: &CtMatrix<'_>,
    p: &CtIntPlan,
    r: usize,
    a: &[u8],
    sym: impl Fn(&[u8], &[u8]) -> f32,
) -> f32 {
    let l = &m.layout;
    let sd = l.scale_dtype;
    let sz = sd.size();
    let Some(row) = m
        .weight
        .get(r * p.weight_row_bytes..(r + 1) * p.weight_row_bytes)
    else {
        return f32::NAN;
    };
    let grid_row = if p.tensor { 0 } else { r / p.rows_per_grid_row };
    let n_groups = if p.tensor { 1 } else { p.grid_cols };
    let s0 = grid_row * p.grid_cols * sz;
    let Some(scales) = m.scale.get(s0..s0 + n_groups * sz) else {
        return f32::NAN;
    };
    let mut v = sym(row, scales);
    if l.zero.is_some() {
        let Some(act) = Q8_0Act::new(a, l.cols) else {
            return f32::NAN;
        };
        let bpg = p.run / QK; // blocks per group
        let mut corr = 0.0f32;
        for g in 0..l.cols.div_ceil(p.run) {
            let cell = if p.tensor {
                0
            } else {
                grid_row * p.grid_cols + g
            };
            let z = sd.round(zero_point(m, p, r, g, cell));
            let ds: f32 = (g * bpg..((g + 1) * bpg).min(l.cols / QK))
                .map(|b| act.ds(b))
                .sum();
            corr += load_scale(sd, scales, if p.tensor { 0 } else { g }) * (z * ds);
        }
        v -= corr;
    }
    v
}

/// Element `i` of a little-endian buffer of `sd`.
#[inline]
pub(crate) fn load_scale(sd: ScaleDtype, b: &[u8], i: usize) -> f32 {
    match sd {
        ScaleDtype::Bf16 => {
            f32::from_bits(u32::from(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])) << 16)
        }
        ScaleDtype::F16 => super::scalar::f16_at(b, 2 * i),
        ScaleDtype::F32 => f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]),
    }
}

/// Signed zero point of row `r`, scale column `g` (grid cell `cell`), as core decodes it.
fn zero_point(m: &CtMatrix<'_>, p: &CtIntPlan, r: usize, g: usize, cell: usize) -> f32 {
    let z = m.zero;
    let u32_at =
        |k: usize| u32::from_le_bytes([z[4 * k], z[4 * k + 1], z[4 * k + 2], z[4 * k + 3]]);
    match m.layout.zero {
        None => 0.0,
        Some(ZeroPoint::Plain(t)) => match t {
            ZpDtype::I8 => z[cell] as i8 as f32,
            ZpDtype::U8 => z[cell] as f32,
            ZpDtype::I32 => u32_at(cell) as i32 as f32,
            ZpDtype::I64 => {
                let mut w = [0u8; 8];
                w.copy_from_slice(&z[8 * cell..8 * cell + 8]);
                i64::from_le_bytes(w) as f32
            }
            ZpDtype::Bf16 => load_scale(ScaleDtype::Bf16, z, cell),
            ZpDtype::F16 => load_scale(ScaleDtype::F16, z, cell),
            ZpDtype::F32 => load_scale(ScaleDtype::F32, z, cell),
        },
        Some(ZeroPoint::Packed) => {
            // Packed along the output dimension: row r is element r of column g's word
            // stream, word k of that stream at index k·grid_cols + g (4 or 8 bits only here).
            let bits = match p.codes {
                Codes::Nib4 => 4,
                _ => 8,
            };
            let per = 32 / bits;
            let word = u32_at((r / per) * p.grid_cols + g);
            let code = (word >> (bits * (r % per))) & ((1 << bits) - 1);
            (code as i32 - (1 << (bits - 1))) as f32
        }
    }
}

/// The signed value of column `c` of a row and the offset subtracted from its code.
#[inline]
fn code(codes: Codes, row: &[u8], c: usize) -> i32 {
    match codes {
        Codes::Nib4 => i32::from((row[c / 2] >> (4 * (c % 2))) & 0xF) - 8,
        Codes::U8 => i32::from(row[c]) - 128,
        Codes::I8 => i32::from(row[c] as i8),
    }
}

/// The scalar row kernel for `codes`: per 32-block exact `Σ q·q_a`, times `d_b`, summed per
/// group in f32, times the group's scale.
#[inline]
fn scalar_row(
    codes: Codes,
    row: &[u8],
    scales: &[u8],
    sd: ScaleDtype,
    run: usize,
    a: &[u8],
    n: usize,
) -> f32 {
    let Some(a) = Q8_0Act::new(a, n) else {
        return f32::NAN;
    };
    let need = match codes {
        Codes::Nib4 => n / 2,
        _ => n,
    };
    let n_groups = n.div_ceil(run.max(1));
    if row.len() < need || run == 0 || scales.len() < n_groups * sd.size() {
        return f32::NAN;
    }
    let mut acc = 0.0f32;
    for g in 0..n_groups {
        let mut gsum = 0.0f32;
        for b in g * run / QK..((g + 1) * run).min(n) / QK {
            let sumi: i32 = (QK * b..QK * (b + 1))
                .map(|c| code(codes, row, c) * i32::from(a.qs[c]))
                .sum();
            gsum += a.d(b) * sumi as f32;
        }
        acc += load_scale(sd, scales, g) * gsum;
    }
    acc
}

/// Scalar `CtRowDot` for pack-quantized int4.
pub fn vec_dot_ct_nib4_q8_0(
    row: &[u8],
    scales: &[u8],
    sd: ScaleDtype,
    run: usize,
    a: &[u8],
    n: usize,
) -> f32 {
    scalar_row(Codes::Nib4, row, scales, sd, run, a, n)
}

/// Scalar `CtRowDot` for pack-quantized int8.
pub fn vec_dot_ct_u8_q8_0(
    row: &[u8],
    scales: &[u8],
    sd: ScaleDtype,
    run: usize,
    a: &[u8],
    n: usize,
) -> f32 {
    scalar_row(Codes::U8, row, scales, sd, run, a, n)
}

/// Scalar `CtRowDot` for naive `I8`.
pub fn vec_dot_ct_i8_q8_0(
    row: &[u8],
    scales: &[u8],
    sd: ScaleDtype,
    run: usize,
    a: &[u8],
    n: usize,
) -> f32 {
    scalar_row(Codes::I8, row, scales, sd, run, a, n)
}
