//! Loading from a HF `tokenizer.json` (+ the directory's `tokenizer_config.json` and
//! `config.json`) and from GGUF metadata (`tokenizer.ggml.*`, as llama.cpp's converter
//! writes it).
//!
//! Only what Laguna uses is accepted; anything else is refused with a message rather than
//! tokenized differently from the reference: no normalizer, the Laguna (or plain Qwen2)
//! pre-tokenizer sequence, a BPE model without dropout / subword affixes / byte fallback,
//! the ByteLevel decoder, and a TemplateProcessing / Bert / Roberta / ByteLevel
//! post-processor.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value as Json;

use super::{AddedToken, Parts, PreTokenizer, SpecialIds, TokenKind, Tokenizer, TokenizerError};

/// Laguna's first Split pattern (spec/laguna.md §7.1).
pub const LINE_BREAK_PATTERN: &str = r"(?:\r?\n)+(?!\r?\n)";
/// The Qwen2 pattern with single digits.
pub const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

// ------------------------------------------------------------------------------------------
// GGUF
// ------------------------------------------------------------------------------------------

/// The typed look-ups the GGUF loader needs, so that it depends on nothing but this
/// trait; implemented for the GGUF crate's metadata list below. Each returns `None` when
/// the key is absent or has another type.
pub trait GgufKv {
    fn get_str(&self, key: &str) -> Option<&str>;
    fn get_u32(&self, key: &str) -> Option<u32>;
    fn get_bool(&self, key: &str) -> Option<bool>;
    fn get_str_array(&self, key: &str) -> Option<&[String]>;
    fn get_i32_array(&self, key: &str) -> Option<Vec<i32>>;
}

/// Adapter to `lagoon_gguf`'s metadata (`GgufFile::metadata`, `Source::Gguf::metadata`).
impl GgufKv for [(String, lagoon_gguf::gguf::Value)] {
    fn get_str(&self, key: &str) -> Option<&str> {
        self.iter().find(|(k, _)| k == key)?.1.as_str()
    }
    fn get_u32(&self, key: &str) -> Option<u32> {
        u32::try_from(self.iter().find(|(k, _)| k == key)?.1.as_u64()?).ok()
    }
    fn get_bool(&self, key: &str) -> Option<bool> {
        self.iter().find(|(k, _)| k == key)?.1.as_bool()
    }
    fn get_str_array(&self, key: &str) -> Option<&[String]> {
        self.iter().find(|(k, _)| k == key)?.1.as_array()?.as_strs()
    }
    fn get_i32_array(&self, key: &str) -> Option<Vec<i32>> {
        use lagoon_gguf::gguf::Array;
        match self.iter().find(|(k, _)| k == key)?.1.as_array()? {
            Array::I32(v) => Some(v.clone()),
            a => a
                .to_u64s()?
                .into_iter()
                .map(|x| i32::try_from(x).ok())
                .collect(),
        }
    }
}

const GGUF_TOKENS: &str = "tokenizer.ggml.tokens";
const GGUF_TYPES: &str = "tokenizer.ggml.token_type";
const GGUF_MERGES: &str = "tokenizer.ggml.merges";

