"""Secrets during real studies on both ssh targets (the host is this machine, through the real sshd): no command line
on the host or the tuning machine ever holds one, the server still gets them, and no file either side wrote holds a
byte of one except the 0600 file the server reads its secret flags from while it runs."""
from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from autotune.engines.llamacpp import LlamaCpp
from autotune.engines.secret_args import OffCommandLine
from autotune.engines.sglang import SGLang
from autotune.run.health import wait_ready
from autotune.studyfile.spec import read_study_file
from autotune.targets.start_command import is_secret
from autotune.targets.local import LocalSpec, LocalTarget
from autotune.targets.process import ProcessTarget
from autotune.targets.systemd import SystemdTarget
from tests.support.cli import finished_ok, kept, run_autotune, status
from tests.support.llama_cache import cached_model, cached_server_binary
from tests.support.ssh import REPO, children, cmdline, remote_study, server_argv, stand_in, wait_for
from autotune.testing.ports import free_port
from autotune.testing.sshd import SSHServer

ENGINE = SGLang()
API_KEY = f"sk-host-{secrets.token_hex(8)}"
HF_TOKEN = f"hf_host_{secrets.token_hex(8)}"
SECRETS = (API_KEY.encode(), HF_TOKEN.encode())
ENV = {"AUTOTUNE_TEST_API_KEY": API_KEY, "AUTOTUNE_TEST_HF_TOKEN": HF_TOKEN}


class CommandLines:
    """Reads every process's command line (what ps shows every user) over and over while a study runs."""

    def __init__(self) -> None:
        self.leaks: list[bytes] = []
        self.seen: set[bytes] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CommandLines:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    argv = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if any(s in argv for s in SECRETS):
                    self.leaks.append(argv)
                if b"autotune.sim" in argv:
                    self.seen.add(argv)
            self._stop.wait(0.02)


def with_secrets(study: Path) -> Path:
    text = study.read_text().replace("[engine.args]\n",
                                     '[engine.args]\napi-key = { env = "AUTOTUNE_TEST_API_KEY" }\n')
    study.write_text(text + '\n[engine.env]\nHF_TOKEN = { env = "AUTOTUNE_TEST_HF_TOKEN" }\n')
    return study


def files_holding_secrets(*roots: Path, skip: tuple[Path, ...] = ()) -> dict[Path, int]:
    """{file: mode} of every file under ``roots`` with a byte of a secret in it."""
    out = {}
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink() and not any(path.is_relative_to(s) for s in skip) \
                    and any(s in path.read_bytes() for s in SECRETS):
                out[path] = path.stat().st_mode & 0o777
    return out


def needs_the_key(url: str) -> None:
    """The server was given the key: it refuses a request without it."""
    assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401
    assert httpx.get(f"{url}/v1/models", timeout=10, headers={"Authorization": f"Bearer {API_KEY}"}
                     ).status_code == 200


@pytest.fixture
def state_dir() -> Iterator[Path]:
    yield Path(os.environ["XDG_STATE_HOME"])


@pytest.mark.slow
def test_a_study_on_ssh_process_shows_no_secret(sshd: SSHServer, state_dir: Path, tmp_path: Path) -> None:
    study = with_secrets(remote_study(tmp_path, sshd, launches=2))
    with CommandLines() as ps:
        r = run_autotune("run", "--study", str(study), cwd=tmp_path, env=ENV)
    finished_ok(r)
    assert [t["state"] for t in kept(status(study)["trials"])] == ["COMPLETE", "COMPLETE"]
    assert ps.leaks == [] and [a for a in ps.seen if b"--config" in a], "the scan saw the servers"

    target = ProcessTarget(read_study_file(str(study)).target())
    try:
        needs_the_key(target.base_url())  # the server left running (best or original) got it off its command line
        held = files_holding_secrets(tmp_path, state_dir)
        # only the running server's own secret file, private, in the private directory
        assert [p.name for p in held] and all(re.fullmatch(r"secret-[0-9a-f-]+\.yaml", p.name) for p in held), held
        assert set(held.values()) == {0o600} and len(held) == 1
        assert [p.parent for p in held] == [Path(target.directory)]
    finally:
        target.stop()
        target.close()
    assert files_holding_secrets(tmp_path, state_dir) == {}, "the stop removed the secret file"


