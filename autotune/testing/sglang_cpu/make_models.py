"""Make the real SGLang's models on this CPU from SmolLM2's GGUF (run by the sglang-cpu venv's python,
scripts/build-sglang-cpu.sh; never imported by autotune).

    python make_models.py GGUF OUT_DIR

OUT_DIR/SmolLM2-135M-Instruct: the GGUF dequantized into Hugging Face's format (safetensors, float32, with its
tokenizer and chat template), the target every sglang-cpu study serves. OUT_DIR/SmolLM2-135M-Instruct-draft: the
same model cut after its first DRAFT_LAYERS decoder layers (the embeddings, final norm and output head kept): a draft
for STANDALONE speculative decoding that is cheaper than the target and weaker, so that steps, topk and draft tokens
trade acceptance against cost as they do on a GPU (a draft equal to the target accepts everything and costs as much).
Idempotent: a stamp beside the models names what made them.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

TARGET = "SmolLM2-135M-Instruct"
DRAFT = f"{TARGET}-draft"
#: the draft's decoder layers, of the target's 30 (docs/real-sglang.md: how this was chosen)
DRAFT_LAYERS = 4
#: bump when what this script writes changes
VERSION = 1


def stamp_of(gguf: Path) -> str:
    digest = hashlib.sha256()
    with gguf.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return json.dumps({"gguf": digest.hexdigest(), "draft_layers": DRAFT_LAYERS, "version": VERSION})


def make(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                  quantization_config=GgufConfig(dequantize=True))
    # a plain model of the same config, holding the dequantized weights: the loaded one stays marked as GGUF, which
    # transformers will not save
    config = loaded.config
    config.quantization_config = None
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    target = out / TARGET
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)

    draft = out / DRAFT
    model.model.layers = model.model.layers[:DRAFT_LAYERS]
    model.config.num_hidden_layers = DRAFT_LAYERS
    if hasattr(model.config, "layer_types") and model.config.layer_types:
        model.config.layer_types = model.config.layer_types[:DRAFT_LAYERS]
    model.save_pretrained(draft)
    tokenizer.save_pretrained(draft)


def main() -> None:
    gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
    stamp = out / "models.build"
    want = stamp_of(gguf)
    if stamp.is_file() and stamp.read_text() == want and (out / TARGET).is_dir() and (out / DRAFT).is_dir():
        print("build-sglang-cpu: cached models are up to date", file=sys.stderr)
        return
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    print(f"build-sglang-cpu: making {TARGET} and its {DRAFT_LAYERS}-layer draft from {gguf.name}", file=sys.stderr)
    make(gguf, out)
    stamp.write_text(want)


if __name__ == "__main__":
    main()
