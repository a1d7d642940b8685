"""Study files for the SGLang emulator: a local target on a free port, the emulator started fast (x1000), tokens at
four times the model's speed (where one client keeps up with a small workload even on a busy 2-core machine; at ten
times it fell behind at concurrency 4 now and then), and a small workload."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from autotune.testing.ports import free_port

SPEC_SPACE = """
[space.speculative-num-steps]
type = "int"
low = 1
high = 8
[space.speculative-eagle-topk]
type = "categorical"
choices = [1, 2, 4, 8]
[space.speculative-num-draft-tokens]
type = "int"
low = 2
high = 32
"""


def one_config_space(steps: int, topk: int, draft: int) -> str:
    """A space of one config: every study trial measures it, and `sim surface --study` computes its truth alone."""
    return "".join(f'[space.{name}]\ntype = "categorical"\nchoices = [{value}]\n' for name, value in (
        ("speculative-num-steps", steps), ("speculative-eagle-topk", topk), ("speculative-num-draft-tokens", draft)))


def write_study(
    directory: Path,
    name: str = "t",
    *,
    launches: int = 6,
    sampler: str = "tpe",
    objective: str = "weighted",
    space: str = SPEC_SPACE,
    args: dict[str, Any] | None = None,
    workload: str = "max_tokens = 48\nconcurrency = [1, 4]\nrequests = 4\n"
                    "window_generations = 1\nwarmup = 1\ntolerance = 0.5",
    health: str = "interval = 0.25\ntimeout = 30",
    extra: str = "",
    port: int | None = None,
    seed: int | None = 7,
    command: list[str] | None = None,
) -> Path:
    """A study file in ``directory``; ``args`` adds to / overrides the fixed engine args; ``command``: the server
    command (the emulator's by default)."""
    fixed: dict[str, Any] = {
        "model-path": "/shared/models/Qwen3.5-122B-A10B",
        "tp-size": 4,
        "speculative-algorithm": "EAGLE",
        "speculative-num-steps": 1,
        "speculative-eagle-topk": 1,
        "speculative-num-draft-tokens": 2,
        "sim-time-scale": 0.001,
        "sim-speedup": 4,
    }
    fixed.update(args or {})
    arg_lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in fixed.items() if v is not None)
    seed_line = f"seed = {seed}\n" if seed is not None else ""
    text = f"""[study]
launches = {launches}
sampler = "{sampler}"
objective = "{objective}"
{seed_line}
[target]
kind = "local"
server_port = {port or free_port()}

[engine]
kind = "sglang"
command = {json.dumps(command or ["autotune-sim"])}

[engine.args]
{arg_lines}
{space}
[workload]
{workload}

[health]
{health}
{extra}
"""
    path = directory / f"{name}.toml"
    path.write_text(text)
    return path


def write_multi(directory: Path, storage: str, targets: list[str], launches: int, time_scale: float = 0.01,
                speedup: float = 10) -> tuple[Path, dict[str, int]]:
    """A study of several local targets (one worker each, on its own free port) sharing ``storage``: its file and
    each target's port. ``time_scale`` and ``speedup`` are the emulator's --sim-time-scale and --sim-speedup."""
    ports = {name: free_port() for name in targets}
    tables = "".join(f'[targets.{name}]\nkind = "local"\nserver_port = {port}\n\n' for name, port in ports.items())
    text = f"""[study]
launches = {launches}
storage = "{storage}"
heartbeat = 1
seed = 3

{tables}
[engine]
kind = "sglang"
command = ["autotune-sim"]

[engine.args]
model-path = "/shared/models/Qwen3.5-122B-A10B"
tp-size = 4
speculative-algorithm = "EAGLE"
speculative-num-steps = 1
speculative-eagle-topk = 1
speculative-num-draft-tokens = 2
sim-time-scale = {time_scale}
sim-speedup = {speedup}
{SPEC_SPACE}
[workload]
max_tokens = 48
concurrency = [1, 4]
requests = 4
window_generations = 1
warmup = 1
tolerance = 0.5

[health]
interval = 0.25
timeout = 30
"""
    path = directory / "multi.toml"
    path.write_text(text)
    return path, ports


def port_of(study: Path) -> int:
    """The server port a study file's (only) target uses."""
    return int(re.search(r"server_port = (\d+)", study.read_text()).group(1))
