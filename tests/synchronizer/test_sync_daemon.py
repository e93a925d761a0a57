"""The daemon as a process: restart on the same port, signals, metrics endpoint, CLI."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest

from bubblespec.protocol.domain import (
    DraftStatus,
    PregenDraft,
    RankState,
    RankStatus,
    StepEventKind,
)
from bubblespec.synchronizer.client import SyncClient
from bubblespec.synchronizer.errors import SyncUnavailable

from .helpers import REPO_ROOT, Daemon, eventually, make_tasks, serving

FAST = ("--heartbeat-interval-s", "0.1", "--rank-timeout-s", "3", "--metrics-port", "-1",
        "--shutdown-grace-s", "0.5")


async def test_restart_on_same_port_rank_reregisters_and_continues() -> None:
    first = Daemon(*FAST)
    client = SyncClient(first.address, timeout_s=0.5)
    try:
        await client.wait_ready()
        await client.register("r0", "http://r0")
        stop = asyncio.Event()
        beats = asyncio.create_task(
            client.run_heartbeats("r0", lambda: RankStatus(RankState.IDLE), stop))
        await client.open_step(0, {"r0": 1}, make_tasks(2, 1))
        old_id = (await client.get_state()).instance_id
        seen: list[tuple[StepEventKind, int]] = []

        async def watch() -> None:  # one watch_step iterator across the restart
            async for ev in client.watch_step(0, "r0", max_reconnect_delay_s=0.2):
                seen.append((ev.kind, ev.step))
                if (ev.kind, ev.step) == (StepEventKind.STOP, 1):
                    return

        watcher = asyncio.create_task(watch())
        await eventually(lambda: seen == [(StepEventKind.OPENED, 0)])
        assert first.stop(signal.SIGTERM) == 0  # graceful
        assert any("stopped" in line for line in first.lines)

        # synchronizer down: the decode path degrades, the control plane raises
        assert not await client.poll_stop(0, "r0")
        assert (await client.claim_tasks(0, "r0", 4)).tasks == []
        assert await client.fetch_drafts(1, ["p0"]) == []
        res = await client.push_drafts(1, "r0", [PregenDraft("p0", 0, [1, 2])])
        assert res.statuses == [DraftStatus.UNAVAILABLE]
        assert not await client.report_done(0, "r0")
        with pytest.raises(SyncUnavailable):
            await client.open_step(1, {"r0": 1})

        second = Daemon(*FAST, port=first.port)
        try:
            async def reregistered() -> bool:
                try:
                    snap = await client.get_state()
                except SyncUnavailable:
                    return False
                return [r.rank_id for r in snap.ranks] == ["r0"]

            await eventually(reregistered, timeout_s=10)
            assert (await client.get_state()).instance_id != old_id
            # the new daemon has no step: old-step calls degrade instead of failing
            assert (await client.claim_tasks(0, "r0", 4)).tasks == []
            await client.open_step(1, {"r0": 1}, make_tasks(1, 1))
            assert await client.report_done(1, "r0")
            assert await client.poll_stop(1, "r0")
            await asyncio.wait_for(watcher, 5)
            # STOP/CLOSED of step 0 came from the first daemon's graceful shutdown or not at
            # all; after the reconnect the stream resumed with step 1
            assert seen[0] == (StepEventKind.OPENED, 0)
            assert seen[-2:] == [(StepEventKind.OPENED, 1), (StepEventKind.STOP, 1)]
        finally:
            stop.set()
            await beats
            assert second.stop(signal.SIGINT) == 0
    finally:
        await client.close()


async def test_metrics_endpoint_exposes_the_documented_names() -> None:
    async with serving(metrics_port=0, metrics_host="127.0.0.1",
                       draft_store_budget_bytes=200) as (server, client):
        await client.register("r0", "a")
        await client.register("r1", "b")
        await client.open_step(0, {"r0": 1, "r1": 1}, make_tasks(2, 2))
        await client.report_done(0, "r0")
        await client.claim_tasks(0, "r0", 2)
        await client.push_drafts(1, "r0", [PregenDraft("p0", 0, [1] * 10), PregenDraft("p1", 0, [1] * 90)])
        await client.poll_stop(0, "r0")
        await client.report_done(0, "r1")
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
        text = text.decode()
    for needle in (
        'bubblespec_sync_rpc_duration_seconds_bucket{le="2500.0",method="PollStop"} 1.0',
        'bubblespec_sync_ranks{state="idle"} 2.0',
        'bubblespec_sync_ranks{state="lost"} 0.0',
        "bubblespec_sync_step 0.0",
        "bubblespec_step_duration_seconds_count 1.0",
        "bubblespec_pregen_tasks_claimed_total 2.0",
        'bubblespec_pregen_tasks_handed_total{kind="fresh"} 4.0',
        'bubblespec_pregen_tasks_handed_total{kind="refresh"} 0.0',
        "bubblespec_pregen_tasks_queued 2.0",
        "bubblespec_draft_store_sequences 1.0",
        "bubblespec_draft_store_tokens 10.0",
        "bubblespec_draft_store_bytes 1",
        'bubblespec_draft_store_rejected_total{reason="rejected_full"} 1.0',
        "bubblespec_build_info{",
        'role="synchronizer"',
    ):
        assert needle in text, needle


def test_cli_help_config_file_and_env(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "bubblespec.cli.main", "sync"]
    help_ = subprocess.run([*run, "--help"], cwd=REPO_ROOT, capture_output=True, text=True,
                           timeout=30, check=False)
    assert help_.returncode == 0
    assert "--rank-timeout-s" in help_.stdout and "BUBBLESPEC_RANK_TIMEOUT_S" in help_.stdout
    assert "marked LOST" in help_.stdout  # field descriptions are the help text
    bad = subprocess.run([*run, "--rank-timeout-s", "0.5", "--heartbeat-interval-s", "1"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=30, check=False)
    assert bad.returncode == 2 and "rank_timeout_s" in bad.stderr

    cfg = tmp_path / "sync.yaml"
    cfg.write_text("poll_every_decode_steps: 5\ntimeline_keep_steps: 3\nmetrics_port: -1\n")
    d = Daemon("--config", str(cfg), "--timeline-keep-steps", "4",
               env={"BUBBLESPEC_TOKEN": "tkn", "BUBBLESPEC_POLL_EVERY_DECODE_STEPS": "6"})
    try:
        effective = next(line for line in d.lines if "effective config" in line)
        assert '"timeline_keep_steps": 4' in effective  # CLI beats the file
        assert '"poll_every_decode_steps": 6' in effective  # env beats the file
        assert '"token": "**********"' in effective and "tkn" not in effective

        async def check() -> None:
            async with SyncClient(d.address, token="tkn") as c:
                await c.wait_ready()
                assert (await c.register("r", "x")).poll_every_decode_steps == 6
            async with SyncClient(d.address) as c:
                with pytest.raises(Exception) as e:
                    await c.register("r", "x")
                assert e.value.code is grpc.StatusCode.UNAUTHENTICATED

        asyncio.run(check())
    finally:
        assert d.stop() == 0


async def test_a_heartbeat_reaches_a_restarted_daemon_within_the_retry_not_the_interval(
        tmp_path: Path) -> None:
    """Heartbeats every 5 s; the daemon SIGKILLed and started again on its journal: the
    rank's beat, retried every 0.25 s while it is unreachable, reaches it within about a
    second of its start (the channel's reconnect backoff is at most 1 s), not 5 s later."""
    flags = ("--heartbeat-interval-s", "5", "--rank-timeout-s", "30", "--metrics-port", "-1",
             "--journal-path", str(tmp_path / "j"))
    first = Daemon(*flags)
    client = SyncClient(first.address, timeout_s=0.5)
    stop = asyncio.Event()
    beats = None
    try:
        await client.wait_ready()
        await client.register("r0", "http://r0")
        beats = asyncio.create_task(
            client.run_heartbeats("r0", lambda: RankStatus(RankState.IDLE, done_step=4), stop))
        await asyncio.sleep(0.2)  # the first beat went through
        first.proc.kill()
        first.proc.wait(10)
        await eventually(lambda: client._unreachable, timeout_s=12)  # a beat failed
        second = Daemon(*flags, port=first.port)
        try:
            up = asyncio.get_running_loop().time()

            async def heard() -> bool:
                try:
                    snap = await client.get_state()
                except SyncUnavailable:
                    return False
                return snap.ranks[0].done_step == 4 and snap.ranks[0].last_heartbeat_age_s < (
                    asyncio.get_running_loop().time() - up)

            await eventually(heard, timeout_s=10)
            assert asyncio.get_running_loop().time() - up < 2.5
        finally:
            stop.set()
            await beats
            beats = None
            assert second.stop(signal.SIGTERM) == 0
    finally:
        stop.set()
        if beats is not None:
            await beats
        if first.proc.poll() is None:
            first.proc.kill()
        await client.close()
