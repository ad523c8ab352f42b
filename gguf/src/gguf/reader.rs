//! GGUF v3 parser over borrowed bytes (an `Mmap`, or a `Vec<u8>` in tests).
//!
//! Layout (spec/formats.md §1): header `GGUF | u32 version | u64 n_tensors | u64 n_kv`,
//! then `n_kv` key/value records, then `n_tensors` tensor-info records, then the data
//! section at the next multiple of `general.alignment` (default 32). Everything is
//! little-endian with no padding between fields.
//!
//! The parser never trusts a count: before allocating for `n` items it checks that the
//! bytes left could hold `n` items of the smallest possible encoding, so a claimed 2^60
//! array is an error, not an allocation. Metadata is decoded into owned [`Value`]s (small,
//! and needed after the map is gone by `inspect`); tensor bytes are never copied, only
//! located: [`GgufFile::tensor_data`] borrows them from the caller's bytes.

use std::collections::HashSet;
use std::ops::Range;

use lagoon_core::dtype::GgmlType;

use super::error::{Claim, GgufError};
use super::value::{Array, Value, ValueType};

/// `G G U F` as the first four bytes.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The key that sets the data alignment (must be u32).
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Longest tensor name, in bytes (`GGML_MAX_NAME` = 64 including the NUL).
pub const MAX_NAME_BYTES: usize = 63;
/// Most dimensions of a tensor (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Deepest array nesting accepted. The spec allows ARRAY of ARRAY (llama.cpp rejects
/// it); we read nested arrays but bound the depth so a hostile file cannot recurse
/// without limit.
pub const MAX_ARRAY_DEPTH: usize = 4;

/// Smallest encodings, used to bound counts before allocating: a KV record is at least an
/// empty key (u64 length) + u32 type + a 1-byte value; a tensor-info record at least an
/// empty name + u32 n_dims + u32 type + u64 offset.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// One tensor-info record, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `ne[0]` is contiguous (the reverse of PyTorch order).
    pub ne: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of the first byte relative to the data section.
    pub offset: u64,
    /// Bytes the tensor occupies (rows are never padded).
    pub n_bytes: u64,
    /// Where the tensor-info record starts in the file, for error messages.
    pub record_offset: u64,
}

impl TensorInfo {
    /// `ne` padded with 1s to four dimensions.
    pub fn ne4(&self) -> [u64; 4] {
        let mut ne = [1u64; 4];
        ne[..self.ne.len()].copy_from_slice(&self.ne);
        ne
    }

    /// Byte strides `nb[0..4]`: `nb[1]` is one row, `nb[2]` one matrix (one expert of a
    /// stacked `[in, out, n_expert]` tensor), `nb[3]` one 3-D slab.
    pub fn nb(&self) -> [u64; 4] {
        let ne = self.ne4();
        let (_, block_bytes) = self.ty.block();
        // Parsing checked that these products fit in u64.
        let nb1 = self.ty.row_bytes(ne[0]).unwrap_or(0);
        [block_bytes as u64, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2]]
    }

    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }

    /// The shape in PyTorch order (`ne` reversed), e.g. ne `[H, I, E]` → `[E, I, H]`.
    pub fn shape(&self) -> Vec<usize> {
        // Parsing checked the element count fits in i64, hence in usize on 64-bit hosts;
        // on 32-bit hosts the byte-range check against the file length bounds it.
        self.ne.iter().rev().map(|&n| n as usize).collect()
    }
}

/// A parsed GGUF file: metadata, tensor directory and where the data section starts.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufFile {
    pub version: u32,
    /// Data alignment in bytes (`general.alignment`, default 32).
    pub alignment: u64,
    /// Key/value records in file order.
    pub metadata: Vec<(String, Value)>,
    /// Tensor-info records in file order.
    pub tensors: Vec<TensorInfo>,
    /// Absolute offset of the data section.
    pub data_start: u64,
    /// Length of the parsed bytes.
    pub file_len: u64,
}

