"""Stand-in ``systemctl``, ``journalctl`` and ``sudo`` for the ssh-systemd tests (systemd cannot run here).

Installed for the test sshd's sessions only: tiny wrappers named systemctl/journalctl/sudo in a directory the test
sshd puts first on PATH (``SetEnv``) call ``fake_systemd.py systemctl ...``. State lives under
``$AUTOTUNE_FAKE_SYSTEMD``::

    system/NAME.service, system/NAME.service.d/*.conf   unit files and drop-ins (the target's unit_dir)
    state/NAME.json                                      loaded config and runtime state of each unit
    journal.jsonl                                        every journal entry: {"seq", "t", "unit", "inv", "msg"}

Behaviour kept close to systemd where the target depends on it: a unit's files are read only at daemon-reload (a
forgotten reload runs the old command line), drop-ins apply in file-name order and ``ExecStart=`` (empty) resets
the list, ExecStart= is split by systemd's rules (specifiers and ``%%``, double/single quotes with C escapes, a
lone unquoted ``;`` separates commands, ``$$``, ``${VAR}`` and whole-word ``$VAR`` substitution), the service runs
in its own process group with systemd's minimal environment plus Environment= and EnvironmentFile= (read at each
start, as systemd does, with its quoting: ``"..."`` with ``\\``, ``"``, ``$`` and backquote escaped, ``'...'``
literal; a leading ``-`` tolerates a missing file), its output goes to the journal
tagged with the start's invocation id (systemd's own "Started"/"Stopped" messages carry none), and ``show`` reports
ActiveState/SubState/Result/ExecMainCode/ExecMainStatus/MainPID/InvocationID like systemd (code 1 = exited,
2 = killed by signal).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(os.environ.get("AUTOTUNE_FAKE_SYSTEMD", "/tmp/fake-systemd"))
UNIT_DIR = ROOT / "system"
STATE_DIR = ROOT / "state"
JOURNAL = ROOT / "journal.jsonl"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STOP_TIMEOUT = 10.0


# -- small utilities -----------------------------------------------------------------------------------------
class Locked:
    def __init__(self, name: str) -> None:
        ROOT.mkdir(parents=True, exist_ok=True)
        self.path = ROOT / f".{name}.lock"

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def journal(unit: str | None, inv: str | None, msg: str, about: str | None = None) -> None:
    """Append an entry: ``inv`` for the service's own output (_SYSTEMD_INVOCATION_ID), ``about`` for the
    manager's messages about an invocation (INVOCATION_ID)."""
    with Locked("journal"):
        seq = 0
        counter = ROOT / ".journal.seq"
        if counter.exists():
            seq = int(counter.read_text() or 0)
        seq += 1
        counter.write_text(str(seq))
        with open(JOURNAL, "a", encoding="utf-8") as f:
            f.write(json.dumps({"seq": seq, "t": time.time(), "unit": unit, "inv": inv, "about": about,
                                "msg": msg}) + "\n")


def state_path(unit: str) -> Path:
    return STATE_DIR / f"{unit}.json"


def load_state(unit: str) -> dict:
    try:
        return json.loads(state_path(unit).read_text())
    except (OSError, ValueError):
        return {}


def save_state(unit: str, state: dict) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = state_path(unit).with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(state_path(unit))


def update_state(unit: str, **changes: object) -> dict:
    with Locked(f"state-{unit}"):
        state = load_state(unit)
        state.update(changes)
        save_state(unit, state)
        return state


# -- systemd's syntax ----------------------------------------------------------------------------------------
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"',
            "'": "'", "s": " "}


def specifiers(text: str, unit: str) -> str:
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "%":
            nxt = text[i + 1] if i + 1 < len(text) else ""
            if nxt == "%":
                out.append("%")
            elif nxt == "n":
                out.append(unit)
            elif nxt == "N":
                out.append(unit.rsplit(".", 1)[0])
            else:
                raise ValueError(f"unsupported specifier %{nxt}")
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _unescape(text: str, i: int) -> tuple[str, int]:
    """The C escape at text[i] (just after a backslash) and the index after it."""
    ch = text[i]
    if ch in _ESCAPES:
        return _ESCAPES[ch], i + 1
    if ch == "x":
        return chr(int(text[i + 1:i + 3], 16)), i + 3
    if ch == "u":
        return chr(int(text[i + 1:i + 5], 16)), i + 5
    if ch in "01234567":
        return chr(int(text[i:i + 3], 8)), i + 3
    raise ValueError(f"invalid escape \\{ch}")


