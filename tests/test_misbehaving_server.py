"""A server that misbehaves never holds the tuner: each mode of tests/support/misbehaving_server.py ends its trial
with a named reason within a stated bound (each measured time printed), without a traceback."""
from __future__ import annotations

import time

import pytest

from autotune.bringup import VERIFY_SECONDS, verify
from autotune.engines import get_engine
from autotune.errors import TrialFailure
from autotune.testing.ports import free_port
from tests.support.misbehaving_server import MisbehavingServer

ENGINE = get_engine("sglang")
#: the server's speculative config: one verify step yields at most 2 tokens
FLAGS = ("--speculative-algorithm", "EAGLE", "--speculative-num-draft-tokens", "2")


@pytest.mark.parametrize("mode, reason, bound", [
    ("endless-body", "bad_response", 15.0),                     # read up to its cap, 8 MiB
    pytest.param("trickle", "unresponsive", VERIFY_SECONDS + 15, marks=pytest.mark.slow),  # a byte a second
])
def test_a_configuration_that_never_ends_fails_verification_within_its_deadline(mode: str, reason: str,
                                                                               bound: float) -> None:
    with MisbehavingServer(mode, free_port(), *FLAGS) as server:
        started = time.monotonic()
        with pytest.raises(TrialFailure) as failure:
            verify(server.url, ENGINE, {"speculative-num-draft-tokens": 2}, {})
        took = time.monotonic() - started
    print(f"{mode}: {failure.value.reason} after {took:.1f} s ({failure.value.detail})")
    assert failure.value.reason == reason and took < bound
