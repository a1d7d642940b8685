"""The target's own engine asked about a config before its first launch.

A host may run another release of the engine, or another GPU, than the engine's rules (engines/) assume. Where the
engine can resolve its arguments without starting (``Engine.host``), the tuner asks the engine installed on the
target, with the python its server command runs (``Target.run_engine_program``, programs/engine_resolve.py),
before a config's first launch: seconds instead of a launch. A config it rejects is pruned with its own message
(``HostRejected``) and costs no launch; one it rewrites runs, and is recorded, as rewritten, with only the engine's own
values taken from the answer (hostrules.py: never a flag autotune or the target owns, never a value the study's rules
would refuse). Every answer is kept in the study (``record.study.host_answer``) with the host that gave it (its
engine's version, its GPUs, the served model): no worker and no resumed run on the same host asks about the same
config again, and an answer another host gave expires (as all do with ``run --forget-host-answers``).

At preflight the tuner asks once about the baseline, and learns the host's GPU and the served model's architecture
with it (nvidia-smi and the model's config.json there; the emulator's profile): the ``Platform`` the engine's rules
take from then on. A host that cannot answer (no engine on that python, an older release without the call, not
the engine's launcher) is said so once, and the engine's rules decide alone for the rest of the run.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import optuna

from autotune import record
from autotune.engines import Args, Engine
from autotune.engines.base import Platform
from autotune.errors import HostRejected, TrialFailure
from autotune.run.hostrules import admissible
from autotune.redact import MASK, is_secret, mask, mask_mapping
from autotune.studyfile.spec import ParamSpec
from autotune.targets.base import Target

log = logging.getLogger("autotune")

#: the program that asks (targets/programs/)
PROGRAM = "engine_resolve"
#: seconds one answer may take (importing SGLang alone takes several on a GPU host)
TIMEOUT = 180.0


class HostResolver:
    """Asks the engine on ``target`` (started by ``command`` with the target's environment ``env``); ``params``: the
    study's [space], whose types a rewritten value of a tuned flag must have."""

    def __init__(self, engine: Engine, target: Target, command: list[str], env: dict[str, str],
                 params: Sequence[ParamSpec] = (), should_stop: Callable[[], bool] = lambda: False) -> None:
        """``should_stop``: a question is given up at once (``TrialFailure("interrupted")``) when it says so."""
        self.should_stop = should_stop
        self.engine = engine
        self.target = target
        self.command = list(command)
        self.env = dict(env)
        self.params = tuple(params)
        #: False once the host was found unable to answer (said once); None before the first question
        self.available: bool | None = None if engine.host is not None else False
        #: the host's GPUs, as it names them (after ``probe``)
        self.gpus: list[str] = []
        #: the host as ``probe`` found it (its engine's version, GPUs, served model), named by every answer kept; an
        #: answer kept from another host expires. None: the host did not say (then every kept answer stands)
        self.host: dict[str, Any] | None = None
        self._answers: dict[str, dict[str, Any]] = {}
        self._said: set[str] = set()

    def probe(self, args: Args, key: str) -> Platform | None:
        """Ask about ``args`` (the baseline, config key ``key``) and read the host's GPU and served model: the
        platform for the engine's rules, None when neither is known. Says once when the host cannot answer."""
        if self.engine.host is None:
            return None
        answer = self._ask("probe", args)
        self.gpus = [str(g) for g in answer.get("gpus") or []]
        self.host = _identity(answer)
        platform = Platform(gpu=self.gpus[0] if self.gpus else "", compute_capability=_capability(answer),
                            architecture=str(answer.get("architecture") or ""))
        where = f"target {self.target.name}"
        if self.gpus:
            log.info("%s: %d x %s (compute capability %s)%s%s", where, len(self.gpus), self.gpus[0],
                     ".".join(map(str, platform.capability or ())) or "unknown",
                     f", serving {platform.architecture}" if platform.architecture else "",
                     f", {answer['version']}" if answer.get("version") else "")
        else:
            log.info("%s: no GPU named by the host (%s)", where, answer.get("platform_error") or "no nvidia-smi")
        if answer.get("answer") == "rejected":
            log.warning("%s: the engine there refuses the study's baseline: %s", where,
                        mask(str(answer.get("message", ""))))
        self._take(answer, args, key, None)
        return platform if platform.gpu or platform.architecture else None

    def effective(self, args: Args, key: str, study: optuna.Study | None) -> Args:
        """``args`` (config key ``key``) as the engine on the target will run them; raises ``HostRejected`` with
        its message for a config it refuses. The answer kept in ``study`` when it was asked before (by any worker,
        in any run); ``args`` unchanged when it cannot answer."""
        stored = self._answers.get(key) or (self._kept(study, key) if study is not None else None)
        if stored is None:
            if self.available is False:
                return dict(args)
            stored = self._take(self._ask("resolve", args), args, key, study)
            if stored is None:
                return dict(args)
        self._answers[key] = stored
        if stored["answer"] == "rejected":
            raise HostRejected(stored["message"])
        return {**args, **stored.get("changes", {})}

    # -- helpers -----------------------------------------------------------------------------------------------

    def _kept(self, study: optuna.Study, key: str) -> dict[str, Any] | None:
        """The answer kept in ``study`` for config ``key``, unless another host gave it (said once)."""
        stored = record.study.host_answer(study, key)
        if stored is None or self.host is None or stored.get("host") == self.host:
            return stored
        self._once("expired", "target %s: the answers kept in the study were given by %s; this host is %s: each "
                   "config is asked again", self.target.name, _described(stored.get("host")), _described(self.host))
        return None

    def _once(self, what: str, message: str, *args: object) -> None:
        if what not in self._said:
            self._said.add(what)
            log.warning(message, *args)

    def _take(self, answer: dict[str, Any], args: Args, key: str, study: optuna.Study | None) -> dict[str, Any] | None:
        """The answer to keep (None when the host could not answer: said once, and never asked again)."""
        if answer.get("answer") == "rejected":
            stored: dict[str, Any] = {"answer": "rejected", "message": mask(str(answer.get("message", "")))}
        elif answer.get("answer") == "resolved" and isinstance(answer.get("values"), dict):
            assert self.engine.host is not None
            runs = self.engine.host.effective(args, answer["values"])
            kept, refused = admissible(self.engine, self.params, args,
                                       {k: v for k, v in runs.items() if k not in args or args[k] != v})
            for name, why in refused.items():
                shown = MASK if is_secret(name) else mask(repr(runs[name]))[:200]
                self._once(f"refused {name}", "target %s: the engine there answers %s=%s: not taken (%s)",
                           self.target.name, name, shown, why)
            stored = {"answer": "resolved", "changes": mask_mapping(kept)}
        else:
            self._unavailable(str(answer.get("reason") or "no answer"))
            return None
        self.available = True
        stored["host"] = self.host
        self._answers[key] = stored
        if study is not None:
            record.study.set_host_answer(study, key, stored)
        return stored

    def _unavailable(self, reason: str) -> None:
        if self.available is not False:
            log.warning("target %s: the engine there cannot be asked about a config before its launch (%s); "
                        "the tuner's own rules decide", self.target.name, mask(reason))
        self.available = False

    def _ask(self, op: str, args: Args) -> dict[str, Any]:
        """The program's answer (``{"answer": "unavailable", "reason": ...}`` when there is none); raises
        ``TrialFailure`` (ssh_lost) when the target cannot be reached, like a launch would, and when a stop is
        requested (interrupted); an answer past the output cap is none."""
        assert self.engine.host is not None
        question = self.engine.host.question(self.command, self.engine.render([], args))
        if isinstance(question, str):
            return {"answer": "unavailable", "reason": question}
        request = {**question.request, "op": op, "env": self.env}
        try:
            done = self.target.run_engine_program(question.launcher, PROGRAM, json.dumps(request).encode(), TIMEOUT,
                                                  self.should_stop)
        except TrialFailure as e:
            if e.reason in ("ssh_lost", "interrupted"):
                raise
            return {"answer": "unavailable", "reason": e.detail}
        lines = done.stdout.strip().splitlines()
        try:
            answer = json.loads(lines[-1])
        except (ValueError, IndexError):
            answer = None
        if not isinstance(answer, dict) or "answer" not in answer:
            return {"answer": "unavailable", "reason": done.detail().removeprefix("autotune: ")}
        return answer


def _capability(answer: dict[str, Any]) -> tuple[int, int] | None:
    """nvidia-smi's compute_cap ("9.0") as (9, 0); None when the host did not say."""
    try:
        major, minor = str(answer.get("capability") or "").split(".")
        return int(major), int(minor)
    except ValueError:
        return None


def _identity(answer: dict[str, Any]) -> dict[str, Any] | None:
    """The host as a probe's answer names it: the engine's version, the GPUs, the served model's architecture and
    config (a digest); None when it named none of them."""
    host = {"version": str(answer.get("version") or ""), "gpus": [str(g) for g in answer.get("gpus") or []],
            "architecture": str(answer.get("architecture") or ""), "model": str(answer.get("model") or "")}
    return host if any(host.values()) else None


def _described(host: Any) -> str:
    """A host identity in a few words, for the log."""
    if not isinstance(host, dict):
        return "a host not named with them (an older autotune kept them)"
    gpus = host.get("gpus") or []
    return (f"engine {host.get('version') or 'of unknown version'} on {gpus[0] if gpus else 'no named GPU'}"
            f"{', serving ' + host['architecture'] if host.get('architecture') else ''}"
            f"{' (model config ' + host['model'] + ')' if host.get('model') else ''}")