def split_words(text: str) -> list[tuple[str, bool]]:
    """systemd's word splitting: [(word, was_a_lone_unquoted_semicolon)]."""
    words: list[tuple[str, bool]] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in " \t":
            i += 1
        if i >= n:
            return words
        if text[i] == ";" and (i + 1 == n or text[i + 1] in " \t"):
            words.append((";", True))
            i += 1
            continue
        if text[i:i + 2] == "\\;" and (i + 2 == n or text[i + 2] in " \t"):
            words.append((";", False))
            i += 2
            continue
        word = []
        if text[i] in "\"'":
            quote = text[i]
            i += 1
            while True:
                if i >= n:
                    raise ValueError("unterminated quote")
                ch = text[i]
                if ch == quote:
                    i += 1
                    break
                if ch == "\\":
                    esc, i = _unescape(text, i + 1)
                    word.append(esc)
                    continue
                word.append(ch)
                i += 1
            if i < n and text[i] not in " \t":
                raise ValueError("a closing quote must be followed by whitespace")
        else:
            while i < n and text[i] not in " \t":
                ch = text[i]
                if ch == "\\":
                    esc, i = _unescape(text, i + 1)
                    word.append(esc)
                    continue
                word.append(ch)
                i += 1
        words.append(("".join(word), False))


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def substitute(word: str, env: dict[str, str]) -> list[str]:
    if word.startswith("$") and _NAME.match(word[1:]):
        return env.get(word[1:], "").split()
    out, i = [], 0
    while i < len(word):
        if word.startswith("$$", i):
            out.append("$")
            i += 2
        elif word.startswith("${", i) and "}" in word[i:]:
            end = word.index("}", i)
            out.append(env.get(word[i + 2:end], ""))
            i = end + 1
        else:
            out.append(word[i])
            i += 1
    return ["".join(out)]


def parse_unit(text: str, into: dict) -> None:
    section = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        while line.endswith("\\") and i < len(lines):
            line = line[:-1] + " " + lines[i].strip()
            i += 1
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if section != "Service" or "=" not in line:
            continue
        key, value = (part.strip() for part in line.split("=", 1))
        if key == "ExecStart":
            if value == "":
                into["ExecStart"] = []
            else:
                into.setdefault("ExecStart", []).append(value)
        elif key in ("Environment", "EnvironmentFile"):
            if value == "":
                into[key] = []
            else:
                into.setdefault(key, []).append(value)
        elif key in ("WorkingDirectory", "Type", "Restart", "User"):
            into[key] = value


def load_unit(unit: str) -> dict:
    fragment = UNIT_DIR / unit
    if not fragment.is_file():
        return {"LoadState": "not-found"}
    config: dict = {"LoadState": "loaded", "FragmentPath": str(fragment)}
    parse_unit(fragment.read_text(), config)
    dropins = sorted((UNIT_DIR / f"{unit}.d").glob("*.conf"), key=lambda p: p.name)
    for path in dropins:
        parse_unit(path.read_text(), config)
    config["DropInPaths"] = [str(p) for p in dropins]
    return config


def read_environment_file(path: str) -> dict[str, str]:
    """systemd's EnvironmentFile= format (the subset autotune writes and common files use)."""
    env: dict[str, str] = {}
    text = Path(path).read_text()
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t\n":
            i += 1
        if i < n and text[i] in "#;":
            while i < n and text[i] != "\n":
                i += 1
            continue
        start = i
        while i < n and text[i] not in "=\n":
            i += 1
        if i >= n or text[i] != "=":
            continue
        key, value = text[start:i].strip(), []
        i += 1
        if i < n and text[i] == '"':
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n:
                    value.append(text[i + 1] if text[i + 1] in '"\\`$' else "\\" + text[i + 1])
                    i += 2
                    continue
                value.append(text[i])
                i += 1
            i += 1
            env[key] = "".join(value)
        elif i < n and text[i] == "'":
            end = text.index("'", i + 1)
            env[key] = text[i + 1:end]
            i = end + 1
        else:
            while i < n and text[i] != "\n":
                value.append(text[i])
                i += 1
            env[key] = "".join(value).rstrip()
    return env


