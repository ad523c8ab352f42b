//! Tokenizes a file's exact bytes, or renders and tokenizes a chat request.
//!
//! `tokenize --model PATH --text-file F`
//!   prints the ids of F's bytes (no special tokens added), comma-separated, on one line.
//! `tokenize --model PATH --chat F.json`
//!   reads `{"messages": [...], "tools": [...], "enable_thinking": bool,
//!   "add_generation_prompt": bool}` (absent `add_generation_prompt` = false, as in
//!   transformers), writes the rendered prompt's exact bytes to stdout and its ids
//!   (comma-separated) to stderr.
//!
//! PATH is a GGUF file (only its metadata is read), a HF directory with `tokenizer.json`, or
//! a bare `tokenizer.json` (text only). `tools/reference/check_tokenize.py` compares the
//! output with HF `tokenizers` and transformers' `apply_chat_template`.

#[path = "common/args.rs"]
mod args;

use std::io::Write;

use anyhow::Context;
use lagoon::generate::prompt::{ChatRequest, TextModel, encode_rendered};

fn join(ids: &[u32]) -> String {
    let s: Vec<String> = ids.iter().map(|t| t.to_string()).collect();
    s.join(",")
}

fn main() -> anyhow::Result<()> {
    let a = args::Args::parse(include_str!("tokenize.rs"), &[])?;
    let model = a
        .get("model")
        .context("--model PATH is required (a .gguf file or a HF directory with tokenizer.json)")?;
    let m = TextModel::open(model)?;
    match (a.get("text-file"), a.get("chat")) {
        (Some(f), None) => {
            let bytes = std::fs::read(f).with_context(|| format!("reading --text-file {f}"))?;
            println!("{}", join(&m.tokenizer.encode(&bytes, false)));
        }
        (None, Some(f)) => {
            let bytes = std::fs::read(f).with_context(|| format!("reading --chat {f}"))?;
            let req = ChatRequest::from_json(&bytes, f)?;
            let template = m
                .template
                .as_ref()
                .map_err(|e| anyhow::anyhow!("{model}: {e}"))?;
            let text = req.render(template)?;
            let ids = encode_rendered(&m.tokenizer, &text);
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())?;
            out.flush()?;
            eprintln!("{}", join(&ids));
        }
        _ => anyhow::bail!("give exactly one of --text-file F or --chat F.json"),
    }
    Ok(())
}
