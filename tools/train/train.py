"""Train the bundled tiny Laguna model on CPU with PyTorch.

The model is transformers' own `LagunaForCausalLM` (sdpa attention), so training and the
reference implementation are the same code. Steps:

1. corpus: CPython 3.11 stdlib modules shipped by Debian (common.py), every 16th file held
   out for validation;
2. tokenizer: byte-level BPE, vocab 4096, Laguna pre-tokenizer and special ids, trained on
   the training files -> OUT/tokenizer.json;
3. data: every file tokenised as [BOS] + ids, concatenated; batches are random windows of
   SEQ_LEN + 1 tokens drawn by a generator seeded with (seed, step), so a resumed run draws
   the same batches;
4. training: AdamW, linear warmup + cosine decay, grad clip 1; the router correction bias is
   trained the auxiliary-loss-free way (DeepSeek-V3): after each step every MoE layer's
   bias moves by `bias_lr * sign(mean load - expert load)`, so it steers selection only;
5. checkpoints OUT/ckpt/ (model + schedule state, Adam moments; each file < 16 MB) every
   --ckpt-every steps, replaced atomically; a rerun resumes from it.

Usage: train.py prepare [--out DATA]
       train.py train [--data DATA] [--out OUT] [--steps N] [--threads T] [--max-seconds S]
Initialisation and batches are seeded; with a fixed thread count and CPU the result is
bit-reproducible (checked: two runs, and a run stopped and resumed, give identical weights).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch

import common

SEED = 20261130


def prepare(out: Path) -> None:
    """Corpus -> tokenizer.json, tokens.npz (train / val streams) and corpus.json in OUT."""
    from tokenizers import Tokenizer
    out.mkdir(parents=True, exist_ok=True)
    train_files, val_files = common.split_corpus()
    summary = common.corpus_summary(train_files, val_files)
    t0 = time.time()
    tok = common.train_tokenizer(common.read_texts(train_files))
    tok.save(str(out / "tokenizer.json"))
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    streams = []
    for files in (train_files, val_files):
        ids = []
        for text in common.read_texts(files):
            ids.extend(tok.encode(text, add_special_tokens=True).ids)   # [BOS] + text
        streams.append(np.asarray(ids, dtype=np.int32))
    np.savez(out / "tokens.npz", train=streams[0], val=streams[1])
    summary["tokens"] = {"train": int(len(streams[0])), "val": int(len(streams[1]))}
    summary["tokenizer_sha256"] = hashlib.sha256((out / "tokenizer.json").read_bytes()).hexdigest()
    common.write_json(out / "corpus.json", summary)
    print(f"tokenizer + data in {time.time() - t0:.1f} s: {summary['tokens']}", flush=True)


def batch(stream: np.ndarray, bsz: int, seq: int, rng: np.random.Generator) -> torch.Tensor:
    starts = rng.integers(0, len(stream) - seq - 1, size=bsz)
    return torch.from_numpy(np.stack([stream[s:s + seq + 1] for s in starts]).astype(np.int64))


def make_model():
    from transformers import LagunaConfig, LagunaForCausalLM
    torch.manual_seed(SEED)
    cfg = LagunaConfig(**{k: v for k, v in common.config().items() if k not in ("architectures", "model_type", "torch_dtype")})
    cfg._attn_implementation = "sdpa"
    model = LagunaForCausalLM(cfg)
    return model


def lr_at(step: int, a) -> float:
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    p = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


@torch.no_grad()
def evaluate(model, val: np.ndarray, bsz: int, seq: int, n_batches: int) -> float:
    model.eval()
    rng = np.random.default_rng([SEED, 999])
    tot = 0.0
    for _ in range(n_batches):
        x = batch(val, bsz, seq, rng)
        tot += model(input_ids=x[:, :-1], labels=x[:, :-1].clone(), use_cache=False).loss.item()
    model.train()
    return tot / n_batches


CKPT_FILES = ("state.pt", "adam_m.pt", "adam_v.pt")   # each < 16 MB so a run can ship it


def save_ckpt(d: Path, model, opt, step: int, elapsed: float, args: dict) -> None:
    """Model + schedule state and the two Adam moments in three files, written atomically
    (into a temporary folder that replaces the old one)."""
    sd = opt.state_dict()
    tmp = d.with_name(d.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "step": step, "elapsed": elapsed, "args": args,
                "param_groups": sd["param_groups"],
                "adam_step": {k: v["step"] for k, v in sd["state"].items()}}, tmp / "state.pt")
    torch.save({k: v["exp_avg"] for k, v in sd["state"].items()}, tmp / "adam_m.pt")
    torch.save({k: v["exp_avg_sq"] for k, v in sd["state"].items()}, tmp / "adam_v.pt")
    old = d.with_name(d.name + ".old")
    if d.exists():
        os.replace(d, old)
    os.replace(tmp, d)
    if old.exists():
        for f in old.iterdir():
            f.unlink()
        old.rmdir()


def load_ckpt(d: Path, model, opt):
    st = torch.load(d / "state.pt", weights_only=False)
    m = torch.load(d / "adam_m.pt")
    v = torch.load(d / "adam_v.pt")
    model.load_state_dict(st["model"])
    opt.load_state_dict({"param_groups": st["param_groups"],
                         "state": {k: {"step": st["adam_step"][k], "exp_avg": m[k], "exp_avg_sq": v[k]}
                                   for k in m}})
    return st


def train(a) -> None:
    torch.set_num_threads(a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    data = np.load(Path(a.data) / "tokens.npz")
    train_s, val_s = data["train"], data["val"]
    seq = common.SEQ_LEN
    model = make_model()
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

    routers = [m for m in model.modules() if type(m).__name__ == "LagunaTopKRouter"]
    loads: list[torch.Tensor] = []

    def hook(mod, inp, outp):
        loads.append(torch.bincount(outp[2].reshape(-1), minlength=mod.num_experts).float())
    for r in routers:
        r.register_forward_hook(hook)

    ckpt = out / "ckpt"
    log_path = out / "train_log.jsonl"
    args = {k: v for k, v in vars(a).items() if k != "func"}
    step, elapsed = 0, 0.0
    if (ckpt / "state.pt").exists():
        st = load_ckpt(ckpt, model, opt)
        step, elapsed = st["step"], st["elapsed"]
        for k in ("steps", "batch", "lr", "warmup", "min_lr_frac", "weight_decay", "bias_lr"):
            assert st["args"][k] == args[k], f"resume with the same --{k} ({st['args'][k]})"
        print(f"resumed at step {step}", flush=True)
    else:
        common.write_json(out / "run.json", {"args": args, "n_params": n_params, "seed": SEED,
                                             "torch": torch.__version__,
                                             "train_tokens": int(len(train_s)), "val_tokens": int(len(val_s))})
        log_path.write_text("")
    print(f"{n_params} parameters, {len(train_s)} train tokens, {a.steps} steps x {a.batch} x {seq}, "
          f"{a.threads} threads", flush=True)

    t_start = time.time()
    t_last = t_start
    e0 = elapsed
    losses = []
    while step < a.steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        x = batch(train_s, a.batch, seq, np.random.default_rng([SEED, step]))
        loads.clear()
        loss = model(input_ids=x[:, :-1], labels=x[:, :-1].clone(), use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():   # auxiliary-loss-free balancing of the selection bias
            for r, ld in zip(routers, loads):
                r.e_score_correction_bias.add_(a.bias_lr * torch.sign(ld.mean() - ld))
        step += 1
        losses.append(loss.item())
        elapsed = e0 + time.time() - t_start
        if step % 20 == 0 or step == a.steps:
            rec = {"step": step, "loss": round(float(np.mean(losses)), 4), "lr": lr_at(step - 1, a),
                   "grad_norm": round(float(gn), 3), "elapsed_s": round(elapsed, 1),
                   "max_load_frac": [round(float(ld.max() / ld.sum()), 3) for ld in loads[:len(routers)]]}
            losses = []
            if step % a.eval_every == 0 or step == a.steps:
                rec["val_loss"] = round(evaluate(model, val_s, 8, seq, 8), 4)
            with open(log_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print(json.dumps(rec), f"{(time.time() - t_last) / 20:.2f} s/step", flush=True)
            t_last = time.time()
        if step % a.ckpt_every == 0 or step == a.steps:
            save_ckpt(ckpt, model, opt, step, elapsed, args)
            if a.max_seconds and time.time() - t_start > a.max_seconds and step < a.steps:
                print(f"stopping at step {step} (--max-seconds); rerun to resume", flush=True)
                return
    torch.save(model.state_dict(), out / "final.pt")
    print("done", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(required=True)
    pp = sub.add_parser("prepare", help="corpus -> tokenizer + token streams")
    pp.add_argument("--out", default="/work/train-out/data")
    pp.set_defaults(func=lambda a: prepare(Path(a.out)))
    tp = sub.add_parser("train", help="train (resumes from OUT/ckpt)")
    tp.add_argument("--data", default="/work/train-out/data")
    tp.add_argument("--out", default="/work/train-out/run")
    tp.add_argument("--steps", type=int, default=2200)
    tp.add_argument("--batch", type=int, default=16)
    tp.add_argument("--lr", type=float, default=3e-3)
    tp.add_argument("--min-lr-frac", type=float, default=0.05)
    tp.add_argument("--warmup", type=int, default=100)
    tp.add_argument("--weight-decay", type=float, default=0.1)
    tp.add_argument("--bias-lr", type=float, default=1e-3)
    tp.add_argument("--threads", type=int, default=2)
    tp.add_argument("--ckpt-every", type=int, default=100)
    tp.add_argument("--eval-every", type=int, default=200)
    tp.add_argument("--max-seconds", type=float, default=0,
                    help="stop after the next checkpoint once this much wall time has passed; rerun to resume")
    tp.set_defaults(func=train)
    a = ap.parse_args()
    a.func(a)


if __name__ == "__main__":
    main()
