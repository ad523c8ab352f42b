"""Random Laguna weights in the poolside on-disk (safetensors) naming.

All matrices are q * 2**e with one power-of-two scale per 32 inputs (see
common.pow2_blocks), so f32 / bf16 / f16 / Q8_0 copies are bit-identical. Magnitudes follow
REFERENCE-NOTES: projections std 0.8/sqrt(fan_in), RMSNorm gains 1 +- 0.1, embeddings std 1,
router correction bias N(0, 0.1).

Names (HF on-disk form, per-expert, singular shared_expert, bias under mlp.experts):
  model.embed_tokens.weight, model.norm.weight, lm_head.weight
  model.layers.{l}.input_layernorm.weight / post_attention_layernorm.weight
  model.layers.{l}.self_attn.{q,k,v,o,g}_proj.weight, self_attn.{q,k}_norm.weight
  dense:  model.layers.{l}.mlp.{gate,up,down}_proj.weight
  sparse: model.layers.{l}.mlp.gate.weight, mlp.experts.e_score_correction_bias,
          mlp.experts.{e}.{gate,up,down}_proj.weight, mlp.shared_expert.{gate,up,down}_proj.weight
"""
from __future__ import annotations

import math

import numpy as np

from common import assert_bf16_exact, assert_f16_exact, pow2_blocks, pow2_vector

PROJ_GAIN = 0.8
HEAD_GAIN = 2.0   # lm_head std 2/sqrt(H): logits std ~2


def attn_heads(cfg: dict) -> list[int]:
    return cfg.get("num_attention_heads_per_layer") or [cfg["num_attention_heads"]] * cfg["num_hidden_layers"]


def gate_per_head(cfg: dict) -> bool:
    g = cfg.get("gating", True)
    return g is True or g == "per-head"


def make_weights(case: dict) -> dict[str, np.ndarray]:
    cfg = case["config"]
    rng = np.random.default_rng(case["seed"])
    H, V, D = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"]
    Hkv = cfg["num_key_value_heads"]
    heads = attn_heads(cfg)
    lin = lambda out, inp: pow2_blocks(rng, (out, inp), PROJ_GAIN / math.sqrt(inp))
    gain = lambda n: _gain(rng, n)

    w: dict[str, np.ndarray] = {}
    w["model.embed_tokens.weight"] = pow2_blocks(rng, (V, H), 1.0)
    for l, (attn_kind, mlp_kind) in enumerate(case["layer_kinds"]):
        p = f"model.layers.{l}."
        Hq = heads[l]
        w[p + "input_layernorm.weight"] = gain(H)
        w[p + "self_attn.q_proj.weight"] = lin(Hq * D, H)
        w[p + "self_attn.k_proj.weight"] = lin(Hkv * D, H)
        w[p + "self_attn.v_proj.weight"] = lin(Hkv * D, H)
        w[p + "self_attn.o_proj.weight"] = lin(H, Hq * D)
        w[p + "self_attn.g_proj.weight"] = lin(Hq if gate_per_head(cfg) else Hq * D, H)
        w[p + "self_attn.q_norm.weight"] = gain(D)
        w[p + "self_attn.k_norm.weight"] = gain(D)
        w[p + "post_attention_layernorm.weight"] = gain(H)
        if mlp_kind == "dense":
            I = cfg["intermediate_size"]
            w[p + "mlp.gate_proj.weight"] = lin(I, H)
            w[p + "mlp.up_proj.weight"] = lin(I, H)
            w[p + "mlp.down_proj.weight"] = lin(H, I)
        else:
            E, I, Is = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
            w[p + "mlp.gate.weight"] = lin(E, H)
            w[p + "mlp.experts.e_score_correction_bias"] = _bias(rng, E)
            for e in range(E):
                w[p + f"mlp.experts.{e}.gate_proj.weight"] = lin(I, H)
                w[p + f"mlp.experts.{e}.up_proj.weight"] = lin(I, H)
                w[p + f"mlp.experts.{e}.down_proj.weight"] = lin(H, I)
            w[p + "mlp.shared_expert.gate_proj.weight"] = lin(Is, H)
            w[p + "mlp.shared_expert.up_proj.weight"] = lin(Is, H)
            w[p + "mlp.shared_expert.down_proj.weight"] = lin(H, Is)
    w["model.norm.weight"] = gain(H)
    w["lm_head.weight"] = pow2_blocks(rng, (V, H), HEAD_GAIN / math.sqrt(H))
    for k, v in w.items():
        assert_bf16_exact(v, k)
        assert_f16_exact(v, k)
    return w


def _gain(rng, n):
    # 1 + N(0, 0.1) on a 2**-6 grid: values in ~[0.7, 1.3] need <= 7 significant bits
    return pow2_vector(rng, n, 1.0, 0.1, frac_bits=6)


def _bias(rng, n):
    # N(0, 0.1) on a 2**-10 grid (|q| <= 255 -> bf16-exact); stored F32 on disk
    return pow2_vector(rng, n, 0.0, 0.1, frac_bits=10)
