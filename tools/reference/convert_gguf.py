"""Run llama.cpp's convert_hf_to_gguf.py on an hf-f32 directory, with three runtime patches
(the llama.cpp tree itself is not modified):

1. pre-tokenizer: a freshly trained tokenizer has an unknown pre-tokenizer hash, so
   LagunaModel.get_vocab_base_pre is made to return "laguna" (REFERENCE-NOTES);
2. sliding-window pattern: the converter cannot express an irregular full/sliding layout;
   after its own set_gguf_parameters we write `laguna.attention.sliding_window_pattern` as
   a per-layer bool array (true = sliding) taken from config.json's layer_types -- unless
   --swa-pattern omit is given (allowed only when llama.cpp's default, full iff l % 4 == 0,
   is right);
3. no sliding layer: transformers' AutoConfig fills sliding_window = 512 when the key is
   absent and the converter would write it; we drop `laguna.attention.sliding_window` so
   llama.cpp runs the model with swa_type NONE.

Usage: convert_gguf.py HF_DIR OUTFILE --outtype f32|f16|bf16|q8_0 [--swa-pattern array|omit] [--model-name N]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common import LLAMA_CPP_DIR


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_dir")
    ap.add_argument("outfile")
    ap.add_argument("--outtype", required=True, choices=["f32", "f16", "bf16", "q8_0"])
    ap.add_argument("--swa-pattern", default="array", choices=["array", "omit"])
    ap.add_argument("--model-name", default=None, help="general.name")
    a = ap.parse_args()

    sys.path.insert(0, str(LLAMA_CPP_DIR))
    import convert_hf_to_gguf  # noqa: E402  (llama.cpp's script, imported as a module)
    import gguf  # noqa: E402
    from conversion.laguna import LagunaModel  # noqa: E402

    raw_cfg = json.loads((Path(a.hf_dir) / "config.json").read_text())
    n_layer = raw_cfg["num_hidden_layers"]
    layer_types = raw_cfg.get("layer_types") or ["full_attention"] * n_layer
    swa = [t == "sliding_attention" for t in layer_types]

    def get_vocab_base_pre(self, tokenizer) -> str:  # patch 1
        return "laguna"

    orig_set_params = LagunaModel.set_gguf_parameters

    def set_gguf_parameters(self) -> None:  # patches 2 + 3
        orig_set_params(self)
        arch = self.gguf_writer.arch
        key_window = gguf.Keys.Attention.SLIDING_WINDOW.format(arch=arch)
        kv = self.gguf_writer.kv_data[0]
        if not any(swa):
            kv.pop(key_window, None)
        else:
            assert kv[key_window].value == raw_cfg["sliding_window"], "sliding_window not written as expected"
            if a.swa_pattern == "array":
                self.gguf_writer.add_sliding_window_pattern(swa)
            else:
                default = [l % 4 != 0 for l in range(n_layer)]
                if swa != default:
                    raise SystemExit("--swa-pattern omit but layer_types is not the llama.cpp default pattern")

    LagunaModel.get_vocab_base_pre = get_vocab_base_pre
    LagunaModel.set_gguf_parameters = set_gguf_parameters

    sys.argv = ["convert_hf_to_gguf.py", "--outtype", a.outtype, "--outfile", a.outfile, a.hf_dir]
    if a.model_name:
        sys.argv[1:1] = ["--model-name", a.model_name]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
