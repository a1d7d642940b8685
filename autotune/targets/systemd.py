"""The ssh-systemd target: the server is a systemd service on a remote host; each config is a drop-in.

Why a drop-in and not an edited unit: ``<unit_dir>/<unit>.d/zz-autotune.conf`` resets ``ExecStart=`` and sets the
trial's command line (plus ``Environment=`` lines). The operator's unit file (User=, GPU settings, Restart=, limits,
ExecStartPre=...) is never rewritten or even parsed, so nothing of it can be lost or mangled, and going back is
deleting one file. The ``zz-`` prefix sorts it after the operator's own drop-ins (systemd applies drop-ins in file
name order across /etc, /run and /usr/lib), so an ``override.conf`` with its own ExecStart= cannot shadow the trial.

Secrets stay out of the drop-in (systemd shows a unit's ExecStart= and Environment= to every user, whatever the
file's mode): secret variables go to ``zz-autotune.env`` (its EnvironmentFile=), secret flags to the file the engine
reads them from (``zz-autotune.yaml`` for SGLang's --config), both 0600 beside it; with sudo they are written by
``install`` from its standard input, so no copy is left anywhere. Files of ours the drop-in in place does not name
are removed.

Backup: before the first change, the unit as it is (``systemctl cat``, the fragment file, any existing
zz-autotune.conf, whether it was running) is saved on the target (``<workdir>/unit-<unit>/backup.json``) and a copy
kept locally (``$XDG_STATE_HOME/autotune/backups/``). An existing backup is never overwritten, so it stays the
pre-tuning original across tuner restarts and across tuners on other machines (a missing remote copy is put back
from the local one). ``restore`` installs what autotune's own local copy holds: a target copy that differs from it
is refused, and a target copy without a local one is used only when there is no drop-in to put back. It puts the
drop-in back as it was (removes ours, or restores the file that was there), reloads, restarts the unit if it was
running before tuning, and then archives the backup (renamed ``backup.restored-<time>.json``) so the next study
starts from the unit as it is then.

The unit-file text (ExecStart= quoting) is written by unitfile.py.

Logs: ``journalctl _SYSTEMD_INVOCATION_ID=<id> + INVOCATION_ID=<id>`` (the service's output and systemd's messages
about that start; the id is read right after ``systemctl start``), continued with ``--after-cursor``: exactly this
start, nothing of the previous one's shutdown. Without invocation ids (systemd < 232): ``-u UNIT --since=@<start>``.
Exit status: ``systemctl show`` ActiveState/SubState/ExecMainCode/ExecMainStatus; killed by signal N reads as -N.
"""
from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune import redact
from autotune.errors import TrialFailure, UserError
from autotune.targets.lock_holder import state_dir
from autotune.tables import PLAIN_TOKEN, Reader
from autotune.targets.logfollow import LogFollower
from autotune.targets.base import Deployment
from autotune.targets.start_command import StartCommand
from autotune.targets.remote import FIND_PYTHON, RemoteTarget, program_line
from autotune.targets.ssh import Completed, SSHConnection, SSHSpec, sh_command
from autotune.targets.unitfile import dropin_problem, environment_file, exec_line, render_dropin

DROPIN_STEM = "zz-autotune"
DROPIN_NAME = f"{DROPIN_STEM}.conf"
BACKUP = "backup.json"
SYSTEMCTL_TIMEOUT = 300.0   # start/stop wait for the unit's own TimeoutStartSec/TimeoutStopSec (90 s by default)
LOG_FOLLOW_INTERVAL = 2.0   # seconds between background journal reads into the trial's log file
PORT_SETTLE = 3.0           # after `systemctl stop` returned, the unit's processes are gone: a port held longer than
                            # this is someone else's
SHOW_PROPS = ("ActiveState", "SubState", "Result", "ExecMainCode", "ExecMainStatus", "ExecMainPID", "MainPID",
              "InvocationID", "NRestarts")
#: where systemd (>= 239) looks for an ExecStart= executable given without a path (not the login PATH)
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
UNIT_NAME = re.compile(r"[A-Za-z0-9:_.@-]+\.service")
_RUNNING = ("active", "reloading", "activating", "deactivating")
_CLD_KILLED, _CLD_DUMPED = 2, 3


