//! HF checkpoint directories: `config.json`, safetensors (one `model.safetensors` or shards
//! listed by `model.safetensors.index.json`), optionally quantised with compressed-tensors
//! (or the HF `fp8` block format).
//!
//! [`load`] parses the config into a [`ModelConfig`], maps every safetensors file, detects
//! quantised Linears from their tensors ([`quant`]), and renames everything to GGUF names,
//! stacking per-expert weights ([`names`]).

pub mod config;
pub mod ct_config;
pub mod names;
pub mod pyre;
pub mod quant;
pub mod safetensors;

use std::fs::File;
use std::path::{Path, PathBuf};

use lagoon_core::config::{MlpKind, ModelConfig};
use lagoon_core::weights::MatRef;
use memmap2::Mmap;
use serde_json::Value;

use crate::checkpoint::{Source, Span, TensorRecord};
use crate::error::Error;
use quant::FileTensor;
use safetensors::Dtype;

/// A malformed or unsupported HF checkpoint directory.
#[derive(Debug)]
pub enum HfError {
    /// The directory has no `config.json`.
    NoConfig { dir: PathBuf },
    /// Neither `model.safetensors` nor `model.safetensors.index.json` exists.
    NoWeights { dir: PathBuf },
    /// A JSON document (config.json, an index, a safetensors header) does not parse.
    BadJson { file: String, detail: String },
    /// A safetensors file is shorter than its 8-byte header length.
    FileTooShort { file: String, len: u64 },
    /// The header length exceeds the reference reader's limit.
    HeaderTooLarge {
        file: String,
        header_len: u64,
        limit: u64,
    },
    /// The header runs past the end of the file.
    HeaderOutOfFile {
        file: String,
        header_len: u64,
        file_len: u64,
    },
    /// A header entry lacks a field or has one of the wrong type.
    BadTensorEntry {
        file: String,
        tensor: String,
        detail: String,
    },
    /// A dtype string safetensors does not define.
    UnknownDtype {
        file: String,
        tensor: String,
        dtype: String,
    },
    /// `data_offsets` reversed or past the data buffer.
    OffsetsOutOfRange {
        file: String,
        tensor: String,
        begin: u64,
        end: u64,
        data_len: u64,
    },
    /// `data_offsets` span a byte count other than `numel × dtype size`.
    SizeMismatch {
        file: String,
        tensor: String,
        expected: u64,
        got: u64,
    },
    /// Two tensors share bytes.
    Overlap {
        file: String,
        tensor: String,
        other: String,
    },
    /// Bytes of the data buffer that no tensor covers (`next`: the tensor after the gap,
    /// `None` for bytes after the last tensor).
    Gap {
        file: String,
        offset: u64,
        next: Option<String>,
    },
    /// The shard index names a file that is not there.
    MissingShard { index: String, shard: String },
    /// The shard index puts a tensor in a shard that does not hold it.
    ShardMismatch { tensor: String, shard: String },
    /// Two source tensors claim one name.
    DuplicateTensor {
        tensor: String,
        first: String,
        second: String,
    },
    /// `model_type` / `architectures` do not name Laguna.
    NotLaguna { key: &'static str, got: String },
    /// A config.json value of the wrong type or range.
    ConfigValue {
        key: String,
        expected: &'static str,
        got: String,
    },
    /// A config.json option the Laguna forward pass does not implement.
    Unsupported {
        key: String,
        value: String,
        detail: &'static str,
    },
    /// A Laguna tensor stored in a dtype lagoon cannot use for it.
    UnsupportedDtype { tensor: String, dtype: String },
    /// A tensor whose rank or shape cannot be what its name says.
    BadShape {
        tensor: String,
        expected: String,
        got: Vec<usize>,
    },
    /// A per-expert projection is absent.
    MissingExpert {
        layer: usize,
        proj: &'static str,
        expert: usize,
        n_experts: usize,
    },
    /// An expert index at or past `num_experts`.
    UnexpectedExpert {
        tensor: String,
        expert: usize,
        n_experts: usize,
    },
    /// Experts of one projection differ in shape or encoding.
    ExpertMismatch {
        tensor: String,
        first: String,
        detail: String,
    },
    /// `quantization_config.quant_method` other than compressed-tensors or fp8.
    UnsupportedQuantMethod { method: String },
    /// A compressed-tensors transform applied to activations at run time.
    OnlineTransform {
        group: String,
        transform: String,
        location: String,
        targets: Vec<String>,
    },
    /// A compressed-tensors format lagoon has no decoder for.
    UnsupportedFormat { format: String, module: String },
    /// A `re:` target that is not valid (or uses regex syntax not supported here).
    BadRegex { pattern: String, detail: String },
    /// A quantised module lacks one of its tensors.
    CtMissing { module: String, tensor: String },
    /// A quantised module's tensor has the wrong dtype.
    CtDtype {
        tensor: String,
        expected: &'static str,
        got: Dtype,
    },
    /// A quantised module's tensor has the wrong shape.
    CtShape {
        tensor: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    /// A quantised module that lagoon cannot decode, and why.
    CtUnsupported { module: String, detail: String },
}

impl std::fmt::Display for HfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use HfError::*;
        match self {
            NoConfig { dir } => write!(
                f,
                "{} has no config.json; point lagoon at the checkpoint directory as downloaded from the hub",
                dir.display()
            ),
            NoWeights { dir } => write!(
                f,
                "{} has neither model.safetensors nor model.safetensors.index.json; download the weight files too",
                dir.display()
            ),
            BadJson { file, detail } => write!(
                f,
                "{file}: invalid JSON ({detail}); the file is corrupt or truncated"
            ),
            FileTooShort { file, len } => write!(
                f,
                "{file}: {len} bytes is too short for a safetensors file (8-byte header length first); re-download it"
            ),
            HeaderTooLarge {
                file,
                header_len,
                limit,
            } => write!(
                f,
                "{file}: header length {header_len} exceeds the safetensors limit of {limit} bytes; the file is not safetensors or is corrupt"
            ),
            HeaderOutOfFile {
                file,
                header_len,
                file_len,
            } => write!(
                f,
                "{file}: header of {header_len} bytes runs past the end of the {file_len}-byte file; the file is truncated"
            ),
            BadTensorEntry {
                file,
                tensor,
                detail,
            } => {
                write!(f, "{file}: header entry `{tensor}`: {detail}")
            }
            UnknownDtype {
                file,
                tensor,
                dtype,
            } => write!(
                f,
                "{file}: tensor `{tensor}` has dtype `{dtype}`, which safetensors does not define"
            ),
            OffsetsOutOfRange {
                file,
                tensor,
                begin,
                end,
                data_len,
            } => write!(
                f,
                "{file}: tensor `{tensor}` claims bytes {begin}..{end} of a {data_len}-byte data buffer; the file is truncated or corrupt"
            ),
            SizeMismatch {
                file,
                tensor,
                expected,
                got,
            } => write!(
                f,
                "{file}: tensor `{tensor}` spans {got} bytes but its shape and dtype need {expected}; the header is corrupt"
            ),
            Overlap {
                file,
                tensor,
                other,
            } => write!(
                f,
                "{file}: tensors `{tensor}` and `{other}` overlap; the header is corrupt"
            ),
            Gap { file, offset, next } => match next {
                Some(n) => write!(
                    f,
                    "{file}: data bytes from offset {offset} up to tensor `{n}` belong to no tensor; the header is corrupt"
                ),
                None => write!(
                    f,
                    "{file}: data bytes from offset {offset} to the end of the file belong to no tensor; the file has trailing garbage"
                ),
            },
            MissingShard { index, shard } => write!(
                f,
                "{index} lists shard {shard}, which is not in the directory; download every shard"
            ),
            ShardMismatch { tensor, shard } => write!(
                f,
                "the shard index puts `{tensor}` in {shard}, but that file does not hold it; the index and shards are from different revisions"
            ),
            DuplicateTensor {
                tensor,
                first,
                second,
            } => write!(
                f,
                "`{first}` and `{second}` both provide `{tensor}`; remove the stray file or tensor"
            ),
            NotLaguna { key, got } => write!(
                f,
                "config.json `{key}` is {got}, not Laguna (`laguna` / `LagunaForCausalLM`); lagoon only runs Laguna models"
            ),
            ConfigValue { key, expected, got } => {
                write!(f, "config.json `{key}` is {got}; expected {expected}")
            }
            Unsupported { key, value, detail } => {
                write!(
                    f,
                    "config.json `{key}` = {value} is not supported: {detail}"
                )
            }
            UnsupportedDtype { tensor, dtype } => write!(
                f,
                "tensor `{tensor}` is stored as {dtype}, which lagoon cannot use for it"
            ),
            BadShape {
                tensor,
                expected,
                got,
            } => write!(
                f,
                "tensor `{tensor}` has shape {got:?}, expected {expected}"
            ),
            MissingExpert {
                layer,
                proj,
                expert,
                n_experts,
            } => write!(
                f,
                "layer {layer}: expert {expert} of {n_experts} has no {proj}_proj weight; the checkpoint is incomplete (missing shard?)"
            ),
            UnexpectedExpert {
                tensor,
                expert,
                n_experts,
            } => write!(
                f,
                "`{tensor}` is expert {expert}, but the config declares {n_experts} experts"
            ),
            ExpertMismatch {
                tensor,
                first,
                detail,
            } => write!(
                f,
                "`{tensor}` differs from `{first}` ({detail}); every expert of a projection must share one shape and encoding"
            ),
            UnsupportedQuantMethod { method } => write!(
                f,
                "quantization_config.quant_method `{method}` is not supported; lagoon reads compressed-tensors and fp8 checkpoints (or use a GGUF)"
            ),
            OnlineTransform {
                group,
                transform,
                location,
                targets,
            } => write!(
                f,
                "transform_config group `{group}` applies a {transform} transform at location `{location}` (targets {targets:?}): it must run on activations at inference time, which lagoon does not implement; use a checkpoint whose transforms are merged into the weights (weight_input/weight_output only)"
            ),
            UnsupportedFormat { format, module } => write!(
                f,
                "module `{module}` uses compressed-tensors format `{format}`, which lagoon cannot decode; use a pack-quantized (int4/int8), int-quantized or float-quantized (FP8) checkpoint, or a GGUF"
            ),
            BadRegex { pattern, detail } => {
                write!(f, "quantization_config target `{pattern}`: {detail}")
            }
            CtMissing { module, tensor } => write!(
                f,
                "quantised module `{module}` has no `{tensor}`; the checkpoint is incomplete or not compressed-tensors"
            ),
            CtDtype {
                tensor,
                expected,
                got,
            } => write!(f, "`{tensor}` is {got}; expected {expected}"),
            CtShape {
                tensor,
                expected,
                got,
            } => write!(
                f,
                "`{tensor}` has shape {got:?}, expected {expected:?} from the weight shape and quantization scheme"
            ),
            CtUnsupported { module, detail } => {
                write!(f, "quantised module `{module}`: {detail}")
            }
        }
    }
}

