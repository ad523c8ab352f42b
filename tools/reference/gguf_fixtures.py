#!/usr/bin/env python3
"""Writes the GGUF oracle fixtures for lagoon-gguf's reader tests with gguf-py, an
independent writer (llama.cpp's gguf-py; the version used is recorded in each manifest).

    /work/venv/ref/bin/python tools/reference/gguf_fixtures.py [OUT_DIR]

OUT_DIR defaults to gguf/tests/fixtures/gguf. It writes:

* all_types.gguf + all_types.json: every metadata value type (u8..f64, bool, string,
  arrays of each, arrays of strings, empty arrays, nested arrays), `general.alignment` 64,
  and F32 / F16 / BF16 / Q8_0 tensors (1-D, 2-D, 3-D).
* tiny_laguna-0000{1,2}-of-00002.gguf + tiny_laguna.json: a tiny but complete Laguna model
  (3 layers: dense + 2 MoE, per-layer heads, sliding layers, YaRN) split into two shards
  by gguf-py's own splitter, exactly as gguf-split lays them out (all metadata in shard 0,
  split.* keys in every shard), with the ModelConfig values the loader must derive.

Manifests give floats as IEEE bit patterns (so NaN, -0.0 and inf compare exactly) and
tensor bytes as hex (all_types) or FNV-1a-64 (tiny_laguna), plus each tensor's absolute
data offset as gguf-py's own GGUFReader reports it.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import struct
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as T

ROOT = Path(__file__).resolve().parents[2]


class Writer(gguf.GGUFWriter):
    """gguf-py refuses empty arrays ("Invalid GGUF metadata array. Empty array"), which
    the format allows. Encode them as the format says (element type, count 0) and defer
    everything else to gguf-py."""

    def _pack_val(self, val, vtype, add_vtype, sub_type=None):
        if vtype == T.ARRAY and isinstance(val, Sequence) and len(val) == 0:
            assert sub_type is not None, "an empty array needs an explicit element type"
            out = bytearray()
            if add_vtype:
                out += self._pack("I", vtype)
            out += self._pack("I", sub_type)
            out += self._pack("Q", 0)
            return bytes(out)
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def generator_info() -> dict:
    try:
        version = importlib.metadata.version("gguf")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {
        "tool": "tools/reference/gguf_fixtures.py",
        "gguf_py_version": version,
        "gguf_py_source": "llama.cpp vendored gguf-py (" + str(Path(gguf.__file__).parent) + ")",
        "numpy_version": np.__version__,
    }


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def f64_bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def encode(vtype: T, val, sub_type: T | None = None) -> dict:
    """A value as the manifest spells it: {"type": NAME, "value" | "bits" | "elem"+"items"}."""
    if vtype == T.ARRAY:
        if sub_type is None:
            sub_type = T.get_type(val[0])
        return {"type": "ARRAY", "elem": sub_type.name, "items": [encode(sub_type, v) for v in val]}
    if vtype == T.FLOAT32:
        return {"type": vtype.name, "bits": f32_bits(val)}
    if vtype == T.FLOAT64:
        return {"type": vtype.name, "bits": f64_bits(val)}
    return {"type": vtype.name, "value": val}


def fnv1a64(b: bytes) -> int:
    h = 0xCBF29CE484222325
    for x in b:
        h = ((h ^ x) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def dump(manifest: dict) -> str:
    """JSON with one line per top-level key and per list item: small and diffable."""
    lines = ["{"]
    items = list(manifest.items())
    for i, (k, v) in enumerate(items):
        comma = "," if i + 1 < len(items) else ""
        if isinstance(v, list) and v and isinstance(v[0], dict):
            lines.append(f" {json.dumps(k)}: [")
            for j, x in enumerate(v):
                lines.append("  " + json.dumps(x, ensure_ascii=False) + ("," if j + 1 < len(v) else ""))
            lines.append(" ]" + comma)
        else:
            lines.append(f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}{comma}")
    return "\n".join(lines + ["}"]) + "\n"


def reader_offsets(path: Path) -> dict[str, int]:
    """Absolute data offsets according to gguf-py's reader (a second opinion)."""
    r = gguf.GGUFReader(path)
    return {t.name: int(t.data_offset) for t in r.tensors}


# --------------------------------------------------------------------------- all_types


