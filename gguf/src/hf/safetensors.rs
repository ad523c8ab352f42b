//! safetensors container (spec/formats.md §6): `u64 LE` header length N, N bytes of JSON
//! (`name → {dtype, shape, data_offsets}` plus an optional `__metadata__` of strings), then the
//! data buffer. Offsets are relative to the buffer; the tensors must tile it exactly, as the
//! reference reader (`safetensors/src/tensor.rs`) demands.

use serde_json::Value;

use super::HfError;

/// The reference implementation's limit on the header length.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// A safetensors element type (enum `Dtype` in `safetensors/src/tensor.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    Bool,
    F4,
    F6E2M3,
    F6E3M2,
    U8,
    I8,
    F8E5M2,
    F8E4M3,
    F8E8M0,
    F8E4M3Fnuz,
    F8E5M2Fnuz,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    F64,
    I64,
    U64,
    C64,
}

impl Dtype {
    /// Parses a header dtype string.
    pub fn parse(s: &str) -> Option<Dtype> {
        use Dtype::*;
        Some(match s {
            "BOOL" => Bool,
            "F4" => F4,
            "F6_E2M3" => F6E2M3,
            "F6_E3M2" => F6E3M2,
            "U8" => U8,
            "I8" => I8,
            "F8_E5M2" => F8E5M2,
            "F8_E4M3" => F8E4M3,
            "F8_E8M0" => F8E8M0,
            "F8_E4M3FNUZ" => F8E4M3Fnuz,
            "F8_E5M2FNUZ" => F8E5M2Fnuz,
            "I16" => I16,
            "U16" => U16,
            "F16" => F16,
            "BF16" => BF16,
            "I32" => I32,
            "U32" => U32,
            "F32" => F32,
            "F64" => F64,
            "I64" => I64,
            "U64" => U64,
            "C64" => C64,
            _ => return None,
        })
    }

    /// The header spelling.
    pub fn name(self) -> &'static str {
        use Dtype::*;
        match self {
            Bool => "BOOL",
            F4 => "F4",
            F6E2M3 => "F6_E2M3",
            F6E3M2 => "F6_E3M2",
            U8 => "U8",
            I8 => "I8",
            F8E5M2 => "F8_E5M2",
            F8E4M3 => "F8_E4M3",
            F8E8M0 => "F8_E8M0",
            F8E4M3Fnuz => "F8_E4M3FNUZ",
            F8E5M2Fnuz => "F8_E5M2FNUZ",
            I16 => "I16",
            U16 => "U16",
            F16 => "F16",
            BF16 => "BF16",
            I32 => "I32",
            U32 => "U32",
            F32 => "F32",
            F64 => "F64",
            I64 => "I64",
            U64 => "U64",
            C64 => "C64",
        }
    }

    /// Bits per element.
    pub fn bits(self) -> usize {
        use Dtype::*;
        match self {
            F4 => 4,
            F6E2M3 | F6E3M2 => 6,
            Bool | U8 | I8 | F8E5M2 | F8E4M3 | F8E8M0 | F8E4M3Fnuz | F8E5M2Fnuz => 8,
            I16 | U16 | F16 | BF16 => 16,
            I32 | U32 | F32 => 32,
            F64 | I64 | U64 | C64 => 64,
        }
    }

    /// The ggml type with the same byte layout, if any (F32/F16/BF16 and the plain ints).
    pub fn ggml(self) -> Option<lagoon_core::dtype::GgmlType> {
        use lagoon_core::dtype::GgmlType as G;
        Some(match self {
            Dtype::F32 => G::F32,
            Dtype::F16 => G::F16,
            Dtype::BF16 => G::BF16,
            Dtype::F64 => G::F64,
            Dtype::I8 => G::I8,
            Dtype::I16 => G::I16,
            Dtype::I32 => G::I32,
            Dtype::I64 => G::I64,
            _ => return None,
        })
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One tensor of a safetensors file. `start` is an absolute file offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: Dtype,
    /// PyTorch order (not reversed).
    pub shape: Vec<usize>,
    pub start: usize,
    pub len: usize,
}

