"""Make the real SGLang's models on this CPU from SmolLM2's GGUF (run by the sglang-cpu venv's python,
scripts/build-sglang-cpu.sh; never imported by autotune).

    python make_models.py GGUF OUT_DIR CALIBRATION.jsonl...

OUT_DIR/SmolLM2-135M-Instruct: the GGUF dequantized into Hugging Face's format (safetensors, float32, with its
tokenizer and chat template), the target every sglang-cpu study serves.

OUT_DIR/SmolLM2-135M-Instruct-draft: a draft for STANDALONE speculative decoding, cheaper than the target and weaker,
so that steps, topk and draft tokens trade acceptance against cost as they do on a GPU (a draft equal to the target
accepts everything and costs as much). It is the target's first DRAFT_LAYERS decoder layers and its embeddings, with
an output head of its own: the target's output head behind a linear map fitted (ridge least squares, closed form) to
take the final norm of the draft's last hidden state to the final norm of the target's, over the prompts of the
calibration files. The target's early layers alone agree with its next token about 5% of the time; with the fitted
head about 38% (on held-out prompts: the build prints it). Idempotent: a stamp beside the models names what made
them.
"""
from __future__ import annotations

import hashlib
import json
import random
import shutil
import sys
from pathlib import Path

TARGET = "SmolLM2-135M-Instruct"
DRAFT = f"{TARGET}-draft"
#: the draft's decoder layers, of the target's 30: the fitted head agreed with the target 37-38% at 2 to 8 layers
#: and 46% at 15 (docs/real-sglang.md); 4 keeps the draft at about a third of the target's cost
DRAFT_LAYERS = 4
#: the calibration prompts the head is fitted on, the ones it is checked on, and each one's most tokens
FIT, HELD_OUT, TOKENS = 120, 40, 256
RIDGE = 1e-2
#: bump when what this script writes changes
VERSION = 2


def stamp_of(gguf: Path, calibration: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in (gguf, *calibration):
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return json.dumps({"inputs": digest.hexdigest(), "draft_layers": DRAFT_LAYERS, "version": VERSION})


def prompts(calibration: list[Path]) -> list[list[dict[str, str]]]:
    """Chat messages of every request of the files (OpenAI chat lines, or {"prompt": ...} lines as a user turn), in
    an order fixed by a seed."""
    out = []
    for path in calibration:
        for line in path.read_text().splitlines():
            row = json.loads(line)
            out.append(row["messages"] if "messages" in row else [{"role": "user", "content": row["prompt"]}])
    random.Random(0).shuffle(out)
    return out


def load_target(gguf: Path):
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                  quantization_config=GgufConfig(dequantize=True))
    # a plain model of the same config holding the dequantized weights: the loaded one stays marked as GGUF, which
    # transformers will not save
    config = loaded.config
    config.quantization_config = None
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    return model.eval()


def fitted_head(model, tokenizer, messages: list[list[dict[str, str]]]):
    """The map M (hidden x hidden) with norm(h_DRAFT_LAYERS) @ M closest to norm(h_last) over the fit prompts, and the
    share of the held-out prompts' positions where the draft's next token is the target's."""
    import torch

    def states(batch):
        xs, ys, targets = [], [], []
        with torch.no_grad():
            for m in batch:
                ids = tokenizer.apply_chat_template(m, return_tensors="pt", return_dict=True)["input_ids"][:, :TOKENS]
                out = model(ids, output_hidden_states=True)
                xs.append(model.model.norm(out.hidden_states[DRAFT_LAYERS][0]))
                ys.append(out.hidden_states[-1][0])       # the last hidden state, after the final norm
                targets.append(out.logits[0].argmax(-1))
        return torch.cat(xs), torch.cat(ys), torch.cat(targets)

    x, y, _ = states(messages[:FIT])
    m = torch.linalg.solve(x.T @ x + RIDGE * torch.eye(x.shape[1]), x.T @ y)
    held_x, _, held_targets = states(messages[FIT:FIT + HELD_OUT])
    with torch.no_grad():
        agree = float(((held_x @ m) @ model.lm_head.weight.T).argmax(-1).eq(held_targets).float().mean())
    return m, agree


def make(gguf: Path, out: Path, calibration: list[Path]) -> None:
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = load_target(gguf)
    model.save_pretrained(out / TARGET)
    tokenizer.save_pretrained(out / TARGET)

    m, agree = fitted_head(model, tokenizer, prompts(calibration))
    print(f"build-sglang-cpu: the {DRAFT_LAYERS}-layer draft agrees with the target's next token at {agree:.1%} of "
          "the held-out prompts' positions", file=sys.stderr)
    with torch.no_grad():
        head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=False)
        head.weight.copy_(model.lm_head.weight @ m.T)
    model.model.layers = model.model.layers[:DRAFT_LAYERS]
    model.config.num_hidden_layers = DRAFT_LAYERS
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:DRAFT_LAYERS]
    model.config.tie_word_embeddings = False
    model.lm_head = head
    model.save_pretrained(out / DRAFT)
    tokenizer.save_pretrained(out / DRAFT)


def main() -> None:
    gguf, out, calibration = Path(sys.argv[1]), Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]]
    stamp = out / "models.build"
    want = stamp_of(gguf, calibration)
    if stamp.is_file() and stamp.read_text() == want and (out / TARGET).is_dir() and (out / DRAFT).is_dir():
        print("build-sglang-cpu: cached models are up to date", file=sys.stderr)
        return
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    print(f"build-sglang-cpu: making {TARGET} and its {DRAFT_LAYERS}-layer draft from {gguf.name}", file=sys.stderr)
    make(gguf, out, calibration)
    stamp.write_text(want)


if __name__ == "__main__":
    main()
