"""Study files (TOML) -> a validated ``StudySpec``.

Every error names the file, the key and what is allowed, in one line, so a typo never reaches a GPU host.
"""
from __future__ import annotations

import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from autotune.engines import ENGINES, ArgValue, get_engine
from autotune.errors import UserError
from autotune.redact import MASK, is_secret, redact_url, remember, remember_url_password
from autotune.tables import CONTROL, PLAIN_TOKEN, Reader
from autotune.targets import TargetSpec, parse_target

SAMPLERS = ("tpe", "gp", "random", "grid")
#: how the sampler meets a flag whose valid values depend on others (SGLang's draft tokens on steps and topk):
#: "engine" draws it inside the range the engine accepts given the others; "fixed" draws the [space] range as
#: written and leaves invalid combinations to be rejected before deploying (the grid sampler always does this)
RANGES = ("engine", "fixed")
#: how a model-based sampler's first configs after the baseline are chosen: the engine's starting points, or at random
INITIAL_DESIGNS = ("engine", "random")
OBJECTIVES = ("single", "concurrent", "weighted", "pareto", "mix", "capacity")
PARAM_TYPES = ("int", "float", "categorical")

#: names are matched whole (``\A...\Z``): they reach file names, command lines and shells
FLAG_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_-]*\Z")
STUDY_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
#: the longest study name: it becomes file names (NAME-artifacts, NAME.db-journal) whose length a file system caps
#: at 255 bytes
MAX_NAME = 100
#: the largest study file read (a study file is a few kB; a larger one is not a study file)
MAX_STUDY_BYTES = 4 * 2**20
#: the highest seed the samplers take (numpy's generators take 32 bits)
MAX_SEED = 2**32 - 1
#: the most requests a concurrency level keeps in flight
MAX_CONCURRENCY = 10_000
#: the largest magnitude of a number in [space] (a server flag's value; beyond it floats lose whole numbers)
MAX_MAGNITUDE = 10**15


@dataclass(frozen=True)
class EngineSpec:
    kind: str
    command: list[str]
    args: dict[str, ArgValue]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ParamSpec:
    name: str
    type: str
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    choices: tuple[ArgValue, ...] = ()

    def contains(self, value: ArgValue) -> bool:
        """Whether ``value`` is one the sampler could suggest (the baseline's value may lie outside)."""
        if self.type == "categorical":
            return (type(value), value) in self._choice_set
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.type == "int" and value != int(value):
            return False
        if not self.low <= value <= self.high:
            return False
        return self.step is None or abs((value - self.low) / self.step - round((value - self.low) / self.step)) < 1e-9

    @cached_property
    def _choice_set(self) -> frozenset[tuple[type, ArgValue]]:
        """The choices by type and value, so that ``contains`` costs the same for 20,000 choices as for two."""
        return frozenset((type(c), c) for c in self.choices)

    def count(self) -> int:
        """How many values a discrete parameter has, counted, never listed (an int range may have billions)."""
        if self.type == "categorical":
            return len(self.choices)
        assert self.low is not None and self.high is not None
        return math.floor((self.high - self.low) / (self.step or 1) + 1e-9) + 1

    def values(self) -> Sequence[ArgValue]:
        """Every value of a discrete parameter (ints and categoricals; floats need a step), in order. An int range
        is a ``range``: it is indexed, sliced and measured without being listed."""
        if self.type == "categorical":
            return list(self.choices)
        assert self.low is not None and self.high is not None
        if self.type == "int":
            step = int(self.step or 1)
            return range(int(self.low), int(self.low) + self.count() * step, step)
        return [round(self.low + i * self.step, 12) for i in range(self.count())]  # type: ignore[operator]


