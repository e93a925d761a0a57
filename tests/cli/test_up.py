"""`bubblespec up`: a child that dies during start makes the command exit non-zero with its
log tail; once up, a child that dies is reported and restarted while the command keeps
serving, and one that keeps dying makes it stop with its log tail; `--help` works and bad
arguments are refused."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

from tests.cluster.helpers import REPO_ROOT
from tests.deploy.helpers import engine_model_dir


def test_up_command_exits_nonzero_with_the_log_tail(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "bubblespec.cli.main", "up", "--ranks", "1", "--model",
         str(tmp_path), "--rank-arg=--no-such-flag", "--log-dir", str(tmp_path), "--grace-s", "3"],
        check=False, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "r0 exited with code 2" in r.stderr and "no-such-flag" in r.stderr


def test_up_help_and_bad_args() -> None:
    r = subprocess.run([sys.executable, "-m", "bubblespec.cli.main", "up", "--help"],
                       check=False, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert r.returncode == 0 and "--rank-arg" in r.stdout and "--tls" in r.stdout
    r = subprocess.run([sys.executable, "-m", "bubblespec.cli.main", "up", "--ranks", "0"],
                       check=False, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert r.returncode == 2
    r = subprocess.run([sys.executable, "-m", "bubblespec.cli.main", "up",
                        "--give-up-window-s", "0"],
                       check=False, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert r.returncode == 2 and "--give-up-window-s" in r.stderr


def _wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _gateway(up: subprocess.Popen) -> psutil.Process:
    kids = [p for p in psutil.Process(up.pid).children()
            if "gateway" in p.cmdline() and p.status() != psutil.STATUS_ZOMBIE]
    assert len(kids) == 1, kids
    return kids[0]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health_generate", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.engine
@pytest.mark.slow  # ~1 min; the supervisor's restarts also run in tests/cluster without engines
def test_up_restarts_a_dead_child_and_stops_when_it_keeps_dying(tmp_path: Path) -> None:
    """SIGKILL the gateway under `bubblespec up --give-up-restarts 1`: the first death is
    reported and the gateway restarted (the command keeps serving), the second one is more
    than 1 restart per window allows: the command stops everything and exits 1 with the
    gateway's log tail."""
    model = engine_model_dir()
    if model is None:
        pytest.skip("no model: build bubblespec/assets/tiny-llama or set BUBBLESPEC_TEST_MODEL")
    out, err, logs = tmp_path / "out", tmp_path / "err", tmp_path / "logs"
    with out.open("w") as o, err.open("w") as e:
        up = subprocess.Popen(
            [sys.executable, "-m", "bubblespec.cli.main", "up", "--ranks", "1", "--model", model,
             "--log-dir", str(logs), "--give-up-restarts", "1", "--grace-s", "3"],
            stdout=o, stderr=e, stdin=subprocess.DEVNULL, cwd=REPO_ROOT)
    try:
        _wait_for(lambda: "Ctrl-C to stop." in out.read_text() or up.poll() is not None, 600,
                  "bubblespec up ready")
        assert up.poll() is None, out.read_text() + err.read_text()
        m = re.search(r"^  gateway +(http://\S+)$", out.read_text(), re.MULTILINE)
        assert m, out.read_text()
        url = m.group(1)
        children = psutil.Process(up.pid).children()
        _gateway(up).kill()
        _wait_for(lambda: "gateway restarted (restart 1)" in err.read_text(), 60,
                  "the gateway restarted")
        assert "gateway exited with code -9" in err.read_text()
        assert "restarting it in 1 s" in err.read_text()
        _wait_for(lambda: _healthy(url), 120, "the restarted gateway healthy")
        assert up.poll() is None, err.read_text()
        _gateway(up).kill()
        assert up.wait(timeout=120) == 1, err.read_text()
        text = err.read_text()
        assert "gateway exited with code -9 and keeps dying; stopping" in text, text
        assert "1 restart(s) per 600 s spent" in text
        assert f"(log {logs / 'gateway.log'}):" in text
        tail = (logs / "gateway.log").read_text().splitlines()[-1]
        assert tail in text  # the gateway's log tail
        _wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                                  for p in children), 30, "every child gone")
    finally:
        if up.poll() is None:
            up.terminate()
            up.wait(timeout=60)
