//! A GGUF v3 writer: metadata of every value type and tensors of any ggml type, laid out
//! the way gguf-py lays them out (tensors in insertion order, each padded to the
//! alignment, the file padded at the end), so a file we write reads back byte-identical
//! in llama.cpp and in [`GgufFile::parse`](super::GgufFile::parse).
//!
//! It checks its input with the reader's rules (unique non-empty keys, names < 64 bytes,
//! ≤ 4 dims, whole blocks, data length = type × dims), so everything it writes parses.
//! [`GgufWriter::to_bytes_with_layout`] also reports where every field went, which the
//! corrupt-file tests use to mutate one field at a time.

use std::collections::HashSet;
use std::io::{self, Write};
use std::path::Path;

use lagoon_core::dtype::GgmlType;

use super::error::GgufError;
use super::reader::{
    ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS, MAX_NAME_BYTES, align_up,
    tensor_bytes,
};
use super::value::{Array, Value};

/// Builds a GGUF file in memory and writes it out.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    alignment: u64,
    metadata: Vec<(String, Value)>,
    keys: HashSet<String>,
    tensors: Vec<PendingTensor>,
    names: HashSet<String>,
}

#[derive(Clone, Debug)]
struct PendingTensor {
    name: String,
    ty: GgmlType,
    ne: Vec<u64>,
    data: Vec<u8>,
}

/// Where each field of a written file lies (absolute byte offsets).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    pub kvs: Vec<KvLayout>,
    pub tensors: Vec<TensorLayout>,
    /// Offset of the `n_tensors` and `n_kv` header fields.
    pub tensor_count_at: u64,
    pub kv_count_at: u64,
    pub data_start: u64,
    pub file_len: u64,
}

/// Where one key/value record lies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub key: String,
    /// The key's u64 length field (start of the record).
    pub start: u64,
    /// The u32 value type.
    pub type_at: u64,
    /// The value (for arrays: the u32 element type, then the u64 count at `value_at + 4`).
    pub value_at: u64,
    /// One past the record's last byte.
    pub end: u64,
}

/// Where one tensor-info record and its data lie.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorLayout {
    pub name: String,
    /// The name's u64 length field (start of the record).
    pub start: u64,
    pub n_dims_at: u64,
    /// `ne[0]`; `ne[i]` is at `ne_at + 8·i`.
    pub ne_at: u64,
    pub type_at: u64,
    pub offset_at: u64,
    /// Offset relative to the data section.
    pub offset: u64,
    pub n_bytes: u64,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty file with the default 32-byte alignment.
    pub fn new() -> GgufWriter {
        GgufWriter {
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            keys: HashSet::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
        }
    }

    /// Sets the data alignment and records it as `general.alignment` (u32).
    pub fn set_alignment(&mut self, alignment: u32) -> Result<&mut Self, GgufError> {
        self.add(ALIGNMENT_KEY, Value::U32(alignment))
    }

    /// Adds one key/value record. Keys must be non-empty and unique; `general.alignment`
    /// must be a u32 power of two and also sets the alignment.
    pub fn add(&mut self, key: &str, value: impl Into<Value>) -> Result<&mut Self, GgufError> {
        let value = value.into();
        if key.is_empty() {
            return Err(GgufError::EmptyKey { offset: 0 });
        }
        if self.keys.contains(key) {
            return Err(GgufError::DuplicateKey {
                key: key.to_owned(),
                offset: 0,
            });
        }
        if key == ALIGNMENT_KEY {
            match value {
                Value::U32(a) if a.is_power_of_two() => self.alignment = u64::from(a),
                Value::U32(a) => return Err(GgufError::BadAlignment { got: u64::from(a) }),
                ref v => return Err(GgufError::AlignmentNotU32 { got: v.ty() }),
            }
        }
        if let Value::Array(a) = &value
            && depth(a) > MAX_ARRAY_DEPTH
        {
            return Err(GgufError::ArrayTooDeep {
                key: key.to_owned(),
                offset: 0,
                max_depth: MAX_ARRAY_DEPTH,
            });
        }
        self.keys.insert(key.to_owned());
        self.metadata.push((key.to_owned(), value));
        Ok(self)
    }

    /// Adds a tensor with dims `ne` in ggml order (`ne[0]` contiguous) and its encoded
    /// bytes, which must be exactly what `ty` and `ne` imply.
    pub fn add_tensor(
        &mut self,
        name: &str,
        ty: GgmlType,
        ne: &[u64],
        data: impl Into<Vec<u8>>,
    ) -> Result<&mut Self, GgufError> {
        let data = data.into();
        if name.len() > MAX_NAME_BYTES {
            return Err(GgufError::NameTooLong {
                name: name.to_owned(),
                offset: 0,
                len: name.len() as u64,
            });
        }
        if self.names.contains(name) {
            return Err(GgufError::DuplicateTensor {
                name: name.to_owned(),
                offset: 0,
            });
        }
        if ne.len() > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                tensor: name.to_owned(),
                offset: 0,
                n_dims: ne.len() as u32,
            });
        }
        let expected = tensor_bytes(name, ty, ne)?;
        if expected != data.len() as u64 {
            return Err(GgufError::DataSizeMismatch {
                tensor: name.to_owned(),
                expected,
                got: data.len() as u64,
            });
        }
        self.names.insert(name.to_owned());
        self.tensors.push(PendingTensor {
            name: name.to_owned(),
            ty,
            ne: ne.to_vec(),
            data,
        });
        Ok(self)
    }

    /// The metadata added so far, in order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The data alignment.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// The whole file as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.to_bytes_with_layout().0
    }

    /// The whole file as bytes, and where each field went.
    pub fn to_bytes_with_layout(&self) -> (Vec<u8>, Layout) {
        let mut out = Vec::new();
        // Writing into a Vec cannot fail.
        let layout = self.write_to(&mut out).unwrap_or_default();
        (out, layout)
    }

    /// Writes the file to `path` (created or truncated).
    pub fn write_file(&self, path: impl AsRef<Path>) -> io::Result<Layout> {
        let mut f = io::BufWriter::new(std::fs::File::create(path)?);
        let layout = self.write_to(&mut f)?;
        f.flush()?;
        Ok(layout)
    }

    /// Writes the file to `w`.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<Layout> {
        let a = self.alignment;
        let mut head = Vec::new();
        let mut layout = Layout::default();
        head.extend(MAGIC);
        head.extend(3u32.to_le_bytes());
        layout.tensor_count_at = head.len() as u64;
        head.extend((self.tensors.len() as u64).to_le_bytes());
        layout.kv_count_at = head.len() as u64;
        head.extend((self.metadata.len() as u64).to_le_bytes());

        for (key, value) in &self.metadata {
            let start = head.len() as u64;
            put_str(&mut head, key);
            let type_at = head.len() as u64;
            head.extend(value.ty().id().to_le_bytes());
            let value_at = head.len() as u64;
            put_value(&mut head, value);
            layout.kvs.push(KvLayout {
                key: key.clone(),
                start,
                type_at,
                value_at,
                end: head.len() as u64,
            });
        }

        let mut offset = 0u64;
        for t in &self.tensors {
            let start = head.len() as u64;
            put_str(&mut head, &t.name);
            let n_dims_at = head.len() as u64;
            head.extend((t.ne.len() as u32).to_le_bytes());
            let ne_at = head.len() as u64;
            for &d in &t.ne {
                head.extend(d.to_le_bytes());
            }
            let type_at = head.len() as u64;
            head.extend((t.ty as u32).to_le_bytes());
            let offset_at = head.len() as u64;
            head.extend(offset.to_le_bytes());
            let n_bytes = t.data.len() as u64;
            layout.tensors.push(TensorLayout {
                name: t.name.clone(),
                start,
                n_dims_at,
                ne_at,
                type_at,
                offset_at,
                offset,
                n_bytes,
            });
            offset += padded(n_bytes, a);
        }

        let data_start = padded(head.len() as u64, a);
        head.resize(data_start as usize, 0);
        w.write_all(&head)?;
        for t in &self.tensors {
            w.write_all(&t.data)?;
            let pad = padded(t.data.len() as u64, a) - t.data.len() as u64;
            io::copy(&mut io::Read::take(io::repeat(0), pad), w)?;
        }
        layout.data_start = data_start;
        layout.file_len = data_start + offset;
        Ok(layout)
    }
}

