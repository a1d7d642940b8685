"""What a study will run, worked out offline (`autotune validate`, and the first step of every command that deploys
or measures): the engine, the target, the space and its baseline, the prompts, the starting points. Nothing here
connects anywhere or writes anything; every problem is a ``UserError``."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from autotune.bench.traffic import TrafficRequest, raw
from autotune.bench.workload import load_prompts, load_traffic
from autotune.engines import ArgValue, Engine, get_engine
from autotune.errors import InvalidConfig, UserError
from autotune.redact import is_secret
from autotune.search.sampling import check_sampler, initial_design, startup_launches
from autotune.search.settings import SearchSettings
from autotune.studyfile.space import Candidate, Space
from autotune.studyfile.spec import StudySpec
from autotune.targets import TargetSpec
from autotune.bench.workload_view import check_context


@dataclass(frozen=True)
class Plan:
    spec: StudySpec
    engine: Engine
    target: TargetSpec
    space: Space
    baseline: Candidate
    #: the requests the study sends (a raw prompt of ``[workload] prompts`` has no length of its own)
    prompts: list[TrafficRequest]
    #: distinct effective configs in the space (a lower bound when ``at_least``)
    valid_configs: int
    at_least: bool
    #: the engine's starting points for the space (``opening``: the ones a new study measures)
    starting_points: list[dict[str, ArgValue]]
    budget: int
    #: the tuner's own search (a bench may run it with other settings)
    search: SearchSettings = field(default_factory=SearchSettings)

    @property
    def opening(self) -> list[dict[str, ArgValue]]:
        """The starting points a new study measures after the baseline: the first ones, as many as the search's
        settings say, or the ones they pick by their place in the engine's list."""
        chosen = self.search.starting_points
        if isinstance(chosen, tuple):
            points = [self.starting_points[i] for i in chosen if i < len(self.starting_points)]
        else:
            points = self.starting_points[:chosen]
        return points[:max(0, self.budget - 1)]

    @property
    def startup(self) -> int:
        """Launches before the model-based samplers and the local search take over."""
        return startup_launches(self.spec)

    @property
    def headers(self) -> dict[str, str]:
        """What every request to the server needs (an API key among the fixed args)."""
        return self.engine.auth_headers(self.space.fixed)

    @property
    def logs_dir(self) -> Path:
        """Local server logs of every start: NAME-logs/ beside the study file."""
        return self.spec.directory / f"{self.spec.name}-logs"


def make_plan(spec: StudySpec, target: str | None = None, launches: int | None = None) -> Plan:
    """Check everything that can be checked offline for ``target`` (--target; may be left out when the study has
    one target) and a budget of ``launches`` (default: the study file's); raises ``UserError``."""
    if spec.missing:
        raise UserError(f"{spec.path}: {spec.missing[0]}")
    engine = get_engine(spec.engine.kind)
    target_spec = replace(spec.target(target), engine=engine.kind)
    port = spec.engine.args.get(engine.port_flag)
    if port is not None and port != target_spec.server_port:
        raise UserError(f"{spec.path}: [engine.args] {engine.port_flag} = {port} but the target's server_port is "
                        f"{target_spec.server_port}; set one of them only")
    _refuse_owned(spec, engine)
    check_sampler(spec)
    space = Space(spec, engine, target_spec.server_port)
    valid, at_least = space.check()
    try:
        baseline = space.baseline()
    except InvalidConfig as e:
        raise UserError(f"{spec.path}: [engine.args] the baseline (the fixed args) is invalid: {e}") from None
    budget = launches or spec.launches
    requests = requests_of(spec)
    check_context(spec, engine, baseline.args, requests)
    return Plan(spec=spec, engine=engine, target=target_spec, space=space, baseline=baseline,
                prompts=requests, valid_configs=valid, at_least=at_least,
                starting_points=initial_design(spec, space), budget=budget)


def _refuse_owned(spec: StudySpec, engine: Engine) -> None:
    """A flag the target or autotune sets (the port, the API key, the model...) is never tuned: a trial that moved it
    would time out where autotune waits, and the sampler would learn a false failure."""
    for p in spec.space:
        why = engine.owner_of(p.name) or ("a secret, given to the server by autotune" if is_secret(p.name) else None)
        if why is not None:
            raise UserError(f"{spec.path}: [space.{p.name}]: {p.name} is {why}, not a flag to tune; set it in "
                            "[engine.args] or the target's table")


def requests_of(spec: StudySpec) -> list[TrafficRequest]:
    """The study's requests: its dataset's, or its prompts file's raw prompts."""
    w = spec.workload
    if w.dataset is not None:
        return load_traffic(w.dataset, spec.directory)
    return [raw(p) for p in load_prompts(w.prompts, spec.directory)]
