#!/usr/bin/env python3
"""Reference data for the Laguna tokenizer (`src/tokenizer/`), recorded with HF `tokenizers`.

  tokenizer_fixtures.py tables     -> src/tokenizer/unicode_tables.rs
  tokenizer_fixtures.py fixtures   -> tests/fixtures/tokenizer/*

`tables` probes the regex engine HF `tokenizers` uses (Oniguruma) for the members of the
classes the Laguna pre-tokenizer regex uses (`\\p{L}`, `\\p{N}`, `\\s`) and writes them as
range tables, so the Rust scanner classifies every code point exactly as HF does (Rust's
`char::is_alphabetic` is the Alphabetic property, a superset of `\\p{L}` that includes
combining vowel signs such as U+093F, so it cannot be used).

`fixtures` writes:
  tokenizer.json, tokenizer_config.json   byte-level BPE (vocab 2000) with the Laguna
                                          pre-tokenizer and the Laguna special-token layout,
                                          trained on CPython stdlib files (CORPUS_FILES)
  tokenizer.gguf                          the same tokenizer as llama.cpp's converter writes
                                          it (LagunaModel.set_vocab, no tensors)
  variant.json                            a small tokenizer with added tokens that use the
                                          lstrip / rstrip / single_word / normalized flags,
                                          non-special added tokens and ignore_merges
  cases.json                              texts and byte strings with the ids HF assigns

Invalid UTF-8: HF `tokenizers` only accepts `str`, so it cannot see invalid bytes at all
(`bytes.decode('utf-8', 'replace')` first would turn each maximal invalid subpart into
U+FFFD, i.e. the bytes EF BF BD). Our encoder takes bytes and treats each maximal invalid
subpart as one pseudo-character of class "other" (the class of U+FFFD) whose byte-level
symbols are its own raw bytes, so decode(encode(b)) == b. The expected ids for byte cases
are built from HF components: HF splits the U+FFFD-substituted string (added tokens +
pre-tokenizer, read back through `Encoding.word_ids`/offsets); each word that holds a
substituted character is re-encoded by HF's BPE model (`tokenizer.model.tokenize`) from the
byte-level form of the original bytes.
"""
from __future__ import annotations

import argparse
import codecs
import json
import random
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
OUT_DIR = REPO_ROOT / "tests" / "fixtures" / "tokenizer"
TABLES_RS = REPO_ROOT / "src" / "tokenizer" / "unicode_tables.rs"
LLAMA_CPP_DIR = Path("/work/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp")

# Laguna's pre-tokenizer (spec/laguna.md §7.1).
SPLIT_LINEBREAKS = r"(?:\r?\n)+(?!\r?\n)"
SPLIT_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Special ids laid out as in the real Laguna vocabulary (0 unk, 2 BOS=EOS, 9 pad, 24 turn end).
SPECIAL_TOKENS = [
    "<unk>", "<|reserved_1|>", "〈|EOS|〉", "<system>", "</system>", "<user>",
    "<|fim_prefix|>", "<|fim_middle|>", "</user>", "<pad>", "<think>", "<|fim_suffix|>",
    "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
    "</arg_value>", "<tool_response>", "</tool_response>", "<available_tools>",
    "</available_tools>", "<assistant>", "</assistant>",
]
NON_SPECIAL = {"</assistant>"}  # special=false in the release, like here

# Training corpus: files of the CPython standard library of the interpreter running this
# script (recorded in cases.json). test_unicode.py brings many non-ASCII characters.
CORPUS_FILES = ["textwrap.py", "difflib.py", "argparse.py", "calendar.py", "json/__init__.py",
                "json/decoder.py", "json/encoder.py", "test/test_unicode.py"]
VOCAB_SIZE = 2000


# ------------------------------------------------------------------------------------------
# Unicode tables
# ------------------------------------------------------------------------------------------

def onig_members(cls: str) -> list[int]:
    from tokenizers import Regex, pre_tokenizers
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    big = "".join(map(chr, cps))
    split = pre_tokenizers.Split(Regex(f"[^{cls}]"), behavior="removed", invert=False)
    return sorted({ord(ch) for piece, _ in split.pre_tokenize_str(big) for ch in piece})