impl GgufFile {
    /// Parses and validates a whole GGUF file: header, metadata, tensor infos, and that
    /// every tensor's byte range is aligned, inside `bytes` and disjoint from the others.
    pub fn parse(bytes: &[u8]) -> Result<GgufFile, GgufError> {
        let mut cur = Cursor { bytes, pos: 0 };
        let file_len = bytes.len() as u64;

        let magic = cur.take(4, &|| "header (magic)".into())?;
        if magic != MAGIC {
            let mut got = [0u8; 4];
            got.copy_from_slice(magic);
            return Err(GgufError::BadMagic { got });
        }
        let version = cur.u32(&|| "header (version)".into())?;
        check_version(version)?;
        let tensor_count_at = cur.pos as u64;
        let n_tensors = cur.u64(&|| "header (tensor count)".into())?;
        let kv_count_at = cur.pos as u64;
        let n_kv = cur.u64(&|| "header (metadata count)".into())?;

        // The KV records follow the header; both counts must fit in what is left.
        let left = cur.remaining() as u64;
        if n_kv > left / MIN_KV_BYTES {
            return Err(GgufError::ClaimExceedsFile {
                claim: Claim::KvCount,
                context: "header".into(),
                offset: kv_count_at,
                claimed: n_kv,
                max_possible: left / MIN_KV_BYTES,
            });
        }
        if n_tensors > left / MIN_TENSOR_INFO_BYTES {
            return Err(GgufError::ClaimExceedsFile {
                claim: Claim::TensorCount,
                context: "header".into(),
                offset: tensor_count_at,
                claimed: n_tensors,
                max_possible: left / MIN_TENSOR_INFO_BYTES,
            });
        }

        let metadata = read_metadata(&mut cur, n_kv)?;
        let alignment = alignment_of(&metadata)?;
        let tensors = read_tensor_infos(&mut cur, n_tensors)?;

        let end_of_infos = cur.pos as u64;
        // end_of_infos <= file_len, so this cannot overflow in practice; saturate anyway.
        let data_start = align_up(end_of_infos, alignment).unwrap_or(u64::MAX);
        check_tensor_ranges(&tensors, data_start, alignment, file_len)?;

        Ok(GgufFile {
            version,
            alignment,
            metadata,
            tensors,
            data_start,
            file_len,
        })
    }

    /// A metadata value by key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// A tensor-info record by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Absolute byte range of a tensor of this file.
    pub fn tensor_range(&self, t: &TensorInfo) -> Range<usize> {
        // Parsing checked data_start + offset + n_bytes <= file_len, so these fit usize.
        let start = (self.data_start + t.offset) as usize;
        start..start + t.n_bytes as usize
    }

    /// The bytes of a tensor, borrowed from `bytes`, which must be the bytes this file
    /// was parsed from (`None` if they are shorter).
    pub fn tensor_data<'a>(&self, bytes: &'a [u8], t: &TensorInfo) -> Option<&'a [u8]> {
        bytes.get(self.tensor_range(t))
    }
}

/// `x` rounded up to a multiple of `align` (a power of two), `None` on overflow.
pub fn align_up(x: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    Some(x.checked_add(align - 1)? & !(align - 1))
}

fn check_version(version: u32) -> Result<(), GgufError> {
    if version == 0 {
        return Err(GgufError::UnsupportedVersion { version });
    }
    // llama.cpp's heuristic: a byte-swapped small version has zero low 16 bits.
    if version & 0xffff == 0 {
        return Err(GgufError::BigEndian { version });
    }
    // v1 used u32 counts; v2 has v3's layout.
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion { version });
    }
    Ok(())
}

fn alignment_of(metadata: &[(String, Value)]) -> Result<u64, GgufError> {
    match metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
        None => Ok(DEFAULT_ALIGNMENT),
        Some((_, Value::U32(a))) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some((_, Value::U32(a))) => Err(GgufError::BadAlignment { got: u64::from(*a) }),
        Some((_, v)) => Err(GgufError::AlignmentNotU32 { got: v.ty() }),
    }
}

