"""Gateway config (CLI > env > YAML > defaults) and the `bubblespec gateway` process."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from bubblespec.cluster import free_ports
from bubblespec.config import ConfigError, load_config
from bubblespec.gateway.config import ENV_PREFIX, GatewayConfig

from .helpers import REPO_ROOT


def test_sources_and_precedence(tmp_path: Path) -> None:
    yml = tmp_path / "gw.yaml"
    yml.write_text("run_seed: 1\nport: 9000\nranks: ['a:1']\n")
    cfg = load_config(GatewayConfig, ["--config", str(yml), "--port", "9100",
                                      "--ranks", '["b:2", "http://c:3"]'],
                      env={f"{ENV_PREFIX}RUN_SEED": "5", f"{ENV_PREFIX}TOKEN": "t"},
                      env_prefix=ENV_PREFIX)
    assert cfg.port == 9100 and cfg.run_seed == 5 and cfg.ranks == ["b:2", "http://c:3"]
    assert cfg.token is not None and cfg.token.get_secret_value() == "t"
    with pytest.raises(ConfigError, match="max_n"):
        load_config(GatewayConfig, ["--max-n", "5000"], env={}, env_prefix=ENV_PREFIX)


def test_gateway_process_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    log = open(tmp_path / "gw.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "bubblespec.cli.main", "gateway", "--port",
                             str(port), "--ranks", "[]"], stdout=log, stderr=subprocess.STDOUT,
                            cwd=REPO_ROOT, env={"BUBBLESPEC_GATEWAY_RUN_SEED": "3",
                                                "PATH": "/usr/bin:/bin"})
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.HTTPError:
                assert proc.poll() is None, (tmp_path / "gw.log").read_text()
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert r.json() == {"status": "ok"}
        cfg = httpx.get(f"http://127.0.0.1:{port}/config").json()
        assert cfg["run_seed"] == 3 and cfg["port"] == port
        # no synchronizer, no ranks: not ready, and says why
        r = httpx.get(f"http://127.0.0.1:{port}/health_generate")
        assert r.status_code == 503 and "no rank" in r.json()["detail"]
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught
        assert proc.wait(timeout=15) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    text = (tmp_path / "gw.log").read_text()
    assert "effective config" in text and "Application shutdown complete" in text


def test_bad_config_exits_2() -> None:
    r = subprocess.run([sys.executable, "-m", "bubblespec.cli.main", "gateway", "--port",
                        "70000"], check=False, capture_output=True, text=True, timeout=60,
                       cwd=REPO_ROOT)
    assert r.returncode == 2 and "port" in r.stderr
