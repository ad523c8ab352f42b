"""Named fixture cases and a random-config generator.

A *case* is a plain dict:
  name, seed, n_tokens           -- identity / evaluation sequence length
  config                         -- the exact HF config.json content (dict)
  layer_kinds                    -- resolved [("full"|"sliding", "dense"|"sparse")] per layer
  quant                          -- list of compressed-tensors variants to export
  gguf_swa_pattern               -- "array": write laguna.attention.sliding_window_pattern
                                    (per-layer bools); "omit": leave it out (only allowed
                                    when the llama.cpp default, full iff l % 4 == 0, holds)
  sensitivity                    -- run the "can the fixture tell right from wrong" checks
  notes                          -- free text copied into meta.json
"""
from __future__ import annotations

import copy
import math

import numpy as np

FULL, SLIDING = "full_attention", "sliding_attention"

BASE_CONFIG = {
    "architectures": ["LagunaForCausalLM"],
    "model_type": "laguna",
    "vocab_size": 512,
    "hidden_size": 64,
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
}

CT_INT4 = {"dir": "ct-int4", "num_bits": 4, "strategy": "group", "group_size": 32, "symmetric": True}
CT_INT4_ASYM = {"dir": "ct-int4-asym", "num_bits": 4, "strategy": "group", "group_size": 32, "symmetric": False}
CT_INT8 = {"dir": "ct-int8", "num_bits": 8, "strategy": "channel", "group_size": None, "symmetric": True}


def resolve_layer_kinds(config: dict) -> list[tuple[str, str]]:
    """(attention kind, mlp kind) per layer as transformers 5.23 resolves them, after
    checking that the legacy rule (mlp_only_layers / decoder_sparse_step) agrees."""
    L = config["num_hidden_layers"]
    lt = config.get("layer_types") or [FULL] * L
    mlt = config.get("mlp_layer_types")
    if mlt is None:
        mlt = ["dense"] + ["sparse"] * (L - 1)          # transformers default
    if "mlp_only_layers" in config or "decoder_sparse_step" in config:
        only = config.get("mlp_only_layers", [])
        step = config.get("decoder_sparse_step", 1)
        legacy = ["sparse" if (l not in only and config["num_experts"] > 0 and (l + 1) % step == 0)
                  else "dense" for l in range(L)]
        assert legacy == mlt, f"legacy MLP schema {legacy} disagrees with transformers' {mlt}"
    return [("sliding" if t == SLIDING else "full", m) for t, m in zip(lt, mlt)]


def _finish(case: dict) -> dict:
    cfg = case["config"]
    case["layer_kinds"] = resolve_layer_kinds(cfg)
    kinds = [a for a, _ in case["layer_kinds"]]
    if case.get("gguf_swa_pattern") == "omit" and "sliding" in kinds:
        default = ["full" if l % 4 == 0 else "sliding" for l in range(len(kinds))]
        assert kinds == default, "gguf_swa_pattern=omit needs the llama.cpp default pattern"
    if "sliding" not in kinds:
        assert "sliding_window" not in cfg, "drop sliding_window when no layer slides"
    else:
        assert case["n_tokens"] > 2 * cfg["sliding_window"], "sequence must exceed 2 windows"
    return case


