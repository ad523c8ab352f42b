""""Can the fixture tell right from wrong?" -- alter one feature at a time in transformers
and measure how far the logits move from the correct reference (REFERENCE-NOTES).

Each variant is a plausible engine bug; a fixture is useful for a feature only if the
variant's relative L2 distance is far above the tolerance used in tests (~1e-5 for f32).
Only the variants that apply to the case's config are run.
"""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch

from common import compare
from ref_transformers import _load, logits_for_model

FULL, SLIDING = "full_attention", "sliding_attention"


def _rope_override(cfg: dict, layer_type: str, **changes) -> dict:
    rp = copy.deepcopy(cfg["rope_parameters"])
    d = rp[layer_type]
    for k, v in changes.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    return {"rope_parameters": rp}


def _zero_bias(model) -> None:
    for m in model.modules():
        if hasattr(m, "e_score_correction_bias"):
            m.e_score_correction_bias.data.zero_()


def _zero_gate(model) -> None:
    for name, p in model.named_parameters():
        if name.endswith("self_attn.g_proj.weight"):
            p.data.zero_()


def _weights_with_bias(model) -> None:
    """Bug: routing weights taken from the *biased* scores."""
    import types
    import torch.nn.functional as F

    def fwd(self, hidden_states):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        logits = F.linear(hidden_states, self.weight).float()
        s = torch.sigmoid(logits) + self.e_score_correction_bias.float()
        _, idx = torch.topk(s, self.top_k, dim=-1)
        w = s.gather(-1, idx)
        w = w / w.sum(dim=-1, keepdim=True)
        return logits, w.to(hidden_states.dtype), idx

    for m in model.modules():
        if type(m).__name__ == "LagunaTopKRouter":
            m.forward = types.MethodType(fwd, m)


def _no_topk_norm(model) -> None:
    """Bug: routing weights not renormalised over the selected experts."""
    import types
    import torch.nn.functional as F

    def fwd(self, hidden_states):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        logits = F.linear(hidden_states, self.weight).float()
        s = torch.sigmoid(logits)
        _, idx = torch.topk(s + self.e_score_correction_bias.float(), self.top_k, dim=-1)
        return logits, s.gather(-1, idx).to(hidden_states.dtype), idx

    for m in model.modules():
        if type(m).__name__ == "LagunaTopKRouter":
            m.forward = types.MethodType(fwd, m)


def expert_set_change_fraction(model, tokens: list[int]) -> float:
    """Fraction of (MoE layer, token) pairs whose top-k expert set changes when the
    correction bias is ignored for selection (same router inputs)."""
    changed, total = 0, 0
    hooks = []

    def hook(mod, inp, out):
        nonlocal changed, total
        h = inp[0].reshape(-1, mod.hidden_dim)
        s = torch.sigmoid(torch.nn.functional.linear(h, mod.weight).float())
        a = torch.topk(s + mod.e_score_correction_bias.float(), mod.top_k, dim=-1).indices.sort(-1).values
        b = torch.topk(s, mod.top_k, dim=-1).indices.sort(-1).values
        changed += int((a != b).any(-1).sum())
        total += a.shape[0]

    for m in model.modules():
        if type(m).__name__ == "LagunaTopKRouter":
            hooks.append(m.register_forward_hook(hook))
    logits_for_model(model, tokens)
    for h in hooks:
        h.remove()
    return changed / max(total, 1)


def variants(cfg: dict) -> dict:
    """name -> (config_overrides, mutate_fn)"""
    L = cfg["num_hidden_layers"]
    ltypes = cfg.get("layer_types") or [FULL] * L
    has_swa = SLIDING in ltypes
    full = cfg["rope_parameters"].get(FULL, {})
    v: dict = {}
    if full.get("rope_type") == "yarn":
        v["yarn_off"] = (_rope_override(cfg, FULL, rope_type="default", factor=None, beta_fast=None,
                                        beta_slow=None, attention_factor=None,
                                        original_max_position_embeddings=None), None)
        if full.get("attention_factor") is not None:
            v["default_mscale"] = (_rope_override(cfg, FULL, attention_factor=None), None)
        else:
            v["mscale_1.0"] = (_rope_override(cfg, FULL, attention_factor=1.0), None)
        if (full.get("beta_fast") or 32) != 32 or (full.get("beta_slow") or 1) != 1:
            v["default_betas_32_1"] = (_rope_override(cfg, FULL, beta_fast=32.0, beta_slow=1.0), None)
    if full.get("partial_rotary_factor", 1.0) != 1.0:
        v["full_partial_rotary_1.0"] = (_rope_override(cfg, FULL, partial_rotary_factor=1.0), None)
    if has_swa:
        W = cfg["sliding_window"]
        v["window_off"] = ({"sliding_window": 1 << 20}, None)
        v["window_plus_1"] = ({"sliding_window": W + 1}, None)
        v["window_minus_1"] = ({"sliding_window": W - 1}, None)
        sl = cfg["rope_parameters"][SLIDING]
        v["sliding_uses_full_rope"] = (
            {"rope_parameters": {**copy.deepcopy(cfg["rope_parameters"]), SLIDING: copy.deepcopy(full)}}, None)
        if sl.get("rope_theta") != full.get("rope_theta"):
            v["sliding_theta_swapped"] = (_rope_override(cfg, SLIDING, rope_theta=full["rope_theta"]), None)
    v["bias_zeroed"] = ({}, _zero_bias)
    v["weights_from_biased_scores"] = ({}, _weights_with_bias)
    v["no_topk_renorm"] = ({}, _no_topk_norm)
    if cfg.get("moe_routed_scaling_factor", 1.0) != 1.0:
        v["routed_scale_1.0"] = ({"moe_routed_scaling_factor": 1.0}, None)
    else:
        v["routed_scale_2.5"] = ({"moe_routed_scaling_factor": 2.5}, None)
    v["gate_constant"] = ({}, _zero_gate)
    return v


def run_sensitivity(hf_dir: Path, tokens: list[int], base_logits: np.ndarray) -> dict:
    import json
    cfg = json.loads((Path(hf_dir) / "config.json").read_text())
    out = {}
    base_model = _load(hf_dir)
    out["_expert_set_changed_by_bias_fraction"] = expert_set_change_fraction(base_model, tokens)
    for name, (over, mutate) in variants(cfg).items():
        model = _load(hf_dir, over or None)
        if mutate is not None:
            mutate(model)
        r = compare(logits_for_model(model, tokens), base_logits)
        out[name] = {"rel_l2": r["rel_l2"], "argmax_agreement": r["argmax_agreement"]}
    return out
