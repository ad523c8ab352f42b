"""Export the trained tiny Laguna: HF directory -> Q8_0 GGUF -> reference outputs.

1. the trained weights (RUN/final.pt, transformers' internal names) are snapped to the Q8_0
   grid (per 32 inputs: d = f16(max|x| / 127), x = round(x / d) * d) for every matrix the
   GGUF converter stores as Q8_0 (all 2-D weights but the router, which it keeps F32), so
   the HF checkpoint and the GGUF hold bit-identical values (checked after conversion);
2. HF directory (HF_DIR): config.json, model.safetensors in poolside's on-disk naming
   (per-expert tensors, `mlp.shared_expert`, `mlp.experts.e_score_correction_bias`, as
   tools/reference/make_model.py), tokenizer.json, tokenizer_config.json with the Laguna v8
   chat template; loading it with `LagunaForCausalLM.from_pretrained` must reproduce the
   in-memory model's logits;
3. GGUF: tools/reference/convert_gguf.py --outtype q8_0 -> models/laguna-tiny/model.gguf;
4. references into models/laguna-tiny/: transformers float32 eager logits of a validation
   prompt at a few positions (`logits.transformers.f32`) and greedy generations
   (`reference.json`), plus config.json, tokenizer.json, corpus / run summaries.

Usage: export.py [--run /work/train-out/run] [--data /work/train-out/data] [--hf /work/train-out/hf]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

import common
import train

MODEL_DIR = common.REPO / "models" / "laguna-tiny"
CHAT_TEMPLATE = common.REPO / "tests" / "fixtures" / "chat" / "laguna_v8.jinja"
EVAL_FILE = "reprlib.py"          # a held-out file (common.split_corpus's validation set)
EVAL_TOKENS = 160                 # > 2 sliding windows of 64
EVAL_POSITIONS = [0, 1, 2, 63, 64, 65, 100, 127, 128, 159]
GREEDY_PROMPTS = ["", "    def __repr__(self):\n        return ", "    if not isinstance("]
GREEDY_NEW = 64


def snap_q8_0(x: torch.Tensor) -> torch.Tensor:
    """Nearest values on the Q8_0 grid, blocks of 32 along the last (input) axis."""
    a = x.detach().double().numpy()
    b = a.reshape(-1, 32)
    d = (np.abs(b).max(axis=1, keepdims=True) / 127).astype(np.float16).astype(np.float64)
    q = np.clip(np.round(np.divide(b, d, out=np.zeros_like(b), where=d > 0)), -127, 127)
    return torch.from_numpy((q * d).reshape(a.shape).astype(np.float32))


def poolside_state_dict(model, cfg: dict) -> dict[str, torch.Tensor]:
    """transformers' internal names -> poolside on-disk names (tools/reference/make_model.py)."""
    out = {}
    I = cfg["moe_intermediate_size"]
    for k, v in model.state_dict().items():
        v = v.detach().float().contiguous()
        if ".mlp.experts.gate_up_proj" in k:
            p = k.replace("gate_up_proj", "")
            for e in range(v.shape[0]):
                out[f"{p}{e}.gate_proj.weight"] = v[e, :I].contiguous()
                out[f"{p}{e}.up_proj.weight"] = v[e, I:].contiguous()
        elif ".mlp.experts.down_proj" in k:
            p = k.replace("down_proj", "")
            for e in range(v.shape[0]):
                out[f"{p}{e}.down_proj.weight"] = v[e].contiguous()
        elif k.endswith(".mlp.gate.e_score_correction_bias"):
            out[k.replace(".mlp.gate.", ".mlp.experts.")] = v
        elif ".mlp.shared_experts." in k:
            out[k.replace(".shared_experts.", ".shared_expert.")] = v
        else:
            out[k] = v
    return out


