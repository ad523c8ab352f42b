#!/usr/bin/env python3
"""Generates the IQ / FP4 lookup tables under core/src/quant/tables/ from ggml's data.

    /work/venv/ref/bin/python tools/reference/gen_iq_tables.py          # write the files
    /work/venv/ref/bin/python tools/reference/gen_iq_tables.py --check  # compare only

Only the *data* of the tables is taken (spec/formats.md §3.12): the integer lists between
`GGML_TABLE_BEGIN(type, name, size)` and `GGML_TABLE_END()` in ggml's
`ggml/src/ggml-common.h`. No code is copied. Every table is then checked three ways before
anything is written:

1. against gguf-py's independent copy (`gguf/quants.py`: the grids stored as `grid_map`
   plus a hex string of small indices, `IQ2_XXS.ksigns`, `IQ4_NL.kvalues`,
   `MXFP4.kvalues`), expanded with gguf-py's own `init_grid`;
2. against the SHA-256 of its little-endian byte dump listed in spec §3.12 (SPEC_SHA256);
3. against the structural facts in the spec (ksigns parity rule, kmask = 1 << j, the set
   of byte values each grid uses).

Sources (the llama.cpp tree vendored in llama-cpp-python 0.3.36, llama.cpp commit
0c1e570, gguf-py 0.19.0), overridable with LLAMA_CPP_DIR.
"""

import hashlib
import os
import re
import sys
import textwrap
from pathlib import Path

import numpy as np

LLAMA_CPP_DIR = Path(os.environ.get(
    "LLAMA_CPP_DIR", "/work/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp"))
HEADER = LLAMA_CPP_DIR / "ggml" / "src" / "ggml-common.h"
SOURCE_NOTE = ["llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36),",
               "`ggml/src/ggml-common.h`"]
OUT = Path(__file__).resolve().parents[2] / "core" / "src" / "quant" / "tables"

# SHA-256 of each table's little-endian byte dump, from spec/formats.md §3.12 (computed there
# from ggml commit d99724f; the tables are unchanged between the two commits).
SPEC_SHA256 = {
    "kvalues_iq4nl": "61aa47540aa024b5d6ddaa839b84ffe59f3d5a349af5c6c7ffcb5e0474b46163",
    "kmask_iq2xs": "5ac9831b2e30eb285ef34f8501620f878432d5c04331ad1ae47f977a83ba41a5",
    "ksigns_iq2xs": "a76742a603f8beca5212ecce0f1f02f11a4887fd2f7c8b15aca0ea3eb3380c31",
    "iq2xxs_grid": "05826b5d3e472a3a78f196be62ac78acf81df0f909626e12ab9fa2a5d490dd54",
    "iq2xs_grid": "06e47aaca60b4dc1d9b5a3f34540437058a6b142b4d7a59d5ded769b4d1bf1de",
    "iq2s_grid": "e1aa1473412b0552c2174c30ef22ab4073f6a181b85a17056e8249bd2932fd88",
    "iq3xxs_grid": "46e35f5a997efdee6c99ce57854c8a0d4f0ff8ca57e5e8a60c0793ea580acf5d",
    "iq3s_grid": "bd1af4945a1717c65610b0284e4628b9a1ba3b306fae3a06f6e5f597356e349f",
    "iq1s_grid": "07540ffc1aeaf6ad4d97e96b0fcc765aae39671d4ae4a27bbd0e796fde167c6a",
}
# kvalues_fp4 is not in the spec's hash table (its values are listed in §3.0); its hash is
# recorded in core/tests/fixtures/quant/README.md from this script's output.
EXTRA = ["kvalues_fp4"]

C_TYPES = {  # C element type -> (numpy little-endian dtype, Rust type, hex digits or None)
    "uint8_t": ("u1", "u8", None),
    "int8_t": ("i1", "i8", None),
    "uint32_t": ("<u4", "u32", 8),
    "uint64_t": ("<u8", "u64", 16),
}