@dataclass(frozen=True)
class SystemdSpec(SSHSpec):
    """kind = "ssh-systemd": the SSH options, and the unit that runs the server."""

    unit: str = ""
    #: where units and their drop-ins live on the target
    unit_dir: str = "/etc/systemd/system"
    #: run systemctl, journalctl, install and rm through passwordless ``sudo -n``
    sudo: bool = False

    kind = "ssh-systemd"
    keys = (*SSHSpec.keys, "unit", "unit_dir", "sudo")

    @classmethod
    def read(cls, table: dict[str, Any], where: str, reader: Reader) -> dict[str, Any]:
        unit = reader.get(table, where, "unit", str, None)
        if unit is None:
            reader.fail(where, "unit", "is required for kind = \"ssh-systemd\" (e.g. \"sglang.service\")")
        if not UNIT_NAME.fullmatch(unit):
            reader.fail(where, "unit", f"must be a systemd service name ending in .service, got {unit!r}")
        unit_dir = reader.get(table, where, "unit_dir", str, "/etc/systemd/system")
        if not unit_dir.startswith("/") or not PLAIN_TOKEN.fullmatch(unit_dir):
            reader.fail(where, "unit_dir", f"must be an absolute path of plain characters, got {unit_dir!r}")
        return {**super().read(table, where, reader), "unit": unit, "unit_dir": unit_dir,
                "sudo": reader.get(table, where, "sudo", bool, False)}

    @property
    def identity(self) -> str:
        return f"{self.user or ''}@{self.host}:{self.port}:{self.unit}"

    def unit_note(self, study: str) -> list[str]:
        return [f"This study tunes {self.unit} through a drop-in: `autotune apply --study {study}` puts this",
                "config on that unit instead and keeps the unit's own settings."]