def hybrid_perhead() -> dict:
    L = 5
    cfg = copy.deepcopy(BASE_CONFIG)
    cfg.update({
        "num_hidden_layers": L,
        "layer_types": [FULL, SLIDING, SLIDING, FULL, SLIDING],      # irregular
        "sliding_window": 8,
        "num_attention_heads": 4,
        "num_attention_heads_per_layer": [4, 8, 8, 4, 8],
        "num_key_value_heads": 2,
        "head_dim": 16,
        "gating": "per-head",
        "intermediate_size": 96,
        "mlp_layer_types": ["dense"] + ["sparse"] * (L - 1),
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64,
        "moe_routed_scaling_factor": 2.5,
        # YaRN tuned for rd = 16*0.5 = 8 rotary dims (4 frequency pairs) and positions < 64:
        # theta 1000 -> inv_freq = 1, .178, .0316, .0056;  corr_dim(beta) = 8 ln(L0/(2 pi beta)) / (2 ln 1000)
        #   beta_fast 64 -> 0.77 -> low 0  (llama.cpp default 32 would give low 1)
        #   beta_slow 2  -> 2.78 -> high 3 (default 1 would give high 4)
        # => ramp = i/3: dims 1,2 blended, dim 3 fully interpolated (/8).
        "rope_parameters": {
            FULL: {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 8.0,
                   "original_max_position_embeddings": 1536, "beta_fast": 64.0, "beta_slow": 2.0,
                   "attention_factor": 1.125, "partial_rotary_factor": 0.5},
            SLIDING: {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
        },
        "max_position_embeddings": 12288,
    })
    return _finish({
        "name": "hybrid_perhead", "seed": 1001, "n_tokens": 40, "config": cfg,
        "quant": [CT_INT4, CT_INT8, CT_INT4_ASYM], "gguf_swa_pattern": "array", "sensitivity": True,
        "notes": "irregular full/sliding pattern (needs the GGUF per-layer bool array), per-layer heads, "
                 "YaRN with explicit attention_factor 1.125 != default 1.2079 and non-default betas, "
                 "partial rotary 0.5 on full layers, per-head gate, 8 experts top-2 + shared, scale 2.5.",
    })


def perelem_legacy() -> dict:
    L = 4
    cfg = copy.deepcopy(BASE_CONFIG)
    cfg.update({
        "num_hidden_layers": L,
        # no layer_types (=> all full attention), no sliding_window key
        "num_attention_heads": 4,                          # uniform, no per-layer list (M.1 style)
        "num_key_value_heads": 2,
        "head_dim": 16,
        "gating": "per-element",                           # g_proj out = Hq * D
        "intermediate_size": 64,
        # legacy schema; transformers ignores these and uses mlp_layer_types' default
        # [dense] + [sparse]*(L-1), which is exactly what the legacy rule gives here.
        "mlp_only_layers": [0],
        "decoder_sparse_step": 1,
        "num_experts": 6,
        "num_experts_per_tok": 3,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "moe_routed_scaling_factor": 1.0,
        # full rotary with YaRN, no attention_factor (=> mscale 0.1 ln 4 + 1), default betas;
        # theta 1e4, rd 16: low = 0, high = 4 for L0 = 512.
        "rope_parameters": {
            FULL: {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                   "original_max_position_embeddings": 512, "partial_rotary_factor": 1.0},
        },
        "max_position_embeddings": 2048,
    })
    return _finish({
        "name": "perelem_legacy", "seed": 2002, "n_tokens": 40, "config": cfg,
        "quant": [CT_INT4, CT_INT8], "gguf_swa_pattern": "array", "sensitivity": False,
        "notes": "M.1-like: all full attention (no layer_types, no sliding_window key), per-element gate, "
                 "legacy mlp_only_layers/decoder_sparse_step schema (agrees with transformers' default), "
                 "no attention_factor (default YaRN mscale), top-3 of 6 experts, routed scale 1.0.",
    })


def xs2_style() -> dict:
    L = 6
    cfg = copy.deepcopy(BASE_CONFIG)
    cfg.update({
        "num_hidden_layers": L,
        "layer_types": [FULL if l % 4 == 0 else SLIDING for l in range(L)],
        "sliding_window": 16,
        "num_attention_heads": 4,
        "num_attention_heads_per_layer": [4 if l % 4 == 0 else 6 for l in range(L)],
        "num_key_value_heads": 2,
        "head_dim": 16,
        "gating": True,                                    # == per-head in transformers
        "intermediate_size": 64,
        "mlp_layer_types": ["dense"] + ["sparse"] * (L - 1),
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "moe_routed_scaling_factor": 2.5,
        "rope_parameters": {
            FULL: {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 32.0,
                   "original_max_position_embeddings": 4096, "beta_fast": 64.0, "beta_slow": 1.0,
                   "attention_factor": 1.0, "partial_rotary_factor": 0.5},
            SLIDING: {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
        },
        "max_position_embeddings": 131072,
    })
    return _finish({
        "name": "xs2_style", "seed": 3003, "n_tokens": 48, "config": cfg,
        "quant": [CT_INT4, CT_INT8], "gguf_swa_pattern": "omit", "sensitivity": False,
        "notes": "XS.2-like: gating true, attention_factor 1.0 (HF applies no mscale; llama.cpp needs the "
                 "attn_factor override), full iff l % 4 == 0, window 16. The GGUF omits "
                 "sliding_window_pattern like the official XS.2 GGUFs (llama.cpp default pattern applies).",
    })


NAMED_CASES = {
    "hybrid_perhead": hybrid_perhead,
    "perelem_legacy": perelem_legacy,
    "xs2_style": xs2_style,
}


def random_case(seed: int, name: str | None = None) -> dict:
    """Draw a fresh random (but valid, converter- and llama.cpp-expressible) config."""
    rng = np.random.default_rng(seed)
    ch = lambda xs: xs[int(rng.integers(len(xs)))]
    L = int(rng.integers(2, 7))
    D = int(ch([16, 32]))
    hkv = int(ch([1, 2]))
    full_heads = hkv * int(ch([1, 2, 3, 4])) if D == 16 else hkv * int(ch([1, 2]))
    sliding_heads = hkv * int(ch([1, 2, 3, 4])) if D == 16 else hkv * int(ch([1, 2]))
    # q_proj width must stay a multiple of 32 (Q8_0 / o_proj rows)
    while full_heads * D % 32:
        full_heads += hkv
    while sliding_heads * D % 32:
        sliding_heads += hkv
    attn_mode = ch(["all_full", "periodic4", "random"])
    if attn_mode == "all_full":
        kinds = ["full"] * L
    elif attn_mode == "periodic4":
        kinds = ["full" if l % 4 == 0 else "sliding" for l in range(L)]
    else:
        kinds = [ch(["full", "sliding"]) for _ in range(L)]
        if "full" not in kinds:
            kinds[int(rng.integers(L))] = "full"
    has_swa = "sliding" in kinds
    n_dense = int(ch([0, 1, 1, 2])) if L > 2 else 1
    n_dense = min(n_dense, L - 1)
    E = int(ch([2, 4, 6, 8]))
    K = int(rng.integers(1, min(E - 1, 4) + 1))   # K < E: selection must matter
    gate = ch([True, "per-head", "per-element"])
    schema = ch(["mlp_layer_types", "legacy"]) if n_dense == 1 else "mlp_layer_types"
    window = int(ch([4, 8, 16]))
    n_tokens = int(rng.integers(max(40, 2 * window + 9), 65))

    cfg = copy.deepcopy(BASE_CONFIG)
    cfg.update({
        "num_hidden_layers": L,
        "num_attention_heads": full_heads,
        "num_key_value_heads": hkv,
        "head_dim": D,
        "gating": gate,
        "intermediate_size": int(ch([32, 64, 96, 128])),
        "num_experts": E,
        "num_experts_per_tok": K,
        "moe_intermediate_size": int(ch([32, 64])),
        "shared_expert_intermediate_size": int(ch([32, 64])),
        "moe_routed_scaling_factor": float(ch([1.0, 2.5, 1.5])),
    })
    heads = [full_heads if k == "full" else sliding_heads for k in kinds]
    if has_swa or rng.random() < 0.5:
        cfg["layer_types"] = [FULL if k == "full" else SLIDING for k in kinds]
    if has_swa:
        cfg["sliding_window"] = window
    if len(set(heads)) > 1 or rng.random() < 0.5:
        cfg["num_attention_heads_per_layer"] = heads
    if schema == "legacy":
        cfg["mlp_only_layers"] = [0]
        cfg["decoder_sparse_step"] = 1
    else:
        cfg["mlp_layer_types"] = ["dense"] * n_dense + ["sparse"] * (L - n_dense)

    partial = float(ch([0.5, 1.0]))
    rd = int(D * partial)
    theta = float(ch([1000.0, 10000.0, 500000.0]))
    full_rope = {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": partial}
    if rng.random() < 0.75:
        factor = float(ch([4.0, 8.0, 16.0, 32.0]))
        # choose L0 so that corr_dim(beta_slow=1) lands inside the rotary dims
        target_high = float(rng.uniform(1.5, rd / 2 - 0.5))
        L0 = int(round(2 * math.pi * math.exp(target_high * 2 * math.log(theta) / rd)))
        L0 = max(L0, 16)
        full_rope.update({"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": L0})
        if rng.random() < 0.5:
            full_rope["beta_fast"] = float(ch([16.0, 32.0, 64.0]))
            full_rope["beta_slow"] = float(ch([1.0, 2.0]))
        if rng.random() < 0.6:
            full_rope["attention_factor"] = float(ch([1.0, 1.125, 1.25, 1.5]))
        cfg["max_position_embeddings"] = int(L0 * factor)
    else:
        cfg["max_position_embeddings"] = 4096
    rope = {FULL: full_rope}
    if has_swa:
        rope[SLIDING] = {"rope_type": "default", "rope_theta": float(ch([10000.0, 1000.0])),
                         "partial_rotary_factor": float(ch([1.0, 0.5]))}
    cfg["rope_parameters"] = rope

    kinds_attn = ["full" if k == "full" else "sliding" for k in kinds]
    default_pattern = ["full" if l % 4 == 0 else "sliding" for l in range(L)]
    pattern_mode = "omit" if (has_swa and kinds_attn == default_pattern and rng.random() < 0.5) else "array"
    return _finish({
        "name": name or f"random_{seed}", "seed": int(seed) * 7 + 11, "n_tokens": n_tokens, "config": cfg,
        "quant": [CT_INT4] + ([CT_INT4_ASYM] if rng.random() < 0.5 else [CT_INT8]),
        "gguf_swa_pattern": pattern_mode, "sensitivity": False,
        "notes": f"random config drawn with --random-config {seed}",
    })


def get_case(name: str) -> dict:
    return NAMED_CASES[name]()
