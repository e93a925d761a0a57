"""The poison-request policy (`bubblespec/gateway/quarantine.py`), with a fake clock, and
through `dispatch` with ranks whose engines die (faults injected on purpose: the rank calls
are plain functions that raise what a rank with a dead engine answers)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from bubblespec.gateway.dispatch import DispatchError, Poisoned, dispatch
from bubblespec.gateway.errors import RankCallError
from bubblespec.gateway.quarantine import Quarantine, describe, fingerprint
from bubblespec.gateway.shard import WorkItem, lpt
from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.sampling import SamplingParams
from tests.gateway.test_dispatch import reply

TOPK = SamplingParams(top_k=1, max_new_tokens=32)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_fingerprint_is_prompt_and_sampling_not_seeds() -> None:
    a = fingerprint([1, 2, 3], TOPK)
    assert a == fingerprint((1, 2, 3), SamplingParams(top_k=1, max_new_tokens=32))
    assert a != fingerprint([1, 2, 4], TOPK)
    assert a != fingerprint([1, 2, 3], SamplingParams(top_k=2, max_new_tokens=32))
    assert describe(TOPK) == "max_new_tokens=32, top_k=1"
    assert describe(SamplingParams()) == "defaults"


def test_two_deaths_on_two_ranks_quarantine_and_refuse_for_hold_s() -> None:
    clock = Clock()
    q = Quarantine(hold_s=60, suspect_s=60, clock=clock)
    fp, other = fingerprint([1, 9], TOPK), fingerprint([1, 8], TOPK)
    assert q.engine_died("r0", "boom", [(fp, "req A"), (other, "req B")]) == []
    held = q.engine_died("r1", "boom too", [(fp, "req A")])
    assert [h.what for h in held] == ["req A"]
    assert "r0 (boom) and r1 (boom too)" in held[0].reason()
    q.check([[1, 8]], TOPK)  # the other request: one death only, not refused
    with pytest.raises(ApiError) as e:
        q.check([[1, 8], [1, 9]], TOPK)
    assert e.value.status == 422 and e.value.field == "prompts[1]"
    assert "quarantined" in e.value.detail and "r1" in e.value.detail
    clock.t += 61
    q.check([[1, 9]], TOPK)  # the hold is over
    assert q.held_count == 0


def test_a_restarted_engine_dying_again_counts() -> None:
    """The request came back (a retry after its failed step) to the same rank, whose engine
    had been restarted: the second death quarantines it."""
    q = Quarantine(clock=Clock())
    fp = fingerprint([3], TOPK)
    assert q.engine_died("r0", "x", [(fp, "A")]) == []
    assert [h.what for h in q.engine_died("r0", "y", [(fp, "A")])] == ["A"]


def test_suspects_expire_and_completed_requests_are_cleared() -> None:
    clock = Clock()
    q = Quarantine(hold_s=60, suspect_s=10, clock=clock)
    fp = fingerprint([5], TOPK)
    q.engine_died("r0", "x", [(fp, "A")])
    clock.t += 11
    assert q.engine_died("r1", "x", [(fp, "A")]) == []  # the first death is forgotten
    q.cleared([fp])
    assert q.engine_died("r2", "x", [(fp, "A")]) == []


def test_bounded() -> None:
    q = Quarantine(max_entries=5, clock=Clock())
    for i in range(50):
        q.engine_died("r0", "x", [(fingerprint([i], TOPK), str(i))])
        q.engine_died("r1", "x", [(fingerprint([i], TOPK), str(i))])
    assert q.held_count == 5 and len(q._suspects) <= 5


def _items(num: int) -> list[WorkItem]:
    return [WorkItem(i, f"k{i}", (1, i), 0, 2, None, 10.0) for i in range(num)]


def test_dispatch_stops_a_poison_request_at_the_second_engine() -> None:
    """Prompt 1 kills every engine it reaches. The first death re-runs the shard; the
    second ends the step with a 500 naming prompts[1]; the third rank never receives it."""
    q = Quarantine(clock=Clock())
    calls: list[tuple[str, list[int]]] = []

    async def call(rank: str, its: list[WorkItem], rerun: bool, timeout_s: float
                   ) -> dict[str, Any]:
        calls.append((rank, [it.index for it in its]))
        await asyncio.sleep(0.01)
        if any(it.index == 1 for it in its):
            raise RankCallError(rank, "HTTP 503: the engine died", 503, "engine",
                                engine_died=True)
        return reply(rank, its)

    def on_death(rank: str, its: list[WorkItem], reason: str) -> Poisoned | None:
        held = q.engine_died(rank, reason, [(f"fp{it.index}", f"prompts[{it.index}]")
                                            for it in its])
        return Poisoned("killed two engines", held[0].what) if held else None

    assignment = lpt(_items(4), ["r0", "r1", "r2"])
    with pytest.raises(DispatchError) as e:
        asyncio.run(dispatch(assignment, call, timeout_s=10, on_engine_death=on_death))
    assert e.value.status == 500 and e.value.field == "prompts[1]"
    with_poison = [r for r, ix in calls if 1 in ix]
    assert len(with_poison) == 2, calls  # two engines, never a third


def test_dispatch_reruns_after_a_death_without_the_hook_verdict() -> None:
    """One engine death that the hook does not attribute: the shard is re-run and the
    step completes."""
    died = []

    async def call(rank: str, its: list[WorkItem], rerun: bool, timeout_s: float
                   ) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        if rank == "r0":
            raise RankCallError(rank, "HTTP 503: the engine died", 503, "engine",
                                engine_died=True)
        return reply(rank, its)

    def on_death(rank: str, its: list[WorkItem], reason: str) -> Poisoned | None:
        died.append(rank)
        return None

    res = asyncio.run(dispatch(lpt(_items(4), ["r0", "r1"]), call, timeout_s=10,
                               on_engine_death=on_death))
    assert died == ["r0"] and sorted(res.samples) == [0, 1, 2, 3]


class Engines:
    """Fake ranks with one engine each (a fault injected on purpose): a call holding prompt
    `poison` kills its rank's engine, which fails every call running on that rank."""

    def __init__(self, poison: int) -> None:
        self.poison = poison
        self.dead: dict[str, asyncio.Event] = {}
        self.calls: list[tuple[str, list[int]]] = []

    async def call(self, rank: str, its: list[WorkItem], rerun: bool, timeout_s: float
                   ) -> dict[str, Any]:
        self.calls.append((rank, [it.index for it in its]))
        dead = self.dead.setdefault(rank, asyncio.Event())
        if any(it.index == self.poison for it in its):
            await asyncio.sleep(0.01)
            dead.set()
        else:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(dead.wait(), 0.2)
        if dead.is_set():
            raise RankCallError(rank, "HTTP 503: the engine died", 503, "engine",
                                engine_died=True)
        return reply(rank, its)