impl TensorInfo {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A parsed header: tensors sorted by offset, and `__metadata__`.
#[derive(Clone, Debug, Default)]
pub struct Header {
    pub metadata: Vec<(String, String)>,
    pub tensors: Vec<TensorInfo>,
}

/// Parses and checks the header of a whole safetensors file held in `bytes`. `file` names the
/// file in errors.
pub fn parse(file: &str, bytes: &[u8]) -> Result<Header, HfError> {
    let file_len = bytes.len() as u64;
    let too_short = || HfError::FileTooShort {
        file: file.to_string(),
        len: file_len,
    };
    let n = u64::from_le_bytes(
        bytes
            .get(..8)
            .ok_or_else(too_short)?
            .try_into()
            .unwrap_or([0; 8]),
    );
    if n > MAX_HEADER_BYTES {
        return Err(HfError::HeaderTooLarge {
            file: file.to_string(),
            header_len: n,
            limit: MAX_HEADER_BYTES,
        });
    }
    if 8 + n > file_len {
        return Err(HfError::HeaderOutOfFile {
            file: file.to_string(),
            header_len: n,
            file_len,
        });
    }
    let json = &bytes[8..8 + n as usize];
    if json.first() != Some(&b'{') {
        return Err(HfError::BadJson {
            file: file.to_string(),
            detail: "the header does not start with `{`".into(),
        });
    }
    let value: Value = serde_json::from_slice(json).map_err(|e| HfError::BadJson {
        file: file.to_string(),
        detail: e.to_string(),
    })?;
    let Value::Object(map) = value else {
        return Err(HfError::BadJson {
            file: file.to_string(),
            detail: "the header is not a JSON object".into(),
        });
    };
    let data_start = 8 + n as usize;
    let data_len = bytes.len() - data_start;
    let mut header = Header::default();
    for (name, entry) in &map {
        if name == "__metadata__" {
            let Value::Object(m) = entry else {
                return Err(bad_entry(file, name, "`__metadata__` is not an object"));
            };
            for (k, v) in m {
                let Value::String(s) = v else {
                    return Err(bad_entry(
                        file,
                        name,
                        &format!("`__metadata__.{k}` is not a string"),
                    ));
                };
                header.metadata.push((k.clone(), s.clone()));
            }
            continue;
        }
        header
            .tensors
            .push(parse_entry(file, name, entry, data_start, data_len)?);
    }
    header.tensors.sort_by_key(|t| (t.start, t.len));
    // The tensors must tile the buffer: no overlap, no gap, nothing after the last.
    let mut end = data_start;
    let mut prev: Option<&TensorInfo> = None;
    for t in &header.tensors {
        if t.start < end {
            return Err(HfError::Overlap {
                file: file.to_string(),
                tensor: t.name.clone(),
                other: prev.map(|p| p.name.clone()).unwrap_or_default(),
            });
        }
        if t.start > end {
            return Err(HfError::Gap {
                file: file.to_string(),
                offset: (end - data_start) as u64,
                next: Some(t.name.clone()),
            });
        }
        end = t.start + t.len;
        prev = Some(t);
    }
    if end != bytes.len() {
        return Err(HfError::Gap {
            file: file.to_string(),
            offset: (end - data_start) as u64,
            next: None,
        });
    }
    Ok(header)
}

/// Serialises tensors (name, dtype, shape, little-endian bytes) as a safetensors file, in
/// the given order, with the header padded with spaces to a multiple of 8 as the reference
/// writer does. For tests and tools; the sizes are not checked.
pub fn serialize(tensors: &[(&str, Dtype, &[usize], &[u8])], metadata: &[(&str, &str)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        let m: serde_json::Map<String, Value> = metadata
            .iter()
            .map(|(k, v)| (k.to_string(), Value::from(*v)))
            .collect();
        header.insert("__metadata__".into(), Value::Object(m));
    }
    let mut offset = 0usize;
    for (name, dtype, shape, data) in tensors {
        header.insert(
            name.to_string(),
            serde_json::json!({
                "dtype": dtype.name(),
                "shape": shape,
                "data_offsets": [offset, offset + data.len()],
            }),
        );
        offset += data.len();
    }
    let mut json = Value::Object(header).to_string().into_bytes();
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
    }
    out
}

