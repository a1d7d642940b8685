#!/usr/bin/env python3
"""Does the quick tier (`python -m pytest -m "not slow"`) exercise every module of autotune?

Runs the quick tier under coverage.py, its subprocesses included (`autotune run`, the emulator, dashboards: every
Python process the tests start from this interpreter), then prints each module of autotune with the share of its
statements the tier ran, and exits 1 if one ran none. The remote helpers that the SSH targets ship to the target and
run with its own python3 (`python3 -c SOURCE`) are listed apart: coverage cannot see inside those processes.

Usage: python scripts/fast_tier_coverage.py [--keep DIR] [-- PYTEST ARGS...]   (needs `pip install coverage`)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: run on the target by its python3 as `python3 -c SOURCE` (targets/remote.py), never imported here
REMOTE_ONLY = {"autotune/targets/programs/supervisor.py"}

RC = """[run]
source = {source}
parallel = true
data_file = {data}
patch = subprocess
sigterm = true
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="keep coverage's data and JSON report in this directory")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="autotune-tier-coverage-"))
    work.mkdir(parents=True, exist_ok=True)
    rc = work / "coveragerc"
    rc.write_text(RC.format(source=REPO / "autotune", data=work / ".coverage"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    tests = subprocess.run([sys.executable, "-m", "coverage", "run", f"--rcfile={rc}", "-m", "pytest", "-q",
                            "-m", "not slow", "-p", "no:cacheprovider", *args.pytest_args], cwd=REPO, env=env,
                           check=False)
    subprocess.run([sys.executable, "-m", "coverage", "combine", f"--rcfile={rc}", "-q"], cwd=REPO, env=env,
                   check=True)
    report = work / "coverage.json"
    subprocess.run([sys.executable, "-m", "coverage", "json", f"--rcfile={rc}", "-q", "-o", str(report)], cwd=REPO,
                   env=env, check=True)
    files = {str(Path(name).resolve().relative_to(REPO)): data["summary"]
             for name, data in json.loads(report.read_text())["files"].items()}
    modules = sorted(str(p.relative_to(REPO)) for p in (REPO / "autotune").rglob("*.py"))
    unrun = []
    print(f"\n{'module':<48} {'statements':>10} {'run':>6}")
    for module in modules:
        if module in REMOTE_ONLY:
            print(f"{module:<48} {'':>10} {'remote':>6}  (run by the target's python3 -c, not measurable here)")
            continue
        summary = files.get(module)
        statements = summary["num_statements"] if summary else 0
        run = summary["covered_lines"] if summary else 0
        share = run / statements if statements else 1.0
        mark = "" if run or not statements else "  <- not exercised by the quick tier"
        print(f"{module:<48} {statements:>10} {share:>6.0%}{mark}")
        if statements and not run:
            unrun.append(module)
    print(f"\n{len(modules) - len(REMOTE_ONLY) - len(unrun)} of {len(modules) - len(REMOTE_ONLY)} measurable modules "
          f"exercised by the quick tier; not exercised: {', '.join(unrun) or 'none'}; the tier's pytest exit status: "
          f"{tests.returncode}")
    return 1 if unrun or tests.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
