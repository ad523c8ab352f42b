//! A minimal `--flag value` parser shared by the examples (keeps them free of a CLI crate).
#![allow(dead_code)] // each example uses a subset of these helpers

use std::collections::HashMap;

pub struct Args {
    values: HashMap<String, String>,
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
                values.insert(name.to_string(), v);
            }
        }
        Ok(Args { values, flags })
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(|s| s.as_str())
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

    /// Comma-separated token ids.
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
