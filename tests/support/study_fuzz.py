"""Generated study files for the fuzzer (tests/studyfile/test_fuzz_study.py): real study files (studies/*.toml and the
texts of study_texts.py) mutated structurally, and the runner that puts each through autotune's own ``main()``.

``cases(seed, n)`` is deterministic for a seed. ``python -m tests.support.study_fuzz CASES.json DIR`` runs the cases
of CASES.json, each in a directory of its own under DIR, and prints one JSON line per case: its verdict ("exit 0",
"exit 2", or what else happened: a traceback, a hang, a character printed raw that autotune writes out), so that the
parent can count them, and cap the runner's memory and time. A case may bring files of its own (a dataset's bytes:
dataset_fuzz.py)."""
from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import io
import json
import os
import random
import re
import resource
import signal
import subprocess
import sys
import time
import tomllib
import traceback
from pathlib import Path
from typing import Any

import tomli_w

from tests.support import study_texts

ROOT = Path(__file__).resolve().parents[2]
#: the most seconds one case may take before it counts as a hang
HANG_SECONDS = 10
#: the runner's address space: the interpreter with optuna, numpy and torch's imports is ~800 MB
MEMORY = 2 * 2**30
#: the whole batch (about 30 s on one busy core): beyond it, cases hang or crawl
BATCH_SECONDS = 240
#: values of every type, some of them huge, some with control characters
ODD_VALUES: list[Any] = [
    0, -1, 1, 2**31, 2**63, 10**30, -10**30, 1e308, -1e308, float("inf"), float("-inf"), float("nan"), 0.5, -0.0,
    True, False, "", "x", "a" * 300, "a" * 100_000, "x\x1b[2J\x07", "line\nline", "nul\x00", "del\x7f", "\u202eevil",
    "../../etc/passwd", "$(touch pwned)", "a;b", [], [1, 1], [True, 1], [1, 1.0], ["a"] * 3, {}, {"env": "HOME"},
    {"secret": "s3cret-value"}, {"nested": {"deeper": [1, {"x": 2}]}}, list(range(20_000)),
]
#: paths a study may name that are no regular file, or none at all
ODD_PATHS = ["/dev/zero", "/dev/null", "p.fifo", "p.dir", "missing.jsonl", "/proc/self/mem", "/", "~nobody/x",
             "/etc/shadow", "p" * 300, "/tmp/" + "d/" * 200 + "x", "sqlite:////dev/zero", "sqlite:///p.dir",
             "sqlite:///p.fifo", "sqlite:///" + "n" * 300]
#: flags autotune or a target owns, and other flags a space or the fixed args may name
FLAGS = ["port", "host", "model-path", "api-key", "served-model-name", "config", "speculative-eagle-topk",
         "speculative-num-steps", "speculative-num-draft-tokens", "tp-size", "page-size", "attention-backend",
         "speculative-algorithm", "cuda-graph-max-bs", "x" * 300, "bad name", "-dash", "n\nl"]
#: what autotune never prints raw (its output is read in terminals and logs): controls but the line feed, line and
#: paragraph separators, bidi overrides and isolates, lone surrogates (autotune/visible.py writes them out)
HIDDEN = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
#: keys no table knows
UNKNOWN_KEYS = ["trails", "typo", "", " ", "\x1b", "k" * 300, "port", "name"]


