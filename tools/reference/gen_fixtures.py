#!/usr/bin/env python3
"""Generate reference fixtures for tiny random Laguna models.

  gen_fixtures.py --case hybrid_perhead [--case ...]     named cases -> tests/fixtures/models/<case>/
  gen_fixtures.py --all                                  all named cases
  gen_fixtures.py --random-config SEED --out DIR         a freshly drawn random config -> DIR
  gen_fixtures.py --case X --llamacpp-only               (re)compute only the llama.cpp logits of an
                                                          existing fixture and update its meta.json
  --skip-llamacpp                                        everything except llama.cpp logits

Per fixture directory:
  hf-f32/ hf-bf16/                 HF checkpoints (+ tokenizer), identical values
  ct-int4/ ct-int8/ [ct-int4-asym/] compressed-tensors pack-quantized (routed experts only),
                                   each with logits.transformers.f32 of its dequantised model
  model-{f32,f16,q8_0}.gguf        llama.cpp convert_hf_to_gguf.py from hf-f32/
  tokens.txt                       comma-separated token ids
  logits.transformers.f32          raw LE f32 [n_tokens, vocab], transformers f32 eager on hf-f32
  logits.llamacpp.{f32,f16,q8_0}.f32
  meta.json                        config summary, versions, errors, sensitivity numbers
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import cases as cases_mod  # noqa: E402
from common import (FIXTURE_ROOT, LLAMA_CPP_DIR, REPO_ROOT, SCRIPT_VERSION, compare, package_versions,  # noqa: E402
                    read_logits, write_json, write_logits)

GGUF_TYPES = ["f32", "f16", "q8_0"]
PY = sys.executable


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def config_summary(case: dict) -> dict:
    c = case["config"]
    L = c["num_hidden_layers"]
    heads = c.get("num_attention_heads_per_layer") or [c["num_attention_heads"]] * L
    return {
        "num_hidden_layers": L,
        "hidden_size": c["hidden_size"],
        "vocab_size": c["vocab_size"],
        "head_dim": c["head_dim"],
        "num_attention_heads_per_layer": heads,
        "num_key_value_heads": c["num_key_value_heads"],
        "layer_attention": [a for a, _ in case["layer_kinds"]],
        "layer_mlp": [m for _, m in case["layer_kinds"]],
        "mlp_schema": "legacy mlp_only_layers/decoder_sparse_step" if "mlp_only_layers" in c else "mlp_layer_types",
        "sliding_window": c.get("sliding_window"),
        "gating": c.get("gating", True),
        "gate_mode": "per-head" if (c.get("gating", True) is True or c.get("gating") == "per-head") else "per-element",
        "intermediate_size": c["intermediate_size"],
        "num_experts": c["num_experts"],
        "num_experts_per_tok": c["num_experts_per_tok"],
        "moe_intermediate_size": c["moe_intermediate_size"],
        "shared_expert_intermediate_size": c["shared_expert_intermediate_size"],
        "moe_routed_scaling_factor": c.get("moe_routed_scaling_factor", 1.0),
        "rope_parameters": c["rope_parameters"],
        "yarn_low_high": yarn_low_high(c),
    }


def yarn_low_high(c: dict):
    import math
    rp = c["rope_parameters"].get("full_attention", {})
    if rp.get("rope_type") != "yarn":
        return None
    rd = int(c["head_dim"] * rp.get("partial_rotary_factor", 1.0))
    L0, base = rp["original_max_position_embeddings"], rp["rope_theta"]
    cd = lambda n: rd * math.log(L0 / (n * 2 * math.pi)) / (2 * math.log(base))
    low = max(math.floor(cd(rp.get("beta_fast") or 32)), 0)
    high = min(math.ceil(cd(rp.get("beta_slow") or 1)), rd - 1)
    return {"rotary_dims": rd, "low": low, "high": high}


def make_tokens(case: dict, attempt: int) -> list[int]:
    rng = np.random.default_rng([case["seed"], attempt])
    V = case["config"]["vocab_size"]
    return [case["config"]["bos_token_id"]] + [int(t) for t in rng.integers(0, V, case["n_tokens"] - 1)]


def choose_tokens(case: dict, model_dirs: list[Path], attempts: int) -> tuple[list[int], dict]:
    """Draw `attempts` random sequences (BOS + uniform ids) and keep the one whose smallest
    routing margin over all MoE decisions of all given models (hf-f32 and the dequantised
    ct-* models) is largest, so that expert selection is not on a knife edge and small
    numeric differences (f16/bf16/q8 activations) do not flip experts."""
    import tempfile
    from ref_transformers import load_any, router_margins
    with tempfile.TemporaryDirectory() as td:
        models = [load_any(d, Path(td) / d.name) for d in model_dirs]
        best = None
        for att in range(attempts):
            toks = make_tokens(case, att)
            per = {d.name: float(router_margins(mod, toks).min(initial=np.inf)) for d, mod in zip(model_dirs, models)}
            m = min(per.values())
            if best is None or m > best[1]:
                best = (toks, m, att, per)
            if not np.isfinite(m):
                break
    toks, m, att, per = best
    return toks, {"draw": f"numpy default_rng([seed, attempt]) with attempt={att}: BOS + uniform ids",
                  "attempts": attempts, "chosen_attempt": att,
                  "min_router_margin": m,
                  "min_router_margin_per_model": per,
                  "margin_note": "smallest (k-th minus (k+1)-th) biased sigmoid score over all MoE routing "
                                 "decisions of hf-f32 and every ct-* model (transformers f32)"}


def llama_cpp_available() -> tuple[bool, str]:
    r = subprocess.run([PY, "-c", "import llama_cpp; print(llama_cpp.__version__)"], capture_output=True, text=True)
    if r.returncode == 0:
        return True, r.stdout.strip()
    return False, (r.stderr.strip().splitlines() or ["import failed"])[-1]


def verify_gguf_identical(out: Path) -> dict:
    """All GGUF variants must hold bit-identical weight values."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    ref = {t.name: np.asarray(t.data).reshape(-1) for t in GGUFReader(str(out / "model-f32.gguf")).tensors}
    res = {}
    for ty in GGUF_TYPES[1:]:
        types = {}
        for t in GGUFReader(str(out / f"model-{ty}.gguf")).tensors:
            a = dequantize(t.data, t.tensor_type).reshape(-1).astype(np.float32)
            assert np.array_equal(a, ref[t.name]), f"{ty}: {t.name} differs from f32"
            types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
        res[ty] = {"identical_to_f32": True, "tensor_types": types}
    return res


