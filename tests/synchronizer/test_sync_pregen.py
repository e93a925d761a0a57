"""Pre-generation queue: breadth-first, first come first served, no duplicates, requeue."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
import pytest

from bubblespec.protocol.domain import PregenDraft, PregenTask, RankState, RankStatus
from bubblespec.protocol.sampling import PregenWindow
from bubblespec.rpc.v1 import synchronizer_pb2 as pb
from bubblespec.synchronizer.pregen import TaskQueue

from .helpers import eventually, make_tasks, serving, stub


def keys(tasks: Sequence[PregenTask]) -> list[tuple[str, int]]:
    return [(t.prompt_key, t.sample_index) for t in tasks]


def test_queue_order_is_breadth_first_and_requeue_keeps_it() -> None:
    q = TaskQueue(1, make_tasks(3, 2))
    assert keys(q.claim("a", 2)) == [("p0", 0), ("p1", 0)]
    assert keys(q.claim("b", 2)) == [("p2", 0), ("p0", 1)]
    assert q.release("a") == 2  # a's tasks come back ahead of every sample-1 task
    assert keys(q.claim("b", 10)) == [("p0", 0), ("p1", 0), ("p1", 1), ("p2", 1)]
    assert q.complete(("p0", 1)) and not q.complete(("p0", 1)) and not q.complete(("zz", 0))
    assert (q.queued, q.claimed, q.completed) == (0, 5, 1)


async def test_two_ranks_claim_breadth_first_without_duplicates() -> None:
    async with serving() as (_, client):
        for r in ("r0", "r1", "slow"):
            await client.register(r, r)
        await client.open_step(0, {"r0": 1, "r1": 1, "slow": 1}, make_tasks(4, 3))
        await client.report_done(0, "r0")
        first = await client.claim_tasks(0, "r0", 3)
        assert keys(first.tasks) == [("p0", 0), ("p1", 0), ("p2", 0)]
        assert (first.target_step, first.stop, first.remaining) == (1, False, 9)
        assert first.tasks[0].seed == 0 and first.tasks[1].prompt_token_ids == [1, 2, 4]
        assert first.tasks[0].sampling.top_k == 20
        await client.report_done(0, "r1")
        claims = await asyncio.gather(*(client.claim_tasks(0, r, 2)
                                        for r in ("r1", "r0", "r1", "r0", "r1")))
        order = [(f"p{p}", s) for s in range(3) for p in range(4)]  # breadth-first
        # concurrent claims reach the daemon in any order; each takes the next tasks of the
        # queue, so in the order the daemon served them they continue the first claim's
        served = sorted((keys(c.tasks) for c in claims), key=lambda ks: order.index(ks[0]))
        got = keys(first.tasks) + [k for ks in served for k in ks]
        assert len(got) == len(set(got)) == 12  # every task exactly once
        assert got == order
        assert (await client.claim_tasks(0, "r0", 5)).tasks == []  # queue empty, no stop yet
        await client.report_done(0, "slow")
        after = await client.claim_tasks(0, "r0", 5)
        assert after.stop and after.tasks == []


async def test_claim_requires_done_and_is_empty_after_stop() -> None:
    async with serving() as (server, client):
        await client.register("r0", "a")
        await client.register("r1", "b")
        await client.register("idle", "c")
        await client.open_step(0, {"r0": 1, "r1": 1}, make_tasks(2, 1))
        channel, raw = stub(server.address)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await raw.ClaimTasks(pb.ClaimTasksRequest(step=0, rank_id="r0", max_tasks=1))
        assert e.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "rank_id" in e.value.details() and "bubble" in e.value.details()
        # the client degrades (rank decodes on), a rank outside the step may claim at once
        assert (await client.claim_tasks(0, "r0", 1)).tasks == []
        assert len((await client.claim_tasks(0, "idle", 1)).tasks) == 1
        # a tail-fill claim: a rank still decoding its shard takes lanes beside it
        tail = await client.claim_tasks(0, "r1", 1, tail_fill=True)
        assert keys(tail.tasks) == [("p1", 0)] and not tail.stop
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await raw.ClaimTasks(pb.ClaimTasksRequest(step=1, rank_id="idle", max_tasks=1))
        assert e.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        await client.report_done(0, "r0")
        await client.report_done(0, "r1")
        assert (await client.claim_tasks(0, "r0", 5)).tasks == []
        await channel.close()


async def test_lost_rank_tasks_go_back_to_the_queue_and_complete_ones_do_not() -> None:
    # "dies" never beats: the time from its registration to its push must stay under the
    # rank timeout on a loaded host (0.3 s did not, once), and its loss comes after that
    async with serving(heartbeat_interval_s=0.05, rank_timeout_s=1.5) as (_, client):
        for r in ("dies", "r1", "slow"):
            await client.register(r, r)
        await client.open_step(0, {"dies": 1, "r1": 1, "slow": 1}, make_tasks(3, 2))
        stop = asyncio.Event()
        beats = [asyncio.create_task(client.run_heartbeats(
            r, lambda: RankStatus(RankState.PREGEN), stop)) for r in ("r1", "slow")]
        await client.report_done(0, "dies")
        held = await client.claim_tasks(0, "dies", 3)
        assert keys(held.tasks) == [("p0", 0), ("p1", 0), ("p2", 0)]
        res = await client.push_drafts(1, "dies", [PregenDraft("p1", 0, [7, 8, 9], complete=True)])
        assert res.stored == 1
        assert (await client.get_state()).claimed_tasks == 2  # p1/0 is complete

        async def lost() -> bool:
            return any(r.state is RankState.LOST for r in (await client.get_state()).ranks)

        await eventually(lost, timeout_s=10.0)
        await client.report_done(0, "r1")
        again = await client.claim_tasks(0, "r1", 10)
        # p1's sample 0 completed (3 tokens): p1 is known short, so behind p0 and p2
        assert keys(again.tasks) == [("p0", 0), ("p2", 0), ("p0", 1), ("p2", 1), ("p1", 1)]
        assert not await client.poll_stop(0, "r1")  # "slow" is alive and not done
        stop.set()
        await asyncio.gather(*beats)


async def test_training_window_hands_out_tasks_after_the_stop_until_the_close() -> None:
    async with serving() as (_server, client):
        for r in ("r0", "r1"):
            await client.register(r, r)
        await client.open_step(0, {"r0": 1, "r1": 1}, make_tasks(2, 2),
                               pregen_window=PregenWindow.TRAINING)
        await client.report_done(0, "r0")
        assert await client.poll_pregen(0, "r0") == (False, False)
        await client.report_done(0, "r1")  # the stop signal fires: the bubble is over
        assert await client.poll_stop(0, "r0")
        assert await client.poll_pregen(0, "r1") == (True, False)  # the window is not
        claim = await client.claim_tasks(0, "r1", 3)
        assert len(claim.tasks) == 3 and not claim.stop and claim.target_step == 1
        res = await client.push_drafts(1, "r1", [PregenDraft("p0", 0, [5, 6], complete=True)])
        assert res.stored == 1
        await client.close_step(0)  # the next step (or the weight push) ends the window
        assert await client.poll_pregen(0, "r1") == (True, True)
        after = await client.claim_tasks(0, "r0", 3)
        assert after.stop and after.tasks == []
        await client.push_drafts(1, "r1", [PregenDraft("p1", 0, [7], complete=False)])
        await client.open_step(1, {"r0": 1})
        got = {(d.prompt_key, d.sample_index): list(d.token_ids)
               for d in await client.fetch_drafts(1, ["p0", "p1"])}
        assert got == {("p0", 0): [5, 6], ("p1", 0): [7]}  # pushes up to the fetch are kept


async def test_bubble_window_ends_pregen_at_the_stop_and_bad_window_is_invalid() -> None:
    async with serving() as (server, client):
        await client.register("r0", "a")
        await client.open_step(0, {"r0": 1}, make_tasks(1, 2))
        assert await client.poll_pregen(0, "r0") == (False, False)
        await client.report_done(0, "r0")
        assert await client.poll_pregen(0, "r0") == (True, True)
        assert await client.poll_pregen(7, "r0") == (True, True)  # not the current step
        channel, raw = stub(server.address)
        bad = pb.OpenStepRequest(step=1, shards=[pb.ShardAssignment(rank_id="r0",
                                                                     num_requests=1)],
                                 pregen_window=9)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await raw.OpenStep(bad)
        assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "pregen_window" in e.value.details()
        await channel.close()
