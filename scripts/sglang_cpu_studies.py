#!/usr/bin/env python3
"""The two real-SGLang studies on each of their two datasets, run as a user runs them, and each pick confirmed by an
independent client against speculation off and against the study's runner-up.

    scripts/sglang_cpu_studies.py [--out DIR] [--launches N] [--seed N] [--only NAME ...] [--confirm-only]

NAME is one of standalone-chat, standalone-copy, ngram-copy, ngram-chat: studies/sglang-cpu.toml (STANDALONE with the
draft cut from the target) and studies/sglang-cpu-ngram.toml (NGRAM), each on sglang-cpu-chat.jsonl (open chat) and
sglang-cpu-copy.jsonl (copy-heavy). Each study is `autotune run --study COPY` on a copy of the shipped file in OUT
(its paths made absolute, its sampler's seed from the clock unless --seed, printed); its pick is `autotune best`'s,
its runner-up the launched config with the next-best value. Then each of the pick, the runner-up and the same
server without speculation is started on its own (SGLang's own launcher, the study's flags) and measured by
autotune/testing/reference_client.py, which shares no code with autotune: the study's requests one after another
(single stream), then in waves of 4; in two rounds, the second in the reverse order, so that a machine that slows
down in the middle favours none. Printed: each server's figures with their 95% intervals, and the pick's gain over
speculation off and over the runner-up.

Needs scripts/build-sglang-cpu.sh. Run it on an otherwise idle machine: every figure is a CPU's.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from autotune.engines import SGLang
from autotune.testing import reference_client, sglang_cpu

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

STUDIES = {
    "standalone-chat": ("sglang-cpu", "sglang-cpu-chat.jsonl"),
    "standalone-copy": ("sglang-cpu", "sglang-cpu-copy.jsonl"),
    "ngram-copy": ("sglang-cpu-ngram", "sglang-cpu-copy.jsonl"),
    "ngram-chat": ("sglang-cpu-ngram", "sglang-cpu-chat.jsonl"),
}
WAVE = 4


def autotune(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotune", *args], cwd=cwd, capture_output=True, text=True,
                          check=False)


def run_study(name: str, out: Path, launches: int, seed: int) -> Path:
    base, dataset = STUDIES[name]
    directory = (out / name).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    study = sglang_cpu.study_file(directory, base, name=name, study={"launches": launches, "seed": seed},
                                  workload={"dataset": dataset})
    started = time.monotonic()
    done = autotune("run", "--study", str(study), cwd=directory)
    if done.returncode != 0:
        raise SystemExit(f"{name}: autotune run failed: {done.stderr[-2000:]}")
    print(f"{name}: {launches} launches (seed {seed}) in {(time.monotonic() - started) / 60:.1f} min", flush=True)
    return study


def pick_and_runner_up(study: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the pick's params, the runner-up's params or None) as autotune reports them."""
    best = json.loads(autotune("best", "--study", str(study), "--json", cwd=study.parent).stdout)
    report = json.loads(autotune("status", "--study", str(study), "--json", cwd=study.parent).stdout)
    by_config: dict[str, list[dict[str, Any]]] = {}
    for t in report["trials"]:
        if t["state"] == "COMPLETE" and t["value"] is not None:
            by_config.setdefault(json.dumps(t["params"], sort_keys=True), []).append(t)
    ranked = sorted(by_config.values(), key=lambda ts: -sum(t["value"] for t in ts) / len(ts))
    others = [ts[0]["params"] for ts in ranked if ts[0]["params"] != best["params"]]
    return best["params"], (others[0] if others else None)


def server_args(study: Path, params: dict[str, Any] | None) -> dict[str, Any]:
    """The study's fixed flags with ``params`` over them; None: the same server without speculative decoding."""
    fixed = dict(tomllib.loads(study.read_text())["engine"]["args"])
    if params is None:
        return {k: v for k, v in fixed.items() if not k.startswith("speculative-")}
    return {**fixed, **params}


