//! Tensor-driven detection of quantised Linears (spec/formats.md §7.8). For every module
//! prefix `P`:
//! 1. `P.weight_packed` I32 ⇒ pack-quantized (with `P.weight_scale`, `P.weight_shape`, and
//!    `P.weight_zero_point` iff asymmetric);
//! 2. `P.weight_packed` U8 ⇒ NVFP4 / MXFP4: refused;
//! 3. `P.weight` F8_E4M3 ⇒ FP8 with `P.weight_scale` (or HF fp8's `P.weight_scale_inv`);
//! 4. `P.weight` I8 with `P.weight_scale` ⇒ int8 (int-quantized);
//! 5. anything else is a plain tensor.
//!
//! The config supplies only what the tensors cannot say, and cross-checks.

use std::collections::{HashMap, HashSet};

use lagoon_core::quant::ct::{
    CtKind, CtLayout, CtStrategy, PackOrder, ScaleDtype, ZeroPoint, ZpDtype, packed_words,
};

use super::HfError;
use super::ct_config::{CtConfig, QuantConfig, QuantType, Strategy, WeightArgs};
use super::safetensors::{Dtype, TensorInfo};
use crate::checkpoint::{PartRecord, Span};
use crate::compressed::CtRecord;

/// One tensor of the directory, with the index of its file.
#[derive(Clone, Debug)]
pub struct FileTensor {
    pub file: u32,
    pub info: TensorInfo,
}

impl FileTensor {
    pub fn span(&self) -> Span {
        Span {
            file: self.file,
            start: self.info.start,
            len: self.info.len,
        }
    }
}

/// A logical weight before name normalisation: a quantised Linear (`P.weight`) or a plain
/// tensor, with its PyTorch-order shape.
#[derive(Clone, Debug)]
pub struct Logical {
    /// `P.weight` for quantised modules, else the tensor's own name.
    pub hf_name: String,
    pub shape: Vec<usize>,
    pub part: PartRecord,
    /// The safetensors dtype of a plain tensor (`None` for quantised modules).
    pub dtype: Option<Dtype>,
}

/// Companion tensors a quantised module consumes.
const COMPANIONS: &[&str] = &[
    "weight_packed",
    "weight_scale",
    "weight_scale_inv",
    "weight_shape",
    "weight_zero_point",
    "weight_global_scale",
];

/// Splits `tensors` (in file order) into logical weights. Tensors whose dtype has no ggml
/// equivalent and that belong to no quantised module are left out (reported by name in
/// `skipped`).
pub fn collect(
    tensors: &[FileTensor],
    bytes: &dyn Fn(Span) -> Vec<u8>,
    quant: &QuantConfig,
    skipped: &mut Vec<String>,
) -> Result<Vec<Logical>, HfError> {
    let by_name: HashMap<&str, &FileTensor> =
        tensors.iter().map(|t| (t.info.name.as_str(), t)).collect();
    let ct = match quant {
        QuantConfig::CompressedTensors(c) => Some(c),
        _ => None,
    };
    // Pass 1: quantised modules, which consume their companion tensors.
    let mut consumed: HashSet<&str> = HashSet::new();
    let mut modules: HashMap<&str, Logical> = HashMap::new();
    for t in tensors {
        let name = t.info.name.as_str();
        let Some(p) = name
            .strip_suffix(".weight_packed")
            .or_else(|| name.strip_suffix(".weight"))
        else {
            continue;
        };
        if let Some(l) = detect(p, t, &by_name, bytes, quant, ct)? {
            for c in COMPANIONS.iter().chain(&["weight"]) {
                if let Some((k, _)) = by_name.get_key_value(format!("{p}.{c}").as_str()) {
                    consumed.insert(k);
                }
            }
            modules.insert(name, l);
        }
    }
    // Pass 2: in file order, each module where its main tensor lies, everything else plain.
    let mut out = Vec::new();
    for t in tensors {
        let name = t.info.name.as_str();
        if let Some(l) = modules.remove(name) {
            out.push(l);
        } else if consumed.contains(name) {
            continue;
        } else if let Some(l) = plain(t) {
            out.push(l);
        } else if super::names::map_name(name) != super::names::Mapped::Unknown {
            // A tensor the model needs, in a dtype nothing decodes (e.g. a bare FP8 weight
            // without a scale): say so rather than report it missing later.
            return Err(HfError::UnsupportedDtype {
                tensor: name.to_string(),
                dtype: t.info.dtype.to_string(),
            });
        } else {
            skipped.push(name.to_string());
        }
    }
    Ok(out)
}

