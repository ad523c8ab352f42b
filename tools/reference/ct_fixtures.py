#!/usr/bin/env python3
"""Writes the compressed-tensors oracle fixtures under gguf/tests/fixtures/hf/.

Run with the reference venv (torch, transformers 5.23.0, compressed-tensors 0.20.0,
safetensors):

    /work/venv/ref/bin/python tools/reference/ct_fixtures.py

Each fixture directory holds what compressed-tensors itself writes for a small set of
Linears (its compressor packs the weights, `ModelCompressor.update_config` writes the
`quantization_config` into config.json), plus `reference.safetensors`: every quantised
module's weight as compressed-tensors' own `decompress_model` returns it, in that
function's output dtype (the scale dtype), so the Rust decoders can be compared bit for bit.

Scales and zero points are computed by compressed-tensors' `calculate_qparams` from
min/max statistics of each scale group (the same statistics llm-compressor's min-max
observer collects), then the real compressor quantises and packs.

Also writes `fp8_e4m3_table.safetensors` (all 256 E4M3 codes and their f32 values as torch
decodes them) and `tiny_laguna/` (a tiny random LagunaForCausalLM saved by transformers'
own `save_pretrained`, to check the tensor names and config.json it really writes).
"""

import json
import math
import os
import sys

import compressed_tensors
import safetensors
import torch
import transformers
from compressed_tensors.compressors.model_compressors.model_compressor import ModelCompressor
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    apply_quantization_config,
)
from compressed_tensors.quantization.utils.helpers import calculate_qparams
from safetensors.torch import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
OUT = os.path.normpath(os.path.join(ROOT, "gguf", "tests", "fixtures", "hf"))


def versions():
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "compressed_tensors": compressed_tensors.__version__,
        "safetensors": safetensors.__version__,
        "python": sys.version.split()[0],
    }


class Net(torch.nn.Module):
    """A flat set of bias-free Linears, named `layers.N.<name>` like a model's modules."""

    def __init__(self, shapes):
        super().__init__()
        self.layers = torch.nn.ModuleDict()
        for name, (out_f, in_f) in shapes.items():
            self.layers[name] = torch.nn.Linear(in_f, out_f, bias=False)


def fill_weights(net, seed):
    """Random weights with structure: per-row magnitudes spanning 2^-6..2^3, an outlier
    column, one all-zero scale group (scale falls back to eps) and a one-signed row."""
    g = torch.Generator().manual_seed(seed)
    for name, lin in net.layers.items():
        out_f, in_f = lin.weight.shape
        w = torch.randn(out_f, in_f, generator=g)
        w *= torch.exp2(torch.randint(-6, 4, (out_f, 1), generator=g).float())
        w[:, 3] *= 6.0
        w[1, :32] = 0.0
        w[2] = w[2].abs() + 0.01
        lin.weight.data = w.to(lin.weight.dtype)


def group_stats(w, args):
    """Min and max of each scale group of `w` for the strategy in `args`."""
    w = w.float()
    s = args.strategy
    if s == "tensor":
        return w.min(), w.max()
    if s == "channel":
        return w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    if s == "group":
        out_f, in_f = w.shape
        v = w.reshape(out_f, in_f // args.group_size, args.group_size)
        return v.amin(dim=-1), v.amax(dim=-1)
    if s == "block":
        bh, bw = args.block_structure
        out_f, in_f = w.shape
        nr, nc = math.ceil(out_f / bh), math.ceil(in_f / bw)
        p = torch.nn.functional.pad(w, (0, nc * bw - in_f, 0, nr * bh - out_f))
        v = p.reshape(nr, bh, nc, bw)
        return v.amin(dim=(1, 3)), v.amax(dim=(1, 3))
    raise ValueError(s)


def calibrate(net):
    for lin in net.layers.values():
        scheme = getattr(lin, "quantization_scheme", None)
        if scheme is None or scheme.weights is None:
            continue
        lo, hi = group_stats(lin.weight.data, scheme.weights)
        scale, zp = calculate_qparams(lo, hi, scheme.weights)
        lin.weight_scale.data = scale.to(lin.weight_scale.dtype).reshape(lin.weight_scale.shape)
        if hasattr(lin, "weight_zero_point"):
            lin.weight_zero_point.data = zp.to(lin.weight_zero_point.dtype).reshape(
                lin.weight_zero_point.shape
            )
        if hasattr(lin, "input_scale"):
            # Static input activations: a fixed, non-trivial scale (unused by the loader).
            lin.input_scale.data = torch.full_like(lin.input_scale, 0.0625)


def int_args(bits, strategy, symmetric, group_size=None):
    return QuantizationArgs(
        num_bits=bits,
        type="int",
        symmetric=symmetric,
        strategy=strategy,
        group_size=group_size,
    )


def write_fixture(name, dtype, shapes, groups, ignore, seed, extra_config=None):
    """Quantises `shapes` with `groups` ({group: (targets, weights args, input args)}) and
    writes config.json, model.safetensors and reference.safetensors into OUT/name."""
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    net = Net(shapes).to(dtype)
    fill_weights(net, seed)
    config_groups = {
        g: QuantizationScheme(targets=t, weights=w, input_activations=ia)
        for g, (t, w, ia) in groups.items()
    }
    qcfg = QuantizationConfig(config_groups=config_groups, ignore=ignore)
    apply_quantization_config(net, qcfg)
    calibrate(net)

    compressor = ModelCompressor.from_pretrained_model(net)
    compressor.compress_model(net)
    state = {k: v.contiguous() for k, v in net.state_dict().items()}
    save_file(state, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    config = {"fixture": name, "versions": versions(), "torch_dtype": str(dtype).split(".")[1]}
    config.update(extra_config or {})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    compressor.update_config(d)

    # compressed-tensors' own decompression of the very tensors just written.
    compressor.decompress_model(net)
    ref = {}
    for mod_name, lin in net.layers.items():
        if getattr(lin, "quantization_scheme", None) is not None:
            ref[f"layers.{mod_name}.weight"] = lin.weight.data.contiguous()
    save_file(ref, os.path.join(d, "reference.safetensors"), metadata={"format": "pt"})
    print(name, {k: (tuple(v.shape), str(v.dtype)) for k, v in state.items()})


def fp8_table():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    vals = codes.view(torch.float8_e4m3fn).float()
    save_file(
        {"codes": codes, "values": vals},
        os.path.join(OUT, "fp8_e4m3_table.safetensors"),
        metadata={"torch": torch.__version__},
    )


def tiny_laguna():
    from transformers import LagunaConfig, LagunaForCausalLM

    torch.manual_seed(7)
    cfg = LagunaConfig(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_attention_heads_per_layer=[4, 6, 4],
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=4096,
        sliding_window=16,
        layer_types=["full_attention", "sliding_attention", "full_attention"],
        mlp_layer_types=["dense", "sparse", "sparse"],
        moe_intermediate_size=16,
        shared_expert_intermediate_size=8,
        num_experts=4,
        num_experts_per_tok=2,
        moe_routed_scaling_factor=2.5,
        gating="per-head",
        rope_parameters={
            "full_attention": {
                "rope_type": "yarn",
                "rope_theta": 500000.0,
                "factor": 32.0,
                "original_max_position_embeddings": 512,
                "beta_fast": 64.0,
                "beta_slow": 1.0,
                "partial_rotary_factor": 0.5,
            },
            "sliding_attention": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 1.0,
            },
        },
        bos_token_id=2,
        eos_token_id=[2, 24],
        dtype="bfloat16",
    )
    model = LagunaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p, dtype=torch.float32).to(p.dtype) * 0.1)
    d = os.path.join(OUT, "tiny_laguna")
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d)
    with open(os.path.join(d, "versions.json"), "w") as f:
        json.dump(versions(), f, indent=2, sort_keys=True)
    with safetensors.safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        print("tiny_laguna", sorted(f.keys()))


