"""The `autotune` command line: click commands that parse options, call one function and print."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from autotune.errors import UserError

if TYPE_CHECKING:
    import optuna

    from autotune.run.plan import Plan
    from autotune.studyfile.spec import StudySpec

STUDY = click.option("--study", "study_name", required=True, metavar="NAME",
                     help="A study name under ./studies, or a path to a study .toml file.")
def _storage(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--storage gets the study file's storage checks (a relative SQLite path is relative to here)."""
    if value is None:
        return None
    from autotune.redact import remember_url_password
    from autotune.studyfile.spec import resolve_storage

    remember_url_password(value)
    try:
        return resolve_storage(value, Path.cwd())
    except ValueError as e:
        raise click.BadParameter(str(e), ctx, param) from None


STORAGE = click.option("--storage", default=None, metavar="URL", callback=_storage,
                       help="Override the study file's storage URL.")
TARGET = click.option("--target", "target_name", default=None, metavar="NAME",
                      help="Which [targets.NAME] of the study to use (when it has several).")
class Seconds(click.ParamType):
    """A finite number of seconds, at least 0 (click's FloatRange lets nan and inf through)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds < 0:
            self.fail(f"{value!r} is not a finite number of seconds, at least 0", param, ctx)
        return seconds


SECONDS = Seconds()
JSON = click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
PROCESSES = click.option("--processes", type=click.IntRange(min=0, max=256), default=None, metavar="N",
                         help="The load generator's processes per concurrency level ([workload] processes; "
                              "0: what its machine can spare).")


def _with_processes(spec: StudySpec, processes: int | None) -> StudySpec:
    """``spec`` with ``--processes`` in place of its [workload] processes."""
    if processes is None:
        return spec
    return dataclasses.replace(spec, workload=dataclasses.replace(spec.workload, processes=processes))


def _plan(study_name: str, target: str | None = None, launches: int | None = None,
          processes: int | None = None) -> Plan:
    """The study file checked offline for one target (see autotune.run.plan)."""
    from autotune.run.plan import make_plan
    from autotune.studyfile.spec import read_study_file

    return make_plan(_with_processes(read_study_file(study_name), processes), target, launches)


def _study(study_name: str, storage: str | None) -> tuple[StudySpec, optuna.Study]:
    """The study file and the study as stored, for commands that only read it."""
    from autotune.record.storage import load_existing_study
    from autotune.studyfile.spec import read_study_file

    spec = read_study_file(study_name)
    return spec, load_existing_study(spec.name, storage or spec.storage)


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


@click.group()
@click.version_option(package_name="autotune")
def cli() -> None:
    """Bayesian autotuner for LLM serving engines."""


@cli.command()
@STUDY
@click.option("--launches", "--trials", "launches", type=click.IntRange(min=1), default=None,
              help="Budget: servers started, counted across restarts (a reused or rejected config costs none).")
@click.option("--timeout", type=SECONDS, default=None, metavar="SECONDS",
              help="Start no trial after this many seconds.")
@click.option("--until", default=None, metavar="HH:MM", help="Start no trial after this local time.")
@STORAGE
@TARGET
@click.option("--all-targets", is_flag=True, help="Start one worker per [targets.NAME] of the study.")
@click.option("--no-restore", is_flag=True, help="Leave the target as the last trial left it.")
@click.option("--warm-start", "warm_start", default=None, metavar="OLD",
              help="A new study measures the best configs of study OLD (a name or file) first; no values are copied.")
@PROCESSES
@click.option("--forget-host-answers", is_flag=True,
              help="Ask the engine on the target about every config again (a host's answers are kept in the study).")
def run(study_name: str, launches: int | None, timeout: float | None, until: str | None, storage: str | None,
        target_name: str | None, all_targets: bool, no_restore: bool, warm_start: str | None,
        processes: int | None, forget_host_answers: bool) -> None:
    """Create or resume the study and tune until its budget or deadline."""
    from autotune.run.plan import make_plan
    from autotune.studyfile.spec import read_study_file
    from autotune.run.tuner import RunOptions, Tuner
    from autotune.run.workers import run_all_targets

    options = RunOptions(launches=launches, timeout=timeout, until=until, storage=storage, target=target_name,
                         restore=not no_restore, warm_start=warm_start, processes=processes,
                         forget_host_answers=forget_host_answers)
    spec = _with_processes(read_study_file(study_name), processes)
    if not all_targets:
        summary = Tuner(make_plan(spec, target_name, launches), options).run()
        _next_steps(study_name)
        if summary.exit_status:
            sys.exit(summary.exit_status)
        return
    if target_name is not None:
        raise UserError("--all-targets and --target exclude each other")
    for name in spec.targets:  # every worker's input is checked before any starts
        make_plan(spec, name, launches)
    status = run_all_targets(spec, options.flags())
    _next_steps(study_name)
    sys.exit(status)


def _next_steps(study_name: str) -> None:
    """What to look at once a run ends."""
    name = shlex.quote(study_name)
    click.echo(f"next: autotune best --study {name}                the best config and its command line\n"
               f"      autotune report --study {name} --out report  trials.csv, summary.md and plots\n"
               f"      autotune dashboard --study {name}           every trial in optuna-dashboard")


@cli.command()
@STUDY
def validate(study_name: str) -> None:
    """Check the study file and its space offline; deploys nothing."""
    from autotune.run.plan import make_plan
    from autotune.studyfile.spec import read_study_file

    spec = read_study_file(study_name)
    plans = [make_plan(spec, name) for name in spec.targets]
    plan = plans[0]
    click.echo(f"{spec.path}: ok: {len(spec.space)} parameters, "
               f"{'at least ' if plan.at_least else ''}{plan.valid_configs} distinct valid configs, "
               f"a budget of {spec.launches} launches, sampler {spec.sampler}, objective {spec.objective}, "
               f"targets {', '.join(f'{t.name} ({t.kind})' for t in spec.targets.values())}, "
               f"{len(plan.prompts)} {'requests' if spec.workload.dataset else 'prompts'}")
    for params in plan.opening:
        click.echo(f"  starting point: {plan.engine.describe(params)}")


@cli.command()
@STUDY
@JSON
def workload(study_name: str, as_json: bool) -> None:
    """What the study will send, before any launch: requests, lengths, sampling, categories, each level's share."""
    from autotune.run.plan import make_plan
    from autotune.studyfile.spec import read_study_file
    from autotune.bench.workload_view import describe, text

    spec = read_study_file(study_name)
    plan = make_plan(spec, next(iter(spec.targets)))
    view = describe(spec, plan.prompts)
    if as_json:
        _print_json(view)
    else:
        click.echo(text(view))


