"""systemd unit-file text: the ssh-systemd target's drop-in and the service unit `autotune best --format unit` prints.

ExecStart quoting (systemd.service(5), "Command lines"): every word is written in double quotes with C escapes for
``\\``, ``"`` and control characters; ``%`` is doubled (specifiers are expanded everywhere in the line, quotes or
not) and ``$`` is doubled (environment variables are substituted in every argument). A quoted lone ``;`` is an
argument, not a command separator. The executable (first word) must be a plain path or name: systemd expands no
variables there and reads ``-@:+!`` prefixes from it, so anything else is refused before deploying.

Secrets never go in a drop-in: every user can read a unit's ``Environment=`` and ``ExecStart=`` through systemd's
D-Bus properties (``systemctl show``), whatever the file's mode. Secret variables go in an ``EnvironmentFile=`` of
mode 0600 (systemd.exec(5) format: double quotes, ``\\``, ``"``, ``$`` and backquote escaped), which only root reads.
"""
from __future__ import annotations

import re
import time
from collections.abc import Mapping

from autotune.errors import TrialFailure

_EXECUTABLE = re.compile(r"[A-Za-z0-9_./+=,][A-Za-z0-9_./+=,@:-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9_./+=,@:%-]*")


def _c_escape(text: str) -> str:
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out).replace("%", "%%")


def exec_word(word: str) -> str:
    """One argument of an ExecStart= line, reaching the process exactly as ``word``."""
    return '"' + _c_escape(word).replace("$", "$$") + '"'


def exec_line(argv: list[str]) -> str:
    """The value of ExecStart= for ``argv``; raises ``TrialFailure`` for an executable systemd cannot take."""
    if not argv:
        raise TrialFailure("deploy_failed", "empty server command")
    if not _EXECUTABLE.fullmatch(argv[0]):
        raise TrialFailure("deploy_failed", f"server command {argv[0]!r} cannot be an ExecStart= executable: use a "
                                            "plain absolute path (no spaces, quotes, '$' or '%', no leading -@:+!)")
    return " ".join([exec_word(argv[0]), *(exec_word(a) for a in argv[1:])])


def environment_line(name: str, value: str) -> str:
    """The value of one Environment= assignment (no ``$`` expansion happens there; specifiers do)."""
    if not _ENV_NAME.fullmatch(name):
        raise TrialFailure("deploy_failed", f"invalid environment variable name {name!r}")
    return '"' + _c_escape(f"{name}={value}") + '"'


def environment_file(env: Mapping[str, str]) -> str:
    """The text of an EnvironmentFile= holding ``env``: each value reaches the process exactly as given."""
    lines = []
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name):
            raise TrialFailure("deploy_failed", f"invalid environment variable name {name!r}")
        quoted = "".join("\\" + ch if ch in '\\"$`' else ch for ch in value)
        lines.append(f'{name}="{quoted}"')
    return "\n".join(lines) + "\n" if lines else ""


def path_line(path: str) -> str:
    """A plain absolute path as the value of a path setting (EnvironmentFile=): specifiers escaped."""
    if not _PLAIN_PATH.fullmatch(path):
        raise TrialFailure("deploy_failed", f"{path!r} cannot be named in a unit file: use a plain absolute path")
    return path.replace("%", "%%")


def render_dropin(argv: list[str], env: Mapping[str, str], unit: str, path: str, note: str = "",
                  env_file: str | None = None) -> str:
    """A drop-in that replaces the unit's ExecStart= (and adds Environment= lines, and an EnvironmentFile= that holds
    the secret ones)."""
    lines = [
        f"# Written by autotune{' (' + note + ')' if note else ''} at {time.strftime('%Y-%m-%d %H:%M:%S')}.",
        "# The unit's own file is untouched. To go back by hand:",
        f"#   rm {path} && systemctl daemon-reload && systemctl restart {unit}",
        "[Service]",
        "ExecStart=",
        f"ExecStart={exec_line(argv)}",
    ]
    lines += [f"Environment={environment_line(k, v)}" for k, v in env.items()]
    if env_file is not None:
        lines.append(f"EnvironmentFile={path_line(env_file)}")
    return "\n".join(lines) + "\n"


def dropin_problem(text: str) -> str | None:
    """Why ``text`` is not shaped like a drop-in ``render_dropin`` writes (None when it is): only comments,
    ``[Service]``, a reset ``ExecStart=``, one quoted ``ExecStart="..."`` (no ``-@:+!`` prefix, which would change how
    systemd runs it), quoted ``Environment="..."`` lines and one plain ``EnvironmentFile=`` path. The shape says
    nothing of who wrote it: what a restore installs comes from autotune's own copy of the backup."""
    starts = files = 0
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#") or s in ("[Service]", "ExecStart="):
            continue
        if s.startswith('ExecStart="') and s.endswith('"') and starts == 0:
            starts += 1
            continue
        if s.startswith('Environment="') and s.endswith('"'):
            continue
        if s.startswith("EnvironmentFile=") and files == 0 and _PLAIN_PATH.fullmatch(s.split("=", 1)[1]):
            files += 1
            continue
        return f"line {n}: {s[:80]!r}"
    return None


def render_service(argv: list[str], env: Mapping[str, str], description: str, header: list[str]) -> str:
    """A whole service unit running ``argv``; ``header`` lines are written first as comments."""
    lines = [f"# {line}" if line else "#" for line in header]
    lines += [
        "",
        "[Unit]",
        f"Description={description}",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=exec",
        "# User=  (the account that should run the server)",
        f"ExecStart={exec_line(argv)}",
        *(f"Environment={environment_line(k, v)}" for k, v in env.items()),
        "KillMode=control-group",
        "Restart=on-failure",
        "RestartSec=10",
        "LimitNOFILE=65536",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"
