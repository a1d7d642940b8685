"""What SGLang's CPU start-up asks of the kernels (srt/distributed/bootstrap.py, parallel_state.py): binding the
OpenMP threads to cores, and the shared-memory collectives of tensor parallelism, which one process (tp 1) never
needs."""
from __future__ import annotations

import os

import torch

from .library import op


def _cpus(spec: str) -> list[int]:
    """'0-3,6' -> [0, 1, 2, 3, 6]."""
    out: list[int] = []
    for part in filter(None, spec.replace("|", ",").split(",")):
        low, _, high = part.partition("-")
        out += range(int(low), int(high or low) + 1)
    return out


@op("init_cpu_threads_env(str cpu_ids) -> str")
def init_cpu_threads_env(cpu_ids: str) -> str:
    """torch's threads: one per CPU named, or OMP_NUM_THREADS where the server's environment sets it (no binding to
    cores: the machine is shared with the tests that drive it, and a thread bound to a busy core stalls the
    others at every barrier)."""
    wanted = os.environ.get("OMP_NUM_THREADS", "")
    threads = int(wanted) if wanted.isdigit() and int(wanted) > 0 else len(_cpus(cpu_ids))
    if threads:
        torch.set_num_threads(threads)
    return f"{torch.get_num_threads()} OpenMP threads for CPUs {cpu_ids}"


@op("initialize(int size, int rank) -> ()")
def initialize(size: int, rank: int) -> None:
    if size != 1:
        raise NotImplementedError("the shared-memory collectives of tensor parallelism (tp > 1)")


@op("shm_allreduce(Tensor(a!) data, int reduce_op) -> ()")
def shm_allreduce(data: torch.Tensor, reduce_op: int) -> None:
    """One rank: the sum over ranks is the data itself."""


@op("shm_allgather(Tensor data, int dim) -> Tensor")
def shm_allgather(data: torch.Tensor, dim: int) -> torch.Tensor:
    return data.clone()
