"""Reference logits from transformers' native `laguna` model (float32, eager attention).

* plain HF directory (hf-f32 / hf-bf16): loaded with from_pretrained(dtype=float32);
* compressed-tensors directory: transformers 5.23 cannot load it, so the checkpoint is
  dequantised with compressed-tensors' own decompression (bf16 weights, exact here because
  the scales are powers of two), written to a temporary float32 HF directory and loaded
  from there -- i.e. a float model carrying the fake-quantised experts.

One forward over the whole sequence, positions 0..T-1, no cache.
"""
from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import torch


def _load(model_dir: Path, config_overrides: dict | None = None):
    from transformers import AutoConfig, LagunaForCausalLM
    config = AutoConfig.from_pretrained(model_dir)
    if config_overrides:
        for k, v in config_overrides.items():
            setattr(config, k, copy.deepcopy(v))
    model, info = LagunaForCausalLM.from_pretrained(
        model_dir, config=config, dtype=torch.float32, attn_implementation="eager",
        output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        raise RuntimeError(f"transformers loading problems for {model_dir}: {bad}")
    model.eval()
    return model


@torch.no_grad()
def logits_for_model(model, tokens: list[int]) -> np.ndarray:
    ids = torch.tensor([tokens], dtype=torch.long)
    out = model(input_ids=ids, use_cache=False)
    return out.logits[0].float().numpy()


@torch.no_grad()
def router_margins(model, tokens: list[int]) -> np.ndarray:
    """Selection margin of every routing decision: (k-th - (k+1)-th) biased sigmoid score,
    shape [n_moe_layers, n_tokens]. Small margins = near-ties that flip under tiny numeric
    differences (f16/bf16/q8 activations)."""
    rec = []

    def hook(mod, inp, out):
        h = inp[0].reshape(-1, mod.hidden_dim)
        s = torch.sigmoid(torch.nn.functional.linear(h, mod.weight).float()) + mod.e_score_correction_bias.float()
        v = s.sort(-1, descending=True).values
        k = mod.top_k
        rec.append((v[:, k - 1] - v[:, k]) if k < v.shape[1] else torch.full_like(v[:, 0], float("inf")))

    hooks = [m.register_forward_hook(hook) for m in model.modules() if type(m).__name__ == "LagunaTopKRouter"]
    try:
        logits_for_model(model, tokens)
    finally:
        for h in hooks:
            h.remove()
    if not rec:
        return np.full((0, len(tokens)), np.inf)
    return torch.stack(rec).numpy()


def load_any(model_dir: Path, tmp: Path):
    """Load an hf-* or ct-* directory as a float32 transformers model."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return _load(dequantised_dir(Path(model_dir), tmp) if "quantization_config" in cfg else Path(model_dir))


def dequantised_dir(ct_dir: Path, tmp: Path) -> Path:
    """Make a float32 HF checkpoint from a compressed-tensors one (compressed-tensors' own
    decompression)."""
    from safetensors.torch import save_file
    from export import ct_dequantise_with_compressed_tensors, copy_tokenizer
    tensors = ct_dequantise_with_compressed_tensors(ct_dir)
    tensors = {k: v.to(torch.float32).contiguous() for k, v in tensors.items()}
    tmp.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((ct_dir / "config.json").read_text())
    cfg.pop("quantization_config")
    cfg["torch_dtype"] = "float32"
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    copy_tokenizer(ct_dir, tmp)
    return tmp


def transformers_logits(model_dir: Path, tokens: list[int], config_overrides: dict | None = None,
                        mutate: Callable | None = None) -> np.ndarray:
    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    with tempfile.TemporaryDirectory() as td:
        load_dir = dequantised_dir(model_dir, Path(td)) if "quantization_config" in cfg else model_dir
        model = _load(load_dir, config_overrides)
        if mutate is not None:
            mutate(model)
        return logits_for_model(model, tokens)


if __name__ == "__main__":
    import argparse
    from common import write_logits
    torch.set_num_threads(1)
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("model_dir")
    ap.add_argument("tokens", help="tokens.txt (comma separated ids)")
    ap.add_argument("out", help="output raw f32 logits file")
    a = ap.parse_args()
    toks = [int(x) for x in Path(a.tokens).read_text().strip().split(",")]
    write_logits(Path(a.out), transformers_logits(Path(a.model_dir), toks))