/// A plain tensor as one ggml-typed part, or `None` if its dtype has no ggml equivalent.
pub fn plain(t: &FileTensor) -> Option<Logical> {
    let ty = t.info.dtype.ggml()?;
    Some(Logical {
        hf_name: t.info.name.clone(),
        shape: t.info.shape.clone(),
        part: PartRecord::Ggml { ty, span: t.span() },
        dtype: Some(t.info.dtype),
    })
}

fn ct_err(module: &str, detail: impl Into<String>) -> HfError {
    HfError::CtUnsupported {
        module: module.to_string(),
        detail: detail.into(),
    }
}

fn missing(module: &str, tensor: &str) -> HfError {
    HfError::CtMissing {
        module: module.to_string(),
        tensor: format!("{module}.{tensor}"),
    }
}

/// Recognises the quantised module `p` whose main tensor is `t`, or `None` for a plain one.
fn detect(
    p: &str,
    t: &FileTensor,
    by_name: &HashMap<&str, &FileTensor>,
    bytes: &dyn Fn(Span) -> Vec<u8>,
    quant: &QuantConfig,
    ct: Option<&CtConfig>,
) -> Result<Option<Logical>, HfError> {
    let get = |suffix: &str| by_name.get(format!("{p}.{suffix}").as_str()).copied();
    let packed = t.info.name.ends_with(".weight_packed");
    let kind_of_weight = match (packed, t.info.dtype) {
        (true, Dtype::I32) => Family::Packed,
        (true, Dtype::U8) => {
            let format = if get("weight_global_scale").is_some() {
                "nvfp4-pack-quantized"
            } else {
                "mxfp4-pack-quantized"
            };
            return Err(HfError::UnsupportedFormat {
                format: format.into(),
                module: p.to_string(),
            });
        }
        (true, d) => {
            return Err(HfError::CtDtype {
                tensor: t.info.name.clone(),
                expected: "I32 (pack-quantized) or U8 (FP4)",
                got: d,
            });
        }
        (false, Dtype::F8E4M3) => Family::Fp8,
        (false, Dtype::I8) if get("weight_scale").is_some() => Family::Int8,
        (false, d @ (Dtype::F8E5M2 | Dtype::F8E4M3Fnuz | Dtype::F8E5M2Fnuz | Dtype::F8E8M0))
            if get("weight_scale").is_some() || get("weight_scale_inv").is_some() =>
        {
            return Err(HfError::UnsupportedFormat {
                format: format!("{d} weights"),
                module: p.to_string(),
            });
        }
        _ => return Ok(None),
    };
    if let Some(c) = ct {
        c.check_format(p)?;
    }
    let args = ct
        .and_then(|c| c.scheme_for(p))
        .and_then(|g| g.weights.as_ref());
    if get("weight_g_idx").is_some() {
        return Err(ct_err(
            p,
            "activation-ordered groups (`weight_g_idx`, actorder=group) are not supported; re-export with actorder=weight or none",
        ));
    }
    let (scale_t, scale_inv) = match (get("weight_scale"), get("weight_scale_inv")) {
        (Some(s), _) => (s, false),
        (None, Some(s)) if kind_of_weight == Family::Fp8 => (s, true),
        _ => return Err(missing(p, "weight_scale")),
    };
    let scale_dtype = match scale_t.info.dtype {
        Dtype::BF16 => ScaleDtype::Bf16,
        Dtype::F16 => ScaleDtype::F16,
        Dtype::F32 => ScaleDtype::F32,
        d => {
            return Err(HfError::CtDtype {
                tensor: scale_t.info.name.clone(),
                expected: "BF16, F16 or F32",
                got: d,
            });
        }
    };
    let shape = &t.info.shape;
    if shape.len() != 2 {
        return Err(ct_err(
            p,
            format!(
                "quantised weights of rank {} (e.g. fused 3-D experts) are not supported; only per-Linear 2-D tensors are",
                shape.len()
            ),
        ));
    }
    let zp_t = get("weight_zero_point");
    let (rows, cols, kind, zero) = match kind_of_weight {
        Family::Packed => {
            let shape_t = get("weight_shape").ok_or_else(|| missing(p, "weight_shape"))?;
            let (rows, cols) = read_shape(shape_t, bytes)?;
            if rows != shape[0] {
                return Err(HfError::CtShape {
                    tensor: t.info.name.clone(),
                    expected: vec![rows, shape[1]],
                    got: shape.clone(),
                });
            }
            let words = shape[1];
            let version = ct.and_then(|c| c.version);
            let (bits, order) = pack_bits(p, args, cols, words, version)?;
            let strategy = strategy(p, args, rows, cols, scale_t)?;
            let zero = match zp_t {
                None => None,
                Some(z) => Some(packed_zero(z, strategy, rows, cols, bits, order)?),
            };
            if zero.is_none() && args.is_some_and(|a| !a.symmetric) {
                return Err(missing(p, "weight_zero_point"));
            }
            let kind = CtKind::packed_int(bits, strategy, zero.is_none(), order);
            (rows, cols, kind, zero)
        }
        Family::Int8 => {
            if let Some(a) = args
                && (a.ty != QuantType::Int || a.num_bits > 8)
            {
                return Err(ct_err(
                    p,
                    format!(
                        "I8 weights but the config says {} {}-bit",
                        ty_name(a.ty),
                        a.num_bits
                    ),
                ));
            }
            let (rows, cols) = (shape[0], shape[1]);
            let strategy = strategy(p, args, rows, cols, scale_t)?;
            let zero = match zp_t {
                None => None,
                Some(z) => Some(plain_zero(z)?),
            };
            if zero.is_none() && args.is_some_and(|a| !a.symmetric) {
                return Err(missing(p, "weight_zero_point"));
            }
            let kind = CtKind::Int8 {
                symmetric: zero.is_none(),
                strategy,
            };
            (rows, cols, kind, zero)
        }
        Family::Fp8 => {
            if let Some(a) = args
                && (a.ty != QuantType::Float || a.num_bits != 8)
            {
                return Err(ct_err(
                    p,
                    format!(
                        "F8_E4M3 weights but the config says {} {}-bit",
                        ty_name(a.ty),
                        a.num_bits
                    ),
                ));
            }
            if zp_t.is_some() {
                return Err(ct_err(
                    p,
                    "asymmetric FP8 (a weight_zero_point) is not supported",
                ));
            }
            let (rows, cols) = (shape[0], shape[1]);
            let strategy = match (quant, scale_inv) {
                (
                    QuantConfig::HfFp8 {
                        block: Some((r, c)),
                    },
                    _,
                ) => {
                    let s = CtStrategy::Block { rows: *r, cols: *c };
                    expect_grid(scale_t, s, rows, cols)?;
                    s
                }
                _ => strategy(p, args, rows, cols, scale_t)?,
            };
            (rows, cols, CtKind::Fp8 { strategy }, None)
        }
    };
    let layout = CtLayout {
        kind,
        rows,
        cols,
        scale_dtype,
        zero,
    };
    let rec = CtRecord {
        layout,
        weight: t.span(),
        scale: scale_t.span(),
        zero: zp_t.map(FileTensor::span),
    };
    rec.check().map_err(|e| ct_err(p, e.to_string()))?;
    Ok(Some(Logical {
        hf_name: format!("{p}.weight"),
        shape: vec![rows, cols],
        part: PartRecord::Ct(rec),
        dtype: None,
    }))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Packed,
    Int8,
    Fp8,
}

