"""systemd unit-file text: the ssh-systemd target's drop-in and the service unit `autotune best --format unit` prints.

ExecStart quoting (systemd.service(5), "Command lines"): every word is written in double quotes with C escapes for
``\\``, ``"`` and control characters; ``%`` is doubled (specifiers are expanded everywhere in the line, quotes or
not) and ``$`` is doubled (environment variables are substituted in every argument). A quoted lone ``;`` is an
argument, not a command separator. The executable (first word) must be a plain path or name: systemd expands no
variables there and reads ``-@:+!`` prefixes from it, so anything else is refused before deploying.
"""
from __future__ import annotations

import re
import time
from collections.abc import Mapping

from autotune.errors import TrialFailure

_EXECUTABLE = re.compile(r"\A[A-Za-z0-9_./+=,][A-Za-z0-9_./+=,@:-]*\Z")
_ENV_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")


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
    if not _EXECUTABLE.match(argv[0]):
        raise TrialFailure("deploy_failed", f"server command {argv[0]!r} cannot be an ExecStart= executable: use a "
                                            "plain absolute path (no spaces, quotes, '$' or '%', no leading -@:+!)")
    return " ".join([exec_word(argv[0]), *(exec_word(a) for a in argv[1:])])


def environment_line(name: str, value: str) -> str:
    """The value of one Environment= assignment (no ``$`` expansion happens there; specifiers do)."""
    if not _ENV_NAME.match(name):
        raise TrialFailure("deploy_failed", f"invalid environment variable name {name!r}")
    return '"' + _c_escape(f"{name}={value}") + '"'


def render_dropin(argv: list[str], env: Mapping[str, str], unit: str, path: str, note: str = "") -> str:
    """A drop-in that replaces the unit's ExecStart= (and adds Environment= lines)."""
    lines = [
        f"# Written by autotune{' (' + note + ')' if note else ''} at {time.strftime('%Y-%m-%d %H:%M:%S')}.",
        "# The unit's own file is untouched. To go back by hand:",
        f"#   rm {path} && systemctl daemon-reload && systemctl restart {unit}",
        "[Service]",
        "ExecStart=",
        f"ExecStart={exec_line(argv)}",
    ]
    lines += [f"Environment={environment_line(k, v)}" for k, v in env.items()]
    return "\n".join(lines) + "\n"


def dropin_problem(text: str) -> str | None:
    """Why ``text`` is not a drop-in ``render_dropin`` could have written (None when it could): only comments,
    ``[Service]``, a reset ``ExecStart=``, one quoted ``ExecStart="..."`` (no ``-@:+!`` prefix, which would change how
    systemd runs it) and quoted ``Environment="..."`` lines."""
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#") or s in ("[Service]", "ExecStart="):
            continue
        if s.startswith(('ExecStart="', 'Environment="')) and s.endswith('"'):
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
