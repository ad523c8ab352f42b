//! A minimal `--flag value` parser shared by the examples (keeps them free of a CLI crate).
#![allow(dead_code)] // each example uses a subset of these helpers

use std::collections::HashMap;

pub struct Args {
    /// Every value given for an option, in order (`get` takes the last).
    values: HashMap<String, Vec<String>>,
    flags: Vec<String>,
}

impl Args {
    /// Parses `std::env::args`. `switches` are the flags that take no value. `source` is the
    /// example's own source (`include_str!`): `--help` / `-h` prints its `//!` header and exits.
    pub fn parse(source: &str, switches: &[&str]) -> anyhow::Result<Args> {
        let mut values = HashMap::new();
        let mut flags = Vec::new();
        let mut it = std::env::args().skip(1);
        while let Some(a) = it.next() {
            if a == "--help" || a == "-h" {
                for line in source.lines().take_while(|l| l.starts_with("//!")) {
                    println!(
                        "{}",
                        line.trim_start_matches("//!")
                            .strip_prefix(' ')
                            .unwrap_or("")
                    );
                }
                std::process::exit(0);
            }
            let Some(name) = a.strip_prefix("--").or_else(|| a.strip_prefix('-')) else {
                anyhow::bail!("unexpected argument `{a}`; options look like `--name value`");
            };
            if switches.contains(&name) {
                flags.push(name.to_string());
            } else {
                let v = it
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("`--{name}` needs a value"))?;
                values
                    .entry(name.to_string())
                    .or_insert_with(Vec::new)
                    .push(v);
            }
        }
        Ok(Args { values, flags })
    }

    /// The option's value (the last one when given several times).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values
            .get(name)
            .and_then(|v| v.last())
            .map(|s| s.as_str())
    }

    /// Every value of a repeatable option, in order.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.values
            .get(name)
            .map(|v| v.iter().map(|s| s.as_str()).collect())
            .unwrap_or_default()
    }

    /// The value of the first of `names` that was given (for aliases such as `-n` /
    /// `--max-tokens`).
    pub fn get_any<'a>(&self, names: &[&'a str]) -> Option<(&'a str, &str)> {
        names.iter().find_map(|&n| self.get(n).map(|v| (n, v)))
    }

    pub fn flag(&self, name: &str) -> bool {
        self.flags.iter().any(|f| f == name)
    }

    /// A parsed value, or `default` when absent.
    pub fn num<T: std::str::FromStr>(&self, name: &str, default: T) -> anyhow::Result<T> {
        match self.get(name) {
            None => Ok(default),
            Some(s) => s
                .parse()
                .map_err(|_| anyhow::anyhow!("`--{name} {s}` is not a valid number")),
        }
    }

    /// `--kv f32|f16|bf16|q8_0`: a CUDA session's KV cache type (llama.cpp's `-ctk` / `-ctv`).
    /// The default is f16 on CUDA where `cuda_f16` (bench, generate: llama.cpp's default, half
    /// the cache memory, prefill attention on cp.async-pipelined tiles) and f32 otherwise
    /// (logits, the checking tool, and the CPU). A 16-bit type is an error on the CPU
    /// (`device` `None`), whose cache is f32 only.
    #[allow(dead_code)] // not every example that includes this file takes --kv
    pub fn kv(
        &self,
        device: Option<usize>,
        cuda_f16: bool,
    ) -> anyhow::Result<lagoon::cuda_backend::KvCache> {
        use lagoon::cuda_backend::KvCache;
        let default = if device.is_some() && cuda_f16 {
            "f16"
        } else {
            "f32"
        };
        let name = self.get("kv").unwrap_or(default);
        let kv = KvCache::parse(name).ok_or_else(|| {
            anyhow::anyhow!("--kv `{name}`: the KV cache types are f32, f16, bf16 and q8_0")
        })?;
        anyhow::ensure!(
            kv == KvCache::F32 || device.is_some(),
            "--kv {name} is a CUDA option (the CPU backend keeps its KV cache in f32)"
        );
        Ok(kv)
    }

    /// `--device`: `cpu` (the default) → `None`, `cuda` / `cuda:N` → `Some(N)`.
    pub fn device(&self) -> anyhow::Result<Option<usize>> {
        match self.get("device").unwrap_or("cpu") {
            "cpu" => Ok(None),
            "cuda" => Ok(Some(0)),
            d => d
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Some)
                .ok_or_else(|| anyhow::anyhow!("--device `{d}`: use cpu, cuda or cuda:N")),
        }
    }

    pub fn tokens(&self, name: &str) -> anyhow::Result<Option<Vec<u32>>> {
        let Some(s) = self.get(name) else {
            return Ok(None);
        };
        let ids = s
            .split(',')
            .map(|t| t.trim())
            .filter(|t| !t.is_empty())
            .map(|t| {
                t.parse::<u32>()
                    .map_err(|_| anyhow::anyhow!("`{t}` in --{name} is not a token id"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        anyhow::ensure!(!ids.is_empty(), "--{name} holds no token ids");
        Ok(Some(ids))
    }
}
