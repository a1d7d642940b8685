"""The search space: study parameters -> Optuna suggestions -> candidates the engine would really run.

A candidate is the *effective* config: the study's fixed args, the suggested params, and the engine's own rewrites
(SGLang turns topk 1 with any draft count into steps + 1). Two suggestions with the same effective config are the
same experiment, so the key of a candidate is what decides whether a measurement can be reused.

Dependent ranges (``[study] ranges = "engine"``, the default): a flag whose valid values depend on other tuned flags
(``Engine.depends_on``; SGLang's draft tokens on steps and topk) is drawn as a fill fraction of the range the engine
accepts given them (``Engine.valid_range``): Optuna sees a fixed parameter ``NAME.fill`` in [0, 1] (0 = the lowest
valid value, 1 = the highest), so every suggestion is a config the engine runs and multivariate TPE and GP model the
space as it is. The flag's real value is what the sampler suggestion turns into: ``suggest`` returns it, and the
trial records it (user attrs ``params`` and ``config``). ``ranges = "fixed"`` (and the grid sampler) draw every
flag over its [space] range as written; the engine's rules then reject invalid combinations before deploying.
"""
from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import optuna

from autotune.engines import Args, ArgValue, Engine, ValidRange, config_key
from autotune.engines.base import Platform
from autotune.errors import InvalidConfig, UserError
from autotune.redact import mask
from autotune.studyfile.spec import ParamSpec, StudySpec

#: the most combinations the search walks to find every valid config (search/neighbours.py; once per run)
MAX_ENUMERATION = 2_000_000
#: the most combinations `validate` tries to find a valid config and count them (a larger space: a random sample)
MAX_CHECK = 10_000
#: suffix of the internal parameter that places a dependent flag inside its valid range
FILL = ".fill"


@dataclass(frozen=True)
class ServerFile:
    """A file the server reads, named by a flag: the target places it and the flag gets its path there."""

    flag: str
    name: str                       # its file name, and the flag's value in the config (and key) until placed
    text: str


@dataclass(frozen=True)
class Candidate:
    params: dict[str, ArgValue]     # the values the sampler chose (empty for a baseline without tuned flags)
    args: Args                      # every server flag, after the engine's rules
    key: str                        # Space.key(args): equal for configs the engine runs identically
    files: tuple[ServerFile, ...] = ()

    def tuned(self, names: list[str]) -> dict[str, ArgValue]:
        """The effective values of the tuned flags (what the server must report back)."""
        return {n: self.args[n] for n in names if n in self.args}


