"""The journal: a daemon restarted on its journal comes back with its step, ranks, queue and
every draft it acknowledged; the file stays bounded; a torn or foreign file is handled."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from bubblespec.protocol.domain import DraftStatus, PregenDraft, RankState, RankStatus
from bubblespec.synchronizer.client import SyncClient
from bubblespec.synchronizer.journal import MAGIC, Journal, JournalError
from bubblespec.synchronizer.server import SyncServer

from .helpers import Daemon, config, eventually, make_tasks, open_with_idle_ranks, serving


def _drafts(keys: list[tuple[str, int]], n: int = 8, complete: bool = True
            ) -> list[PregenDraft]:
    return [PregenDraft(k, i, [10 + i, 20 + len(k), *range(n - 2)], complete=complete)
            for k, i in keys]


def _store_view(server: SyncServer, step: int, keys: list[str]) -> list[tuple]:
    drafts, _ = server.state.store.fetch(step, keys)
    return [(d.prompt_key, d.sample_index, list(d.token_ids), d.complete) for d in drafts]


async def test_a_restarted_daemon_has_the_step_queue_and_acknowledged_drafts(tmp_path: Path
                                                                            ) -> None:
    path = tmp_path / "sync.journal"
    keys = [f"p{p}" for p in range(4)]
    async with serving(journal_path=str(path)) as (first, c):
        await open_with_idle_ranks(c, make_tasks(4, 2))
        got0 = (await c.claim_tasks(0, "r0", 3)).tasks
        res = await c.push_drafts(1, "r0", _drafts([(t.prompt_key, t.sample_index)
                                                    for t in got0[:2]]))
        assert res.statuses == [DraftStatus.STORED] * 2
        partial = await c.push_drafts(1, "r0", _drafts([(got0[2].prompt_key,
                                                         got0[2].sample_index)],
                                                       complete=False))
        assert partial.stored == 1
        before = _store_view(first, 1, keys)
        queued = len(first.state.current.queue)
        # the file as it is while the first still runs: as after a SIGKILL, it holds what
        # the first acknowledged (records reach the OS before the reply)
        (tmp_path / "copy").write_bytes(path.read_bytes())
    async with SyncServer(config(journal_path=str(tmp_path / "copy"))) as second:
        assert second.replayed[1] == 0 and second.replayed[0] > 0
        cur = second.state.current
        assert cur is not None and cur.step == 0 and cur.stop_unix_s is None
        assert cur.done == {"r0", "r1"} and cur.pending == ["slow"]
        assert _store_view(second, 1, keys) == before
        assert len(cur.queue) == queued
        async with SyncClient(second.address, timeout_s=2.0) as c2:
            # no re-registration needed; the claim goes on where the first daemon was,
            # so nothing r0 holds is handed out twice
            reply = await c2.heartbeat("r1", RankStatus(RankState.IDLE))
            assert reply.current_step == 0
            got1 = (await c2.claim_tasks(0, "r1", 16)).tasks
            handed = {(t.prompt_key, t.sample_index) for t in got0}
            assert handed.isdisjoint({(t.prompt_key, t.sample_index) for t in got1})
            assert len(got1) == 8 - len(got0)
            assert await c2.report_done(0, "slow")  # the step's stop fires on the new daemon
            fetched = await c2.fetch_drafts(1, keys)
            assert sorted((d.prompt_key, d.sample_index) for d in fetched if d.complete) == \
                sorted((t.prompt_key, t.sample_index) for t in got0[:2])


async def test_the_journal_stays_bounded_and_replays_the_newest_steps(tmp_path: Path) -> None:
    path = tmp_path / "sync.journal"
    big = 2000
    async with serving(journal_path=str(path)) as (server, c):
        for r in ("r0", "r1"):
            await c.register(r, r)
        sizes = []
        for step in range(8):
            await c.open_step(step, {"r0": 1, "r1": 1}, make_tasks(2, 2))
            await c.report_done(step, "r0")
            tasks = (await c.claim_tasks(step, "r0", 8)).tasks
            await c.push_drafts(step + 1, "r0", _drafts(
                [(t.prompt_key, t.sample_index) for t in tasks], n=big))
            await c.report_done(step, "r1")
            sizes.append(path.stat().st_size)
        assert server.journal is not None and server.journal.compactions >= 2
        # about two steps of drafts at most (the live one and the one being cut)
        assert max(sizes) < 4 * 4 * (4 * big + 200)
        expect = _store_view(server, 8, ["p0", "p1"])
        assert len(expect) == 4
    async with SyncServer(config(journal_path=str(path))) as again:
        assert again.replayed[1] == 0
        assert again.state.current.step == 7 and again.state.current.stop_unix_s is not None
        assert _store_view(again, 8, ["p0", "p1"]) == expect
        assert min(again.state.ranks.infos(), key=lambda r: r.rank_id).rank_id == "r0"


def test_a_torn_last_record_is_dropped_and_a_foreign_file_refused(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j = Journal(path)
    assert j.load() == []
    from bubblespec.rpc.v1 import synchronizer_pb2 as pb
    j.append("RegisterRank", pb.RegisterRankRequest(rank_id="r0", address="a"))
    j.append("CloseStep", pb.CloseStepRequest(step=3))
    j.close()
    whole = path.read_bytes()
    path.write_bytes(whole[:-2])  # died mid-write
    j = Journal(path)
    got = j.load()
    assert [(m, r.rank_id) for m, r in got] == [("RegisterRank", "r0")]
    j.append("CloseStep", pb.CloseStepRequest(step=4))  # appends after the cut
    j.close()
    assert [m for m, _ in Journal(path).load()] == ["RegisterRank", "CloseStep"]
    foreign = tmp_path / "f"
    foreign.write_bytes(b"not a journal")
    with pytest.raises(JournalError, match="not a bubblespec synchronizer journal"):
        Journal(foreign).load()
    assert MAGIC.startswith(b"BSJ")


async def test_sigkilled_mid_bubble_the_restarted_daemon_loses_no_acknowledged_draft(
        tmp_path: Path) -> None:
    """A real daemon process, SIGKILLed while ranks push in the bubble, started again on the
    same port and journal: the step goes on, every draft acknowledged before the kill is
    fetched at the next step, and the ranks' calls succeed without re-registering."""
    flags = ("--heartbeat-interval-s", "0.1", "--rank-timeout-s", "3", "--metrics-port", "-1",
             "--journal-path", str(tmp_path / "sync.journal"))
    first = Daemon(*flags)
    c = SyncClient(first.address, timeout_s=1.0)
    try:
        await c.wait_ready()
        await open_with_idle_ranks(c, make_tasks(8, 4))
        acked: set[tuple[str, int]] = set()
        pushing = True

        async def rank(r: str) -> None:
            while pushing:
                tasks = (await c.claim_tasks(0, r, 2)).tasks
                if not tasks:
                    await asyncio.sleep(0.01)
                    continue
                res = await c.push_drafts(1, r, _drafts(
                    [(t.prompt_key, t.sample_index) for t in tasks]))
                acked.update((t.prompt_key, t.sample_index) for t, s in
                             zip(tasks, res.statuses) if s is DraftStatus.STORED)
                await asyncio.sleep(0.05)  # a chunk's decoding

        workers = [asyncio.create_task(rank(r)) for r in ("r0", "r1")]
        await eventually(lambda: len(acked) >= 6, timeout_s=10)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
        before = set(acked)
        second = Daemon(*flags, port=first.port)
        try:
            assert any("requests replayed (0 refused)" in line for line in second.lines)
            await eventually(lambda: len(acked) > len(before), timeout_s=10)
            pushing = False
            await asyncio.gather(*workers)
            snap = await c.get_state()
            assert sorted(r.rank_id for r in snap.ranks) == ["r0", "r1", "slow"]
            assert snap.current_step == 0
            assert await c.report_done(0, "slow")
            await c.open_step(1, {"r0": 1, "r1": 1, "slow": 1})
            fetched = {(d.prompt_key, d.sample_index)
                       for d in await c.fetch_drafts(1, [f"p{p}" for p in range(8)])}
            assert before <= fetched and acked <= fetched
        finally:
            assert second.stop(signal.SIGTERM) == 0
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
        await c.close()
