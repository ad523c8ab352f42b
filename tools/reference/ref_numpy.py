"""Independent float64 Laguna forward in plain numpy (cross-check of the transformers
reference; written from spec/laguna.md, shares no code with transformers).

Reads config.json + model.safetensors of an hf-* or ct-* directory. For compressed-tensors
checkpoints it unpacks `weight_packed` itself (LSB-first, offset-binary codes, spec §9.1),
independently of compressed-tensors.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np


# ------------------------------------------------------------------------------ loading

def _unpack(packed: np.ndarray, bits: int, n_cols: int) -> np.ndarray:
    """int32 [R, W] -> signed codes [R, n_cols]; element k at bit k*bits (LSB first)."""
    u = packed.astype(np.int64) & 0xFFFFFFFF
    R = u.shape[0]
    per = 32 // bits
    assert 32 % bits == 0
    codes = np.empty((R, u.shape[1] * per), dtype=np.int64)
    for j in range(per):
        codes[:, j::per] = (u >> (bits * j)) & ((1 << bits) - 1)
    return codes[:, :n_cols] - (1 << (bits - 1))


def load_weights(model_dir: Path) -> tuple[dict, dict[str, np.ndarray]]:
    from safetensors.numpy import load_file
    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    raw = load_file(str(model_dir / "model.safetensors")) if not _has_bf16(model_dir) else _load_torch(model_dir)
    qc = cfg.get("quantization_config")
    w: dict[str, np.ndarray] = {}
    if qc is None:
        return cfg, {k: v.astype(np.float64) for k, v in raw.items()}
    (scheme,) = qc["config_groups"].values()
    wa = scheme["weights"]
    bits = wa["num_bits"]
    for k, v in raw.items():
        if k.endswith(".weight_packed"):
            mod = k[: -len(".weight_packed")]
            N, K = (int(x) for x in raw[mod + ".weight_shape"])
            q = _unpack(v, bits, K).astype(np.float64)
            s = raw[mod + ".weight_scale"].astype(np.float64)           # [N, G]
            G = s.shape[1]
            g = K // G
            if not wa["symmetric"]:
                zp = _unpack(raw[mod + ".weight_zero_point"].T.copy(), bits, N).T.astype(np.float64)  # [N, G]
                q = q - np.repeat(zp, g, axis=1)
            w[mod + ".weight"] = q * np.repeat(s, g, axis=1)
        elif k.endswith((".weight_scale", ".weight_shape", ".weight_zero_point")):
            continue
        else:
            w[k] = v.astype(np.float64)
    return cfg, w


def _has_bf16(model_dir: Path) -> bool:
    import struct
    with open(model_dir / "model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    return any(isinstance(v, dict) and v.get("dtype") == "BF16" for v in hdr.values())


def _load_torch(model_dir: Path) -> dict[str, np.ndarray]:
    import torch
    from safetensors.torch import load_file
    out = {}
    for k, v in load_file(str(model_dir / "model.safetensors")).items():
        out[k] = v.to(torch.float64).numpy() if v.is_floating_point() else v.numpy()
    return out


# ------------------------------------------------------------------------------ forward

def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def rope_tables(rp: dict, D: int, T: int, max_pos: int):
    rd = int(D * rp.get("partial_rotary_factor", 1.0))
    base = rp["rope_theta"]
    i = np.arange(rd // 2, dtype=np.float64)
    # transformers computes inv_freq in float32; mimic that rounding so positions agree to 1 ulp
    pos_freq = (np.float32(base) ** (np.arange(0, rd, 2, dtype=np.float32) / np.float32(rd))).astype(np.float64)
    inv = 1.0 / pos_freq
    scale = 1.0
    if rp.get("rope_type", "default") == "yarn":
        f = rp["factor"]
        L0 = rp.get("original_max_position_embeddings", max_pos)
        bf = rp.get("beta_fast") or 32
        bs = rp.get("beta_slow") or 1
        cd = lambda n: rd * math.log(L0 / (n * 2 * math.pi)) / (2 * math.log(base))
        low, high = max(math.floor(cd(bf)), 0), min(math.ceil(cd(bs)), rd - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((i - low) / (high - low), 0, 1)
        inv = (inv / f) * ramp + inv * (1 - ramp)
        scale = rp["attention_factor"] if rp.get("attention_factor") is not None else (
            0.1 * math.log(f) + 1 if f > 1 else 1.0)
    inv = inv.astype(np.float32).astype(np.float64)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    return rd, np.cos(ang) * scale, np.sin(ang) * scale


def apply_rope(x, rd, cos, sin):
    # x [T, H, D]; NeoX half split on the first rd dims
    h = rd // 2
    a, b = x[..., :h], x[..., h:rd]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([a * c - b * s, b * c + a * s, x[..., rd:]], axis=-1)


def forward(cfg: dict, w: dict[str, np.ndarray], tokens: list[int]) -> np.ndarray:
    T = len(tokens)
    L, H, D = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["head_dim"]
    Hkv, eps = cfg["num_key_value_heads"], cfg["rms_norm_eps"]
    heads = cfg.get("num_attention_heads_per_layer") or [cfg["num_attention_heads"]] * L
    ltypes = cfg.get("layer_types") or ["full_attention"] * L
    mtypes = cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (L - 1)
    gating = cfg.get("gating", True)
    per_head = gating is True or gating == "per-head"
    W = cfg.get("sliding_window")
    rope = cfg["rope_parameters"]
    x = w["model.embed_tokens.weight"][tokens]
    pos = np.arange(T)
    causal = pos[None, :] <= pos[:, None]
    for l in range(L):
        p = f"model.layers.{l}."
        Hq = heads[l]
        sliding = ltypes[l] == "sliding_attention"
        h = rms(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, Hq, D)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, Hkv, D)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, Hkv, D)
        q = rms(q, w[p + "self_attn.q_norm.weight"], eps)
        k = rms(k, w[p + "self_attn.k_norm.weight"], eps)
        rd, cos, sin = rope_tables(rope[ltypes[l]], D, T, cfg["max_position_embeddings"])
        q, k = apply_rope(q, rd, cos, sin), apply_rope(k, rd, cos, sin)
        mask = causal & ((pos[:, None] - pos[None, :]) < W) if sliding else causal
        rep = Hq // Hkv
        o = np.empty((T, Hq, D))
        for j in range(Hq):
            s = q[:, j] @ k[:, j // rep].T / math.sqrt(D)
            s = np.where(mask, s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o[:, j] = s @ v[:, j // rep]
        g = softplus(h @ w[p + "self_attn.g_proj.weight"].T)
        o = o * g[:, :, None] if per_head else o * g.reshape(T, Hq, D)
        x = x + o.reshape(T, Hq * D) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        if mtypes[l] == "dense":
            m = p + "mlp."
            x = x + (silu(h @ w[m + "gate_proj.weight"].T) * (h @ w[m + "up_proj.weight"].T)) @ w[m + "down_proj.weight"].T
        else:
            m = p + "mlp."
            sc = 1.0 / (1.0 + np.exp(-(h @ w[m + "gate.weight"].T)))
            sel = sc + w[m + "experts.e_score_correction_bias"][None, :]
            K = cfg["num_experts_per_tok"]
            routed = np.zeros_like(x)
            for t in range(T):
                idx = np.argsort(-sel[t], kind="stable")[:K]
                wt = sc[t, idx] / sc[t, idx].sum()
                for e, we in zip(idx, wt):
                    ep = m + f"experts.{e}."
                    a = silu(h[t] @ w[ep + "gate_proj.weight"].T) * (h[t] @ w[ep + "up_proj.weight"].T)
                    routed[t] += we * (a @ w[ep + "down_proj.weight"].T)
            s_ = m + "shared_expert."
            shared = (silu(h @ w[s_ + "gate_proj.weight"].T) * (h @ w[s_ + "up_proj.weight"].T)) @ w[s_ + "down_proj.weight"].T
            x = x + cfg.get("moe_routed_scaling_factor", 1.0) * routed + shared
    x = rms(x, w["model.norm.weight"], eps)
    return x @ w["lm_head.weight"].T


def numpy_logits(model_dir: Path, tokens: list[int]) -> np.ndarray:
    cfg, w = load_weights(Path(model_dir))
    return forward(cfg, w, tokens)
