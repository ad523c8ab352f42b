#!/usr/bin/env python3
"""Writes the ggml quant-block oracle fixtures under core/tests/fixtures/quant/.

    /work/venv/ref/bin/python tools/reference/quant_fixtures.py

Oracle: gguf-py's numpy codecs (`gguf.quants.dequantize` / `quantize`), which match
libggml bit for bit. Generated with:
    gguf-py 0.19.0 (editable, llama.cpp 0c1e570 vendored in llama-cpp-python 0.3.36)
    numpy 2.4.6, Python 3.11.7
The script refuses to run under other versions unless QUANT_FIXTURES_ANY_VERSION=1, so a
regenerated fixture never silently comes from a different oracle.

For each ggml type `<t>` it writes
    <t>.blocks  raw blocks, exactly as they sit in a GGUF data section
    <t>.f32     gguf-py's dequantisation of those blocks, little-endian f32
Blocks are random bytes (fixed seed) with the fp16 scale fields overwritten by finite,
moderate values, plus edge-case blocks at fixed indices (see EDGE_CASES); the last block
has non-finite scales on purpose so NaN/Inf propagation is compared too.

Also writes f16/bf16 fixtures (selected bit patterns and their f32 values) and
q8_0_quant.{f32,blocks}: activation rows and gguf-py's Q8_0 quantisation of them.
"""

import os
import sys
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, np_roundf, quantize

EXPECTED = {"gguf": "0.19.0", "numpy": "2.4.6"}
SEED = 0x1A600
OUT = Path(__file__).resolve().parents[2] / "core" / "tests" / "fixtures" / "quant"

# name -> (type, byte offsets of the fp16 scale fields, number of blocks)
# Offsets mirror ggml-common.h (and core/src/quant/*.rs): e.g. Q2_K keeps d, dmin at the end.
TYPES = {
    "q4_0": (T.Q4_0, [0], 48),
    "q4_1": (T.Q4_1, [0, 2], 48),
    "q5_0": (T.Q5_0, [0], 48),
    "q5_1": (T.Q5_1, [0, 2], 48),
    "q8_0": (T.Q8_0, [0], 48),
    "q2_k": (T.Q2_K, [80, 82], 16),
    "q3_k": (T.Q3_K, [108], 16),
    "q4_k": (T.Q4_K, [0, 2], 16),
    "q5_k": (T.Q5_K, [0, 2], 16),
    "q6_k": (T.Q6_K, [208], 16),
}

# Edge-case blocks, by index: each is (fp16 bits for every scale field or None, fill byte for
# all non-scale bytes or None).
EDGE_CASES = {
    0: (0x0000, None),  # zero scale: outputs are +0/-0, which catches operation-order slips
    1: ("neg", None),  # negative scales
    2: (None, 0xFF),  # max nibbles / max 6-bit scales and mins / all high bits set
    3: (None, 0x00),  # min nibbles (most negative quants for the signed types)
    4: (0x0001, None),  # smallest fp16 subnormal
    5: (0x03FF, 0xFF),  # largest fp16 subnormal with max quants
    6: (0x7BFF, 0xFF),  # largest finite fp16 (65504) with max quants
    7: (0x8000, None),  # negative zero
}


def check_versions():
    got = {"gguf": gguf_version(), "numpy": np.__version__}
    if got != EXPECTED and os.environ.get("QUANT_FIXTURES_ANY_VERSION") != "1":
        sys.exit(f"oracle versions {got} differ from {EXPECTED}; update the header, README "
                 "and EXPECTED, or set QUANT_FIXTURES_ANY_VERSION=1")


def gguf_version():
    from importlib.metadata import version
    return version("gguf")


def random_scales(rng, n):
    """Finite fp16 bits of magnitude 2^-12..2^2, either sign."""
    mag = np.exp2(rng.uniform(-12.0, 2.0, n))
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return (sign * mag).astype(np.float16).view(np.uint16)


def make_blocks(rng, type_size, scale_offsets, n_blocks):
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    scales = random_scales(rng, n_blocks * len(scale_offsets)).reshape(n_blocks, -1)
    for i, (bits, fill) in EDGE_CASES.items():
        if fill is not None:
            blocks[i, :] = fill
        if bits == "neg":
            scales[i] |= 0x8000
        elif bits is not None:
            scales[i] = bits
    scales[-1, 0] = 0x7C00  # +inf
    if len(scale_offsets) > 1:
        scales[-1, 1] = 0xFE00  # NaN
    for k, off in enumerate(scale_offsets):
        blocks[:, off:off + 2] = scales[:, k:k + 1].astype("<u2").view(np.uint8)
    return blocks