def parse_show(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def decode_exit(props: dict[str, str]) -> int:
    """The main process's exit as Deployment.exit_status reports it (negative: killed by that signal)."""
    try:
        code = int(props.get("ExecMainCode") or 0)
        status = int(props.get("ExecMainStatus") or 0)
    except ValueError:
        return 1
    return -status if code in (_CLD_KILLED, _CLD_DUMPED) and status else status


class SystemdDeployment(Deployment):
    """One start of the unit (one invocation id). A poll costs one remote command: ``read_log`` fetches the new
    journal lines and the unit's state together, and ``exit_status`` right after it uses that state."""

    #: how long the state fetched with the journal stands in for a fresh ``systemctl show``
    STATE_FRESH = 0.5

    def __init__(self, target: SystemdTarget, invocation: str, since: str, base_url: str, log_path: Path) -> None:
        self.target = target
        self.invocation = invocation
        self.since = since
        self.base_url = base_url
        self.log_path = log_path
        self._cursor: str | None = None
        self._status: int | None = None
        self._props: dict[str, str] | None = None
        self._props_at = 0.0
        self._props_thread = 0
        self._mark = f"--- autotune {secrets.token_hex(8)} ---"
        self._generation = target.conn.generation
        self._follower = LogFollower(self._fetch_log, log_path, LOG_FOLLOW_INTERVAL, invocation[:12] or target.unit)

    def reconnected(self) -> bool:
        """Whether the SSH connection was reopened since this start (see ProcessDeployment.reconnected)."""
        return self.target.conn.generation != self._generation

    def exit_status(self) -> int | None:
        if self._status is not None:
            return self._status
        # the state read with the journal stands in only for a read_log() this thread just made (the background
        # follower's copy may predate a stop this thread has done since)
        if self._props is not None and self._props_thread == threading.get_ident() \
                and time.monotonic() - self._props_at < self.STATE_FRESH:
            p = self._props
        else:
            p = self.target.show(*SHOW_PROPS)
        self._props = None
        current = p.get("InvocationID", "")
        if self.invocation and current and current != self.invocation:
            # restarted since (Restart= or someone else): this start has ended; its status is gone with it
            self._status = 1
            return self._status
        active, sub = p.get("ActiveState", ""), p.get("SubState", "")
        if active in _RUNNING and sub != "auto-restart":
            return None
        self._status = decode_exit(p)
        self._follower.stop()
        return self._status

    def stop_following(self) -> None:
        self._follower.stop()
        self._props = None

    def _journal_argv(self) -> list[str]:
        argv = ["journalctl", "-q", "--no-pager", "-o", "cat", "--show-cursor"]
        if self.invocation:
            # the service's own output, and the manager's messages about this start ("Main process exited, ...")
            argv += [f"_SYSTEMD_INVOCATION_ID={self.invocation}", "+", f"INVOCATION_ID={self.invocation}"]
        else:  # a systemd without invocation ids: this unit since the start
            argv += ["-u", self.target.unit, f"--since=@{self.since}"]
        if self._cursor:
            argv.append(f"--after-cursor={self._cursor}")
        return self.target._argv(argv)

    def read_log(self) -> str:
        return self._follower.read()

    def _fetch_log(self) -> str:
        """New journal lines of this start, and the unit's state with them (one remote command)."""
        show = self.target._argv(["systemctl", "show", self.target.unit, *_props_args(SHOW_PROPS)])
        script = f"{sh_command(self._journal_argv())}; echo {sh_command([self._mark])}; {sh_command(show)}"
        result = self.target.conn.run(script, timeout=60, what="reading the journal")
        journal, _, state = result.stdout.partition(self._mark + "\n")
        if state:
            self._props, self._props_at = parse_show(state), time.monotonic()
            self._props_thread = threading.get_ident()
        lines = journal.splitlines()
        if lines and lines[-1].startswith("-- cursor: "):
            self._cursor = lines.pop()[len("-- cursor: "):].strip()
        return "\n".join(lines) + "\n" if lines else ""


def _dropin_mode(text: str, values: tuple[str, ...] = ()) -> int:
    """0600 for a drop-in that may hold a secret (an Environment= line, a secret value or a secret-named flag),
    else 0644 (``systemctl cat`` shows it to everyone)."""
    words = text.replace('"', " ").replace("=", " ").split()
    private = ("\nEnvironment=" in text or any(v in text for v in values) or redact.mask(text) != text
               or any(redact.is_secret(w.lstrip("-")) for w in words if w.startswith("-")))
    return 0o600 if private else 0o644


def _props_args(props: tuple[str, ...]) -> list[str]:
    out = []
    for prop in props:
        out += ["-p", prop]
    return out


class SystemdTarget(RemoteTarget):
    """kind = "ssh-systemd": the server is ``spec.unit`` on the target, configured by a drop-in."""

    spec: SystemdSpec

    def __init__(self, spec: SystemdSpec, cwd: Path | None = None, conn: SSHConnection | None = None) -> None:
        super().__init__(spec, cwd, conn)
        self.unit: str = spec.unit
        self.current: SystemdDeployment | None = None
        self._user: str | None = None

    # -- paths -------------------------------------------------------------------------------------------------
    @property
    def dropin_dir(self) -> str:
        return posixpath.join(self.spec.unit_dir, f"{self.unit}.d")

    @property
    def dropin_path(self) -> str:
        return posixpath.join(self.dropin_dir, DROPIN_NAME)

    @property
    def env_file_path(self) -> str:
        """The drop-in's EnvironmentFile= (secret variables; 0600, read by systemd as root)."""
        return posixpath.join(self.dropin_dir, f"{DROPIN_STEM}.env")

    def secret_file_path(self, suffix: str) -> str:
        """The file the server reads secret flags from (0600, the unit's own user's)."""
        return posixpath.join(self.dropin_dir, f"{DROPIN_STEM}{suffix or '.secret'}")

    @property
    def subdir(self) -> str:
        return f"unit-{self.unit}"

    @property
    def lock_names(self) -> list[str]:
        return [f"unit:{self.unit}", *super().lock_names]

    @property
    def backup_path(self) -> str:
        return posixpath.join(self.directory, BACKUP)

    @property
    def local_backup_path(self) -> Path:
        name = f"{self.spec.user or ''}@{self.spec.host}-{self.spec.port}-{self.unit}"
        safe = re.sub(r"[^A-Za-z0-9_.@-]+", "_", name)
        return state_dir() / "backups" / safe / BACKUP

    # -- remote commands ---------------------------------------------------------------------------------------
    def _argv(self, argv: list[str]) -> list[str]:
        return ["sudo", "-n", *argv] if self.spec.sudo else list(argv)

    def run(self, argv: list[str], *, timeout: float = 60.0, what: str | None = None,
            stdin: bytes | None = None) -> Completed:
        return self.conn.run(sh_command(self._argv(argv)), timeout=timeout, what=what or " ".join(argv[:2]),
                             stdin=stdin)

    def systemctl(self, *args: str, timeout: float = SYSTEMCTL_TIMEOUT) -> Completed:
        result = self.run(["systemctl", *args], timeout=timeout, what=f"systemctl {args[0]}")
        if not result.ok:
            raise TrialFailure("deploy_failed", f"systemctl {' '.join(args)} on {self.spec.host} failed: "
                                                f"{result.detail()}")
        return result

    def show(self, *props: str) -> dict[str, str]:
        argv = ["systemctl", "show", self.unit, *_props_args(props)]
        result = self.run(argv, timeout=60, what="systemctl show")
        if not result.ok:
            raise TrialFailure("deploy_failed", f"systemctl show {self.unit} on {self.spec.host} failed: "
                                                f"{result.detail()}")
        return parse_show(result.stdout)

    def _read_root_file(self, path: str) -> str | None:
        try:
            return self.conn.read_text(path)
        except PermissionError:
            if not self.spec.sudo:
                raise TrialFailure("deploy_failed", f"cannot read {path} on {self.spec.host} "
                                                    "(set sudo = true?)") from None
        result = self.run(["cat", "--", path], what=f"reading {path}")
        return result.stdout if result.ok else None

    # -- backup ------------------------------------------------------------------------------------------------
    def _local_backup(self) -> str | None:
        path = self.local_backup_path
        return path.read_text(encoding="utf-8") if path.is_file() else None

    def _remote_backup(self) -> str | None:
        data = self.read_file(BACKUP)
        return None if data is None else data.decode("utf-8", "replace")

    def _same_as_local(self, remote: str, local: str) -> None:
        """A remote backup must be the very text autotune wrote there and kept a copy of."""
        if hashlib.sha256(remote.encode()).digest() != hashlib.sha256(local.encode()).digest():
            raise UserError(f"the unit backup {self.backup_path} on {self.spec.host} differs from the copy autotune "
                            f"kept when it took it ({self.local_backup_path}): refusing to use it (someone changed "
                            f"it); compare the two, and remove the one that is wrong")

    def load_backup(self) -> dict[str, object] | None:
        """The pre-tuning backup, for restoring it: the copy autotune kept on this machine when it took the backup
        (the target's copy must be the same), or the target's copy when it says there was no drop-in to put back
        (removing ours is then all a restore installs). A target copy with a drop-in in it and no local copy is
        refused: what autotune installs as root comes from its own copy only."""
        remote = self._remote_backup()
        local = self._local_backup()
        if local is not None:
            if remote is not None:
                self._same_as_local(remote, local)
            return self._checked_backup(local)
        if remote is None:
            return None
        backup = self._checked_backup(remote)
        if backup.get("dropin") is not None:
            raise UserError(f"the unit backup {self.backup_path} on {self.spec.host} holds a drop-in to put back, "
                            f"but this machine has no copy of it ({self.local_backup_path}; was it taken from "
                            f"another machine?): autotune installs only a backup it kept itself; restore from "
                            f"there, or check {self.backup_path} and put its drop-in back by hand")
        return backup

    def _checked_backup(self, text: str) -> dict[str, object]:
        """The backup as autotune writes it, or a UserError."""
        fix = f"fix or remove it (the local copy is {self.local_backup_path})"
        try:
            backup = json.loads(text)
        except ValueError:
            raise UserError(f"the unit backup {self.backup_path} on {self.spec.host} is not valid JSON; {fix}") \
                from None
        if not isinstance(backup, dict) or backup.get("unit") != self.unit \
                or backup.get("dropin_path") != self.dropin_path:
            raise UserError(f"the unit backup {self.backup_path} on {self.spec.host} is not autotune's backup of "
                            f"{self.unit}; {fix}")
        dropin = backup.get("dropin")
        if dropin is not None:
            bad = dropin_problem(dropin) if isinstance(dropin, str) else "it is not text"
            if bad:
                raise UserError(f"the unit backup {self.backup_path} on {self.spec.host} holds a drop-in autotune "
                                f"did not write ({bad}); refusing to install it; {fix}")
        return backup

    def ensure_backup(self) -> dict[str, object]:
        """Take the backup of the unit as it is now, unless one exists (it is never overwritten). A target copy
        that differs from the local one stops the run here, before anything changes."""
        remote = self._remote_backup()
        local = self._local_backup()
        if remote is not None:
            if local is not None:
                self._same_as_local(remote, local)
            return self._checked_backup(remote)
        if local is not None:
            backup = self._checked_backup(local)
            self.write_file(BACKUP, local.encode(), 0o600, exclusive=True)
            return backup
        props = self.show("LoadState", "ActiveState", "FragmentPath", "DropInPaths", "UnitFileState")
        if props.get("LoadState") not in ("loaded",):
            raise UserError(f"target {self.spec.name}: unit {self.unit} is not loaded on {self.spec.host} "
                            f"(LoadState={props.get('LoadState') or '?'}); check the unit name")
        fragment_path = props.get("FragmentPath", "")
        cat = self.run(["systemctl", "cat", self.unit], what="systemctl cat")
        record = {
            "unit": self.unit,
            "host": self.spec.host,
            "taken": time.strftime("%Y-%m-%d %H:%M:%S"),
            "active_state": props.get("ActiveState"),
            "unit_file_state": props.get("UnitFileState"),
            "fragment_path": fragment_path,
            "fragment": self._read_root_file(fragment_path) if fragment_path else None,
            "dropin_paths": props.get("DropInPaths", "").split(),
            "dropin_path": self.dropin_path,
            "dropin": self._read_root_file(self.dropin_path),
            "systemctl_cat": cat.stdout if cat.ok else None,
        }
        text = json.dumps(record, indent=1) + "\n"
        if not self.write_file(BACKUP, text.encode(), 0o600, exclusive=True):
            # another tuner took it first: theirs is the original (no local copy of it here)
            return self._checked_backup(self._remote_backup() or text)
        self._keep_local(text)
        return self._checked_backup(text)

    def _keep_local(self, text: str) -> None:
        path = self.local_backup_path
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            return
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)

    def _archive_backup(self) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        if self._remote_backup() is not None:
            self.rename_file(BACKUP, f"backup.restored-{stamp}.json")
        if self.local_backup_path.exists():
            self.local_backup_path.rename(self.local_backup_path.with_name(f"backup.restored-{stamp}.json"))

    # -- the drop-in and its secret files ----------------------------------------------------------------------
    def _dropin(self, launch: StartCommand) -> tuple[str, dict[str, tuple[str, bool]]]:
        """The drop-in text for ``launch`` and the secret files beside it: {path: (text, the unit's user owns it)}.
        Secret variables go to the EnvironmentFile= (systemd reads it as root); secret flags to the file the engine
        reads (the server reads it as the unit's user)."""
        secret_env = launch.secret_env()
        env = {k: v for k, v in launch.env.items() if k not in secret_env}
        files: dict[str, tuple[str, bool]] = {}
        env_file = None
        if secret_env:
            env_file = self.env_file_path
            files[env_file] = (environment_file(secret_env), False)
        secret_path = None
        if launch.file is not None:
            secret_path = self.secret_file_path(launch.file.suffix)
            files[secret_path] = (launch.file.text, True)
        text = render_dropin(launch.command(secret_path), env, self.unit, self.dropin_path, note=self.spec.name,
                             env_file=env_file)
        return text, files

    def place_file(self, name: str, data: bytes, local: Path) -> str:
        """Into the unit's drop-in directory (systemd reads only its .conf files), readable by the unit's user
        whoever that is (a schedule holds no secret); installed with sudo like the drop-in."""
        path = posixpath.join(self.dropin_dir, name)
        self._install(path, data.decode(), 0o644)
        return path

    def _unit_user(self) -> str:
        """The user the unit's processes run as ("" for root)."""
        if self._user is None:
            self._user = self.show("User").get("User", "")
        return self._user

    def _install(self, path: str, text: str, mode: int, owner: str = "") -> None:
        """Put ``text`` at ``path`` (in the unit's drop-in directory) with ``mode``; with sudo through ``install``
        fed on its standard input (no copy of it is left anywhere), else over SFTP."""
        if not self.spec.sudo:
            if owner and owner not in ("root", self.spec.user or ""):
                raise TrialFailure("deploy_failed", f"{self.unit} runs as {owner}: autotune can give it {path} only "
                                                    "with sudo = true")
            try:
                self.conn.makedirs(self.dropin_dir)
                self.conn.write_bytes(path, text.encode(), mode)
            except PermissionError:
                raise TrialFailure("deploy_failed", f"cannot write {path} on {self.spec.host} as "
                                                    f"{self.spec.user or 'this user'} (set sudo = true?)") from None
            return
        argv = ["install", "-D", "-m", f"{mode:04o}", *(["-o", owner] if owner else []), "/dev/stdin", path]
        result = self.run(argv, what=f"installing {path}", stdin=text.encode())
        if not result.ok:
            raise TrialFailure("deploy_failed", f"cannot install {path} with sudo -n on {self.spec.host}: "
                                                f"{result.detail()}")

    def _remove(self, *paths: str) -> None:
        if not paths:
            return
        if not self.spec.sudo:
            for path in paths:
                try:
                    self.conn.remove(path)
                except PermissionError:
                    raise TrialFailure("deploy_failed", f"cannot remove {path} on {self.spec.host} "
                                                        f"(set sudo = true?)") from None
            return
        result = self.run(["rm", "-f", "--", *paths], what="removing the drop-in")
        if not result.ok:
            raise TrialFailure("deploy_failed", f"cannot remove {' '.join(paths)}: {result.detail()}")

    def _remove_secret_files(self, dropin: str | None) -> None:
        """Remove autotune's secret files (``zz-autotune.*`` beside its drop-in) that ``dropin``, the drop-in now in
        place, does not name."""
        if not self.conn.exists(self.dropin_dir):
            return
        text = dropin or ""
        names = self.conn.sftp(lambda s: s.listdir(self.dropin_dir), "listing the drop-ins")
        paths = [posixpath.join(self.dropin_dir, n) for n in names
                 if n.startswith(f"{DROPIN_STEM}.") and n != DROPIN_NAME]
        self._remove(*(p for p in paths if p not in text and p.replace("%", "%%") not in text))

    # -- Target ------------------------------------------------------------------------------------------------
    def rendered(self, argv: list[str], env: dict[str, str]) -> tuple[str, str]:
        try:
            text, _ = self._dropin(self.start_command(argv, env))
        except TrialFailure as e:
            text = f"# cannot be rendered: {e.detail}\n"
        return DROPIN_NAME, text

    def preflight(self, command: list[str]) -> None:
        """Reachable, the unit is loaded, the drop-in can be written (or sudo -n works), the command can be an
        ExecStart= executable and exists on the target."""
        try:
            exec_line(command)
        except TrialFailure as e:
            raise UserError(f"target {self.spec.name}: {e.detail}") from None
        q = sh_command
        unit = q([self.unit])
        load = q(self._argv(["systemctl", "show", self.unit, "-p", "LoadState", "--value"]))
        extra = [
            f'state=$({load}) || {{ echo "autotune: systemctl show {unit} failed" >&2; exit 1; }}',
            (f'[ "$state" = loaded ] || {{ echo "autotune: unit {unit} is not loaded on the target '
            f'(LoadState=$state); check the unit name" >&2; exit 1; }}'),
        ]
        if self.spec.sudo:
            extra.append("sudo -n true 2>/dev/null || { echo 'autotune: sudo -n needs a password on the target; "
                         "allow the user passwordless sudo for systemctl, journalctl, install and rm' >&2; exit 1; }")
        else:
            dirs = f"{q([self.dropin_dir])} {q([self.spec.unit_dir])}"
            extra.append(
                f'w=; for d in {dirs}; do if [ -d "$d" ]; then [ -w "$d" ] && w=1; break; fi; done; '
                f'[ -n "$w" ] || {{ echo "autotune: cannot write {self.dropin_dir} as $(id -un); set sudo = true" '
                f'>&2; exit 1; }}')
        self.check_host(command, extra, search_path=SYSTEMD_PATH)

    def deploy(self, argv: list[str], env: dict[str, str], log_path: Path) -> SystemdDeployment:
        launch = self.start_command(argv, env)
        text, files = self._dropin(launch)
        self.ensure_backup()
        for path, (content, users) in files.items():
            self._install(path, content, 0o600, self._unit_user() if users else "")
        self._install(self.dropin_path, text, _dropin_mode(text, launch.secrets))
        self._remove_secret_files(text)
        return self._restart(log_path, reload=True)

    def _stop_script(self, reload: bool) -> list[str]:
        """Shell lines: (daemon-reload,) stop the unit, then print the port's state and fail with 93 if it is held."""
        q = sh_command
        lines = []
        if reload:
            lines.append(f"{q(self._argv(['systemctl', 'daemon-reload']))} || exit 91")
        lines += [
            f"{q(self._argv(['systemctl', 'stop', self.unit]))} || exit 92",
            FIND_PYTHON,
            f'state=$({program_line("ports", "port", self.spec.server_port, PORT_SETTLE)})',
            'echo "$state"',
            """case "$state" in *'"listening": true'*) exit 93;; esac""",
        ]
        return lines

    def _check_stop(self, result: Completed) -> list[str]:
        """The stdout lines after the port state; raises for a failed reload/stop or a held port."""
        lines = result.stdout.splitlines()
        if result.status == 91:
            raise TrialFailure("deploy_failed", f"systemctl daemon-reload on {self.spec.host} failed: "
                                                f"{result.detail()}")
        if result.status == 92:
            raise TrialFailure("deploy_failed", f"systemctl stop {self.unit} on {self.spec.host} failed: "
                                                f"{result.detail()}")
        try:
            state = json.loads(lines[0])
        except (ValueError, IndexError):
            raise TrialFailure("deploy_failed", f"stopping {self.unit} on {self.spec.host} failed "
                                                f"(status {result.status}): {result.detail()}") from None
        if result.status == 93:
            holder = state.get("holder") or "another process"
            raise TrialFailure("port_busy", f"port {self.spec.server_port} on {self.spec.host} is still held by "
                                            f"{holder} after stopping {self.unit}")
        return lines[1:]

    def _restart(self, log_path: Path, reload: bool) -> SystemdDeployment:
        """(daemon-reload,) stop, check the port, start and read the new invocation id: one remote command."""
        self._forget_current()
        q = sh_command
        script = "\n".join([
            *self._stop_script(reload),
            "date +%s",
            f"{q(self._argv(['systemctl', 'start', self.unit]))}; rc=$?",
            q(self._argv(["systemctl", "show", self.unit, *_props_args(SHOW_PROPS)])),
            "exit $rc",
        ])
        result = self.conn.run(script, timeout=2 * SYSTEMCTL_TIMEOUT, retry=False,
                               what=f"restarting {self.unit}")
        lines = self._check_stop(result)
        since = lines[0].strip() if lines else str(int(time.time()))
        props = parse_show("\n".join(lines[1:]))
        invocation = props.get("InvocationID", "")
        if not result.ok and not invocation:
            raise TrialFailure("deploy_failed", f"systemctl start {self.unit} on {self.spec.host} failed: "
                                                f"{result.detail()}")
        self.current = SystemdDeployment(self, invocation, since, self.base_url(), log_path)
        return self.current

    def _forget_current(self) -> None:
        if self.current is not None:
            self.current.stop_following()
        self.current = None

    def stop(self) -> None:
        """Stop the unit and wait (briefly) until its port is free; a port held by someone else is left alone."""
        self._forget_current()
        result = self.conn.run("\n".join(self._stop_script(reload=False)), timeout=SYSTEMCTL_TIMEOUT,
                               what=f"stopping {self.unit}")
        if result.status != 93:
            self._check_stop(result)

    def restore(self, argv: list[str], env: dict[str, str], log_path: Path) -> SystemdDeployment | None:
        """Put the unit back as it was before tuning (from the backup; ``argv`` is not needed) and restart it if
        it was running then. Returns the deployment to wait for, or None when it was not running."""
        backup = self.load_backup()
        if backup is None:
            return None  # autotune never changed this unit
        original = backup.get("dropin")
        if original is None:
            self._remove(self.dropin_path)
        else:
            self._install(self.dropin_path, str(original), _dropin_mode(str(original)))
        self._remove_secret_files(None if original is None else str(original))
        deployment = None
        if backup.get("active_state") in _RUNNING:
            deployment = self._restart(log_path, reload=True)
        else:
            self.systemctl("daemon-reload", timeout=120)
            self.stop()
        self._archive_backup()
        return deployment

    def close(self) -> None:
        self._forget_current()
        super().close()