fn ty_name(t: QuantType) -> &'static str {
    match t {
        QuantType::Int => "int",
        QuantType::Float => "float",
    }
}

/// `P.weight_shape`: I64 (or I32) `[out, in]`.
fn read_shape(t: &FileTensor, bytes: &dyn Fn(Span) -> Vec<u8>) -> Result<(usize, usize), HfError> {
    let size = match t.info.dtype {
        Dtype::I64 => 8,
        Dtype::I32 => 4,
        d => {
            return Err(HfError::CtDtype {
                tensor: t.info.name.clone(),
                expected: "I64 or I32",
                got: d,
            });
        }
    };
    if t.info.numel() != 2 {
        return Err(HfError::CtShape {
            tensor: t.info.name.clone(),
            expected: vec![2],
            got: t.info.shape.clone(),
        });
    }
    let b = bytes(t.span());
    let read = |i: usize| -> i64 {
        let c = &b[i * size..(i + 1) * size];
        if size == 8 {
            i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))
        } else {
            i32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as i64
        }
    };
    let (r, c) = (read(0), read(1));
    match (usize::try_from(r), usize::try_from(c)) {
        (Ok(r), Ok(c)) if r > 0 && c > 0 => Ok((r, c)),
        _ => Err(HfError::CtShape {
            tensor: format!("{} (values)", t.info.name),
            expected: vec![],
            got: vec![r.max(0) as usize, c.max(0) as usize],
        }),
    }
}