def write(name, blocks_bytes, values):
    (OUT / f"{name}.blocks").write_bytes(blocks_bytes)
    (OUT / f"{name}.f32").write_bytes(np.ascontiguousarray(values, dtype="<f4").tobytes())


def quant_types(rng):
    for name, (qtype, offsets, n_blocks) in TYPES.items():
        block_elems, type_size = gguf.GGML_QUANT_SIZES[qtype]
        blocks = make_blocks(rng, type_size, offsets, n_blocks)
        with np.errstate(all="ignore"):
            y = dequantize(blocks.reshape(1, -1), qtype).reshape(-1)
        assert y.size == n_blocks * block_elems
        write(name, blocks.tobytes(), y)


def float_types(rng):
    special = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00,
                        0x3555, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFFFF,
                        0x3F80, 0xC000, 0x7F80, 0xFF80, 0x7FC0, 0x0080, 0x007F],
                       dtype=np.uint16)
    bits = np.concatenate([special, rng.integers(0, 1 << 16, 256 - special.size,
                                                 dtype=np.uint16)])
    raw = bits.astype("<u2").view(np.uint8)
    for name, qtype in (("f16", T.F16), ("bf16", T.BF16)):
        with np.errstate(all="ignore"):
            y = dequantize(raw.reshape(1, -1), qtype).reshape(-1)
        write(name, raw.tobytes(), y)


def q8_0_activation_rows(rng):
    """Rows of 32-element blocks for quantize_row_q8_0, edge cases first."""
    b = []
    b.append(np.zeros(32))  # d = 0, id = 0
    b.append(np.concatenate([[127.0], np.arange(31) - 15.5]))  # d = 1: exact .5 ties
    b.append(np.concatenate([[-127.0], -(np.arange(31) + 0.5)]))  # negative max, ties
    b.append(rng.standard_normal(32) * 1e-4)  # d is an fp16 subnormal
    b.append(rng.standard_normal(32) * 1e7)  # d overflows fp16 to inf
    b.append(np.where(np.arange(32) == 17, -3.7, 0.0))  # a single non-zero
    b.append(np.full(32, 1e-30))  # d rounds to fp16 zero while id = 1/d stays finite
    b.append(rng.standard_normal(32) * np.where(rng.random(32) < 0.1, 1000.0, 1.0))  # outliers
    b.extend(id_sensitive_blocks(rng, 4))
    while len(b) < 32:
        b.append(rng.standard_normal(32) * 10.0 ** rng.uniform(-4, 4))
    x = np.concatenate(b).astype(np.float32).reshape(4, -1)  # 4 rows of 8 blocks
    with np.errstate(all="ignore"):
        q = quantize(x, T.Q8_0)
    (OUT / "q8_0_quant.f32").write_bytes(x.astype("<f4").tobytes())
    (OUT / "q8_0_quant.blocks").write_bytes(q.tobytes())


def id_sensitive_blocks(rng, n):
    """Blocks whose quants differ between ggml's `roundf(x * (1/d))` and `roundf(x / d)`:
    values one ulp around (k + 0.5) * d, where the rounding of 1/d tips the tie."""
    out = []
    while len(out) < n:
        amax = np.float32(rng.uniform(0.5, 100.0))
        d = amax / np.float32(127)
        xs = ((np.arange(127, dtype=np.float32) + np.float32(0.5)) * d).astype(np.float32)
        cand = np.concatenate([xs, np.nextafter(xs, np.float32(np.inf)),
                               np.nextafter(xs, np.float32(0))])
        q_mul = np_roundf(cand * (np.float32(1) / d))
        q_div = np_roundf(cand / d)
        hits = cand[q_mul != q_div]
        if hits.size >= 8:
            vals = rng.choice(hits, 31) * np.where(rng.random(31) < 0.5, -1, 1)
            out.append(np.concatenate([[amax], vals]).astype(np.float32))
    return out


def main():
    check_versions()
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    quant_types(rng)
    float_types(rng)
    q8_0_activation_rows(rng)
    for p in sorted(OUT.iterdir()):
        print(f"{p.stat().st_size:7d}  {p.name}")


if __name__ == "__main__":
    main()