def write_all_types(out: Path) -> None:
    path = out / "all_types.gguf"
    w = Writer(path, arch="test")
    kv: list[dict] = [{"key": "general.architecture", **encode(T.STRING, "test")}]

    def add(key: str, vtype: T, val, sub_type: T | None = None) -> None:
        w.add_key_value(key, val, vtype, sub_type=sub_type)
        kv.append({"key": key, **encode(vtype, val, sub_type)})

    w.add_custom_alignment(64)
    kv.append({"key": "general.alignment", **encode(T.UINT32, 64)})

    add("test.u8", T.UINT8, 255)
    add("test.i8", T.INT8, -128)
    add("test.u16", T.UINT16, 65535)
    add("test.i16", T.INT16, -32768)
    add("test.u32", T.UINT32, 4294967295)
    add("test.i32", T.INT32, -2147483648)
    add("test.f32", T.FLOAT32, 3.140000104904175)
    add("test.f32_neg_zero", T.FLOAT32, -0.0)
    add("test.f32_inf", T.FLOAT32, math.inf)
    add("test.bool_true", T.BOOL, True)
    add("test.bool_false", T.BOOL, False)
    add("test.str", T.STRING, "héllo ✓ laguna")
    add("test.str_empty", T.STRING, "")
    add("test.str_nul", T.STRING, "a\u0000b")
    add("test.u64", T.UINT64, 18446744073709551615)
    add("test.i64", T.INT64, -9223372036854775808)
    add("test.f64", T.FLOAT64, 2.718281828459045)
    add("test.f64_tiny", T.FLOAT64, 5e-324)

    add("test.arr.u8", T.ARRAY, [0, 1, 255], T.UINT8)
    add("test.arr.i8", T.ARRAY, [-128, 0, 127], T.INT8)
    add("test.arr.u16", T.ARRAY, [0, 65535], T.UINT16)
    add("test.arr.i16", T.ARRAY, [-32768, 32767], T.INT16)
    add("test.arr.u32", T.ARRAY, [48, 64, 64, 64], T.UINT32)
    add("test.arr.i32", T.ARRAY, [-1, 0, 1, 2147483647], T.INT32)
    add("test.arr.f32", T.ARRAY, [1.5, -0.0, math.inf, math.nan], T.FLOAT32)
    add("test.arr.bool", T.ARRAY, [True, False, False, True], T.BOOL)
    add("test.arr.str", T.ARRAY, ["<s>", "", "Ġthe", "✓✓", "a b"], T.STRING)
    add("test.arr.u64", T.ARRAY, [0, 18446744073709551615], T.UINT64)
    add("test.arr.i64", T.ARRAY, [-9223372036854775808, 9223372036854775807], T.INT64)
    add("test.arr.f64", T.ARRAY, [1e300, -2.5, math.nan], T.FLOAT64)
    add("test.arr.long_i32", T.ARRAY, list(range(-50, 50)), T.INT32)
    add("test.arr.empty_u8", T.ARRAY, [], T.UINT8)
    add("test.arr.empty_str", T.ARRAY, [], T.STRING)
    add("test.arr.empty_f64", T.ARRAY, [], T.FLOAT64)
    # ARRAY of ARRAY: gguf-py infers each inner array's element type from its first item
    # (python int -> INT32, str -> STRING).
    add("test.arr.nested_i32", T.ARRAY, [[1, 2, 3], [4]], T.ARRAY)
    add("test.arr.nested_str", T.ARRAY, [["a"], ["b", "c"]], T.ARRAY)

    rng = np.random.default_rng(20240601)
    tensors = []

    def tensor(name: str, arr: np.ndarray, raw_dtype: Q | None, ggml_type: Q, ne: list[int]) -> None:
        w.add_tensor(name, arr, raw_dtype=raw_dtype)
        tensors.append({"name": name, "type": int(ggml_type), "type_name": ggml_type.name,
                        "ne": ne, "data_hex": arr.tobytes().hex()})

    v = rng.standard_normal(3).astype(np.float32)
    tensor("v.weight", v, None, Q.F32, [3])
    h = rng.standard_normal((2, 8)).astype(np.float16)
    tensor("h.weight", h, None, Q.F16, [8, 2])
    q = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), Q.Q8_0)
    tensor("q.weight", q, Q.Q8_0, Q.Q8_0, [64, 2])
    e = rng.standard_normal((2, 3, 4)).astype(np.float32)
    tensor("blk.0.ffn_gate_exps.weight", e, None, Q.F32, [4, 3, 2])
    b = gguf.quants.quantize(rng.standard_normal((3, 5)).astype(np.float32), Q.BF16)
    tensor("b.weight", b, Q.BF16, Q.BF16, [5, 3])

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    offsets = reader_offsets(path)
    for t in tensors:
        t["abs_offset"] = offsets[t["name"]]
    manifest = {"generator": generator_info(), "file": path.name, "alignment": 64,
                "kv": kv, "tensors": tensors}
    (out / "all_types.json").write_text(dump(manifest))