/// A bounds-checked little-endian reader.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// The next `n` bytes; `what` names the field for the error.
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() as u64 {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
                needed: n,
                file_len: self.bytes.len() as u64,
            });
        }
        // n <= remaining, so it fits usize.
        let s = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N as u64, what)?);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A `u64 length + bytes` string's raw bytes; the length is checked against the
    /// bytes left before anything is taken.
    fn string_bytes(&mut self, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        let len_at = self.pos as u64;
        let len = self.u64(what)?;
        let left = self.remaining() as u64;
        if len > left {
            return Err(GgufError::ClaimExceedsFile {
                claim: Claim::StringLength,
                context: what(),
                offset: len_at,
                claimed: len,
                max_possible: left,
            });
        }
        self.take(len, what)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let at = self.pos as u64;
        let b = self.string_bytes(what)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                what: what(),
                offset: at,
            }),
        }
    }
}

fn read_metadata(cur: &mut Cursor<'_>, n_kv: u64) -> Result<Vec<(String, Value)>, GgufError> {
    // n_kv was bounded by the file length.
    let mut out = Vec::with_capacity(n_kv as usize);
    let mut seen: HashSet<String> = HashSet::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let rec_at = cur.pos as u64;
        let key = cur.string(&|| format!("key of key/value record {i}"))?;
        if key.is_empty() {
            return Err(GgufError::EmptyKey { offset: rec_at });
        }
        if !seen.insert(key.clone()) {
            return Err(GgufError::DuplicateKey {
                key,
                offset: rec_at,
            });
        }
        let ty_at = cur.pos as u64;
        let ty_id = cur.u32(&|| format!("value type of key `{key}`"))?;
        let ty = ValueType::from_id(ty_id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.clone(),
            offset: ty_at,
            got: ty_id,
        })?;
        let value = read_value(cur, ty, &key)?;
        out.push((key, value));
    }
    Ok(out)
}