class Space:
    def __init__(self, spec: StudySpec, engine: Engine, server_port: int) -> None:
        self.params = spec.space
        self.engine = engine
        self.fixed: Args = {**spec.engine.args, engine.port_flag: server_port}
        #: the target's GPU and served model, once the tuner has read them (hostresolve.py): the engine's rules use
        #: them for the defaults that depend on them
        self.platform: Platform | None = None
        self.path = spec.path
        self.ranges = "fixed" if spec.sampler == "grid" else spec.ranges
        tuned = {p.name for p in self.params}
        #: tuned flags whose valid range depends on other tuned flags: drawn as a fill fraction of that range
        self.dependent = {p.name for p in self.params if self.ranges == "engine"
                          and tuned.intersection(engine.depends_on(p.name))}
        # the flags a dependent one depends on are drawn first
        self._order = sorted(self.params, key=lambda p: p.name in self.dependent)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def suggest(self, trial: optuna.Trial, only: dict[str, ArgValue] | None = None) -> dict[str, ArgValue]:
        """Ask the trial for every parameter, or for the names in ``only`` (a baseline fixes just those); returns
        the flags' values (a dependent flag's fill fraction already turned into its value)."""
        chosen: dict[str, ArgValue] = {}
        for p in self._order:
            if only is None or p.name in only:
                chosen[p.name] = self._suggest(trial, p, chosen)
        return {n: chosen[n] for n in self.names if n in chosen}

    def _suggest(self, trial: optuna.Trial, p: ParamSpec, chosen: dict[str, ArgValue]) -> ArgValue:
        if self.ranges != "engine" or not self.engine.depends_on(p.name):
            return _suggest(trial, p)
        valid = self.engine.valid_range(p.name, {**self.fixed, **chosen})
        if p.name in self.dependent:
            return _place(p, valid, trial.suggest_float(p.name + FILL, 0.0, 1.0))
        # the flags it depends on are fixed: its valid range is the same in every trial
        if valid.irrelevant:
            return p.values()[0] if p.type != "float" or p.step else float(p.low)
        inside = values_inside(p, valid)
        if inside is None:
            return _suggest(trial, p)  # no value is valid: drawn as written, the engine rejects it
        if p.type == "categorical":
            return trial.suggest_categorical(p.name, list(inside))
        return _suggest(trial, replace(p, low=inside[0], high=inside[-1]))

    def internal(self, params: dict[str, ArgValue]) -> dict[str, ArgValue]:
        """The sampler's parameters for flag values ``params`` (to queue a config, like the baseline): a dependent
        flag becomes its fill fraction, the middle of its value's share of [0, 1]."""
        out: dict[str, ArgValue] = {}
        for name, value in params.items():
            if name not in self.dependent:
                out[name] = value
                continue
            p = next(q for q in self.params if q.name == name)
            valid = self.engine.valid_range(name, {**self.fixed, **params})
            out[name + FILL] = _fill_of(p, ValidRange() if valid.irrelevant else valid, value)
        return out

    def candidate(self, params: dict[str, ArgValue]) -> Candidate:
        """The effective config for ``params``; raises ``InvalidConfig`` if the engine would reject it."""
        args = self.engine.resolve({**self.fixed, **params}, self.platform)
        return Candidate(params=dict(params), args=args, key=self.key(args))

    def adaptive(self, args: Args, file: ServerFile) -> Candidate:
        """The adaptive server that runs ``args`` (built on this space's fixed args) with its schedule ``file``."""
        resolved = self.engine.resolve({**args, file.flag: file.name}, self.platform)
        return Candidate(params={}, args=resolved, key=self.key(resolved), files=(file,))

    def baseline_params(self) -> dict[str, ArgValue]:
        """The study's fixed values of tuned flags that lie inside the space: the baseline's params for the
        sampler. (The baseline always runs the fixed args; values outside the space are just not shown to it.)"""
        return {p.name: self.fixed[p.name] for p in self.params
                if p.name in self.fixed and p.contains(self.fixed[p.name])}

    def baseline(self) -> Candidate:
        args = self.engine.resolve(dict(self.fixed), self.platform)
        return Candidate(params=self.baseline_params(), args=args, key=self.key(args))

    def starting_points(self) -> list[dict[str, ArgValue]]:
        """The engine's starting points that this space holds, as tuned flags' values: each a config the engine
        runs, none the baseline's config, no two the same config."""
        values = {p.name: p.values() for p in self.params if p.type != "float" or p.step}
        seen = {self.baseline().key}
        out = []
        for point in self.engine.starting_points(values, self.fixed):
            params = {n: v for n, v in point.items() if n in values}
            if params and self.is_new(params, seen):
                out.append(params)
        return out

    def is_new(self, params: dict[str, ArgValue], seen: set[str]) -> bool:
        """Whether ``params`` (tuned flags' values) is a config the sampler could suggest and the engine runs, whose
        key is not in ``seen`` yet; its key is added when it is."""
        if not all(p.contains(params[p.name]) for p in self.params if p.name in params):
            return False
        try:
            key = self.candidate(params).key
        except InvalidConfig:
            return False
        if key in seen:
            return False
        seen.add(key)
        return True

    def key(self, args: Args) -> str:
        """The config key: every flag but the port, which says where a config runs, not what it is (workers on
        several targets must recognise each other's configs). Secrets are masked: keys are stored and compared."""
        return mask(config_key({k: v for k, v in args.items() if k != self.engine.port_flag}))

    def grid(self) -> dict[str, list[ArgValue]]:
        """Every value of every parameter, for Optuna's GridSampler."""
        return {p.name: p.values() for p in self.params}

    def configs(self) -> Iterator[dict[str, ArgValue]]:
        """Every combination of a discrete space (floats contribute their bounds and midpoint when stepless)."""
        axes = [p.values() if p.type != "float" or p.step else _float_probe(p) for p in self.params]
        for combo in _product(axes):
            yield dict(zip(self.names, combo, strict=True))

    def candidates(self) -> Iterator[Candidate]:
        """The effective config of every combination ``configs`` walks that the engine accepts, once each
        (combinations that differ only in flags the engine drops are one config)."""
        seen: set[str] = set()
        for params in self.configs():
            try:
                candidate = self.candidate(params)
            except InvalidConfig:
                continue
            if candidate.key not in seen:
                seen.add(candidate.key)
                yield candidate

    def size(self) -> int:
        """How many combinations ``configs`` walks, counted, never listed."""
        return math.prod(p.count() if p.type != "float" or p.step else len(_float_probe(p)) for p in self.params)

    @property
    def walkable(self) -> bool:
        """Whether every combination can be tried in reasonable time (at most MAX_ENUMERATION of them)."""
        return self.size() <= MAX_ENUMERATION

    def _sample(self, n: int) -> Iterator[dict[str, ArgValue]]:
        """``n`` combinations drawn evenly at random from the whole space (the same ones each time), by their index
        in ``configs``' order: nothing is listed."""
        axes = [p.values() if p.type != "float" or p.step else _float_probe(p) for p in self.params]
        rng = random.Random(0)
        size = self.size()
        for _ in range(n):
            index = rng.randrange(size)
            combo = []
            for axis in reversed(axes):
                index, at = divmod(index, len(axis))
                combo.append(axis[at])
            yield dict(zip(self.names, reversed(combo), strict=True))

    def check(self) -> tuple[int, bool]:
        """Reject a space with no config the engine would run. Returns how many distinct effective configs it has
        (suggestions the engine rewrites to the same config count once) and whether that is a lower bound (a space
        of more than MAX_CHECK combinations is sampled, not walked)."""
        keys = set()
        first_reason = None
        size = self.size()
        combos = self.configs() if size <= MAX_CHECK else self._sample(MAX_CHECK)
        for params in combos:
            try:
                keys.add(hash(self.candidate(params).key))  # counted: 10,000 keys of a long argument are large
            except InvalidConfig as e:
                first_reason = first_reason or f"{_fmt(params)}: {e}"
        if not keys:
            raise UserError(f"{self.path}: [space] is impossible: the {self.engine.kind} rules reject every config "
                            f"(e.g. {first_reason})")
        self._check_reach()
        return len(keys), size > MAX_CHECK

    def _check_reach(self) -> None:
        """Refuse a flag whose [space] range goes past the most the engine accepts anywhere in the space (draft
        tokens up to 2000000000 for trees that hold at most 457): values no config can run. The flags it depends on
        are tried at their extremes (the engines' bounds grow with them)."""
        for p in self.params:
            deps = self.engine.depends_on(p.name)
            if not deps or p.type == "categorical":
                continue
            axes = [self._extremes(d) for d in deps]
            most: float | None = None
            for combo in itertools.product(*axes):
                valid = self.engine.valid_range(p.name, {**self.fixed, **dict(zip(deps, combo, strict=True))})
                if valid.irrelevant:
                    continue
                if valid.high is None:
                    break
                most = valid.high if most is None else max(most, valid.high)
            else:
                if most is not None and p.high > most:
                    raise UserError(f"{self.path}: [space.{p.name}] high: {p.high} is more than {self.engine.kind} "
                                    f"accepts anywhere in this space, given its {', '.join(deps)} (at most {most})")

    def _extremes(self, name: str) -> list[ArgValue]:
        """A flag's lowest and highest value in the space (every choice of a categorical), or its fixed value."""
        p = next((q for q in self.params if q.name == name), None)
        if p is None:
            return [self.fixed[name]] if name in self.fixed else []
        if p.type == "categorical":
            return list(p.choices)
        return [p.values()[0] if p.type == "int" else p.low, p.values()[-1] if p.type == "int" else p.high]

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        return {p.name: _distribution(p) for p in self.params}


