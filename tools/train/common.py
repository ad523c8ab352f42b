"""Shared pieces of the tiny-Laguna training pipeline: the corpus (which files of which
Debian package), the model config and the tokenizer trainer.

Corpus: the `*.py` modules of CPython 3.11's standard library (without its test suites
and codec tables) as shipped by the
Debian 12 packages `libpython3.11-minimal` and `libpython3.11-stdlib` (installed under
/usr/lib/python3.11). The file list comes from `dpkg -L`, so the selection is exactly "what
the package ships", independent of anything else installed there.
"""
from __future__ import annotations

import copy
import hashlib
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "reference"))

from make_tokenizer import NON_SPECIAL, SPECIAL_TOKENS, SPLIT_LINEBREAKS, SPLIT_QWEN2  # noqa: E402

PACKAGES = ["libpython3.11-minimal", "libpython3.11-stdlib"]
STDLIB_DIR = "/usr/lib/python3.11/"
EXCLUDE_DIRS = {"test", "tests", "idle_test", "encodings"}
VAL_EVERY = 16            # every 16th file (sorted by path) is held out for validation

BOS = 2
VOCAB = 4096
SEQ_LEN = 256             # training context; > 2 sliding windows
FULL, SLIDING = "full_attention", "sliding_attention"

CONFIG = {
    "architectures": ["LagunaForCausalLM"],
    "model_type": "laguna",
    "vocab_size": VOCAB,
    "hidden_size": 128,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 2,
    "eos_token_id": [2, 24],
    "pad_token_id": 9,
    "num_hidden_layers": 5,
    # full layers 0 and 3, sliding elsewhere: irregular (not llama.cpp's l % 4 default),
    # so the GGUF needs the per-layer sliding_window_pattern array
    "layer_types": [FULL, SLIDING, SLIDING, FULL, SLIDING],
    "sliding_window": 64,
    "num_attention_heads": 4,
    "num_attention_heads_per_layer": [4, 6, 6, 4, 6],
    "num_key_value_heads": 2,
    "head_dim": 32,
    "gating": "per-head",
    "intermediate_size": 256,
    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse", "sparse"],
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 128,
    "moe_routed_scaling_factor": 2.5,
    "moe_apply_router_weight_on_input": False,
    "moe_router_logit_softcapping": 0.0,
    "router_aux_loss_coef": 0.0,
    "norm_topk_prob": True,
    # Full layers: YaRN over half of the head (16 rotary dims = 8 frequency pairs), trained
    # at the original context 256 and stretched 4x. theta 1e4, L0 256:
    #   corr_dim(beta) = 16 ln(256 / (2 pi beta)) / (2 ln 1e4)
    #   beta_fast 32 -> 0.21 -> low 0;  beta_slow 1 -> 3.22 -> high 4
    # so pairs 0-3 are blended and pairs 4-7 fully interpolated; attention_factor explicit.
    # Sliding layers: plain RoPE over the whole head, theta 1e4.
    "rope_parameters": {
        FULL: {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
               "original_max_position_embeddings": SEQ_LEN, "beta_fast": 32.0, "beta_slow": 1.0,
               "attention_factor": 1.125, "partial_rotary_factor": 0.5},
        SLIDING: {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
    },
    "max_position_embeddings": 4 * SEQ_LEN,
    "initializer_range": 0.02,
    "torch_dtype": "float32",
}


def config() -> dict:
    return copy.deepcopy(CONFIG)


def package_versions() -> dict[str, str]:
    out = {}
    for p in PACKAGES:
        v = subprocess.run(["dpkg-query", "-W", "-f=${Version}", p], check=True,
                           capture_output=True, text=True).stdout
        out[p] = v
    return out


def corpus_files() -> list[str]:
    """The .py files under STDLIB_DIR shipped by PACKAGES, sorted, minus the test suites
    (`test/`, `tests/`, `idle_test/`) and the `encodings/` codec tables."""
    files = set()
    for p in PACKAGES:
        listing = subprocess.run(["dpkg", "-L", p], check=True, capture_output=True, text=True).stdout
        for line in listing.splitlines():
            if not (line.startswith(STDLIB_DIR) and line.endswith(".py")):
                continue
            parts = line[len(STDLIB_DIR):].split("/")
            if any(d in EXCLUDE_DIRS for d in parts[:-1]):
                continue
            files.add(line)
    return sorted(files)


def split_corpus() -> tuple[list[str], list[str]]:
    files = corpus_files()
    val = [f for i, f in enumerate(files) if i % VAL_EVERY == VAL_EVERY - 1]
    train = [f for f in files if f not in val]
    return train, val


def read_texts(files: list[str]) -> list[str]:
    return [Path(f).read_text(encoding="utf-8") for f in files]


def corpus_summary(train: list[str], val: list[str]) -> dict:
    h = hashlib.sha256()
    n = {"train": 0, "val": 0}
    for kind, files in (("train", train), ("val", val)):
        for f in files:
            b = Path(f).read_bytes()
            n[kind] += len(b)
            h.update(f.encode() + b"\0" + b)
    return {
        "packages": package_versions(),
        "selection": f"{STDLIB_DIR}**/*.py listed by `dpkg -L` of {' and '.join(PACKAGES)}, "
                     f"except under {sorted(EXCLUDE_DIRS)} directories",
        "n_files": {"train": len(train), "val": len(val)},
        "bytes": n,
        "val_files": [f[len(STDLIB_DIR):] for f in val],
        "sha256": h.hexdigest(),
    }


def train_tokenizer(texts: list[str], vocab_size: int = VOCAB):
    """Byte-level BPE with Laguna's pre-tokenizer and special ids (as
    tools/reference/make_tokenizer.py, but trained on the corpus)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_LINEBREAKS), behavior="merged_with_next", invert=False),
        pre_tokenizers.Split(Regex(SPLIT_QWEN2), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=(t not in NON_SPECIAL), normalized=False) for t in SPECIAL_TOKENS]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="〈|EOS|〉 $A", pair="〈|EOS|〉 $A $B", special_tokens=[("〈|EOS|〉", BOS)])
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t), i)
    assert tok.get_vocab_size() == vocab_size, (tok.get_vocab_size(), vocab_size)
    return tok


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
