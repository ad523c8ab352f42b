//! `quantization_config` of config.json (spec/formats.md §7.1): compressed-tensors config
//! groups, `ignore`, formats and transforms, or the HF `fp8` block format (§7.7).
//!
//! The loader is tensor-driven (§7.8); the config only supplies what the tensors cannot say
//! (bit width when ambiguous, block sizes) and cross-checks, and it is where unsupported
//! formats and online transforms are refused.

use serde_json::{Map, Value};

use super::HfError;
use super::config::short;
use super::pyre::PyRegex;

/// How a checkpoint's weights are quantised, per its config.
#[derive(Clone, Debug, Default)]
pub enum QuantConfig {
    /// No `quantization_config`.
    #[default]
    None,
    CompressedTensors(CtConfig),
    /// HF `quant_method: fp8`: F8_E4M3 weights with `weight_scale_inv` per block.
    HfFp8 {
        block: Option<(u32, u32)>,
    },
}

/// `int` or `float` weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantType {
    Int,
    Float,
}

/// The `strategy` of a QuantizationArgs, with its size parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    Tensor,
    Channel,
    Group(u32),
    Block(u32, u32),
    /// `token`, `tensor_group`, `attn_head`: never a static weight strategy we decode.
    Other,
}

/// The `weights` QuantizationArgs of a config group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightArgs {
    pub num_bits: u8,
    pub ty: QuantType,
    pub symmetric: bool,
    pub strategy: Strategy,
    /// The strategy string as written (for messages).
    pub strategy_name: String,
}

/// A module-name target: `re:<python regex>`, or an exact module or class name.
#[derive(Clone, Debug)]
pub enum Target {
    Regex { pattern: String, re: PyRegex },
    Name(String),
}

impl Target {
    fn parse(s: &str) -> Result<Target, HfError> {
        match s.strip_prefix("re:") {
            Some(p) => Ok(Target::Regex {
                pattern: p.to_string(),
                re: PyRegex::new(p).map_err(|detail| HfError::BadRegex {
                    pattern: s.to_string(),
                    detail,
                })?,
            }),
            None => Ok(Target::Name(s.to_string())),
        }
    }

    /// compressed-tensors `is_match`: a regex match, the exact module name, or the class
    /// name. Every module this is asked about is a Linear, so the class target `Linear`
    /// matches all of them.
    pub fn matches(&self, module: &str) -> bool {
        match self {
            Target::Regex { re, .. } => re.is_match(module),
            Target::Name(n) => n == module || n == "Linear",
        }
    }
}

/// One entry of `config_groups`.
#[derive(Clone, Debug)]
pub struct CtGroup {
    pub name: String,
    pub targets: Vec<Target>,
    pub weights: Option<WeightArgs>,
    /// The group's own `format`, else the global one (unless that is `mixed-precision`).
    pub format: Option<String>,
}

/// A parsed compressed-tensors `quantization_config`.
#[derive(Clone, Debug, Default)]
pub struct CtConfig {
    /// The compressed-tensors version that wrote the checkpoint, as `(major, minor)`.
    pub version: Option<(u32, u32)>,
    pub groups: Vec<CtGroup>,
    pub ignore: Vec<Target>,
}

/// Formats whose tensors lagoon decodes.
const SUPPORTED_FORMATS: &[&str] = &[
    "dense",
    "pack-quantized",
    "int-quantized",
    "naive-quantized",
    "float-quantized",
];

impl CtConfig {
    /// The group that quantises `module` (its name in the checkpoint, without `.weight`):
    /// the first whose targets match, unless an `ignore` entry matches.
    pub fn scheme_for(&self, module: &str) -> Option<&CtGroup> {
        if self.ignore.iter().any(|t| t.matches(module)) {
            return None;
        }
        self.groups
            .iter()
            .find(|g| g.weights.is_some() && g.targets.iter().any(|t| t.matches(module)))
    }

    /// Refuses a quantised module whose group's format has no decoder here.
    pub fn check_format(&self, module: &str) -> Result<(), HfError> {
        if let Some(g) = self.scheme_for(module)
            && let Some(f) = &g.format
            && !SUPPORTED_FORMATS.contains(&f.as_str())
        {
            return Err(HfError::UnsupportedFormat {
                format: f.clone(),
                module: module.to_string(),
            });
        }
        Ok(())
    }
}

