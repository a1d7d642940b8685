"""The `autotune` command line: click commands that parse options, call one function and print."""
from __future__ import annotations

import click


@click.group()
@click.version_option(package_name="autotune")
def cli() -> None:
    """Bayesian autotuner for LLM serving engines."""


@cli.group()
def sim() -> None:
    """The SGLang emulator's companion commands (the emulator itself is `python -m autotune.sim`)."""


def main() -> None:
    cli()
