"""The `autotune` command line: click commands that parse options, call one function and print."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from autotune.errors import UserError

STUDY = click.option("--study", "study_name", required=True, metavar="NAME",
                     help="A study name under ./studies, or a path to a study .toml file.")
STORAGE = click.option("--storage", default=None, metavar="URL", help="Override the study file's storage URL.")
TARGET = click.option("--target", "target_name", default=None, metavar="NAME",
                      help="Which [targets.NAME] of the study to use (when it has several).")
JSON = click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")


def _tuner(study_name: str, storage: str | None = None, target: str | None = None, **options: Any):
    from autotune.study import load_study
    from autotune.tuner import RunOptions, Tuner

    return Tuner(load_study(study_name), RunOptions(storage=storage, target=target, **options))


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
    options = dict(trials=trials, timeout=timeout, until=until, restore=not no_restore)
    if not all_targets:
        _tuner(study_name, storage, target_name, **options).run()
        return
    if target_name is not None:
        raise UserError("--all-targets and --target exclude each other")
    from autotune.study import load_study
    from autotune.tuner import RunOptions, Tuner
    from autotune.workers import run_all_targets

    spec = load_study(study_name)
    for name in spec.targets:  # every worker's input is checked before any starts
        Tuner(spec, RunOptions(storage=storage, target=name, **options)).validate()
    sys.exit(run_all_targets(spec, RunOptions(storage=storage, **options)))


@cli.command()
@STUDY
def validate(study_name: str) -> None:
    """Check the study file and its space offline; deploys nothing."""
    tuner = _tuner(study_name)
    info = tuner.validate()
    spec = tuner.spec
    click.echo(f"{spec.path}: ok: {len(spec.space)} parameters, "
               f"{'at least ' if info['at_least'] else ''}{info['valid_configs']} distinct valid configs, "
               f"{spec.trials} trials, sampler {spec.sampler}, objective {spec.objective}, "
               f"targets {', '.join(f'{t.name} ({t.kind})' for t in spec.targets.values())}, "
               f"{info['prompts']} prompts")
    from autotune.space import describe
    for params in info["starting_points"]:
        click.echo(f"  starting point: {describe(params)}")


@cli.command()
@STUDY
@STORAGE
@JSON
def status(study_name: str, storage: str | None, as_json: bool) -> None:
    """Every trial: number, state, params, metrics, failure reason."""
    from autotune import results

    tuner = _tuner(study_name, storage)
    study = tuner.open_existing()
    rows = [results.row(t) for t in study.get_trials(deepcopy=False)]
    if as_json:
        _print_json({"study": tuner.spec.name, "trials": rows})
        return
    for r in rows:
        m = r["metrics"] or {}
        figures = (f"single {m['single_tok_s']:.1f} tok/s, concurrent {m['concurrent_tok_s']:.1f} tok/s, "
                   f"mrr {m.get('max_running_requests')}") if m.get("single_tok_s") is not None else ""
        value = " / ".join(f"{v:.4g}" for v in r["values"]) if r["values"] and r["state"] == "COMPLETE" else "-"
        params = " ".join(f"{k}={v}" for k, v in r["params"].items()) or "(fixed args)"
        tail = ", ".join(x for x in (figures, r["reason"] or "", f"target {r['target']}" if r["target"] else "") if x)
        click.echo(f"{r['number']:>4} {r['state']:<8} {value:>10}  {params}  {tail}")


@cli.command()
@STUDY
@STORAGE
@click.option("--format", "fmt", type=click.Choice(["args", "unit", "json"]), default=None,
              help="args: the shell-quoted server command line; unit: a systemd service unit running it; "
                   "json: one JSON document (same as --json).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (--format json).")
def best(study_name: str, storage: str | None, fmt: str | None, as_json: bool) -> None:
    """The best feasible trial: params, metrics and the full server command line."""
    from autotune import report, results

    tuner = _tuner(study_name, storage)
    t = report.best_trial(tuner.open_existing())
    out = report.best_document(t)
    if as_json or fmt == "json":
        _print_json(out)
    elif fmt == "args":
        click.echo(report.best_args(t, report.server_env(t, tuner.spec)))
    elif fmt == "unit":
        click.echo(report.best_unit(t, tuner.spec, report.server_env(t, tuner.spec)), nl=False)
    else:
        import shlex

        click.echo(f"trial {t.number}: value {' / '.join(f'{v:.4g}' for v in t.values)}")
        for k, v in results.params(t).items():
            click.echo(f"  {k} = {v}")
        click.echo(shlex.join(out["command"] or []))


@cli.command("report")
@STUDY
@STORAGE
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Directory for trials.csv, summary.md and the HTML plots (created if missing).")
def report_cmd(study_name: str, storage: str | None, out_dir: Path) -> None:
    """Write trials.csv, summary.md and HTML plots (history, importances, slice, contour, Pareto front,
    throughput against concurrency, timeline) for a study."""
    from autotune import report

    tuner = _tuner(study_name, storage)
    result = report.write_report(tuner.open_existing(), tuner.spec, out_dir)
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

    tuner = _tuner(study_name, storage)
    board = dash.prepare(tuner.spec.name, tuner.spec.directory, tuner.storage_url, host, port, allow_remote)
    click.echo(board.banner())
    board.serve()


@cli.command()
@STUDY
@TARGET
@JSON
def bench(study_name: str, target_name: str | None, as_json: bool) -> None:
    """Measure the server deployed now with the study's workload; deploys nothing."""
    result = _tuner(study_name, target=target_name).bench()
    if as_json:
        _print_json(result)
        return
    m = result["metrics"]
    click.echo(f"{result['url']}: single {m['single_tok_s']:.1f} tok/s, concurrent {m['concurrent_tok_s']:.1f} tok/s "
               f"at {m['concurrency']}, accept length {m['accept_length']}, max_running_requests "
               f"{m['max_running_requests']}")


@cli.command()
@STUDY
@click.option("--trial", "number", type=click.IntRange(min=0), default=None, help="Trial number (default: the best).")
@STORAGE
@TARGET
def apply(study_name: str, number: int | None, storage: str | None, target_name: str | None) -> None:
    """Deploy the best (or a chosen) trial's config and wait until it is healthy."""
    t = _tuner(study_name, storage, target_name).apply(number)
    click.echo(f"trial {t.number} deployed and healthy")


@cli.command()
@STUDY
@STORAGE
@TARGET
def restore(study_name: str, storage: str | None, target_name: str | None) -> None:
    """Put back the server as it was before tuning and wait until it is healthy."""
    _tuner(study_name, storage, target_name).restore()
    click.echo("restored")


@cli.group()
def sim() -> None:
    """The SGLang emulator's companion commands (the emulator itself is `python -m autotune.sim`)."""


@sim.command("surface")
@click.option("--profile", default="qwen122b", show_default=True, help="Profile name or path to a profile .toml.")
@click.option("--concurrency", default=32, show_default=True, type=click.IntRange(min=1),
              help="Requests in flight for concurrent_tok_s.")
@click.option("--space", default=None,
              help='JSON {"speculative-num-steps": [..], ...} or a study .toml with [space.*] tables.')
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def sim_surface(profile: str, concurrency: int, space: str | None, as_json: bool) -> None:
    """The emulator's noise-free figures for every valid speculative config of a space."""
    import json

    from autotune.sim.profile import ProfileError
    from autotune.sim.surface import SpaceError, format_table, parse_space, surface

    try:
        result = surface(profile, concurrency, parse_space(space) if space else None)
    except (ProfileError, SpaceError) as e:
        raise click.ClickException(str(e)) from None
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