impl std::error::Error for HfError {}

/// The tensors of a HF directory, mapped, with GGUF names.
#[derive(Debug)]
pub struct HfTensors {
    /// The safetensors files, indexed by `Span::file`.
    pub files: Vec<PathBuf>,
    pub maps: Vec<Mmap>,
    pub records: Vec<TensorRecord>,
    /// Tensors left out because their dtype has no ggml equivalent and no quantised module
    /// uses them (e.g. a stray `U8` buffer).
    pub skipped: Vec<String>,
}

impl HfTensors {
    /// The bytes of a span (spans were checked against the files when read).
    pub fn bytes(&self, s: Span) -> &[u8] {
        &self.maps[s.file as usize][s.start..s.start + s.len]
    }

    /// A record by normalised name.
    pub fn record(&self, name: &str) -> Option<&TensorRecord> {
        self.records.iter().find(|r| r.name == name)
    }

    /// Borrowed views of a record's parts.
    pub fn parts<'a>(&'a self, r: &'a TensorRecord) -> Vec<MatRef<'a>> {
        r.parts
            .iter()
            .map(|p| MatRef {
                rows: r.rows,
                cols: r.cols,
                enc: match p {
                    crate::checkpoint::PartRecord::Ggml { ty, span } => {
                        lagoon_core::weights::Encoding::Ggml {
                            ty: *ty,
                            data: self.bytes(*span),
                        }
                    }
                    crate::checkpoint::PartRecord::Ct(c) => {
                        lagoon_core::weights::Encoding::Ct(c.resolve(|s| self.bytes(s)))
                    }
                },
            })
            .collect()
    }
}

