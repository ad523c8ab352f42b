//! Why a GGUF file could not be read, written, or turned into a Laguna config. Every
//! variant carries the key or tensor, the byte offset and what was expected where that
//! applies; the Display text says what to do about it.

use std::fmt;
use std::path::PathBuf;

use lagoon_core::dtype::GgmlType;

use super::value::ValueType;

/// What a count or length in the file claimed to hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    TensorCount,
    KvCount,
    StringLength,
    ArrayLength,
}

impl Claim {
    fn unit(self) -> &'static str {
        match self {
            Claim::TensorCount => "tensor-info records",
            Claim::KvCount => "key/value records",
            Claim::StringLength => "string bytes",
            Claim::ArrayLength => "array elements",
        }
    }
}

/// A malformed GGUF container or unusable GGUF metadata.
#[derive(Debug)]
pub enum GgufError {
    /// The file ended inside a header field, key/value or tensor-info record.
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        file_len: u64,
    },
    /// The first four bytes are not `GGUF`.
    BadMagic {
        got: [u8; 4],
    },
    /// The version's low 16 bits are zero: the file was written big-endian.
    BigEndian {
        version: u32,
    },
    /// Version 0, 1 (u32 counts) or newer than 3.
    UnsupportedVersion {
        version: u32,
    },
    /// A count or length claims more than the rest of the file could hold.
    ClaimExceedsFile {
        claim: Claim,
        /// What was being read (`key "general.name"`, `tensor-info record 3`, ...).
        context: String,
        offset: u64,
        claimed: u64,
        /// How many items fit at most in the remaining bytes.
        max_possible: u64,
    },
    /// A value or array-element type id outside 0..=12.
    UnknownValueType {
        key: String,
        offset: u64,
        got: u32,
    },
    /// A BOOL byte other than 0 or 1.
    InvalidBool {
        key: String,
        offset: u64,
        got: u8,
    },
    /// A key, string value or tensor name is not UTF-8.
    InvalidUtf8 {
        what: String,
        offset: u64,
    },
    /// Arrays nested deeper than [`MAX_ARRAY_DEPTH`](super::reader::MAX_ARRAY_DEPTH).
    ArrayTooDeep {
        key: String,
        offset: u64,
        max_depth: usize,
    },
    EmptyKey {
        offset: u64,
    },
    DuplicateKey {
        key: String,
        offset: u64,
    },
    /// `general.alignment` is stored with a type other than u32.
    AlignmentNotU32 {
        got: ValueType,
    },
    /// `general.alignment` is zero or not a power of two.
    BadAlignment {
        got: u64,
    },
    /// A tensor name of 64 bytes or more (ggml keeps names in 64 bytes with a NUL).
    NameTooLong {
        name: String,
        offset: u64,
        len: u64,
    },
    DuplicateTensor {
        name: String,
        offset: u64,
    },
    TooManyDims {
        tensor: String,
        offset: u64,
        n_dims: u32,
    },
    /// A ggml type id that is unknown, removed (block size 0) or newer than lagoon.
    UnknownTensorType {
        tensor: String,
        offset: u64,
        got: u32,
    },
    /// `ne[0]` is not a whole number of blocks.
    RaggedRow {
        tensor: String,
        ty: GgmlType,
        ne0: u64,
        block: usize,
    },
    /// A dimension is negative as i64, or the element count or byte size overflows.
    DimsOverflow {
        tensor: String,
        ne: Vec<u64>,
    },
    /// A tensor's offset is not a multiple of the file's alignment.
    MisalignedTensor {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    /// A tensor's bytes end past the end of the file.
    TensorOutOfFile {
        tensor: String,
        start: u64,
        end: u64,
        file_len: u64,
    },
    /// Two tensors' byte ranges overlap.
    TensorsOverlap {
        first: String,
        second: String,
        first_end: u64,
        second_start: u64,
    },
    /// A shard of a split set is not on disk.
    MissingShard {
        path: PathBuf,
        shard: u32,
        count: u32,
    },
    /// A file says it is one of `count` shards but its name does not follow
    /// `<prefix>-NNNNN-of-MMMMM.gguf`, so the other shards cannot be found.
    SplitName {
        path: PathBuf,
        count: u32,
    },
    /// A shard's `split.*` keys disagree with the set (`expected` vs `got`; `None` = absent).
    SplitMismatch {
        path: PathBuf,
        key: &'static str,
        expected: u64,
        got: Option<u64>,
    },
    /// Writer input: the bytes given for a tensor do not match its type and dims.
    DataSizeMismatch {
        tensor: String,
        expected: u64,
        got: u64,
    },
    /// `general.architecture` is not `laguna`.
    WrongArchitecture {
        got: String,
    },
    /// A metadata key the Laguna config needs is absent.
    MissingKey {
        key: String,
    },
    /// A metadata key has a type the config cannot use.
    WrongKeyType {
        key: String,
        expected: &'static str,
        got: String,
    },
    /// A metadata key has a value the config cannot use.
    BadKeyValue {
        key: String,
        detail: String,
    },
    /// An error inside a particular file (a split shard or the file that was opened).
    InFile {
        path: PathBuf,
        source: Box<GgufError>,
    },
}

