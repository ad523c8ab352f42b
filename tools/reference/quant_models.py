#!/usr/bin/env python3
"""Tiny Laguna GGUFs in every llama.cpp quant type, quantised by llama.cpp itself, with
llama.cpp's logits for each file (issue #5, third test; checked by tests/quant_logits.rs).

    /work/venv/ref/bin/python tools/reference/quant_models.py [--out DIR] [--keep-tmp DIR]

Output: tests/fixtures/models/quant/:

  eval_tokens.txt                comma-separated evaluation ids (BOS first); not `tokens.txt`,
                                 which would make tests/logits_vs_reference.rs take this
                                 directory for one of its transformers cases
  model-<t>.gguf                 llama.cpp's quantisation of one f32 model into type <t>
  logits.llamacpp.<t>.f32        llama.cpp on model-<t>.gguf (its quantised-activation CPU
                                 path), raw LE f32 [n_tokens, vocab]
  logits.llamacpp.<t>.deq.f32    llama.cpp on the *dequantised* model-<t> (every tensor
                                 converted back to F32 by llama.cpp's own `llama_model_quantize`
                                 with ftype ALL_F32): its f32 reference path on the same weights
  meta.json                      config, versions, type histograms, distances, sizes, sha256

The model. Hidden 256 and every row length (ne0) a multiple of 256, so every type quantises
without llama.cpp's shape fallbacks: 2 layers, [full attention + dense MLP, sliding attention +
MoE]; 8 query heads, 2 KV heads, head_dim 32 (o_proj rows 256); per-head softplus gate; QK-norm;
YaRN with partial rotary 0.5 on the full layer, plain RoPE on the sliding one (window 8, other
theta); dense I 256; 3 routed experts top-2 (I 256, sigmoid + correction bias, renormalised,
routed scale 2.5) + shared expert (256); vocab 320 (a trained byte-level BPE). Weights come
from make_model.make_weights (the fixtures' magnitudes; logits std ~2). ~1.5 M parameters:
the smallest model with all of these features at these row lengths.

Quantisation: `llama_model_quantize` of llama-cpp-python (its bundled llama.cpp knows Laguna),
`pure` (every quantisable tensor gets the type; norms, the router `ffn_gate_inp` and the
correction bias stay F32) for every base type, so each file exercises its type in every
matrix kind (embedding rows, attention, dense MLP, 3-D expert tensors, shared expert, lm_head).
The three K-quant mixes Q3_K_M, Q4_K_M, Q5_K_M are llama.cpp's own mixes (not pure): they add
the mixed-type layouts real GGUFs have. MXFP4 is ftype MXFP4_MOE with `pure`, so MXFP4 is
used for every matrix, not only the experts (the non-pure mix would put Q8_0 elsewhere).
The script asserts each file's type histogram (recorded in meta.json).

Importance matrix (all types get one; IQ1/IQ2/IQ3_XXS need it): computed here as llama.cpp's
`llama-imatrix` collects it and tools/quantize/quantize.cpp hands it to the quantiser -- per
matrix, the mean over calibration tokens of the squared input activation of each column (per
expert for the 3-D expert tensors, over the tokens routed to that expert; ones for an expert
no token reached) -- from the float64 numpy forward of ref_numpy.py on the f32
weights, over 2 x 128 random calibration tokens (not the evaluation tokens). token_embd has
no matmul input; it gets ones (llama.cpp's IQ quantisers assert on a missing one).

Tokens: BOS + uniform ids; of TOKEN_ATTEMPTS draws the one whose smallest router margin
(k-th minus (k+1)-th biased score) over the f32 model and every dequantised model is largest.

llama.cpp settings: those of ref_llamacpp.py (f32 KV cache, flash attention off, YaRN
alignment overrides, logits for all positions), 2 threads, the whole sequence in one ubatch.
Also run and recorded (distances only, in meta.json): ubatch 1 (token-by-token decode, other
matmul path), 1 thread, and no weight repacking (`use_extra_bufts = false`).

The bounds tests/quant_logits.rs applies, per type (d = relative L2 over all positions,
d_llama = d(logits.llamacpp.<t>.f32, logits.llamacpp.<t>.deq.f32), llama.cpp's own distance
between its CPU path and its f32 reference path on the same file, ~1e-2 here):
  * lagoon reference path (dequantise + f32) vs logits.llamacpp.<t>.deq.f32 <= 1e-4 (the f32
    bound of the other fixture tests): both run the same f32 model, so any dequantisation error
    anywhere in the model shows; meta.json records the float64 numpy forward on the
    dequantised weights vs that file (~2e-7) as the proof that it is a reference.
  * lagoon fast path vs logits.llamacpp.<t>.deq.f32 <= 1.25 x d_llama, and vs
    logits.llamacpp.<t>.f32 <= 1.6 x d_llama (sqrt(1 + 1.25^2): independent rounding).
The spread between llama.cpp's own configurations (ubatch 1 / 1 thread / no repacking, in
meta.json) is no bound: it is 0 for most types and up to ~7e-3 for a few. With quantised
activations one element rounding the other way (a 1-ulp difference before a rounding) is
re-rounded by every later matrix and moves the logits of every position it reaches (all later
ones through the full-attention layer, 8 through the sliding one) by ~d_llama; so two engines
agree to ~1e-7 at a position or differ by ~d_llama there, nothing in between.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

from common import FIXTURE_ROOT, LLAMA_CPP_DIR, compare, package_versions, write_json, write_logits  # noqa: E402

SCRIPT_VERSION = "1.0.0"
OUT = FIXTURE_ROOT / "quant"
PY = sys.executable
SEED = 0x5EED5
N_TOKENS = 32
TOKEN_ATTEMPTS = 64
N_CALIB = (2, 128)  # calibration sequences x tokens for the importance matrix
FULL, SLIDING = "full_attention", "sliding_attention"

CONFIG = {
    "architectures": ["LagunaForCausalLM"],
    "model_type": "laguna",
    "vocab_size": 320,
    "hidden_size": 256,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 2,
    "eos_token_id": [2, 24],
    "pad_token_id": 9,
    "moe_apply_router_weight_on_input": False,
    "moe_router_logit_softcapping": 0.0,
    "router_aux_loss_coef": 0.0,
    "norm_topk_prob": True,
    "torch_dtype": "float32",
    "num_hidden_layers": 2,
    "layer_types": [FULL, SLIDING],
    "sliding_window": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "gating": "per-head",
    "intermediate_size": 256,
    "mlp_layer_types": ["dense", "sparse"],
    "num_experts": 3,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 256,
    "shared_expert_intermediate_size": 256,
    "moe_routed_scaling_factor": 2.5,
    # rd = 32 * 0.5 = 16 rotary dims on the full layer; theta 1000, factor 8, original
    # context 512 with betas 32/1: the YaRN ramp falls inside the 8 frequency pairs.
    "rope_parameters": {
        FULL: {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 8.0,
               "original_max_position_embeddings": 512, "beta_fast": 32.0, "beta_slow": 1.0,
               "attention_factor": 1.125, "partial_rotary_factor": 0.5},
        SLIDING: {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
    },
    "max_position_embeddings": 4096,
}

# name -> (llama_ftype constant, pure, {tensor type: count} expected among quantisable tensors
# or None for llama.cpp's mixes, whose histogram is recorded and must contain `main`)
# The quantisable tensors: 2 x (q, k, v, output, gate) + dense (gate, up, down) + experts
# (gate, up, down) + shared (gate, up, down) + token_embd + output = 21.
N_QUANTISABLE = 21
TYPES = {
    "q4_0": ("LLAMA_FTYPE_MOSTLY_Q4_0", True, "Q4_0"),
    "q4_1": ("LLAMA_FTYPE_MOSTLY_Q4_1", True, "Q4_1"),
    "q5_0": ("LLAMA_FTYPE_MOSTLY_Q5_0", True, "Q5_0"),
    "q5_1": ("LLAMA_FTYPE_MOSTLY_Q5_1", True, "Q5_1"),
    "q8_0": ("LLAMA_FTYPE_MOSTLY_Q8_0", True, "Q8_0"),
    "q2_k": ("LLAMA_FTYPE_MOSTLY_Q2_K", True, "Q2_K"),
    "q3_k_m": ("LLAMA_FTYPE_MOSTLY_Q3_K_M", False, "Q3_K"),
    "q4_k_m": ("LLAMA_FTYPE_MOSTLY_Q4_K_M", False, "Q4_K"),
    "q5_k_m": ("LLAMA_FTYPE_MOSTLY_Q5_K_M", False, "Q5_K"),
    "q6_k": ("LLAMA_FTYPE_MOSTLY_Q6_K", True, "Q6_K"),
    "iq1_s": ("LLAMA_FTYPE_MOSTLY_IQ1_S", True, "IQ1_S"),
    "iq1_m": ("LLAMA_FTYPE_MOSTLY_IQ1_M", True, "IQ1_M"),
    "iq2_xxs": ("LLAMA_FTYPE_MOSTLY_IQ2_XXS", True, "IQ2_XXS"),
    "iq2_xs": ("LLAMA_FTYPE_MOSTLY_IQ2_XS", True, "IQ2_XS"),
    "iq2_s": ("LLAMA_FTYPE_MOSTLY_IQ2_M", True, "IQ2_S"),  # IQ2_M's base type is IQ2_S
    "iq3_xxs": ("LLAMA_FTYPE_MOSTLY_IQ3_XXS", True, "IQ3_XXS"),
    "iq3_s": ("LLAMA_FTYPE_MOSTLY_IQ3_S", True, "IQ3_S"),
    "iq4_nl": ("LLAMA_FTYPE_MOSTLY_IQ4_NL", True, "IQ4_NL"),
    "iq4_xs": ("LLAMA_FTYPE_MOSTLY_IQ4_XS", True, "IQ4_XS"),
    "mxfp4": ("LLAMA_FTYPE_MOSTLY_MXFP4_MOE", True, "MXFP4"),
}

# Tensors llama.cpp never quantises (1-D, router): must stay F32.
KEEP_F32 = ("_norm.weight", "ffn_gate_inp.weight", "exp_probs_b.bias")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def case() -> dict:
    from cases import resolve_layer_kinds
    c = {"name": "quant", "seed": SEED, "n_tokens": N_TOKENS, "config": CONFIG}
    c["layer_kinds"] = resolve_layer_kinds(CONFIG)
    return c


# ------------------------------------------------------------------------------- names

def hf_to_gguf(cfg: dict) -> dict[str, tuple[str, int | None]]:
    """HF weight name -> (GGUF tensor name, expert index for the 3-D expert tensors)."""
    m = {"model.embed_tokens.weight": ("token_embd.weight", None),
         "lm_head.weight": ("output.weight", None),
         "model.norm.weight": ("output_norm.weight", None)}
    attn = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
            "g_proj": "attn_gate", "q_norm": "attn_q_norm", "k_norm": "attn_k_norm"}
    proj = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
    for l, kind in enumerate(cfg["mlp_layer_types"]):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        m[p + "input_layernorm.weight"] = (b + "attn_norm.weight", None)
        m[p + "post_attention_layernorm.weight"] = (b + "ffn_norm.weight", None)
        for k, v in attn.items():
            m[p + f"self_attn.{k}.weight"] = (b + f"{v}.weight", None)
        if kind == "dense":
            for k, v in proj.items():
                m[p + f"mlp.{k}.weight"] = (b + f"ffn_{v}.weight", None)
        else:
            m[p + "mlp.gate.weight"] = (b + "ffn_gate_inp.weight", None)
            m[p + "mlp.experts.e_score_correction_bias"] = (b + "exp_probs_b.bias", None)
            for k, v in proj.items():
                m[p + f"mlp.shared_expert.{k}.weight"] = (b + f"ffn_{v}_shexp.weight", None)
                for e in range(cfg["num_experts"]):
                    m[p + f"mlp.experts.{e}.{k}.weight"] = (b + f"ffn_{v}_exps.weight", e)
    return m


def gguf_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF as float64 in numpy order, dequantised by gguf-py."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    out = {}
    for t in GGUFReader(str(path)).tensors:
        a = dequantize(t.data, t.tensor_type)
        out[t.name] = np.asarray(a, dtype=np.float64).reshape([int(x) for x in reversed(t.shape.tolist())])
    return out


def hf_weights_from_gguf(path: Path, cfg: dict) -> dict[str, np.ndarray]:
    g = gguf_arrays(path)
    w = {}
    for hf, (name, e) in hf_to_gguf(cfg).items():
        w[hf] = g[name] if e is None else g[name][e]
    return w


# ------------------------------------------------------------------------- numpy forward

class _Recorded:
    """A weight matrix that records what multiplies it: numpy defers `x @ m` to
    `m.__rmatmul__` when `__array_ufunc__` is None, so ref_numpy.forward runs unchanged."""
    __array_ufunc__ = None

    def __init__(self, name, w, sink):
        self.name, self.w, self.sink = name, w, sink

    @property
    def T(self):
        return self

    def __rmatmul__(self, x):
        y = x @ self.w.T
        self.sink(self.name, np.atleast_2d(x), np.atleast_2d(y))
        return y


class _Recording(dict):
    def __init__(self, w, sink):
        super().__init__(w)
        self.sink = sink

    def __getitem__(self, k):
        v = dict.__getitem__(self, k)
        return _Recorded(k, v, self.sink) if v.ndim == 2 and k != "model.embed_tokens.weight" else v


def forward(cfg: dict, w: dict, tokens: list[int], sink=None) -> np.ndarray:
    from ref_numpy import forward as np_forward
    return np_forward(cfg, _Recording(w, sink) if sink else w, tokens)


def importance_matrix(cfg: dict, w: dict, rng) -> tuple[dict[str, np.ndarray], dict]:
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}

    def sink(name, x, y):
        sums[name] = sums.get(name, 0.0) + (x * x).sum(axis=0)
        counts[name] = counts.get(name, 0) + x.shape[0]

    V = cfg["vocab_size"]
    for _ in range(N_CALIB[0]):
        toks = [cfg["bos_token_id"]] + [int(t) for t in rng.integers(0, V, N_CALIB[1] - 1)]
        forward(cfg, w, toks, sink)
    per: dict[str, list] = {}
    stats = {}
    for hf, (name, e) in hf_to_gguf(cfg).items():
        if not hf.endswith("_proj.weight") and hf != "lm_head.weight":
            continue
        n_in = w[hf].shape[1]
        if counts.get(hf):
            v = sums[hf] / counts[hf]
        else:
            v = np.ones(n_in)  # an expert no calibration token reached
        stats[hf] = counts.get(hf, 0)
        if e is None:
            per[name] = [v]
        else:
            per.setdefault(name, [None] * cfg["num_experts"])[e] = v
    im = {k: np.ascontiguousarray(np.concatenate(v), dtype=np.float32) for k, v in per.items()}
    im["token_embd.weight"] = np.ones(cfg["hidden_size"], np.float32)
    return im, {"tokens_per_matrix": stats}


def router_margin(cfg: dict, w: dict, tokens: list[int]) -> float:
    K = cfg["num_experts_per_tok"]
    out = [np.inf]

    def sink(name, x, y):
        if name.endswith("mlp.gate.weight"):
            bias = w[name.replace("mlp.gate.weight", "mlp.experts.e_score_correction_bias")]
            s = np.sort(1.0 / (1.0 + np.exp(-y)) + bias[None, :], axis=1)[:, ::-1]
            out.append(float((s[:, K - 1] - s[:, K]).min()))

    forward(cfg, w, tokens, sink)
    return min(out)


# ------------------------------------------------------------------------------ llama.cpp

def silence_llama():
    import llama_cpp
    cb = llama_cpp.llama_log_callback(lambda level, text, user: None)
    llama_cpp.llama_log_set(cb, None)
    return cb  # keep alive


def quantize(src: Path, dst: Path, ftype: int, pure: bool, imatrix: dict | None, requantize=False):
    """llama.cpp's quantiser (learned from llama-quant.cpp: imatrix entries are per GGUF
    tensor name, ne0 * n_expert floats; `pure` skips the per-tensor mix rules)."""
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.pure = pure
    params.allow_requantize = requantize
    params.nthread = 2
    keep = []
    if imatrix:
        entries = (llama_cpp.llama_model_imatrix_data * (len(imatrix) + 1))()
        for ent, (name, data) in zip(entries, imatrix.items()):
            ent.name = name.encode()
            keep.append(data)
            ent.data = data.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            ent.size = data.size
        entries[len(imatrix)].name = None
        params.imatrix = ctypes.cast(entries, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize {src.name} -> {dst.name} (ftype {ftype}) failed ({rc})")


def llamacpp_logits(path: Path, tokens: list[int], cfg: dict, ubatch: int | None = None,
                    n_threads: int = 2, repack: bool = True) -> np.ndarray:
    """ref_llamacpp.llamacpp_logits with a choice of ubatch, threads and weight repacking."""
    import llama_cpp
    import llama_cpp.llama as llama_mod
    from llama_cpp import Llama
    from ref_llamacpp import yarn_alignment
    al = yarn_alignment(cfg)
    n = len(tokens)
    ub = ubatch or n
    orig = llama_mod.llama_cpp.llama_model_default_params

    def params():
        p = orig()
        p.use_extra_bufts = repack
        return p

    llama_mod.llama_cpp.llama_model_default_params = params
    try:
        llm = Llama(model_path=str(path), n_ctx=max(256, n), n_batch=ub, n_ubatch=ub,
                    n_threads=n_threads, n_threads_batch=n_threads, logits_all=True, flash_attn=False,
                    type_k=0, type_v=0, yarn_beta_fast=al["yarn_beta_fast"], yarn_beta_slow=al["yarn_beta_slow"],
                    kv_overrides=al["kv_overrides"] or None, seed=0, verbose=False)
    finally:
        llama_mod.llama_cpp.llama_model_default_params = orig
    assert llm.n_vocab() == cfg["vocab_size"]
    llm.eval(tokens)
    out = np.array(llm.scores[:n, :cfg["vocab_size"]], dtype=np.float32, copy=True)
    llm.close()
    return out


def histogram(path: Path) -> tuple[dict[str, int], dict[str, str]]:
    from gguf import GGUFReader
    types = {t.name: t.tensor_type.name for t in GGUFReader(str(path)).tensors}
    h: dict[str, int] = {}
    for ty in types.values():
        h[ty] = h.get(ty, 0) + 1
    return dict(sorted(h.items())), types


def check_types(name: str, main: str, pure: bool, types: dict[str, str]) -> None:
    quantisable = {k: v for k, v in types.items() if not k.endswith(KEEP_F32)}
    assert len(quantisable) == N_QUANTISABLE, (name, len(quantisable))
    for k, v in types.items():
        if k.endswith(KEEP_F32):
            assert v == "F32", f"{name}: {k} is {v}, expected F32"
    if pure:
        bad = {k: v for k, v in quantisable.items() if v != main}
        assert not bad, f"{name}: not every matrix is {main}: {bad}"
    else:
        n_main = sum(v == main for v in quantisable.values())
        assert n_main >= N_QUANTISABLE // 2, f"{name}: only {n_main} tensors are {main}"


def per_position(a: np.ndarray, ref: np.ndarray) -> np.ndarray:
    return np.linalg.norm(a - ref, axis=1) / np.linalg.norm(ref, axis=1)


def dist(a: np.ndarray, ref: np.ndarray) -> dict:
    r = compare(a, ref)
    pp = per_position(a, ref)
    r["median_position"] = float(np.median(pp))
    r["max_position"] = float(pp.max())
    return r


# ---------------------------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--keep-tmp", type=Path, help="write the f32 model and dequantised GGUFs here")
    ap.add_argument("--only", action="append", help="only these types (for experiments)")
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import llama_cpp
    from export import export_hf
    from make_model import make_weights

    t0 = time.time()
    _cb = silence_llama()
    c = case()
    cfg = c["config"]
    out = a.out.resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tmp_ctx = tempfile.TemporaryDirectory()
    tmp = a.keep_tmp.resolve() if a.keep_tmp else Path(tmp_ctx.name)
    tmp.mkdir(parents=True, exist_ok=True)

    log("weights, hf-f32, f32 GGUF")
    w32 = make_weights(c)
    weights = {k: v.astype(np.float64) for k, v in w32.items()}
    export_hf(c, w32, tmp / "hf-f32", "float32")
    f32 = tmp / "model-f32.gguf"
    r = subprocess.run([PY, str(HERE / "convert_gguf.py"), str(tmp / "hf-f32"), str(f32), "--outtype", "f32",
                        "--model-name", "laguna-fixture-quant"],
                       capture_output=True, text=True, env={**os.environ, "NO_LOCAL_GGUF": ""})
    if r.returncode != 0:
        raise RuntimeError(f"GGUF conversion failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    back = hf_weights_from_gguf(f32, cfg)
    assert all(np.array_equal(back[k], weights[k]) for k in weights), "f32 GGUF != the HF weights"

    log("importance matrix")
    imatrix, im_info = importance_matrix(cfg, weights, np.random.default_rng([SEED, 1]))

    names = [n for n in TYPES if not a.only or n in a.only]
    files, hist, deq_w = {}, {}, {}
    for n in names:
        ftype_name, pure, main = TYPES[n]
        ftype = getattr(llama_cpp, ftype_name)
        dst = out / f"model-{n}.gguf"
        quantize(f32, dst, ftype, pure, imatrix)
        h, types = histogram(dst)
        check_types(n, main, pure, types)
        deq = tmp / f"deq-{n}.gguf"
        quantize(dst, deq, llama_cpp.LLAMA_FTYPE_ALL_F32, True, None, requantize=True)
        # llama.cpp's own dequantisation (ALL_F32) == gguf-py's, tensor by tensor
        ours = gguf_arrays(dst)
        theirs = gguf_arrays(deq)
        assert all(np.array_equal(ours[k], theirs[k]) for k in ours), f"{n}: llama.cpp and gguf-py dequantise differently"
        deq_w[n] = hf_weights_from_gguf(deq, cfg)
        files[n] = (dst, deq)
        hist[n] = {"ftype": ftype_name, "pure": pure, "main_type": main, "histogram": h,
                   "types": {k: v for k, v in types.items() if not k.endswith(KEEP_F32)} if not pure else None,
                   "bytes": dst.stat().st_size}
        log(f"{n}: {dst.stat().st_size} B {h}")

    log("choosing the evaluation sequence (router margins over f32 and every dequantised model)")
    V = cfg["vocab_size"]
    best = None
    for att in range(TOKEN_ATTEMPTS):
        rng = np.random.default_rng([SEED, 2, att])
        toks = [cfg["bos_token_id"]] + [int(t) for t in rng.integers(0, V, N_TOKENS - 1)]
        per = {"f32": router_margin(cfg, weights, toks)}
        for n in names:
            per[n] = router_margin(cfg, deq_w[n], toks)
        m = min(per.values())
        if best is None or m > best[1]:
            best = (toks, m, att, per)
    tokens, margin, att, margins = best
    log(f"min router margin {margin:.3e} (attempt {att})")
    (out / "eval_tokens.txt").write_text(",".join(map(str, tokens)) + "\n")

    results = {}
    for n in names:
        dst, deq = files[n]
        lq = llamacpp_logits(dst, tokens, cfg)
        ld = llamacpp_logits(deq, tokens, cfg)
        write_logits(out / f"logits.llamacpp.{n}.f32", lq)
        write_logits(out / f"logits.llamacpp.{n}.deq.f32", ld)
        npf = forward(cfg, deq_w[n], tokens)
        res = {
            "cpu_vs_f32_reference": dist(lq, ld),
            "ubatch1_vs_cpu": dist(llamacpp_logits(dst, tokens, cfg, ubatch=1), lq),
            "threads1_vs_cpu": dist(llamacpp_logits(dst, tokens, cfg, n_threads=1), lq),
            "no_repack_vs_cpu": dist(llamacpp_logits(dst, tokens, cfg, repack=False), lq),
            "f32_reference_vs_numpy_f64": dist(ld, npf),
            "cpu_vs_numpy_f64": dist(lq, npf),
        }
        results[n] = {**hist[n], "distances": res, "router_margin": margins[n]}
        log(f"{n}: cpu vs f32 ref {res['cpu_vs_f32_reference']['rel_l2']:.3e}, ubatch1 "
            f"{res['ubatch1_vs_cpu']['rel_l2']:.2e}, threads1 {res['threads1_vs_cpu']['rel_l2']:.2e}, "
            f"no-repack {res['no_repack_vs_cpu']['rel_l2']:.2e}, f32 ref vs numpy {res['f32_reference_vs_numpy_f64']['rel_l2']:.2e}")

    f32_logits = forward(cfg, weights, tokens)
    meta = {
        "generated_by": "tools/reference/quant_models.py",
        "script_version": SCRIPT_VERSION,
        "seed": SEED,
        "versions": package_versions(),
        "llama_cpp_source": {"dir": str(LLAMA_CPP_DIR),
                             "note": "vendored in llama-cpp-python 0.3.36 (llama.cpp commit 0c1e570)"},
        "n_tokens": N_TOKENS,
        "tokens": {"draw": "numpy default_rng([seed, 2, attempt]): BOS + uniform ids", "attempts": TOKEN_ATTEMPTS,
                   "chosen_attempt": att, "min_router_margin": margin},
        "logits_format": "raw little-endian float32, row-major [n_tokens, vocab_size]",
        "config_json": cfg,
        "n_params": int(sum(v.size for v in weights.values())),
        "imatrix": {"construction": "mean over calibration tokens of the squared input activation per column "
                                    "(per expert over the tokens routed to it), float64 numpy forward on the f32 "
                                    "weights; token_embd: ones", "calibration": f"{N_CALIB[0]} x {N_CALIB[1]} tokens",
                    **im_info},
        "llamacpp_settings": "f32 KV cache, flash attention off, 2 threads, ubatch = n_tokens, logits_all, "
                             "YaRN alignment of ref_llamacpp.py",
        "distances_note": "rel_l2 = ||a - b|| / ||b|| over all positions (b the second named); cpu = llama.cpp on "
                          "model-<t>.gguf, f32_reference = llama.cpp on the dequantised file, numpy_f64 = "
                          "ref_numpy.py on the dequantised weights",
        "f32_model_logits_std": float(f32_logits.std()),
        "types": results,
    }
    meta["files"] = {p.name: {"bytes": p.stat().st_size, "sha256": sha256(p)}
                     for p in sorted(out.iterdir()) if p.is_file()}
    meta["total_bytes"] = sum(v["bytes"] for v in meta["files"].values())
    meta["elapsed_s"] = round(time.time() - t0, 1)
    write_json(out / "meta.json", meta)
    log(f"done: {meta['total_bytes']} bytes in {out}")


if __name__ == "__main__":
    main()
