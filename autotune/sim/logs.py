"""SGLang's log lines on stderr ("[YYYY-mm-dd HH:MM:SS TP0] msg"), its tracebacks, and how it dies."""
from __future__ import annotations

import logging
import os
import signal
import sys

DATEFMT = "%Y-%m-%d %H:%M:%S"
# Where a pip-installed SGLang lives; only used to make tracebacks look like SGLang's.
SGLANG_ROOT = "/usr/local/lib/python3.12/dist-packages/sglang"

# Stack frames SGLang shows when its scheduler fails in each phase: (file under sglang/, line, function, code).
_FRAMES: dict[str, list[tuple[str, int, str, str]]] = {
    "scheduler": [
        ("srt/managers/scheduler.py", 6361, "run_scheduler_process", "scheduler = Scheduler(server_args, port_args)"),
    ],
    "load": [
        ("srt/managers/scheduler.py", 633, "__init__", "self.init_model_worker()"),
        ("srt/managers/tp_worker.py", 352, "__init__", "self.model_runner = ModelRunner("),
        ("srt/model_executor/model_runner.py", 1308, "load_model", "self.model = get_model("),
    ],
    "kv": [
        ("srt/managers/scheduler.py", 633, "__init__", "self.init_model_worker()"),
        ("srt/model_executor/model_runner.py", 1491, "init_memory_pool",
         "config = self.kv_cache_configurator.configure("),
        ("srt/mem_cache/kv_cache_configurator.py", 3183, "_resolve_memory_pool_config",
         "config = self.config_from_budget(available_bytes)"),
    ],
    "graph": [
        ("srt/managers/scheduler.py", 633, "__init__", "self.init_model_worker()"),
        ("srt/model_executor/model_runner_components/cuda_graph_setup.py", 773, "capture_decode_graph",
         "runner = GraphRunnerCls(model_runner)"),
        ("srt/model_executor/runner/decode_cuda_graph_runner.py", 601, "__init__", "raise Exception("),
    ],
    "adaptive_graph": [
        ("srt/managers/scheduler.py", 633, "__init__", "self.init_model_worker()"),
        ("srt/speculative/eagle_worker_v2.py", 262, "__init__", "self.adaptive_controller.init_states("),
        ("srt/speculative/adaptive_runtime_state.py", 118, "init_states",
         "state = self.worker.build_adaptive_runtime_state("),
        ("srt/speculative/eagle_worker_v2.py", 1490, "build_adaptive_runtime_state",
         "target_graph_runner = TargetGraphRunnerCls("),
        ("srt/model_executor/runner/decode_cuda_graph_runner.py", 601, "__init__", "raise Exception("),
    ],
    "capture": [
        ("srt/model_executor/runner/decode_cuda_graph_runner.py", 598, "__init__", "self.capture()"),
        ("srt/model_executor/runner/decode_cuda_graph_runner.py", 731, "capture", "self._capture_one(bs)"),
    ],
    "running": [
        ("srt/managers/scheduler.py", 6367, "run_scheduler_process", "scheduler.run_event_loop()"),
        ("srt/managers/scheduler.py", 1702, "event_loop_overlap", "batch_result = self.run_batch(batch)"),
        ("srt/speculative/eagle_worker_v2.py", 919, "draft_forward",
         "parent_list, top_scores_index, draft_tokens = organize_draft_results("),
    ],
    # a tree (topk > 1) of fewer draft tokens than steps + 1, at its first verify (seen on the real 0.5.23 server)
    "verify": [
        ("srt/managers/scheduler.py", 6368, "run_scheduler_process", "scheduler.run_event_loop()"),
        ("srt/managers/scheduler.py", 4829, "run_batch", "batch_result = self.model_worker.forward_batch_generation("),
        ("srt/speculative/eagle_worker_v2.py", 1980, "verify", "return run_eagle_verify("),
        ("srt/speculative/eagle_worker_common.py", 775, "run_eagle_verify", "predict = _finalize_accept_tree_path("),
        ("srt/speculative/eagle_worker_common.py", 511, "_finalize_accept_tree_path",
         "predict = _compact_accept_to_front("),
        ("srt/speculative/eagle_worker_common.py", 543, "_compact_accept_to_front",
         "out.view(bs, nd, *x.shape[1:])[:, :s1] = gathered.view(bs, s1, *x.shape[1:])"),
    ],
}


def setup(level: str, prefix: str) -> tuple[logging.Logger, logging.Logger]:
    """Loggers of the launching process and of scheduler rank 0, each flushing every line to stderr.

    ``level`` is SGLang's --log-level; an unknown name fails like SGLang's getattr(logging, ...) does."""
    numeric = getattr(logging, level.upper())
    loggers = []
    for name, fmt in (("sglang.launcher", "[%(asctime)s] %(message)s"),
                      ("sglang.scheduler", f"[%(asctime)s{prefix}] %(message)s")):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(fmt, DATEFMT))
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.propagate = False
        logger.setLevel(numeric)
        loggers.append(logger)
    return loggers[0], loggers[1]