def command_line(unit: str, config: dict) -> tuple[list[str], dict[str, str]]:
    env = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", "INVOCATION_ID": ""}
    for assignment in config.get("Environment", []):
        for word, _ in split_words(specifiers(assignment, unit)):
            if "=" in word:
                k, v = word.split("=", 1)
                env[k] = v
    for setting in config.get("EnvironmentFile", []):
        path = specifiers(setting, unit)
        try:
            env.update(read_environment_file(path.lstrip("-")))
        except OSError:
            if not path.startswith("-"):
                raise ValueError(f"Failed to load environment files: {path}") from None
    lines = config.get("ExecStart") or []
    if len(lines) != 1:
        raise ValueError(f"Type=simple needs exactly one ExecStart=, got {len(lines)}")
    words = split_words(specifiers(lines[0], unit))
    if any(sep for _, sep in words):
        raise ValueError("more than one command line in ExecStart= of a Type=simple service")
    argv = [words[0][0]]
    if argv[0][:1] in "-@:+!":
        raise ValueError(f"executable prefixes are not supported by the stand-in: {argv[0]}")
    for word, _ in words[1:]:
        argv += substitute(word, env)
    return argv, env


# -- systemctl -----------------------------------------------------------------------------------------------
def pgid_alive(pgid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def cmd_daemon_reload(args: list[str]) -> int:
    for unit_file in UNIT_DIR.glob("*.service"):
        with Locked(f"state-{unit_file.name}"):
            state = load_state(unit_file.name)
            state["loaded"] = load_unit(unit_file.name)
            save_state(unit_file.name, state)
    return 0


def cmd_start(unit: str) -> int:
    with Locked(f"state-{unit}"):
        state = load_state(unit)
        if state.get("ActiveState") == "active":
            return 0
        config = state.get("loaded") or load_unit(unit)
        state["loaded"] = config
        if config.get("LoadState") != "loaded":
            print(f"Failed to start {unit}: Unit {unit} not found.", file=sys.stderr)
            return 5
        inv = uuid.uuid4().hex
        state.update(ActiveState="active", SubState="running", Result="success", InvocationID=inv,
                     MainPID=0, ExecMainPID=0, ExecMainCode=0, ExecMainStatus=0)
        save_state(unit, state)
    journal(unit, None, f"Started {unit}.", about=inv)
    # the supervisor: daemonised, so that it outlives this systemctl call and the SSH session
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            supervise(unit, inv, config)
            os._exit(0)
        os._exit(0)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        state = load_state(unit)
        if state.get("MainPID") or state.get("ActiveState") != "active":
            break
        time.sleep(0.02)
    return 0


def supervise(unit: str, inv: str, config: dict) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        argv, env = command_line(unit, config)
    except (ValueError, IndexError) as e:
        journal(unit, None, f"{unit}: invalid ExecStart=: {e}", about=inv)
        finish(unit, inv, 1, 203, "exit-code")
        return
    env["INVOCATION_ID"] = inv
    exe = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=DEFAULT_PATH)
    if not exe:
        journal(unit, None, f"{unit}: Failed to locate executable {argv[0]}: No such file or directory", about=inv)
        finish(unit, inv, 1, 203, "exit-code")
        return
    cwd = config.get("WorkingDirectory") or "/"
    proc = subprocess.Popen([exe, *argv[1:]], env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    update_state(unit, MainPID=proc.pid, ExecMainPID=proc.pid)
    assert proc.stdout is not None
    for raw in proc.stdout:
        journal(unit, inv, raw.decode("utf-8", "replace").rstrip("\n"))
    rc = proc.wait()
    if rc < 0:
        finish(unit, inv, 2, -rc, "signal")
    else:
        finish(unit, inv, 1, rc, "success" if rc == 0 else "exit-code")


def finish(unit: str, inv: str, code: int, status: int, result: str) -> None:
    with Locked(f"state-{unit}"):
        state = load_state(unit)
        if state.get("InvocationID") != inv:
            return
        stopping = state.get("ActiveState") == "deactivating"
        stopped = stopping and code == 2 and status in (signal.SIGTERM, signal.SIGKILL)
        if result == "success" or stopped:
            state.update(ActiveState="inactive", SubState="dead", Result="success")
        else:
            state.update(ActiveState="failed", SubState="failed", Result=result)
        state.update(MainPID=0, ExecMainCode=code, ExecMainStatus=status)
        save_state(unit, state)
    if code == 2:
        journal(unit, None, f"{unit}: Main process exited, code=killed, status={status}/{signal.Signals(status).name}",
                about=inv)
    elif status:
        journal(unit, None, f"{unit}: Main process exited, code=exited, status={status}", about=inv)


def cmd_stop(unit: str) -> int:
    with Locked(f"state-{unit}"):
        state = load_state(unit)
        if state.get("ActiveState") != "active":
            return 0
        pid = int(state.get("MainPID") or 0)
        inv = state.get("InvocationID")
        state.update(ActiveState="deactivating", SubState="stop-sigterm")
        save_state(unit, state)
    journal(unit, None, f"Stopping {unit}...", about=inv)
    if pid:
        for sig, limit in ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
            deadline = time.monotonic() + limit
            while pgid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            if not pgid_alive(pid):
                break
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and load_state(unit).get("ActiveState") == "deactivating":
        time.sleep(0.02)
    with Locked(f"state-{unit}"):
        state = load_state(unit)
        if state.get("InvocationID") == inv and state.get("ActiveState") == "deactivating":
            state.update(ActiveState="inactive", SubState="dead", MainPID=0)
            save_state(unit, state)
    journal(unit, None, f"Stopped {unit}.", about=inv)
    return 0


def cmd_show(args: list[str]) -> int:
    props: list[str] = []
    value_only = False
    units = []
    it = iter(args)
    for a in it:
        if a in ("-p", "--property"):
            props += next(it).split(",")
        elif a.startswith("--property="):
            props += a.split("=", 1)[1].split(",")
        elif a == "--value":
            value_only = True
        elif a.startswith("-"):
            continue
        else:
            units.append(a)
    unit = units[0]
    state = load_state(unit)
    loaded = state.get("loaded") or load_unit(unit)
    known = {
        "Id": unit,
        "LoadState": loaded.get("LoadState", "not-found"),
        "ActiveState": state.get("ActiveState", "inactive"),
        "SubState": state.get("SubState", "dead"),
        "Result": state.get("Result", "success"),
        "MainPID": state.get("MainPID", 0),
        "ExecMainPID": state.get("ExecMainPID", 0),
        "ExecMainCode": state.get("ExecMainCode", 0),
        "ExecMainStatus": state.get("ExecMainStatus", 0),
        "InvocationID": state.get("InvocationID", ""),
        "NRestarts": 0,
        "FragmentPath": loaded.get("FragmentPath", ""),
        "DropInPaths": " ".join(loaded.get("DropInPaths", [])),
        "UnitFileState": "enabled" if loaded.get("LoadState") == "loaded" else "",
        "User": loaded.get("User", ""),
    }
    for prop in props or list(known):
        value = known.get(prop, "")
        print(value if value_only else f"{prop}={value}")
    return 0


def cmd_cat(unit: str) -> int:
    fragment = UNIT_DIR / unit
    if not fragment.is_file():
        print(f"No files found for {unit}.", file=sys.stderr)
        return 1
    parts = [f"# {fragment}\n{fragment.read_text()}"]
    for path in sorted((UNIT_DIR / f"{unit}.d").glob("*.conf"), key=lambda p: p.name):
        parts.append(f"# {path}\n{path.read_text()}")
    print("\n".join(parts), end="")
    return 0


def systemctl(args: list[str]) -> int:
    args = [a for a in args if a not in ("--no-pager", "--no-ask-password", "-q", "--quiet", "--system")]
    if not args:
        print("stand-in systemctl: no command", file=sys.stderr)
        return 1
    cmd, rest = args[0], args[1:]
    if cmd == "daemon-reload":
        return cmd_daemon_reload(rest)
    if cmd == "start":
        return max([cmd_start(u) for u in rest] or [0])
    if cmd == "stop":
        return max([cmd_stop(u) for u in rest] or [0])
    if cmd == "restart":
        for u in rest:
            cmd_stop(u)
        return max([cmd_start(u) for u in rest] or [0])
    if cmd == "show":
        return cmd_show(rest)
    if cmd == "is-active":
        state = load_state(rest[0]).get("ActiveState", "inactive")
        print(state)
        return 0 if state == "active" else 3
    if cmd == "cat":
        return cmd_cat(rest[0])
    print(f"stand-in systemctl: unsupported command {cmd!r}", file=sys.stderr)
    return 1


# -- journalctl ----------------------------------------------------------------------------------------------
FIELDS = {
    "_SYSTEMD_INVOCATION_ID": lambda e: e["inv"],
    "INVOCATION_ID": lambda e: e["about"],
    "_SYSTEMD_UNIT": lambda e: e["unit"] if e["inv"] else None,
    "UNIT": lambda e: e["unit"] if e["about"] or not e["inv"] else None,
}


def _matches(entry: dict, groups: list[dict[str, list[str]]]) -> bool:
    """journalctl's match semantics: same field ORed, different fields ANDed, '+' separates ORed groups."""
    groups = [g for g in groups if g]
    if not groups:
        return True
    return any(all(FIELDS[k](entry) in values for k, values in g.items()) for g in groups)


def journalctl(args: list[str]) -> int:
    units: list[str] = []
    groups: list[dict[str, list[str]]] = [{}]
    output, show_cursor, after, since, lines = "short", False, None, None, None
    it = iter(args)
    for a in it:
        if a in ("-u", "--unit"):
            units.append(next(it))
        elif a.startswith("--unit="):
            units.append(a.split("=", 1)[1])
        elif a in ("-o", "--output"):
            output = next(it)
        elif a.startswith("--output="):
            output = a.split("=", 1)[1]
        elif a == "--show-cursor":
            show_cursor = True
        elif a.startswith("--after-cursor="):
            after = a.split("=", 1)[1]
        elif a == "--after-cursor":
            after = next(it)
        elif a.startswith("--since="):
            since = a.split("=", 1)[1]
        elif a in ("-S", "--since"):
            since = next(it)
        elif a in ("-n", "--lines"):
            lines = int(next(it))
        elif a in ("--no-pager", "-q", "--quiet", "--no-hostname"):
            continue
        elif a == "+":
            groups.append({})
        elif "=" in a and not a.startswith("-") and a.split("=", 1)[0] in FIELDS:
            k, v = a.split("=", 1)
            groups[-1].setdefault(k, []).append(v)
        else:
            print(f"stand-in journalctl: unsupported option or match {a!r}", file=sys.stderr)
            return 1
    after_seq = int(after.rsplit("i=", 1)[1]) if after else 0
    since_t = float(since[1:]) if since and since.startswith("@") else None
    entries = []
    if JOURNAL.exists():
        for raw in JOURNAL.read_text(encoding="utf-8").splitlines():
            e = json.loads(raw)
            if e["seq"] <= after_seq or (units and e["unit"] not in units) or not _matches(e, groups):
                continue
            if since_t is not None and e["t"] < since_t:
                continue
            entries.append(e)
    if lines is not None:
        entries = entries[-lines:] if lines else []
    for e in entries:
        if output == "cat":
            print(e["msg"])
        else:
            stamp = time.strftime("%b %d %H:%M:%S", time.localtime(e["t"]))
            print(f"{stamp} localhost {e['unit'] or 'systemd'}: {e['msg']}")
    if show_cursor and entries:
        print(f"-- cursor: s=fake;i={entries[-1]['seq']}")
    return 0


def sudo(args: list[str]) -> int:
    while args and args[0].startswith("-"):
        args = args[1:]
    ROOT.mkdir(parents=True, exist_ok=True)
    with open(ROOT / "sudo.log", "a", encoding="utf-8") as f:
        f.write(json.dumps(args) + "\n")
    os.execvp(args[0], args)
    return 127


def main() -> int:
    tool, args = sys.argv[1], sys.argv[2:]
    if tool == "systemctl":
        return systemctl(args)
    if tool == "journalctl":
        return journalctl(args)
    if tool == "sudo":
        return sudo(args)
    print(f"unknown stand-in {tool}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
