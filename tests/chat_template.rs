//! Chat templates rendered by `lagoon::chat` against transformers' `apply_chat_template`
//! (fixtures from tools/reference/chat_fixtures.py; templates' provenance in
//! tests/fixtures/chat/README.md).

use std::path::PathBuf;

use lagoon::chat::ChatTemplate;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat")
}

#[test]
fn renders_match_transformers() {
    let dir = fixtures();
    let cases: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("cases.json")).unwrap()).unwrap();
    let mut templates = std::collections::HashMap::new();
    let mut failed = Vec::new();
    let cases = cases.as_array().unwrap();
    for case in cases {
        let name = case["template"].as_str().unwrap();
        let tmpl = templates.entry(name.to_owned()).or_insert_with(|| {
            let text = std::fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
            ChatTemplate::from_str(&text).unwrap()
        });
        let tools = (!case["tools"].is_null()).then_some(&case["tools"]);
        let got = tmpl
            .render(
                &case["messages"],
                tools,
                case["enable_thinking"].as_bool(),
                case["add_generation_prompt"].as_bool().unwrap(),
            )
            .unwrap_or_else(|e| format!("ERROR {e}"));
        let want = case["expected"].as_str().unwrap();
        if got != want {
            failed.push(format!(
                "{name} {}:\n--- want\n{want}\n--- got\n{got}",
                case["name"].as_str().unwrap()
            ));
        }
    }
    assert!(cases.len() >= 100, "only {} cases", cases.len());
    assert!(
        failed.is_empty(),
        "{} of {} differ:\n{}",
        failed.len(),
        cases.len(),
        failed.join("\n\n")
    );
}

#[test]
fn environment_features() {
    let t = ChatTemplate::from_str(
        "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}\
         {{ m.content.strip().upper() }}|{{ m | tojson }}|{{ m | tojson(indent=2) }}\n\
         {% endfor %}{% if messages | length > 2 %}{{ raise_exception('too many') }}{% endif %}\
         {{ strftime_now('%Y')|length }}",
    )
    .unwrap();
    let msgs = serde_json::json!([{"role": "user", "content": " é\u{1F600}\"x "}, {"role": "b", "content": "y"}]);
    let out = t.render(&msgs, None, None, false).unwrap();
    assert_eq!(
        out,
        "É\u{1F600}\"X|{\"role\": \"user\", \"content\": \" é\u{1F600}\\\"x \"}|{\n  \"role\": \"user\",\n  \"content\": \" é\u{1F600}\\\"x \"\n}\n4"
    );
    let msgs = serde_json::json!([{"content": "a"}, {"content": "b"}, {"content": "c"}]);
    let err = t.render(&msgs, None, None, false).unwrap_err();
    assert!(err.to_string().contains("too many"), "{err}");
    let t = ChatTemplate::from_str("{{ 'é' | tojson(ensure_ascii=True) }}").unwrap();
    assert_eq!(
        t.render(&serde_json::json!([]), None, None, false).unwrap(),
        "\"\\u00e9\""
    );
}

#[test]
fn loads_from_hf_dir_and_gguf_metadata() {
    let dir = std::env::temp_dir().join(format!("lagoon-chat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"chat_template": "cfg:{{ messages[0].content }}"}"#,
    )
    .unwrap();
    let msgs = serde_json::json!([{"role": "user", "content": "hi"}]);
    let t = ChatTemplate::from_hf_dir(&dir).unwrap();
    assert_eq!(t.render(&msgs, None, None, false).unwrap(), "cfg:hi");
    std::fs::write(
        dir.join("chat_template.jinja"),
        "jinja:{{ messages[0].content }}\n",
    )
    .unwrap();
    let t = ChatTemplate::from_hf_dir(&dir).unwrap();
    assert_eq!(t.render(&msgs, None, None, false).unwrap(), "jinja:hi");
    std::fs::remove_dir_all(&dir).unwrap();

    let md = vec![(
        "tokenizer.chat_template".to_owned(),
        lagoon::gguf::gguf::Value::Str("gguf:{{ messages[0].content }}".into()),
    )];
    let t = ChatTemplate::from_gguf_metadata(&md).unwrap();
    assert_eq!(t.render(&msgs, None, None, false).unwrap(), "gguf:hi");
    assert!(ChatTemplate::from_gguf_metadata(&[]).is_err());
}