fn read_value(cur: &mut Cursor<'_>, ty: ValueType, key: &str) -> Result<Value, GgufError> {
    let what = || format!("value of key `{key}`");
    Ok(match ty {
        ValueType::U8 => Value::U8(u8::from_le_bytes(cur.array(&what)?)),
        ValueType::I8 => Value::I8(i8::from_le_bytes(cur.array(&what)?)),
        ValueType::U16 => Value::U16(u16::from_le_bytes(cur.array(&what)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(cur.array(&what)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(cur.array(&what)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(cur.array(&what)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(cur.array(&what)?)),
        ValueType::U64 => Value::U64(u64::from_le_bytes(cur.array(&what)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(cur.array(&what)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(cur.array(&what)?)),
        ValueType::Bool => {
            let at = cur.pos as u64;
            let [b] = cur.array(&what)?;
            Value::Bool(to_bool(b, key, at)?)
        }
        ValueType::Str => Value::Str(cur.string(&what)?),
        ValueType::Array => Value::Array(read_array(cur, key, 1)?),
    })
}

fn to_bool(b: u8, key: &str, at: u64) -> Result<bool, GgufError> {
    match b {
        0 => Ok(false),
        1 => Ok(true),
        got => Err(GgufError::InvalidBool {
            key: key.to_owned(),
            offset: at,
            got,
        }),
    }
}

/// Decodes `n` fixed-size little-endian elements.
fn fixed<const N: usize, T>(
    cur: &mut Cursor<'_>,
    n: u64,
    what: &dyn Fn() -> String,
    f: fn([u8; N]) -> T,
) -> Result<Vec<T>, GgufError> {
    // n was bounded by remaining / N, so n * N cannot overflow.
    let raw = cur.take(n * N as u64, what)?;
    Ok(raw
        .chunks_exact(N)
        .map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            f(a)
        })
        .collect())
}

/// An array value: `u32 element type | u64 count | elements`. `depth` is 1 for a
/// top-level array.
fn read_array(cur: &mut Cursor<'_>, key: &str, depth: usize) -> Result<Array, GgufError> {
    let at = cur.pos as u64;
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufError::ArrayTooDeep {
            key: key.to_owned(),
            offset: at,
            max_depth: MAX_ARRAY_DEPTH,
        });
    }
    let what = || format!("array value of key `{key}`");
    let ty_id = cur.u32(&what)?;
    let elem = ValueType::from_id(ty_id).ok_or_else(|| GgufError::UnknownValueType {
        key: key.to_owned(),
        offset: at,
        got: ty_id,
    })?;
    let count_at = cur.pos as u64;
    let n = cur.u64(&what)?;
    let max_possible = cur.remaining() as u64 / elem.min_encoded_size() as u64;
    if n > max_possible {
        return Err(GgufError::ClaimExceedsFile {
            claim: Claim::ArrayLength,
            context: format!("array value of key `{key}`"),
            offset: count_at,
            claimed: n,
            max_possible,
        });
    }
    Ok(match elem {
        ValueType::U8 => Array::U8(fixed(cur, n, &what, u8::from_le_bytes)?),
        ValueType::I8 => Array::I8(fixed(cur, n, &what, i8::from_le_bytes)?),
        ValueType::U16 => Array::U16(fixed(cur, n, &what, u16::from_le_bytes)?),
        ValueType::I16 => Array::I16(fixed(cur, n, &what, i16::from_le_bytes)?),
        ValueType::U32 => Array::U32(fixed(cur, n, &what, u32::from_le_bytes)?),
        ValueType::I32 => Array::I32(fixed(cur, n, &what, i32::from_le_bytes)?),
        ValueType::F32 => Array::F32(fixed(cur, n, &what, f32::from_le_bytes)?),
        ValueType::U64 => Array::U64(fixed(cur, n, &what, u64::from_le_bytes)?),
        ValueType::I64 => Array::I64(fixed(cur, n, &what, i64::from_le_bytes)?),
        ValueType::F64 => Array::F64(fixed(cur, n, &what, f64::from_le_bytes)?),
        ValueType::Bool => {
            let start = cur.pos as u64;
            let raw = cur.take(n, &what)?;
            let mut v = Vec::with_capacity(raw.len());
            for (i, &b) in raw.iter().enumerate() {
                v.push(to_bool(b, key, start + i as u64)?);
            }
            Array::Bool(v)
        }
        ValueType::Str => {
            let mut v = Vec::with_capacity(n as usize);
            for i in 0..n {
                v.push(cur.string(&|| format!("string {i} of array key `{key}`"))?);
            }
            Array::Str(v)
        }
        ValueType::Array => {
            let mut v = Vec::with_capacity(n as usize);
            for _ in 0..n {
                v.push(read_array(cur, key, depth + 1)?);
            }
            Array::Array(v)
        }
    })
}

fn read_tensor_infos(cur: &mut Cursor<'_>, n: u64) -> Result<Vec<TensorInfo>, GgufError> {
    // n was bounded by the file length.
    let mut out = Vec::with_capacity(n as usize);
    let mut seen: HashSet<String> = HashSet::with_capacity(n as usize);
    for i in 0..n {
        let rec_at = cur.pos as u64;
        let what = || format!("tensor-info record {i}");
        let raw = cur.string_bytes(&what)?;
        if raw.len() > MAX_NAME_BYTES {
            return Err(GgufError::NameTooLong {
                name: String::from_utf8_lossy(raw).into_owned(),
                offset: rec_at,
                len: raw.len() as u64,
            });
        }
        let name = std::str::from_utf8(raw)
            .map_err(|_| GgufError::InvalidUtf8 {
                what: format!("name of tensor-info record {i}"),
                offset: rec_at,
            })?
            .to_owned();
        if !seen.insert(name.clone()) {
            return Err(GgufError::DuplicateTensor {
                name,
                offset: rec_at,
            });
        }
        let what = || format!("tensor-info record of `{name}`");
        let n_dims = cur.u32(&what)?;
        if n_dims as usize > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                tensor: name,
                offset: rec_at,
                n_dims,
            });
        }
        let ne: Vec<u64> = fixed(cur, u64::from(n_dims), &what, u64::from_le_bytes)?;
        let ty_id = cur.u32(&what)?;
        let offset = cur.u64(&what)?;
        let ty = GgmlType::from_id(ty_id).ok_or_else(|| GgufError::UnknownTensorType {
            tensor: name.clone(),
            offset: rec_at,
            got: ty_id,
        })?;
        let n_bytes = tensor_bytes(&name, ty, &ne)?;
        out.push(TensorInfo {
            name,
            ne,
            ty,
            offset,
            n_bytes,
            record_offset: rec_at,
        });
    }
    Ok(out)
}

