"""The `autotune` command line: click commands that parse options, call one function and print."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from autotune.errors import UserError

if TYPE_CHECKING:
    import optuna

    from autotune.plan import Plan
    from autotune.study import StudySpec

STUDY = click.option("--study", "study_name", required=True, metavar="NAME",
                     help="A study name under ./studies, or a path to a study .toml file.")
STORAGE = click.option("--storage", default=None, metavar="URL", help="Override the study file's storage URL.")
TARGET = click.option("--target", "target_name", default=None, metavar="NAME",
                      help="Which [targets.NAME] of the study to use (when it has several).")
JSON = click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")


def _plan(study_name: str, target: str | None = None, trials: int | None = None) -> Plan:
    """The study file checked offline for one target (see autotune.plan)."""
    from autotune.plan import make_plan
    from autotune.study import load_study

    return make_plan(load_study(study_name), target, trials)


def _study(study_name: str, storage: str | None) -> tuple[StudySpec, optuna.Study]:
    """The study file and the study as stored, for commands that only read it."""
    from autotune.storage import load_existing_study
    from autotune.study import load_study

    spec = load_study(study_name)
    return spec, load_existing_study(spec.name, storage or spec.storage)


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


@click.group()
@click.version_option(package_name="autotune")
def cli() -> None:
    """Bayesian autotuner for LLM serving engines."""


@cli.command()
@STUDY
@click.option("--trials", type=click.IntRange(min=1), default=None, help="Total budget, counted across restarts.")
@click.option("--timeout", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Start no trial after this many seconds.")
@click.option("--until", default=None, metavar="HH:MM", help="Start no trial after this local time.")
@STORAGE
@TARGET
@click.option("--all-targets", is_flag=True, help="Start one worker per [targets.NAME] of the study.")
@click.option("--no-restore", is_flag=True, help="Leave the target as the last trial left it.")
def run(study_name: str, trials: int | None, timeout: float | None, until: str | None, storage: str | None,
        target_name: str | None, all_targets: bool, no_restore: bool) -> None:
    """Create or resume the study and tune until its budget or deadline."""
    from autotune.plan import make_plan
    from autotune.study import load_study
    from autotune.tuner import RunOptions, Tuner
    from autotune.workers import run_all_targets

    options = RunOptions(trials=trials, timeout=timeout, until=until, storage=storage, target=target_name,
                         restore=not no_restore)
    spec = load_study(study_name)
    if not all_targets:
        Tuner(make_plan(spec, target_name, trials), options).run()
        return
    if target_name is not None:
        raise UserError("--all-targets and --target exclude each other")
    for name in spec.targets:  # every worker's input is checked before any starts
        make_plan(spec, name, trials)
    sys.exit(run_all_targets(spec, options))


@cli.command()
@STUDY
def validate(study_name: str) -> None:
    """Check the study file and its space offline; deploys nothing."""
    from autotune.plan import make_plan
    from autotune.study import load_study

    spec = load_study(study_name)
    plans = [make_plan(spec, name) for name in spec.targets]
    plan = plans[0]
    click.echo(f"{spec.path}: ok: {len(spec.space)} parameters, "
               f"{'at least ' if plan.at_least else ''}{plan.valid_configs} distinct valid configs, "
               f"{spec.trials} trials, sampler {spec.sampler}, objective {spec.objective}, "
               f"targets {', '.join(f'{t.name} ({t.kind})' for t in spec.targets.values())}, "
               f"{len(plan.prompts)} prompts")
    for params in plan.starting_points:
        click.echo(f"  starting point: {plan.engine.describe(params)}")


@cli.command()
@STUDY
@STORAGE
@JSON
def status(study_name: str, storage: str | None, as_json: bool) -> None:
    """Every trial: number, state, params, metrics, failure reason."""
    from autotune import record

    spec, study = _study(study_name, storage)
    recs = record.records(study.get_trials(deepcopy=False))
    if as_json:
        _print_json({"study": spec.name, "trials": [r.as_row() for r in recs]})
        return
    for r in recs:
        params = " ".join(f"{k}={v}" for k, v in r.params.items()) or "(fixed args)"
        tail = ", ".join(x for x in (r.figures_text(), r.reason or "", f"target {r.target}" if r.target else "") if x)
        click.echo(f"{r.number:>4} {r.state.name:<8} {r.values_text():>10}  {params}  {tail}")


@cli.command()
@STUDY
@STORAGE
@click.option("--format", "fmt", type=click.Choice(["args", "unit", "json"]), default=None,
              help="args: the shell-quoted server command line; unit: a systemd service unit running it; "
                   "json: one JSON document (same as --json).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (--format json).")
def best(study_name: str, storage: str | None, fmt: str | None, as_json: bool) -> None:
    """The best feasible trial: params, metrics and the full server command line."""
    from autotune import best as forms

    spec, study = _study(study_name, storage)
    rec = forms.best_record(study)
    if as_json or fmt == "json":
        _print_json(forms.document(rec))
    elif fmt == "args":
        click.echo(forms.args_line(rec, spec))
    elif fmt == "unit":
        click.echo(forms.unit(rec, spec), nl=False)
    else:
        import shlex

        click.echo(f"trial {rec.number}: value {rec.values_text()}")
        for k, v in rec.params.items():
            click.echo(f"  {k} = {v}")
        click.echo(shlex.join(rec.command or []))


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
    from autotune import dashboard as dash
    from autotune.study import load_study

    spec = load_study(study_name)
    board = dash.prepare(spec.name, spec.directory, storage or spec.storage, host, port, allow_remote)
    click.echo(board.banner())
    board.serve()


@cli.command()
@STUDY
@TARGET
@JSON
def bench(study_name: str, target_name: str | None, as_json: bool) -> None:
    """Measure the server deployed now with the study's workload; deploys nothing."""
    from autotune import commands
    from autotune.record import figures_text

    result = commands.bench(_plan(study_name, target_name))
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
    from autotune import commands

    plan = _plan(study_name, target_name)
    t = commands.apply(plan, storage or plan.spec.storage, number)
    click.echo(f"trial {t.number} deployed and healthy")


@cli.command()
@STUDY
@STORAGE
@TARGET
def restore(study_name: str, storage: str | None, target_name: str | None) -> None:
    """Put back the server as it was before tuning and wait until it is healthy."""
    from autotune import commands

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
    from autotune.sim.surface import SpaceError, format_study_table, format_table, parse_space, study_surface, surface

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


def main() -> None:
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except UserError as e:
        click.echo(f"autotune: error: {e}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