@pytest.mark.slow
def test_a_study_on_ssh_systemd_shows_no_secret(sshd: SSHServer, fake_systemd_root: Path, state_dir: Path,
                                               tmp_path: Path) -> None:
    name = f"sglang-secrets-{free_port()}.service"
    study = with_secrets(remote_study(tmp_path, sshd, launches=2, target="\n".join([
        'kind = "ssh-systemd"', f'unit = "{name}"', f'unit_dir = "{fake_systemd_root / "system"}"', "sudo = true"])))
    spec = read_study_file(str(study)).target()
    unit_file = fake_systemd_root / "system" / name
    # the unit runs this checkout's emulator (systemd gives a service no PYTHONPATH of the caller's)
    unit_file.write_text(f"[Service]\nType=simple\nExecStart={' '.join(server_argv(spec.server_port))}\n"
                         f"Environment=PYTHONPATH={REPO}\n")
    stand_in(fake_systemd_root, "systemctl", "daemon-reload")
    stand_in(fake_systemd_root, "systemctl", "start", name)
    dropin_dir = fake_systemd_root / "system" / f"{name}.d"
    journal = fake_systemd_root / "journal.jsonl"
    systemds_own = (journal, fake_systemd_root / "state")
    try:
        with CommandLines() as ps:
            # --no-restore: the unit is left running a trial's config with its secrets
            r = run_autotune("run", "--study", str(study), "--no-restore", cwd=tmp_path, env=ENV)
        finished_ok(r)
        assert ps.leaks == [] and [a for a in ps.seen if b"--config" in a], "the scan saw the servers"
        assert b"sudo" not in b"".join(ps.leaks)
        target = SystemdTarget(spec)
        try:
            needs_the_key(target.base_url())
        finally:
            target.close()
        # the secret file and the environment file beside the drop-in, 0600; nothing else, sudo's log included
        held = files_holding_secrets(tmp_path, state_dir, fake_systemd_root, skip=systemds_own)
        assert {p.name: mode for p, mode in held.items()} == {"zz-autotune.yaml": 0o600, "zz-autotune.env": 0o600}
        assert all(p.parent == dropin_dir for p in held)
        assert (dropin_dir / "zz-autotune.conf").stat().st_mode & 0o777 == 0o644  # no secret in it: readable
        assert "EnvironmentFile=" in (dropin_dir / "zz-autotune.conf").read_text()

        finished_ok(run_autotune("restore", "--study", str(study), cwd=tmp_path, env=ENV))
        assert not dropin_dir.exists() or not list(dropin_dir.iterdir())
        assert files_holding_secrets(tmp_path, state_dir, fake_systemd_root, skip=systemds_own) == {}
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{spec.server_port}/v1/models", timeout=5).status_code == 200,
                 timeout=60)
    finally:
        stand_in(fake_systemd_root, "systemctl", "stop", name)


def test_a_local_server_gets_its_key_off_the_command_line(tmp_path: Path) -> None:
    """The local target too: the key in a private file that lives as long as the start, the log masked as it is
    written."""
    port = free_port()
    target = LocalTarget(LocalSpec(server_port=port, engine="sglang"), tmp_path)
    log = tmp_path / "trial.log"
    pid_file = Path(os.environ["XDG_STATE_HOME"]) / "autotune" / f"local-{port}.pid"
    with CommandLines() as ps:
        d = target.deploy(server_argv(port, "--api-key", API_KEY), {"HF_TOKEN": HF_TOKEN}, log)
        try:
            wait_ready(d, ENGINE, interval=0.05, timeout=60, headers={"Authorization": f"Bearer {API_KEY}"})
            needs_the_key(f"http://127.0.0.1:{port}")
            secret_dir = Path(d.secret_dir or "")
            assert (secret_dir / "secret.yaml").stat().st_mode & 0o777 == 0o600
            assert secret_dir.stat().st_mode & 0o777 == 0o700
            assert "argv" not in pid_file.read_text() and not files_holding_secrets(pid_file.parent)
            wait_for(lambda: "server_args=" in log.read_text(), timeout=10)
        finally:
            target.stop()
    assert ps.leaks == [] and ps.seen
    assert "'api_key': '***'" in log.read_text() and not files_holding_secrets(tmp_path)
    assert not secret_dir.exists()