fn bad_entry(file: &str, tensor: &str, detail: &str) -> HfError {
    HfError::BadTensorEntry {
        file: file.to_string(),
        tensor: tensor.to_string(),
        detail: detail.to_string(),
    }
}

fn parse_entry(
    file: &str,
    name: &str,
    entry: &Value,
    data_start: usize,
    data_len: usize,
) -> Result<TensorInfo, HfError> {
    let Value::Object(e) = entry else {
        return Err(bad_entry(file, name, "the entry is not an object"));
    };
    let dtype_s = e
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| bad_entry(file, name, "`dtype` is missing or not a string"))?;
    let dtype = Dtype::parse(dtype_s).ok_or_else(|| HfError::UnknownDtype {
        file: file.to_string(),
        tensor: name.to_string(),
        dtype: dtype_s.to_string(),
    })?;
    let shape = e
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| bad_entry(file, name, "`shape` is missing or not an array"))?
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| bad_entry(file, name, "`shape` holds a non-integer or negative entry"))?;
    let offs = e
        .get("data_offsets")
        .and_then(Value::as_array)
        .filter(|a| a.len() == 2)
        .and_then(|a| Some((a[0].as_u64()?, a[1].as_u64()?)))
        .ok_or_else(|| bad_entry(file, name, "`data_offsets` is not a pair of integers"))?;
    let (begin, end) = offs;
    if begin > end || end > data_len as u64 {
        return Err(HfError::OffsetsOutOfRange {
            file: file.to_string(),
            tensor: name.to_string(),
            begin,
            end,
            data_len: data_len as u64,
        });
    }
    let numel = shape
        .iter()
        .try_fold(1u128, |a, &d| a.checked_mul(d as u128))
        .unwrap_or(u128::MAX);
    let bits = numel.saturating_mul(dtype.bits() as u128);
    if bits % 8 != 0 || bits / 8 != (end - begin) as u128 {
        return Err(HfError::SizeMismatch {
            file: file.to_string(),
            tensor: name.to_string(),
            expected: (bits / 8).min(u64::MAX as u128) as u64,
            got: end - begin,
        });
    }
    Ok(TensorInfo {
        name: name.to_string(),
        dtype,
        shape,
        start: data_start + begin as usize,
        len: (end - begin) as usize,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn reads_two_tensors_and_metadata() {
        let h = r#"{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}  "#;
        let f = file(h, &[0u8; 12]);
        let hd = parse("x", &f).unwrap();
        assert_eq!(hd.metadata, vec![("format".to_string(), "pt".to_string())]);
        assert_eq!(hd.tensors[0].name, "a");
        assert_eq!(hd.tensors[0].start, 8 + h.len());
        assert_eq!(hd.tensors[1].dtype, Dtype::BF16);
        assert_eq!(hd.tensors[1].len, 4);
    }

    #[test]
    fn scalar_and_empty_tensors() {
        let h = r#"{"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]},"e":{"dtype":"F32","shape":[0,4],"data_offsets":[8,8]}}"#;
        let f = file(h, &[1u8; 8]);
        let hd = parse("x", &f).unwrap();
        assert_eq!(hd.tensors.len(), 2);
    }

    #[test]
    fn rejects_gap_and_trailing_bytes() {
        let h = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}"#;
        assert!(matches!(
            parse("x", &file(h, &[0u8; 4])),
            Err(HfError::Gap { offset: 0, .. })
        ));
        let h = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#;
        assert!(matches!(
            parse("x", &file(h, &[0u8; 3])),
            Err(HfError::Gap {
                offset: 2,
                next: None,
                ..
            })
        ));
    }
}