def main():
    os.makedirs(OUT, exist_ok=True)
    bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32

    # bf16 scales: the W4A16 family, 3-bit dense packing, int8 pack, FP8 block 128.
    write_fixture(
        "ct_mixed_bf16",
        bf16,
        {
            "int4_sym_a": (16, 64),
            "int4_sym_b": (24, 96),
            "int4_asym_a": (16, 64),
            "int4_asym_b": (20, 96),
            "int3_sym": (12, 64),
            "int8_ch": (16, 72),
            "fp8_block_a": (24, 96),
            "fp8_block_b": (130, 136),
            "skipped": (8, 32),
        },
        {
            "group_0": (["re:.*int4_sym_[ab]$"], int_args(4, "group", True, 32), None),
            "group_1": (["re:.*int4_asym"], int_args(4, "group", False, 32), None),
            "group_2": (["layers.int3_sym"], int_args(3, "group", True, 32), None),
            "group_3": (["re:.*int8_ch$"], int_args(8, "channel", True), None),
            "group_4": (
                ["re:.*fp8_block"],
                QuantizationArgs(
                    num_bits=8, type="float", symmetric=True, strategy="block", block_structure=[128, 128]
                ),
                QuantizationArgs(
                    num_bits=8, type="float", symmetric=True, strategy="group", group_size=128, dynamic=True
                ),
            ),
        },
        ["re:.*skipped$"],
        seed=1,
    )

    # f16 scales: asymmetric channel int8 (8-bit packed zero points), asymmetric int4 with
    # rows that do not fill a zero-point word, FP8 channel (FP8_DYNAMIC).
    write_fixture(
        "ct_mixed_f16",
        f16,
        {
            "int8_asym_ch": (20, 64),
            "int4_asym_ch": (13, 40),
            "int4_asym_g": (11, 64),
            "fp8_ch": (24, 96),
        },
        {
            "group_0": (["re:.*int8_asym"], int_args(8, "channel", False), None),
            "group_1": (["re:.*int4_asym_ch$"], int_args(4, "channel", False), None),
            "group_2": (["re:.*int4_asym_g$"], int_args(4, "group", False, 16), None),
            "group_3": (
                ["re:.*fp8_ch$"],
                QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="channel"),
                QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="token", dynamic=True),
            ),
        },
        [],
        seed=2,
    )

    # f32 scales: W8A8 int-quantized (unpacked I8; channel sym, tensor asym) and FP8 tensor
    # with a static input scale.
    write_fixture(
        "ct_w8a8_f32",
        f32,
        {
            "int8_ch": (16, 64),
            "int8_tensor_asym": (12, 48),
            "fp8_tensor": (16, 64),
        },
        {
            "group_0": (
                ["re:.*int8_ch$"],
                int_args(8, "channel", True),
                QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True),
            ),
            "group_1": (
                ["re:.*int8_tensor_asym$"],
                int_args(8, "tensor", False),
                QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True),
            ),
            "group_2": (
                ["re:.*fp8_tensor$"],
                QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="tensor"),
                QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="tensor"),
            ),
        },
        [],
        seed=3,
    )

    fp8_table()
    tiny_laguna()
    with open(os.path.join(OUT, "VERSIONS.json"), "w") as f:
        json.dump(versions(), f, indent=2, sort_keys=True)


if __name__ == "__main__":
    main()
