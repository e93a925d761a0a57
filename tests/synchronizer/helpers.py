"""Shared helpers for the synchronizer tests: a real daemon on loopback, real channels.

The daemon is created inside the test's own loop (`serving`), or as a
separate process (`Daemon`) where a real process boundary matters (restart, signals).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from bubblespec.protocol.domain import PregenTask
from bubblespec.protocol.sampling import SamplingParams
from bubblespec.rpc.v1 import synchronizer_pb2_grpc as pb_grpc
from bubblespec.synchronizer.client import SyncClient
from bubblespec.synchronizer.config import SyncConfig
from bubblespec.synchronizer.server import SyncServer

REPO_ROOT = Path(__file__).resolve().parents[2]




def config(**overrides: Any) -> SyncConfig:
    """A test config: any free port, no metrics server, fast liveness timing."""
    base: dict[str, Any] = {"port": 0, "metrics_port": -1, "heartbeat_interval_s": 0.1,
                            "rank_timeout_s": 5.0, "shutdown_grace_s": 0.5}
    base.update(overrides)
    return SyncConfig(**base)


@contextlib.asynccontextmanager
async def serving(**overrides: Any) -> AsyncIterator[tuple[SyncServer, SyncClient]]:
    """An in-process daemon and a client of it (token passed through if configured)."""
    cfg = config(**overrides)
    async with SyncServer(cfg) as server:
        token = cfg.token.get_secret_value() if cfg.token else None
        async with SyncClient(server.address, token=token, timeout_s=2.0) as client:
            yield server, client


def stub(address: str) -> tuple[grpc.aio.Channel, pb_grpc.SynchronizerStub]:
    """A raw generated stub, for checking status codes and metadata directly."""
    channel = grpc.aio.insecure_channel(address)
    return channel, pb_grpc.SynchronizerStub(channel)


def make_tasks(num_prompts: int, samples: int, max_new_tokens: int = 32,
               keyed: bool = False) -> list[PregenTask]:
    """Prompt-major task list (p0 s0, p0 s1, ..., p1 s0, ...), as a gateway would send it
    (`keyed`: keyed sampling, whose drafts may offer margin branches)."""
    return [
        PregenTask(f"p{p}", [1, 2, 3 + p], s, seed=1000 * p + s,
                   sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=0.7,
                                           top_p=0.9, top_k=20,
                                           seed_mode="keyed" if keyed else "default"))
        for p in range(num_prompts) for s in range(samples)
    ]


async def eventually(predicate: Any, timeout_s: float = 3.0, period_s: float = 0.02) -> None:
    """Wait until `await predicate()` (or `predicate()`) is truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(period_s)


class Daemon:
    """`python -m bubblespec.synchronizer.server` as a child process on loopback."""

    def __init__(self, *args: str, port: int = 0, env: dict[str, str] | None = None) -> None:
        cmd = [sys.executable, "-m", "bubblespec.synchronizer.server", "--port", str(port),
               "--host", "127.0.0.1", *args]
        self.proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **(env or {})})
        self.lines: list[str] = []
        self.port = self._wait_for(r"listening on [^:]+:(\d+)")
        metrics = self._find(r"metrics: http://[^:]+:(\d+)/metrics")
        self.metrics_port = int(metrics) if metrics else None

    def _wait_for(self, pattern: str, timeout_s: float = 20.0) -> int:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            m = re.search(pattern, line)
            if m:
                return int(m.group(1))
        raise AssertionError("daemon did not start:\n" + "".join(self.lines))

    def _find(self, pattern: str) -> str | None:
        for line in self.lines:
            m = re.search(pattern, line)
            if m:
                return m.group(1)
        return None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> int:
        """Signal the daemon and wait; returns its exit code, output kept in `lines`."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        out, _ = self.proc.communicate(timeout=timeout_s)
        self.lines.append(out)
        return self.proc.returncode


async def open_with_idle_ranks(client: Any, tasks: list[PregenTask],
                               done: tuple[str, ...] = ("r0", "r1")) -> None:
    """Register the ranks `done` and "slow", open step 0 with one request each and `tasks`
    to pre-generate, and report the `done` ranks done: they may claim, "slow" decodes on."""
    for r in (*done, "slow"):
        await client.register(r, r)
    await client.open_step(0, {r: 1 for r in (*done, "slow")}, tasks)
    for r in done:
        await client.report_done(0, r)