/// Bit width and word order of a pack-quantized weight with `words` int32s per row of `cols`
/// values. The config's `num_bits` when there is one, else the only width that fits. For
/// 3/5/6/7 bits the word count tells the dense layout (≥ 0.20) from the per-word one (0.19);
/// where both fit, the writer's version decides.
fn pack_bits(
    p: &str,
    args: Option<&WeightArgs>,
    cols: usize,
    words: usize,
    version: Option<(u32, u32)>,
) -> Result<(u8, PackOrder), HfError> {
    let order_for = |bits: u8| -> Option<PackOrder> {
        let dense = packed_words(cols, bits, PackOrder::Dense) == words;
        let per = packed_words(cols, bits, PackOrder::PerWord) == words;
        match (dense, per) {
            (true, true) if 32 % bits as u32 != 0 && version.is_some_and(|v| v < (0, 20)) => {
                Some(PackOrder::PerWord)
            }
            (true, _) => Some(PackOrder::Dense),
            (false, true) => Some(PackOrder::PerWord),
            (false, false) => None,
        }
    };
    if let Some(a) = args {
        if a.ty != QuantType::Int || !(1..=8).contains(&a.num_bits) {
            return Err(ct_err(
                p,
                format!(
                    "pack-quantized weights but the config says {} {}-bit",
                    ty_name(a.ty),
                    a.num_bits
                ),
            ));
        }
        return order_for(a.num_bits)
            .map(|o| (a.num_bits, o))
            .ok_or_else(|| {
                ct_err(
                    p,
                    format!(
                        "`weight_packed` has {words} int32 words per row, but {} columns at {} bits need {}",
                        cols,
                        a.num_bits,
                        packed_words(cols, a.num_bits, PackOrder::Dense)
                    ),
                )
            });
    }
    let fits: Vec<(u8, PackOrder)> = (1..=8u8)
        .filter_map(|b| order_for(b).map(|o| (b, o)))
        .collect();
    // Without a config, prefer the current writer's layout when only one width fits it.
    let preferred = if version.is_some_and(|v| v < (0, 20)) {
        PackOrder::PerWord
    } else {
        PackOrder::Dense
    };
    let in_preferred: Vec<&(u8, PackOrder)> = fits.iter().filter(|f| f.1 == preferred).collect();
    match (fits.as_slice(), in_preferred.as_slice()) {
        ([one], _) => Ok(*one),
        (_, [one]) => Ok(**one),
        ([], _) => Err(ct_err(
            p,
            format!("{words} int32 words per row fit no bit width for {cols} columns"),
        )),
        _ => Err(ct_err(
            p,
            format!(
                "{words} int32 words per row of {cols} columns fit several bit widths; the config names no group for this module"
            ),
        )),
    }
}

