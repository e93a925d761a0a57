"""The shared `main()`: config errors exit 2, a taken port exits 3, port 0 picks a free
port that the served config then reports."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from bubblespec.gateway.config import ENV_PREFIX, GatewayConfig
from bubblespec.http.serve import EXIT_BIND, EXIT_CONFIG, http_main, service_main
from bubblespec.synchronizer.config import SyncConfig

REPO_ROOT = Path(__file__).resolve().parents[2]


def _never(_: object) -> int:
    raise AssertionError("must not run")


def test_bad_config_exits_2_naming_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert service_main(SyncConfig, ["--port", "70000"], _never, prog="bubblespec sync") \
        == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("bubblespec sync: invalid configuration") and "port" in err


def test_a_taken_port_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert http_main(GatewayConfig, ["--port", str(port)], _never,
                         prog="bubblespec gateway", env_prefix=ENV_PREFIX) == EXIT_BIND
    assert f"cannot bind 127.0.0.1:{port}" in capsys.readouterr().err


def test_port_0_serves_on_a_free_port_the_config_reports(tmp_path: Path) -> None:
    log_path = tmp_path / "gw.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "bubblespec.cli.main", "gateway",
                                 "--port", "0", "--ranks", "[]"], stdout=log,
                                stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                env={"PATH": "/usr/bin:/bin"})
    try:
        deadline = time.monotonic() + 30
        while not (m := re.search(r"gateway on 127\.0\.0\.1:(\d+)", log_path.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        port = int(m.group(1))
        assert port != 0
        cfg = httpx.get(f"http://127.0.0.1:{port}/config", timeout=5).json()
        assert cfg["port"] == port
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