def write_hf(model, hf: Path, data: Path) -> None:
    from safetensors.torch import save_file
    if hf.exists():
        shutil.rmtree(hf)
    hf.mkdir(parents=True)
    cfg = common.config()
    common.write_json(hf / "config.json", cfg)
    save_file(poolside_state_dict(model, cfg), str(hf / "model.safetensors"), metadata={"format": "pt"})
    shutil.copyfile(data / "tokenizer.json", hf / "tokenizer.json")
    common.write_json(hf / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "〈|EOS|〉", "eos_token": "〈|EOS|〉", "pad_token": "<pad>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": cfg["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE.read_text(),
    })
    common.write_json(hf / "special_tokens_map.json", {
        "bos_token": "〈|EOS|〉", "eos_token": "〈|EOS|〉", "pad_token": "<pad>", "unk_token": "<unk>"})


def load_hf(hf: Path):
    from transformers import LagunaForCausalLM
    m, info = LagunaForCausalLM.from_pretrained(hf, dtype=torch.float32, attn_implementation="eager",
                                                output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    assert not bad, bad
    return m.eval()


@torch.no_grad()
def logits(model, ids: list[int]) -> np.ndarray:
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float().numpy()


@torch.no_grad()
def val_loss(model, val: np.ndarray, seq: int = common.SEQ_LEN) -> float:
    """Mean next-token loss over the whole validation stream in consecutive windows."""
    n = (len(val) - 1) // seq
    x = torch.from_numpy(val[: n * seq].astype(np.int64)).view(n, seq)
    tot, cnt = 0.0, 0
    for i in range(0, n, 16):
        xb = x[i:i + 16]
        tot += model(input_ids=xb, labels=xb.clone(), use_cache=False).loss.item() * xb.numel()
        cnt += xb.numel()
    return tot / cnt


def check_gguf(gguf_path: Path, hf_state: dict[str, torch.Tensor]) -> dict:
    """The GGUF's matrices, dequantised by gguf-py, equal the HF tensors bit for bit."""
    import gguf
    r = gguf.GGUFReader(str(gguf_path))
    types = {}
    for t in r.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    deq = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in r.tensors}
    pairs = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight"}
    n_exact = 0
    for g, h in pairs.items():
        assert np.array_equal(deq[g].reshape(-1), hf_state[h].numpy().reshape(-1)), g
        n_exact += 1
    L = common.CONFIG["num_hidden_layers"]
    E = common.CONFIG["num_experts"]
    for l in range(L):
        p = f"model.layers.{l}."
        m = {"attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
             "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight"}
        for g, h in m.items():
            assert np.array_equal(deq[f"blk.{l}.{g}"].reshape(-1), hf_state[p + h].numpy().reshape(-1)), (l, g)
            n_exact += 1
        if f"blk.{l}.ffn_gate_exps.weight" in deq:
            for g, h in (("ffn_gate_exps", "gate_proj"), ("ffn_up_exps", "up_proj"), ("ffn_down_exps", "down_proj")):
                ref = np.stack([hf_state[f"{p}mlp.experts.{e}.{h}.weight"].numpy() for e in range(E)])
                assert np.array_equal(deq[f"blk.{l}.{g}.weight"].reshape(-1), ref.reshape(-1)), (l, g)
                n_exact += 1
    return {"tensor_types": types, "tensors_checked_bit_exact": n_exact}


@torch.no_grad()
def greedy(model, ids: list[int], n: int) -> list[int]:
    out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                         eos_token_id=[2, 24], pad_token_id=9)
    return out[0, len(ids):].tolist()


