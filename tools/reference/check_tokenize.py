#!/usr/bin/env python3
"""Compare `examples/tokenize.rs` with HF `tokenizers` and transformers' apply_chat_template.

  check_tokenize.py --hf-dir DIR [--model PATH] [--bin EXE] [--text F ...] [--chat F.json ...]
  check_tokenize.py --record   (re-record tests/fixtures/tokenize/expected.json)

For every `--text F`: the example's ids of F's exact bytes (`--text-file F`) against
`tokenizers.Tokenizer.from_file(DIR/tokenizer.json).encode(F as UTF-8, add_special_tokens=False)`.
For every `--chat F.json` ({"messages", "tools", "enable_thinking", "add_generation_prompt"};
absent add_generation_prompt = False, absent enable_thinking = kwarg not passed): the example's
rendered bytes (stdout) and ids (stderr) against
`AutoTokenizer.from_pretrained(DIR).apply_chat_template(..., tokenize=False)` and that text
encoded with `add_special_tokens=False` (what apply_chat_template(tokenize=True) does).

`--model` is what the example loads (default: DIR; may be the same model's GGUF). The example
runs through `cargo run --release --example tokenize` unless `--bin` names a built binary
(e.g. target/release/examples/tokenize). Exits 1 on any mismatch, printing the first
differing position. Files that are not valid UTF-8 are skipped (HF cannot take them).

Recorded with: tokenizers 0.23.3, transformers 5.23 (see /work/venv/ref).
"""

import argparse
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "tokenize"


def run_example(args, model, flag, path):
    if args.bin:
        cmd = [args.bin]
    else:
        cmd = ["cargo", "run", "-q", "--release", "--example", "tokenize", "--"]
    cmd += ["--model", str(model), flag, str(path)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr.decode(errors='replace')}")
    return p.stdout, p.stderr


def parse_ids(b):
    s = b.decode().strip().splitlines()
    s = s[-1] if s else ""
    return [int(x) for x in s.split(",")] if s else []


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def reference_chat(hf_tok, req):
    kwargs = {}
    if req.get("enable_thinking") is not None:
        kwargs["enable_thinking"] = req["enable_thinking"]
    text = hf_tok.apply_chat_template(
        req["messages"],
        tools=req.get("tools"),
        tokenize=False,
        add_generation_prompt=bool(req.get("add_generation_prompt", False)),
        **kwargs,
    )
    ids = hf_tok(text, add_special_tokens=False)["input_ids"]
    return text, ids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hf-dir", type=pathlib.Path, help="reference HF directory (tokenizer.json + template)")
    ap.add_argument("--model", type=pathlib.Path, help="what the example loads (default: --hf-dir)")
    ap.add_argument("--bin", help="built tokenize example binary (default: cargo run)")
    ap.add_argument("--text", nargs="*", default=[], type=pathlib.Path)
    ap.add_argument("--chat", nargs="*", default=[], type=pathlib.Path)
    ap.add_argument("--record", action="store_true", help="check the committed fixtures and write expected.json")
    args = ap.parse_args()

    if args.record:
        args.hf_dir = args.hf_dir or FIX / "hf"
        args.text = sorted((FIX / "texts").iterdir())
        args.chat = sorted((FIX / "chats").glob("*.json"))
    if not args.hf_dir:
        ap.error("--hf-dir is required (or --record)")
    model = args.model or args.hf_dir

    import tokenizers
    import transformers
    from transformers import AutoTokenizer

    raw = tokenizers.Tokenizer.from_file(str(args.hf_dir / "tokenizer.json"))
    hf_tok = AutoTokenizer.from_pretrained(str(args.hf_dir))

    failures = 0
    record = {
        "generated_by": "tools/reference/check_tokenize.py --record",
        "tokenizers_version": tokenizers.__version__,
        "transformers_version": transformers.__version__,
        "texts": [],
        "chats": [],
    }
    for f in args.text:
        data = f.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            print(f"SKIP {f}: not valid UTF-8 (HF tokenizers takes only str)")
            continue
        want = raw.encode(text, add_special_tokens=False).ids
        out, _ = run_example(args, model, "--text-file", f)
        got = parse_ids(out)
        if got == want:
            print(f"ok   {f}: {len(want)} ids")
        else:
            failures += 1
            i = first_diff(got, want)
            print(f"FAIL {f}: ids differ at {i}: got {got[i:i + 8]} want {want[i:i + 8]} ({len(got)} vs {len(want)})")
        record["texts"].append({"file": f.name, "ids": want})
    for f in args.chat:
        req = json.loads(f.read_text(encoding="utf-8"))
        want_text, want_ids = reference_chat(hf_tok, req)
        out, err = run_example(args, model, "--chat", f)
        got_ids = parse_ids(err)
        if out != want_text.encode("utf-8"):
            failures += 1
            w = want_text.encode("utf-8")
            i = first_diff(out, w)
            print(f"FAIL {f}: rendered text differs at byte {i}: got {out[i:i + 40]!r} want {w[i:i + 40]!r}")
        elif got_ids != want_ids:
            failures += 1
            i = first_diff(got_ids, want_ids)
            print(f"FAIL {f}: ids differ at {i}: got {got_ids[i:i + 8]} want {want_ids[i:i + 8]}")
        else:
            print(f"ok   {f}: {len(want_text)} chars, {len(want_ids)} ids")
        record["chats"].append({"file": f.name, "rendered": want_text, "ids": want_ids})

    if args.record:
        if failures:
            print("not recording: the example disagrees with the reference")
        else:
            out = FIX / "expected.json"
            out.write_text(json.dumps(record, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
            print(f"wrote {out}")
    print(f"{failures} mismatches")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