impl GgufError {
    /// The error without its [`GgufError::InFile`] wrappers.
    pub fn root(&self) -> &GgufError {
        match self {
            GgufError::InFile { source, .. } => source.root(),
            e => e,
        }
    }

    /// Wraps `self` with the file it came from.
    pub fn in_file(self, path: impl Into<PathBuf>) -> GgufError {
        GgufError::InFile {
            path: path.into(),
            source: Box::new(self),
        }
    }
}

const CORRUPT: &str = "the file is corrupt or truncated; re-download or re-convert it";

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use GgufError::*;
        match self {
            Truncated {
                what,
                offset,
                needed,
                file_len,
            } => write!(
                f,
                "GGUF file ends inside the {what}: {needed} bytes needed at byte {offset}, but the file has {file_len} bytes; {CORRUPT}"
            ),
            BadMagic { got } => write!(
                f,
                "not a GGUF file: it starts with {got:02x?} instead of \"GGUF\"; pass a .gguf file or a HF checkpoint directory"
            ),
            BigEndian { version } => write!(
                f,
                "GGUF version field reads {version:#010x}: the file was written big-endian, which lagoon does not read; convert it with gguf-convert-endian"
            ),
            UnsupportedVersion { version } => write!(
                f,
                "GGUF version {version} is not supported (lagoon reads versions 2 and 3); re-convert the model with a current llama.cpp"
            ),
            ClaimExceedsFile {
                claim,
                context,
                offset,
                claimed,
                max_possible,
            } => write!(
                f,
                "{context}: byte {offset} claims {claimed} {}, but the rest of the file can hold at most {max_possible}; {CORRUPT}",
                claim.unit()
            ),
            UnknownValueType { key, offset, got } => write!(
                f,
                "metadata key `{key}` has value type id {got} at byte {offset}; GGUF defines ids 0..=12, so {CORRUPT}"
            ),
            InvalidBool { key, offset, got } => write!(
                f,
                "metadata key `{key}` has bool byte {got} at byte {offset}; only 0 and 1 are valid, so {CORRUPT}"
            ),
            InvalidUtf8 { what, offset } => {
                write!(f, "the {what} at byte {offset} is not UTF-8; {CORRUPT}")
            }
            ArrayTooDeep {
                key,
                offset,
                max_depth,
            } => write!(
                f,
                "metadata key `{key}` nests arrays more than {max_depth} deep at byte {offset}; no model needs that, so {CORRUPT}"
            ),
            EmptyKey { offset } => write!(f, "metadata key at byte {offset} is empty; {CORRUPT}"),
            DuplicateKey { key, offset } => write!(
                f,
                "metadata key `{key}` appears twice (second at byte {offset}); the writer was broken, re-convert the model"
            ),
            AlignmentNotU32 { got } => write!(
                f,
                "`general.alignment` is stored as {got}, but GGUF requires u32; fix it with gguf-set-metadata or re-convert"
            ),
            BadAlignment { got } => write!(
                f,
                "`general.alignment` is {got}, which is not a non-zero power of two; {CORRUPT}"
            ),
            NameTooLong { name, offset, len } => write!(
                f,
                "tensor name `{name}` at byte {offset} is {len} bytes; ggml allows at most 63, so rename the tensor when converting"
            ),
            DuplicateTensor { name, offset } => write!(
                f,
                "tensor `{name}` appears twice (second record at byte {offset}); the writer was broken, re-convert the model"
            ),
            TooManyDims {
                tensor,
                offset,
                n_dims,
            } => write!(
                f,
                "tensor `{tensor}` (record at byte {offset}) has {n_dims} dimensions; ggml allows at most 4, so {CORRUPT}"
            ),
            UnknownTensorType {
                tensor,
                offset,
                got,
            } => write!(
                f,
                "tensor `{tensor}` (record at byte {offset}) has ggml type id {got}, which is removed, unknown, or newer than lagoon; re-quantise with a supported type"
            ),
            RaggedRow {
                tensor,
                ty,
                ne0,
                block,
            } => write!(
                f,
                "tensor `{tensor}` has rows of {ne0} elements, not a multiple of the {block}-element {ty} block; {CORRUPT}"
            ),
            DimsOverflow { tensor, ne } => write!(
                f,
                "tensor `{tensor}` has dims {ne:?}, whose element count or byte size overflows; {CORRUPT}"
            ),
            MisalignedTensor {
                tensor,
                offset,
                alignment,
            } => write!(
                f,
                "tensor `{tensor}` starts at data offset {offset}, not a multiple of the file's alignment {alignment}; {CORRUPT}"
            ),
            TensorOutOfFile {
                tensor,
                start,
                end,
                file_len,
            } => write!(
                f,
                "tensor `{tensor}` occupies bytes {start}..{end} but the file has {file_len} bytes; {CORRUPT}"
            ),
            TensorsOverlap {
                first,
                second,
                first_end,
                second_start,
            } => write!(
                f,
                "tensor `{second}` starts at byte {second_start}, inside `{first}` (which ends at {first_end}); {CORRUPT}"
            ),
            MissingShard { path, shard, count } => write!(
                f,
                "shard {} of {count} is missing: {} does not exist; download every shard into the same directory",
                shard + 1,
                path.display()
            ),
            SplitName { path, count } => write!(
                f,
                "{} is one of {count} shards, but its name does not follow <prefix>-00001-of-{count:05}.gguf, so the other shards cannot be found; restore the original file names",
                path.display()
            ),
            SplitMismatch {
                path,
                key,
                expected,
                got,
            } => match got {
                Some(g) => write!(
                    f,
                    "{}: `{key}` is {g}, expected {expected}; the shards come from different splits, download them again",
                    path.display()
                ),
                None => write!(
                    f,
                    "{}: `{key}` is missing, expected {expected}; the shards come from different splits, download them again",
                    path.display()
                ),
            },
            DataSizeMismatch {
                tensor,
                expected,
                got,
            } => write!(
                f,
                "tensor `{tensor}`: {got} bytes given, but its type and dims need {expected}"
            ),
            WrongArchitecture { got } => write!(
                f,
                "`general.architecture` is `{got}`, but lagoon runs only `laguna` models"
            ),
            MissingKey { key } => write!(
                f,
                "metadata key `{key}` is missing; the file was not converted for the laguna architecture or the converter is too old"
            ),
            WrongKeyType { key, expected, got } => write!(
                f,
                "metadata key `{key}` holds {got}, expected {expected}; re-convert the model"
            ),
            BadKeyValue { key, detail } => write!(f, "metadata key `{key}`: {detail}"),
            InFile { path, source } => write!(f, "{}: {source}", path.display()),
        }
    }
}

impl std::error::Error for GgufError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GgufError::InFile { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}