/// The scale shape as `(rows, cols)`: `[]`/`[1]` → (1, 1), `[n]` → (n, 1).
fn grid_of(shape: &[usize]) -> Option<(usize, usize)> {
    match shape {
        [] => Some((1, 1)),
        [n] => Some((*n, 1)),
        [r, c] => Some((*r, *c)),
        _ => None,
    }
}

fn expected_grid(s: CtStrategy, rows: usize, cols: usize) -> (usize, usize) {
    match s {
        CtStrategy::Tensor => (1, 1),
        CtStrategy::Channel => (rows, 1),
        CtStrategy::Group(g) => (rows, cols.div_ceil(g as usize)),
        CtStrategy::Block { rows: br, cols: bc } => {
            (rows.div_ceil(br as usize), cols.div_ceil(bc as usize))
        }
    }
}

fn expect_grid(scale: &FileTensor, s: CtStrategy, rows: usize, cols: usize) -> Result<(), HfError> {
    let want = expected_grid(s, rows, cols);
    if grid_of(&scale.info.shape) == Some(want) {
        Ok(())
    } else {
        Err(HfError::CtShape {
            tensor: scale.info.name.clone(),
            expected: vec![want.0, want.1],
            got: scale.info.shape.clone(),
        })
    }
}

/// The scale strategy: from the config when it names one, else from the scale's shape
/// (`[1]` tensor, `[out, 1]` channel, `[out, k]` group `in / k`, `[⌈out/128⌉, ⌈in/128⌉]`
/// block 128).
fn strategy(
    p: &str,
    args: Option<&WeightArgs>,
    rows: usize,
    cols: usize,
    scale: &FileTensor,
) -> Result<CtStrategy, HfError> {
    let from_args = args.and_then(|a| match a.strategy {
        Strategy::Tensor => Some(CtStrategy::Tensor),
        Strategy::Channel => Some(CtStrategy::Channel),
        Strategy::Group(g) => Some(CtStrategy::Group(g)),
        Strategy::Block(r, c) => Some(CtStrategy::Block { rows: r, cols: c }),
        Strategy::Other => None,
    });
    if let Some(a) = args
        && a.strategy == Strategy::Other
    {
        return Err(ct_err(
            p,
            format!("weight strategy `{}` is not supported", a.strategy_name),
        ));
    }
    if let Some(s) = from_args {
        expect_grid(scale, s, rows, cols)?;
        return Ok(s);
    }
    let bad = || HfError::CtShape {
        tensor: scale.info.name.clone(),
        expected: vec![rows, 1],
        got: scale.info.shape.clone(),
    };
    let (sr, sc) = grid_of(&scale.info.shape).ok_or_else(bad)?;
    if sr * sc == 1 {
        return Ok(if rows == 1 {
            CtStrategy::Channel
        } else {
            CtStrategy::Tensor
        });
    }
    if sr == rows && sc == 1 {
        return Ok(CtStrategy::Channel);
    }
    if sr == rows && sc > 0 && cols.is_multiple_of(sc) {
        return Ok(CtStrategy::Group((cols / sc) as u32));
    }
    let b128 = CtStrategy::Block {
        rows: 128,
        cols: 128,
    };
    if expected_grid(b128, rows, cols) == (sr, sc) {
        return Ok(b128);
    }
    Err(bad())
}