def _product(axes: list[Sequence[ArgValue]]) -> Iterator[tuple[ArgValue, ...]]:
    """itertools.product without listing its inputs first (an int range may hold billions of values)."""
    if not axes:
        yield ()
        return
    for head in axes[0]:
        for rest in _product(axes[1:]):
            yield (head, *rest)


def _suggest(trial: optuna.Trial, p: ParamSpec) -> ArgValue:
    if p.type == "categorical":
        return trial.suggest_categorical(p.name, list(p.choices))
    if p.type == "int":
        return trial.suggest_int(p.name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
    return trial.suggest_float(p.name, float(p.low), float(p.high), step=p.step, log=p.log)


def values_inside(p: ParamSpec, valid: ValidRange) -> Sequence[ArgValue] | tuple[float, float] | None:
    """The values of ``p`` inside ``valid`` in order (a stepless float: its (low, high)); None if there are none."""
    def ok(v: ArgValue) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return True  # a bound says nothing about a non-numeric choice
        return (valid.low is None or v >= valid.low) and (valid.high is None or v <= valid.high)

    if p.type == "float" and not p.step:
        lo = float(p.low) if valid.low is None else max(float(p.low), valid.low)
        hi = float(p.high) if valid.high is None else min(float(p.high), valid.high)
        return (lo, hi) if lo <= hi else None
    values = p.values()
    if isinstance(values, range):  # clipped by arithmetic: a range is never listed
        first = 0 if valid.low is None else max(0, math.ceil((valid.low - values.start) / values.step))
        last = len(values) if valid.high is None else min(len(values),
                                                           math.floor((valid.high - values.start) / values.step) + 1)
        return values[first:last] or None
    return tuple(v for v in values if ok(v)) or None


def _place(p: ParamSpec, valid: ValidRange, fill: float) -> ArgValue:
    """The value at fraction ``fill`` of ``p``'s values inside ``valid``: equal shares of [0, 1] for each value, so a
    uniform fill draws every valid value equally often. Irrelevant (or no valid value): placed in the range as
    written (the engine overrides, or rejects, it)."""
    inside = None if valid.irrelevant else values_inside(p, valid)
    if inside is None:
        inside = values_inside(p, ValidRange())
    assert inside is not None
    if p.type == "float" and not p.step:
        lo, hi = inside
        return lo + fill * (hi - lo)
    return inside[min(len(inside) - 1, max(0, math.floor(fill * len(inside))))]


def _fill_of(p: ParamSpec, valid: ValidRange, value: ArgValue) -> float:
    """The fill fraction ``_place`` turns into ``value`` (the middle of its share); 0.5 for a value outside."""
    inside = values_inside(p, valid) or values_inside(p, ValidRange()) or ()
    if p.type == "float" and not p.step:
        lo, hi = inside
        return 0.5 if hi <= lo or not lo <= float(value) <= hi else (float(value) - lo) / (hi - lo)
    if isinstance(inside, range):
        return (inside.index(value) + 0.5) / len(inside) if isinstance(value, int) and value in inside else 0.5
    matches = [i for i, v in enumerate(inside) if v == value and type(v) is type(value)]
    return (matches[0] + 0.5) / len(inside) if matches else 0.5


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