def to_ranges(cps: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for c in cps:
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def write_tables() -> None:
    import tokenizers
    classes = [("Letter", r"\p{L}"), ("Number", r"\p{N}"), ("Space", r"\s")]
    rows = []
    seen: dict[int, str] = {}
    for name, cls in classes:
        members = onig_members(cls)
        for c in members:
            assert c not in seen, f"U+{c:04X} in both {seen[c]} and {name}"
            seen[c] = name
        rows += [(a, b, name) for a, b in to_ranges(members) if b >= 0x80]
    rows.sort()
    ascii_cls = []
    for c in range(0x80):
        ascii_cls.append(seen.get(c, "Other"))
    lines = [
        "//! Generated by `tools/reference/tokenizer_fixtures.py tables` -- do not edit.",
        "//!",
        f"//! Members of `\\p{{L}}`, `\\p{{N}}` and `\\s` as HF `tokenizers` {tokenizers.__version__}",
        "//! (Oniguruma) sees them, probed code point by code point.",
        "",
        "use super::pretokenize::Class;",
        "",
        "/// Class of each ASCII byte.",
        "#[rustfmt::skip]",
        "pub(crate) static ASCII: [Class; 128] = [",
    ]
    for i in range(0, 128, 8):
        lines.append("    " + " ".join(f"Class::{c}," for c in ascii_cls[i:i + 8]))
    lines += [
        "];",
        "",
        "/// Sorted, disjoint inclusive ranges of non-ASCII code points; everything not listed",
        "/// is `Class::Other`.",
        "#[rustfmt::skip]",
        f"pub(crate) static RANGES: [(u32, u32, Class); {len(rows)}] = [",
    ]
    for a, b, name in rows:
        lines.append(f"    (0x{max(a, 0x80):05X}, 0x{b:05X}, Class::{name}),")
    lines += ["];", ""]
    TABLES_RS.write_text("\n".join(lines))
    print("wrote", TABLES_RS, len(rows), "ranges")


# ------------------------------------------------------------------------------------------
# Tokenizers
# ------------------------------------------------------------------------------------------

def laguna_pre_tokenizer():
    from tokenizers import Regex, pre_tokenizers
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_LINEBREAKS), behavior="merged_with_next", invert=False),
        pre_tokenizers.Split(Regex(SPLIT_QWEN2), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])


def train(texts: list[str], vocab_size: int, specials: list):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = laguna_pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="〈|EOS|〉 $A", pair="〈|EOS|〉 $A $B", special_tokens=[("〈|EOS|〉", 2)])
    return tok


def corpus_texts() -> tuple[list[str], Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(stdlib / f).read_text(encoding="utf-8") for f in CORPUS_FILES]
    return texts, stdlib


def main_tokenizer():
    from tokenizers import AddedToken
    texts, _ = corpus_texts()
    specials = [AddedToken(t, special=t not in NON_SPECIAL, normalized=False) for t in SPECIAL_TOKENS]
    tok = train(texts, VOCAB_SIZE, specials)
    # BpeTrainer registers all its special_tokens with special=true; restore the flag.
    from tokenizers import Tokenizer
    js = json.loads(tok.to_str())
    for a in js["added_tokens"]:
        a["special"] = a["content"] not in NON_SPECIAL
    tok = Tokenizer.from_str(json.dumps(js))
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t), i)
    return tok


def variant_tokenizer():
    """Small tokenizer exercising added-token flags and ignore_merges."""
    from tokenizers import AddedToken, Tokenizer
    texts, _ = corpus_texts()
    specials = [AddedToken(t, special=t not in NON_SPECIAL, normalized=False) for t in SPECIAL_TOKENS[:3]]
    tok = train(texts[:2], 400, specials)
    tok.add_tokens([
        AddedToken("<mask>", lstrip=True, rstrip=False, special=True, normalized=False),
        AddedToken("[R]", rstrip=True, special=True, normalized=False),
        AddedToken("[LR]", lstrip=True, rstrip=True, special=False, normalized=True),
        AddedToken("word", single_word=True, special=False, normalized=True),
        AddedToken("hello world", special=False, normalized=False),
        AddedToken("<<", special=False, normalized=True),
        AddedToken("<<<", special=False, normalized=False),
        AddedToken("the", special=False, normalized=True),  # already in the model vocab
        AddedToken("ĠĠ", special=False, normalized=False),  # byte-level-looking content
        AddedToken("日本", special=True, normalized=False),
    ])
    js = json.loads(tok.to_str())
    js["model"]["ignore_merges"] = True
    return Tokenizer.from_str(json.dumps(js)), js