@dataclass(frozen=True)
class WorkloadSpec:
    prompts: str = "builtin"
    #: the study's own traffic (bench/traffic.py reads the formats); None: ``prompts``
    dataset: str | None = None
    #: the output length where the data gives none (and of every raw prompt of ``prompts``)
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float | None = None
    #: None: a dataset's requests end naturally, ``prompts`` run to max_tokens (as autotune always measured them)
    ignore_eos: bool | None = None
    concurrency: tuple[int, ...] = (1, 8, 32)
    #: the single stream's requests
    requests: int = 32
    #: each concurrency level's window closes once this many generations of requests (the level's concurrency each)
    #: have finished inside it: one generation leaves the figure to how a single batch's prompts happened to fall
    window_generations: int = 4
    warmup: int = 2
    request_timeout: float = 300.0
    stall_timeout: float = 30.0
    tolerance: float = 0.03
    min_repeats: int = 1
    max_repeats: int = 3
    #: objective "mix": concurrency level -> share of the time the server spends there (shares sum to 1)
    mix: dict[int, float] = field(default_factory=dict)
    #: the load generator's worker processes per concurrency level (0: what its machine can spare)
    processes: int = 0
    #: where the concurrency levels' load generator runs (CLIENTS)
    client: str = "auto"

    @property
    def forced_length(self) -> bool:
        """Whether every request runs to its size, past the end the model would give it (ignore_eos)."""
        return self.ignore_eos if self.ignore_eos is not None else self.dataset is None


#: where a concurrency level's load generator can run: "local" on this machine, through the target's own way to the
#: server (for SSH targets with a tunnel, autotune's port forward); "openssh" on this machine through an OpenSSH
#: `ssh -L` forward (SSH targets); "target" on the target host itself (SSH targets); "auto" picks for the target
CLIENTS = ("auto", "local", "openssh", "target")


@dataclass(frozen=True)
class ConstraintSpec:
    min_running_requests: int | None = None
    max_ttft_p99_ms: float | None = None
    max_itl_p99_ms: float | None = None
    max_error_rate: float = 0.0

    @property
    def slo(self) -> tuple[float | None, float | None] | None:
        """(max TTFT p99, max ITL p99) in ms, or None when neither is set."""
        if self.max_ttft_p99_ms is None and self.max_itl_p99_ms is None:
            return None
        return self.max_ttft_p99_ms, self.max_itl_p99_ms


@dataclass(frozen=True)
class HealthSpec:
    interval: float = 0.5
    timeout: float = 900.0


@dataclass(frozen=True)
class StudySpec:
    name: str
    path: Path
    storage: str
    launches: int                    # the budget: launches (servers started)
    sampler: str
    objective: str
    seed: int | None
    startup_trials: int | None
    pruning: bool
    heartbeat: float
    targets: dict[str, TargetSpec]
    engine: EngineSpec
    space: tuple[ParamSpec, ...]
    workload: WorkloadSpec
    constraints: ConstraintSpec
    health: HealthSpec
    text: str = field(repr=False, default="")
    ranges: str = "engine"
    initial_design: str = "engine"
    #: whether the study measures the engine's adaptive speculative server built from its own measurements
    adaptive: bool = False
    #: values named by reference whose environment variable is not set (commands that launch refuse to start)
    missing: tuple[str, ...] = ()

    @property
    def directory(self) -> Path:
        return self.path.parent

    @property
    def state_prefix(self) -> Path:
        """Where this study's files live beside the study file: NAME.db, NAME.log, NAME-logs/, NAME-artifacts/."""
        return self.directory / self.name

    def target(self, name: str | None = None) -> TargetSpec:
        if name is None:
            if len(self.targets) == 1:
                return next(iter(self.targets.values()))
            raise UserError(
                f"{self.path}: several targets ({', '.join(self.targets)}); choose one with --target NAME"
            )
        if name not in self.targets:
            raise UserError(f"{self.path}: no target {name!r}; targets: {', '.join(self.targets)}")
        return self.targets[name]

    @property
    def directions(self) -> list[str]:
        return ["maximize", "maximize"] if self.objective == "pareto" else ["maximize"]

    @property
    def param_names(self) -> list[str]:
        return [p.name for p in self.space]

    @property
    def levels(self) -> tuple[int, ...]:
        """The concurrency levels a trial measures: the workload's, and the single stream (1) whenever the objective
        needs it (every objective but "concurrent", "mix" and "capacity"; for "capacity" they are the ladder its
        probes climb, bench/capacity.py)."""
        single = (1,) if self.objective not in ("concurrent", "mix", "capacity") else ()
        return tuple(sorted({*single, *self.workload.concurrency}))


