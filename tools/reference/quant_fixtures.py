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

The IQ, ternary and MXFP4 types (IQ_TYPES) get the same random-block fixtures from a second
generator (seed SEED + 1, so the files above stay byte-identical), and also
`<t>_llama.{blocks,f32}`: the first rows of a tensor that llama.cpp's own quantiser
(`llama_model_quantize` of llama-cpp-python, with an importance matrix) wrote into a GGUF,
and gguf-py's dequantisation of them (TQ1_0/TQ2_0 quantise a model of near-ternary
weights). Every `.f32` of those types is also compared with libggml's `to_float` (the built
library shipped with llama-cpp-python) before it is written.
"""

import ctypes
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, np_roundf, quantize

EXPECTED = {"gguf": "0.19.0", "numpy": "2.4.6", "llama_cpp": "0.3.36"}
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
    import llama_cpp
    got = {"gguf": gguf_version(), "numpy": np.__version__, "llama_cpp": llama_cpp.__version__}
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


def make_blocks(rng, type_size, scale_offsets, n_blocks, pack=None):
    """Random blocks with edge cases; `pack(blocks, scales)` replaces the default writing
    of each fp16 scale column k at byte offset `scale_offsets[k]`."""
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
    if pack is not None:
        pack(blocks, scales)
        return blocks
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


# --- IQ, ternary and MXFP4 types -----------------------------------------------------------

def pack_iq1_m(blocks, scales):
    """IQ1_M has no d field: the fp16 bits go, a nibble each, into the top nibbles of the
    four u16 scale words at bytes 48..56 (nibble k into word k)."""
    words = blocks[:, 48:56].copy().view("<u2")
    bits = scales[:, 0].astype(np.uint16).reshape(-1, 1)
    nibbles = (bits >> np.array([0, 4, 8, 12], dtype=np.uint16)) & np.uint16(0xF)
    words = (words & np.uint16(0x0FFF)) | (nibbles << np.uint16(12))
    blocks[:, 48:56] = words.astype("<u2").view(np.uint8)


def make_mxfp4_blocks(rng, n_blocks):
    """MXFP4 has an E8M0 scale byte, never non-finite itself: random exponents near 127,
    edge blocks with the extremes (e = 0, 1: f32 subnormals; 254, 255: products overflow to
    inf, and ggml gives 2^127 for 255 rather than NaN)."""
    blocks = rng.integers(0, 256, size=(n_blocks, 17), dtype=np.uint8)
    blocks[:, 0] = rng.integers(112, 142, size=n_blocks, dtype=np.uint8)
    edges = {0: (0, None), 1: (1, 0xFF), 2: (2, None), 3: (127, 0xFF), 4: (128, 0x00),
             5: (254, 0xFF), 6: (255, None), 7: (126, 0x77)}
    for i, (e, fill) in edges.items():
        if fill is not None:
            blocks[i, 1:] = fill
        blocks[i, 0] = e
    blocks[-1, 0] = 255
    return blocks


# name -> (type, fp16 scale offsets, blocks, packer, llama.cpp ftype for `<t>_llama`)
IQ_TYPES = {
    "iq2_xxs": (T.IQ2_XXS, [0], 32, None, gguf.LlamaFileType.MOSTLY_IQ2_XXS),
    "iq2_xs": (T.IQ2_XS, [0], 32, None, gguf.LlamaFileType.MOSTLY_IQ2_XS),
    "iq2_s": (T.IQ2_S, [0], 32, None, gguf.LlamaFileType.MOSTLY_IQ2_M),  # IQ2_M's base type
    "iq3_xxs": (T.IQ3_XXS, [0], 32, None, gguf.LlamaFileType.MOSTLY_IQ3_XXS),
    "iq3_s": (T.IQ3_S, [0], 32, None, gguf.LlamaFileType.MOSTLY_IQ3_S),
    "iq1_s": (T.IQ1_S, [0], 32, None, gguf.LlamaFileType.MOSTLY_IQ1_S),
    "iq1_m": (T.IQ1_M, [0], 32, pack_iq1_m, gguf.LlamaFileType.MOSTLY_IQ1_M),
    "iq4_nl": (T.IQ4_NL, [0], 48, None, gguf.LlamaFileType.MOSTLY_IQ4_NL),
    "iq4_xs": (T.IQ4_XS, [0], 32, None, gguf.LlamaFileType.MOSTLY_IQ4_XS),
    "tq1_0": (T.TQ1_0, [52], 32, None, gguf.LlamaFileType.MOSTLY_TQ1_0),
    "tq2_0": (T.TQ2_0, [64], 32, None, gguf.LlamaFileType.MOSTLY_TQ2_0),
    "mxfp4": (T.MXFP4, None, 48, None, gguf.LlamaFileType.MOSTLY_MXFP4_MOE),
}


class Libggml:
    """libggml's own row decoders (`ggml_get_type_traits(t)->to_float`), a second oracle."""

    class Traits(ctypes.Structure):
        _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                    ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                    ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                    ("from_float_ref", ctypes.c_void_p)]

    TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)

    def __init__(self):
        import llama_cpp
        lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
        lib.ggml_get_type_traits.restype = ctypes.POINTER(self.Traits)
        lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
        self.lib = lib

    def dequantize(self, qtype, blocks):
        traits = self.lib.ggml_get_type_traits(int(qtype)).contents
        block_elems, type_size = gguf.GGML_QUANT_SIZES[qtype]
        assert (traits.blck_size, traits.type_size) == (block_elems, type_size), qtype.name
        src = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1)
        y = np.empty(src.size // type_size * block_elems, dtype=np.float32)
        self.TO_FLOAT(traits.to_float)(src.ctypes.data, y.ctypes.data, y.size)
        return y


def same_bits(a, b):
    """Bit-exact, any NaN equal to any NaN (payloads differ between conversions)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and bool(np.all((a.view(np.uint32) == b.view(np.uint32))
                                              | (np.isnan(a) & np.isnan(b))))


def checked_dequantize(ggml, blocks, qtype, what):
    with np.errstate(all="ignore"):
        y = dequantize(blocks.reshape(1, -1), qtype).reshape(-1)
    assert same_bits(y, ggml.dequantize(qtype, blocks)), f"{what}: gguf-py != libggml"
    return y


def iq_types(rng, ggml):
    for name, (qtype, offsets, n_blocks, pack, _) in IQ_TYPES.items():
        block_elems, type_size = gguf.GGML_QUANT_SIZES[qtype]
        if qtype == T.MXFP4:
            blocks = make_mxfp4_blocks(rng, n_blocks)
        else:
            blocks = make_blocks(rng, type_size, offsets, n_blocks, pack)
        y = checked_dequantize(ggml, blocks, qtype, name)
        assert y.size == n_blocks * block_elems
        write(name, blocks.tobytes(), y)


# A one-layer llama-architecture model, big enough for every block size; llama.cpp's
# quantiser only needs the hyperparameters and the tensors.
LLAMA_H, LLAMA_FF, LLAMA_VOCAB = 256, 512, 64
LLAMA_TENSOR = "blk.0.ffn_down.weight"  # 512 inputs (2 super-blocks) per row
LLAMA_ROWS = 8  # rows of LLAMA_TENSOR kept per type


def write_f32_llama(path, rng, ternary=False):
    """The model and a per-tensor importance matrix (column weights, name -> f32[ne0]).
    `ternary`: weights near {-1, 0, 1} times a row gain, so that TQ1_0/TQ2_0 (which round
    x / amax) keep most of them non-zero."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(128)
    w.add_embedding_length(LLAMA_H)
    w.add_block_count(1)
    w.add_feed_forward_length(LLAMA_FF)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(LLAMA_H // 2)
    w.add_vocab_size(LLAMA_VOCAB)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    imatrix = {}

    def matrix(name, rows, cols):
        # heavy-tailed weights, per-row gains over two decades, a few outlier columns
        if ternary:
            x = rng.integers(-1, 2, size=(rows, cols)).astype(np.float64)
            x *= 1.0 + 0.1 * rng.standard_normal((rows, cols))
            x *= 0.02 * np.exp2(rng.uniform(-3.0, 3.0, size=(rows, 1)))
        else:
            x = rng.standard_t(4, size=(rows, cols)) * 0.02
            x *= np.exp2(rng.uniform(-3.0, 3.0, size=(rows, 1)))
            x[:, rng.choice(cols, 4, replace=False)] *= 8.0
        w.add_tensor(name, x.astype(np.float32))
        imatrix[name] = (rng.gamma(2.0, 1.0, cols) + 1e-3).astype(np.float32)

    ones = np.ones(LLAMA_H, np.float32)
    matrix("token_embd.weight", LLAMA_VOCAB, LLAMA_H)
    w.add_tensor("output_norm.weight", ones)
    matrix("output.weight", LLAMA_VOCAB, LLAMA_H)
    w.add_tensor("blk.0.attn_norm.weight", ones)
    w.add_tensor("blk.0.ffn_norm.weight", ones)
    for n in ("q", "k", "v", "output"):
        matrix(f"blk.0.attn_{n}.weight", LLAMA_H, LLAMA_H)
    matrix("blk.0.ffn_gate.weight", LLAMA_FF, LLAMA_H)
    matrix("blk.0.ffn_up.weight", LLAMA_FF, LLAMA_H)
    matrix(LLAMA_TENSOR, LLAMA_H, LLAMA_FF)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return imatrix


def llama_quantize(src, dst, ftype, imatrix):
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = int(ftype)
    params.pure = True  # every quantisable tensor gets the ftype's base type
    params.nthread = 2
    entries = (llama_cpp.llama_model_imatrix_data * (len(imatrix) + 1))()
    for e, (name, data) in zip(entries, imatrix.items()):
        e.name = name.encode()
        e.data = data.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        e.size = data.size
    entries[len(imatrix)].name = None
    params.imatrix = ctypes.cast(entries, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(),
                                        ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize to {ftype.name} failed ({rc})")


def llama_types(rng, ggml):
    import llama_cpp
    silent = llama_cpp.llama_log_callback(lambda level, text, user: None)
    llama_cpp.llama_log_set(silent, None)
    with tempfile.TemporaryDirectory() as tmp:
        models = {}
        for ternary in (False, True):
            src = Path(tmp) / f"f32{'-ternary' if ternary else ''}.gguf"
            models[ternary] = (src, write_f32_llama(src, rng, ternary))
        for name, (qtype, _, _, _, ftype) in IQ_TYPES.items():
            src, imatrix = models[qtype in (T.TQ1_0, T.TQ2_0)]
            dst = Path(tmp) / f"{name}.gguf"
            llama_quantize(src, dst, ftype, imatrix)
            tensor = next(t for t in gguf.GGUFReader(dst).tensors if t.name == LLAMA_TENSOR)
            assert tensor.tensor_type == qtype, f"{name}: got {tensor.tensor_type.name}"
            blocks = np.array(tensor.data[:LLAMA_ROWS]).reshape(-1)
            y = checked_dequantize(ggml, blocks, qtype, f"{name}_llama")
            assert y.size == LLAMA_ROWS * LLAMA_FF
            write(f"{name}_llama", blocks.tobytes(), y)


def main():
    check_versions()
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    quant_types(rng)
    float_types(rng)
    q8_0_activation_rows(rng)
    ggml = Libggml()
    iq_types(np.random.default_rng(SEED + 1), ggml)
    llama_types(np.random.default_rng(SEED + 2), ggml)
    for p in sorted(OUT.iterdir()):
        print(f"{p.stat().st_size:7d}  {p.name}")


if __name__ == "__main__":
    main()