def test_a_death_counts_every_call_on_the_dead_engine_once() -> None:
    """r1 dies of the poison; its re-run joins r0's own shard in r0's engine, which dies:
    the poison was at two deaths even when r0's own shard is reported first, and the
    step ends with the 500 naming it, not with "no rank left"."""
    q = Quarantine(clock=Clock())
    seen: list[tuple[str, list[int]]] = []

    def on_death(rank: str, its: list[WorkItem], reason: str) -> Poisoned | None:
        seen.append((rank, sorted(it.index for it in its)))
        held = q.engine_died(rank, reason, [(f"fp{it.index}", f"prompts[{it.index}]")
                                            for it in its])
        return Poisoned("killed two engines", held[0].what) if held else None

    engines = Engines(poison=1)
    assignment = {"r0": [_items(2)[0]], "r1": [_items(2)[1]]}
    with pytest.raises(DispatchError) as e:
        asyncio.run(dispatch(assignment, engines.call, timeout_s=10, on_engine_death=on_death))
    assert e.value.status == 500 and e.value.field == "prompts[1]", e.value
    assert seen == [("r1", [1]), ("r0", [0, 1])], seen


def test_hold_zero_names_the_request_but_never_refuses_it() -> None:
    q = Quarantine(hold_s=0, clock=Clock())
    fp = fingerprint([7], TOPK)
    q.engine_died("r0", "x", [(fp, "A")])
    held = q.engine_died("r1", "x", [(fp, "A")])
    assert [h.fingerprint for h in held] == [fp]
    q.check([[7]], TOPK)