impl Tokenizer {
    /// From GGUF metadata as `lagoon_gguf` reads it.
    pub fn from_gguf_metadata(
        metadata: &[(String, lagoon_gguf::gguf::Value)],
    ) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_gguf_kv(metadata)
    }

    /// The tokenizer of an opened checkpoint: its GGUF metadata, or the `tokenizer.json`
    /// (with `tokenizer_config.json` / `config.json`) of its HF directory.
    pub fn from_checkpoint(ckpt: &lagoon_gguf::Checkpoint) -> Result<Tokenizer, TokenizerError> {
        match &ckpt.source {
            lagoon_gguf::Source::Gguf { metadata, .. } => Tokenizer::from_gguf_metadata(metadata),
            lagoon_gguf::Source::Hf { dir, .. } => Tokenizer::from_hf_dir(dir),
        }
    }

    /// From GGUF `tokenizer.ggml.*` keys. Added tokens are the CONTROL, USER_DEFINED and
    /// UNKNOWN entries; they are matched in text as HF matches its added tokens.
    pub fn from_gguf_kv<K: GgufKv + ?Sized>(kv: &K) -> Result<Tokenizer, TokenizerError> {
        let missing = |key: &str, expected: &'static str| TokenizerError::Missing {
            key: key.to_string(),
            expected,
        };
        let model = kv
            .get_str("tokenizer.ggml.model")
            .ok_or_else(|| missing("tokenizer.ggml.model", "a string"))?;
        if model != "gpt2" {
            return Err(TokenizerError::Unsupported {
                what: "tokenizer.ggml.model",
                found: model.to_string(),
            });
        }
        let pre = match kv.get_str("tokenizer.ggml.pre").unwrap_or("default") {
            "laguna" => PreTokenizer::Laguna,
            "qwen2" => PreTokenizer::Qwen2,
            other => {
                return Err(TokenizerError::Unsupported {
                    what: "tokenizer.ggml.pre",
                    found: other.to_string(),
                });
            }
        };
        let tokens = kv
            .get_str_array(GGUF_TOKENS)
            .ok_or_else(|| missing(GGUF_TOKENS, "a string array"))?;
        let kinds: Vec<TokenKind> = match kv.get_i32_array(GGUF_TYPES) {
            Some(t) if t.len() == tokens.len() => t.into_iter().map(kind_from_gguf).collect(),
            Some(_) => {
                return Err(missing(
                    GGUF_TYPES,
                    "an integer array as long as tokenizer.ggml.tokens",
                ));
            }
            None => vec![TokenKind::Normal; tokens.len()],
        };
        let merges_raw = kv
            .get_str_array(GGUF_MERGES)
            .ok_or_else(|| missing(GGUF_MERGES, "a string array"))?;
        let mut merges = Vec::with_capacity(merges_raw.len());
        for (i, m) in merges_raw.iter().enumerate() {
            // llama.cpp: split at the first space after the first byte.
            let sp = m
                .as_bytes()
                .iter()
                .skip(1)
                .position(|&b| b == b' ')
                .map(|p| p + 1);
            let Some(sp) = sp else {
                return Err(TokenizerError::BadMerge {
                    index: i,
                    merge: m.clone(),
                });
            };
            merges.push((m[..sp].to_string(), m[sp + 1..].to_string()));
        }

        let mut model_vocab = HashMap::with_capacity(tokens.len());
        let mut added = Vec::new();
        for (id, (t, &kind)) in tokens.iter().zip(&kinds).enumerate() {
            model_vocab.insert(t.clone(), id as u32);
            if matches!(
                kind,
                TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
            ) && !t.is_empty()
            {
                added.push(AddedToken {
                    content: t.clone(),
                    id: id as u32,
                    special: kind != TokenKind::UserDefined,
                    normalized: false,
                    lstrip: false,
                    rstrip: false,
                    single_word: false,
                });
            }
        }
        // llama.cpp ignores out-of-range special ids.
        let id = |key: &str| kv.get_u32(key).filter(|&i| (i as usize) < tokens.len());
        let special = SpecialIds {
            bos: id("tokenizer.ggml.bos_token_id"),
            eos: id("tokenizer.ggml.eos_token_id"),
            eot: id("tokenizer.ggml.eot_token_id"),
            pad: id("tokenizer.ggml.padding_token_id"),
            unk: id("tokenizer.ggml.unknown_token_id"),
        };
        // llama.cpp's default for gpt2 vocabularies is no BOS unless the key says so.
        let add_bos = kv.get_bool("tokenizer.ggml.add_bos_token").unwrap_or(false);
        let add_eos = kv.get_bool("tokenizer.ggml.add_eos_token").unwrap_or(false);
        Tokenizer::from_parts(Parts {
            model_vocab,
            merges,
            added,
            kinds: Some(kinds),
            unk: None,
            ignore_merges: false,
            pre,
            special,
            prefix: special.bos.filter(|_| add_bos).into_iter().collect(),
            suffix: special.eos.filter(|_| add_eos).into_iter().collect(),
        })
    }
}

fn kind_from_gguf(t: i32) -> TokenKind {
    match t {
        2 => TokenKind::Unknown,
        3 => TokenKind::Control,
        4 => TokenKind::UserDefined,
        5 => TokenKind::Unused,
        6 => TokenKind::Byte,
        _ => TokenKind::Normal,
    }
}

// ------------------------------------------------------------------------------------------
// HF tokenizer.json
// ------------------------------------------------------------------------------------------

fn json_err(file: &str, detail: impl Into<String>) -> TokenizerError {
    TokenizerError::Json {
        file: file.to_string(),
        detail: detail.into(),
    }
}

fn unsupported(what: &'static str, v: &Json) -> TokenizerError {
    let mut found = v.to_string();
    if found.len() > 300 {
        let mut cut = 300;
        while !found.is_char_boundary(cut) {
            cut -= 1;
        }
        found.truncate(cut);
        found.push('…');
    }
    TokenizerError::Unsupported { what, found }
}

