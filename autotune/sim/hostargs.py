"""SGLang 0.5.23's argument resolution as a library, the way a tuner asks a host's SGLang about a config before it
launches one: ``prepare_server_args(argv)``, then ``.resolve_once()`` (raises the exception SGLang would) and
``.resolved_dict()`` (every server field after SGLang's rules). The emulator answers with the same rules it starts
with (args.py), so a question asked of ``autotune-sim`` and a launch of it agree, as they do on SGLang.

``platform(argv)`` says which GPU the emulated host has and which model it serves (the profile's), where a real
host's nvidia-smi and the model's config.json would.
The fault ``old-release`` answers as SGLang before 0.5.23, whose ServerArgs has no ``resolve_once``.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import logging
from typing import Any

from autotune.sim.args import _TYPES, ArgRuleError, build_parser, merge_config, resolve, sim_options
from autotune.sim.flags_table import FLAGS
from autotune.sim.profile import Profile, ProfileError, load_profile

log = logging.getLogger("sglang.srt.server_args")

_BUILTIN_ERRORS = {cls.__name__: cls for cls in (ValueError, AssertionError, TypeError, RuntimeError,
                                                   NotImplementedError, KeyError)}


def apply_forced(ns: argparse.Namespace, warn) -> None:
    """The fault ``force-arg:FLAG=VALUE``: FLAG resolves to VALUE whatever the command line asked, with a
    warning, like SGLang's own forced settings (a backend's page size)."""
    kinds = {entry["dest"]: _TYPES[entry.get("type", "str")] for entry in FLAGS if entry["kind"] == "store"}
    for dest, text in sim_options(ns).faults.forced_args.items():
        value = kinds.get(dest, str)(text)
        if getattr(ns, dest, None) != value:
            warn(f"{dest} is set to {value} (requested {getattr(ns, dest, None)}) by this release's rules")
        setattr(ns, dest, value)


class _ServerArgs:
    """What ``prepare_server_args`` returns before 0.5.23 (fault ``old-release``): no ``resolve_once``."""

    def __init__(self, ns: argparse.Namespace, argv: list[str], profile: Profile) -> None:
        self._ns = ns
        self._argv = argv
        self._profile = profile
        self._fields: dict[str, Any] | None = None


class ServerArgs(_ServerArgs):
    """0.5.23's: the rules run in ``resolve_once``."""

    def resolve_once(self) -> None:
        """Apply SGLang's rules; raises the exception SGLang raises for a config it rejects."""
        if self._fields is not None:
            return
        apply_forced(self._ns, log.warning)
        try:
            self._fields = resolve(self._ns, self._argv, self._profile, log.warning).fields
        except ArgRuleError as e:
            name, _, message = str(e).partition(": ")
            raise _BUILTIN_ERRORS.get(name, RuntimeError)(message if message else name) from None

    def resolved_dict(self) -> dict[str, Any]:
        self.resolve_once()
        assert self._fields is not None
        return dict(self._fields)


def _parse(argv: list[str]) -> tuple[argparse.Namespace, Profile]:
    """Parse like SGLang's launcher: argparse errors print usage and raise SystemExit(2)."""
    parser = build_parser()
    ns = parser.parse_args(merge_config(list(argv), parser))
    try:
        return ns, load_profile(ns.sim_profile)
    except ProfileError as e:
        parser.error(f"argument --sim-profile: {e}")
        raise


_ServerArgs.__name__ = _ServerArgs.__qualname__ = "ServerArgs"


def prepare_server_args(argv: list[str]) -> _ServerArgs:
    """The server's arguments for ``argv`` (the flags after the launcher), unresolved."""
    ns, profile = _parse(argv)
    cls = _ServerArgs if sim_options(ns).faults.old_release else ServerArgs
    return cls(ns, list(argv), profile)


def platform(argv: list[str]) -> dict[str, Any]:
    """The emulated host's GPUs (one name each, as nvidia-smi lists them; the compute capability left to be known
    by the name) and the served model's architecture and name: the profile's."""
    with contextlib.redirect_stderr(io.StringIO()):
        profile = _parse(argv)[1]
    return {"gpus": [profile.hardware.gpu_name] * max(1, profile.hardware.gpus), "capability": "",
            "architecture": profile.model.architecture, "model": profile.name}