@cli.command()
@STUDY
@STORAGE
@JSON
def status(study_name: str, storage: str | None, as_json: bool) -> None:
    """Every trial: number, state, whether it launched a server, params, metrics, failure reason."""
    from autotune import record
    from autotune.results import tally

    spec, study = _study(study_name, storage)
    trials = study.get_trials(deepcopy=False)
    recs = record.records(trials)
    launches = len(tally.launches(trials))
    if as_json:
        _print_json({"study": spec.name, "budget": spec.launches, "launches": launches,
                     "trials": [r.as_row() for r in recs]})
        return
    for r in recs:
        params = " ".join(f"{k}={v}" for k, v in r.params.items()) or ("(its schedule)" if r.adaptive
                                                                        else "(fixed args)")
        how = (f"reuses trial {r.reused_from}" if r.reused_from is not None else
               f"{r.role}, from {r.origin}" if r.origin else r.role or "")
        reason = f"{r.reason}: {(r.detail or '')[:160]}" if r.reason == "host_rejected" else r.reason or ""
        rewrote = ("the target ran " + " ".join(f"{k}={v[1]} (not {v[0]})" for k, v in r.host_rewrote.items())
                   if r.host_rewrote else "")
        tail = ", ".join(x for x in (r.figures_text(), reason, rewrote, how, f"target {r.target}" if r.target else "")
                         if x)
        click.echo(f"{r.number:>4} {r.state.name:<8} {'launch' if r.launched else '-':<6} {r.values_text():>10}  "
                   f"{params}  {tail}")
    click.echo(f"{launches} of {spec.launches} launches in {len(recs)} trials")