# Rust file -> tables it holds (one file per IQ family; tables/mod.rs is hand-written).
FILES = {
    "kvalues.rs": ["kvalues_iq4nl", "kvalues_fp4"],
    "iq2.rs": ["kmask_iq2xs", "ksigns_iq2xs", "iq2xxs_grid", "iq2xs_grid", "iq2s_grid"],
    "iq3.rs": ["iq3xxs_grid", "iq3s_grid"],
    "iq1.rs": ["iq1s_grid"],
}

DOCS = {  # one doc comment per table, wrapped by rust_table
    "kvalues_iq4nl": "IQ4_NL / IQ4_XS non-linear 4-bit codebook (`kvalues_iq4nl`), indexed "
                     "by nibble.",
    "kvalues_fp4": "E2M1 values, doubled (`kvalues_fp4` = `kvalues_mxfp4`): bit 3 is the sign, "
                   "bits 0-2 index {0, 0.5, 1, 1.5, 2, 3, 4, 6} times 2. Used with a halved "
                   "E8M0 scale.",
    "kmask_iq2xs": "`kmask_iq2xs[j] = 1 << j`: the sign bit of weight j in a sign byte.",
    "ksigns_iq2xs": "7-bit sign index -> 8 sign bits (bit j set = weight j negative). Bit 7 is "
                    "the parity of bits 0-6, so the number of negatives is even "
                    "(`ksigns_iq2xs`).",
    "iq2xxs_grid": "IQ2_XXS codebook: 256 points of 8 magnitudes in {8, 25, 43}, byte j = "
                   "weight j.",
    "iq2xs_grid": "IQ2_XS codebook: 512 points of 8 magnitudes in {8, 25, 43}, byte j = "
                  "weight j.",
    "iq2s_grid": "IQ2_S codebook: 1024 points of 8 magnitudes in {8, 25, 43}, byte j = "
                 "weight j.",
    "iq3xxs_grid": "IQ3_XXS codebook: 256 points of 4 magnitudes in {4, 12, .., 52, 62}, "
                   "byte j = weight j.",
    "iq3s_grid": "IQ3_S codebook: 512 points of 4 odd magnitudes 1..15, byte j = weight j.",
    "iq1s_grid": "IQ1_S / IQ1_M codebook: 2048 points of 8 values in {-1, 0, 1}; byte j, read "
                 "as i8, is weight j (0xff = -1).",
}


def parse_header(text):
    """name -> (C type, list of ints) for every GGML_TABLE_BEGIN ... GGML_TABLE_END()."""
    defines = dict(re.findall(r"^#define\s+(\w+)\s+(\d+)\s*$", text, re.M))
    tables = {}
    pat = re.compile(r"^GGML_TABLE_BEGIN\((\w+),\s*(\w+),\s*(\w+)\)\s*$(.*?)^GGML_TABLE_END\(\)",
                     re.M | re.S)
    for ctype, name, size, body in pat.findall(text):
        body = re.sub(r"//[^\n]*", "", body)
        values = [int(tok, 0) for tok in re.split(r"[,\s]+", body) if tok]
        n = int(defines.get(size, size))
        assert len(values) == n, f"{name}: {len(values)} values, declared {n}"
        assert name not in tables, f"{name} defined twice"
        tables[name] = (ctype, values)
    return tables


def le_bytes(ctype, values):
    dtype = C_TYPES[ctype][0]
    return np.array(values, dtype=np.int64 if dtype == "i1" else np.uint64).astype(dtype).tobytes()


