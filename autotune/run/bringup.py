"""Bringing a config up on a target: deploy -> ready -> verified. One path for trials, `autotune apply`, the
restore of the original and the deploy of the best config at the end of a study.

Readiness (health.py) fails fast with a named reason; verification reads the running server's own account of its
configuration (``Engine.server_info``) and refuses a server that does not run the requested tuned flags, so a stale
server is never measured or left behind as "the best" (``wrong_args``). That account is read within
VERIFY_SECONDS and up to a size (bounded.py): a server that drips it (``unresponsive``) or sends it without end
(``bad_response``) ends the trial, and a stop request ends the wait at once.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from autotune.bench import bounded
from autotune.redact import MASK
from autotune.engines import ArgValue, Engine, ServerInfo
from autotune.errors import TrialFailure
from autotune.run.health import Ready, wait_ready
from autotune.run.plan import Plan
from autotune.record import TrialRecord
from autotune.studyfile.spec import HealthSpec
from autotune.targets import Deployment, Target

log = logging.getLogger("autotune")

#: seconds the server has to give its account of its configuration (SGLang answers at once; llama.cpp may run one
#: token first)
VERIFY_SECONDS = 30.0


@dataclass(frozen=True)
class Running:
    """A server that came up: its deployment, how long readiness took, and what it reports running (None when
    nothing was to be verified)."""

    deployment: Deployment
    ready: Ready
    info: ServerInfo | None


def bring_up(
    start: Callable[[], Deployment],
    engine: Engine,
    health: HealthSpec,
    headers: Mapping[str, str],
    expect: Mapping[str, ArgValue] | None,
    *,
    should_stop: Callable[[], bool] = lambda: False,
    on_stage: Callable[[str, str], None] = lambda stage, detail: None,
    on_deployed: Callable[[Deployment], None] = lambda deployment: None,
) -> Running:
    """``start()`` the server (a target's deploy or restore), wait until it is ready, then check it runs the tuned
    flags ``expect`` (None: readiness only). ``on_stage(stage, detail)`` hears "deploying", "waiting" (with the
    seconds waited) and "verifying"; ``on_deployed`` gets the deployment as soon as it exists. Raises
    ``TrialFailure`` with the reason of whatever went wrong."""
    on_stage("deploying", "")
    deployment = start()
    on_deployed(deployment)
    on_stage("waiting", "")
    ready = wait_ready(deployment, engine, health.interval, health.timeout, dict(headers), should_stop=should_stop,
                       on_poll=lambda waited: on_stage("waiting", f"{waited:.0f} s"))
    if expect is None:
        return Running(deployment, ready, None)
    on_stage("verifying", "")
    return Running(deployment, ready, verify(deployment.base_url, engine, expect, headers, should_stop))


def verify(base_url: str, engine: Engine, expect: Mapping[str, ArgValue], headers: Mapping[str, str],
           should_stop: Callable[[], bool] = lambda: False) -> ServerInfo:
    """What the server at ``base_url`` reports running; ``TrialFailure("wrong_args")`` if it is not ``expect``."""
    info = server_info(base_url, engine, headers, should_stop)
    wrong = engine.mismatches(expect, info)
    if wrong:
        raise TrialFailure("wrong_args", "; ".join(wrong))
    return info


def server_info(base_url: str, engine: Engine, headers: Mapping[str, str],
                should_stop: Callable[[], bool] = lambda: False) -> ServerInfo:
    """The running server's account of its configuration, read within VERIFY_SECONDS and up to ``bounded.MAX_BODY``
    bytes. Raises ``TrialFailure``: ``wrong_args`` if it gives none, ``bad_response`` past the cap, ``unresponsive``
    past the deadline, ``interrupted`` when ``should_stop()`` says so meanwhile."""
    what = "the server's account of its configuration"
    with bounded.client(base_url, headers, timeout=VERIFY_SECONDS) as client:
        try:
            return bounded.within(VERIFY_SECONDS, lambda: engine.server_info(client), should_stop)
        except bounded.TooLarge as e:
            raise TrialFailure("bad_response", f"{what}: {e}") from None
        except bounded.Overran:
            raise TrialFailure("unresponsive", f"{what} not read within {VERIFY_SECONDS:g} s") from None
        except bounded.Stopped:
            raise TrialFailure("interrupted", f"stop requested while reading {what}") from None
        except (httpx.HTTPError, ValueError) as e:
            raise TrialFailure("wrong_args", f"cannot read the server's configuration: {e}") from None


def deploy_trial(plan: Plan, target: Target, rec: TrialRecord, log_path: Path) -> Running:
    """Deploy a measured trial's config again on ``target`` (``trial_argv``) and check it is healthy and runs its
    tuned flags."""
    config = rec.config or {}
    expect = {n: config[n] for n in plan.space.names if n in config}
    argv = trial_argv(plan, target, rec)
    return bring_up(lambda: target.deploy(argv, plan.spec.engine.env, log_path), plan.engine,
                    plan.spec.health, plan.headers, expect)


def trial_argv(plan: Plan, target: Target, rec: TrialRecord) -> list[str]:
    """The server command of a measured trial's effective config on the target in force: on its port (never the port
    of the target the trial ran on, nor the port the study file named then), the secrets the record masks taken from
    the study file, an adaptive server's schedule placed on it again, with the study file's server command."""
    fixed = plan.space.fixed  # the study's args and the target's port
    args = {k: fixed.get(k, v) if v == MASK else v for k, v in (rec.config or {}).items()}
    args[plan.engine.port_flag] = fixed[plan.engine.port_flag]
    rules, schedule = plan.engine.adaptive, rec.schedule
    if rules is not None and schedule and rules.file_flag in args:
        name = str(schedule["file"])
        args[rules.file_flag] = target.place_file(name, json.dumps(schedule["document"], indent=1).encode(),
                                                  plan.spec.directory / name)
    return plan.engine.render(plan.spec.engine.command, args)


def restore_original(plan: Plan, target: Target) -> None:
    """Put back what ran before tuning (the backed-up unit, or the study's fixed args) and wait until it is healthy.
    Raises ``TrialFailure`` when it does not come up."""
    argv = plan.engine.render(plan.spec.engine.command, plan.baseline.args)
    deployment = target.restore(argv, plan.spec.engine.env, plan.logs_dir / "restore.log")
    if deployment is not None:
        running = bring_up(lambda: deployment, plan.engine, plan.spec.health, plan.headers, None)
        log.info("restored the original config: healthy after %.1f s", running.ready.seconds)