fn read_json(path: &Path) -> Result<Json, TokenizerError> {
    let bytes = std::fs::read(path).map_err(|source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|e| json_err(&path.display().to_string(), e.to_string()))
}

fn is_null_or_absent(v: Option<&Json>) -> bool {
    v.is_none_or(Json::is_null)
}

/// `Split` with this regex, behaviour and `invert = false`.
fn is_split(v: &Json, pattern: &str, behavior: &str) -> bool {
    v["type"] == "Split"
        && v["pattern"]["Regex"] == pattern
        && v["behavior"] == behavior
        && v.get("invert").is_none_or(|i| i == false)
}

/// `ByteLevel` that only maps bytes (`add_prefix_space` and `use_regex` off).
fn is_plain_bytelevel(v: &Json) -> bool {
    v["type"] == "ByteLevel" && v["add_prefix_space"] == false && v["use_regex"] == false
}

fn parse_pre_tokenizer(v: &Json) -> Result<PreTokenizer, TokenizerError> {
    let seq = match v["pretokenizers"].as_array() {
        Some(seq) if v["type"] == "Sequence" => seq.as_slice(),
        _ => &[],
    };
    match seq {
        [a, b, c]
            if is_split(a, LINE_BREAK_PATTERN, "MergedWithNext")
                && is_split(b, QWEN2_PATTERN, "Isolated")
                && is_plain_bytelevel(c) =>
        {
            Ok(PreTokenizer::Laguna)
        }
        [b, c] if is_split(b, QWEN2_PATTERN, "Isolated") && is_plain_bytelevel(c) => {
            Ok(PreTokenizer::Qwen2)
        }
        _ => Err(unsupported("pre_tokenizer", v)),
    }
}

/// Ids put before and after a single sequence by the post-processor.
fn parse_post_processor(
    v: &Json,
    token_id: &dyn Fn(&str) -> Option<u32>,
) -> Result<(Vec<u32>, Vec<u32>), TokenizerError> {
    if v.is_null() {
        return Ok((Vec::new(), Vec::new()));
    }
    let file = "tokenizer.json post_processor";
    match v["type"].as_str() {
        Some("ByteLevel") => Ok((Vec::new(), Vec::new())),
        Some("TemplateProcessing") => {
            let items = v["single"]
                .as_array()
                .ok_or_else(|| json_err(file, "`single` is not a list"))?;
            let (mut prefix, mut suffix) = (Vec::new(), Vec::new());
            let mut seen_a = false;
            for item in items {
                if let Some(seq) = item.get("Sequence") {
                    if seq["id"] == "A" {
                        seen_a = true;
                    }
                    continue;
                }
                let name = item["SpecialToken"]["id"]
                    .as_str()
                    .ok_or_else(|| json_err(file, format!("unexpected template item {item}")))?;
                let ids = v["special_tokens"][name]["ids"]
                    .as_array()
                    .ok_or_else(|| json_err(file, format!("no ids for special token `{name}`")))?;
                let ids = ids
                    .iter()
                    .map(|i| i.as_u64().and_then(|i| u32::try_from(i).ok()))
                    .collect::<Option<Vec<u32>>>()
                    .ok_or_else(|| json_err(file, format!("bad ids for special token `{name}`")))?;
                if seen_a { &mut suffix } else { &mut prefix }.extend(ids);
            }
            Ok((prefix, suffix))
        }
        Some("BertProcessing" | "RobertaProcessing") => {
            let id = |key: &str| {
                let name = v[key][0].as_str().unwrap_or_default();
                v[key][1]
                    .as_u64()
                    .and_then(|i| u32::try_from(i).ok())
                    .or_else(|| token_id(name))
                    .ok_or_else(|| json_err(file, format!("bad `{key}`")))
            };
            Ok((vec![id("cls")?], vec![id("sep")?]))
        }
        Some("Sequence") => {
            let procs = v["processors"]
                .as_array()
                .ok_or_else(|| json_err(file, "`processors` is not a list"))?;
            // Each processor wraps the output of the previous one.
            let (mut prefix, mut suffix) = (Vec::new(), Vec::new());
            for p in procs {
                let (pp, ss) = parse_post_processor(p, token_id)?;
                prefix.splice(0..0, pp);
                suffix.extend(ss);
            }
            Ok((prefix, suffix))
        }
        _ => Err(unsupported("post_processor", v)),
    }
}

