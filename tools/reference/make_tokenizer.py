"""Train a tiny GPT-2-style byte-level BPE tokenizer shaped like Laguna's.

* pre-tokenizer = Laguna's (spec §7.1): Split on line-break runs (MergedWithNext), the
  Qwen2 single-digit regex (Isolated), then ByteLevel without its own regex;
* special ids placed as in the real vocabulary: 0 <unk>, 2 〈|EOS|〉 (BOS and EOS), 9 <pad>,
  24 </assistant> (a *non-special* added token in HF, promoted to CONTROL by the GGUF
  converter), plus FIM / chat markers;
* vocab size == the model's vocab_size, so the GGUF converter adds no [PAD] entries.

The training corpus is embedded below so the result is deterministic.
"""
from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = [
    "<unk>",              # 0
    "<|reserved_1|>",     # 1
    "〈|EOS|〉",            # 2  BOS == EOS
    "<system>",           # 3
    "</system>",          # 4
    "<user>",             # 5
    "<|fim_prefix|>",     # 6
    "<|fim_middle|>",     # 7
    "</user>",            # 8
    "<pad>",              # 9
    "<think>",            # 10
    "<|fim_suffix|>",     # 11
    "</think>",           # 12
    "<tool_call>",        # 13
    "</tool_call>",       # 14
    "<arg_key>",          # 15
    "</arg_key>",         # 16
    "<arg_value>",        # 17
    "</arg_value>",       # 18
    "<tool_response>",    # 19
    "</tool_response>",   # 20
    "<available_tools>",  # 21
    "</available_tools>", # 22
    "<assistant>",        # 23
    "</assistant>",       # 24 (special=false, like the release)
]
NON_SPECIAL = {"</assistant>"}

SPLIT_LINEBREAKS = r"(?:\r?\n)+(?!\r?\n)"
SPLIT_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = """\
Laguna is a family of mixture-of-experts language models. Each layer has a pre-norm
attention block followed by either a dense feed-forward network or a sparse block with
routed experts and one shared expert. The router uses sigmoid scores; a correction bias
changes which experts are selected but not how their outputs are weighted.
Sliding-window layers look at the most recent tokens only, while full-attention layers
see the whole history and use YaRN-scaled rotary position embeddings on part of the
head dimension. The attention output is multiplied by a softplus gate before the output
projection. Numbers such as 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 42, 128, 512 and 2048 are
split into single digits by the pre-tokenizer.

def forward(self, hidden_states, positions):
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states = residual + self.self_attn(hidden_states, positions)
    residual = hidden_states
    hidden_states = self.post_attention_layernorm(hidden_states)
    return residual + self.mlp(hidden_states)

fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let r = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(a, b)| a * r * b).collect()
}

The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore.
It's what they'll say, and we've heard it before: "I'd rather test than guess."
Tokens, tensors, tables; weights, scales, zero points; experts, routers, gates.
"""


def build_tokenizer(vocab_size: int):
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
        vocab_size=vocab_size,
        min_frequency=1,
        show_progress=False,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = [CORPUS] * 4
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="〈|EOS|〉 $A", pair="〈|EOS|〉 $A $B", special_tokens=[("〈|EOS|〉", 2)])
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t), i)
    assert tok.get_vocab_size() == vocab_size, (tok.get_vocab_size(), vocab_size)
    return tok


def write_tokenizer(out_dir: Path, vocab_size: int, model_max_length: int) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(vocab_size)
    tok.save(str(out_dir / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "〈|EOS|〉",
        "eos_token": "〈|EOS|〉",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "〈|EOS|〉", "eos_token": "〈|EOS|〉", "pad_token": "<pad>", "unk_token": "<unk>",
    }, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--vocab", type=int, default=512)
    a = ap.parse_args()
    write_tokenizer(Path(a.out_dir), a.vocab, 4096)
    print("wrote", a.out_dir)
