#!/usr/bin/env python3
"""Reference outputs of vLLM's `poolside_v1` reasoning + tool-call parsers.

  parse_fixtures.py --vllm-src DIR  -> tests/fixtures/parse/cases.json

Runs vLLM's OWN parser code (no re-implementation): the composed parser that
`vllm serve --reasoning-parser poolside_v1 --tool-call-parser poolside_v1
--enable-auto-tool-choice` builds (`ParserManager.get_parser` -> `DelegatingParser` over
`PoolsideV1ReasoningParser` + `PoolsideV1ToolParser`), driven the way the chat-completions
server drives it:

* batch: `parser.parse(text, request, enable_auto_tools=True)` then
  `assemble_chat_message_fields` (serving.py's non-streaming path);
* streaming: one `ChatStreamProcessor` per stream, `step(delta_text, delta_token_ids,
  finish_reason, prompt_token_ids)` per chunk (serving.py's streaming path), chunks being one
  token each, two seeded random chunkings of tokens (named cases), and with thinking off
  random cuts of the text at any character (tags split across chunks).

vLLM is not installed: DIR holds the pure-Python files of the vLLM 0.33.0 wheel, e.g.
  pip download vllm==0.33.0 --no-deps -d /tmp/w
  unzip -q /tmp/w/vllm-0.33.0-*.whl 'vllm/*.py' -d /tmp/vllm-src     # DIR=/tmp/vllm-src
and its pure-Python dependencies are pip-installed (see requirements.txt: openai,
partial-json-parser, xgrammar --no-deps + apache-tvm-ffi, cbor2, pyzmq, aiohttp,
openai-harmony, fastapi, pillow, pybase64, cachetools, prometheus-client, msgspec,
cloudpickle, uvloop, py-cpuinfo). Nothing is stubbed; the compiled `vllm._C` is never
imported by these modules.

Text is tokenised with tests/fixtures/tokenizer/tokenizer.json (Laguna-like: every chat
marker is one special token; `<think>`=10, `</think>`=12, `<assistant>`=23) and decoded with
special tokens kept (`skip_special_tokens=False`, what vLLM does once tools are on: see
PoolsideV1ToolParser.adjust_request). Per-token delta texts follow an incremental detokenizer:
a token whose text would end in an incomplete UTF-8 sequence yields "" and its bytes come
with a later token. Tool-call ids are random in vLLM; only their presence is recorded.
"""

import argparse
import json
import pathlib
import platform
import random
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "parse" / "cases.json"
TOKENIZER = ROOT / "tests" / "fixtures" / "tokenizer" / "tokenizer.json"

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "units": {"type": "string", "enum": ["c", "f"]},
        }, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "set_config",
        "parameters": {"type": "object", "properties": {
            "flag": {"type": "boolean"},
            "ratio": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "meta": {"type": "object"},
            "nothing": {"type": "null"},
            "code": {"type": "string"},
            "count": {"type": "integer"},
            "maybe": {"type": ["string", "null"]},
        }}}},
    {"type": "function", "function": {"name": "no_params"}},
    {"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}},
]

# Prompts (rendered-template tails; what matters is the token scan back to `<assistant>`).
P_V8_THINK = "〈|EOS|〉<system>sys</system>\n<user>hi</user>\n<assistant><think>"
P_V8_NOTHINK = "〈|EOS|〉<system>sys</system>\n<user>hi</user>\n<assistant></think>"
P_V2_THINK = "〈|EOS|〉<system>\n\nsys\n</system>\n<user>\nhi\n</user>\n<assistant>\n<think>"
P_V2_NOTHINK = "〈|EOS|〉<system>\n\nsys\n</system>\n<user>\nhi\n</user>\n<assistant>\n</think>"
P_HISTORY = ("〈|EOS|〉<user>q1</user>\n<assistant><think>r1</think>a1</assistant>\n"
             "<user>q2 mentions </think> here</user>\n<assistant><think>")
P_HISTORY_OPEN = ("〈|EOS|〉<user>q1</user>\n<assistant><think>r1</think>a1</assistant>\n"
                  "<user>q2</user>\n<assistant>")