def traceback_text(phase: str, exception: str, cause: str | None = None) -> str:
    """A Python traceback as SGLang's get_exception_traceback() formats a scheduler failure in ``phase``.

    With ``cause`` the exception was raised while handling ``cause`` (Python's chained traceback)."""
    def block(frames: list[tuple[str, int, str, str]], last: str) -> list[str]:
        lines = ["Traceback (most recent call last):"]
        for file, line, func, code in frames:
            lines.append(f'  File "{SGLANG_ROOT}/{file}", line {line}, in {func}')
            lines.append(f"    {code}")
        return [*lines, last]

    lines = []
    if cause is not None:
        lines += block(_FRAMES["capture"], cause)
        lines += ["", "During handling of the above exception, another exception occurred:", ""]
    lines += block(_FRAMES["scheduler"] + _FRAMES[phase], exception)
    return "\n".join(lines) + "\n"


def config_traceback(exception: str) -> str:
    """The traceback Python prints when SGLang's launcher cannot merge a --config file."""
    frames = [
        ("<frozen runpy>", 198, "_run_module_as_main", None),
        ("<frozen runpy>", 88, "_run_code", None),
        (f"{SGLANG_ROOT}/launch_server.py", 90, "<module>", "server_args = prepare_server_args(sys.argv[1:])"),
        (f"{SGLANG_ROOT}/srt/server_args.py", 8127, "prepare_server_args",
         "argv = config_merger.merge_config_with_args(argv)"),
        (f"{SGLANG_ROOT}/srt/utils/server_args_config_parser.py", 81, "merge_config_with_args",
         "config_data = self._parse_yaml_config(config_file_path)"),
    ]
    return _traceback(frames, exception)


def _traceback(frames: list[tuple[str, int, str, str | None]], exception: str) -> str:
    lines = ["Traceback (most recent call last):"]
    for file, line, func, code in frames:
        lines.append(f'  File "{file}", line {line}, in {func}')
        if code:
            lines.append(f"    {code}")
    lines.append(exception)
    return "\n".join(lines)


def launcher_traceback(exception: str, inner: list[tuple[str, int, str, str]] | None = None) -> str:
    """The traceback Python prints when argument resolution raises in `python -m sglang.launch_server`.

    ``inner`` are the frames below the resolution pipeline (file under sglang/, line, function, code); by default
    the speculative hook calling the algorithm's argument handler."""
    inner = inner or [("srt/arg_groups/speculative_hook.py", 286, "handle_speculative_decoding",
                       "algo.handle_server_args(server_args)")]
    frames = [
        ("<frozen runpy>", 198, "_run_module_as_main", None),
        ("<frozen runpy>", 88, "_run_code", None),
        (f"{SGLANG_ROOT}/launch_server.py", 92, "<module>", "run_server(server_args)"),
        (f"{SGLANG_ROOT}/launch_server.py", 28, "run_server", "server_args.resolve_once()"),
        (f"{SGLANG_ROOT}/srt/server_args.py", 364, "resolve_once", "run_resolution_pipeline(self)"),
        *((f"{SGLANG_ROOT}/{file}", line, func, code) for file, line, func, code in inner),
    ]
    return _traceback(frames, exception)


def die(launcher: logging.Logger, scheduler: logging.Logger, phase: str, exception: str, running: bool,
        cause: str | None = None) -> None:
    """Report a scheduler failure the way SGLang does, then SIGKILL this process (its whole tree), rc -9.

    ``running`` selects the SIGQUIT handler in force: the launch-phase one or the tokenizer manager's."""
    scheduler.error(f"Scheduler hit an exception: {traceback_text(phase, exception, cause)}")
    if running:
        # the tokenizer manager's handler, its crash diagnostics on (SGLANG_PYSPY_DUMP_BEFORE_CRASH's default); the
        # real one then sleeps 5 s before looking for the scheduler, which nothing here waits for
        launcher.error("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
        launcher.info("Sleeping 5 seconds before crash diagnostics to let GPU activity settle.")
        launcher.error("No live scheduler processes found; skipping py-spy and CUDA coredump.")
    else:
        launcher.error("Received sigquit from a child process. It usually means the child failed.")
    kill_process_tree(launcher)


def kill_process_tree(launcher: logging.Logger) -> None:
    """SGLang's kill_process_tree(os.getpid()): log it, then SIGKILL ourselves (exit status -9)."""
    pid = os.getpid()
    launcher.info(f"kill_process_tree called: parent_pid={pid}, include_parent=True, pid={pid}")
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(pid, signal.SIGKILL)