/// Opens a HF directory as checkpoint parts.
pub fn load(dir: &Path) -> Result<(ModelConfig, Source, Vec<Mmap>, Vec<TensorRecord>), Error> {
    let config_json = read_config(dir)?;
    let cfg = config::parse(&config_json)?;
    let n_experts = cfg
        .model
        .mlp_types
        .contains(&MlpKind::Sparse)
        .then_some(cfg.model.n_experts);
    let mut t = open_tensors(dir, &config_json, n_experts)?;
    if cfg.tie_word_embeddings
        && t.record("output.weight").is_none()
        && let Some(e) = t.record("token_embd.weight")
    {
        let mut out = e.clone();
        out.name = "output.weight".into();
        t.records.push(out);
    }
    Ok((
        cfg.model,
        Source::Hf {
            dir: dir.to_path_buf(),
            config: config_json,
        },
        t.maps,
        t.records,
    ))
}

/// Reads and parses `dir/config.json`.
pub fn read_config(dir: &Path) -> Result<Value, Error> {
    let path = dir.join("config.json");
    if !path.is_file() {
        return Err(HfError::NoConfig {
            dir: dir.to_path_buf(),
        }
        .into());
    }
    let text = std::fs::read(&path).map_err(|source| Error::Io {
        path: path.clone(),
        source,
    })?;
    serde_json::from_slice(&text).map_err(|e| {
        HfError::BadJson {
            file: path.display().to_string(),
            detail: e.to_string(),
        }
        .into()
    })
}