def measure(args: dict[str, Any], requests: list[dict[str, Any]], workdir: Path) -> dict[str, dict[str, float]]:
    # the study's flags as the product renders them; only the measuring client is independent of autotune
    server = sglang_cpu.RealSGLang(SGLang().render([], args), workdir)
    try:
        server.wait_ready(600)
        reference_client.chat_single_stream(server.url, requests[:1])  # a first request warms the server up
        return {"single": reference_client.chat_single_stream(server.url, requests),
                "waves": reference_client.chat_waves(server.url, requests, WAVE)}
    finally:
        server.kill()


def gain(a: dict[str, float], b: dict[str, float]) -> str:
    """a over b, with an interval from both figures' relative half-widths."""
    ratio = a["output_tok_s"] / b["output_tok_s"]
    half = math.hypot(*((x["ci_high"] - x["ci_low"]) / 2 / x["output_tok_s"] for x in (a, b)))
    return f"{ratio:.3f} [{ratio * (1 - half):.3f}, {ratio * (1 + half):.3f}]"


def confirm(name: str, study: Path) -> None:
    pick, runner_up = pick_and_runner_up(study)
    dataset = Path(tomllib.loads(study.read_text())["workload"]["dataset"])
    temperature = tomllib.loads(study.read_text())["workload"].get("temperature", 0.0)
    # as the study sends them: the data's messages and length, the study's temperature where the data gives none
    requests = [{"messages": row["messages"], "max_tokens": row["max_tokens"],
                 "temperature": row.get("temperature", temperature)}
                for row in map(json.loads, dataset.read_text().splitlines())]
    servers = {"pick": server_args(study, pick), "off": server_args(study, None)}
    if runner_up is not None:
        servers["runner-up"] = server_args(study, runner_up)
    figures: dict[str, list[dict[str, dict[str, float]]]] = {k: [] for k in servers}
    order = list(servers)
    with tempfile.TemporaryDirectory() as workdir:
        for round_ in (order, order[::-1]):
            for key in round_:
                figures[key].append(measure(servers[key], requests, Path(workdir)))
    print(f"\n{name}: pick {pick}, runner-up {runner_up}")
    pooled = {key: {level: _pooled([r[level] for r in runs]) for level in ("single", "waves")}
              for key, runs in figures.items()}
    for key, levels in pooled.items():
        print(f"  {key:9s} " + "  ".join(f"{level} {f['output_tok_s']:.2f} tok/s [{f['ci_low']:.2f}, "
                                         f"{f['ci_high']:.2f}]" for level, f in levels.items()))
    for level in ("single", "waves"):
        print(f"  {level}: pick / off {gain(pooled['pick'][level], pooled['off'][level])}", end="")
        if "runner-up" in pooled:
            print(f", pick / runner-up {gain(pooled['pick'][level], pooled['runner-up'][level])}", end="")
        print()
    sys.stdout.flush()


def _pooled(runs: list[dict[str, float]]) -> dict[str, float]:
    """Two rounds' figures as one: the mean, and an interval as wide as the rounds' own and their disagreement."""
    mean = sum(r["output_tok_s"] for r in runs) / len(runs)
    half = max(*((r["ci_high"] - r["ci_low"]) / 2 for r in runs), *(abs(r["output_tok_s"] - mean) for r in runs))
    return {"output_tok_s": mean, "ci_low": mean - half, "ci_high": mean + half}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(".bench/sglang-cpu"))
    parser.add_argument("--launches", type=int, default=8)
    parser.add_argument("--seed", type=int, default=time.time_ns() % 2**32,
                        help="the studies' sampler seed (default: from the clock)")
    parser.add_argument("--only", nargs="*", choices=list(STUDIES), default=list(STUDIES))
    parser.add_argument("--confirm-only", action="store_true", help="confirm the studies already in --out")
    opts = parser.parse_args()
    sglang_cpu.python()
    for name in opts.only:
        if opts.confirm_only:
            study = (opts.out / name / f"{name}.toml").resolve()
        else:
            study = run_study(name, opts.out, opts.launches, opts.seed)
        confirm(name, study)


if __name__ == "__main__":
    main()
