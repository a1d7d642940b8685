"""The geometry of a space for the local search: a config's neighbours (one tuned flag moved one stride along its
values) and its coordinates for the local model (each flag's place among the values it may take there).

A flag whose valid range depends on others (draft tokens on steps and topk) moves inside that range and keeps its
place in it when another flag's move changes the range: widening a chain's tree gives a tree half full, not the
chain's old draft count.
"""
from __future__ import annotations

import functools
import math

from autotune.engines import ArgValue
from autotune.errors import InvalidConfig
from autotune.studyfile.space import Candidate, Space, values_inside
from autotune.studyfile.spec import ParamSpec


def moves(space: Space, params: dict[str, ArgValue], measured: set[str],
          stride: float) -> list[tuple[dict[str, ArgValue], str]]:
    """The unmeasured configs one stride from ``params`` in one flag, with their keys."""
    options: list[tuple[dict[str, ArgValue], str]] = []
    for p in space.params:
        if p.name not in params:
            continue
        for value in _adjacent(space, p, params, stride):
            moved = _refit(space, params, {**params, p.name: value})
            if not all(q.contains(moved[q.name]) for q in space.params if q.name not in space.dependent):
                continue  # a value the sampler could not suggest (a chain's forced draft count, say)
            try:
                key = space.candidate(moved).key
            except InvalidConfig:
                continue
            if key not in measured and key not in {k for _, k in options}:
                options.append((moved, key))
    return options


def lower(space: Space, params: dict[str, ArgValue], measured: set[str],
          stride: float = 1 / 8) -> list[tuple[dict[str, ArgValue], str]]:
    """The unmeasured configs one stride below ``params`` in one of the flags the engine's memory need grows with,
    in the engine's order (``Engine.memory_flags``: SGLang lowers draft tokens first, then steps)."""
    try:
        args = space.candidate(params).args
    except InvalidConfig:
        return []
    options: list[tuple[dict[str, ArgValue], str]] = []
    for name in space.engine.memory_flags(args):
        p = next((q for q in space.params if q.name == name), None)
        if p is None or name not in params:
            continue
        values = _values(space, p, params)
        here = _index(values, params[name])
        if here is None:
            continue
        below = here - max(1, round(len(values) * stride))
        if below < 0:
            below = 0 if here > 0 else None
        if below is None:
            continue
        moved = _refit(space, params, {**params, name: values[below]})
        try:
            key = space.candidate(moved).key
        except InvalidConfig:
            continue
        if key not in measured and key not in {k for _, k in options}:
            options.append((moved, key))
    return options


@functools.lru_cache(maxsize=16)
def valid_configs(space: Space) -> tuple[tuple[dict[str, ArgValue], Candidate], ...]:
    """Every distinct config of the space the engine runs: its tuned flags' effective values and its candidate.
    Worked out once per space (a few thousand resolutions); () for a space too large to walk (``Space.walkable``:
    a topk range may hold a billion values)."""
    if not space.walkable:
        return ()
    out = []
    for candidate in space.candidates():
        params = candidate.tuned(space.names)
        if all(p.contains(params[p.name]) for p in space.params if p.name in params):
            out.append((params, candidate))
    return tuple(out)


def places(space: Space, params: dict[str, ArgValue]) -> tuple[float, ...]:
    """A config's coordinates for the local model: each tuned flag's place among the values it may take there."""
    out = []
    for p in space.params:
        values = _values(space, p, params)
        here = _index(values, params.get(p.name))
        out.append(0.5 if here is None or len(values) < 2 else here / (len(values) - 1))
    return tuple(out)


