"""The search space: study parameters -> Optuna suggestions -> candidates the engine would really run.

A candidate is the *effective* config: the study's fixed args, the suggested params, and the engine's own rewrites
(SGLang turns topk 1 with any draft count into steps + 1). Two suggestions with the same effective config are the
same experiment, so the key of a candidate is what decides whether a measurement can be reused.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import optuna

from autotune.engines import Args, ArgValue, Engine, config_key
from autotune.errors import InvalidConfig, UserError
from autotune.study import ParamSpec, StudySpec

#: an impossible space is found by trying configs; beyond this many a space counts as possible
MAX_ENUMERATION = 100_000


@dataclass(frozen=True)
class Candidate:
    params: dict[str, ArgValue]     # the values the sampler chose (empty for a baseline without tuned flags)
    args: Args                      # every server flag, after the engine's rules
    key: str                        # Space.key(args): equal for configs the engine runs identically

    def tuned(self, names: list[str]) -> dict[str, ArgValue]:
        """The effective values of the tuned flags (what the server must report back)."""
        return {n: self.args[n] for n in names if n in self.args}


class Space:
    def __init__(self, spec: StudySpec, engine: Engine, server_port: int) -> None:
        self.params = spec.space
        self.engine = engine
        self.fixed: Args = {**spec.engine.args, engine.port_flag: server_port}
        self.path = spec.path

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def suggest(self, trial: optuna.Trial, only: dict[str, ArgValue] | None = None) -> dict[str, ArgValue]:
        """Ask the trial for every parameter, or for the names in ``only`` (a baseline fixes just those)."""
        return {p.name: _suggest(trial, p) for p in self.params if only is None or p.name in only}

    def candidate(self, params: dict[str, ArgValue]) -> Candidate:
        """The effective config for ``params``; raises ``InvalidConfig`` if the engine would reject it."""
        args = self.engine.resolve({**self.fixed, **params})
        return Candidate(params=dict(params), args=args, key=self.key(args))

    def baseline_params(self) -> dict[str, ArgValue]:
        """The study's fixed values of tuned flags that lie inside the space: the baseline's params for the
        sampler. (The baseline always runs the fixed args; values outside the space are just not shown to it.)"""
        return {p.name: self.fixed[p.name] for p in self.params if p.name in self.fixed and p.contains(self.fixed[p.name])}

    def baseline(self) -> Candidate:
        args = self.engine.resolve(dict(self.fixed))
        return Candidate(params=self.baseline_params(), args=args, key=self.key(args))

    def key(self, args: Args) -> str:
        """The config key: every flag but the port, which says where a config runs, not what it is (workers on
        several targets must recognise each other's configs)."""
        return config_key({k: v for k, v in args.items() if k != self.engine.port_flag})

    def grid(self) -> dict[str, list[ArgValue]]:
        """Every value of every parameter, for Optuna's GridSampler."""
        return {p.name: p.values() for p in self.params}

    def configs(self) -> Iterator[dict[str, ArgValue]]:
        """Every combination of a discrete space (floats contribute their bounds and midpoint when stepless)."""
        axes = [p.values() if p.type != "float" or p.step else _float_probe(p) for p in self.params]
        for combo in itertools.product(*axes):
            yield dict(zip(self.names, combo))

    def check(self) -> int:
        """Reject a space with no config the engine would run; return how many distinct effective configs it has
        (suggestions the engine rewrites to the same config count once)."""
        keys = set()
        first_reason = None
        for params in itertools.islice(self.configs(), MAX_ENUMERATION):
            try:
                keys.add(self.candidate(params).key)
            except InvalidConfig as e:
                first_reason = first_reason or f"{_fmt(params)}: {e}"
        if not keys:
            raise UserError(f"{self.path}: [space] is impossible: the {self.engine.kind} rules reject every config "
                            f"(e.g. {first_reason})")
        return len(keys)

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        return {p.name: _distribution(p) for p in self.params}


def _suggest(trial: optuna.Trial, p: ParamSpec) -> ArgValue:
    if p.type == "categorical":
        return trial.suggest_categorical(p.name, list(p.choices))
    if p.type == "int":
        return trial.suggest_int(p.name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
    return trial.suggest_float(p.name, float(p.low), float(p.high), step=p.step, log=p.log)


def _distribution(p: ParamSpec) -> optuna.distributions.BaseDistribution:
    if p.type == "categorical":
        return optuna.distributions.CategoricalDistribution(list(p.choices))
    if p.type == "int":
        return optuna.distributions.IntDistribution(int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
    return optuna.distributions.FloatDistribution(float(p.low), float(p.high), step=p.step, log=p.log)


def _float_probe(p: ParamSpec) -> list[float]:
    lo, hi = float(p.low), float(p.high)
    return sorted({lo, (lo + hi) / 2, hi})


def _fmt(params: dict[str, ArgValue]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def describe(params: dict[str, ArgValue]) -> str:
    """Short human form of params for log lines: 'steps=3 topk=1 draft=4'."""
    return _fmt({_short(k): v for k, v in params.items()}) or "(fixed args)"


def _short(name: str) -> str:
    for prefix in ("speculative-num-", "speculative-eagle-", "speculative-", "spec-"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name