fn parse_tokenizer_json(j: &Json) -> Result<Parts, TokenizerError> {
    const FILE: &str = "tokenizer.json";
    if !is_null_or_absent(j.get("normalizer")) {
        return Err(unsupported("normalizer", &j["normalizer"]));
    }
    let pre = parse_pre_tokenizer(&j["pre_tokenizer"])?;
    if j["decoder"]["type"] != "ByteLevel" {
        return Err(unsupported("decoder", &j["decoder"]));
    }

    let m = &j["model"];
    if m.get("type").is_some_and(|t| t != "BPE") {
        return Err(unsupported("model", &m["type"]));
    }
    let dropout_off = m
        .get("dropout")
        .is_none_or(|d| d.is_null() || d.as_f64() == Some(0.0));
    let no_affix = |k: &str| m.get(k).is_none_or(|v| v.is_null() || v == "");
    if !dropout_off
        || !no_affix("continuing_subword_prefix")
        || !no_affix("end_of_word_suffix")
        || m["byte_fallback"] == true
    {
        let mut shown = m.clone();
        if let Some(o) = shown.as_object_mut() {
            o.remove("vocab");
            o.remove("merges");
        }
        return Err(unsupported("BPE model options", &shown));
    }
    let vocab_json = m["vocab"]
        .as_object()
        .ok_or_else(|| json_err(FILE, "model.vocab is not an object"))?;
    let mut model_vocab = HashMap::with_capacity(vocab_json.len());
    for (k, v) in vocab_json {
        let id = v
            .as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| json_err(FILE, format!("model.vocab[{k:?}] is not an id")))?;
        model_vocab.insert(k.clone(), id);
    }
    let merges_json = m["merges"]
        .as_array()
        .ok_or_else(|| json_err(FILE, "model.merges is not a list"))?;
    let mut merges = Vec::with_capacity(merges_json.len());
    for (i, mj) in merges_json.iter().enumerate() {
        match mj {
            // Legacy "a b" lines: exactly two parts on ' ' (HF convert_merges_to_hashmap).
            Json::String(s) => {
                if s.starts_with("#version") {
                    continue;
                }
                let mut parts = s.split(' ');
                match (parts.next(), parts.next(), parts.next()) {
                    (Some(a), Some(b), None) => merges.push((a.to_string(), b.to_string())),
                    _ => {
                        return Err(TokenizerError::BadMerge {
                            index: i,
                            merge: s.clone(),
                        });
                    }
                }
            }
            Json::Array(p) if p.len() == 2 && p[0].is_string() && p[1].is_string() => {
                merges.push((
                    p[0].as_str().unwrap_or_default().into(),
                    p[1].as_str().unwrap_or_default().into(),
                ));
            }
            other => {
                return Err(TokenizerError::BadMerge {
                    index: i,
                    merge: other.to_string(),
                });
            }
        }
    }
    let unk = match m["unk_token"].as_str() {
        Some(u) => model_vocab.get(u).map(|&id| (id, m["fuse_unk"] == true)),
        None => None,
    };

    // Added tokens, with ids assigned as HF's deserializer does: the model's id for a
    // content it knows, else the next id after the model vocabulary (the stored `id` is
    // only checked against, like HF's warning).
    let mut added: Vec<AddedToken> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut next_id = model_vocab.len() as u32;
    let list = j["added_tokens"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    for a in list {
        let content = a["content"]
            .as_str()
            .ok_or_else(|| json_err(FILE, format!("added token without content: {a}")))?;
        if content.is_empty() {
            continue;
        }
        let flag = |k: &str, default: bool| a[k].as_bool().unwrap_or(default);
        let special = flag("special", false);
        let mut tok = AddedToken {
            content: content.to_string(),
            id: 0,
            special,
            normalized: flag("normalized", !special),
            lstrip: flag("lstrip", false),
            rstrip: flag("rstrip", false),
            single_word: flag("single_word", false),
        };
        match index.get(content) {
            Some(&k) => {
                tok.id = added[k].id;
                added[k] = tok;
            }
            None => {
                tok.id = match model_vocab.get(content) {
                    Some(&id) => id,
                    None => {
                        next_id += 1;
                        next_id - 1
                    }
                };
                index.insert(content.to_string(), added.len());
                added.push(tok);
            }
        }
    }

    let added_ids: HashMap<&str, u32> = added.iter().map(|t| (t.content.as_str(), t.id)).collect();
    let token_id = |s: &str| added_ids.get(s).or_else(|| model_vocab.get(s)).copied();
    let (prefix, suffix) = parse_post_processor(&j["post_processor"], &token_id)?;
    let special = SpecialIds {
        bos: prefix.first().copied(),
        unk: unk.map(|u| u.0),
        ..SpecialIds::default()
    };
    Ok(Parts {
        model_vocab,
        merges,
        added,
        kinds: None,
        unk,
        ignore_merges: m["ignore_merges"] == true,
        pre,
        special,
        prefix,
        suffix,
    })
}

