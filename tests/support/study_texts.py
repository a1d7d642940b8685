"""Study files for offline checks (loading, the space, bad input): VALID is a small valid study, WIDE the same with
SGLang's whole speculative space."""
from __future__ import annotations

from pathlib import Path

from autotune.engines import get_engine
from autotune.studyfile.space import Space
from autotune.studyfile.spec import read_study_file

STEPS, TOPK, DRAFT = "speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens"

VALID = """
[study]
trials = 10
[target]
kind = "local"
server_port = 31555
[engine]
kind = "sglang"
command = ["autotune-sim"]
[engine.args]
model-path = "/m"
speculative-algorithm = "EAGLE"
[space.speculative-num-steps]
type = "int"
low = 1
high = 4
[space.speculative-eagle-topk]
type = "categorical"
choices = [1, 2]
[space.speculative-num-draft-tokens]
type = "int"
low = 2
high = 8
"""
WIDE = VALID.replace("high = 4", "high = 8").replace("choices = [1, 2]", "choices = [1, 2, 4, 8]") \
    .replace("low = 2\nhigh = 8", "low = 2\nhigh = 32")


def write(tmp_path: Path, text: str, name: str = "s") -> Path:
    """``text`` as the study file NAME.toml in ``tmp_path``."""
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def space_of(tmp_path: Path, text: str = WIDE) -> Space:
    """The search space of the study ``text`` (SGLang, the target's port 31555)."""
    return Space(read_study_file(str(write(tmp_path, text))), get_engine("sglang"), 31555)