# ------------------------------------------------------------------------------------------
# Cases
# ------------------------------------------------------------------------------------------

CASES = {
    "empty": "",
    "prose": "The quick brown fox jumps over the lazy dog. It's what they'll say, and we've "
             "heard it before: \"I'd rather test than guess.\" DON'T SHOUT, WE'RE FINE; I'M "
             "sure YOU'LL agree. 'Re 'sTART 'ſ 'ſt x'ſ",
    "code_python": "def forward(self, x):\n    return self.mlp(x) + x  # residual\n\n\nclass A(B):\n\tpass\n",
    "code_rust": "fn main() {\n    let v: Vec<u32> = (0..10).map(|i| i * 2).collect();\n    println!(\"{v:?}\");\n}\n",
    "cjk": "我想在apple工作1314151天～ 日本語のテキストです。한국어 텍스트입니다. 中文，标点！",
    "emoji": "🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 👍🏽 👨\u200d👩\u200d👧 🇫🇷",
    "digits": "3 33 333 3333 33333 3.3 3..3 3...3 ٣٤٥ ①②③ １２３ Ⅻ ² 0x1F 1e-6 10,000",
    "letters_vs_alphabetic": "हिन्दी ภาษาไทย e\u0301 ǅungla ʰello ℌilbert ꙮ",
    "whitespace_runs": "a    b\t\tc  \t  d   \n   \n\n  e\u3000f\u00a0g\u2028h\u0085i\u000bj\u000ck   ",
    "trailing_spaces": "end   ",
    "leading_spaces": "   start",
    "crlf": "line one\r\nline two\r\n\r\nline four\r\n",
    "lone_cr": "a\rb\r\rc\r\n\rd\r",
    "mixed_breaks": "a\n\r\nb\n\r\r\nc \r\n d\t\n\te\n",
    "only_newlines": "\n\n\n",
    "only_crlf": "\r\n\r\n",
    "specials": "〈|EOS|〉<system>You are helpful.</system>\n<user>Hi <think>x</think></user>\n<assistant><think>\nhmm\n</think>ok</assistant>\n",
    "special_partial": "<think <think>> <<think>> </think </assistant></assistant>x<assistant ><tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>",
    "special_spaces": "  <think>  a  </think>  \n<user>\n",
    "fim": "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "punct": "a.b,c;d:e!f?g (h) [i] {j} <k> \"l\" 'm' `n` ~o@p#q$r%s^t&u*v-w_x+y=z|/\\",
    "long_s_contraction": "it'ſa 'ſx\n'ſ x'ſſ 'Sa",
    "apostrophes": "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D 'x ''s '' 's's",
    "symbols_runs": "------======= ''''''```````\"\"\"\"......!!!!!!?????? -->\n<!-- ->\r\n",
    "long_space_run": " " * 300 + "x" + "\t" * 50 + "\n" * 20,
    "long_word": "a" * 500,
    "chktxt": "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis "
              "concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 "
              "កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български "
              "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? "
              "'M not sure I'll make it, 'D you like some tea? We'Ve a'lL",
    "replacement_char": "bad \ufffd char \ufffd\ufffd",
    "nul_and_controls": "a\x00b\x01c\x1fd\x7fe",
}

# Atoms for random strings: each case is a concatenation of 1..40 of these.
ATOMS = ["a", "Z", "the", "ſ", "é", "e\u0301", "ß", "中", "語", "한", "ि", "ह", "😀", "👍🏽", "\u200d",
         " ", "  ", "\t", "\n", "\r", "\r\n", "\u3000", "\u00a0", "\u2028", "\u0085", "\x0b",
         "'", "'s", "'LL", "'re", "1", "٣", "①", "²", ".", ",", "-", "!", "\"", "<", ">", "/", "_",
         "〈|EOS|〉", "<think>", "</think>", "</assistant>", "<user>", "<think", "EOS|〉", "\ufffd"]

