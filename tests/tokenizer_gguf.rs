//! The tokenizer loaded from GGUF metadata written by llama.cpp's converter agrees with
//! HF `tokenizers` and with the same tokenizer loaded from tokenizer.json.

use std::path::PathBuf;

use lagoon::gguf::gguf::GgufFile;
use lagoon::tokenizer::{PreTokenizer, TokenKind, Tokenizer};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn gguf_tokenizer(path: &std::path::Path) -> Tokenizer {
    let bytes = std::fs::read(path).unwrap();
    let file = GgufFile::parse(&bytes).unwrap();
    Tokenizer::from_gguf_metadata(&file.metadata).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn converter_gguf_matches_hf_ids() {
    let dir = root().join("tests/fixtures/tokenizer");
    let tok = gguf_tokenizer(&dir.join("tokenizer.gguf"));
    assert_eq!(tok.pre_tokenizer(), PreTokenizer::Laguna);
    let sp = tok.special_ids();
    assert_eq!(
        (sp.bos, sp.eos, sp.eot, sp.pad, sp.unk),
        (Some(2), Some(2), Some(24), Some(9), Some(0))
    );
    // The converter promotes </assistant> to CONTROL.
    assert_eq!(tok.kind(24), TokenKind::Control);
    assert!(tok.is_end_of_generation(24) && tok.is_end_of_generation(2));

    let cases: Value =
        serde_json::from_slice(&std::fs::read(dir.join("cases.json")).unwrap()).unwrap();
    for c in cases["cases"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let text = c["text"].as_str().unwrap();
        assert_eq!(
            tok.encode(text.as_bytes(), false),
            ids(&c["ids"]),
            "case {name}"
        );
        assert_eq!(
            tok.encode(text.as_bytes(), true),
            ids(&c["ids_with_special"]),
            "case {name} (add_special)"
        );
        assert_eq!(
            tok.decode(&ids(&c["ids"])),
            text.as_bytes(),
            "case {name} decode"
        );
    }
    let hf = Tokenizer::from_hf_dir(&dir).unwrap();
    assert_eq!(hf.vocab_size(), tok.vocab_size());
    for id in 0..tok.vocab_size() as u32 {
        assert_eq!(hf.id_to_token(id), tok.id_to_token(id), "id {id}");
        assert_eq!(hf.token_bytes(id), tok.token_bytes(id), "id {id}");
    }
}

/// The model fixture's GGUF (converted from its hf-f32 directory with a different,
/// 512-token vocabulary) tokenizes like that directory's tokenizer.json, opened through
/// the checkpoint API.
#[test]
fn model_fixture_gguf_and_hf_dir_agree() {
    let case = root().join("tests/fixtures/models/hybrid_perhead");
    let from_gguf = lagoon::Checkpoint::open(case.join("model-q8_0.gguf")).unwrap();
    let gguf_tok = Tokenizer::from_checkpoint(&from_gguf).unwrap();
    let hf_tok = Tokenizer::from_hf_dir(case.join("hf-f32")).unwrap();
    assert_eq!(gguf_tok.vocab_size(), 512);
    let cases: Value = serde_json::from_slice(
        &std::fs::read(root().join("tests/fixtures/tokenizer/cases.json")).unwrap(),
    )
    .unwrap();
    let mut n_tokens = 0;
    for c in cases["cases"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap().as_bytes();
        let a = gguf_tok.encode(text, true);
        assert_eq!(a, hf_tok.encode(text, true), "case {}", c["name"]);
        assert_eq!(gguf_tok.decode(&a[1..]), text);
        n_tokens += a.len();
    }
    assert!(n_tokens > 10_000);
}
