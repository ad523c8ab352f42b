//! Encode throughput on ≥100k tokens of real text (the repository's own sources) and on
//! cache-unfriendly random words, single thread (issue #3's speed requirement):
//!
//!   cargo run --release --example tokenize_speed
//!
//! It also checks the round trip of what it encodes.

use std::path::{Path, PathBuf};
use std::time::Instant;

use lagoon::tokenizer::Tokenizer;

fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_dir() && !name.starts_with('.') && name != "target" && name != "fixtures" {
            rust_sources(&p, out);
        } else if name.ends_with(".rs") || name.ends_with(".py") || name.ends_with(".md") {
            out.push(p);
        }
    }
}

fn encode_100k_tokens() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let tok = Tokenizer::from_hf_dir(root.join("tests/fixtures/tokenizer")).unwrap();
    let mut files = Vec::new();
    rust_sources(&root, &mut files);
    let mut text = Vec::new();
    for f in &files {
        text.extend(std::fs::read(f).unwrap());
        if text.len() >= 450_000 {
            break;
        }
    }
    let mut best = f64::INFINITY;
    let mut ids = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        ids = tok.encode(&text, false);
        best = best.min(t.elapsed().as_secs_f64());
    }
    assert!(
        ids.len() >= 100_000,
        "corpus too small: {} tokens",
        ids.len()
    );
    assert_eq!(tok.decode(&ids), text);
    println!(
        "encode: {} bytes -> {} tokens in {:.1} ms (best of 5): {:.2} M tokens/s, {:.1} MB/s",
        text.len(),
        ids.len(),
        best * 1e3,
        ids.len() as f64 / best / 1e6,
        text.len() as f64 / best / 1e6
    );
}

/// Cache-unfriendly input: pseudo-random words (almost every piece is new), so every
/// piece goes through the merge queue.
fn encode_random_words() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let tok = Tokenizer::from_hf_dir(root.join("tests/fixtures/tokenizer")).unwrap();
    let alphabet: Vec<char> = "etaoinshrdlucmfwypvbgkqjxzETAONдежзий日本語中文한국"
        .chars()
        .collect();
    let seps = [" ", " ", " ", "\n", ", ", ". ", "  ", "\t", "_", "("];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let mut text = String::new();
    while text.len() < 400_000 {
        for _ in 0..1 + next(12) {
            text.push(alphabet[next(alphabet.len())]);
        }
        text.push_str(seps[next(seps.len())]);
    }
    let mut best = f64::INFINITY;
    let mut ids = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        ids = tok.encode(text.as_bytes(), false);
        best = best.min(t.elapsed().as_secs_f64());
    }
    assert!(ids.len() >= 100_000, "text too small: {} tokens", ids.len());
    assert_eq!(tok.decode(&ids), text.as_bytes());
    println!(
        "encode (random words): {} bytes -> {} tokens in {:.1} ms (best of 5): {:.2} M tokens/s",
        text.len(),
        ids.len(),
        best * 1e3,
        ids.len() as f64 / best / 1e6
    );
}

fn main() {
    encode_100k_tokens();
    encode_random_words();
}