def find_study_file(name: str, studies_dir: Path | None = None) -> Path:
    """NAME is a path to a .toml file, or a name under ./studies."""
    candidate = Path(name).expanduser()
    if candidate.suffix == ".toml" or "/" in name:
        if not _is_file(candidate):
            raise UserError(f"study file {candidate} does not exist")
        return candidate.resolve()
    base = studies_dir or Path.cwd() / "studies"
    path = base / f"{name}.toml"
    if not _is_file(path):
        known = sorted(p.stem for p in base.glob("*.toml")) if base.is_dir() else []
        hint = f"; studies in {base}: {', '.join(known)}" if known else f"; no studies in {base}"
        raise UserError(f"unknown study {name!r}: {path} does not exist{hint}")
    return path.resolve()


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a regular file (a name too long for the file system is none)."""
    try:
        return path.is_file()
    except OSError:
        return False


def read_study_file(name_or_path: str, studies_dir: Path | None = None) -> StudySpec:
    """Find, parse and validate a study file."""
    path = find_study_file(name_or_path, studies_dir)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_STUDY_BYTES + 1)
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    if len(raw) > MAX_STUDY_BYTES:
        raise UserError(f"{path}: larger than {MAX_STUDY_BYTES // 2**20} MiB: not a study file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {raw[e.start]:#04x} at offset {e.start})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: not valid TOML: {e}") from None
    except RecursionError:
        raise UserError(f"{path}: not valid TOML here: arrays or tables nested too deeply") from None
    return parse_study(data, path, text)


def parse_study(data: dict[str, Any], path: Path, text: str = "") -> StudySpec:
    v = Reader(path)
    v.only(data, "", ("study", "target", "targets", "engine", "space", "workload", "constraints", "health"))

    study = v.table(data, "study")
    v.only(study, "study", ("name", "storage", "launches", "trials", "sampler", "objective", "seed", "startup_trials",
                            "pruning", "heartbeat", "ranges", "initial_design", "adaptive"))
    name = v.get(study, "study", "name", str, path.stem)
    if not STUDY_NAME.fullmatch(name):
        v.fail("study", "name", f"must be letters, digits, '.', '_' or '-', got {name!r}")
    if len(name) > MAX_NAME:
        v.fail("study", "name", f"is {len(name)} characters long; at most {MAX_NAME} (it names the study's files)"
                                + ("" if "name" in study else ": name the study in [study] name, or the file shorter"))
    storage = v.get(study, "study", "storage", str, f"sqlite:///{path.parent / name}.db")
    try:
        storage = resolve_storage(storage, path.parent)
    except ValueError as e:
        v.fail("study", "storage", str(e))
    remember_url_password(storage)
    if "launches" in study and "trials" in study:
        v.fail("study", "trials", "and launches are the same budget (servers started); give one of them")
    budget_key = "launches" if "launches" in study else "trials"
    launches = v.integer(study, "study", budget_key, 40, low=1)
    sampler = v.choice(study, "study", "sampler", SAMPLERS, "tpe")
    objective = v.choice(study, "study", "objective", OBJECTIVES, "weighted")
    seed = v.integer(study, "study", "seed", None, low=0, high=MAX_SEED)
    startup_trials = v.integer(study, "study", "startup_trials", None, low=0)
    ranges = v.choice(study, "study", "ranges", RANGES, "engine")
    initial_design = v.choice(study, "study", "initial_design", INITIAL_DESIGNS, "engine")
    pruning = v.get(study, "study", "pruning", bool, objective != "pareto")
    heartbeat = v.number(study, "study", "heartbeat", 10.0, low=1, high=600)
    adaptive = v.get(study, "study", "adaptive", bool, False)
    if pruning and objective == "pareto":
        v.fail("study", "pruning",
               "is not available with objective = \"pareto\" (Optuna prunes single objectives only)")

    targets = _targets(data, v)
    engine = _engine(data, v, path)
    if adaptive and get_engine(engine.kind).adaptive is None:
        v.fail("study", "adaptive", f"the {engine.kind} engine has no adaptive speculative mode (allowed: false)")
    space = _space(data, v, engine)
    workload = _workload(data, v)
    if (objective == "mix") != bool(workload.mix):
        v.fail("workload", "mix", 'and objective = "mix" go together: the mix gives the load the objective weighs '
                                  '(e.g. mix = { 1 = 0.2, 8 = 0.5, 32 = 0.3 })')
    constraints = _constraints(data, v)
    if objective == "capacity" and constraints.slo is None:
        v.fail("constraints", "max_ttft_p99_ms", 'or max_itl_p99_ms is required with objective = "capacity": the '
                                                 'SLO the capacity is measured within (e.g. max_ttft_p99_ms = 500)')
    health = _health(data, v)
    if sampler == "grid":
        for p in space:
            if p.type == "float" and p.step is None:
                v.fail(f"space.{p.name}", "step", "is required for a float parameter with sampler = \"grid\"")
        cells = math.prod(p.count() for p in space)
        if cells > MAX_GRID:
            v.fail("study", "sampler", f"\"grid\" would list {cells:.3g} configs; at most {MAX_GRID} (narrow the "
                                       "[space] ranges, or use tpe)")
    return StudySpec(
        name=name, path=path, storage=storage, launches=launches, sampler=sampler, objective=objective, seed=seed,
        startup_trials=startup_trials, pruning=pruning, heartbeat=heartbeat, targets=targets, engine=engine,
        space=space, workload=workload, constraints=constraints, health=health, text=text, ranges=ranges,
        initial_design=initial_design, adaptive=adaptive, missing=tuple(v.missing),
    )


def resolve_storage(url: str, base: Path) -> str:
    """A storage URL as autotune opens it: relative SQLite paths are relative to ``base`` (the study file's
    directory). Raises ValueError saying what is allowed."""
    if url.startswith("sqlite:///"):
        rest = url[len("sqlite:///"):]
        if rest in ("", ":memory:"):
            raise ValueError("must name a database file; an in-memory database would lose the study")
        p = Path(rest).expanduser()
        if not p.is_absolute():
            p = base / p
        return f"sqlite:///{p}"
    if url.startswith(("postgresql://", "postgresql+", "mysql://", "mysql+")):
        return url
    raise ValueError(f"must be sqlite:///PATH or postgresql://..., got {redact_url(url)!r}")


def _targets(data: dict[str, Any], v: Reader) -> dict[str, TargetSpec]:
    if "target" in data and "targets" in data:
        v.fail("", "targets", "give either [target] or [targets.NAME] tables, not both")
    if "targets" in data:
        tables = v.table(data, "targets")
        if not tables:
            v.fail("", "targets", "needs at least one [targets.NAME] table")
        out = {}
        for tname, table in tables.items():
            if not isinstance(table, dict):
                v.fail("targets", tname, "must be a table of target keys")
            if not FLAG_NAME.fullmatch(tname):
                v.fail("targets", tname, "target names must be letters, digits, '_' or '-'")
            out[tname] = parse_target(tname, table, f"targets.{tname}", v)
            same = next((o for o in out.values() if o.name != tname and o.identity == out[tname].identity), None)
            if same is not None:
                v.fail("targets", tname, f"is the server of [targets.{same.name}] too ({out[tname].identity}): "
                                         "each target needs a port (or unit) of its own")
        return out
    return {"default": parse_target("default", v.table(data, "target"), "target", v)}


def _engine(data: dict[str, Any], v: Reader, path: Path) -> EngineSpec:
    e = v.table(data, "engine")
    v.only(e, "engine", ("kind", "command", "args", "env"))
    kind = v.choice(e, "engine", "kind", tuple(ENGINES), None)
    if kind is None:
        v.fail("engine", "kind", f"is required; allowed: {', '.join(ENGINES)}")
    command = v.get(e, "engine", "command", list, None)
    if not command or not all(isinstance(c, str) and c and not CONTROL.search(c) for c in command):
        v.fail("engine", "command", "is required: a non-empty list of one-line strings, e.g. "
                                    "[\"python3\", \"-m\", \"sglang.launch_server\"]")
    args = dict(v.get(e, "engine", "args", dict, {}))
    for key, value in args.items():
        if isinstance(value, dict):
            _check_name(key, "engine.args", v)
            args[key] = v.reference("engine.args", key, value)
            continue
        _check_arg(key, value, "engine.args", v)
        if isinstance(value, str) and is_secret(key):
            remember(value)
    env = v.env(e, "engine", "env")
    return EngineSpec(kind=kind, command=list(command), args=dict(args), env=env)


#: a float range with a step is listed value by value: at most this many
MAX_FLOAT_STEPS = 1_000_000
#: Optuna's GridSampler lists every cell of the grid up front
MAX_GRID = 1_000_000
#: characters a server flag's value never needs, which in a value would only be an attempt at shell syntax
SHELL_CHARACTERS = frozenset("$`;|&<>\\")


def _check_name(key: str, where: str, v: Reader) -> None:
    if not FLAG_NAME.fullmatch(key):
        v.fail(where, key, "flag names are written without leading dashes: letters, digits, '_' and '-'")


def _check_arg(key: str, value: Any, where: str, v: Reader) -> None:
    _check_name(key, where, v)
    if isinstance(value, (bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            v.fail(where, key, f"must be a finite number, got {value!r}")
        return
    if not isinstance(value, str):
        v.fail(where, key, f"must be a string, number or true (a bare flag), got {type(value).__name__}")
    if value == "" or any(ord(c) < 32 for c in value):
        v.fail(where, key, "must be a non-empty single-line string")
    shell = sorted({c for c in value if c in SHELL_CHARACTERS})
    if shell:
        shown = MASK if is_secret(key) else repr(value)
        v.fail(where, key, f"must not contain {' '.join(shell)} (shell syntax no server flag takes; values reach "
                           f"the server as they are, never through a shell), got {shown}")


def _space(data: dict[str, Any], v: Reader, engine: EngineSpec) -> tuple[ParamSpec, ...]:
    space = v.table(data, "space")
    if not space:
        v.fail("", "space", "is empty: name at least one server flag to tune, as a [space.FLAG] table")
    out = []
    for name, p in space.items():
        where = f"space.{name}"
        if not isinstance(p, dict):
            v.fail("space", name, "must be a table with type = \"int\" | \"float\" | \"categorical\"")
        if not FLAG_NAME.fullmatch(name):
            v.fail("space", name, "flag names are written without leading dashes: letters, digits, '_' and '-'")
        ptype = v.choice(p, where, "type", PARAM_TYPES, None)
        if ptype is None:
            v.fail(where, "type", f"is required; allowed: {', '.join(PARAM_TYPES)}")
        if ptype == "categorical":
            v.only(p, where, ("type", "choices"))
            choices = v.get(p, where, "choices", list, None)
            if not choices:
                v.fail(where, "choices", "must be a non-empty list")
            for c in choices:
                if isinstance(c, bool):
                    continue
                if isinstance(c, (int, float)):
                    if not math.isfinite(c) or abs(c) > MAX_MAGNITUDE:
                        v.fail(where, "choices", f"numbers must be finite, at most {MAX_MAGNITUDE:.0e} in size, "
                                                 f"got {c!r}")
                    continue
                if not isinstance(c, str) or not PLAIN_TOKEN.fullmatch(c):
                    v.fail(where, "choices", "values must be numbers, true/false or plain tokens "
                                             f"(letters, digits, ./:+=,@%_-), got {c!r}")
            _check_distinct(choices, where, v)
            out.append(ParamSpec(name=name, type=ptype, choices=tuple(choices)))
            continue
        v.only(p, where, ("type", "low", "high", "step", "log"))
        num = int if ptype == "int" else float
        low = v.number(p, where, "low", None, low=-MAX_MAGNITUDE, high=MAX_MAGNITUDE)
        high = v.number(p, where, "high", None, low=-MAX_MAGNITUDE, high=MAX_MAGNITUDE)
        if low is None or high is None:
            v.fail(where, "low" if low is None else "high", f"is required for type = \"{ptype}\"")
        if ptype == "int" and (low != int(low) or high != int(high)):
            v.fail(where, "low", "and high must be whole numbers for type = \"int\"")
        if low > high:
            v.fail(where, "low", f"must not exceed high ({low} > {high})")
        step = v.number(p, where, "step", None, low=0, high=MAX_MAGNITUDE)
        log = v.get(p, where, "log", bool, False)
        if step is not None and step <= 0:
            v.fail(where, "step", "must be positive")
        if ptype == "int" and step is not None and step != int(step):
            v.fail(where, "step", "must be a whole number for type = \"int\"")
        if log and (low <= 0 or step not in (None, 1)):
            v.fail(where, "log", "needs low > 0 and no step")
        if ptype == "float" and step is not None and (high - low) / step >= MAX_FLOAT_STEPS:
            v.fail(where, "step", f"gives about {(high - low) / step:.3g} values; at most {MAX_FLOAT_STEPS} (a larger "
                                  "step, or none for a continuous range)")
        out.append(ParamSpec(name=name, type=ptype, low=num(low), high=num(high),
                             step=None if step is None else num(step), log=log))
    return tuple(out)


def _check_distinct(choices: list[ArgValue], where: str, v: Reader) -> None:
    """Refuse two choices the sampler cannot tell apart: equal values (true and 1, 1 and 1.0 are equal in Python, and
    Optuna stores a categorical choice by the first one equal to it)."""
    seen: dict[ArgValue, ArgValue] = {}
    for c in choices:
        if c in seen:
            first = seen[c]
            same = "" if repr(first) == repr(c) else " (equal values: the sampler would store one as the other)"
            v.fail(where, "choices", f"has duplicate values: {_toml(first)} and {_toml(c)}{same}")
        seen[c] = c


def _toml(value: ArgValue) -> str:
    """A choice as the study file writes it."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def _workload(data: dict[str, Any], v: Reader) -> WorkloadSpec:
    w = v.table(data, "workload")
    where = "workload"
    v.only(w, where, ("prompts", "dataset", "ignore_eos", "top_p", "max_tokens", "temperature", "concurrency",
                      "requests", "window_generations",
                      "warmup", "request_timeout", "stall_timeout", "tolerance", "min_repeats", "max_repeats", "mix",
                      "processes", "client"))
    conc = v.get(w, where, "concurrency", list, [1, 8, 32])
    if not conc or not all(isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= MAX_CONCURRENCY
                           for c in conc):
        v.fail(where, "concurrency", f"must be a non-empty list of positive integers up to {MAX_CONCURRENCY}, "
                                     f"got {conc!r}")
    if len(set(conc)) != len(conc):
        v.fail(where, "concurrency", "has duplicate levels")
    min_rep = v.integer(w, where, "min_repeats", 1, low=1, high=20)
    max_rep = v.integer(w, where, "max_repeats", 3, low=1, high=20)
    if max_rep < min_rep:
        v.fail(where, "max_repeats", f"must be at least min_repeats ({min_rep})")
    if "prompts" in w and "dataset" in w:
        v.fail(where, "dataset", "and prompts are two sources of requests: give one")
    top_p = v.number(w, where, "top_p", None, low=0, high=1)
    if top_p is not None and top_p <= 0:
        v.fail(where, "top_p", "must be above 0 and at most 1")
    return WorkloadSpec(
        prompts=v.get(w, where, "prompts", str, "builtin"),
        dataset=v.get(w, where, "dataset", str, None),
        ignore_eos=v.get(w, where, "ignore_eos", bool, None),
        top_p=top_p,
        max_tokens=v.integer(w, where, "max_tokens", 256, low=2, high=1_000_000),
        temperature=v.number(w, where, "temperature", 0.0, low=0, high=2),
        concurrency=tuple(sorted(conc)),
        requests=v.integer(w, where, "requests", 32, low=1, high=100_000),
        window_generations=v.integer(w, where, "window_generations", 4, low=1, high=1000),
        warmup=v.integer(w, where, "warmup", 2, low=0, high=1000),
        request_timeout=v.number(w, where, "request_timeout", 300.0, low=1, high=86400),
        stall_timeout=v.number(w, where, "stall_timeout", 30.0, low=0.5, high=86400),
        tolerance=v.number(w, where, "tolerance", 0.03, low=0.001, high=1),
        min_repeats=min_rep, max_repeats=max_rep, mix=_mix(w, v, conc),
        processes=v.integer(w, where, "processes", 0, low=0, high=256), client=_client(w, v),
    )