def run_llamacpp(case: dict, out: Path, tokens_ref: np.ndarray) -> dict:
    ok, info = llama_cpp_available()
    cmd = f"{PY} tools/reference/gen_fixtures.py --case {case['name']} --llamacpp-only"
    if not ok:
        log(f"llama.cpp logits MISSING ({info}); later run: {cmd}")
        return {"status": "missing", "reason": f"llama_cpp not importable: {info}", "command": cmd}
    from ref_llamacpp import known_deviations
    res = {"status": "ok", "llama_cpp_python": info, "results": {}}
    dev = known_deviations(case["config"])
    if dev:
        res["status"] = "not_a_reference"
        res["known_llamacpp_deviations"] = dev
        log(f"llama.cpp is known to deviate for this config: {dev}")
    V = case["config"]["vocab_size"]
    for ty in GGUF_TYPES:
        dst = out / f"logits.llamacpp.{ty}.f32"
        r = subprocess.run([PY, str(HERE / "ref_llamacpp.py"), str(out / f"model-{ty}.gguf"), str(out / "tokens.txt"),
                            str(dst), "--config", str(out / "hf-f32" / "config.json")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            res["status"] = "error"
            res["results"][ty] = {"error": r.stderr[-2000:]}
            log(f"llama.cpp {ty} FAILED:\n{r.stderr[-2000:]}")
            continue
        params = json.loads(r.stdout.strip().splitlines()[-1])
        res["params"] = params
        lg = read_logits(dst, V)
        cmp_ = compare(lg, tokens_ref)
        pp = np.linalg.norm(lg - tokens_ref, axis=1) / np.linalg.norm(tokens_ref, axis=1)
        med = float(np.median(pp))
        cmp_["per_position_rel_l2"] = {
            "median": med, "max": float(pp.max()), "argmax_position": int(pp.argmax()),
            "outlier_positions": [int(i) for i in np.nonzero(pp > max(5 * med, 1e-5))[0]],
            "note": "outliers (> 5x median) are typically expert-selection flips on near-ties",
        }
        res["results"][ty] = {"file": dst.name, **cmp_}
        log(f"llama.cpp {ty}: rel_l2 {cmp_['rel_l2']:.3e} argmax {cmp_['argmax_agreement']:.3f}")
    res["note"] = ("rel_l2 = ||llamacpp - transformers|| / ||transformers|| over all positions; "
                   "argmax_agreement = fraction of positions with the same greedy token")
    return res


def gen_case(case: dict, out: Path, skip_llamacpp: bool = False, skip_sensitivity: bool = False,
             token_attempts: int = 300) -> dict:
    from export import export_ct, export_hf, ct_dequantise_with_compressed_tensors
    from make_model import make_weights
    from ref_numpy import numpy_logits
    from ref_transformers import transformers_logits

    t0 = time.time()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    log(f"case {case['name']} -> {out}")
    weights = make_weights(case)
    export_hf(case, weights, out / "hf-f32", "float32")
    export_hf(case, weights, out / "hf-bf16", "bfloat16", with_tokenizer=False)
    exact_ct = {}
    for v in case["quant"]:
        log(f"compressed-tensors {v['dir']}")
        exact_ct[v["dir"]] = export_ct(case, weights, out / v["dir"], v)
    log("choosing the evaluation sequence (router margins)")
    tokens, token_info = choose_tokens(case, [out / "hf-f32"] + [out / v["dir"] for v in case["quant"]],
                                       attempts=token_attempts)
    log(f"min router margin {token_info['min_router_margin']:.3e} (attempt {token_info['chosen_attempt']})")
    (out / "tokens.txt").write_text(",".join(map(str, tokens)) + "\n")

    meta: dict = {
        "case": case["name"],
        "seed": case["seed"],
        "script_version": SCRIPT_VERSION,
        "generated_by": "tools/reference/gen_fixtures.py",
        "notes": case.get("notes", ""),
        "n_tokens": len(tokens),
        "tokens_file": "tokens.txt",
        "tokens": token_info,
        "logits_format": "raw little-endian float32, row-major [n_tokens, vocab_size]",
        "config_summary": config_summary(case),
        "versions": package_versions(),
        "llama_cpp_source": {
            "dir": str(LLAMA_CPP_DIR),
            "note": "vendored in llama-cpp-python 0.3.36 (llama.cpp commit 0c1e570 per REFERENCE-NOTES)",
            "conversion/laguna.py sha256": sha256(LLAMA_CPP_DIR / "conversion" / "laguna.py"),
            "src/models/laguna.cpp sha256": sha256(LLAMA_CPP_DIR / "src" / "models" / "laguna.cpp"),
        },
        "weights": {
            "construction": "every matrix q*2^e, q integer in [-127,127], one power-of-two scale per 32 inputs, "
                            "each block contains |q|=127 (Q8_0-exact); norms 1+N(0,0.1) on a 2^-6 grid; "
                            "router bias N(0,0.1) on a 2^-10 grid; projections std 0.8/sqrt(fan_in), "
                            "embeddings std 1, lm_head std 2/sqrt(H)",
            "hf_f32_bf16_f16_q8_0_identical": True,
        },
    }

    # ---- transformers reference on hf-f32 (+ bf16 copy must give the same logits)
    log("transformers hf-f32")
    ref = transformers_logits(out / "hf-f32", tokens)
    write_logits(out / "logits.transformers.f32", ref)
    checks: dict = {}
    checks["hf_bf16_vs_hf_f32_transformers"] = compare(transformers_logits(out / "hf-bf16", tokens), ref)
    assert checks["hf_bf16_vs_hf_f32_transformers"]["max_abs"] == 0.0, "bf16 checkpoint does not hold identical values"
    log("numpy float64 cross-check")
    checks["numpy_f64_vs_transformers"] = compare(numpy_logits(out / "hf-f32", tokens), ref)
    meta["logits_std"] = float(ref.std())

    # ---- compressed-tensors variants
    ct_meta = {}
    for v in case["quant"]:
        d = out / v["dir"]
        exact = exact_ct[v["dir"]]
        ctw = ct_dequantise_with_compressed_tensors(d)
        mism = [k for k in exact if not torch.equal(ctw[k].float(), torch.from_numpy(exact[k]))]
        assert not mism, f"compressed-tensors dequantisation not exact for {mism[:3]}"
        lg = transformers_logits(d, tokens)
        write_logits(d / "logits.transformers.f32", lg)
        ct_meta[v["dir"]] = {
            "scheme": {k: v[k] for k in ("num_bits", "strategy", "group_size", "symmetric")},
            "scales": "powers of two (bf16-exact); compressed-tensors bf16 dequantisation == exact f32 dequantisation",
            "logits": f"{v['dir']}/logits.transformers.f32",
            "vs_unquantised_transformers": compare(lg, ref),
            "numpy_f64_own_unpacking_vs_transformers": compare(numpy_logits(d, tokens), lg),
        }
    meta["compressed_tensors"] = ct_meta

    # ---- GGUF
    conv = {}
    for ty in GGUF_TYPES:
        log(f"convert_hf_to_gguf --outtype {ty}")
        dst = out / f"model-{ty}.gguf"
        r = subprocess.run([PY, str(HERE / "convert_gguf.py"), str(out / "hf-f32"), str(dst), "--outtype", ty,
                            "--swa-pattern", case["gguf_swa_pattern"], "--model-name", f"laguna-fixture-{case['name']}"],
                           capture_output=True, text=True,
                           env={**os.environ, "NO_LOCAL_GGUF": ""})
        if r.returncode != 0:
            raise RuntimeError(f"GGUF conversion {ty} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        conv[ty] = dst.name
    meta["gguf"] = {
        "files": conv,
        "converter": "llama.cpp convert_hf_to_gguf.py via tools/reference/convert_gguf.py "
                     "(runtime patches: tokenizer.ggml.pre=laguna; per-layer bool sliding_window_pattern; "
                     "sliding_window dropped when no layer slides)",
        "sliding_window_pattern": ("per-layer bool array written" if case["gguf_swa_pattern"] == "array"
                                   else "omitted (llama.cpp default: full iff l % 4 == 0)"),
        "format_check": verify_gguf_identical(out),
    }
    meta["checks"] = checks

    # ---- llama.cpp
    if skip_llamacpp:
        meta["llamacpp"] = {"status": "skipped",
                            "command": f"{PY} tools/reference/gen_fixtures.py --case {case['name']} --llamacpp-only"}
    else:
        meta["llamacpp"] = run_llamacpp(case, out, ref)

    # ---- sensitivity
    if case.get("sensitivity") and not skip_sensitivity:
        from sensitivity import run_sensitivity
        log("sensitivity variants")
        meta["sensitivity"] = {
            "note": "transformers f32 logits with ONE feature altered vs the correct reference; "
                    "a feature is tested only if its rel_l2 >> test tolerance",
            "results": run_sensitivity(out / "hf-f32", tokens, ref),
        }

    meta["config_json"] = case["config"]
    meta["files"] = {str(p.relative_to(out)): {"bytes": p.stat().st_size, "sha256": sha256(p)}
                     for p in sorted(out.rglob("*")) if p.is_file() and p.name != "meta.json"}
    meta["elapsed_s"] = round(time.time() - t0, 1)
    write_json(out / "meta.json", meta)
    log(f"done {case['name']} in {meta['elapsed_s']} s")
    return meta


def llamacpp_only(case: dict, out: Path) -> dict:
    meta = json.loads((out / "meta.json").read_text())
    V = case["config"]["vocab_size"]
    ref = read_logits(out / "logits.transformers.f32", V)
    meta["llamacpp"] = run_llamacpp(case, out, ref)
    meta["versions"] = package_versions()
    meta["files"] = {str(p.relative_to(out)): {"bytes": p.stat().st_size, "sha256": sha256(p)}
                     for p in sorted(out.rglob("*")) if p.is_file() and p.name != "meta.json"}
    write_json(out / "meta.json", meta)
    return meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", default=[], choices=sorted(cases_mod.NAMED_CASES))
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--random-config", type=int, metavar="SEED")
    ap.add_argument("--out", type=Path, help="output dir (required with --random-config)")
    ap.add_argument("--skip-llamacpp", action="store_true")
    ap.add_argument("--skip-sensitivity", action="store_true")
    ap.add_argument("--sensitivity", action="store_true", help="also run sensitivity checks for random configs")
    ap.add_argument("--llamacpp-only", action="store_true")
    ap.add_argument("--token-attempts", type=int, default=300,
                    help="random sequences tried; the one with the largest minimum router margin is kept")
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    jobs: list[tuple[dict, Path]] = []
    names = sorted(cases_mod.NAMED_CASES) if a.all else a.case
    for n in names:
        jobs.append((cases_mod.get_case(n), FIXTURE_ROOT / n))
    if a.random_config is not None:
        if a.out is None:
            ap.error("--random-config needs --out DIR")
        c = cases_mod.random_case(a.random_config)
        c["sensitivity"] = a.sensitivity
        jobs.append((c, a.out.resolve()))
    if not jobs:
        ap.error("nothing to do (use --case, --all or --random-config)")
    for case, out in jobs:
        if a.llamacpp_only:
            llamacpp_only(case, out)
        else:
            gen_case(case, out, a.skip_llamacpp, a.skip_sensitivity, a.token_attempts)


if __name__ == "__main__":
    main()
