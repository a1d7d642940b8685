"""`python -m autotune.sim`: SGLang's launcher front half, parsing and argument rules, before anything loads."""
from __future__ import annotations

import argparse
import asyncio
import os
import sys

import yaml

from autotune.sim import logs
from autotune.sim.args import ArgRuleError, build_parser, merge_config, resolve, sim_options
from autotune.sim.hostargs import apply_forced
from autotune.sim.profile import ProfileError, load_profile


def main(argv: list[str] | None = None) -> None:
    """Parse like SGLang (exit 2 on argparse errors, 1 on rule errors), then load and serve until killed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    sys.stderr.write(
        f"{logs.SGLANG_ROOT}/launch_server.py:84: UserWarning: 'python -m sglang.launch_server' is still "
        "supported, but 'sglang serve' is the recommended entrypoint.\n"
        "  Example: sglang serve --model-path <model> [options]\n  warnings.warn(\n"
    )
    parser = build_parser()
    try:
        merged = merge_config(argv, parser)
    except (ValueError, OSError, yaml.YAMLError) as e:
        sys.stderr.write(logs.config_traceback(f"{type(e).__name__}: {e}") + "\n")
        sys.exit(1)
    ns = parser.parse_args(merged)
    try:
        profile = load_profile(ns.sim_profile)
    except ProfileError as e:
        parser.error(f"argument --sim-profile: {e}")
    sim = sim_options(ns)
    launcher, scheduler_log = _loggers(ns)
    apply_forced(ns, launcher.warning)
    try:
        resolved = resolve(ns, argv, profile, launcher.warning)
    except ArgRuleError as e:
        pid = os.getpid()
        launcher.info(f"kill_process_tree called: parent_pid={pid}, include_parent=False, pid={pid}")
        sys.stderr.write(logs.launcher_traceback(str(e), e.frames) + "\n")
        sys.exit(1)
    # Imported only now: argument errors stay fast, like SGLang's parser (the HTTP stack loads in ~1 s).
    from autotune.sim.lifecycle import Lifecycle

    asyncio.run(Lifecycle(resolved, profile, sim, launcher, scheduler_log).run())


def _loggers(ns: argparse.Namespace):
    prefix = (" DP0" if ns.dp_size > 1 else "") + (" TP0" if ns.tp_size > 1 else "")
    try:
        return logs.setup(ns.log_level, prefix)
    except AttributeError:
        sys.stderr.write(logs.launcher_traceback(
            f"AttributeError: module 'logging' has no attribute '{ns.log_level.upper()}'") + "\n")
        sys.exit(1)