@cli.command()
@STUDY
@STORAGE
@click.option("--format", "fmt", type=click.Choice(["args", "unit", "json", "sglang-adaptive"]), default=None,
              help="args: the shell-quoted server command line; unit: a systemd service unit running it; "
                   "json: one JSON document (same as --json); sglang-adaptive: SGLang's adaptive speculative "
                   "schedule from the chains' measurements at each load (the file on stdout, how it was chosen "
                   "and how to deploy it on stderr).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (--format json).")
@click.option("--per-concurrency", is_flag=True,
              help="The best config at each measured concurrency level (from the trials already run).")
def best(study_name: str, storage: str | None, fmt: str | None, as_json: bool, per_concurrency: bool) -> None:
    """The best feasible trial: params, metrics and the full server command line."""
    from autotune.results import best as forms

    if fmt == "sglang-adaptive" and (as_json or per_concurrency):
        raise click.UsageError("--format sglang-adaptive prints the schedule file: no --json or --per-concurrency")
    spec, study = _study(study_name, storage)
    if fmt == "sglang-adaptive":
        _print_adaptive_schedule(spec, study)
        return
    if per_concurrency:
        if fmt not in (None, "json"):
            raise click.UsageError("--per-concurrency prints a table or --json, not --format " + fmt)
        if as_json or fmt == "json":
            curves = forms.capacity_curves(study)
            _print_json({"levels": forms.per_concurrency(study), "capacity": curves} if curves
                        else forms.per_concurrency(study))
        else:
            click.echo("\n".join(forms.per_concurrency_table(study)))
        return
    rec = forms.best_record(study)
    if as_json or fmt == "json":
        _print_json(forms.document(rec, study))
    elif fmt == "args":
        click.echo(forms.args_line(rec, spec))
    elif fmt == "unit":
        click.echo(forms.unit(rec, spec), nl=False)
    else:
        import shlex

        click.echo(f"trial {rec.number}: {forms.estimate_text(rec, study)}")
        tie = forms.tie_line(study)
        if tie is not None:
            click.echo(tie)
        trust = forms.predictions_line(study)
        if trust is not None:
            click.echo(trust)
        if rec.slo_capacity is not None:
            click.echo(forms.capacity_line(rec))
        for k, v in rec.params.items():
            click.echo(f"  {k} = {v}")
        click.echo(shlex.join(rec.command or []))
        for line in forms.adaptive_lines(study):
            click.echo(line)


def _print_adaptive_schedule(spec: StudySpec, study: optuna.Study) -> None:
    import shlex

    from autotune.results import adaptive_schedule
    from autotune.engines import get_engine

    engine = get_engine(spec.engine.kind)
    schedule = adaptive_schedule.build(study, engine, spec.workload.tolerance)
    _print_json(schedule.document)
    for line in adaptive_schedule.summary(schedule, lambda args: shlex.join(engine.render(spec.engine.command, args))):
        click.echo(line, err=True)


@cli.command("report")
@STUDY
@STORAGE
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Directory for trials.csv, summary.md and the HTML plots (created if missing).")
def report_cmd(study_name: str, storage: str | None, out_dir: Path) -> None:
    """Write trials.csv, summary.md and HTML plots (history, importances, slice, contour, Pareto front,
    throughput against concurrency, timeline) for a study."""
    from autotune import report

    spec, study = _study(study_name, storage)
    result = report.write_report(study, spec, out_dir)
    click.echo(f"{out_dir / 'trials.csv'}: {result.rows} trials, {len(result.columns)} columns")
    click.echo(f"{out_dir / 'summary.md'}")
    for p in result.plots:
        click.echo(f"{p.path}" if p.path else f"skipped {p.name}: {p.note}")


