//! Opening a GGUF file, or a whole split set, as memory maps (spec/formats.md §1.8).
//!
//! A split set is `<prefix>-00001-of-0000N.gguf` … `<prefix>-0000N-of-0000N.gguf`; each
//! shard is a complete GGUF file with its own tensors (offsets local to the shard) and
//! `split.no` / `split.count` / `split.tensors.count` keys; the model metadata lives in
//! shard 0. Any shard's path opens the whole set.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::error::GgufError;
use super::reader::{GgufFile, TensorInfo};
use super::value::Value;
use crate::error::Error;

pub const SPLIT_NO: &str = "split.no";
pub const SPLIT_COUNT: &str = "split.count";
pub const SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// One GGUF file or a split set, mapped and parsed.
#[derive(Debug)]
pub struct GgufSet {
    /// Shard paths, shard 0 first (one entry for an unsplit file).
    pub paths: Vec<PathBuf>,
    pub maps: Vec<Mmap>,
    pub files: Vec<GgufFile>,
}

/// Splits `dir/name-00002-of-00003.gguf` into (`dir/name`, 2, 3). Shard numbers are
/// 1-based in names.
pub fn parse_shard_name(path: &Path) -> Option<(PathBuf, u32, u32)> {
    let file = path.file_name()?.to_str()?;
    let stem = file.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() >= 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(count) || prefix.is_empty() {
        return None;
    }
    let (no, count): (u32, u32) = (no.parse().ok()?, count.parse().ok()?);
    if no == 0 || no > count {
        return None;
    }
    Some((path.with_file_name(prefix), no, count))
}

/// The path of shard `no` (1-based) of `count` for a prefix from [`parse_shard_name`].
pub fn shard_path(prefix: &Path, no: u32, count: u32) -> PathBuf {
    let name = prefix
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    prefix.with_file_name(format!("{name}-{no:05}-of-{count:05}.gguf"))
}

/// Maps a file read-only.
fn map(path: &Path) -> Result<Mmap, Error> {
    let file = File::open(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })?;
    // SAFETY: the map is read-only. The one precondition memmap2 cannot check, that no
    // other process truncates or rewrites the file while it is mapped, is the usual
    // contract of mapped model files (llama.cpp assumes the same); every byte range is
    // validated against the length seen at map time.
    unsafe { Mmap::map(&file) }.map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })
}

fn open_one(path: &Path) -> Result<(Mmap, GgufFile), Error> {
    let m = map(path)?;
    let f = GgufFile::parse(&m).map_err(|e| e.in_file(path))?;
    Ok((m, f))
}

/// A split key as an integer (gguf-split writes u16/u16/i32; accept any width).
fn split_key(f: &GgufFile, key: &str) -> Option<u64> {
    f.get(key).and_then(Value::as_u64)
}

impl GgufSet {
    /// Opens `path`; if its `split.count` is above 1, opens every shard of its set.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufSet, Error> {
        let path = path.as_ref();
        let (m, f) = open_one(path)?;
        let count = split_key(&f, SPLIT_COUNT).unwrap_or(1);
        if count <= 1 {
            return Ok(GgufSet {
                paths: vec![path.to_owned()],
                maps: vec![m],
                files: vec![f],
            });
        }
        let bad_name = || {
            Error::Gguf(GgufError::SplitName {
                path: path.to_owned(),
                count: u32::try_from(count).unwrap_or(u32::MAX),
            })
        };
        let (prefix, no, name_count) = parse_shard_name(path).ok_or_else(bad_name)?;
        if u64::from(name_count) != count {
            return Err(bad_name());
        }
        let mut given = Some((m, f));
        let mut set = GgufSet {
            paths: Vec::new(),
            maps: Vec::new(),
            files: Vec::new(),
        };
        for i in 0..name_count {
            let p = shard_path(&prefix, i + 1, name_count);
            let (m, f) = if i + 1 == no {
                // `given` is taken exactly once, at its own index.
                given.take().ok_or_else(bad_name)?
            } else {
                match open_one(&p) {
                    Err(Error::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        return Err(Error::Gguf(GgufError::MissingShard {
                            path: p,
                            shard: i,
                            count: name_count,
                        }));
                    }
                    r => r?,
                }
            };
            for (key, expected) in [(SPLIT_NO, u64::from(i)), (SPLIT_COUNT, count)] {
                let got = split_key(&f, key);
                if got != Some(expected) {
                    return Err(Error::Gguf(GgufError::SplitMismatch {
                        path: p,
                        key,
                        expected,
                        got,
                    }));
                }
            }
            set.paths.push(p);
            set.maps.push(m);
            set.files.push(f);
        }
        set.check_tensors()?;
        Ok(set)
    }

    /// Tensor names unique across shards; the total matches `split.tensors.count`.
    fn check_tensors(&self) -> Result<(), Error> {
        let mut seen = std::collections::HashSet::new();
        for (i, f) in self.files.iter().enumerate() {
            for t in &f.tensors {
                if !seen.insert(t.name.as_str()) {
                    return Err(Error::Gguf(
                        GgufError::DuplicateTensor {
                            name: t.name.clone(),
                            offset: t.record_offset,
                        }
                        .in_file(&self.paths[i]),
                    ));
                }
            }
        }
        if let Some(expected) = split_key(&self.files[0], SPLIT_TENSORS_COUNT) {
            let got = seen.len() as u64;
            if got != expected {
                return Err(Error::Gguf(GgufError::SplitMismatch {
                    path: self.paths[0].clone(),
                    key: SPLIT_TENSORS_COUNT,
                    expected,
                    got: Some(got),
                }));
            }
        }
        Ok(())
    }

    /// The model metadata (shard 0's key/value records).
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.files[0].metadata
    }

    /// A metadata value of shard 0 by key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.files[0].get(key)
    }

    /// Every tensor with its shard index, shard by shard in file order.
    pub fn tensors(&self) -> impl Iterator<Item = (usize, &TensorInfo)> {
        self.files
            .iter()
            .enumerate()
            .flat_map(|(i, f)| f.tensors.iter().map(move |t| (i, t)))
    }

    /// A tensor by name, with its shard index.
    pub fn tensor(&self, name: &str) -> Option<(usize, &TensorInfo)> {
        self.tensors().find(|(_, t)| t.name == name)
    }

    /// The bytes of a tensor of shard `shard`, borrowed from the map.
    pub fn tensor_data(&self, shard: usize, t: &TensorInfo) -> &[u8] {
        // Parsing checked the range against this map's length.
        &self.maps[shard][self.files[shard].tensor_range(t)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names() {
        let p = Path::new("/m/Laguna-S-BF16-00002-of-00005.gguf");
        let (prefix, no, count) = parse_shard_name(p).unwrap();
        assert_eq!(
            (prefix.as_path(), no, count),
            (Path::new("/m/Laguna-S-BF16"), 2, 5)
        );
        assert_eq!(
            shard_path(&prefix, 1, 5),
            Path::new("/m/Laguna-S-BF16-00001-of-00005.gguf")
        );
        assert_eq!(parse_shard_name(Path::new("/m/model.gguf")), None);
        assert_eq!(
            parse_shard_name(Path::new("/m/x-00006-of-00005.gguf")),
            None
        );
        assert_eq!(parse_shard_name(Path::new("/m/x-0001-of-00005.gguf")), None);
        assert_eq!(parse_shard_name(Path::new("/m/-00001-of-00005.gguf")), None);
    }
}
