"""Study files for the real SGLang on this CPU, made from the shipped ones (studies/sglang-cpu*.toml): their paths
into the cache and to their datasets made absolute, their sections changed where a test says so."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import tomli_w

from autotune.testing import sglang_cpu

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

STUDIES = Path(__file__).resolve().parents[2] / "studies"


def _absolute(value: Any) -> Any:
    """A path the shipped study names relative to studies/ ("../.cache/...", "NAME.jsonl"), absolute."""
    if isinstance(value, str) and value.startswith("../.cache/sglang-cpu/"):
        return str(sglang_cpu.cache_dir() / value.removeprefix("../.cache/sglang-cpu/"))
    if isinstance(value, str) and value.endswith(".jsonl") and "/" not in value:
        return str(STUDIES / value)
    return value


def real_study(directory: Path, base: str = "sglang-cpu", name: str = "t", **sections: dict[str, Any]) -> Path:
    """``studies/BASE.toml`` as a study NAME in ``directory``; each keyword replaces keys of that section (``study``,
    ``workload``, ``engine_args``...; a value None removes the key; ``space`` replaces the whole [space], ``target``
    the whole [target])."""
    data = tomllib.loads((STUDIES / f"{base}.toml").read_text())
    data["engine"]["command"] = [_absolute(v) for v in data["engine"]["command"]]
    data["engine"]["args"] = {k: _absolute(v) for k, v in data["engine"]["args"].items()}
    data["workload"] = {k: _absolute(v) for k, v in data["workload"].items()}
    for section, changes in sections.items():
        if section in ("space", "target"):
            data[section] = changes
            continue
        table = data["engine"]["args"] if section == "engine_args" else data.setdefault(section, {})
        for key, value in changes.items():
            if value is None:
                table.pop(key, None)
            else:
                table[key] = value
    path = directory / f"{name}.toml"
    path.write_text(tomli_w.dumps(data))
    return path