fn zp_dtype(t: &FileTensor) -> Result<ZpDtype, HfError> {
    Ok(match t.info.dtype {
        Dtype::I8 => ZpDtype::I8,
        Dtype::U8 => ZpDtype::U8,
        Dtype::I32 => ZpDtype::I32,
        Dtype::I64 => ZpDtype::I64,
        Dtype::BF16 => ZpDtype::Bf16,
        Dtype::F16 => ZpDtype::F16,
        Dtype::F32 => ZpDtype::F32,
        d => {
            return Err(HfError::CtDtype {
                tensor: t.info.name.clone(),
                expected: "an integer or float dtype",
                got: d,
            });
        }
    })
}

/// Unpacked zero points: one per scale (the loader checks the count against the layout).
fn plain_zero(z: &FileTensor) -> Result<ZeroPoint, HfError> {
    Ok(ZeroPoint::Plain(zp_dtype(z)?))
}

/// pack-quantized zero points: packed along dim 0 for group/channel (I32
/// `[words(out), n_groups]`), unpacked for the other strategies.
fn packed_zero(
    z: &FileTensor,
    strategy: CtStrategy,
    rows: usize,
    cols: usize,
    bits: u8,
    order: PackOrder,
) -> Result<ZeroPoint, HfError> {
    let (_, gc) = expected_grid(strategy, rows, cols);
    let packed_shape = (packed_words(rows, bits, order), gc);
    let grid = grid_of(&z.info.shape);
    if matches!(strategy, CtStrategy::Group(_) | CtStrategy::Channel)
        && z.info.dtype == Dtype::I32
        && grid == Some(packed_shape)
    {
        return Ok(ZeroPoint::Packed);
    }
    if grid == Some(expected_grid(strategy, rows, cols)) {
        // Older writers stored unpacked zero points.
        return plain_zero(z);
    }
    Err(HfError::CtShape {
        tensor: z.info.name.clone(),
        expected: vec![packed_shape.0, packed_shape.1],
        got: z.info.shape.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_bits_reads_the_layout_from_the_word_count() {
        // 64 columns: 3-bit dense needs 6 words, the 0.19 per-word layout 7.
        assert_eq!(
            pack_bits("m", None, 64, 6, None).unwrap(),
            (3, PackOrder::Dense)
        );
        assert_eq!(
            pack_bits("m", None, 64, 7, None).unwrap(),
            (3, PackOrder::PerWord)
        );
        assert_eq!(
            pack_bits("m", None, 64, 8, None).unwrap(),
            (4, PackOrder::Dense)
        );
        // 16 words: 8-bit dense or 7-bit per-word; the current layout wins, unless the
        // writer's version says 0.19.
        assert_eq!(
            pack_bits("m", None, 64, 16, None).unwrap(),
            (8, PackOrder::Dense)
        );
        assert_eq!(
            pack_bits("m", None, 64, 16, Some((0, 19))).unwrap(),
            (7, PackOrder::PerWord)
        );
        // 10 columns of 3 bits fit one word either way: the version decides.
        let args = WeightArgs {
            num_bits: 3,
            ty: QuantType::Int,
            symmetric: true,
            strategy: Strategy::Channel,
            strategy_name: "channel".into(),
        };
        assert_eq!(
            pack_bits("m", Some(&args), 10, 1, Some((0, 20))).unwrap(),
            (3, PackOrder::Dense)
        );
        assert_eq!(
            pack_bits("m", Some(&args), 10, 1, Some((0, 19))).unwrap(),
            (3, PackOrder::PerWord)
        );
        assert!(pack_bits("m", Some(&args), 64, 8, None).is_err());
        assert!(pack_bits("m", None, 64, 9, None).is_err());
        assert!(pack_bits("m", None, 8, 1, None).is_err());
    }
}