@cli.command()
@STUDY
@STORAGE
@TARGET
@JSON
def check(study_name: str, storage: str | None, target_name: str | None, as_json: bool) -> None:
    """Measure the server as deployed now against the study's record of its config. Exit 0: within the recorded
    interval (or faster); 1: slower beyond it; 2: the server runs a config the study does not know."""
    from autotune.run import commands

    plan = _plan(study_name, target_name)
    result = commands.check(plan, storage or plan.spec.storage)
    if as_json:
        _print_json(result)
    else:
        click.echo(f"{result['url']} runs the config of trial {result['trial']}: "
                   + ", ".join(f"{k}={v}" for k, v in result["server"].items()))
        for lv in result["levels"]:
            click.echo(f"  c{lv['concurrency']}: {lv['now']:.1f} tok/s now, recorded {lv['recorded']:.1f} "
                       f"[{lv['low']:.1f}, {lv['high']:.1f}] (trials {', '.join(map(str, lv['trials']))}): "
                       f"{lv['verdict']}")
        if result["measurements"] > 1:
            click.echo("  (measured again: a level was slower the first time; slower means slower both times)")
        click.echo("slower than recorded" if result["status"] == "slower" else "as recorded")
    if result["status"] == "slower":
        sys.exit(1)


@cli.command()
@STUDY
@STORAGE
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback needs --allow-remote.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535), help="Port to listen on.")
@click.option("--allow-remote", is_flag=True,
              help="Allow a non-loopback --host (anyone who reaches it can read, change and delete studies).")
def dashboard(study_name: str, storage: str | None, host: str, port: int, allow_remote: bool) -> None:
    """optuna-dashboard on the study's storage, with each trial's server log, command line and measurement
    records as artifacts.

    The dashboard has NO AUTHENTICATION and its API can change and DELETE studies, so it listens on 127.0.0.1
    only. From a laptop, open an SSH tunnel to the host it runs on and browse http://127.0.0.1:8080/ there:

    \b
        ssh -L 8080:127.0.0.1:8080 HOST
    """
    from autotune.record import dashboard as dash
    from autotune.studyfile.spec import read_study_file

    spec = read_study_file(study_name)
    board = dash.prepare(spec.name, spec.directory, storage or spec.storage, host, port, allow_remote)
    click.echo(board.banner())
    board.serve()


@cli.command()
@STUDY
@TARGET
@JSON
@PROCESSES
def bench(study_name: str, target_name: str | None, as_json: bool, processes: int | None) -> None:
    """Measure the server deployed now with the study's workload; deploys nothing."""
    from autotune.run import commands
    from autotune.record import figures_text

    result = commands.bench(_plan(study_name, target_name, processes=processes))
    if as_json:
        _print_json(result)
        return
    m = result["metrics"]
    click.echo(f"{result['url']}: {figures_text(m)}, accept length {m['accept_length']}")


@cli.command()
@STUDY
@click.option("--trial", "number", type=click.IntRange(min=0), default=None, help="Trial number (default: the best).")
@STORAGE
@TARGET
def apply(study_name: str, number: int | None, storage: str | None, target_name: str | None) -> None:
    """Deploy the best (or a chosen) trial's config and wait until it is healthy."""
    from autotune.run import commands

    plan = _plan(study_name, target_name)
    t = commands.apply(plan, storage or plan.spec.storage, number)
    click.echo(f"trial {t.number} deployed and healthy")