P_BARE = "〈|EOS|〉<user>hi</user>\n<assistant>"

TC = "<tool_call>"
ETC = "</tool_call>"


def call(name, *pairs, sep=""):
    body = "".join(f"<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>{sep}" for k, v in pairs)
    return f"{TC}{name}{sep}{body}{ETC}"


# name, thinking, prompt, text, tools?, tool_choice
CASES = [
    ("reasoning_only_truncated", True, P_V8_THINK, "I should think about this carefully", True, "auto"),
    ("reasoning_and_content", True, P_V8_THINK, "Plan: greet.</think>Hello there!", True, "auto"),
    ("reasoning_unicode", True, P_V8_THINK, "Überlegung: 日本語 🤔 ok</think>Ответ: да ✅", True, "auto"),
    ("thinking_off_content", False, P_V8_NOTHINK, "Just an answer.", True, "auto"),
    ("thinking_off_model_thinks", False, P_V8_NOTHINK, "<think>hmm</think>Answer", True, "auto"),
    ("history_think_end_bounded", True, P_HISTORY, "new reasoning</think>new answer", True, "auto"),
    ("history_assistant_open", True, P_HISTORY_OPEN, "reasoning?</think>answer", True, "auto"),
    ("prompt_closed_parser_thinking", True, P_V8_NOTHINK, "direct answer, no think end", True, "auto"),
    ("bare_assistant_prompt", True, P_BARE, "thoughts</think>content", True, "auto"),
    ("model_opens_think", True, P_BARE, "<think>inner</think>outer", True, "auto"),
    ("empty_reasoning", True, P_V8_THINK, "</think>content only", True, "auto"),
    ("reasoning_then_stop", True, P_V8_THINK, "all reasoning</think>", True, "auto"),
    ("think_end_as_plain_tokens", True, P_V8_THINK, ["abc", "</", "think", ">", "def"], True, "auto"),
    ("two_think_ends", True, P_V8_THINK, "a</think>b</think>c", True, "auto"),
    ("tool_string_param", True, P_V8_THINK,
     "Need weather.</think>" + call("get_weather", ("city", " Paris "), ("units", "c")), True, "auto"),
    ("tool_typed_params", False, P_V8_NOTHINK,
     call("set_config", ("flag", "true"), ("ratio", "0.5"), ("tags", '["a", "b"]'),
          ("meta", '{"k": {"n": [1, 2.5e-7, null]}}'), ("nothing", "null"), ("count", " 42 \n")),
     True, "auto"),
    ("tool_python_literals", False, P_V8_NOTHINK,
     call("set_config", ("flag", "True"), ("nothing", "None"), ("tags", "['x', \"y\"]"),
          ("meta", "{'a': (1, 2), 3: 0x1F}"), ("ratio", "1_000.5"), ("count", "1, 2"),
          ("maybe", "'quoted'")),
     True, "auto"),
    ("tool_numbers", False, P_V8_NOTHINK,
     call("run", ("a", "1e400"), ("b", "NaN"), ("c", "-0"), ("d", "1.0"), ("e", "1e-05"),
          ("f", "123456789012345678901234567890"), ("g", ".5"), ("h", "-Infinity"),
          ("i", "1E16"), ("j", "0.0001"), ("k", "-2.5e+300"), ("l", "-0.0")),
     True, "auto"),
    ("tool_unknown_params", False, P_V8_NOTHINK,
     call("get_weather", ("city", "Oslo"), ("extra", '{"x": 1}'), ("note", "plain words"),
          ("flag", "false")), True, "auto"),
    ("tool_string_looks_json", False, P_V8_NOTHINK,
     call("set_config", ("code", '{"a": 1}'), ("count", "7"), ("maybe", "[1]")), True, "auto"),
    ("tool_no_schema", False, P_V8_NOTHINK,
     call("no_params", ("x", "5"), ("y", "hello"), ("z", ' "q" ')), True, "auto"),
    ("tool_schema_without_properties", False, P_V8_NOTHINK,
     call("run", ("x", "5"), ("y", "text")), True, "auto"),
    ("tool_unknown_tool", False, P_V8_NOTHINK,
     call("mystery", ("x", "5"), ("y", "text")), True, "auto"),
    ("multiple_calls_with_content", True, P_V8_THINK,
     "r</think>Before " + call("get_weather", ("city", "A")) + " between "
     + call("get_weather", ("city", "B"), ("days", "2")) + " after", True, "auto"),
    ("content_then_call", False, P_V8_NOTHINK,
     "Let me check.\n\n" + call("get_weather", ("city", "Rome")), True, "auto"),
    ("unterminated_in_string", True, P_V8_THINK,
     "ok</think>" + f"{TC}get_weather<arg_key>city</arg_key><arg_value>Lis", True, "auto"),
    ("unterminated_in_typed", False, P_V8_NOTHINK,
     f"{TC}get_weather<arg_key>days</arg_key><arg_value>1", True, "auto"),
    ("unterminated_after_name", False, P_V8_NOTHINK, f"{TC}get_weather", True, "auto"),
    ("unterminated_after_name_newline", False, P_V8_NOTHINK, f"{TC}get_weather\n", True, "auto"),
    ("unterminated_after_string_value", False, P_V8_NOTHINK,
     f"{TC}get_weather<arg_key>city</arg_key><arg_value>Lisbon</arg_value>", True, "auto"),
    ("second_call_unterminated", False, P_V8_NOTHINK,
     call("get_weather", ("city", "A")) + TC, True, "auto"),
    ("empty_tool_call", False, P_V8_NOTHINK, f"x{TC}{ETC}y", True, "auto"),
    ("v2_style", True, P_V2_THINK,
     "\nThe user wants weather.\n</think>\nChecking.\n"
     + call("get_weather", ("city", "Paris"), ("days", "3"), sep="\n") + "\n", True, "auto"),
    ("v2_thinking_off", False, P_V2_NOTHINK,
     "\n" + call("set_config", ("flag", "false"), ("tags", "[]"), sep="\n") + "\n", True, "auto"),
    ("string_values_escapes", False, P_V8_NOTHINK,
     call("set_config", ("code", 'line1\n\tline2 "q" \\ back\u2028 é 😀\n'),
          ("maybe", "  spaced  ")), True, "auto"),
    ("control_char_json_fallback", False, P_V8_NOTHINK,
     call("set_config", ("meta", '"a\tb"'), ("ratio", "abc"), ("count", "'7'")), True, "auto"),
    ("set_value_fatal", False, P_V8_NOTHINK,
     "pre " + call("set_config", ("tags", "{1, 2}")), True, "auto"),
    ("duplicate_keys", False, P_V8_NOTHINK,
     call("get_weather", ("city", "A"), ("days", "1"), ("city", "B"), ("days", "2")), True, "auto"),
    ("name_whitespace", False, P_V8_NOTHINK,
     f"{TC}  get_weather  \n<arg_key> city </arg_key>\n <arg_value>X</arg_value>{ETC}", True, "auto"),
    ("name_only_call", False, P_V8_NOTHINK, f"{TC}no_params{ETC}", True, "auto"),
    ("tool_choice_none", False, P_V8_NOTHINK, "a " + call("get_weather", ("city", "A")), True, "none"),
    ("no_tools", True, P_V8_THINK, "r</think>" + call("get_weather", ("city", "A")), False, "none"),
    ("required_whitespace_only", False, P_V8_NOTHINK, "  \n ", True, "required"),
    ("required_with_call", False, P_V8_NOTHINK, call("get_weather", ("city", "A")), True, "required"),
    ("tool_call_inside_reasoning", True, P_V8_THINK,
     "maybe " + call("get_weather", ("city", "A")) + " no</think>final", True, "auto"),
    ("junk_between_key_and_value", False, P_V8_NOTHINK,
     f"{TC}get_weather<arg_key>city</arg_key>junk<arg_value>Z</arg_value>"
     f"<arg_key>days</arg_key><arg_value>4</arg_value>{ETC}", True, "auto"),
    ("nested_tool_call_open", False, P_V8_NOTHINK,
     f"{TC}a{TC}get_weather<arg_key>days</arg_key><arg_value>1</arg_value>{ETC}", True, "auto"),
    ("key_extends_past_close", False, P_V8_NOTHINK,
     f"{TC}run<arg_key>a</arg_key>junk</arg_key><arg_value>1</arg_value>{ETC}", True, "auto"),
    ("trailing_partial_start", False, P_V8_NOTHINK, "answer <tool", True, "auto"),
    ("name_with_angle", False, P_V8_NOTHINK,
     f"{TC}get<weather<arg_key>x</arg_key><arg_value>1</arg_value>{ETC}", True, "auto"),
    ("tuple_key_fatal", False, P_V8_NOTHINK, call("run", ("m", "{(1, 2): 3}")), True, "auto"),
    ("unhashable_in_list_fatal", False, P_V8_NOTHINK, call("run", ("m", "[{[1]: 2}, x]")), True, "auto"),
    ("malformed_literals_raw", False, P_V8_NOTHINK,
     call("run", ("a", "[1, x]"), ("b", "{[1]: y}"), ("c", "1+2"), ("d", "007"), ("e", "f'x'"),
          ("f", "-True"), ("g", "1\n2"), ("h", "[1,\n 2] # c"), ("i", "'a' 'b'"), ("j", "(1)"),
          ("k", "r'\\n'"), ("l", "'\\x41\\u00e9\\101'"), ("m", "()"), ("n", "-(1)"),
          ("o", "{'a': 1, 'a': 2}"), ("p", "{1: 'x', True: 'y', 1.0: 'z'}"), ("q", "0b101"),
          ("r", "0o17"), ("s", "[1,]")),
     True, "auto"),
]