/// Parses `quantization_config` (absent or null ⇒ [`QuantConfig::None`]).
pub fn parse(config: &Value) -> Result<QuantConfig, HfError> {
    let Some(q) = config.get("quantization_config").filter(|v| !v.is_null()) else {
        return Ok(QuantConfig::None);
    };
    let q = q
        .as_object()
        .ok_or_else(|| bad("quantization_config", "an object", q))?;
    let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("");
    match method {
        "compressed-tensors" => parse_ct(q).map(QuantConfig::CompressedTensors),
        "fp8" => {
            let block = match q.get("weight_block_size").filter(|v| !v.is_null()) {
                None => None,
                Some(v) => Some(block_pair(v).ok_or_else(|| {
                    bad("quantization_config.weight_block_size", "[rows, cols]", v)
                })?),
            };
            if let Some(f) = q.get("fmt").and_then(Value::as_str)
                && f != "e4m3"
            {
                return Err(HfError::UnsupportedFormat {
                    format: format!("fp8 fmt {f}"),
                    module: "(all)".into(),
                });
            }
            Ok(QuantConfig::HfFp8 { block })
        }
        other => Err(HfError::UnsupportedQuantMethod {
            method: other.to_string(),
        }),
    }
}

fn bad(key: &str, expected: &'static str, got: &Value) -> HfError {
    HfError::ConfigValue {
        key: key.to_string(),
        expected,
        got: short(got),
    }
}

/// `[r, c]` or `"RxC"`, both positive.
fn block_pair(v: &Value) -> Option<(u32, u32)> {
    let (r, c) = match v {
        Value::Array(a) if a.len() == 2 => (a[0].as_u64()?, a[1].as_u64()?),
        Value::String(s) => {
            let (r, c) = s.split_once('x')?;
            (r.trim().parse().ok()?, c.trim().parse().ok()?)
        }
        _ => return None,
    };
    let r = u32::try_from(r).ok().filter(|&r| r > 0)?;
    let c = u32::try_from(c).ok().filter(|&c| c > 0)?;
    Some((r, c))
}

fn parse_version(s: &str) -> Option<(u32, u32)> {
    let mut it = s.split(['.', '+', '-']);
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

fn targets(key: &str, v: Option<&Value>) -> Result<Vec<Target>, HfError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let list: Vec<&str> = match v {
        Value::String(s) => vec![s.as_str()],
        Value::Array(a) => a
            .iter()
            .map(Value::as_str)
            .collect::<Option<_>>()
            .ok_or_else(|| bad(key, "a list of strings", v))?,
        _ => return Err(bad(key, "a list of strings", v)),
    };
    list.into_iter().map(Target::parse).collect()
}

fn parse_ct(q: &Map<String, Value>) -> Result<CtConfig, HfError> {
    check_transforms(q)?;
    check_sparsity(q)?;
    let global_format = q
        .get("format")
        .and_then(Value::as_str)
        .filter(|f| *f != "mixed-precision")
        .map(str::to_string);
    let mut groups = Vec::new();
    if let Some(cg) = q.get("config_groups").filter(|v| !v.is_null()) {
        let cg = cg
            .as_object()
            .ok_or_else(|| bad("quantization_config.config_groups", "an object", cg))?;
        for (name, g) in cg {
            let key = format!("quantization_config.config_groups.{name}");
            let g = g.as_object().ok_or_else(|| bad(&key, "an object", g))?;
            let weights = match g.get("weights").filter(|v| !v.is_null()) {
                None => None,
                Some(w) => Some(weight_args(&format!("{key}.weights"), w)?),
            };
            let format = g
                .get("format")
                .and_then(Value::as_str)
                .map(str::to_string)
                .or_else(|| global_format.clone());
            groups.push(CtGroup {
                name: name.clone(),
                targets: targets(&format!("{key}.targets"), g.get("targets"))?,
                weights,
                format,
            });
        }
    }
    Ok(CtConfig {
        version: q
            .get("version")
            .and_then(Value::as_str)
            .and_then(parse_version),
        groups,
        ignore: targets("quantization_config.ignore", q.get("ignore"))?,
    })
}

