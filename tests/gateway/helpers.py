"""Helpers for the gateway tests: a real `bubblespec sync` process and an in-process gateway."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from bubblespec.cluster.child import Child
from bubblespec.cluster.local import LocalCluster, free_ports
from bubblespec.gateway.config import GatewayConfig
from bubblespec.gateway.server import create_app

REPO_ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def sync_daemon(tmp: Path, *extra: str) -> Iterator[str]:
    """A `bubblespec sync` child process on a free loopback port; yields host:port."""
    (port,) = free_ports(1)
    cluster = LocalCluster(ranks=0, sync_port=port, log_dir=tmp)
    child = Child("sync", [sys.executable, "-m", "bubblespec.cli.main", "sync", "--port",
                           str(port), "--metrics-port", "-1", "--heartbeat-interval-s", "0.2",
                           "--rank-timeout-s", "3", *extra],
                  tmp / "sync.log", cluster._child_env())
    cluster.children["sync"] = child
    child.start()
    try:
        deadline = time.monotonic() + 30
        while not cluster._sync_ready():
            assert child.alive, child.log_tail()
            assert time.monotonic() < deadline, "synchronizer not ready"
            time.sleep(0.05)
        yield cluster.sync_address
    finally:
        cluster.stop()


def dead_address() -> str:
    """host:port with nothing listening."""
    (port,) = free_ports(1)
    return f"127.0.0.1:{port}"


@contextlib.contextmanager
def gateway(**overrides: Any) -> Iterator[TestClient]:
    """The gateway app (lifespan run) behind a TestClient."""
    cfg: dict[str, Any] = {"port": 0, "sync_timeout_s": 1.0, "probe_timeout_s": 1.0}
    cfg.update(overrides)
    with TestClient(create_app(GatewayConfig(**cfg)), raise_server_exceptions=False) as c:
        yield c


def wait_exit(proc: subprocess.Popen, timeout_s: float = 10) -> int:
    return proc.wait(timeout=timeout_s)


def vllm_error(r: Any, status: int, param: str | None) -> dict[str, Any]:
    """The error of `r` in OpenAI's (and vLLM's) shape, with `status` and `param`."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["code"] == status and err["type"]
    assert err["param"] == param, err
    return dict(err)
