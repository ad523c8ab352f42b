//! GGUF v3 reader and writer (spec/formats.md §1) and the Laguna GGUF loader
//! (spec/laguna.md §8).
//!
//! - [`reader`]: [`GgufFile::parse`] validates a whole file held in memory or mapped;
//!   tensor bytes are located, never copied.
//! - [`split`]: [`GgufSet::open`] maps one file or every shard of a split set.
//! - [`value`]: the metadata [`Value`] / [`Array`] types.
//! - [`writer`]: [`GgufWriter`], for tests and synthetic models.
//! - [`laguna_meta`]: `laguna.*` keys → [`ModelConfig`].
//!
//! [`load_checkpoint`] puts these together for [`Checkpoint::open`](crate::Checkpoint::open).

pub mod error;
pub mod laguna_meta;
pub mod reader;
pub mod split;
pub mod value;
pub mod writer;

use std::path::Path;

use lagoon_core::config::ModelConfig;
use memmap2::Mmap;

use crate::checkpoint::{PartRecord, Source, Span, TensorRecord};
use crate::error::Error;

pub use error::{Claim, GgufError};
pub use laguna_meta::laguna_config;
pub use reader::{GgufFile, TensorInfo};
pub use split::GgufSet;
pub use value::{Array, Value, ValueType};
pub use writer::{GgufWriter, KvLayout, Layout, TensorLayout};

/// Opens a GGUF file (any shard of a split set opens the whole set) as checkpoint parts:
/// the Laguna config from shard 0's metadata, the raw metadata for `inspect`, one map per
/// shard, and one record per tensor whose spans point into the shard that holds it.
pub fn load_checkpoint(
    path: &Path,
) -> Result<(ModelConfig, Source, Vec<Mmap>, Vec<TensorRecord>), Error> {
    let set = GgufSet::open(path)?;
    let config =
        laguna_config(set.metadata()).map_err(|e| Error::Gguf(e.in_file(&set.paths[0])))?;
    let records = tensor_records(&set);
    let GgufSet { paths, maps, files } = set;
    let metadata = files
        .into_iter()
        .next()
        .map(|f| f.metadata)
        .unwrap_or_default();
    Ok((
        config,
        Source::Gguf {
            files: paths,
            metadata,
        },
        maps,
        records,
    ))
}

/// One [`TensorRecord`] per tensor of the set, shard by shard in file order.
pub fn tensor_records(set: &GgufSet) -> Vec<TensorRecord> {
    set.tensors()
        .map(|(shard, t)| tensor_record(shard, &set.files[shard], t))
        .collect()
}

/// Maps a tensor-info record to a [`TensorRecord`]: the name unchanged (GGUF names are
/// the normalised ones), `shape` = `ne` reversed, each 2-D part `ne[1]` rows × `ne[0]`
/// columns (a 1-D tensor is one row), and one part per matrix of a 3-D/4-D tensor
/// (expert `e` of `ffn_*_exps` at byte `e·nb[2]`). A zero-byte tensor has no parts.
pub fn tensor_record(shard: usize, file: &GgufFile, t: &TensorInfo) -> TensorRecord {
    let ne = t.ne4();
    let nb = t.nb();
    let start = file.tensor_range(t).start;
    // Parsing bounded every dim, the zero-free element count and the byte range, so the
    // casts below are lossless and `n_parts` is at most `n_bytes / nb[2]`.
    let n_parts = if t.n_bytes == 0 { 0 } else { ne[2] * ne[3] };
    let parts = (0..n_parts)
        .map(|p| PartRecord::Ggml {
            ty: t.ty,
            span: Span {
                file: shard as u32,
                start: start + (p * nb[2]) as usize,
                len: nb[2] as usize,
            },
        })
        .collect();
    TensorRecord {
        name: t.name.clone(),
        source_name: t.name.clone(),
        shape: t.shape(),
        rows: ne[1] as usize,
        cols: ne[0] as usize,
        parts,
    }
}