fn weight_args(key: &str, w: &Value) -> Result<WeightArgs, HfError> {
    let w = w.as_object().ok_or_else(|| bad(key, "an object", w))?;
    let get = |k: &str| w.get(k).filter(|v| !v.is_null());
    let num_bits = match get("num_bits") {
        None => 8,
        Some(v) => v
            .as_u64()
            .and_then(|b| u8::try_from(b).ok())
            .ok_or_else(|| bad(&format!("{key}.num_bits"), "a small integer", v))?,
    };
    let ty = match get("type").and_then(Value::as_str).unwrap_or("int") {
        "int" => QuantType::Int,
        "float" => QuantType::Float,
        _ => {
            return Err(bad(
                &format!("{key}.type"),
                "`int` or `float`",
                get("type").unwrap_or(&Value::Null),
            ));
        }
    };
    let symmetric = get("symmetric").and_then(Value::as_bool).unwrap_or(true);
    let group_size = match get("group_size") {
        None => None,
        Some(v) => Some(
            v.as_i64()
                .ok_or_else(|| bad(&format!("{key}.group_size"), "an integer", v))?,
        ),
    };
    let strategy_name = match get("strategy") {
        Some(s) => s
            .as_str()
            .ok_or_else(|| bad(&format!("{key}.strategy"), "a string", s))?
            .to_string(),
        // QuantizationArgs' inference: none → tensor, > 0 → group, −1 → channel.
        None => match group_size {
            None => "tensor".into(),
            Some(g) if g > 0 => "group".into(),
            Some(-1) => "channel".into(),
            Some(_) => {
                return Err(bad(
                    &format!("{key}.group_size"),
                    "a positive group size or -1 (channel)",
                    get("group_size").unwrap_or(&Value::Null),
                ));
            }
        },
    };
    let strategy = match strategy_name.as_str() {
        "tensor" => Strategy::Tensor,
        "channel" => Strategy::Channel,
        "group" => {
            let g = group_size
                .and_then(|g| u32::try_from(g).ok())
                .filter(|&g| g > 0)
                .ok_or_else(|| {
                    bad(
                        &format!("{key}.group_size"),
                        "a positive group size for strategy `group`",
                        get("group_size").unwrap_or(&Value::Null),
                    )
                })?;
            Strategy::Group(g)
        }
        "block" => {
            let v = get("block_structure").unwrap_or(&Value::Null);
            let (r, c) = block_pair(v).ok_or_else(|| {
                bad(
                    &format!("{key}.block_structure"),
                    "[rows, cols] for strategy `block`",
                    v,
                )
            })?;
            Strategy::Block(r, c)
        }
        _ => Strategy::Other,
    };
    Ok(WeightArgs {
        num_bits,
        ty,
        symmetric,
        strategy,
        strategy_name,
    })
}

/// A non-empty `transform_config` whose `apply` entries act on activations (`input`,
/// `output`, `k_cache`, `q_attn`) needs the rotation at run time: refuse. Weight-side
/// transforms (`weight_input`, `weight_output`) were folded into the stored weights.
fn check_transforms(q: &Map<String, Value>) -> Result<(), HfError> {
    let Some(groups) = q
        .get("transform_config")
        .and_then(|t| t.get("config_groups"))
        .and_then(Value::as_object)
    else {
        return Ok(());
    };
    for (name, scheme) in groups {
        let Some(apply) = scheme.get("apply").and_then(Value::as_array) else {
            continue;
        };
        for a in apply {
            let location = a.get("location").and_then(Value::as_str).unwrap_or("");
            if !location.starts_with("weight") {
                let targets = match a.get("targets") {
                    Some(Value::String(s)) => vec![s.clone()],
                    Some(Value::Array(t)) => t
                        .iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect(),
                    _ => Vec::new(),
                };
                return Err(HfError::OnlineTransform {
                    group: name.clone(),
                    transform: scheme
                        .get("type")
                        .and_then(Value::as_str)
                        .unwrap_or("?")
                        .to_string(),
                    location: location.to_string(),
                    targets,
                });
            }
        }
    }
    Ok(())
}

/// Legacy sparse formats (`sparse-bitmask`, `sparse-24-bitmask`, `marlin-24`) store weights
/// that need their own decompressor: refuse.
fn check_sparsity(q: &Map<String, Value>) -> Result<(), HfError> {
    for key in ["sparsity_config", "moe_sparsity_config"] {
        let Some(s) = q.get(key).and_then(Value::as_object) else {
            continue;
        };
        if let Some(f) = s.get("format").and_then(Value::as_str)
            && f != "dense"
        {
            let module = match s.get("targets") {
                Some(Value::Array(t)) => t
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", "),
                _ => "(all)".to_string(),
            };
            return Err(HfError::UnsupportedFormat {
                format: f.to_string(),
                module,
            });
        }
    }
    Ok(())
}