@cli.command()
@STUDY
@STORAGE
@TARGET
def restore(study_name: str, storage: str | None, target_name: str | None) -> None:
    """Put back the server as it was before tuning and wait until it is healthy."""
    from autotune.run import commands

    commands.restore(_plan(study_name, target_name))
    click.echo("restored")


@cli.group()
def sim() -> None:
    """The SGLang emulator's companion commands (the emulator itself is `python -m autotune.sim`)."""


@sim.command("surface")
@click.option("--profile", default=None, help="Profile name or path to a profile .toml (default qwen122b).")
@click.option("--study", "study_name", default=None, metavar="NAME",
              help="The truth for a study's workload instead: its prompts, max_tokens and concurrency levels.")
@click.option("--concurrency", default=32, show_default=True, type=click.IntRange(min=1),
              help="Requests in flight for concurrent_tok_s (--profile).")
@click.option("--space", default=None,
              help='JSON {"FLAG": [values], ...} or a study .toml with [space.*] tables (--profile).')
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def sim_surface(profile: str | None, study_name: str | None, concurrency: int, space: str | None,
                as_json: bool) -> None:
    """The emulator's noise-free figures for every valid config of a space: the performance model's for a profile,
    or (--study) what a perfect client would measure with the study's workload."""
    from autotune.sim.profile import ProfileError
    from autotune.sim.surface import SpaceError, format_table, parse_space, surface
    from autotune.run.study_truth import format_study_table, study_surface

    try:
        if study_name is not None:
            if profile is not None or space is not None:
                raise UserError("--study takes the profile and the space from the study file: leave out --profile "
                                "and --space")
            result = study_surface(_plan(study_name))
            click.echo(json.dumps(result) if as_json else format_study_table(result))
            return
        result = surface(profile or "qwen122b", concurrency, parse_space(space) if space else None)
    except (ProfileError, SpaceError) as e:
        raise UserError(str(e)) from None
    click.echo(json.dumps(result) if as_json else format_table(result))


@sim.command("profile")
@click.option("--random", "seed", required=True, type=click.IntRange(min=0), metavar="SEED",
              help="Draw a random host, model and draft from this seed (the same seed, the same profile).")
@click.option("--family", type=click.Choice(["closed", "tree", "tight"]), default="closed", show_default=True,
              help="The draft's acceptance model: the emulator's closed form, or a Monte Carlo of SGLang's tree; "
                   "tight: that tree on a host whose widest tree of every width runs out of memory.")
@click.option("--out", type=click.Path(dir_okay=False, writable=True, path_type=Path), default=None, metavar="FILE",
              help="Write the profile file here (default: print it).")
def sim_profile(seed: int, family: str, out: Path | None) -> None:
    """A physically plausible emulator profile drawn from real GPUs and model cards, for --sim-profile FILE and
    `autotune sim surface --profile FILE`."""
    from autotune.sim.random_profile import draw

    host = draw(seed, family=family)
    if out is None:
        click.echo(host.toml(), nl=False)
        return
    try:
        out.write_text(host.toml())
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror}") from None
    click.echo(f"{out}: {host.name}: {host.describe()}")


def _line(message: str) -> str:
    """An error as one line: secrets masked, control characters (a newline in a name) escaped."""
    from autotune.redact import mask
    from autotune.visible import visible

    return visible(mask(message))


def main() -> None:
    from autotune.redact import install_excepthooks

    os.umask(0o077)  # the study's database, logs, artifacts and backups are the user's alone
    install_excepthooks()  # a bug's traceback is printed with secrets masked
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        # one line, like every other error: what is wrong and where to read what is allowed
        where = e.ctx.command_path if isinstance(e, click.UsageError) and e.ctx is not None else "autotune"
        hint = f" (see {where} --help)" if isinstance(e, click.UsageError) else ""
        message = " ".join(e.format_message().split())
        click.echo(f"autotune: error: {_line(message)}{hint}", err=True)
        sys.exit(e.exit_code)
    except UserError as e:
        click.echo(f"autotune: error: {_line(str(e))}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
