"""`autotune dashboard`: the real optuna-dashboard on a real study, read through its HTTP API."""
from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from autotune.testing.ports import free_port
from tests.support.cli import run_cli
from tests.support.small_study import small_study, small_study_trials


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_study(tmp_path_factory)


@pytest.fixture(scope="module")
def dashboard(study: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "dashboard", "--study", str(study), "--port", str(port)],
                            cwd=study.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                if httpx.get(f"{base}/api/studies", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the dashboard never answered"
            time.sleep(0.1)
        yield base, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_dashboard_serves_the_study_its_trials_and_a_failed_trials_log(
        study: Path, dashboard: tuple[str, subprocess.Popen[str]]) -> None:
    base, _ = dashboard
    summaries = httpx.get(f"{base}/api/studies", timeout=10).json()["study_summaries"]
    found = [s for s in summaries if s["study_name"] == "t"]
    assert len(found) == 1
    study_id = found[0]["study_id"]
    attrs = {a["key"]: a["value"] for a in found[0]["user_attrs"]}
    assert attrs["objective"] == "weighted" and "[space.sim-fault]" in attrs["study_file"]

    detail = httpx.get(f"{base}/api/studies/{study_id}", timeout=10).json()
    expected = small_study_trials()
    assert [t["number"] for t in detail["trials"]] == [t["number"] for t in expected]
    assert detail["objective_names"] == ["gain_vs_baseline"]

    crashed = next(t for t in expected if t["reason"] == "crashed")
    trial = detail["trials"][crashed["number"]]
    assert trial["state"] == "Pruned"
    attrs = {a["key"]: a["value"] for a in trial["user_attrs"]}
    assert "crashed" in attrs["reason"] and attrs["stage"] == "waiting"
    names = {a["filename"]: a for a in trial["artifacts"]}
    prefix = f"trial-{crashed['number']:04d}"
    log_name, script_name = f"{prefix}.log", f"{prefix}.command.sh"
    assert set(names) >= {log_name, script_name}

    got = httpx.get(f"{base}/artifacts/{study_id}/{trial['trial_id']}/{names[log_name]['artifact_id']}", timeout=10)
    assert got.status_code == 200 and got.headers["content-type"].startswith("text/plain")
    server_log = (study.parent / "t-logs" / log_name).read_text()
    assert got.text == server_log, "the artifact is not that trial's server log"
    assert "Scheduler hit an exception" in got.text

    script = httpx.get(f"{base}/artifacts/{study_id}/{trial['trial_id']}/{names[script_name]['artifact_id']}",
                       timeout=10).text
    assert "--sim-fault startup-crash" in script

    # a measured trial also carries its raw measurement records
    measured = next(t for t in expected if t["state"] == "COMPLETE" and t["reused_from"] is None)
    files = {a["filename"] for a in detail["trials"][measured["number"]]["artifacts"]}
    assert f"trial-{measured['number']:04d}.records.json" in files


def test_dashboard_listens_on_loopback_and_says_how_to_tunnel(
        dashboard: tuple[str, subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    base, _ = dashboard
    port = int(base.rsplit(":", 1)[1])
    listening = [line.split()[1] for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
                 if line.split()[3] == "0A" and int(line.split()[1].split(":")[1], 16) == port]
    assert listening == [f"0100007F:{port:04X}"], "the dashboard must listen on 127.0.0.1 only"
    code, out, _ = run_cli(monkeypatch, capsys, "dashboard", "--help")
    text = " ".join(out.split())
    assert code == 0 and "NO AUTHENTICATION" in text and "DELETE" in text and "ssh -L 8080:127.0.0.1:8080" in text


def test_dashboard_refuses_other_addresses_and_busy_ports(
        study: Path, dashboard: tuple[str, subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(monkeypatch, capsys, "dashboard", "--study", str(study), "--host", "0.0.0.0")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "no authentication" in err and "--allow-remote" in err and "ssh -L" in err
    busy = dashboard[0].rsplit(":", 1)[1]
    code, _, err = run_cli(monkeypatch, capsys, "dashboard", "--study", str(study), "--port", busy)
    assert code == 2 and "cannot listen on 127.0.0.1:" in err and "Traceback" not in err
    code, _, err = run_cli(monkeypatch, capsys, "dashboard", "--study", str(study.parent / "nope.toml"))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
