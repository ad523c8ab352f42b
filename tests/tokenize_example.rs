//! What `examples/tokenize.rs` does, through the same library calls, on the committed
//! fixture tokenizer, against ids and renders recorded from HF `tokenizers` and
//! transformers by `tools/reference/check_tokenize.py --record`.

use std::path::PathBuf;

use lagoon::generate::prompt::{ChatRequest, PromptError, TextModel, encode_rendered};
use serde_json::Value;

fn fix() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenize")
}

fn expected() -> Value {
    serde_json::from_slice(&std::fs::read(fix().join("expected.json")).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn text_files_match_hf_from_hf_dir_and_gguf() {
    let hf = TextModel::open(fix().join("hf")).unwrap();
    let gguf_path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/tokenizer.gguf");
    let gguf = TextModel::open(&gguf_path).unwrap();
    let exp = expected();
    let texts = exp["texts"].as_array().unwrap();
    assert!(texts.len() >= 5);
    for t in texts {
        let name = t["file"].as_str().unwrap();
        let bytes = std::fs::read(fix().join("texts").join(name)).unwrap();
        let want = ids(&t["ids"]);
        assert_eq!(hf.tokenizer.encode(&bytes, false), want, "{name} (HF dir)");
        assert_eq!(gguf.tokenizer.encode(&bytes, false), want, "{name} (GGUF)");
    }
}

#[test]
fn chats_match_apply_chat_template() {
    let m = TextModel::open(fix().join("hf")).unwrap();
    let template = m.template.as_ref().unwrap();
    let exp = expected();
    let chats = exp["chats"].as_array().unwrap();
    assert!(chats.len() >= 4);
    for c in chats {
        let name = c["file"].as_str().unwrap();
        let bytes = std::fs::read(fix().join("chats").join(name)).unwrap();
        let req = ChatRequest::from_json(&bytes, name).unwrap();
        let text = req.render(template).unwrap();
        assert_eq!(text, c["rendered"].as_str().unwrap(), "{name} render");
        assert_eq!(
            encode_rendered(&m.tokenizer, &text),
            ids(&c["ids"]),
            "{name} ids"
        );
        // Exactly one BOS (id 2), from the template's literal.
        let got = encode_rendered(&m.tokenizer, &text);
        assert_eq!(got.iter().filter(|&&t| t == 2).count(), 1, "{name}");
    }
}

#[test]
fn clear_errors() {
    let e = TextModel::open(fix().join("does-not-exist")).unwrap_err();
    assert!(matches!(e, PromptError::Io { .. }), "{e}");
    let e = TextModel::open(fix().join("texts/plain.txt")).unwrap_err();
    assert!(matches!(e, PromptError::NotAModel { .. }), "{e}");
    // A directory without tokenizer.json.
    let e = TextModel::open(fix().join("chats")).unwrap_err();
    assert!(matches!(e, PromptError::Tokenizer { .. }), "{e}");
    assert!(e.to_string().contains("tokenizer.json"), "{e}");
    // A GGUF without a chat template loads; only chat use fails.
    let gguf =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/tokenizer.gguf");
    assert!(TextModel::open(gguf).unwrap().template.is_err());

    for (bad, what) in [
        (&b"{bad"[..], "not valid JSON"),
        (b"[]", "not an object"),
        (b"{}", "`messages` is missing"),
        (b"{\"messages\": 3}", "`messages` is not a list"),
        (
            b"{\"messages\": [], \"tools\": {}}",
            "`tools` is not a list",
        ),
        (
            b"{\"messages\": [], \"enable_thinking\": \"yes\"}",
            "`enable_thinking`",
        ),
    ] {
        let e = ChatRequest::from_json(bad, "req.json").unwrap_err();
        assert!(matches!(e, PromptError::Request { .. }), "{e}");
        assert!(e.to_string().contains(what), "{e}");
    }
    // Defaults: no add_generation_prompt = false, no enable_thinking = not passed.
    let r = ChatRequest::from_json(b"{\"messages\": []}", "r").unwrap();
    assert_eq!(
        (r.add_generation_prompt, r.enable_thinking, r.tools),
        (false, None, None)
    );
}
