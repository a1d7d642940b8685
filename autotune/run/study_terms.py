"""What makes a resumed study the same study: the traffic it measures and the space it searches, recorded when it is
created (record.study) and compared at every resume.

A study's values compare configs measured on the same requests at the same loads, relative figures divided by a
baseline measured on them too. Resumed under other traffic (another dataset, an edited one, other lengths, sampling or
loads) it would mix two worlds: refused before anything is written, as another objective is, with the way out (a new
name). The traffic is the requests' content (a digest of what is sent: a dataset's, a prompts file's, the built-in
set's, whatever its file is called now) and the workload settings that shape them.

The space may change where Optuna can follow: a range widened or narrowed, a flag added or dropped; the search then
counts its idle trials from the change (budget.exhausted), so a widened space is searched. Optuna keeps a categorical's
choices, a parameter's kind and its log scale for the life of a study: changing those is refused, with the way out.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from autotune.bench.traffic import TrafficRequest
from autotune.errors import UserError
from autotune.redact import redact_url
from autotune.studyfile.spec import ParamSpec, StudySpec

#: the workload settings that shape what is sent and at which loads (the rest only decide how long a level runs)
SHAPING = ("max_tokens", "temperature", "top_p", "ignore_eos", "concurrency", "mix")


def traffic(spec: StudySpec, requests: Sequence[TrafficRequest]) -> dict[str, Any]:
    """The study's traffic as recorded: the requests' digest and count, where they came from, and the settings
    that shape them."""
    w = spec.workload
    sent = [[r.messages, r.prompt, r.max_tokens, r.temperature, r.top_p] for r in requests]
    digest = hashlib.sha256(json.dumps(sent, ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()
    return {"requests": {"digest": digest[:16], "count": len(requests),
                         "source": w.dataset or (w.prompts if w.prompts == "builtin" else f"prompts {w.prompts}")},
            "max_tokens": w.max_tokens, "temperature": w.temperature, "top_p": w.top_p,
            "ignore_eos": w.forced_length, "concurrency": list(w.concurrency),
            "mix": {str(k): v for k, v in sorted(w.mix.items())}}


def space(params: Sequence[ParamSpec]) -> dict[str, dict[str, Any]]:
    """The study's [space] as recorded, by flag."""
    return {p.name: {"type": p.type, "low": p.low, "high": p.high, "step": p.step, "log": p.log,
                     "choices": list(p.choices) if p.choices is not None else None} for p in params}


def refuse_other_traffic(name: str, url: str, then: dict[str, Any] | None, now: dict[str, Any]) -> None:
    """Refuse a resume of study ``name`` under traffic ``now`` when it was created under ``then`` (None: an older
    autotune recorded none; it is taken as the same)."""
    if then is None:
        return
    for key in ("requests", *SHAPING):
        was, is_ = then.get(key), now.get(key)
        if key == "requests" and isinstance(was, dict) and (was.get("digest"), was.get("count")) == (
                is_["digest"], is_["count"]):
            continue
        if key != "requests" and was == is_:
            continue
        raise UserError(f"study {name!r} in {redact_url(url)} was created with other traffic: {_said(key, was)}, the "
                        f"study file now sends {_said(key, is_)}; its measurements and baseline are of that traffic: "
                        "put it back, or give the study a new name (--warm-start "
                        f"{name} measures its best configs first)")


def space_change(name: str, url: str, then: dict[str, Any] | None, now: dict[str, Any]) -> str | None:
    """How the space changed since ``then`` (None: it did not, or an older autotune recorded none); refuses, with
    the way out, a change Optuna cannot follow within one study."""
    if then is None or then == now:
        return None
    changes = []
    for flag in sorted(set(then) | set(now)):
        was, is_ = then.get(flag), now.get(flag)
        if was == is_:
            continue
        if was is None or is_ is None:
            changes.append(f"{flag} {'added' if was is None else 'dropped'}")
            continue
        for key, what in (("type", "its type"), ("log", "its log scale"), ("choices", "its choices")):
            if was.get(key) != is_.get(key):
                raise UserError(f"study {name!r} in {redact_url(url)} was created with [space.{flag}] {key} = "
                                f"{_toml(was.get(key))}, the study file now says {_toml(is_.get(key))}: a study keeps "
                                f"{what} for its life (Optuna's rule); put it back, or give the study a new name "
                                f"(--warm-start {name} measures its best configs first)")
        changes.append(f"{flag} {_range(was)} -> {_range(is_)}")
    return ", ".join(changes)


def _said(key: str, value: Any) -> str:
    if key == "requests" and isinstance(value, dict):
        return f"{value.get('count')} requests of {value.get('source')} (digest {value.get('digest')})"
    return f"{key} = {_toml(value)}"


def _range(p: dict[str, Any]) -> str:
    step = f" step {p['step']}" if p.get("step") else ""
    return f"{p.get('low')}..{p.get('high')}{step}"


def _toml(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, bool) else str(value).lower()