/// Maps the safetensors files of `dir`, detects quantised modules (per `config_json`'s
/// `quantization_config`) and normalises names. `n_experts` is how many experts each stack
/// must hold (`None`: as many as present).
pub fn open_tensors(
    dir: &Path,
    config_json: &Value,
    n_experts: Option<usize>,
) -> Result<HfTensors, Error> {
    let quant_cfg = ct_config::parse(config_json)?;
    let (files, index) = weight_files(dir)?;
    let mut maps = Vec::with_capacity(files.len());
    let mut tensors: Vec<FileTensor> = Vec::new();
    let mut owner: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (i, path) in files.iter().enumerate() {
        let map = map_file(path)?;
        let fname = file_name(path);
        let header = safetensors::parse(&fname, &map)?;
        for info in header.tensors {
            if let Some(&j) = owner.get(&info.name) {
                return Err(HfError::DuplicateTensor {
                    tensor: info.name.clone(),
                    first: format!("{} in {}", info.name, file_name(&files[j])),
                    second: format!("{} in {fname}", info.name),
                }
                .into());
            }
            owner.insert(info.name.clone(), i);
            tensors.push(FileTensor {
                file: i as u32,
                info,
            });
        }
        maps.push(map);
    }
    if let Some(weight_map) = index {
        for (tensor, shard) in weight_map {
            let in_shard = owner
                .get(&tensor)
                .is_some_and(|&i| file_name(&files[i]) == shard);
            if !in_shard {
                return Err(HfError::ShardMismatch { tensor, shard }.into());
            }
        }
    }
    let bytes = |s: Span| maps[s.file as usize][s.start..s.start + s.len].to_vec();
    let mut skipped = Vec::new();
    let logicals = quant::collect(&tensors, &bytes, &quant_cfg, &mut skipped)?;
    let records = names::build(logicals, n_experts)?;
    Ok(HfTensors {
        files,
        maps,
        records,
        skipped,
    })
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// The weight files: the shards of `model.safetensors.index.json` (with its weight map), else
/// `model.safetensors`.
#[allow(clippy::type_complexity)]
fn weight_files(dir: &Path) -> Result<(Vec<PathBuf>, Option<Vec<(String, String)>>), Error> {
    let index_path = dir.join("model.safetensors.index.json");
    if index_path.is_file() {
        let index_name = file_name(&index_path);
        let text = std::fs::read(&index_path).map_err(|source| Error::Io {
            path: index_path.clone(),
            source,
        })?;
        let v: Value = serde_json::from_slice(&text).map_err(|e| HfError::BadJson {
            file: index_name.clone(),
            detail: e.to_string(),
        })?;
        let wm = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| HfError::BadJson {
                file: index_name.clone(),
                detail: "no `weight_map` object".into(),
            })?;
        let mut pairs = Vec::with_capacity(wm.len());
        let mut shards: Vec<String> = Vec::new();
        for (tensor, shard) in wm {
            let shard = shard.as_str().ok_or_else(|| HfError::BadJson {
                file: index_name.clone(),
                detail: format!("`weight_map.{tensor}` is not a file name"),
            })?;
            // Shards must be plain files of this directory.
            if shard.contains('/') || shard.contains('\\') || shard == ".." {
                return Err(HfError::BadJson {
                    file: index_name.clone(),
                    detail: format!(
                        "`weight_map.{tensor}` = {shard:?} is not a file of this directory"
                    ),
                }
                .into());
            }
            if !shards.iter().any(|s| s == shard) {
                shards.push(shard.to_string());
            }
            pairs.push((tensor.clone(), shard.to_string()));
        }
        shards.sort();
        let mut files = Vec::with_capacity(shards.len());
        for s in shards {
            let p = dir.join(&s);
            if !p.is_file() {
                return Err(HfError::MissingShard {
                    index: index_name,
                    shard: s,
                }
                .into());
            }
            files.push(p);
        }
        return Ok((files, Some(pairs)));
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok((vec![single], None));
    }
    Err(HfError::NoWeights {
        dir: dir.to_path_buf(),
    }
    .into())
}

fn map_file(path: &Path) -> Result<Mmap, Error> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let f = File::open(path).map_err(io)?;
    // SAFETY: the map is read-only and private to this process. Like every mmap-based
    // checkpoint loader, lagoon requires that the files are not truncated or rewritten while
    // open; every span handed out is bounds-checked against the map's length.
    unsafe { Mmap::map(&f) }.map_err(io)
}