def check_gguf_py(tables):
    """Compares each table with gguf-py's independently stored copy."""
    from gguf import quants as q

    def grid_bytes(cls, signed):
        cls.init_grid()
        g = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
        assert np.all(g == np.round(g)), cls.__name__
        return g.astype(np.int8 if signed else np.uint8).tobytes()

    pairs = {
        "iq2xxs_grid": grid_bytes(q.IQ2_XXS, False),
        "iq2xs_grid": grid_bytes(q.IQ2_XS, False),
        "iq2s_grid": grid_bytes(q.IQ2_S, False),
        "iq3xxs_grid": grid_bytes(q.IQ3_XXS, False),
        "iq3s_grid": grid_bytes(q.IQ3_S, False),
        "iq1s_grid": grid_bytes(q.IQ1_S, True),
        "ksigns_iq2xs": bytes(q.IQ2_XXS.ksigns),
        "kvalues_iq4nl": np.array(q.IQ4_NL.kvalues, dtype=np.int8).tobytes(),
        "kvalues_fp4": np.array(q.MXFP4.kvalues, dtype=np.int8).tobytes(),
    }
    assert q.IQ1_M.grid_hex == q.IQ1_S.grid_hex
    for name, want in pairs.items():
        got = le_bytes(*tables[name])
        assert got == want, f"{name}: ggml-common.h and gguf-py disagree"


def check_structure(tables):
    ksigns = tables["ksigns_iq2xs"][1]
    assert ksigns == [i | (0x80 if bin(i).count("1") % 2 else 0) for i in range(128)]
    assert tables["kmask_iq2xs"][1] == [1 << j for j in range(8)]
    assert tables["kvalues_fp4"][1] == [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
    byte_sets = {
        "iq2xxs_grid": {8, 25, 43}, "iq2xs_grid": {8, 25, 43}, "iq2s_grid": {8, 25, 43},
        "iq3xxs_grid": {4, 12, 20, 28, 36, 44, 52, 62}, "iq3s_grid": set(range(1, 16, 2)),
        "iq1s_grid": {0x00, 0x01, 0xFF},
    }
    for name, allowed in byte_sets.items():
        used = set(le_bytes(*tables[name]))
        assert used == allowed, f"{name}: bytes {sorted(used)}"
        ctype, values = tables[name]
        assert len(set(values)) == len(values), f"{name}: duplicate grid points"


def sha256s(tables):
    return {name: hashlib.sha256(le_bytes(*tables[name])).hexdigest()
            for name in list(SPEC_SHA256) + EXTRA}


def rust_table(name, ctype, values):
    rtype, hex_digits = C_TYPES[ctype][1], C_TYPES[ctype][2]
    if hex_digits:
        per_line = 4 if hex_digits == 16 else 8
        items = [f"0x{v:0{hex_digits}x}" for v in values]
    else:
        per_line = 16
        items = [str(v) for v in values]
    lines = ["    " + ", ".join(items[i:i + per_line]) + ","
             for i in range(0, len(items), per_line)]
    doc = "".join(f"/// {line}\n" for line in textwrap.wrap(DOCS[name], 92))
    return (f"{doc}#[rustfmt::skip]\n"
            f"pub static {name.upper()}: [{rtype}; {len(values)}] = [\n"
            + "\n".join(lines) + "\n];\n")


def render(file_name, names, tables, hashes):
    head = [
        "//! @generated by tools/reference/gen_iq_tables.py; do not edit, rerun the script.",
        "//!",
        f"//! Data tables only, read from {SOURCE_NOTE[0]}",
        f"//! {SOURCE_NOTE[1]}, and checked against gguf-py 0.19.0 `gguf/quants.py`.",
        "//! SHA-256 of the little-endian bytes (checked by core/tests/quant_ggml.rs):",
    ]
    head += [f"//! * `{n}`: `{hashes[n]}`" for n in names]
    return "\n".join(head) + "\n\n" + "\n".join(rust_table(n, *tables[n]) for n in names)


def main():
    check_only = "--check" in sys.argv[1:]
    tables = parse_header(HEADER.read_text())
    check_gguf_py(tables)
    check_structure(tables)
    hashes = sha256s(tables)
    for name, want in SPEC_SHA256.items():
        assert hashes[name] == want, f"{name}: sha256 {hashes[name]} != spec {want}"
    stale = []
    for file_name, names in FILES.items():
        text = render(file_name, names, tables, hashes)
        path = OUT / file_name
        if check_only:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            OUT.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for name in list(SPEC_SHA256) + EXTRA:
        print(f"{name:14s} {hashes[name]}")
    if stale:
        sys.exit("stale (rerun without --check): " + ", ".join(stale))


if __name__ == "__main__":
    main()
