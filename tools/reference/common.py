"""Shared helpers for the Laguna reference-fixture tools.

Everything here is deliberately small and dependency-light (numpy + stdlib); the torch /
transformers / llama.cpp specific parts live in their own modules.
"""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np

SCRIPT_VERSION = "1.0.0"

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
FIXTURE_ROOT = REPO_ROOT / "tests" / "fixtures" / "models"

# llama.cpp source tree (unpacked llama-cpp-python sdist) holding convert_hf_to_gguf.py.
LLAMA_CPP_DIR = Path(os.environ.get(
    "LLAMA_CPP_DIR", "/work/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp"))

BLOCK = 32  # power-of-two scale block along the input dimension (== Q8_0 / int4 group size)


# --------------------------------------------------------------------------------------
# exactly-representable weights
# --------------------------------------------------------------------------------------

def pow2_blocks(rng: np.random.Generator, shape, std: float, block: int = BLOCK) -> np.ndarray:
    """Random float32 tensor whose values are q * 2**e, q integer in [-127, 127], with one
    power-of-two scale per block of `block` consecutive elements along the LAST dim (the
    input dim of a [out, in] nn.Linear weight).

    Every block contains at least one element with |q| == 127, so llama.cpp's Q8_0
    quantiser (d = amax/127) recovers d = 2**e exactly and all of f32 / bf16 / f16 / Q8_0
    hold bit-identical values.
    """
    shape = tuple(int(s) for s in shape)
    n_in = shape[-1]
    assert n_in % block == 0, f"last dim {n_in} not a multiple of {block}"
    w = rng.standard_normal(shape).astype(np.float64) * std
    wb = w.reshape(-1, n_in // block, block)
    amax = np.abs(wb).max(axis=-1, keepdims=True)
    amax = np.maximum(amax, 1e-30)
    e = np.round(np.log2(amax / 127.0))
    s = np.exp2(e)
    q = np.clip(np.round(wb / s), -127, 127)
    # force the largest-magnitude element of each block to +-127
    idx = np.abs(wb).argmax(axis=-1)[..., None]
    sign = np.sign(np.take_along_axis(wb, idx, axis=-1))
    sign[sign == 0] = 1
    np.put_along_axis(q, idx, 127 * sign, axis=-1)
    out = (q * s).reshape(shape).astype(np.float32)
    assert np.array_equal(out.astype(np.float64), (q * s).reshape(shape))
    return out


def pow2_vector(rng: np.random.Generator, n: int, mean: float, std: float, frac_bits: int = 7) -> np.ndarray:
    """1-D vector mean + N(0, std) rounded to a multiple of 2**-frac_bits with at most 8
    significant bits (bf16-exact)."""
    v = mean + rng.standard_normal(n) * std
    q = np.round(v * 2.0 ** frac_bits)
    # keep |q| <= 255 so it fits bf16's 8-bit significand
    q = np.clip(q, -255, 255)
    return (q / 2.0 ** frac_bits).astype(np.float32)


def assert_bf16_exact(a: np.ndarray, name: str = "") -> None:
    import torch
    t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
    back = t.to(torch.bfloat16).to(torch.float32)
    assert torch.equal(t, back), f"{name}: not exactly representable in bf16"


def assert_f16_exact(a: np.ndarray, name: str = "") -> None:
    back = a.astype(np.float16).astype(np.float32)
    assert np.array_equal(a, back), f"{name}: not exactly representable in f16"


# --------------------------------------------------------------------------------------
# logits files and comparisons
# --------------------------------------------------------------------------------------

def write_logits(path: Path, logits: np.ndarray) -> None:
    a = np.ascontiguousarray(logits, dtype="<f4")
    assert a.ndim == 2
    path.write_bytes(a.tobytes())


def read_logits(path: Path, vocab: int) -> np.ndarray:
    a = np.frombuffer(Path(path).read_bytes(), dtype="<f4")
    return a.reshape(-1, vocab)


def rel_l2(a: np.ndarray, ref: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


def argmax_agreement(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.mean(np.argmax(a, axis=-1) == np.argmax(ref, axis=-1)))


def compare(a: np.ndarray, ref: np.ndarray) -> dict:
    return {
        "rel_l2": rel_l2(a, ref),
        "max_abs": float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(ref, np.float64)))),
        "argmax_agreement": argmax_agreement(a, ref),
    }


# --------------------------------------------------------------------------------------
# misc
# --------------------------------------------------------------------------------------

def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def package_versions() -> dict:
    import importlib.metadata as md
    out = {"python": sys.version.split()[0]}
    for pkg in ["torch", "transformers", "compressed-tensors", "safetensors", "numpy",
                "tokenizers", "gguf", "llama_cpp_python"]:
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def yarn_mscale_default(factor: float) -> float:
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
