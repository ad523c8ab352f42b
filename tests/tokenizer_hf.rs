//! Token ids against HF `tokenizers` (recorded by tools/reference/tokenizer_fixtures.py in
//! tests/fixtures/tokenizer/cases.json): code, prose, CJK, emoji, digits, whitespace runs,
//! CRLF / lone CR, special-token strings, 400 random strings, invalid UTF-8 bytes; plus
//! decode round trips and the streaming decoder.

use std::path::PathBuf;

use lagoon::tokenizer::{PreTokenizer, StreamDecoder, TokenKind, Tokenizer};
use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer")
}

fn cases() -> Value {
    serde_json::from_slice(&std::fs::read(dir().join("cases.json")).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Asserts the text cases of `list` against `tok`: ids with and without specials, HF's
/// decoded text, and (when `round_trip`) decode(encode(text)) == text.
fn check_text_cases(tok: &Tokenizer, list: &Value, round_trip: bool) -> usize {
    let mut n = 0;
    for c in list.as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let text = c["text"].as_str().unwrap();
        let got = tok.encode(text.as_bytes(), false);
        assert_eq!(got, ids(&c["ids"]), "case {name}: {text:?}");
        assert_eq!(
            tok.encode(text.as_bytes(), true),
            ids(&c["ids_with_special"]),
            "case {name} (add_special)"
        );
        let decoded = tok.decode(&got);
        assert_eq!(
            String::from_utf8_lossy(&decoded),
            c["decoded"].as_str().unwrap(),
            "case {name} decode"
        );
        if round_trip {
            assert_eq!(decoded, text.as_bytes(), "case {name} round trip");
        }
        n += 1;
    }
    n
}

#[test]
fn ids_match_hf_on_text() {
    let tok = Tokenizer::from_hf_dir(dir()).unwrap();
    assert_eq!(tok.pre_tokenizer(), PreTokenizer::Laguna);
    let n = check_text_cases(&tok, &cases()["cases"], true);
    assert!(n > 400, "only {n} cases");
}

/// The pre-tokenizer alone against HF's `pre_tokenize_str` (piece boundaries that the
/// ids cannot show when no merge crosses them).
#[test]
fn pieces_match_hf_pre_tokenizer() {
    let mut n = 0;
    for c in cases()["cases"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        let ends: Vec<usize> = PreTokenizer::Laguna
            .pieces(text.as_bytes())
            .into_iter()
            .map(|r| r.end)
            .collect();
        let want: Vec<usize> = ids(&c["piece_ends"])
            .into_iter()
            .map(|e| e as usize)
            .collect();
        assert_eq!(ends, want, "case {}: {text:?}", c["name"]);
        n += ends.len();
    }
    assert!(n > 5000, "only {n} pieces");
}

#[test]
fn tokenizer_json_alone_and_hf_dir_agree() {
    let bytes = std::fs::read(dir().join("tokenizer.json")).unwrap();
    let alone = Tokenizer::from_tokenizer_json(&bytes).unwrap();
    check_text_cases(&alone, &cases()["cases"], true);
    let d = Tokenizer::from_hf_dir(dir()).unwrap();
    let sp = d.special_ids();
    assert_eq!(
        (sp.bos, sp.eos, sp.pad, sp.unk),
        (Some(2), Some(2), Some(9), Some(0))
    );
    assert_eq!(alone.bos(), Some(2));
    assert_eq!(d.special_prefix(), [2]);
    assert!(d.special_suffix().is_empty());
}

#[test]
fn legacy_string_merges_load_identically() {
    let mut j: Value =
        serde_json::from_slice(&std::fs::read(dir().join("tokenizer.json")).unwrap()).unwrap();
    let merges = j["model"]["merges"].as_array_mut().unwrap();
    assert!(merges[0].is_array(), "fixture should use the pair form");
    for m in merges.iter_mut() {
        *m = Value::String(format!(
            "{} {}",
            m[0].as_str().unwrap(),
            m[1].as_str().unwrap()
        ));
    }
    let tok = Tokenizer::from_tokenizer_json(j.to_string().as_bytes()).unwrap();
    check_text_cases(&tok, &cases()["cases"], true);
}

#[test]
fn ids_match_hf_components_on_invalid_utf8() {
    let tok = Tokenizer::from_hf_dir(dir()).unwrap();
    let all = cases();
    for c in all["byte_cases"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let bytes = hex(c["bytes_hex"].as_str().unwrap());
        let got = tok.encode(&bytes, false);
        assert_eq!(got, ids(&c["ids"]), "byte case {name}");
        assert_eq!(tok.decode(&got), bytes, "byte case {name}: round trip");
        // What HF sees after lossy decoding is ordinary text.
        let lossy = c["lossy_text"].as_str().unwrap();
        assert_eq!(
            tok.encode(lossy.as_bytes(), false),
            ids(&c["lossy_ids"]),
            "byte case {name} (lossy)"
        );
    }
}

#[test]
fn added_token_flags_and_ignore_merges_match_hf() {
    let bytes = std::fs::read(dir().join("variant.json")).unwrap();
    let tok = Tokenizer::from_tokenizer_json(&bytes).unwrap();
    // `ĠĠ` is an added token whose content is not what it decodes to, so no round trip.
    check_text_cases(&tok, &cases()["variant_cases"], false);
    let mask = tok.token_to_id("<mask>").unwrap();
    assert_eq!(tok.kind(mask), TokenKind::Control);
    assert_eq!(
        tok.kind(tok.token_to_id("word").unwrap()),
        TokenKind::UserDefined
    );
}

#[test]
fn special_tokens_and_lookups() {
    let tok = Tokenizer::from_hf_dir(dir()).unwrap();
    for (i, s) in ["<unk>", "<|reserved_1|>", "〈|EOS|〉", "<system>"]
        .iter()
        .enumerate()
    {
        assert_eq!(tok.token_to_id(s), Some(i as u32));
        assert_eq!(tok.id_to_token(i as u32), Some(*s));
        assert!(tok.is_special(i as u32));
    }
    let end_turn = tok.token_to_id("</assistant>").unwrap();
    assert_eq!(end_turn, 24);
    assert!(
        !tok.is_special(end_turn),
        "</assistant> is special=false in HF"
    );
    assert_eq!(
        tok.encode("</assistant>".as_bytes(), false),
        [24],
        "non-special added tokens still match"
    );
    // a byte-level vocabulary string
    let space_the = tok.token_to_id("Ġthe").unwrap();
    assert_eq!(tok.token_bytes(space_the), Some(&b" the"[..]));
    assert_eq!(tok.id_to_token(999_999), None);
    assert_eq!(tok.decode(&[999_999, space_the]), b" the");
    // skip_special drops control tokens but keeps </assistant> (HF semantics)
    let ids = tok.encode("<think>hi</think></assistant>".as_bytes(), true);
    assert_eq!(tok.decode_with(&ids, true), b"hi</assistant>");
    // split_special keeps special tokens as text
    let opts = lagoon::tokenizer::EncodeOptions {
        add_special: false,
        split_special: true,
    };
    let plain = tok.encode_with("<think>".as_bytes(), opts);
    assert!(plain.len() > 1 && !plain.contains(&10));
}

/// Streams every case one token at a time: the pieces concatenate to the lossy decoding
/// of all ids, and for valid text to the text itself (so no piece ever held a broken
/// character: it would have shown up as U+FFFD).
#[test]
fn streaming_decoder_matches_whole_decoding() {
    let tok = Tokenizer::from_hf_dir(dir()).unwrap();
    let all = cases();
    let mut inputs: Vec<(String, Vec<u8>)> = Vec::new();
    for c in all["cases"].as_array().unwrap() {
        inputs.push((
            c["name"].as_str().unwrap().into(),
            c["text"].as_str().unwrap().as_bytes().to_vec(),
        ));
    }
    for c in all["byte_cases"].as_array().unwrap() {
        inputs.push((
            c["name"].as_str().unwrap().into(),
            hex(c["bytes_hex"].as_str().unwrap()),
        ));
    }
    let mut dec = StreamDecoder::new();
    let mut held_back = 0;
    for (name, bytes) in inputs {
        let ids = tok.encode(&bytes, false);
        dec.reset();
        let mut text = String::new();
        for &id in &ids {
            let piece = dec.push(&tok, id);
            text.push_str(piece);
            if dec.has_pending() {
                held_back += 1;
            }
        }
        text.push_str(dec.finish());
        assert_eq!(
            text,
            String::from_utf8_lossy(&tok.decode(&ids)),
            "case {name}"
        );
        if let Ok(s) = std::str::from_utf8(&bytes) {
            assert_eq!(text, s, "case {name}");
        }
    }
    assert!(
        held_back > 10,
        "the corpus should split characters across tokens ({held_back})"
    );
}

/// Arbitrary bytes (mostly invalid UTF-8, line breaks, spaces and special-token text mixed
/// in) round-trip through encode / decode, and the streaming decoder agrees with lossy
/// whole decoding. No reference needed: this is about never losing or inventing bytes.
#[test]
fn arbitrary_bytes_round_trip() {
    let tok = Tokenizer::from_hf_dir(dir()).unwrap();
    let atoms: [&[u8]; 12] = [
        b"\xff",
        b"\xe2\x82",
        b"\xf0\x9f\x98",
        b"\r",
        b"\n",
        b" ",
        b"'s",
        b"<think>",
        "〈|EOS|〉".as_bytes(),
        "日本".as_bytes(),
        b"ab",
        b"9",
    ];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let mut dec = StreamDecoder::new();
    for _ in 0..3000 {
        let mut bytes = Vec::new();
        for _ in 0..next(30) {
            if next(3) == 0 {
                bytes.push(next(256) as u8);
            } else {
                bytes.extend_from_slice(atoms[next(atoms.len())]);
            }
        }
        let ids = tok.encode(&bytes, false);
        assert_eq!(tok.decode(&ids), bytes, "{bytes:?}");
        dec.reset();
        let mut text = String::new();
        for &id in &ids {
            text.push_str(dec.push(&tok, id));
        }
        text.push_str(dec.finish());
        assert_eq!(text, String::from_utf8_lossy(&bytes), "{bytes:?}");
    }
}

/// Configurations that would tokenize differently are refused, not approximated.
#[test]
fn unsupported_configurations_are_refused() {
    let base: Value =
        serde_json::from_slice(&std::fs::read(dir().join("tokenizer.json")).unwrap()).unwrap();
    let load = |j: &Value| Tokenizer::from_tokenizer_json(j.to_string().as_bytes());
    let refused = |j: &Value, what: &str| match load(j) {
        Err(lagoon::tokenizer::TokenizerError::Unsupported { what: w, .. }) => assert_eq!(w, what),
        other => panic!("expected Unsupported {what}, got {:?}", other.map(|_| ())),
    };

    let mut j = base.clone();
    j["normalizer"] = serde_json::json!({"type": "NFC"});
    refused(&j, "normalizer");

    let mut j = base.clone();
    j["pre_tokenizer"]["pretokenizers"][1]["pattern"]["Regex"] = "\\p{N}{1,3}".into();
    refused(&j, "pre_tokenizer");

    let mut j = base.clone();
    j["pre_tokenizer"]["pretokenizers"][2]["add_prefix_space"] = true.into();
    refused(&j, "pre_tokenizer");

    let mut j = base.clone();
    j["model"]["dropout"] = 0.1.into();
    refused(&j, "BPE model options");

    // Without the line-break split it is the plain Qwen2 pre-tokenizer.
    let mut j = base.clone();
    j["pre_tokenizer"]["pretokenizers"]
        .as_array_mut()
        .unwrap()
        .remove(0);
    let qwen2 = load(&j).unwrap();
    assert_eq!(qwen2.pre_tokenizer(), PreTokenizer::Qwen2);
    assert_eq!(qwen2.pre_tokenizer().pieces(b"a \nb"), [0..1, 1..3, 3..4]);
    assert_eq!(
        PreTokenizer::Laguna.pieces(b"a \nb"),
        [0..1, 1..2, 2..3, 3..4]
    );

    // A merge whose result is not in the vocabulary is an error, as in HF.
    let mut j = base.clone();
    j["model"]["merges"][0] = serde_json::json!(["<think>", "a"]);
    assert!(matches!(
        load(&j),
        Err(lagoon::tokenizer::TokenizerError::NotInVocab { .. })
    ));
}
