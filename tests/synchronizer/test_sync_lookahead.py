"""Prompts handed several steps ahead: per-step queues, nearest step first, drafts kept
across closes, and drafts stored earlier skipped (done) or refreshed (older weights)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import grpc
import pytest

from bubblespec.protocol.domain import DraftStatus, PregenDraft, PregenTask
from bubblespec.rpc.v1 import synchronizer_pb2 as pb
from bubblespec.synchronizer import convert as cv
from bubblespec.synchronizer.lookahead import Lookahead

from .helpers import make_tasks, serving, stub


def ahead(tasks: Sequence[PregenTask], step: int) -> list[PregenTask]:
    return [dataclasses.replace(t, step=step) for t in tasks]


def keys(tasks: Sequence[PregenTask]) -> list[tuple[int | None, str, int]]:
    return [(t.step, t.prompt_key, t.sample_index) for t in tasks]


def test_claims_take_the_nearest_step_first_then_go_on() -> None:
    q = Lookahead(5, ahead(make_tasks(2, 1), 7) + make_tasks(2, 1))  # unnamed: step 6
    assert list(q.queues) == [6, 7] and (q.target_step, q.last_step, len(q)) == (6, 7, 4)
    assert keys(q.claim("a", 3)) == [(6, "p0", 0), (6, "p1", 0), (7, "p0", 0)]
    assert q.target_step == 7 and (q.queued, q.claimed) == (1, 3)
    assert q.release("a") == 3 and keys(q.claim("b", 9))[0] == (6, "p0", 0)
    assert Lookahead.empty(5).target_step == 6 and Lookahead.empty(5).last_step == 6


def test_a_claim_stops_when_its_refresh_hints_reach_their_budget() -> None:
    store = {(7, f"p{p}", 0): ([1] * 100, True, 0) for p in range(4)}
    q = Lookahead(6, ahead(make_tasks(4, 1), 7), stored=lambda *k: store.get(k),
                  weight_version=1)
    assert len(q.claim("a", 9, max_hint_tokens=250)) == 3  # 300 tokens: the third crossed
    assert len(q.claim("a", 9, max_hint_tokens=50)) == 1  # at least one task
    assert q.queued == 0


def test_stored_drafts_are_done_at_the_current_version_and_refreshed_otherwise() -> None:
    store = {(7, "p0", 0): ([4, 5, 6], True, 3),   # complete, current version: done
             (7, "p1", 0): ([4, 5], True, 2),      # complete, older weights: refresh
             (7, "p2", 0): ([9], False, 3),         # cut short: refresh (continue it)
             (7, "p3", 0): ([], False, 3)}          # empty: a fresh task
    q = Lookahead(6, ahead(make_tasks(5, 1), 7), stored=lambda *k: store.get(k),
                  weight_version=3)
    h = q.handed
    assert (h.fresh, h.refresh, h.done) == (2, 2, 1)
    got = {t.prompt_key: list(t.hint) for t in q.claim("a", 9)}
    assert got == {"p1": [4, 5], "p2": [9], "p3": [], "p4": []}
    # without the version (an older gateway), a complete draft is refreshed, never dropped
    q = Lookahead(6, ahead(make_tasks(1, 1), 7), stored=lambda *k: store.get(k))
    assert (q.handed.done, q.handed.refresh) == (0, 1)


async def test_a_bubble_fills_two_steps_and_the_next_open_refreshes_or_skips() -> None:
    async with serving() as (_, client):
        for r in ("r0", "r1"):
            await client.register(r, r)
        await client.open_step(0, {"r0": 1, "r1": 1},
                               ahead(make_tasks(2, 1), 1) + ahead(make_tasks(2, 1), 2),
                               weight_version=0)
        await client.report_done(0, "r0")
        c = await client.claim_tasks(0, "r0", 3)
        assert keys(c.tasks) == [(1, "p0", 0), (1, "p1", 0), (2, "p0", 0)]
        assert c.target_step == 2 and c.remaining == 1
        drafts = {t.step: PregenDraft(t.prompt_key, 0, [7, 8, 9], complete=True,
                                      weight_version=0) for t in c.tasks}
        res = await client.push_drafts(2, "r0", [drafts[2],
                                                 dataclasses.replace(drafts[2], prompt_key="p1")])
        assert res.statuses == [DraftStatus.STORED] * 2
        res = await client.push_drafts(3, "r0", [drafts[2]])  # never handed: refused
        assert res.statuses == [DraftStatus.REJECTED_STEP]
        await client.report_done(0, "r1")
        # step 1 opens after a weight push (version 1): step 2's drafts survived the close
        # of step 0; handed again, they come back as refreshes with their old tokens
        await client.open_step(1, {"r0": 1, "r1": 1}, ahead(make_tasks(2, 1), 2),
                               weight_version=1)
        assert len(await client.fetch_drafts(2, ["p0", "p1"])) == 2
        await client.report_done(1, "r1")
        c = await client.claim_tasks(1, "r1", 5)
        assert [(t.prompt_key, list(t.hint)) for t in c.tasks] == [("p0", [7, 8, 9]),
                                                                  ("p1", [7, 8, 9])]
        fresh = PregenDraft("p0", 0, [7, 8], complete=True, weight_version=1)
        assert (await client.push_drafts(2, "r1", [fresh])).statuses == [DraftStatus.STORED]
        assert [list(d.token_ids) for d in await client.fetch_drafts(2, ["p0"])] == [[7, 8]]


async def test_a_complete_draft_of_the_current_weights_is_not_queued_again() -> None:
    async with serving() as (_, client):
        await client.register("r0", "r0")
        await client.register("slow", "slow")  # never done: the bubble stays open
        await client.open_step(0, {"r0": 0, "slow": 1}, ahead(make_tasks(1, 1), 2),
                               weight_version=4)
        c = await client.claim_tasks(0, "r0", 5)
        assert keys(c.tasks) == [(2, "p0", 0)]
        done = PregenDraft("p0", 0, [7, 8], complete=True, weight_version=4)
        assert (await client.push_drafts(2, "r0", [done])).statuses == [DraftStatus.STORED]
        # no weight push in between: p0's draft is done, only p1 is queued
        res = await client.open_step(1, {"r0": 0, "slow": 1}, ahead(make_tasks(2, 1), 2),
                                     weight_version=4)
        assert res.num_tasks == 1
        assert keys((await client.claim_tasks(1, "r0", 5)).tasks) == [(2, "p1", 0)]


async def test_a_step_out_of_the_lookahead_range_is_invalid_argument() -> None:
    async with serving(max_lookahead_steps=2) as (server, client):
        await client.register("r0", "a")
        channel, raw = stub(server.address)
        prompts = cv.tasks_to_prompts(ahead(make_tasks(1, 1), 3) + ahead(make_tasks(1, 1), 4))
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await raw.OpenStep(pb.OpenStepRequest(
                step=1, shards=[pb.ShardAssignment(rank_id="r0", num_requests=1)],
                next_prompts=prompts))
        assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "next_prompts[1].step" in e.value.details()
        twice = cv.tasks_to_prompts(ahead(make_tasks(1, 1), 2)) * 2
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await raw.OpenStep(pb.OpenStepRequest(
                step=1, shards=[pb.ShardAssignment(rank_id="r0", num_requests=1)],
                next_prompts=twice))
        assert "next_prompts[1].prompt_key" in e.value.details()
        await channel.close()


def test_a_branch_cut_short_is_continued_from_its_end() -> None:
    store = {(7, "p0", 0): ([4, 5, 6], True, 3),   # done at the current version
             (7, "p1", 0): ([4, 5], True, 2)}      # older weights: refreshed
    cut = {(7, "p0", 0): [(1, [4, 9, 3], False), (2, [4, 5, 8, 1], True)],  # one cut
           (7, "p1", 0): [(0, [7], False)]}        # cut at its runner-up
    q = Lookahead(6, ahead(make_tasks(3, 1), 7), stored=lambda *k: store.get(k),
                  weight_version=3, branches=lambda *k: cut.get(k, []))
    h = q.handed
    assert (h.fresh, h.refresh, h.done, h.branches) == (1, 1, 1, 2)
    got = q.claim("a", 9)
    plain = [t for t in got if t.branch_at is None]
    assert [t.prompt_key for t in plain] == ["p1", "p2"] and got[:2] == plain  # plain first
    cont = {(t.prompt_key, t.branch_at): (list(t.prefix), list(t.hint), t.step)
            for t in got[2:]}
    assert cont == {("p0", 1): ([4, 9, 3], [], 7), ("p1", 0): ([7], [], 7)}
    # a branch already queued in the step's queue is not queued twice
    assert not q.queues[7].continue_branch(got[2], got[2].branch_at, [4, 9])


async def test_a_later_bubble_goes_on_with_a_branch_the_stop_cut() -> None:
    async with serving() as (_, client):
        for r in ("r0", "r1"):
            await client.register(r, r)
        await client.open_step(0, {"r0": 1, "r1": 1}, ahead(make_tasks(1, 1, keyed=True), 2),
                               weight_version=0)
        await client.report_done(0, "r0")
        assert len((await client.claim_tasks(0, "r0", 1)).tasks) == 1
        draft = PregenDraft("p0", 0, [7, 8, 9], complete=True, weight_version=0,
                            branch_offers=[(1, 5)])
        assert (await client.push_drafts(2, "r0", [draft])).statuses == [DraftStatus.STORED]
        (branch,) = (await client.claim_tasks(0, "r0", 1)).tasks
        assert (branch.branch_at, list(branch.prefix)) == (1, [7, 5])
        cut = PregenDraft("p0", 0, [7, 5, 6], complete=False, weight_version=0, branch_at=1)
        assert (await client.push_drafts(2, "r0", [cut])).statuses == [DraftStatus.STORED]
        await client.report_done(0, "r1")
        # step 1 hands step 2's prompts again (new weights): the draft is refreshed and
        # the cut branch goes on from its three tokens
        await client.open_step(1, {"r0": 1, "r1": 1}, ahead(make_tasks(1, 1, keyed=True), 2),
                               weight_version=1)
        await client.report_done(1, "r1")
        got = (await client.claim_tasks(1, "r1", 5)).tasks
        assert [(t.branch_at, list(t.prefix), list(t.hint)) for t in got] == [
            (None, [], [7, 8, 9]), (1, [7, 5, 6], [])]
        more = PregenDraft("p0", 0, [7, 5, 6, 4, 2], complete=True, weight_version=1,
                           branch_at=1)
        assert (await client.push_drafts(2, "r1", [more])).statuses == [DraftStatus.STORED]
        fetched = await client.fetch_drafts(2, ["p0"])
        assert [(d.branch_at, list(d.token_ids)) for d in fetched] == [
            (None, [7, 8, 9]), (1, [7, 5, 6, 4, 2])]
