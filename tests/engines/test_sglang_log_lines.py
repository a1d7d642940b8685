"""SGLang's log lines as the tuner reads them, taken from the installed SGLang's own source (the sglang-cpu venv): no
warning or info message it can log is read as fatal, and the messages it stops on are."""
from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.engines.sglang import SGLang
from tests.support import requires

#: the logger methods whose messages are not failures
LEVELS = {"info", "warning", "warn", "info_once", "warning_once", "debug"}
_LOG_CALL = re.compile(r"\.(" + "|".join(LEVELS) + r")\(")
#: what SGLang prints when it stops: (kind, file under srt/ that says it, the words it says there, the line in a log)
FATAL = [
    ("oom", "model_executor/pool_configurator.py", "Not enough memory. Please try to increase --mem-fraction-static",
     "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: "
     "mem_fraction_static=0.8"),
    ("oom", "", "", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                    "capacity of 79.19 GiB of which 1.05 GiB is free."),
    ("oom", "", "", "RuntimeError: CUDA error: out of memory"),
    ("oom", "model_executor/runner/decode_cuda_graph_runner.py", "Capture cuda graph failed: ",
     "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 20.00 MiB."),
    ("oom", "mem_cache/allocation.py", "Decode out of memory. Try to lower your batch size.",
     "RuntimeError: Decode out of memory. Try to lower your batch size."),
    ("oom", "mem_cache/allocation.py", "alloc_req_slots runs out of memory. ",
     "RuntimeError: alloc_req_slots runs out of memory. Please set a smaller number for `--max-running-requests`."),
    ("crashed", "model_executor/runner/decode_cuda_graph_runner.py", "Capture cuda graph failed: ",
     "Exception: Capture cuda graph failed: CUDA error: an illegal memory access was encountered"),
    ("crashed", "managers/scheduler.py", "Scheduler hit an exception", "Scheduler hit an exception: Traceback "
                                                                      "(most recent call last):"),
    ("crashed", "", "", "Received sigquit from a child process. It usually means the child failed."),
    ("crashed", "", "", "Traceback (most recent call last):"),
    ("invalid_args", "", "", "sglang serve: error: unrecognized arguments: --bogus"),
    ("invalid_args", "", "", "sglang serve: error: argument --page-size: invalid int value: 'x'"),
    ("invalid_args", "arg_groups/speculative_hook.py", "def _handle_eagle_family",
     '  File "/usr/lib/python3/site-packages/sglang/srt/arg_groups/speculative_hook.py", line 1190, in '
     "_handle_eagle_family"),
]


@pytest.fixture(scope="module")
def source() -> Path:
    python = requires.sglang_oracle()
    found = sorted(python.parent.parent.glob("lib/python3*/site-packages/sglang/srt"))
    if not found:
        pytest.fail(f"no sglang/srt in the venv {python.parent.parent} (run scripts/setup.sh)", pytrace=False)
    return found[0]


def _text(node: ast.expr) -> str | None:
    """A log call's message as it prints, placeholders filled with a digit (None: not a literal)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.sub(r"%[-#0 +]*\d*(?:\.\d+)?[sdrfgiex]", "7", node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "7" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        left = _text(node.left)
        right = _text(node.right) if isinstance(node.op, ast.Add) else ""
        return None if left is None else left + (right or "7")
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"):
        return _text(node.func.value)
    return None


def messages(root: Path) -> Iterator[tuple[str, int, str, bool]]:
    """(file, line, message, exc_info) of every warning/info/debug log call with a literal message under ``root``."""
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(errors="replace")
        if not _LOG_CALL.search(text):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", SyntaxWarning)   # invalid escapes in SGLang's strings
                tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
                    and node.func.attr in LEVELS):
                continue
            text = _text(node.args[0])
            if text:
                exc_info = any(k.arg in ("exc_info", "stack_info") for k in node.keywords)
                yield str(path.relative_to(root)), node.lineno, text, exc_info


@pytest.fixture(scope="module")
def logged(source: Path) -> list[tuple[str, int, str, bool]]:
    return list(messages(source))


@pytest.mark.slow
def test_no_warning_or_info_message_is_read_as_fatal(source: Path, logged: list[tuple[str, int, str, bool]]) -> None:
    engine = SGLang()
    found = logged
    assert len(found) > 1000, f"only {len(found)} log messages found under {source}"
    fatal = [f"{where}:{line}: {engine.fatal_reason(piece)}: {piece!r}"
             for where, line, text, _ in found for piece in text.splitlines()
             if engine.fatal_reason(f"[2026-12-06 17:00:00 TP0] {piece}") or engine.fatal_reason(piece)]
    print(f"{len(found)} warning/info/debug messages in {source}")
    assert not fatal, f"{len(fatal)} ordinary messages read as fatal:\n" + "\n".join(fatal[:40])


@pytest.mark.parametrize(("kind", "where", "said", "line"), FATAL)
def test_sglangs_fatal_messages_are_read_as_fatal(source: Path, kind: str, where: str, said: str, line: str) -> None:
    if where:
        assert said in (source / where).read_text(), f"{where} no longer says {said!r}"
    assert SGLang().fatal_reason(f"[2026-12-06 17:00:00 TP0] {line}") == kind
    assert SGLang().fatal_reason(line) == kind


@pytest.mark.slow
def test_a_warning_with_its_traceback_is_not_a_crash(logged: list[tuple[str, int, str, bool]]) -> None:
    """``logger.warning(..., exc_info=True)`` prints the traceback under the warning: no failure by itself."""
    with_traceback = [(w, t) for w, _, t, exc in logged if exc]
    assert ("entrypoints/http_server.py", "post-warmup freeze_gc failed") in with_traceback
    log = [
        "[2026-12-06 17:00:00] The server is fired up and ready to roll!",
        "[2026-12-06 17:00:01] post-warmup freeze_gc failed",
        "Traceback (most recent call last):",
        '  File "/opt/venv/lib/python3.12/site-packages/requests/adapters.py", line 667, in send',
        "    resp = conn.urlopen(",
        "requests.exceptions.ConnectionError: ('Connection aborted.', RemoteDisconnected('Remote end closed "
        "connection without response'))",
        "[2026-12-06 17:00:02] Decode batch, #running-req: 1, #token: 300, token usage: 0.01",
    ]
    assert SGLang().fatal_lines(log) == []


def test_a_traceback_of_its_own_is_a_crash() -> None:
    log = [
        "[2026-12-06 17:00:00] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=60.00 GB",
        "Process SpawnProcess-1:",
        "Traceback (most recent call last):",
        '  File "/opt/venv/lib/python3.12/site-packages/sglang/srt/managers/scheduler.py", line 3100, in run',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.",
    ]
    kinds = [kind for kind, _ in SGLang().fatal_lines(log)]
    assert kinds == ["crashed", "oom"]
