//! `lagoon::parse` against vLLM 0.33.0's own `poolside_v1` parsers
//! (tools/reference/parse_fixtures.py → tests/fixtures/parse/cases.json): batch output and
//! every streamed delta, one token per chunk and two random chunkings.

use anyhow::{Context, Result, bail, ensure};
use lagoon::parse::{
    Delta, Markers, Message, ParseOptions, StreamParser, ToolChoice, Tools, parse,
};
use serde_json::{Value, json};

const CASES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/parse/cases.json"
);

/// The committed fixture, or `LAGOON_PARSE_CASES` (e.g. a large `--fuzz` run).
fn load() -> Result<Value> {
    let path = std::env::var("LAGOON_PARSE_CASES").unwrap_or_else(|_| CASES.to_string());
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    Ok(serde_json::from_str(&text)?)
}

fn markers(doc: &Value) -> Markers {
    let m = &doc["markers"];
    let id = |k: &str| m[k].as_u64().expect("marker id") as u32;
    Markers {
        think: id("think"),
        think_end: id("think_end"),
        assistant: id("assistant"),
    }
}

/// The request of one case; `tools` is the fixture's shared tools array.
fn options(case: &Value, tools: &Value) -> Result<ParseOptions> {
    let tools = match case["with_tools"].as_bool().context("with_tools")? {
        false => Tools::new(),
        true => Tools::from_openai_json(tools)?,
    };
    let tool_choice = match case["tool_choice"].as_str() {
        Some("none") => ToolChoice::None,
        Some("auto") => ToolChoice::Auto,
        Some("required") => ToolChoice::Required,
        other => bail!("unknown tool_choice {other:?}"),
    };
    Ok(ParseOptions {
        thinking: case["thinking"].as_bool().context("thinking")?,
        tools,
        tool_choice,
    })
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn message_json(m: &Message) -> Value {
    json!({
        "reasoning": m.reasoning,
        "content": m.content,
        "tool_calls": m.tool_calls.iter()
            .map(|c| json!({"name": c.name, "arguments": c.arguments}))
            .collect::<Vec<_>>(),
    })
}

fn delta_json(d: &Option<Delta>) -> Value {
    match d {
        None => Value::Null,
        Some(d) => json!({
            "reasoning": d.reasoning,
            "content": d.content,
            "tool_calls": d.tool_calls.iter().map(|c| json!({
                "index": c.index,
                "id": c.name.is_some(),
                "name": c.name,
                "arguments": c.arguments,
            })).collect::<Vec<_>>(),
        }),
    }
}

/// Runs one recorded stream; `finish()` is merged into the last delta, where vLLM puts it.
fn run_stream(
    opts: &ParseOptions,
    m: Markers,
    prompt: &[u32],
    chunks: &[Value],
) -> Vec<Option<Delta>> {
    let mut p = StreamParser::new(opts.clone(), m, prompt);
    let mut out: Vec<Option<Delta>> = chunks
        .iter()
        .map(|c| p.push(c[0].as_str().expect("chunk text"), &ids(&c[1])))
        .collect();
    if let Some(fin) = p.finish() {
        let last = out
            .last_mut()
            .and_then(Option::as_mut)
            .expect("finish only after tool pieces");
        let piece = &fin.tool_calls[0];
        let call = last.tool_calls.last_mut().expect("tool piece");
        assert_eq!(call.index, piece.index);
        call.arguments.push_str(&piece.arguments);
    }
    out
}

#[test]
fn batch_matches_vllm() -> Result<()> {
    let doc = load()?;
    let cases = doc["cases"].as_array().context("cases")?;
    ensure!(cases.len() >= 30, "only {} cases", cases.len());
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().context("name")?;
        let got = message_json(&parse(
            case["text"].as_str().context("text")?,
            &options(case, &doc["tools"])?,
        ));
        if got != case["batch"] {
            failures.push(format!("{name}:\n  got  {got}\n  want {}", case["batch"]));
        }
    }
    ensure!(
        failures.is_empty(),
        "{} batch mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    Ok(())
}

#[test]
fn streaming_matches_vllm() -> Result<()> {
    let doc = load()?;
    let m = markers(&doc);
    let mut failures = Vec::new();
    let mut n_streams = 0;
    for case in doc["cases"].as_array().context("cases")? {
        let name = case["name"].as_str().context("name")?;
        let opts = options(case, &doc["tools"])?;
        let prompt = ids(&case["prompt_ids"]);
        for (s, stream) in case["streams"]
            .as_array()
            .context("streams")?
            .iter()
            .enumerate()
        {
            let chunks = stream["chunks"].as_array().context("chunks")?;
            let want = stream["deltas"].as_array().context("deltas")?;
            let got = run_stream(&opts, m, &prompt, chunks);
            n_streams += 1;
            // Where the reference raised, compare the deltas before it only.
            let upto = if stream["error"].is_null() {
                got.len()
            } else {
                want.len()
            };
            ensure!(
                want.len() == upto,
                "{name}/{s}: {} deltas recorded for {} chunks",
                want.len(),
                chunks.len()
            );
            for (k, (g, w)) in got.iter().zip(want).take(upto).enumerate() {
                let g = delta_json(g);
                if &g != w {
                    failures.push(format!(
                        "{name} stream {s} chunk {k} {:?}:\n  got  {g}\n  want {w}",
                        chunks[k][0]
                    ));
                    break;
                }
            }
        }
    }
    ensure!(n_streams >= 90, "only {n_streams} streams");
    ensure!(
        failures.is_empty(),
        "{} stream mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    Ok(())
}

/// Streaming and batch agree on tool-call arguments where the reference's do (whole
/// calls, no duplicate keys), so the accumulated stream is a usable message too.
#[test]
fn accumulated_stream_arguments_parse_as_json() -> Result<()> {
    let doc = load()?;
    let m = markers(&doc);
    let case = doc["cases"]
        .as_array()
        .context("cases")?
        .iter()
        .find(|c| c["name"] == "multiple_calls_with_content")
        .context("case")?;
    let stream = &case["streams"][0];
    let got = run_stream(
        &options(case, &doc["tools"])?,
        m,
        &ids(&case["prompt_ids"]),
        stream["chunks"].as_array().context("chunks")?,
    );
    let mut args = vec![String::new(); 2];
    for d in got.iter().flatten() {
        for c in &d.tool_calls {
            args[c.index].push_str(&c.arguments);
        }
    }
    let batch = parse(
        case["text"].as_str().context("text")?,
        &options(case, &doc["tools"])?,
    );
    for (a, call) in args.iter().zip(&batch.tool_calls) {
        let streamed: Value = serde_json::from_str(a)?;
        ensure!(
            Some(streamed) == call.arguments_json(),
            "{a} vs {}",
            call.arguments
        );
    }
    Ok(())
}

#[test]
fn markers_come_from_the_tokenizer() -> Result<()> {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tokenizer/tokenizer.json"
    );
    let tok = lagoon::tokenizer::Tokenizer::from_tokenizer_json_file(dir)?;
    let doc = load()?;
    assert_eq!(Markers::from_tokenizer(&tok)?, markers(&doc));
    Ok(())
}

#[test]
fn malformed_tools_are_typed_errors() {
    for bad in [
        json!({"a": 1}),
        json!([{"function": {"parameters": {}}}]),
        json!([{"name": "f", "parameters": 3}]),
    ] {
        assert!(Tools::from_openai_json(&bad).is_err(), "{bad}");
    }
}

/// Long values cut into small pieces (tags split across pieces): the streamed arguments
/// add up to the batch ones. Exercises the resumed searches while a value is incomplete.
#[test]
fn long_values_stream_in_small_pieces() -> Result<()> {
    let doc = load()?;
    let opts = ParseOptions {
        thinking: false,
        tools: Tools::from_openai_json(&doc["tools"])?,
        tool_choice: ToolChoice::Auto,
    };
    let list: Vec<String> = (0..20_000).map(|i| format!("{}.5", i)).collect();
    let text = format!(
        "intro <tool_call>set_config\n<arg_key>tags</arg_key><arg_value>[{}]</arg_value>\
         <arg_key>code</arg_key><arg_value>{}</arg_value></tool_call> tail",
        list.join(", "),
        "é\"\\\n</arg_valu".repeat(5_000)
    );
    let m = markers(&doc);
    let mut p = StreamParser::new(opts.clone(), m, &[m.assistant]);
    let chars: Vec<char> = text.chars().collect();
    let (mut args, mut content, mut names) = (String::new(), String::new(), Vec::new());
    for (k, piece) in chars.chunks(3).enumerate() {
        let piece: String = piece.iter().collect();
        let ids: &[u32] = if k == 0 { &[1] } else { &[] };
        if let Some(d) = p.push(&piece, ids) {
            content.push_str(d.content.as_deref().unwrap_or(""));
            for c in &d.tool_calls {
                ensure!(c.index == 0);
                names.extend(c.name.clone());
                args.push_str(&c.arguments);
            }
        }
    }
    ensure!(p.finish().is_none());
    let batch = parse(&text, &opts);
    ensure!(names == ["set_config"]);
    ensure!(batch.tool_calls.len() == 1 && args == batch.tool_calls[0].arguments);
    ensure!(content == "intro  tail", "{content:?}");
    Ok(())
}