/// `n` rounded up to the alignment. Writer sizes are in-memory sizes, far from u64::MAX.
fn padded(n: u64, a: u64) -> u64 {
    align_up(n, a).unwrap_or(u64::MAX)
}

/// Nesting depth of an array (1 for a flat array).
fn depth(a: &Array) -> usize {
    match a {
        Array::Array(v) => 1 + v.iter().map(depth).max().unwrap_or(0),
        _ => 1,
    }
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

/// The value's payload (its type id is written by the caller).
fn put_value(b: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => b.extend(x.to_le_bytes()),
        Value::I8(x) => b.extend(x.to_le_bytes()),
        Value::U16(x) => b.extend(x.to_le_bytes()),
        Value::I16(x) => b.extend(x.to_le_bytes()),
        Value::U32(x) => b.extend(x.to_le_bytes()),
        Value::I32(x) => b.extend(x.to_le_bytes()),
        Value::F32(x) => b.extend(x.to_le_bytes()),
        Value::Bool(x) => b.push(u8::from(*x)),
        Value::Str(s) => put_str(b, s),
        Value::Array(a) => put_array(b, a),
        Value::U64(x) => b.extend(x.to_le_bytes()),
        Value::I64(x) => b.extend(x.to_le_bytes()),
        Value::F64(x) => b.extend(x.to_le_bytes()),
    }
}

/// `u32 element type | u64 count | elements`.
fn put_array(b: &mut Vec<u8>, a: &Array) {
    b.extend(a.elem_type().id().to_le_bytes());
    b.extend((a.len() as u64).to_le_bytes());
    macro_rules! le {
        ($v:expr) => {
            for x in $v {
                b.extend(x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => b.extend(v),
        Array::I8(v) => le!(v),
        Array::U16(v) => le!(v),
        Array::I16(v) => le!(v),
        Array::U32(v) => le!(v),
        Array::I32(v) => le!(v),
        Array::F32(v) => le!(v),
        Array::Bool(v) => b.extend(v.iter().map(|&x| u8::from(x))),
        Array::Str(v) => {
            for s in v {
                put_str(b, s);
            }
        }
        Array::Array(v) => {
            for inner in v {
                put_array(b, inner);
            }
        }
        Array::U64(v) => le!(v),
        Array::I64(v) => le!(v),
        Array::F64(v) => le!(v),
    }
}