# ---------------------------------------------------------------------- tiny_laguna


def write_tiny_laguna(out: Path) -> None:
    # An HF-style config; the GGUF keys below are what conversion/laguna.py and base.py
    # write for it, and "expect" is what the loader must derive, worked out from HF rules.
    cfg = {
        "vocab_size": 32, "hidden_size": 8, "num_hidden_layers": 3, "head_dim": 4,
        "num_attention_heads_per_layer": [2, 4, 4], "num_key_value_heads": 2,
        "intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 4, "shared_expert_intermediate_size": 6,
        "moe_routed_scaling_factor": 2.5, "rms_norm_eps": 1e-6, "sliding_window": 16,
        "max_position_embeddings": 131072, "bos_token_id": 2, "eos_token_id": [2, 24],
        "rope_full": {"rope_theta": 500000.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                      "beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": 1.25,
                      "partial_rotary_factor": 0.5},
        "rope_sliding": {"rope_theta": 10000.0, "partial_rotary_factor": 1.0},
    }
    L, H, D, V = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["head_dim"], cfg["vocab_size"]
    heads = cfg["num_attention_heads_per_layer"]
    KV, E, I, IS, ID = (cfg["num_key_value_heads"], cfg["num_experts"], cfg["moe_intermediate_size"],
                        cfg["shared_expert_intermediate_size"], cfg["intermediate_size"])
    layer_types = ["full" if l % 4 == 0 else "sliding" for l in range(L)]  # HF layer_types
    mlp_types = ["dense"] + ["sparse"] * (L - 1)

    path = out / "tiny_laguna.gguf"
    w = Writer(path, arch="laguna", split_max_tensors=25)
    arch = "laguna"
    rf, rs = cfg["rope_full"], cfg["rope_sliding"]
    w.add_vocab_size(V)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(ID)
    w.add_head_count(heads)
    w.add_head_count_kv(KV)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_sliding_window(cfg["sliding_window"])
    w.add_rope_dimension_count(int(D * rf["partial_rotary_factor"]))
    w.add_rope_dimension_count_swa(int(D * rs["partial_rotary_factor"]))
    w.add_rope_freq_base(rf["rope_theta"])
    w.add_rope_freq_base_swa(rs["rope_theta"])
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rf["factor"])
    w.add_rope_scaling_orig_ctx_len(rf["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_attn_factor(rf["attention_factor"])
    w.add_rope_scaling_yarn_beta_fast(rf["beta_fast"])
    w.add_rope_scaling_yarn_beta_slow(rf["beta_slow"])
    w.add_expert_count(E)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(I)
    w.add_expert_shared_feed_forward_length(IS)
    w.add_expert_weights_norm(True)
    w.add_expert_weights_scale(cfg["moe_routed_scaling_factor"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_leading_dense_block_count(mlp_types.count("dense"))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("laguna")
    w.add_token_list([f"tok{i}" for i in range(V)])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"][0])
    w.add_eot_token_id(cfg["eos_token_id"][1])

    rng = np.random.default_rng(7)
    tensors = []

    def tensor(name: str, torch_shape: tuple[int, ...], ggml_type: Q) -> None:
        x = rng.standard_normal(torch_shape).astype(np.float32)
        if ggml_type == Q.F32:
            arr, raw = x, None
        elif ggml_type == Q.F16:
            arr, raw = x.astype(np.float16), None
        else:
            arr, raw = gguf.quants.quantize(x, ggml_type), ggml_type
        w.add_tensor(name, arr, raw_dtype=raw)
        tensors.append({"name": name, "type": int(ggml_type), "shape": list(torch_shape),
                        "ne": list(reversed(torch_shape)), "n_bytes": arr.nbytes,
                        "fnv1a64": fnv1a64(arr.tobytes())})

    tensor("token_embd.weight", (V, H), Q.BF16)
    for l in range(L):
        hq = heads[l]
        p = f"blk.{l}."
        tensor(p + "attn_norm.weight", (H,), Q.F32)
        tensor(p + "attn_q.weight", (hq * D, H), Q.F16)
        tensor(p + "attn_k.weight", (KV * D, H), Q.F16)
        tensor(p + "attn_v.weight", (KV * D, H), Q.F16)
        tensor(p + "attn_output.weight", (H, hq * D), Q.F16)
        tensor(p + "attn_q_norm.weight", (D,), Q.F32)
        tensor(p + "attn_k_norm.weight", (D,), Q.F32)
        tensor(p + "attn_gate.weight", (hq, H), Q.F16)
        tensor(p + "ffn_norm.weight", (H,), Q.F32)
        if mlp_types[l] == "dense":
            tensor(p + "ffn_gate.weight", (ID, H), Q.F16)
            tensor(p + "ffn_up.weight", (ID, H), Q.F16)
            tensor(p + "ffn_down.weight", (H, ID), Q.F16)
        else:
            tensor(p + "ffn_gate_inp.weight", (E, H), Q.F32)
            tensor(p + "exp_probs_b.bias", (E,), Q.F32)
            tensor(p + "ffn_gate_exps.weight", (E, I, H), Q.F16)
            tensor(p + "ffn_up_exps.weight", (E, I, H), Q.F16)
            tensor(p + "ffn_down_exps.weight", (E, H, I), Q.F16)
            tensor(p + "ffn_gate_shexp.weight", (IS, H), Q.F16)
            tensor(p + "ffn_up_shexp.weight", (IS, H), Q.F16)
            tensor(p + "ffn_down_shexp.weight", (H, IS), Q.F16)
    tensor("output_norm.weight", (H,), Q.F32)
    tensor("output.weight", (V, H), Q.F16)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    shards = [p.name for p in w.format_shard_names(path)]
    # gguf-py puts tensors in shards in insertion order; record which shard holds each.
    per_shard = 25
    offsets: dict[str, int] = {}
    for s in shards:
        offsets.update(reader_offsets(out / s))
    for i, t in enumerate(tensors):
        t["shard"] = i // per_shard
        t["abs_offset"] = offsets[t["name"]]

    attn_factor = rf.get("attention_factor", 0.1 * math.log(rf["factor"]) + 1.0)
    expect = {
        "vocab_size": V, "hidden_size": H, "n_layers": L, "n_heads": heads, "n_kv_heads": KV,
        "head_dim": D, "layer_types": layer_types, "mlp_types": mlp_types,
        "sliding_window": cfg["sliding_window"], "dense_ffn": ID, "n_experts": E,
        "n_experts_used": cfg["num_experts_per_tok"], "expert_ffn": I, "shared_ffn": IS,
        "routed_scaling_bits": f32_bits(cfg["moe_routed_scaling_factor"]), "norm_topk_prob": True,
        "rms_eps_bits": f32_bits(cfg["rms_norm_eps"]),
        "rope_full": {"theta_bits": f32_bits(rf["rope_theta"]),
                      "rotary_dim": int(D * rf["partial_rotary_factor"]),
                      "yarn": {"factor_bits": f32_bits(rf["factor"]),
                               "original_context": rf["original_max_position_embeddings"],
                               "beta_fast_bits": f32_bits(rf["beta_fast"]),
                               "beta_slow_bits": f32_bits(rf["beta_slow"]),
                               "attention_factor_bits": f32_bits(attn_factor)}},
        "rope_sliding": {"theta_bits": f32_bits(rs["rope_theta"]),
                         "rotary_dim": int(D * rs["partial_rotary_factor"]), "yarn": None},
        "max_position": cfg["max_position_embeddings"], "bos_token": cfg["bos_token_id"],
        "eos_tokens": cfg["eos_token_id"],
    }
    manifest = {"generator": generator_info(), "files": shards, "split_max_tensors": per_shard,
                "expect_config": expect, "tensors": tensors}
    (out / "tiny_laguna.json").write_text(dump(manifest))


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "gguf/tests/fixtures/gguf"
    out.mkdir(parents=True, exist_ok=True)
    write_all_types(out)
    write_tiny_laguna(out)
    for p in sorted(out.iterdir()):
        print(f"{p.stat().st_size:8d}  {p}")


if __name__ == "__main__":
    main()
