"""Write an import-only stand-in for torchvision into a venv's site-packages (scripts/build-sglang-cpu.sh).

PyPI's torchvision is built against a CUDA torch and fails to import beside the CPU build ("operator torchvision::nms
does not exist"). SGLang's multimodal helpers and transformers' image utilities import names from it when their
modules load; serving or resolving for a text model never calls them. Every name exists and raises when used.

    python torchvision_stand_in.py SITE_PACKAGES
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

SUBPACKAGES = ("", "io", "transforms", "transforms/functional", "transforms/v2", "transforms/v2/functional")

STAND_IN = '''"""Import-only stand-in for torchvision (scripts/build-sglang-cpu.sh): imported, never used; using a name
raises."""
import enum

__version__ = "0.0.0+stand.in"


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class ImageReadMode(enum.Enum):
    UNCHANGED = 0
    GRAY = 1
    GRAY_ALPHA = 2
    RGB = 3
    RGB_ALPHA = 4


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    class Unavailable:
        def __init__(self, *args, **kwargs):
            raise RuntimeError(f"torchvision.{name} is a stand-in in this venv")

    Unavailable.__name__ = name
    return Unavailable
'''


def write(site: Path) -> None:
    root = site / "torchvision"
    shutil.rmtree(root, ignore_errors=True)
    for sub in SUBPACKAGES:
        package = root / sub
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text(STAND_IN)


if __name__ == "__main__":
    write(Path(sys.argv[1]))