def spread(space: Space, params: dict[str, ArgValue], log: bool = True,
           dependent_only: bool = False) -> tuple[float, ...]:
    """A config's coordinates for the whole-space model: each tuned flag's value placed over its whole range as
    written (on a log scale with ``log``, for numbers above zero), not inside the range the other flags leave it,
    so that the same draft count sits at the same coordinate in every tree; with ``dependent_only``, only the
    flags whose range depends on others are placed so, the rest by their place among their values."""
    out: list[float] = []
    inside = places(space, params) if dependent_only else ()
    for i, p in enumerate(space.params):
        if dependent_only and p.name not in space.dependent:
            out.append(inside[i])
            continue
        values = _values_as_written(p)
        value = params.get(p.name)
        if value is None or len(values) < 2 or not _ordered(values):
            here = _index(values, value) if value is not None else None
            out.append(0.5 if here is None or len(values) < 2 else here / (len(values) - 1))
            continue
        lo, hi, x = _num(values[0]), _num(values[-1]), _num(value)
        if log and lo > 0:
            lo, hi, x = math.log(lo), math.log(hi), math.log(max(x, 1e-12))
        out.append(0.5 if hi <= lo else min(1.0, max(0.0, (x - lo) / (hi - lo))))
    return tuple(out)


def _values_as_written(p: ParamSpec) -> list[ArgValue]:
    if p.type == "float" and not p.step:
        return [float(p.low), float(p.high)]  # type: ignore[arg-type]
    values = p.values()
    if p.type == "categorical" and _ordered(values):
        values = sorted(values, key=_num)
    return values


def unordered(space: Space) -> list[bool]:
    """Per tuned flag: whether its values have no order (strings, booleans), so that places say only same or not."""
    return [not _ordered(p.values()) if p.type == "categorical" else False for p in space.params]


def _refit(space: Space, before: dict[str, ArgValue], moved: dict[str, ArgValue]) -> dict[str, ArgValue]:
    """``moved`` with each dependent flag whose valid range the move changed kept at the same place in its range (a
    flag that had no choice before, like draft tokens on a chain, goes halfway into the new range, as the engine's
    starting points place it)."""
    out = dict(moved)
    for name in space.dependent:
        if name not in before or name in (set(moved) - set(before)):
            continue
        p = next(q for q in space.params if q.name == name)
        old, new = _values(space, p, before), _values(space, p, moved)
        if old == new or not new:
            continue
        place = old.index(before[name]) / (len(old) - 1) if before[name] in old and len(old) > 1 else 0.5
        out[name] = new[round(place * (len(new) - 1))]
    return out


def _adjacent(space: Space, p: ParamSpec, params: dict[str, ArgValue], stride: float) -> list[ArgValue]:
    """The values one stride below and above ``params[p.name]`` among the values ``p`` may take there."""
    values = _values(space, p, params)
    current = params[p.name]
    here = _index(values, current)
    if here is None:
        return []
    step = max(1, round(len(values) * stride))
    return [values[i] for i in (here - step, here + step) if 0 <= i < len(values) and values[i] != current]


def _index(values: list[ArgValue], current: ArgValue | None) -> int | None:
    """Where ``current`` lies among ``values`` (the nearest of ordered ones); None if it is not there."""
    if not values or current is None:
        return None
    if isinstance(values, range):  # by arithmetic: a range may hold billions of values
        return min(len(values) - 1, max(0, round((_num(current) - values.start) / values.step)))
    if _ordered(values):
        return min(range(len(values)), key=lambda i: abs(_num(values[i]) - _num(current)))
    return next((i for i, v in enumerate(values) if v == current), None)


def _values(space: Space, p: ParamSpec, params: dict[str, ArgValue]) -> list[ArgValue]:
    """The values of ``p`` in order; a dependent flag's only those the engine accepts given the others."""
    if p.type == "float" and not p.step:
        lo, hi = float(p.low), float(p.high)  # type: ignore[arg-type]
        return [lo + (hi - lo) * i / 16 for i in range(17)]
    if p.name in space.dependent:
        valid = space.engine.valid_range(p.name, {**space.fixed, **params})
        if valid.irrelevant:
            return []
        return values_inside(p, valid) or []
    values = p.values()
    if p.type == "categorical" and _ordered(values):
        values = sorted(values, key=_num)
    return values


def _ordered(values: list[ArgValue]) -> bool:
    """Numbers (a categorical of numbers is ordered too); strings and booleans are not."""
    if isinstance(values, range):
        return True  # never walked: a range may hold billions of values
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _num(value: ArgValue) -> float:
    return float(value)  # type: ignore[arg-type]
