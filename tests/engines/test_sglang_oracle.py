"""The engine rules (engines/sglang.py ``resolve``) and the emulator (sim/args.py) against real SGLang 0.5.23's
argument resolution (the oracle venv, autotune/testing/sglang_oracle.py): configs drawn from a seed taken from the
clock (printed; replay with AUTOTUNE_ORACLE_SEED=N), each judged by the three. They must give SGLang's verdict and
the values it resolves: steps, topk, draft tokens, page size, attention backend. The differences the project makes on
purpose are listed below with their reasons (docs/sglang-rules.md); any other fails the test with the config."""
from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from autotune.engines.base import Args
from autotune.engines.sglang import SGLang
from autotune.errors import InvalidConfig
from autotune.sim.args import ArgRuleError, build_parser
from autotune.sim.args import resolve as sim_resolve
from autotune.sim.profile import load_profile
from autotune.testing.sglang_oracle import Answer, Oracle, model_dir
from tests.support import requires
from tests.support.sglang_configs import GPUS, Case, draw

pytestmark = pytest.mark.slow

CONFIGS = 500
#: SGLang's automatic (steps, topk, draft tokens) by architecture, as an emulator profile of the model states it
AUTO_SPECULATIVE = {"LlamaForCausalLM": (5, 4, 8), "DeepseekV3ForCausalLM": (3, 1, 4)}
FIELDS = {"speculative-num-steps": "speculative_num_steps", "speculative-eagle-topk": "speculative_eagle_topk",
          "speculative-num-draft-tokens": "speculative_num_draft_tokens", "page-size": "page_size",
          "attention-backend": "attention_backend", "prefill-attention-backend": "prefill_attention_backend"}


@dataclasses.dataclass(frozen=True)
class Listed:
    """A difference the project makes on purpose: the rules refuse at once a config SGLang accepts while resolving
    its arguments and then fails to start (docs/sglang-rules.md)."""

    kind: str
    reason: str
    matches: Callable[[str], bool]      # on the rules' refusal message


LISTED = (
    Listed("tree over its draft capacity",
           "SGLang accepts draft tokens above topk + (steps-1)*topk^2 + 1 and fails at start with \"selected index k "
           "out of range\"; refusing it at once costs no launch",
           lambda message: message.startswith("selected index k out of range")),
    Listed("tree without a draft-token count",
           "with topk > 1 and no --speculative-num-draft-tokens SGLang resolves draft tokens to None and fails at "
           "start (a TypeError in CUDA-graph capture); refusing it at once costs no launch",
           lambda message: "missing --speculative-num-draft-tokens" in message),
    Listed("tree of fewer draft tokens than steps + 1",
           "SGLang accepts topk > 1 with draft tokens < steps + 1, starts, and its scheduler dies at the first verify "
           "(_compact_accept_to_front; tests/sglang_cpu/test_emulator_against_sglang.py sees it on the real server); "
           "refusing it at once costs no launch",
           lambda message: message.startswith("too few draft tokens for the tree")),
)


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Case, list[str], Answer]]:
    """The drawn configs, each with its argv and real SGLang's answer."""
    seed = int(os.environ.get("AUTOTUNE_ORACLE_SEED") or time.time_ns() % 1_000_000_007)
    print(f"\nSGLang oracle: {CONFIGS} configs from seed {seed} (replay: AUTOTUNE_ORACLE_SEED={seed})")
    root = tmp_path_factory.mktemp("oracle-models")
    models = {kind: model_dir(kind, root) for kind in ("llama", "deepseek")}
    rng = random.Random(seed)
    out = []
    requires.sglang_oracle()
    oracle = Oracle()
    with oracle:
        for _ in range(CONFIGS):
            case = draw(rng)
            argv = argv_of(case, models[case.model])
            out.append((case, argv, oracle.resolve(argv, case.platform)))
    return out


