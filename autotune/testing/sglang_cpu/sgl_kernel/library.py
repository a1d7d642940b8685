"""The ``sgl_kernel`` torch library: SGLang calls these ops as ``torch.ops.sgl_kernel.NAME``."""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

F = TypeVar("F", bound=Callable[..., object])

LIBRARY = torch.library.Library("sgl_kernel", "DEF")


def op(schema: str) -> Callable[[F], F]:
    """Register the decorated function as the op ``schema`` declares (its name is the schema's), for every backend:
    the tensors are CPU tensors, and a few ops take none."""
    name = schema.split("(", 1)[0]

    def register(fn: F) -> F:
        LIBRARY.define(schema)
        LIBRARY.impl(name, fn, "CompositeExplicitAutograd")
        return fn

    return register
