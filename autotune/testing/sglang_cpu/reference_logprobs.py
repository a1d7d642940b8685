"""transformers' own log-probabilities of a token sequence, the reference SGLang's on this CPU is checked against
(run by the sglang-cpu venv's python, tests/sglang_cpu/test_logprobs.py; never imported by autotune).

    python reference_logprobs.py MODEL_DIR < {"ids": [...], "top": N}

prints {"logprobs": [log p(ids[i] | ids[:i]) for i >= 1], "top": [[[token, logprob], ...] for each position >= 1]},
in float32.
"""
from __future__ import annotations

import json
import sys

import torch
from transformers import AutoModelForCausalLM


def main() -> None:
    request = json.load(sys.stdin)
    ids = torch.tensor([request["ids"]])
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    chosen = logprobs[:-1].gather(1, ids[0, 1:].unsqueeze(1)).squeeze(1)
    top = torch.topk(logprobs[:-1], int(request["top"]), dim=-1)
    json.dump({"logprobs": chosen.tolist(),
               "top": [[[int(t), float(v)] for t, v in zip(ts.tolist(), vs.tolist(), strict=True)]
                       for ts, vs in zip(top.indices, top.values, strict=True)]}, sys.stdout)


if __name__ == "__main__":
    main()