def _client(w: dict[str, Any], v: Reader) -> str:
    return v.choice(w, "workload", "client", CLIENTS, "auto")


#: a mix level: a whole number in ASCII digits (``"²".isdigit()`` is true)
LEVEL = re.compile(r"\A[0-9]+\Z")
#: the largest share a mix level may be given (shares are relative: fractions, percentages or request counts)
MAX_SHARE = 1e12


def _mix(w: dict[str, Any], v: Reader, levels: list[int]) -> dict[int, float]:
    """``mix = { 1 = 0.2, 8 = 0.5, 32 = 0.3 }``: each level's share of the server's time, normalised to sum 1."""
    raw = v.get(w, "workload", "mix", dict, {})
    mix: dict[int, float] = {}
    for key, share in raw.items():
        level = int(key) if LEVEL.fullmatch(key) else None
        if level not in levels:
            v.fail("workload.mix", key, f"must be one of the concurrency levels {sorted(levels)}")
        if (isinstance(share, bool) or not isinstance(share, (int, float)) or not math.isfinite(share)
                or not 0 < share <= MAX_SHARE):
            v.fail("workload.mix", key, f"must be a share above 0 and at most {MAX_SHARE:g} (of the time spent at "
                                        f"that load, relative to the others), got {share!r}")
        if level in mix:
            v.fail("workload.mix", key, f"names level {level} twice")
        mix[level] = float(share)
    total = sum(mix.values())
    return {level: share / total for level, share in sorted(mix.items())}


