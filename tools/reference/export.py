"""Write a case's weights as HF checkpoints:

  hf-f32/        config.json (torch_dtype float32) + model.safetensors (all F32) + tokenizer
  hf-bf16/       same values as BF16 (e_score_correction_bias stays F32, as in the releases);
                 no tokenizer copy (to keep fixtures small) -- use hf-f32's
  ct-int4/ ...   compressed-tensors "pack-quantized" checkpoints: routed experts only (ignore
                 list as spec §9.2), everything else BF16, bias F32. Packing is done by
                 compressed-tensors' own PackedQuantizationCompressor; the scales are powers
                 of two so compressed-tensors' bf16 dequantisation is exact.

The GGUF files are made by convert_gguf.py from hf-f32/.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from make_tokenizer import write_tokenizer

EXPERT_RE = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
KEEP_F32 = ("e_score_correction_bias",)


def _save(path: Path, tensors: dict[str, torch.Tensor], fmt_meta: dict | None = None) -> None:
    meta = {"format": "pt"}
    if fmt_meta:
        meta.update(fmt_meta)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=meta)


def write_config(out_dir: Path, cfg: dict, dtype: str, extra: dict | None = None) -> None:
    c = dict(cfg)
    c["torch_dtype"] = dtype
    if extra:
        c.update(extra)
    (out_dir / "config.json").write_text(json.dumps(c, indent=2) + "\n")


def export_hf(case: dict, weights: dict[str, np.ndarray], out_dir: Path, dtype: str,
              with_tokenizer: bool = True) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    tensors = {}
    for k, v in weights.items():
        t = torch.from_numpy(v)
        tensors[k] = t if k.endswith(KEEP_F32) else t.to(tdtype)
        assert torch.equal(tensors[k].float(), t), k
    _save(out_dir / "model.safetensors", tensors)
    write_config(out_dir, case["config"], dtype)
    if with_tokenizer:
        write_tokenizer(out_dir, case["config"]["vocab_size"], case["config"]["max_position_embeddings"])


# ----------------------------------------------------------------------------------------
# compressed-tensors
# ----------------------------------------------------------------------------------------

def ct_ignore_list(case: dict) -> list[str]:
    ign = [
        "lm_head",
        r"re:.*\.self_attn\.(q|k|v|o|g)_proj$",
        r"re:.*\.mlp\.gate$",
    ]
    for l, (_, mlp) in enumerate(case["layer_kinds"]):
        if mlp == "dense":
            ign += [f"model.layers.{l}.mlp.gate_proj", f"model.layers.{l}.mlp.up_proj",
                    f"model.layers.{l}.mlp.down_proj"]
    ign.append(r"re:.*\.mlp\.shared_expert\.(gate|up|down)_proj$")
    return ign


def ct_scheme(variant: dict):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    args = QuantizationArgs(
        num_bits=variant["num_bits"], type="int", symmetric=variant["symmetric"],
        strategy=variant["strategy"], group_size=variant["group_size"], dynamic=False,
        observer="minmax",
    )
    return QuantizationScheme(targets=["Linear"], weights=args, input_activations=None,
                              output_activations=None, format="pack-quantized")


def fake_quant_pow2(w: np.ndarray, variant: dict):
    """Quantise w [N, K] with power-of-two scales. Returns (q int8 [N,K], scale f32 [N,G],
    zero_point int8 [N,G] or None, dequantised f32 [N,K]) -- exact arithmetic."""
    bits = variant["num_bits"]
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    N, K = w.shape
    g = variant["group_size"] if variant["strategy"] == "group" else K
    wb = w.astype(np.float64).reshape(N, K // g, g)
    if variant["symmetric"]:
        amax = np.maximum(np.abs(wb).max(-1, keepdims=True), 1e-30)
        # largest power of two with amax/s <= qmax + 0.5 would clamp the max at most by half a
        # step; use the nearest power of two to amax/(qmax+0.5) so the grid is well used.
        s = np.exp2(np.round(np.log2(amax / (qmax + 0.5))))
        zp = None
        q = np.clip(np.round(wb / s), qmin, qmax)
        deq = q * s
    else:
        lo = np.minimum(wb.min(-1, keepdims=True), 0.0)
        hi = np.maximum(wb.max(-1, keepdims=True), 0.0)
        s = np.exp2(np.ceil(np.log2(np.maximum(hi - lo, 1e-30) / (qmax - qmin))))
        zp = np.clip(np.round(qmin - lo / s), qmin, qmax)
        q = np.clip(np.round(wb / s) + zp, qmin, qmax)
        deq = (q - zp) * s
    to2 = lambda a: a.reshape(N, -1)
    return (to2(q).astype(np.int8), s.reshape(N, -1).astype(np.float32),
            None if zp is None else zp.reshape(N, -1).astype(np.int8), to2(deq).astype(np.float32))


def ct_quantization_config(case: dict, variant: dict) -> dict:
    import compressed_tensors
    from compressed_tensors.quantization import QuantizationConfig
    qc = QuantizationConfig(
        config_groups={"group_0": ct_scheme(variant)},
        format="pack-quantized",
        quantization_status="compressed",
        ignore=ct_ignore_list(case),
    )
    d = qc.model_dump(exclude=["quant_method"], mode="json")
    return {"version": compressed_tensors.__version__, "quant_method": "compressed-tensors",
            "sparsity_config": {}, "transform_config": {}, **d}


def export_ct(case: dict, weights: dict[str, np.ndarray], out_dir: Path, variant: dict) -> dict[str, np.ndarray]:
    """Write a compressed-tensors checkpoint; return the exact dequantised weights (f32) of
    the whole model (for cross-checking compressed-tensors' own decompression)."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor

    out_dir.mkdir(parents=True, exist_ok=True)
    scheme = ct_scheme(variant)
    tensors: dict[str, torch.Tensor] = {}
    deq_all: dict[str, np.ndarray] = {}
    for k, v in weights.items():
        m = EXPERT_RE.match(k)
        if not m:
            t = torch.from_numpy(v)
            tensors[k] = t if k.endswith(KEEP_F32) else t.to(torch.bfloat16)
            deq_all[k] = v
            continue
        q, s, zp, deq = fake_quant_pow2(v, variant)
        sd = {"weight": torch.from_numpy(deq).to(torch.bfloat16),
              "weight_scale": torch.from_numpy(s).to(torch.bfloat16)}
        assert torch.equal(sd["weight"].float(), torch.from_numpy(deq))
        assert torch.equal(sd["weight_scale"].float(), torch.from_numpy(s))
        if zp is not None:
            sd["weight_zero_point"] = torch.from_numpy(zp)
        comp = PackedQuantizationCompressor.compress(sd, scheme)
        mod = k[: -len(".weight")]
        for pk, pv in comp.items():
            tensors[f"{mod}.{pk}"] = pv
        # sanity: our integer codes are what compressed-tensors packed
        from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
        unpacked = unpack_from_int32(comp["weight_packed"], variant["num_bits"], torch.Size(v.shape))
        assert torch.equal(unpacked, torch.from_numpy(q)), k
        deq_all[k] = deq
    _save(out_dir / "model.safetensors", tensors)
    write_config(out_dir, case["config"], "bfloat16",
                 {"quantization_config": ct_quantization_config(case, variant)})
    return deq_all


def ct_dequantise_with_compressed_tensors(ct_dir: Path) -> dict[str, torch.Tensor]:
    """compressed-tensors' own model-free decompression (bf16 result, like a W4A16 kernel's
    weights), returned in on-disk HF naming."""
    from safetensors.torch import load_file
    from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import CompressedTensorsDequantizer
    deq = CompressedTensorsDequantizer(str(ct_dir), dtype=torch.bfloat16)
    tensors = load_file(str(Path(ct_dir) / "model.safetensors"))
    out = deq.validate(dict(tensors))
    return out


def copy_tokenizer(src: Path, dst: Path) -> None:
    for f in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]:
        if (src / f).exists():
            shutil.copy(src / f, dst / f)