# Random generations over the parsers' alphabet (markers, partial markers, names, keys,
# JSON / Python-literal / plain values, whitespace, multi-byte text), for differential
# coverage beyond the hand-written cases.
FUZZ_PIECES = [
    TC, TC, ETC, ETC, "<arg_key>", "<arg_key>", "</arg_key>", "</arg_key>", "<arg_value>",
    "<arg_value>", "</arg_value>", "</arg_value>", "<think>", "</think>", "</think>",
    "get_weather", "set_config", "run", "no_params", "city", "days", "tags", "meta", "flag",
    "code", " ", "\n", "  \n", "\t", "Paris", "42", "-1.5e3", "[1, 2]", '{"a": 1}', "True",
    "None", "'x'", "(1,)", "{1: 2}", "é", "日本", "🤔", "<tool", "</arg_val", "<", ">", "text",
    "NaN", '"q"', "\\", "0x10", "1_0", "null",
]
N_FUZZ = 40
N_COERCE_FUZZ = 30
PROMPTS = [P_V8_THINK, P_V8_NOTHINK, P_V2_THINK, P_BARE, P_HISTORY]


VALUE_ATOMS = [
    "1", "0", "-0", "007", "00", "1_000", "1__0", "0x1F", "0o17", "0b12", "1.", ".5", "1e5", "1e",
    "2j", "1.5e-7", "1E400", "NaN", "Infinity", "-Infinity", "nan", "true", "True", "None",
    "null", "...", "x", "set()", "'a'", '"b"', "'\\x41'", "'\\u00e9'", "r'\\n'", "b'x'",
    "f'x'", "'''t'''", '"\\q"', "'é'", "'a' 'b'", "u'x'", "123456789012345678901",
    '"tab\there"', "'\\101'", "0_0", "1if",
]
SEPS = [", ", ",", " , ", "\n", " # c\n"]