def _constraints(data: dict[str, Any], v: Reader) -> ConstraintSpec:
    c = v.table(data, "constraints")
    where = "constraints"
    v.only(c, where, ("min_running_requests", "max_ttft_p99_ms", "max_itl_p99_ms", "max_error_rate"))
    return ConstraintSpec(
        min_running_requests=v.integer(c, where, "min_running_requests", None, low=1),
        max_ttft_p99_ms=_milliseconds(c, v, "max_ttft_p99_ms"),
        max_itl_p99_ms=_milliseconds(c, v, "max_itl_p99_ms"),
        max_error_rate=v.number(c, where, "max_error_rate", 0.0, low=0, high=1),
    )


def _milliseconds(c: dict[str, Any], v: Reader, key: str) -> float | None:
    """A latency bound: a positive, finite number of milliseconds (a bound of 0 no request could meet)."""
    value = v.number(c, "constraints", key, None, high=MAX_LATENCY_MS)
    if value is not None and value <= 0:
        v.fail("constraints", key, f"must be a number of milliseconds above 0, got {value!r}")
    return None if value is None else float(value)


#: the largest latency bound, in ms (a day)
MAX_LATENCY_MS = 86_400_000


def _health(data: dict[str, Any], v: Reader) -> HealthSpec:
    h = v.table(data, "health")
    v.only(h, "health", ("interval", "timeout"))
    return HealthSpec(
        interval=v.number(h, "health", "interval", 0.5, low=0.25, high=1.0),
        timeout=v.number(h, "health", "timeout", 900.0, low=1, high=86400),
    )