# Byte strings with invalid UTF-8.
BYTE_CASES = {
    "lone_ff": b"abc\xffdef",
    "lone_continuation": b"x\x80\x80y \x80 z",
    "truncated_3byte_before_ascii": b"euro \xe2\x82 sign",
    "truncated_at_end": b"end \xe2\x82",
    "truncated_4byte_at_end": b"emoji \xf0\x9f\x98",
    "overlong": b"\xc0\xaf slash \xe0\x80\xaf",
    "surrogate": b"surrogate \xed\xa0\x80 here",
    "too_big": b"\xf4\x90\x80\x80 and \xf5\x80",
    "invalid_then_letters": b"\xfeabc \xfe\xfe123 \xe2\x82abc",
    "invalid_near_special": b"\xe2\x82<think>\xff</think>\xc3",
    "invalid_and_newlines": b"a\xff\nb\r\n\xff\r\xff",
    "latin1_text": "Ça coûte très cher, señor".encode("latin-1"),
    "mixed_valid": "naïve café 日本 ".encode() + b"\x9c\x9d" + "🚀".encode()[:3] + b" ok",
}


def invalid_ranges(data: bytes) -> tuple[str, list[tuple[int, int]]]:
    """Decode like Python's errors='replace' (one U+FFFD per maximal invalid subpart) and
    return the string with, per character, the byte range it came from."""
    spans: list[tuple[int, int]] = []

    def handler(err: UnicodeDecodeError):
        spans.append((err.start, err.end))
        return ("\ufffd", err.end)

    codecs.register_error("record_spans", handler)
    text = data.decode("utf-8", "record_spans")
    # map characters back to byte ranges
    char_ranges: list[tuple[int, int]] = []
    pos = 0
    it = iter(spans)
    nxt = next(it, None)
    for ch in text:
        if nxt is not None and pos == nxt[0]:
            char_ranges.append(nxt)
            pos = nxt[1]
            nxt = next(it, None)
        else:
            n = len(ch.encode())
            char_ranges.append((pos, pos + n))
            pos += n
    assert pos == len(data)
    return text, char_ranges


def bytelevel(data: bytes) -> str:
    alphabet = bytes_to_unicode()
    return "".join(alphabet[b] for b in data)


def bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def encode_bytes_reference(tok, data: bytes) -> list[int]:
    text, char_ranges = invalid_ranges(data)
    enc = tok.encode(text, add_special_tokens=False)
    invalid_chars = {i for i, (a, b) in enumerate(char_ranges)
                     if text[i] == "\ufffd" and data[a:b] != "\ufffd".encode()}
    # group token indices by word
    words: dict[int, list[int]] = {}
    order: list[int] = []
    for ti, w in enumerate(enc.word_ids):
        assert w is not None
        if w not in words:
            words[w] = []
            order.append(w)
        words[w].append(ti)
    ids: list[int] = []
    for w in order:
        tis = words[w]
        c0 = min(enc.offsets[t][0] for t in tis)
        c1 = max(enc.offsets[t][1] for t in tis)
        if any(c in invalid_chars for c in range(c0, c1)):
            raw = data[char_ranges[c0][0]:char_ranges[c1 - 1][1]]
            ids += [t.id for t in tok.model.tokenize(bytelevel(raw))]
        else:
            ids += [enc.ids[t] for t in tis]
    return ids


def piece_ends(pre_tokenizer, text: str) -> list[int]:
    """Byte offsets where the pre-tokenizer's pieces end (no added-token matching)."""
    byte_at = [0]
    for ch in text:
        byte_at.append(byte_at[-1] + len(ch.encode()))
    return [byte_at[end] for _, (_, end) in pre_tokenizer.pre_tokenize_str(text)]


def record_cases(tok, texts: dict[str, str]) -> list[dict]:
    out = []
    for name, text in texts.items():
        enc = tok.encode(text, add_special_tokens=False)
        with_bos = tok.encode(text, add_special_tokens=True).ids
        decoded = tok.decode(enc.ids, skip_special_tokens=False)
        out.append({"name": name, "text": text, "ids": enc.ids, "ids_with_special": with_bos,
                    "decoded": decoded, "piece_ends": piece_ends(tok.pre_tokenizer, text)})
    return out


