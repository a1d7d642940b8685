"""Faults the emulator injects on demand (``--sim-fault SPEC``, repeatable); the specs are listed in autotune.sim."""
from __future__ import annotations

import argparse
import dataclasses

# name -> (kind of argument, description); kind None means the spec takes no ":VALUE".
FAULTS: dict[str, tuple[str | None, str]] = {
    "startup-crash": (None, "die after the weights load, like a scheduler exception (rc -9)"),
    "startup-hang": (None, "never open the port and never exit"),
    "warmup-hang": (None, "open the port but never finish warm-up (/health stays 503)"),
    "slow-start": ("seconds", "add SECONDS of real time to weight loading (not scaled)"),
    "crash-after": ("tokens", "die like a scheduler crash once TOKENS tokens were generated in total (rc -9)"),
    "oom-under-load": ("requests", "CUDA OOM and die when the running batch exceeds REQUESTS requests (rc -9)"),
    "stall-after": ("tokens", "stop all generation once TOKENS tokens were generated; stay alive and healthy"),
    "errors": ("fraction", "fail that FRACTION of generation requests with an internal error (HTTP 500 / abort)"),
    "force-arg": ("flag=value", "resolve --FLAG to VALUE whatever is asked, with a warning (a release whose rules "
                                "rewrite what autotune's rules keep)"),
    "old-release": (None, "answer a host resolution as a release before 0.5.23: ServerArgs has no resolve_once"),
}


@dataclasses.dataclass
class Faults:
    """The faults one emulator run injects."""

    startup_crash: bool = False
    startup_hang: bool = False
    warmup_hang: bool = False
    slow_start_s: float = 0.0
    crash_after_tokens: int | None = None
    oom_under_load: int | None = None
    stall_after_tokens: int | None = None
    error_fraction: float = 0.0
    forced_args: dict[str, str] = dataclasses.field(default_factory=dict)  # dest -> value (force-arg)
    old_release: bool = False


def parse_fault(spec: str) -> tuple[str, float | str | None]:
    """argparse ``type=`` for --sim-fault: validates one spec, raising ArgumentTypeError with the valid list."""
    name, _, value = spec.partition(":")
    if name not in FAULTS:
        known = ", ".join(n if FAULTS[n][0] is None else f"{n}:{FAULTS[n][0].upper()}" for n in FAULTS)
        raise argparse.ArgumentTypeError(f"unknown fault {spec!r} (one of: {known})")
    kind = FAULTS[name][0]
    if kind is None:
        if value:
            raise argparse.ArgumentTypeError(f"fault {name!r} takes no value, got {spec!r}")
        return name, None
    if kind == "flag=value":
        flag, equals, forced = value.partition("=")
        if not flag or not equals:
            raise argparse.ArgumentTypeError(f"fault {name!r} needs {name}:FLAG=VALUE, got {spec!r}")
        return name, f"{flag.lstrip('-').replace('-', '_')}={forced}"
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"fault {name!r} needs a number: {name}:{kind.upper()}") from None
    if kind in ("tokens", "requests") and (number != int(number) or number < 0):
        raise argparse.ArgumentTypeError(f"fault {name!r} needs a non-negative integer, got {value!r}")
    if kind == "fraction" and not 0.0 <= number <= 1.0:
        raise argparse.ArgumentTypeError(f"fault {name!r} needs a fraction between 0 and 1, got {value!r}")
    if kind == "seconds" and number < 0:
        raise argparse.ArgumentTypeError(f"fault {name!r} needs non-negative seconds, got {value!r}")
    return name, number


def collect(specs: list[tuple[str, float | str | None]] | None) -> Faults:
    """Combine parsed specs (the last one of a kind wins)."""
    faults = Faults()
    for name, value in specs or []:
        if name == "startup-crash":
            faults.startup_crash = True
        elif name == "startup-hang":
            faults.startup_hang = True
        elif name == "warmup-hang":
            faults.warmup_hang = True
        elif name == "slow-start":
            faults.slow_start_s = float(value or 0.0)
        elif name == "crash-after":
            faults.crash_after_tokens = int(value or 0)
        elif name == "oom-under-load":
            faults.oom_under_load = int(value or 0)
        elif name == "stall-after":
            faults.stall_after_tokens = int(value or 0)
        elif name == "errors":
            faults.error_fraction = float(value or 0.0)
        elif name == "force-arg":
            dest, _, forced = str(value).partition("=")
            faults.forced_args[dest] = forced
        elif name == "old-release":
            faults.old_release = True
    return faults
