"""Dispatch: shards run concurrently; failed ranks' shards re-run; nothing lost or doubled.

`dispatch` takes the rank call as a function, so these tests drive it with plain async
functions that answer like a rank would (a StepShardResult), fail, hang or misbehave.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bubblespec.gateway.dispatch import DispatchError, dispatch
from bubblespec.gateway.errors import RankCallError
from bubblespec.gateway.shard import WorkItem, lpt


def items(num: int, n: int = 2, cost: float = 10.0) -> list[WorkItem]:
    return [WorkItem(i, f"k{i}", (1, i), 0, n, None, cost) for i in range(num)]


def reply(rank: str, its: list[WorkItem], drop: int = 0) -> dict[str, Any]:
    results = []
    for it in its:
        samples = [{"sample_index": it.sample_offset + j, "output_ids": [it.index, j],
                    "output_logprobs": [-0.1, -0.2], "meta_info": {"rank": rank}}
                   for j in range(it.n)]
        results.append({"index": it.index, "prompt_key": it.key, "samples": samples})
    if drop:
        results[0]["samples"] = results[0]["samples"][drop:]
    return {"step": 1, "rank_id": rank, "results": results, "decode_seconds": 0.5}


class Ranks:
    """Rank behaviours by name: ok, fail, hang, refuse, short (drops a sample)."""

    def __init__(self, **behaviour: str) -> None:
        self.behaviour = behaviour
        self.calls: list[tuple[str, list[int], bool]] = []
        self.failed: list[str] = []

    async def call(self, rank: str, its: list[WorkItem], rerun: bool, timeout_s: float
                   ) -> dict[str, Any]:
        assert timeout_s > 0
        self.calls.append((rank, [it.index for it in its], rerun))
        how = self.behaviour.get(rank, "ok")
        await asyncio.sleep(0.01)
        if how == "fail":
            raise RankCallError(rank, "POST /v1/step_shard: ConnectError: refused")
        if how == "refuse":
            raise RankCallError(rank, "HTTP 400: bad token id", 400,
                                "requests[0].input_ids[3]", bad_request=True)
        if how == "hang":
            await asyncio.sleep(3600)
        if how == "slow":
            await asyncio.sleep(0.5)
        if how == "slowfail":
            await asyncio.sleep(0.1)
            raise RankCallError(rank, "RemoteProtocolError: server disconnected")
        return reply(rank, its, drop=1 if how == "short" else 0)

    async def on_failure(self, rank: str, reason: str) -> None:
        self.failed.append(rank)


def check_complete(res: Any, num: int, n: int) -> None:
    assert sorted(res.samples) == list(range(num))
    for index, samples in res.samples.items():
        assert sorted(s.sample.sample_index for s in samples) == list(range(n))
        assert all(s.sample.output_ids[0] == index for s in samples)


async def test_all_ranks_ok() -> None:
    ranks = Ranks()
    res = await dispatch(lpt(items(6), ["r0", "r1", "r2"]), ranks.call, timeout_s=5)
    check_complete(res, 6, 2)
    assert not res.failed and not res.reruns
    assert sorted(r for r, _, _ in ranks.calls) == ["r0", "r1", "r2"]
    assert all(run.result is not None for run in res.runs)


async def test_failed_rank_shard_reruns_on_live_ranks() -> None:
    ranks = Ranks(r1="fail")
    res = await dispatch(lpt(items(6), ["r0", "r1", "r2"]), ranks.call, timeout_s=5,
                         on_failure=ranks.on_failure)
    check_complete(res, 6, 2)
    assert ranks.failed == ["r1"] and list(res.failed) == ["r1"]
    lost = next(ix for r, ix, rerun in ranks.calls if r == "r1")
    rerun_calls = [(r, ix) for r, ix, rerun in ranks.calls if rerun]
    assert sorted(i for _, ix in rerun_calls for i in ix) == sorted(lost)
    assert {r for r, _ in rerun_calls} <= {"r0", "r2"}
    assert all(s.rank_id != "r1" for ss in res.samples.values() for s in ss)
    assert sorted(i for _, _, ix, _ in res.reruns for i in ix) == sorted(lost)


async def test_rerun_prefers_ranks_with_less_work_left() -> None:
    ranks = Ranks(r0="slow", r1="slowfail")
    assignment = {"r0": items(1, cost=1000.0), "r1": items(3)[1:],
                  "r2": [WorkItem(5, "k5", (1, 5), 0, 2, None, 1.0)]}
    res = await dispatch(assignment, ranks.call, timeout_s=5)
    # r0 still runs (slowly) a 1000-cost item: both re-run prompts go to r2
    assert {to for _, to, _, _ in res.reruns} == {"r2"}
    assert sorted(res.samples) == [0, 1, 2, 5]


async def test_rerun_rank_failing_too_is_handled_until_none_is_left() -> None:
    ranks = Ranks(r0="fail", r1="slowfail")
    with pytest.raises(DispatchError) as e:
        await dispatch(lpt(items(4), ["r0", "r1"]), ranks.call, timeout_s=5,
                       on_failure=ranks.on_failure)
    assert e.value.status == 503
    assert e.value.ranks == ["r0", "r1"]
    assert "r0" in str(e.value) and "r1" in str(e.value)
    assert sorted(ranks.failed) == ["r0", "r1"]


async def test_short_reply_counts_as_a_failure_and_is_rerun_whole() -> None:
    ranks = Ranks(r0="short")
    res = await dispatch(lpt(items(4), ["r0", "r1"]), ranks.call, timeout_s=5)
    check_complete(res, 4, 2)
    assert "missing" in res.failed["r0"]
    assert all(s.rank_id == "r1" for ss in res.samples.values() for s in ss)


async def test_refused_body_fails_the_call_with_the_ranks_field() -> None:
    ranks = Ranks(r1="refuse")
    with pytest.raises(DispatchError) as e:
        await dispatch(lpt(items(4), ["r0", "r1"]), ranks.call, timeout_s=5)
    assert e.value.status == 400 and e.value.field == "requests[0].input_ids[3]"
    assert e.value.ranks == ["r1"]


async def test_deadline_names_the_ranks_still_running() -> None:
    ranks = Ranks(r1="hang")
    with pytest.raises(DispatchError) as e:
        await dispatch(lpt(items(4), ["r0", "r1"]), ranks.call, timeout_s=0.3)
    assert e.value.status == 504 and e.value.ranks == ["r1"]


async def test_max_reruns() -> None:
    ranks = Ranks(r0="fail", r1="fail")
    with pytest.raises(DispatchError, match="giving up after 0 re-runs"):
        await dispatch(lpt(items(4), ["r0", "r1", "r2"]), ranks.call, timeout_s=5,
                       max_reruns=0)


async def test_split_items_of_one_prompt_merge_back() -> None:
    its = [WorkItem(0, "k0", (1,), 0, 3, None, 3.0), WorkItem(0, "k0", (1,), 3, 2, None, 2.0)]
    ranks = Ranks(r1="fail")
    res = await dispatch(lpt(its, ["r0", "r1"]), ranks.call, timeout_s=5)
    assert sorted(s.sample.sample_index for s in res.samples[0]) == [0, 1, 2, 3, 4]


async def test_empty_shards_are_sent_only_when_asked() -> None:
    ranks = Ranks()
    assignment = lpt(items(1), ["r0", "r1"])
    await dispatch(assignment, ranks.call, timeout_s=5)
    assert [r for r, _, _ in ranks.calls] == ["r0"]
    ranks = Ranks()
    res = await dispatch(assignment, ranks.call, timeout_s=5, send_empty=True)
    assert sorted(r for r, _, _ in ranks.calls) == ["r0", "r1"]
    assert sorted(res.samples) == [0]


async def test_a_hanging_rank_marked_lost_is_dropped_and_its_shard_rerun() -> None:
    """A frozen rank never answers nor closes its connection: without the synchronizer's LOST
    mark the step would wait for it until the deadline (this test's 30 s)."""
    ranks = Ranks(r1="hang")
    asked = 0

    async def lost() -> set[str]:
        nonlocal asked
        asked += 1
        return {"r1"} if asked >= 2 else set()

    t0 = asyncio.get_running_loop().time()
    res = await dispatch(lpt(items(6), ["r0", "r1", "r2"]), ranks.call, timeout_s=30,
                         on_failure=ranks.on_failure, lost=lost, lost_poll_s=0.05)
    assert asyncio.get_running_loop().time() - t0 < 5
    check_complete(res, 6, 2)
    assert ranks.failed == ["r1"] and "LOST" in res.failed["r1"]
    hung = next(ix for r, ix, rerun in ranks.calls if r == "r1")
    assert sorted(i for _, _, ix, _ in res.reruns for i in ix) == sorted(hung)
    assert {to for _, to, _, _ in res.reruns} <= {"r0", "r2"}
    assert all(s.rank_id != "r1" for ss in res.samples.values() for s in ss)
    assert [run.error for run in res.runs if run.rank_id == "r1"] == [res.failed["r1"]]


async def test_lost_ranks_without_running_calls_and_failed_asks_change_nothing() -> None:
    """LOST names a rank that already answered (its reply is kept), and an ask that fails
    counts as no news."""
    ranks = Ranks(r1="slow")
    calls = 0

    async def lost() -> set[str]:
        nonlocal calls
        calls += 1
        if calls % 2:
            raise RuntimeError("synchronizer unreachable")
        return {"r0"}

    res = await dispatch(lpt(items(4), ["r0", "r1"]), ranks.call, timeout_s=5, lost=lost,
                         lost_poll_s=0.02)
    check_complete(res, 4, 2)
    assert calls >= 2 and not res.failed and not res.reruns
