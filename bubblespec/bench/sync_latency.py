"""Cost of the synchronizer itself: RPC round trips on loopback, as a rank sees them.

`bubblespec bench sync [--n 2000]` starts a daemon in a child process (so
client and server do not share an event loop or a core's GIL), then times sequential calls
through `SyncClient`: PollStop (what a pre-generating rank pays every T decode steps),
ClaimTasks of 1 and 8 tasks (256-token prompts), PushDrafts of one 256-token draft,
FetchDrafts of one prompt with 8 samples. Prints per-call latency percentiles in microseconds
and, from the daemon's own histogram, the mean time spent inside its handlers.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

from bubblespec.protocol.domain import PregenDraft, PregenTask
from bubblespec.protocol.sampling import SamplingParams
from bubblespec.synchronizer.client import SyncClient


def start_daemon(*args: str, port: int = 0, log: list[str] | None = None
                 ) -> tuple[subprocess.Popen[str], str, int]:
    """A daemon on loopback (`port` 0: a free one) with extra flags `args`; returns
    (process, host:port, metrics port); its log lines up to "listening" go to `log`."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bubblespec.synchronizer.server", "--port", str(port),
         "--metrics-port", "0", "--metrics-host", "127.0.0.1", "--shutdown-grace-s", "0",
         *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines = [] if log is None else log
    for line in proc.stdout:  # the daemon logs only a few lines per run: no need to drain
        lines.append(line)
        m = re.search(r"listening on [^:]+:(\d+) \(metrics: http://[^:]+:(\d+)", line)
        if m:
            return proc, f"127.0.0.1:{m.group(1)}", int(m.group(2))
    proc.kill()
    raise RuntimeError("daemon did not start:\n" + "".join(lines))


async def _time(n: int, call: Callable[[int], Awaitable[Any]]) -> dict[str, float]:
    """Latency percentiles (us) of `n` sequential awaits of `call(i)`, after a warm-up."""
    for i in range(min(50, n)):
        await call(i)
    samples = []
    for i in range(n):
        t0 = time.perf_counter()
        await call(i)
        samples.append((time.perf_counter() - t0) * 1e6)
    samples.sort()
    return {
        "calls": n,
        "mean_us": round(statistics.fmean(samples), 1),
        "p50_us": round(samples[n // 2], 1),
        "p90_us": round(samples[int(n * 0.9)], 1),
        "p99_us": round(samples[min(n - 1, int(n * 0.99))], 1),
    }


async def measure(address: str, n: int) -> dict[str, dict[str, float]]:
    """Time the rank-side RPCs against the daemon at `address`."""
    async with SyncClient(address, timeout_s=5.0) as c:
        await c.wait_ready()
        for r in ("bench", "slow"):
            await c.register(r, f"http://{r}")
        prompts = (n + 60) * 9 // 8 + 1  # enough tasks for the warm-ups and both claim sizes
        tasks = [PregenTask(f"p{p}", list(range(256)), s, p * 8 + s,
                            SamplingParams(max_new_tokens=256))
                 for p in range(prompts) for s in range(8)]
        await c.open_step(0, {"bench": 1, "slow": 1}, tasks, timeout_s=60)
        await c.report_done(0, "bench")  # "slow" keeps the step running: the bubble
        await c.push_drafts(1, "bench", [PregenDraft("f", s, list(range(256))) for s in range(8)])
        draft = [PregenDraft("x", 0, list(range(256)))]
        return {
            "PollStop": await _time(n, lambda i: c.poll_stop(0, "bench")),
            "ClaimTasks(1)": await _time(n, lambda i: c.claim_tasks(0, "bench", 1)),
            "ClaimTasks(8)": await _time(n // 8, lambda i: c.claim_tasks(0, "bench", 8)),
            "PushDrafts(1x256)": await _time(n, lambda i: c.push_drafts(1, "bench", draft)),
            "FetchDrafts(8x256)": await _time(n, lambda i: c.fetch_drafts(1, ["f"])),
        }


def _server_side_us(metrics_port: int) -> dict[str, float]:
    """Mean in-daemon handler time per method (us), from bubblespec_sync_rpc_duration_seconds."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    sums: dict[str, list[float]] = {}
    pattern = r'bubblespec_sync_rpc_duration_seconds_(sum|count)\{method="(\w+)"\} (\S+)'
    for kind, method, value in re.findall(pattern, text):
        sums.setdefault(method, [0.0, 0.0])[kind == "count"] = float(value)
    return {m: round(1e6 * s / c, 1) for m, (s, c) in sorted(sums.items()) if c}


def run(n: int = 2000) -> dict[str, dict[str, float]]:
    """Start a daemon, measure round trips and in-daemon handler time, stop it."""
    proc, address, metrics_port = start_daemon()
    try:
        result = asyncio.run(measure(address, n))
        result["server_handler_mean_us"] = _server_side_us(metrics_port)
        return result
    finally:
        proc.terminate()
        proc.wait(timeout=10)

