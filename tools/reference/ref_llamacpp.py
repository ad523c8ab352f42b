"""Per-position logits from llama.cpp (llama-cpp-python) for a GGUF file.

Settings: logits_all=True, f32 KV cache (type_k = type_v = 0 = GGML_TYPE_F32), flash
attention off, n_threads 2, one batch/ubatch holding the whole sequence.

YaRN alignment with transformers (REFERENCE-NOTES): llama.cpp (this commit) ignores
`rope.scaling.yarn_attn_factor` / `yarn_beta_*` from the GGUF. It always uses magnitude
(1 + 0.1 ln factor) * `rope.scaling.attn_factor` on full layers and takes beta_fast/slow
from the context parameters. So we pass the config's betas (HF defaults 32 / 1 when absent)
and override `laguna.rope.scaling.attn_factor` = attention_factor / (1 + 0.1 ln factor)
(1.0 when the config has no attention_factor, i.e. HF's default mscale).

Usage: ref_llamacpp.py MODEL.gguf tokens.txt OUT.f32 --config hf-f32/config.json
Prints a JSON line with the parameters used.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np


def yarn_alignment(cfg: dict) -> dict:
    rp = (cfg.get("rope_parameters") or {}).get("full_attention") or {}
    if rp.get("rope_type") != "yarn":
        return {"yarn": False, "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0, "kv_overrides": {}}
    f = float(rp["factor"])
    default = 0.1 * math.log(f) + 1.0 if f > 1 else 1.0
    attn = rp.get("attention_factor")
    attn = default if attn is None else float(attn)
    return {
        "yarn": True,
        "yarn_beta_fast": float(rp.get("beta_fast") or 32.0),
        "yarn_beta_slow": float(rp.get("beta_slow") or 1.0),
        "kv_overrides": {"laguna.rope.scaling.attn_factor": attn / default},
    }


def known_deviations(cfg: dict) -> list[str]:
    """Configs where llama.cpp (this commit) is known NOT to compute the transformers model;
    its logits are then not a reference."""
    out = []
    L = cfg["num_hidden_layers"]
    lt = cfg.get("layer_types") or ["full_attention"] * L
    rp = cfg.get("rope_parameters") or {}
    D = cfg["head_dim"]
    rd = {t: int(D * (rp.get(t) or {}).get("partial_rotary_factor", 1.0)) for t in ("full_attention", "sliding_attention")}
    if lt[0] == "sliding_attention" and "full_attention" in lt and rd["full_attention"] != rd["sliding_attention"]:
        out.append("layer 0 is sliding and full/sliding rotary dims differ: llama.cpp's graph takes n_rot = "
                   "hparams.n_rot(0) (= n_rot_swa) for every full layer (llama-graph.cpp n_rot(hparams.n_rot()))")
    return out


def llamacpp_logits(gguf_path: Path, tokens: list[int], cfg: dict, n_threads: int = 2) -> tuple[np.ndarray, dict]:
    import llama_cpp
    from llama_cpp import Llama
    al = yarn_alignment(cfg)
    n = len(tokens)
    llm = Llama(
        model_path=str(gguf_path),
        n_ctx=max(256, n), n_batch=n, n_ubatch=n,
        n_threads=n_threads, n_threads_batch=n_threads,
        logits_all=True, flash_attn=False,
        type_k=0, type_v=0,                      # GGML_TYPE_F32 KV cache
        yarn_beta_fast=al["yarn_beta_fast"], yarn_beta_slow=al["yarn_beta_slow"],
        kv_overrides=al["kv_overrides"] or None,
        seed=0, verbose=False,
    )
    vocab = llm.n_vocab()
    assert vocab == cfg["vocab_size"], (vocab, cfg["vocab_size"])
    llm.eval(tokens)
    logits = np.array(llm.scores[:n, :vocab], dtype=np.float32, copy=True)
    params = {"n_threads": n_threads, "type_k": "f32", "type_v": "f32", "flash_attn": False,
              "logits_all": True, "n_batch": n, "llama_cpp_python": llama_cpp.__version__, **al}
    llm.close()
    return logits, params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("tokens")
    ap.add_argument("out")
    ap.add_argument("--config", required=True, help="the HF config.json the GGUF was made from")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    from common import write_logits
    cfg = json.loads(Path(a.config).read_text())
    toks = [int(x) for x in Path(a.tokens).read_text().strip().split(",")]
    logits, params = llamacpp_logits(Path(a.gguf), toks, cfg, a.threads)
    write_logits(Path(a.out), logits)
    print(json.dumps(params))


if __name__ == "__main__":
    main()