def argv_of(case: Case, model: Path) -> list[str]:
    argv = ["--model-path", str(model)]
    for name, value in case.args.items():
        argv += [f"--{name}", str(model) if value == "DRAFT" else str(value)]
    return argv


def rules(case: Case, model: Path) -> Args:
    args = {k: str(model) if v == "DRAFT" else v for k, v in case.args.items()}
    return SGLang().resolve(args, case.platform)


def differences(predicted: Args, real: dict[str, Any], where: str) -> list[str]:
    """The resolved values the prediction gets wrong; the page size is always predicted for a known GPU and model
    (1 when not written), the others where the prediction gives them."""
    wrong = []
    for name, field in FIELDS.items():
        want = real.get(field)
        have = predicted.get(name, 1 if name == "page-size" else None)
        if have is None and name != "attention-backend":
            continue
        if str(have) != str(want):
            wrong.append(f"{where} {name}={have}, SGLang {field}={want}")
    return wrong


def test_rules_agree_with_sglang(judged: list[tuple[Case, list[str], Answer]]) -> None:
    listed: collections.Counter[str] = collections.Counter()
    unexpected = []
    for case, argv, answer in judged:
        model = Path(argv[1])
        try:
            predicted = rules(case, model)
        except InvalidConfig as e:
            if not answer.accepted:
                continue
            kind = next((item.kind for item in LISTED if item.matches(str(e))), None)
            if kind is None:
                unexpected.append(f"{case.describe()}: the rules refuse ({e}); SGLang accepts it")
            else:
                listed[kind] += 1
            continue
        if not answer.accepted:
            unexpected.append(f"{case.describe()}: the rules accept it; SGLang refuses: {answer.error}")
            continue
        unexpected += [f"{case.describe()}: {d}" for d in differences(predicted, answer.resolved or {}, "rules")]
    agreeing = len(judged) - len(unexpected) - sum(listed.values())
    print(f"rules: {len(judged)} configs, {agreeing} agree with SGLang, listed differences: {dict(listed)}")
    assert not unexpected, f"{len(unexpected)} unlisted differences:\n" + "\n".join(unexpected[:30])


@functools.cache
def _parser() -> argparse.ArgumentParser:
    return build_parser()


def emulated(case: Case, argv: list[str]) -> tuple[dict[str, Any] | None, str | None]:
    """The emulator's resolution of ``argv`` with a profile of the case's GPU and model: (fields, None), or
    (None, the error) for a config it refuses while resolving."""
    base = load_profile("llama8b")
    profile = dataclasses.replace(
        base,
        model=dataclasses.replace(base.model, architecture=case.platform.architecture,
                                  auto_speculative=AUTO_SPECULATIVE[case.platform.architecture]),
        hardware=dataclasses.replace(base.hardware, gpu_name=GPUS[case.gpu]),
    )
    ns = _parser().parse_args(argv)
    try:
        resolved = sim_resolve(ns, argv, profile, lambda message: None)
    except ArgRuleError as e:
        return None, str(e)
    return resolved.fields, None


def test_emulator_agrees_with_sglang(judged: list[tuple[Case, list[str], Answer]]) -> None:
    unexpected = []
    for case, argv, answer in judged:
        fields, error = emulated(case, argv)
        if fields is None:
            if answer.accepted:
                unexpected.append(f"{case.describe()}: the emulator refuses ({error}); SGLang accepts it")
            continue
        if not answer.accepted:
            unexpected.append(f"{case.describe()}: the emulator accepts it; SGLang refuses: {answer.error}")
            continue
        predicted = {name: fields.get(field) for name, field in FIELDS.items()}
        unexpected += [f"{case.describe()}: {d}" for d in differences(predicted, answer.resolved or {}, "emulator")]
    print(f"emulator: {len(judged)} configs, {len(judged) - len(unexpected)} agree with SGLang")
    assert not unexpected, f"{len(unexpected)} differences:\n" + "\n".join(unexpected[:30])
