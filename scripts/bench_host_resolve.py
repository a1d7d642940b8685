#!/usr/bin/env python3
"""How long the tuner waits when it asks a host's SGLang about a config before launching it (docs/host-resolution.md).

The question the tuner asks (targets/programs/engine_resolve.py, run by the server command's python, on a local
target here) is timed, one fresh process per answer as in a study, against two hosts:

  emulator   ``python -m autotune.sim``: the emulator answering through autotune.sim.hostargs (its Llama on an H100);
  oracle     SGLang 0.5.23's own resolution in the sglang-cpu venv (scripts/build-sglang-cpu.sh) as the host's
             SGLang, answering as an H100 would (a platform override: this machine has no GPU), for a model
             directory holding only a Llama's config.json (autotune.testing.sglang_oracle.model_dir).

    python scripts/bench_host_resolve.py [--answers 5] [--only emulator|oracle]

Prints one row per host: answers, median / min / max seconds per answer, and what the answers were. The machine's
load shows in these figures: quote them with it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from autotune.engines import SGLang
from autotune.run import hostresolve
from autotune.targets import LocalSpec, LocalTarget
from autotune.testing.sglang_oracle import OracleMissing, model_dir, oracle_python

ENGINE = SGLang()
#: SGLang's platform facts (runtime_context._PLATFORM_PROBES) of an H100 (compute capability 9.0)
H100 = {"is_cuda": True, "is_hip": False, "is_npu": False, "is_xpu": False, "is_musa": False, "is_mps": False,
        "has_amx": False, "has_flashinfer": True, "is_sm90": True, "is_hopper_with_cuda_12_3": True,
        "is_sm100": False, "is_sm100_or_sm110": False, "is_sm110": False, "is_sm120": False, "is_blackwell": False,
        "device_capability": [9, 0], "device_sm": 90}
#: the configs asked about, one per answer (then again from the first): chains, trees, one SGLang refuses (trtllm_mha
#: takes topk 1 only)
TREES = [(3, 1, 4, ""), (5, 4, 8, ""), (3, 4, 8, "trtllm_mha"), (2, 2, 4, ""), (6, 1, 7, ""), (3, 4, 16, "")]


def ask(target: LocalTarget, command: list[str], flags: list[str], override: list[object] | None) -> tuple[float, str]:
    """One question as the tuner asks it: (seconds, the answer in a word)."""
    question = ENGINE.host.question(command, flags)
    assert not isinstance(question, str), question
    request = {**question.request, "op": "resolve", "env": {}, **({"override": override} if override else {})}
    started = time.monotonic()
    done = target.run_engine_program(question.launcher, hostresolve.PROGRAM, json.dumps(request).encode(),
                                     hostresolve.TIMEOUT)
    seconds = time.monotonic() - started
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return seconds, f"no answer ({done.detail()})"
    word = answer["answer"]
    if word == "resolved":
        values = answer["values"]
        word += f" {values.get('speculative_num_steps')}/{values.get('speculative_eagle_topk')}/" \
                f"{values.get('speculative_num_draft_tokens')} {values.get('attention_backend')}"
    elif word == "rejected":
        word += f" ({answer['message'][:60]})"
    else:
        word += f" ({answer.get('reason', '')[:60]})"
    return seconds, word


def tree_flags(i: int) -> list[str]:
    steps, topk, draft, backend = TREES[i % len(TREES)]
    chosen = ["--attention-backend", backend] if backend else []
    return ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(steps), "--speculative-eagle-topk",
            str(topk), "--speculative-num-draft-tokens", str(draft), *chosen]


def bench(name: str, command: list[str], base: list[str], override: list[object] | None, answers: int,
          work: Path) -> None:
    target = LocalTarget(LocalSpec(engine="sglang"), cwd=work)
    times, words = [], []
    for i in range(answers):
        seconds, word = ask(target, command, [*base, *tree_flags(i)], override)
        times.append(seconds)
        words.append(word)
    print(f"{name:<9} {answers:>7} {statistics.median(times):>9.2f} {min(times):>7.2f} {max(times):>7.2f}  "
          f"{'; '.join(dict.fromkeys(words))}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=5, help="answers per host (default 5)")
    parser.add_argument("--only", choices=["emulator", "oracle"], help="one host only")
    options = parser.parse_args()
    if options.answers < 1:
        parser.error("--answers must be at least 1")
    try:
        python = oracle_python() if options.only != "emulator" else None
    except OracleMissing as e:
        print(f"bench_host_resolve: {e}", file=sys.stderr)
        sys.exit(2)
    with tempfile.TemporaryDirectory(prefix="bench-host-resolve-") as tmp:
        work = Path(tmp)
        model = model_dir("llama", work)
        print(f"{'host':<9} {'answers':>7} {'median s':>9} {'min s':>7} {'max s':>7}  answers")
        if options.only != "oracle":
            bench("emulator", [sys.executable, "-m", "autotune.sim"],
                  ["--model-path", "/m", "--sim-profile", "llama8b"], None, options.answers, work)
        if python is not None:
            base = ["--model-path", str(model), "--speculative-draft-model-path", str(model), "--device", "cuda"]
            bench("oracle", [str(python), "-m", "sglang.launch_server"], base,
                  ["sglang.srt.runtime_context", "override_platform", H100], options.answers, work)


if __name__ == "__main__":
    main()