def top2_margins(model, ids: list[int], gen: list[int]) -> list[float]:
    """Top-1 minus top-2 logit at every greedy step: a near tie there can flip under
    rounding, so the engine test compares the greedy ids only up to the first one."""
    lg = logits(model, ids + gen[:-1])[len(ids) - 1:]
    s = np.sort(lg, axis=1)
    return [round(float(x), 6) for x in s[:, -1] - s[:, -2]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="/work/train-out/run")
    ap.add_argument("--data", default="/work/train-out/data")
    ap.add_argument("--hf", default="/work/train-out/hf")
    a = ap.parse_args()
    torch.set_num_threads(2)
    run, data, hf = Path(a.run), Path(a.data), Path(a.hf)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(data / "tokenizer.json"))
    val = np.load(data / "tokens.npz")["val"]

    model = train.make_model()
    model.load_state_dict(torch.load(run / "final.pt"))
    model.eval()
    vl_trained = val_loss(model, val)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.ndim >= 2 and not n.endswith(".mlp.gate.weight"):
                p.copy_(snap_q8_0(p))
    vl_snapped = val_loss(model, val)
    print(f"val loss trained {vl_trained:.4f}, Q8_0-snapped {vl_snapped:.4f}", flush=True)

    assert common.STDLIB_DIR + EVAL_FILE in common.split_corpus()[1], "EVAL_FILE must be held out"
    text = Path(common.STDLIB_DIR, EVAL_FILE).read_text()
    eval_ids = tok.encode(text).ids[:EVAL_TOKENS]
    assert eval_ids[0] == common.BOS and len(eval_ids) == EVAL_TOKENS

    write_hf(model, hf, data)
    ref = load_hf(hf)
    model.config._attn_implementation = "eager"
    lg = logits(ref, eval_ids)
    d = np.abs(lg - logits(model, eval_ids)).max()
    print(f"HF dir reload vs in-memory model: max |dlogit| {d:.2e}", flush=True)
    assert d < 1e-4, d

    MODEL_DIR.mkdir(parents=True, exist_ok=True)
    gguf_path = MODEL_DIR / "model.gguf"
    subprocess.run([sys.executable, str(common.REPO / "tools/reference/convert_gguf.py"), str(hf), str(gguf_path),
                    "--outtype", "q8_0", "--model-name", "laguna-tiny"], check=True,
                   cwd=common.REPO / "tools/reference")
    from safetensors.torch import load_file
    gg = check_gguf(gguf_path, load_file(str(hf / "model.safetensors")))
    print("GGUF:", gg, flush=True)

    lg[EVAL_POSITIONS].astype("<f4").tofile(MODEL_DIR / "logits.transformers.f32")
    samples = []
    for prompt in GREEDY_PROMPTS:
        ids = tok.encode(prompt).ids
        gen = greedy(ref, ids, GREEDY_NEW)
        samples.append({"prompt": prompt, "prompt_tokens": ids, "greedy_tokens": gen,
                        "top2_margins": top2_margins(ref, ids, gen),
                        "text": tok.decode(gen, skip_special_tokens=False)})
        print(json.dumps(samples[-1]["prompt"]), "->", json.dumps(samples[-1]["text"]), flush=True)

    corpus = json.loads((data / "corpus.json").read_text())
    run_info = json.loads((run / "run.json").read_text())
    log = [json.loads(l) for l in (run / "train_log.jsonl").read_text().splitlines()]
    import tokenizers
    import transformers
    common.write_json(MODEL_DIR / "reference.json", {
        "eval": {"file": EVAL_FILE, "tokens": eval_ids, "positions": EVAL_POSITIONS,
                 "logits": "logits.transformers.f32: raw little-endian f32 [len(positions), vocab]"},
        "greedy": samples,
        "produced_by": {"transformers": transformers.__version__, "torch": torch.__version__,
                        "tokenizers": tokenizers.__version__, "attn_implementation": "eager",
                        "dtype": "float32"},
    })
    common.write_json(MODEL_DIR / "training.json", {
        "corpus": corpus, "run": run_info, "final": log[-1],
        "val_loss_full": {"trained": vl_trained, "q8_0_snapped": vl_snapped},
        "gguf": gg | {"bytes": gguf_path.stat().st_size,
                      "sha256": hashlib.sha256(gguf_path.read_bytes()).hexdigest()},
    })
    shutil.copyfile(hf / "config.json", MODEL_DIR / "config.json")
    shutil.copyfile(hf / "tokenizer.json", MODEL_DIR / "tokenizer.json")
    shutil.copyfile(hf / "tokenizer_config.json", MODEL_DIR / "tokenizer_config.json")
    shutil.copyfile(run / "train_log.jsonl", MODEL_DIR / "train_log.jsonl")
    print("wrote", MODEL_DIR)


if __name__ == "__main__":
    main()
