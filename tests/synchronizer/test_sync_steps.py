"""Step lifecycle: open, done reports, stop via WatchStep and via PollStop, close, re-open."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from bubblespec.protocol.domain import StepEvent, StepEventKind
from bubblespec.synchronizer.client import SyncClient
from bubblespec.synchronizer.errors import SyncError

from .helpers import make_tasks, serving


async def _register(client: SyncClient, *ranks: str) -> None:
    for r in ranks:
        await client.register(r, f"http://{r}")


async def test_stop_fires_when_last_rank_is_done_via_poll_and_stream() -> None:
    async with serving() as (_, client):
        await _register(client, "r0", "r1", "r2")
        res = await client.open_step(0, {"r0": 4, "r1": 4, "r2": 0}, make_tasks(3, 2))
        assert (res.step, res.num_tasks, res.already_open) == (0, 6, False)
        events: list[StepEvent] = []

        async def watch() -> None:
            async for ev in client.watch_step(0, "r1"):
                events.append(ev)
                if ev.kind is StepEventKind.STOP:
                    return

        watcher = asyncio.create_task(watch())
        assert not await client.poll_stop(0, "r0")
        assert not await client.report_done(0, "r0")
        assert not await client.poll_stop(0, "r1")
        state = await client.get_state()
        assert state.pending_rank_ids == ["r1"]  # r2 has 0 requests: done from the start
        assert await client.report_done(0, "r1")  # the last one: stop fires
        assert await client.poll_stop(0, "r0")
        await asyncio.wait_for(watcher, 2)
        assert [e.kind for e in events] == [StepEventKind.OPENED, StepEventKind.STOP]
        assert all(e.step == 0 for e in events)
        # a late watcher gets the current state at once
        assert await client.wait_stop(0, "r2", timeout_s=1)


async def test_next_open_closes_previous_and_old_steps_read_as_stopped() -> None:
    async with serving() as (_, client):
        await _register(client, "r0")
        await client.open_step(0, {"r0": 1})
        waiting = asyncio.create_task(client.wait_stop(0, "r0", timeout_s=3))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await client.open_step(1, {"r0": 1})  # ends step 0: the stop signal must fire
        assert await waiting
        assert await client.poll_stop(0, "r0") and not await client.poll_stop(1, "r0")
        assert await client.poll_stop(7, "r0")  # unknown future step: do not pre-generate
        await client.close_step(1)
        assert await client.poll_stop(1, "r0")
        await client.close_step(1)  # idempotent
        snap = await client.get_state()
        assert (snap.current_step, snap.step_open, snap.stopped) == (1, False, True)
        with pytest.raises(SyncError) as e:
            await client.close_step(2)
        assert e.value.code is grpc.StatusCode.FAILED_PRECONDITION and e.value.field == "step"


async def test_reopen_rules() -> None:
    async with serving() as (_, client):
        await _register(client, "r0", "r1")
        first = await client.open_step(3, {"r0": 2}, make_tasks(2, 2))
        again = await client.open_step(3, {"r0": 2}, make_tasks(2, 2))  # retried: accepted
        assert again.already_open and again.opened_unix_s == first.opened_unix_s
        for step, shards in ((3, {"r0": 3}), (2, {"r0": 2})):
            with pytest.raises(SyncError) as e:
                await client.open_step(step, shards)
            assert e.value.code is grpc.StatusCode.INVALID_ARGUMENT and e.value.field == "step"
        await client.close_step(3)
        with pytest.raises(SyncError):  # a closed step cannot come back
            await client.open_step(3, {"r0": 2}, make_tasks(2, 2))
        await client.open_step(5, {"r1": 1})  # gaps are fine


async def test_watch_stream_follows_several_steps() -> None:
    async with serving() as (_, client):
        await _register(client, "r0")
        seen: list[tuple[StepEventKind, int]] = []

        async def watch() -> None:
            async for ev in client.watch_step(0, "r0"):
                seen.append((ev.kind, ev.step))
                if (ev.kind, ev.step) == (StepEventKind.CLOSED, 1):
                    return

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0.05)
        await client.open_step(0, {"r0": 1})
        await client.report_done(0, "r0")
        await client.open_step(1, {"r0": 1})
        await client.close_step(1)
        await asyncio.wait_for(watcher, 2)
        K = StepEventKind
        assert seen == [(K.OPENED, 0), (K.STOP, 0), (K.CLOSED, 0), (K.OPENED, 1), (K.STOP, 1),
                        (K.CLOSED, 1)]
