#!/usr/bin/env python3
"""Reference renders of the Laguna chat templates, recorded with transformers.

  chat_fixtures.py  -> tests/fixtures/chat/cases.json

For each template in tests/fixtures/chat/ (laguna_v8.jinja, laguna_v2.jinja: see README.md
there for provenance) and each conversation below, renders
`PreTrainedTokenizerFast.apply_chat_template(messages, tools=..., tokenize=False,
add_generation_prompt=..., enable_thinking=...)` and records inputs and output.
`enable_thinking: null` means the kwarg is not passed (the template default applies).
The Rust test `tests/chat_template.rs` renders the same inputs with `lagoon::chat`.
"""

import json
import pathlib
import sys

from transformers import PreTrainedTokenizerFast

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "chat"
TEMPLATES = ["laguna_v8", "laguna_v2"]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather for a city — «quoted» & <escaped>",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "days": {"type": "integer", "minimum": 1, "default": 3},
                "ratio": {"type": "number", "default": 0.5},
                "units": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.\nReturns a list.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": ["integer", "null"]}}},
    },
}

SYS = {"role": "system", "content": "You are a terse assistant.  \n"}
U1 = {"role": "user", "content": "What's the weather in Zürich?"}
A_CALL = {
    "role": "assistant",
    "content": "",
    "reasoning_content": "The user wants weather. I'll call the tool.",
    "tool_calls": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "arguments": {"city": "Zürich", "days": 2, "ratio": 1.0, "flags": [True, None, "x\"y"], "opts": {"b": 1, "a": "ä"}},
            },
        },
        {"type": "function", "function": {"name": "search", "arguments": {"q": "weather \"Zürich\"\n", "n": 1e16}}},
    ],
}
TOOL = {"role": "tool", "content": "{\"temp\": 21, \"sky\": \"☀\"}"}
A_FINAL = {"role": "assistant", "content": "It's 21 °C and sunny ☀.", "reasoning_content": "Tool said 21."}

CONVS = [
    ("single_user", [{"role": "user", "content": "Hello!"}], None),
    ("system_user", [SYS, {"role": "user", "content": "Hi"}], None),
    ("empty_system", [{"role": "system", "content": ""}, {"role": "user", "content": "Hi"}], None),
    ("whitespace_system", [{"role": "system", "content": "  \n "}, {"role": "user", "content": "Hi"}], None),
    (
        "multi_turn",
        [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Simple arithmetic."},
            {"role": "user", "content": "And 3+3?"},
        ],
        None,
    ),
    ("tools_full", [SYS, U1, A_CALL, TOOL, A_FINAL, {"role": "user", "content": "Thanks"}], [WEATHER, SEARCH]),
    ("tools_no_system", [U1, A_CALL, TOOL], [WEATHER]),
    ("tools_empty_system", [{"role": "system", "content": ""}, U1], [WEATHER, SEARCH]),
    (
        "reasoning_alias",
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "reasoning": "via the vLLM field"},
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "a2", "thinking": "via thinking"},
            {"role": "user", "content": "q3"},
        ],
        None,
    ),
    (
        "think_in_content",
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "<think>\nhidden plan\n</think>\n\n  the answer  "},
            {"role": "user", "content": "q2"},
        ],
        None,
    ),
    (
        "unicode_and_second_system",
        [
            {"role": "system", "content": "日本語で答えてください。"},
            {"role": "user", "content": "こんにちは 👋 \u00e9\u0301 \t tabs\r\nCRLF"},
            {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"q": "東京 🗼", "n": 3}}}]},
            {"role": "tool", "content": "结果"},
            {"role": "system", "content": "Mid-conversation system note."},
            {"role": "user", "content": "続けて"},
        ],
        [SEARCH],
    ),
    (
        "assistant_last",
        [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi!", "reasoning_content": ""}],
        None,
    ),
]

VARIANTS = [(None, True), (False, True), (True, True), (True, False), (False, False)]


def main():
    out = []
    for name in TEMPLATES:
        template = (FIX / f"{name}.jinja").read_text()
        tok = PreTrainedTokenizerFast(
            tokenizer_file=str(ROOT / "tests" / "fixtures" / "tokenizer" / "tokenizer.json"), chat_template=template
        )
        for conv, messages, tools in CONVS:
            for think, agp in VARIANTS:
                kwargs = {}
                if think is not None:
                    kwargs["enable_thinking"] = think
                text = tok.apply_chat_template(
                    json.loads(json.dumps(messages)),
                    tools=json.loads(json.dumps(tools)) if tools is not None else None,
                    tokenize=False,
                    add_generation_prompt=agp,
                    **kwargs,
                )
                out.append(
                    {
                        "template": name,
                        "name": f"{conv}/think={think}/agp={agp}",
                        "messages": messages,
                        "tools": tools,
                        "enable_thinking": think,
                        "add_generation_prompt": agp,
                        "expected": text,
                    }
                )
    path = FIX / "cases.json"
    path.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    print(f"{len(out)} cases -> {path.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
