"""`autotune run` end to end on remote targets through the real sshd: ssh-process with a tunnel, ssh-systemd with
`autotune restore`, and a connection cut in the middle of a study."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from autotune.engines.sglang import SGLang
from autotune.studyfile.spec import read_study_file
from autotune.targets.process import ProcessTarget
from autotune.testing.ports import free_port
from autotune.testing.sshd import SSHServer
from tests.support.cli import finished_ok, kept, run_autotune, status, wait_for_line
from tests.support.ssh import children, cmdline, main_pid, remote_study, stand_in, wait_for

ENGINE = SGLang()
READY = "/health_generate"  # SGLang answers 200 here once it can generate
REPO = Path(__file__).resolve().parents[2]




@pytest.mark.slow
def test_study_on_an_ssh_process_target(sshd: SSHServer, tmp_path: Path) -> None:
    study = remote_study(tmp_path, sshd, launches=2)
    r = run_autotune("run", "--study", str(study), cwd=tmp_path)
    finished_ok(r)
    trials = kept(status(study)["trials"])
    assert len(trials) == 2 and trials[0]["state"] == "COMPLETE"
    assert trials[0]["metrics"]["single_tok_s"] > 0
    log = (tmp_path / "t-logs" / "trial-0000.log").read_text()
    assert "The server is fired up and ready to roll!" in log  # fetched from the target over SFTP

    # the tuner has exited; the target keeps a healthy server (the best config, or the original)
    spec = read_study_file(str(study)).target()
    target = ProcessTarget(spec)
    try:
        assert httpx.get(target.base_url() + READY, timeout=10).status_code == 200
        record = json.loads(Path(target.pid_file).read_text())  # the pid file on the target names it
        if "left running the best config" in (tmp_path / "t.log").read_text():
            best = json.loads(run_autotune("best", "--study", str(study), "--json").stdout)
            assert cmdline(children(record["pgid"])[0]) == best["command"]
        else:
            assert "restored the original config" in (tmp_path / "t.log").read_text()
        # the drift check measures that server through the same tunnel and finds it as recorded
        r = run_autotune("check", "--study", str(study), "--json", cwd=tmp_path)
        assert r.returncode == 0, r.stderr + r.stdout
        checked = json.loads(r.stdout)
        assert checked["status"] == "ok" and checked["url"].startswith("http://127.0.0.1:")
        assert {lv["concurrency"] for lv in checked["levels"]} == {1, 4}
    finally:
        target.stop()
        target.close()


@pytest.mark.slow
def test_study_on_an_ssh_systemd_target_then_restore(sshd: SSHServer, fake_systemd_root: Path,
                                                    tmp_path: Path) -> None:
    name = f"sglang-study-{free_port()}.service"
    study = remote_study(tmp_path, sshd, launches=2, target="\n".join([
        'kind = "ssh-systemd"', f'unit = "{name}"', f'unit_dir = "{fake_systemd_root / "system"}"']))
    spec = read_study_file(str(study)).target()
    original = [sys.executable, "-m", "autotune.sim", "--port", str(spec.server_port), "--host", "127.0.0.1",
                "--model-path", "/m", "--tp-size", "4", "--served-model-name", "original-config",
                "--sim-time-scale", "0.005", "--sim-speedup", "1"]
    unit_file = fake_systemd_root / "system" / name
    unit_text = f"[Service]\nType=simple\nExecStart={' '.join(original)}\n"
    unit_file.write_text(unit_text)
    stand_in(fake_systemd_root, "systemctl", "daemon-reload")
    stand_in(fake_systemd_root, "systemctl", "start", name)
    try:
        # --no-restore: the unit is left as the last trial left it, so `autotune restore` has work to do
        finished_ok(run_autotune("run", "--study", str(study), "--no-restore", cwd=tmp_path))
        trials = kept(status(study)["trials"])
        assert len(trials) == 2 and trials[0]["state"] == "COMPLETE"
        dropin = fake_systemd_root / "system" / f"{name}.d" / "zz-autotune.conf"
        assert dropin.exists()
        assert "fired up" in (tmp_path / "t-logs" / "trial-0000.log").read_text()  # from the journal

        finished_ok(run_autotune("restore", "--study", str(study), cwd=tmp_path))
        assert not dropin.exists()
        assert unit_file.read_text() == unit_text
        wait_for(lambda: main_pid(fake_systemd_root, name) and cmdline(main_pid(fake_systemd_root, name)) == original,
                 timeout=30)
    finally:
        stand_in(fake_systemd_root, "systemctl", "stop", name)


@pytest.mark.slow
def test_study_survives_a_connection_cut(private_sshd: SSHServer, tmp_path: Path) -> None:
    study = remote_study(tmp_path, private_sshd, launches=4)
    log = tmp_path / "t.log"
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "run", "--study", str(study)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # cut the connection while the trial after the baseline is being measured or started (a baseline cut short
        # as client_bound on a busy machine is measured again under the next number)
        wait_for(lambda: log.exists() and re.search(r"trial \d+ \[baseline\] COMPLETE", log.read_text()), timeout=180)
        time.sleep(0.5)
        assert private_sshd.kill_connections() > 0
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err + out
    assert "Traceback" not in err
    trials = status(study)["trials"]
    counted = [t for t in trials if t["state"] in ("COMPLETE", "PRUNED", "FAIL")]
    assert len(counted) >= 4
    for t in trials:  # the cut cost at most a retried trial, never blamed on the config
        assert t["reason"] not in ("errors", "stalled", "crashed_under_load", "oom_under_load", "crashed",
                                   "startup_timeout"), t
    assert "reconnected" in log.read_text()

    spec = read_study_file(str(study)).target()
    target = ProcessTarget(spec)
    try:
        assert httpx.get(target.base_url() + READY, timeout=10).status_code == 200
    finally:
        target.stop()
        target.close()


@pytest.mark.slow
@pytest.mark.parametrize("signum, to_group", [(signal.SIGTERM, False), (signal.SIGINT, True)])
def test_a_signal_during_the_final_deploy_leaves_the_best_running(sshd: SSHServer, tmp_path: Path,
                                                                   signum: int, to_group: bool) -> None:
    """A stop request during the final deploy (SIGTERM from systemd, or Ctrl-C, which a terminal sends to the whole
    process group) does not cut it short: the config it deploys is left running and healthy, then the tuner exits
    128 + the signal's number."""
    study = remote_study(tmp_path, sshd, launches=2)
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "run", "--study", str(study)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    spec = read_study_file(str(study)).target()
    target = ProcessTarget(spec)
    try:
        wait_for_line(tmp_path / "t.log", r"final deploy: ", proc, timeout=240)
        time.sleep(0.3)
        if to_group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 128 + signum, err + out
        assert "Traceback" not in err
        name = signal.Signals(signum).name
        assert f"{name} received: stopping at the next safe point" in out
        text = (tmp_path / "t.log").read_text()
        assert re.search(r"left running the best config: trial \d+|restored the original config: healthy", text), text
        # the tuner has exited; the target runs what the log says, healthy
        assert httpx.get(target.base_url() + READY, timeout=10).status_code == 200
        record = json.loads(Path(target.pid_file).read_text())
        running = cmdline(children(record["pgid"])[0])
        if "left running the best config" in text:
            best = json.loads(run_autotune("best", "--study", str(study), "--json").stdout)
            assert running == best["command"]
        else:
            baseline = next(t for t in status(study)["trials"] if t["baseline"] and t["command"])
            assert running == baseline["command"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        target.stop()
        target.close()