def base_texts() -> list[str]:
    """The real study files the mutations start from."""
    texts = [p.read_text() for p in sorted((ROOT / "studies").glob("*.toml"))]
    return [*texts, study_texts.VALID, study_texts.WIDE]


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path in a parsed study (tables, keys, list items)."""
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list) and len(doc) <= 50:
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _set(doc: dict, path: tuple, value: Any) -> None:
    node = doc
    for k in path[:-1]:
        node = node[k]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value


_DELETE = object()


def _table(doc: dict, rng: random.Random) -> dict:
    """A random table of ``doc`` (the top level among them)."""
    tables = [doc] + [v for p in _paths(doc) for v in [_get(doc, p)] if isinstance(v, dict)]
    return rng.choice(tables)


def _sub(table: dict, key: str) -> dict:
    """The table ``key`` of ``table``, made one if an earlier mutation left something else there."""
    if not isinstance(table.get(key), dict):
        table[key] = {}
    return table[key]


def _get(doc: Any, path: tuple) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def _mutate(doc: dict, rng: random.Random) -> str:
    """One structural mutation of ``doc`` in place; returns what it did, for the report of a failing case."""
    kind = rng.choice(["type", "type", "huge", "string", "control", "unknown", "duplicate", "owned", "path", "path",
                       "delete", "range", "targets", "space"])
    paths = _paths(doc)
    if kind in ("type", "huge", "string", "control", "delete") and paths:
        path = rng.choice(paths)
        if kind == "type":
            value = copy.deepcopy(rng.choice(ODD_VALUES))
        elif kind == "huge":
            value = rng.choice([10**9, 10**15, 10**15 + 1, 2**53 + 1, 10**19, -10**19, 1e15, 1e300, 4294967296])
        elif kind == "string":
            value = rng.choice(["s" * 256, "s" * 10_000, "s" * 100_000, "é" * 5000])
        elif kind == "control":
            value = rng.choice(["a\x1bb", "\x07", "a\nb", "\r", "\x00", "\x7f", "\u2028", "\x9b31m"])
        else:
            value = _DELETE
        _set(doc, path, value)
        return f"{kind} {path!r}"
    if kind == "unknown":
        table = _table(doc, rng)
        key = rng.choice(UNKNOWN_KEYS)
        table[key] = copy.deepcopy(rng.choice(ODD_VALUES[:20]))
        return f"unknown key {key!r}"
    if kind == "duplicate":
        choices = rng.choice([[1, 1], [True, 1], [1, 1.0], [False, 0], ["a", "a"], [1, 2, 2.0], [0.0, -0.0]])
        _sub(doc, "space")[rng.choice(FLAGS[:12])] = {"type": "categorical", "choices": choices}
        return f"duplicate choices {choices!r}"
    if kind == "owned":
        flag = rng.choice(FLAGS)
        if rng.random() < 0.5:
            _sub(doc, "space")[flag] = rng.choice([{"type": "int", "low": 1, "high": 4},
                                                            {"type": "categorical", "choices": ["a", "b"]}])
        else:
            _sub(_sub(doc, "engine"), "args")[flag] = rng.choice([31000, "x", True, "/m"])
        return f"flag {flag!r}"
    if kind == "path":
        where = rng.choice([("workload", "prompts"), ("study", "storage"), ("target", "identity_file"),
                            ("target", "workdir"), ("target", "known_hosts")])
        value = rng.choice(ODD_PATHS)
        _sub(doc, where[0])[where[1]] = value
        return f"path {where!r} = {value[:40]!r}"
    if kind == "range":
        name = rng.choice(FLAGS[6:9])
        low, high = rng.choice([(1, 10**9), (1, 10**15), (10, 1), (-5, 5), (0, 0), (1, 2**63), (1.5, 2)])
        _sub(doc, "space")[name] = {"type": rng.choice(["int", "float", "categorical"]), "low": low,
                                             "high": high, **({"step": rng.choice([1, 0, -1, 1e-9])}
                                                              if rng.random() < 0.3 else {})}
        return f"range {name} {low}..{high}"
    if kind == "targets":
        port = rng.choice([31000, 31000, 0, 70000])
        doc.pop("target", None)
        doc["targets"] = {n: {"kind": rng.choice(["local", "ssh-process", "ssh-systemd", "k8s"]), "server_port": port,
                              "host": "gpu1"} for n in rng.sample(["a", "b", "c", "a" * 200], rng.randint(1, 3))}
        return f"targets on port {port}"
    space = _sub(doc, "space")
    if space:
        space.pop(rng.choice(list(space)))
    return "a [space] table removed"


def _text_mutation(text: str, rng: random.Random) -> tuple[str, str]:
    """A mutation of the text itself (TOML that may no longer parse)."""
    kind = rng.choice(["truncate", "duplicate line", "bytes"])
    lines = text.splitlines(keepends=True)
    if kind == "truncate":
        return text[:rng.randrange(len(text) + 1)], kind
    if kind == "duplicate line" and lines:
        i = rng.randrange(len(lines))
        return "".join(lines[:i + 1] + lines[i:]), kind
    at = rng.randrange(len(text) + 1)
    return text[:at] + rng.choice(["\x1b", "\x00", "[", "]]", "=", '"', "\ufeff", "\udcff"]) + text[at:], kind


def cases(seed: int, n: int) -> list[dict[str, Any]]:
    """``n`` cases: a study file, the command line to run on it, and what was done to it."""
    rng = random.Random(seed)
    docs = [tomllib.loads(t) for t in base_texts()]
    out = []
    for i in range(n):
        doc = copy.deepcopy(rng.choice(docs))
        done = [_mutate(doc, rng) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
        try:
            text = tomli_w.dumps(doc)
        except (TypeError, ValueError) as e:  # a value TOML cannot hold
            text, done = tomli_w.dumps(rng.choice(docs)), [*done, f"(unwritable: {e})"]
        if rng.random() < 0.1:
            text, kind = _text_mutation(text, rng)
            done.append(kind)
        command = rng.choices(["validate", "status", "best"], weights=[8, 1, 1])[0]
        out.append({"number": i, "text": text, "argv": [command, "--study", "S.toml"], "done": done})
    return out


# -- the runner (in a subprocess whose memory the test caps) ----------------------------------------------------------

class Hang(Exception):
    pass


def clock_seed(what: str) -> int:
    """A seed from the clock, or AUTOTUNE_FUZZ_SEED's to replay a run; printed either way."""
    seed = int(os.environ.get("AUTOTUNE_FUZZ_SEED") or time.time_ns() % 2**32)
    print(f"{what} seed {seed} (replay: AUTOTUNE_FUZZ_SEED={seed})")
    return seed


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def run_batch(todo: list[dict[str, Any]], directory: Path, seed: int) -> list[dict[str, Any]]:
    """Every case of ``todo`` through this module's runner, in one process under MEMORY, within BATCH_SECONDS: each
    case's result, all of them (a batch that hangs, crawls or stops early fails the calling test)."""
    import pytest

    (directory / "cases.json").write_text(json.dumps(todo))
    (directory / "runs").mkdir()
    try:
        r = subprocess.run([sys.executable, "-m", "tests.support.study_fuzz", str(directory / "cases.json"),
                            str(directory / "runs")], capture_output=True, text=True, cwd=ROOT, preexec_fn=_capped,
                           timeout=BATCH_SECONDS, check=False)
    except subprocess.TimeoutExpired as e:
        done = (e.stdout or b"").decode().count("\n")
        pytest.fail(f"seed {seed}: the batch took over {BATCH_SECONDS} s ({done} cases done; case {done}: "
                    f"{todo[min(done, len(todo) - 1)]['done']})", pytrace=False)
    results = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert r.returncode == 0 and len(results) == len(todo), (
        f"seed {seed}: the runner ended with {r.returncode} after {len(results)} cases "
        f"(case {len(results)}: {todo[len(results)]['done'] if len(results) < len(todo) else ''}): {r.stderr[-2000:]}")
    return results