def random_cases(n: int, seed: int) -> dict[str, str]:
    rng = random.Random(seed)
    return {f"random_{i}": "".join(rng.choice(ATOMS) for _ in range(rng.randint(1, 40))) for i in range(n)}


def write_gguf(hf_dir: Path, out: Path, vocab_size: int) -> None:
    """The tokenizer part of llama.cpp's convert_hf_to_gguf.py for Laguna."""
    sys.path.insert(0, str(LLAMA_CPP_DIR))
    sys.path.insert(0, str(LLAMA_CPP_DIR / "gguf-py"))
    import gguf
    from conversion.laguna import LagunaModel

    model = object.__new__(LagunaModel)
    model.dir_model = hf_dir
    model.hparams = {"vocab_size": vocab_size, "bos_token_id": 2, "eos_token_id": [2, 24]}
    model.gguf_writer = gguf.GGUFWriter(str(out), "laguna")
    LagunaModel.get_vocab_base_pre = lambda self, tokenizer: "laguna"  # fresh vocab: unknown hash
    model.set_vocab()
    w = model.gguf_writer
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_fixtures() -> None:
    import tokenizers
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    tok = main_tokenizer()
    tok.save(str(OUT_DIR / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "〈|EOS|〉", "eos_token": "〈|EOS|〉", "pad_token": "<pad>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False, "clean_up_tokenization_spaces": False,
    }
    (OUT_DIR / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    write_gguf(OUT_DIR, OUT_DIR / "tokenizer.gguf", tok.get_vocab_size())

    texts = dict(CASES)
    texts.update(random_cases(400, seed=7))
    # a larger unseen text: the start of a stdlib module that is not in the training corpus
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts["stdlib_shlex"] = (stdlib / "shlex.py").read_text(encoding="utf-8")[:6000]
    cases = record_cases(tok, texts)

    byte_cases = []
    for name, data in BYTE_CASES.items():
        lossy = data.decode("utf-8", "replace")
        byte_cases.append({
            "name": name, "bytes_hex": data.hex(), "ids": encode_bytes_reference(tok, data),
            "lossy_text": lossy, "lossy_ids": tok.encode(lossy, add_special_tokens=False).ids,
        })
    # sanity: on valid UTF-8 the byte-case reference equals plain HF encoding
    for c in cases[:40]:
        assert encode_bytes_reference(tok, c["text"].encode()) == c["ids"], c["name"]

    var, var_json = variant_tokenizer()
    (OUT_DIR / "variant.json").write_text(json.dumps(var_json, ensure_ascii=False))
    var_texts = {
        "lstrip": "a   <mask> b<mask>   c \t<mask>",
        "rstrip": "x[R]   y [R]\n\nz[R]",
        "lrstrip": "p  [LR]  q[LR][LR]  ",
        "single_word": "word words sword a word. _word word_ (word) wordy 1word word1 日本word",
        "with_space": "say hello world and hello  world hello worldly",
        "nested": "<<< << <<<< <<<<< <",
        "in_vocab": "the theme bathe the",
        "bytelevel_like": "ĠĠ  ĠĠĠ Ġ",
        "cjk_special": "日本語 日本",
        "mix": "〈|EOS|〉word<mask>[R] the <<<word>>> hello world",
        "ignore_merges": "the quick brown fox; def return self.mlp(x)",
    }
    var_cases = record_cases(var, var_texts)

    doc = {
        "generated_by": "tools/reference/tokenizer_fixtures.py fixtures",
        "tokenizers_version": tokenizers.__version__,
        "python": sys.version.split()[0],
        "corpus": [f"CPython {sys.version.split()[0]} stdlib: {f}" for f in CORPUS_FILES],
        "vocab_size": tok.get_vocab_size(),
        "invalid_utf8_note": __doc__.split("Invalid UTF-8:")[1].strip(),
        "cases": cases,
        "byte_cases": byte_cases,
        "variant_cases": var_cases,
    }
    (OUT_DIR / "cases.json").write_text(json.dumps(doc, ensure_ascii=False, indent=0) + "\n")
    for p in sorted(OUT_DIR.iterdir()):
        print(p.name, p.stat().st_size)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["tables", "fixtures"])
    a = ap.parse_args()
    if a.what == "tables":
        write_tables()
    else:
        write_fixtures()