def test_each_engine_says_how_it_takes_a_secret_off_its_command_line() -> None:
    head = ["python3", "-m", "sglang.launch_server", "--model-path", "/m"]
    sg = SGLang().hide_secrets([*head, "--api-key", "k-1234", "--admin-api-key=a\"b: yes", "--port", "1"], is_secret)
    assert sg.argv == [*head, "--port", "1"] and sg.env == {} and sg.kept == ()
    assert sg.file is not None and (sg.file.flag, sg.file.suffix) == ("--config", ".yaml")
    assert yaml.safe_load(sg.file.text) == {"api-key": "k-1234", "admin-api-key": 'a"b: yes'}  # strings, as given
    own = [*head, "--config", "mine.yaml", "--api-key", "k-1234"]  # SGLang reads one config file: the study's
    assert SGLang().hide_secrets(own, is_secret) == OffCommandLine(own, kept=("api-key",))

    ll = LlamaCpp().hide_secrets(["llama-server", "-m", "x.gguf", "--api-key", "k-1234", "--port", "1"], is_secret)
    assert ll.argv == ["llama-server", "-m", "x.gguf", "--port", "1"] and ll.env == {"LLAMA_API_KEY": "k-1234"}
    assert ll.file is None and ll.kept == ()


def _sim(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotune.sim", "--model-path", "/m", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("name, text, error", [
    ("c.json", '{"api-key": "x"}', "ValueError: Config file must be YAML format, got: .json"),
    ("missing.yaml", None, "ValueError: Config file not found: missing.yaml"),
    ("list.yaml", "- a\n- b\n", "ValueError: Config file must contain a dictionary at root level"),
])
def test_the_emulator_refuses_a_config_file_as_sglang_does(name: str, text: str | None, error: str,
                                                           tmp_path: Path) -> None:
    if text is not None:
        (tmp_path / name).write_text(text)
    r = _sim("--config", name, cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.rstrip().splitlines()[-1] == error
    assert "Traceback (most recent call last):" in r.stderr and "merge_config_with_args" in r.stderr
    two = _sim("--config", "a.yaml", "--config", "b.yaml", cwd=tmp_path)
    assert two.stderr.rstrip().splitlines()[-1] == "ValueError: Multiple config files specified! Only one allowed."


def test_the_emulator_merges_a_config_file_under_its_command_line(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "secret.yaml").write_text(f'"api-key": "{API_KEY}"\n"served-model-name": "from-the-file"\n')
    proc = subprocess.Popen([*server_argv(port, "--config", "secret.yaml", "--served-model-name", "from-the-line")],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        auth = {"Authorization": f"Bearer {API_KEY}"}
        wait_for(lambda: _get(f"http://127.0.0.1:{port}/health") == 200, timeout=60)
        needs_the_key(f"http://127.0.0.1:{port}")
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=auth, timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["from-the-line"]  # the command line wins
        info = httpx.get(f"http://127.0.0.1:{port}/server_info", headers=auth, timeout=10).json()
        assert API_KEY not in info["launch_command"] and "--config secret.yaml" in info["launch_command"]
    finally:
        proc.kill()
        proc.wait()


def _get(url: str) -> int:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return 0




@pytest.mark.usefixtures("llama_parts")
def test_llama_server_on_ssh_process_takes_its_key_from_its_environment(make_spec, cleanup, tmp_path: Path) -> None:
    spec = make_spec(engine="llamacpp")
    target = cleanup(ProcessTarget(spec))
    argv = [str(cached_server_binary()), "-m", str(cached_model()), "--host", "127.0.0.1",
            "--port", str(spec.server_port), "-c", "256", "-t", "1", "--api-key", API_KEY]
    with CommandLines() as ps:
        d = target.deploy(argv, {}, tmp_path / "llama.log")
        wait_ready(d, LlamaCpp(), interval=0.1, timeout=120, headers={"Authorization": f"Bearer {API_KEY}"})
        needs_the_key(target.base_url())
    assert ps.leaks == []
    server = children(d.pgid)[0]
    assert f"LLAMA_API_KEY={API_KEY}".encode() in Path(f"/proc/{server}/environ").read_bytes().split(b"\0")
    assert "--api-key" not in cmdline(server)