def _alarm(signum: int, frame: Any) -> None:
    raise Hang()


def snapshot(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "other"
            for p in sorted(directory.rglob("*"))}


def run_case(case: dict[str, Any], directory: Path) -> dict[str, Any]:
    """The case through ``main()`` in ``directory``: its verdict."""
    from autotune.cli import main

    directory.mkdir()
    (directory / "S.toml").write_text(case["text"], encoding="utf-8", errors="surrogateescape")
    for name, data in case.get("files", {}).items():  # a dataset's bytes (tests/support/dataset_fuzz.py)
        (directory / name).write_bytes(base64.b64decode(data))
    os.mkfifo(directory / "p.fifo")
    (directory / "p.dir").mkdir()
    before = snapshot(directory)
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["autotune", *case["argv"]]
    os.chdir(directory)
    code: object = 0
    crash = ""
    signal.setitimer(signal.ITIMER_REAL, HANG_SECONDS)
    start = time.monotonic()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Hang:
        crash = f"hang over {HANG_SECONDS} s"
    except BaseException as e:  # anything else is what the fuzzer looks for
        crash = "exception: " + "".join(traceback.format_exception(e))[-1500:]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        os.chdir(ROOT)
    errors = err.getvalue().splitlines()
    verdict = crash or _verdict(code, errors, out.getvalue() + err.getvalue())
    if verdict in ("exit 0", "exit 2") and HIDDEN.search(out.getvalue() + err.getvalue()):
        verdict = f"printed a hidden character {HIDDEN.search(out.getvalue() + err.getvalue()).group()!r}"
    if verdict in ("exit 0", "exit 2") and snapshot(directory) != before:
        verdict = "wrote files"
    return {"number": case["number"], "verdict": verdict, "stderr": err.getvalue()[-1500:],
            "seconds": round(time.monotonic() - start, 3)}


def _verdict(code: object, errors: list[str], everything: str) -> str:
    if "Traceback" in everything:
        return f"traceback (exit {code})"
    if code == 0:
        return "exit 0"
    if code == 2 and len(errors) == 1 and errors[0].startswith("autotune: error: "):
        return "exit 2"
    return f"exit {code} with {len(errors)} lines on stderr"


def main() -> None:
    signal.signal(signal.SIGALRM, _alarm)
    todo = json.loads(Path(sys.argv[1]).read_text())
    where = Path(sys.argv[2])
    for case in todo:
        print(json.dumps(run_case(case, where / f"case-{case['number']}")), flush=True)


if __name__ == "__main__":
    main()