def literal_value(rng, depth=0):
    r = rng.random()
    if depth > 2 or r < 0.45:
        v = rng.choice(VALUE_ATOMS)
        if rng.random() < 0.15:
            v = rng.choice(["-", "+", "~", "- "]) + v
        return v
    items = [literal_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if r < 0.6:
        return "[" + rng.choice(SEPS).join(items) + rng.choice(["", ","]) + "]"
    if r < 0.7:
        return "(" + ", ".join(items) + rng.choice(["", ","]) + ")"
    if r < 0.8:
        return "{" + ", ".join(items) + "}"
    if r < 0.9:
        return "{" + ", ".join(f"{literal_value(rng, depth + 1)}{rng.choice([': ', ':'])}{i}"
                               for i in items) + "}"
    op = rng.choice(["+", "-", "*", ","])
    return f"{literal_value(rng, depth + 1)} {op} {literal_value(rng, depth + 1)}"


def coerce_fuzz_cases(rng, n):
    """Random argument values (JSON / Python-literal / neither) for `_deserialize`."""
    out = []
    for k in range(n):
        pairs = [(rng.choice(["a", "b", "code", "count"]), literal_value(rng))
                 for _ in range(rng.randint(1, 4))]
        out.append((f"cfuzz_{k:03}", False, P_V8_NOTHINK,
                    call(rng.choice(["run", "set_config"]), *pairs), True, "auto"))
    return out


def fuzz_cases(rng, n):
    out = []
    for k in range(n):
        text = "".join(rng.choice(FUZZ_PIECES) for _ in range(rng.randint(3, 24)))
        choice = rng.choice(["auto"] * 6 + ["required", "none"])
        out.append((f"fuzz_{k:02}", rng.random() < 0.6, rng.choice(PROMPTS), text,
                    rng.random() < 0.9 or choice != "none", choice))
    return out


def detok_deltas(tok, ids):
    """Per-token delta texts of an incremental detokenizer (UTF-8-safe hold-back)."""
    out, emitted = [], ""
    for k in range(len(ids)):
        full = tok.decode(ids[: k + 1], skip_special_tokens=False)
        if full.endswith("\ufffd"):
            out.append("")
            continue
        assert full.startswith(emitted), (full, emitted)
        out.append(full[len(emitted):])
        emitted = full
    return out


def delta_json(d):
    if d is None:
        return None
    calls = []
    for tc in d.tool_calls or []:
        assert (tc.id is None) == (tc.type is None)
        calls.append({
            "index": tc.index,
            "id": tc.id is not None,
            "name": tc.function.name if tc.function else None,
            "arguments": tc.function.arguments if tc.function else None,
        })
    return {"reasoning": d.reasoning, "content": d.content, "tool_calls": calls}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm-src", required=True, help="dir with the wheel's vllm/*.py")
    ap.add_argument("--out", default=str(OUT), help="output file (default: the fixture)")
    ap.add_argument("--fuzz", type=int, default=N_FUZZ, help="number of random cases")
    ap.add_argument("--fuzz-seed", type=int, default=7)
    ap.add_argument("--fuzz-only", action="store_true", help="leave out the named cases")
    ap.add_argument("--coerce-fuzz", type=int, default=N_COERCE_FUZZ,
                    help="number of random argument-value cases")
    args = ap.parse_args()
    out_path = pathlib.Path(args.out)
    sys.path.insert(0, args.vllm_src)

    import importlib.metadata as md

    from transformers import PreTrainedTokenizerFast
    from vllm import _version as vv
    from vllm.entrypoints.openai.chat_completion.message_assembly import (
        assemble_chat_message_fields,
    )
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.chat_completion.stream_processor import ChatStreamProcessor
    from vllm.parser.parser_manager import ParserManager

    assert vv.__version__ == "0.33.0", vv.__version__
    tok = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER))
    vocab = tok.get_vocab()
    markers = {"think": vocab["<think>"], "think_end": vocab["</think>"],
               "assistant": vocab["<assistant>"]}
    parser_cls = ParserManager.get_parser(
        tool_parser_name="poolside_v1", reasoning_parser_name="poolside_v1",
        enable_auto_tools=True, tokenizer=tok)

    def request(with_tools, tool_choice):
        kw = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        if with_tools:
            kw["tools"] = TOOLS
            kw["tool_choice"] = tool_choice
        return ChatCompletionRequest(**kw)

    def make_parser(req, thinking):
        return parser_cls(tok, req.tools, chat_template_kwargs={"enable_thinking": thinking})

    rng = random.Random(20261130)
    cases = []
    all_cases = (([] if args.fuzz_only else CASES)
                 + fuzz_cases(random.Random(args.fuzz_seed), args.fuzz)
                 + coerce_fuzz_cases(random.Random(args.fuzz_seed + 1), args.coerce_fuzz))
    for name, thinking, prompt, text, with_tools, tool_choice in all_cases:
        if isinstance(text, list):  # pieces tokenised separately (markers as plain text)
            ids = [i for piece in text for i in tok.encode(piece, add_special_tokens=False)]
            text = "".join(text)
        else:
            ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids, skip_special_tokens=False) == text, name
        prompt_ids = tok.encode(prompt, add_special_tokens=False)
        req = request(with_tools, tool_choice)
        assert req.tool_choice == tool_choice, (name, req.tool_choice)

        # Batch: serving.py chat_completion_full_generator.
        parser = make_parser(req, thinking)
        parser.set_prompt_token_ids(prompt_ids)
        reasoning, content, tool_calls = parser.parse(text, req, enable_auto_tools=True,
                                                      model_output_token_ids=ids)
        fields = assemble_chat_message_fields(req, reasoning, content, tool_calls,
                                              enable_auto_tools=True, parser_cls=parser_cls)
        batch = {"reasoning": fields.reasoning, "content": fields.content,
                 "tool_calls": [{"name": tc.function.name, "arguments": tc.function.arguments}
                                for tc in fields.tool_calls]}

        # Streaming: one token per chunk, then two random chunkings.
        per_token = detok_deltas(tok, ids)
        chunkings = [[1] * len(ids)]
        for _ in range(0 if "fuzz_" in name else 2):
            sizes, left = [], len(ids)
            while left:
                n = min(left, rng.randint(1, 5))
                sizes.append(n)
                left -= n
            chunkings.append(sizes)
        chunk_lists = []
        for sizes in chunkings:
            chunks, pos = [], 0
            for n in sizes:
                chunks.append(["".join(per_token[pos:pos + n]), ids[pos:pos + n]])
                pos += n
            chunk_lists.append(chunks)
        if not thinking and "fuzz_" not in name:
            # Text cut at random characters (tags split across chunks; ids only matter to
            # the reasoning parser, which is off): all ids ride on the first chunk.
            chunks, pos = [], 0
            while pos < len(text):
                n = rng.randint(1, 4)
                chunks.append([text[pos:pos + n], ids if pos == 0 else []])
                pos += n
            chunk_lists.append(chunks)
        streams = []
        for chunks in chunk_lists:
            proc = ChatStreamProcessor(req, make_parser(req, thinking), enable_auto_tools=True,
                                       parser_cls=parser_cls)
            deltas, error = [], None
            for k, (dt, dids) in enumerate(chunks):
                last = k == len(chunks) - 1
                try:
                    step = proc.step(dt, list(dids), "stop" if last else None, prompt_ids)
                except Exception as e:  # the reference raises (recorded, not compared past)
                    error = f"{type(e).__name__}: {e}"
                    break
                deltas.append(delta_json(step.delta))
            streams.append({"chunks": chunks, "deltas": deltas, "error": error})

        cases.append({
            "name": name, "thinking": thinking,
            "with_tools": with_tools, "tool_choice": tool_choice,
            "prompt_ids": prompt_ids, "text": text, "ids": ids,
            "batch": batch, "streams": streams,
        })

    versions = {
        "vllm": vv.__version__, "vllm_commit": vv.__commit_id__,
        "python": platform.python_version(),
        "transformers": md.version("transformers"), "tokenizers": md.version("tokenizers"),
        "partial-json-parser": md.version("partial-json-parser"),
        "regex": md.version("regex"), "pydantic": md.version("pydantic"),
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"generator": "tools/reference/parse_fixtures.py", "versions": versions,
           "markers": markers, "tools": TOOLS, "cases": cases}
    out_path.write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {out_path} ({out_path.stat().st_size} bytes, {len(cases)} cases)")


if __name__ == "__main__":
    main()