/// Byte size of a tensor, after llama.cpp's checks: every `ne` non-negative as i64, the
/// element count (zeros counted as 1) fits i64, `ne[0]` is whole blocks, and the byte size fits u64.
pub(crate) fn tensor_bytes(name: &str, ty: GgmlType, ne: &[u64]) -> Result<u64, GgufError> {
    let overflow = || GgufError::DimsOverflow {
        tensor: name.to_owned(),
        ne: ne.to_vec(),
    };
    // Zero dims are counted as 1 here, so a zero-element tensor cannot hide absurd
    // other dims (which would size per-expert part lists).
    let mut n_elements: u64 = 1;
    for &d in ne {
        if d > i64::MAX as u64 {
            return Err(overflow());
        }
        n_elements = n_elements
            .checked_mul(d.max(1))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(overflow)?;
    }
    let ne0 = ne.first().copied().unwrap_or(1);
    let (block, _) = ty.block();
    if ne0 % block as u64 != 0 {
        return Err(GgufError::RaggedRow {
            tensor: name.to_owned(),
            ty,
            ne0,
            block,
        });
    }
    let row = ty.row_bytes(ne0).ok_or_else(overflow)?;
    ne.iter()
        .skip(1)
        .try_fold(row, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)
}

/// Every tensor: offset aligned, bytes inside the file, no two overlapping.
fn check_tensor_ranges(
    tensors: &[TensorInfo],
    data_start: u64,
    alignment: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    let mut ranges: Vec<(u64, u64, usize)> = Vec::with_capacity(tensors.len());
    for (i, t) in tensors.iter().enumerate() {
        if t.offset % alignment != 0 {
            return Err(GgufError::MisalignedTensor {
                tensor: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
        let start = data_start.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(s), Some(e)) if e <= file_len => {
                if e > s {
                    ranges.push((s, e, i));
                }
            }
            _ => {
                return Err(GgufError::TensorOutOfFile {
                    tensor: t.name.clone(),
                    start: start.unwrap_or(u64::MAX),
                    end: end.unwrap_or(u64::MAX),
                    file_len,
                });
            }
        }
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        let ((_, first_end, a), (second_start, _, b)) = (w[0], w[1]);
        if first_end > second_start {
            return Err(GgufError::TensorsOverlap {
                first: tensors[a].name.clone(),
                second: tensors[b].name.clone(),
                first_end,
                second_start,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worked example of spec/formats.md §1.10, byte for byte (written by gguf-py).
    fn spec_example() -> Vec<u8> {
        let mut b = Vec::new();
        let s = |b: &mut Vec<u8>, s: &str| {
            b.extend((s.len() as u64).to_le_bytes());
            b.extend(s.as_bytes());
        };
        b.extend(b"GGUF");
        b.extend(3u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(3u64.to_le_bytes());
        s(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        s(&mut b, "test");
        s(&mut b, "test.u32");
        b.extend(4u32.to_le_bytes());
        b.extend(7u32.to_le_bytes());
        s(&mut b, "test.arr");
        b.extend(9u32.to_le_bytes());
        b.extend(5u32.to_le_bytes());
        b.extend(3u64.to_le_bytes());
        for v in [1i32, 2, 3] {
            b.extend(v.to_le_bytes());
        }
        assert_eq!(b.len(), 0x88);
        s(&mut b, "t.weight");
        b.extend(2u32.to_le_bytes());
        b.extend(32u64.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(8u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        s(&mut b, "v.weight");
        b.extend(1u32.to_le_bytes());
        b.extend(3u64.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend(96u64.to_le_bytes());
        assert_eq!(b.len(), 0xe0);
        b.extend((0..68).map(|i| i as u8));
        b.resize(0x140, 0);
        for v in [1.0f32, 2.0, 3.0] {
            b.extend(v.to_le_bytes());
        }
        b.resize(0x160, 0);
        b
    }

    #[test]
    fn parses_the_spec_example() {
        let b = spec_example();
        let f = GgufFile::parse(&b).unwrap();
        assert_eq!(f.version, 3);
        assert_eq!(f.alignment, 32);
        assert_eq!(f.data_start, 0xe0);
        assert_eq!(f.get("general.architecture"), Some(&Value::from("test")));
        assert_eq!(f.get("test.u32"), Some(&Value::U32(7)));
        assert_eq!(
            f.get("test.arr"),
            Some(&Value::Array(Array::I32(vec![1, 2, 3])))
        );
        let t = f.tensor("t.weight").unwrap();
        assert_eq!(
            (t.ty, t.ne.clone(), t.n_bytes),
            (GgmlType::Q8_0, vec![32, 2], 68)
        );
        assert_eq!(t.shape(), vec![2, 32]);
        assert_eq!(t.nb(), [34, 34, 68, 68]);
        assert_eq!(f.tensor_data(&b, t).unwrap()[..3], [0, 1, 2]);
        let v = f.tensor("v.weight").unwrap();
        assert_eq!(f.tensor_range(v), 0x140..0x14c);
        assert_eq!(f.tensor_data(&b, v).unwrap()[..4], 1.0f32.to_le_bytes());
    }

    #[test]
    fn version_rules() {
        assert!(check_version(2).is_ok());
        assert!(check_version(3).is_ok());
        assert!(matches!(
            check_version(1),
            Err(GgufError::UnsupportedVersion { version: 1 })
        ));
        assert!(matches!(
            check_version(0x0300_0000),
            Err(GgufError::BigEndian { .. })
        ));
        assert!(matches!(
            check_version(0),
            Err(GgufError::UnsupportedVersion { .. })
        ));
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(
            tensor_bytes("t", GgmlType::Q4K, &[512, 3, 2]).unwrap(),
            2 * 144 * 6
        );
        assert_eq!(tensor_bytes("t", GgmlType::F32, &[]).unwrap(), 4);
        assert_eq!(tensor_bytes("t", GgmlType::F32, &[0, 5]).unwrap(), 0);
        assert!(matches!(
            tensor_bytes("t", GgmlType::Q8_0, &[33]),
            Err(GgufError::RaggedRow {
                ne0: 33,
                block: 32,
                ..
            })
        ));
        assert!(matches!(
            tensor_bytes("t", GgmlType::F32, &[1 << 62, 4]),
            Err(GgufError::DimsOverflow { .. })
        ));
        // A zero dim does not hide absurd other dims.
        assert!(matches!(
            tensor_bytes("t", GgmlType::F32, &[0, 1 << 40, 1 << 40]),
            Err(GgufError::DimsOverflow { .. })
        ));
        assert!(matches!(
            tensor_bytes("t", GgmlType::F32, &[u64::MAX]),
            Err(GgufError::DimsOverflow { .. })
        ));
        // Fits i64 elements but not u64 bytes.
        assert!(matches!(
            tensor_bytes("t", GgmlType::F64, &[1 << 62]),
            Err(GgufError::DimsOverflow { .. })
        ));
        assert_eq!(align_up(0xe0, 32), Some(0xe0));
        assert_eq!(align_up(0xe1, 32), Some(0x100));
        assert_eq!(align_up(u64::MAX, 32), None);
    }
}