/// A token named in tokenizer_config.json: a string or `{"content": ...}`.
fn config_token(v: &Json) -> Option<&str> {
    v.as_str().or_else(|| v["content"].as_str())
}

fn json_ids(v: &Json) -> Vec<u32> {
    match v {
        Json::Array(a) => a
            .iter()
            .filter_map(|i| i.as_u64()?.try_into().ok())
            .collect(),
        v => v
            .as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .into_iter()
            .collect(),
    }
}

impl Tokenizer {
    /// From the text of a HF `tokenizer.json`. BOS is the first id the post-processor puts
    /// before a sequence; EOS and end of turn are unknown from this file alone (see
    /// [`from_hf_dir`](Self::from_hf_dir)).
    pub fn from_tokenizer_json(bytes: &[u8]) -> Result<Tokenizer, TokenizerError> {
        let j: Json =
            serde_json::from_slice(bytes).map_err(|e| json_err("tokenizer.json", e.to_string()))?;
        Tokenizer::from_parts(parse_tokenizer_json(&j)?)
    }

    /// From a HF directory: `tokenizer.json`, plus, when present,
    /// * `tokenizer_config.json`: `bos_token` / `eos_token` / `pad_token` / `unk_token`;
    ///   and, as transformers 5 does, if it has `add_bos_token` or `add_eos_token`, those
    ///   decide what `add_special` adds instead of the tokenizer.json post-processor;
    /// * `config.json` (else `generation_config.json`): `eos_token_id`; a list such as
    ///   Laguna's `[2, 24]` also gives the end-of-turn id (the first entry that is not
    ///   BOS), as llama.cpp's Laguna converter reads it.
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Tokenizer, TokenizerError> {
        let dir = dir.as_ref();
        let tj_path = dir.join("tokenizer.json");
        if !tj_path.is_file() {
            return Err(TokenizerError::NoTokenizer {
                path: dir.to_path_buf(),
            });
        }
        let tj = read_json(&tj_path)?;
        let mut parts = parse_tokenizer_json(&tj)?;
        let token_id = |parts: &Parts, s: &str| {
            parts
                .added
                .iter()
                .find(|t| t.content == s)
                .map(|t| t.id)
                .or_else(|| parts.model_vocab.get(s).copied())
        };

        let cfg_path = dir.join("tokenizer_config.json");
        if cfg_path.is_file() {
            let cfg = read_json(&cfg_path)?;
            let named =
                |parts: &Parts, key: &str| config_token(&cfg[key]).and_then(|s| token_id(parts, s));
            let bos = named(&parts, "bos_token");
            let eos = named(&parts, "eos_token");
            let pad = named(&parts, "pad_token");
            let unk = named(&parts, "unk_token");
            let sp = &mut parts.special;
            sp.bos = bos.or(sp.bos);
            sp.eos = eos.or(sp.eos);
            sp.pad = pad.or(sp.pad);
            sp.unk = unk.or(sp.unk);
            if cfg.get("add_bos_token").is_some() || cfg.get("add_eos_token").is_some() {
                let add_bos = cfg["add_bos_token"] == true;
                let add_eos = cfg["add_eos_token"] == true;
                parts.prefix = parts.special.bos.filter(|_| add_bos).into_iter().collect();
                parts.suffix = parts.special.eos.filter(|_| add_eos).into_iter().collect();
            }
        }

        for name in ["config.json", "generation_config.json"] {
            let path = dir.join(name);
            if !path.is_file() {
                continue;
            }
            let cfg = read_json(&path)?;
            let eos_ids = json_ids(&cfg["eos_token_id"]);
            if eos_ids.is_empty() {
                continue;
            }
            let bos = json_ids(&cfg["bos_token_id"])
                .first()
                .copied()
                .or(parts.special.bos);
            let sp = &mut parts.special;
            sp.eos = sp.eos.or(eos_ids.first().copied());
            if eos_ids.len() > 1 {
                sp.eot = eos_ids.iter().copied().find(|&e| Some(e) != bos);
            }
            break;
        }
        Tokenizer::from_parts(parts)
    }

    /// [`from_tokenizer_json`](Self::from_tokenizer_json) on a file.
    pub fn from_tokenizer_json_file(path: impl AsRef<Path>) -> Result<Tokenizer, TokenizerError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| TokenizerError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Tokenizer::from_tokenizer_json(&bytes)
    }
}
