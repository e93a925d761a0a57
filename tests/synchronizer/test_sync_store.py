"""Draft store: byte budget, partial replacement and extension, drop of finished steps."""

from __future__ import annotations

from bubblespec.protocol.domain import DraftStatus, PregenDraft
from bubblespec.synchronizer.store import DraftStore, sequence_cost

from .helpers import make_tasks, serving


def test_replace_extend_gap_and_accounting() -> None:
    s = DraftStore(budget_bytes=10_000)
    assert s.put(1, PregenDraft("p", 0, [1, 2, 3])) is DraftStatus.STORED
    assert s.put(1, PregenDraft("p", 0, [4, 5], offset=3)) is DraftStatus.STORED  # extend
    assert s.put(1, PregenDraft("p", 0, [9], offset=2, complete=True)) is DraftStatus.STORED  # cut
    assert s.put(1, PregenDraft("p", 0, [0], offset=4)) is DraftStatus.REJECTED_GAP
    (d,), truncated = s.fetch(1, ["p"])
    assert list(d.token_ids) == [1, 2, 9] and d.complete and not truncated
    assert s.put(1, PregenDraft("p", 0, [6])) is DraftStatus.STORED  # offset 0 replaces
    assert (s.sequences, s.tokens, s.bytes) == (1, 1, sequence_cost("p", 1))
    assert s.drop_through(1) == 1 and (s.sequences, s.tokens, s.bytes) == (0, 0, 0)


def test_budget_rejects_growth_but_keeps_what_is_stored() -> None:
    s = DraftStore(budget_bytes=sequence_cost("a", 40) + sequence_cost("b", 5))
    assert s.put(1, PregenDraft("a", 0, list(range(40)))) is DraftStatus.STORED
    assert s.put(1, PregenDraft("b", 0, list(range(5)))) is DraftStatus.STORED
    assert s.put(1, PregenDraft("b", 0, [1], offset=5)) is DraftStatus.REJECTED_FULL
    assert s.put(1, PregenDraft("c", 0, [1])) is DraftStatus.REJECTED_FULL
    assert s.put(1, PregenDraft("a", 0, [1, 2])) is DraftStatus.STORED  # shrinking frees room
    assert s.put(1, PregenDraft("c", 0, [1])) is DraftStatus.STORED
    assert s.bytes <= s.budget_bytes
    drafts, _ = s.fetch(1, ["b", "a", "b"])
    assert [(d.prompt_key, len(d.token_ids)) for d in drafts] == [("b", 5), ("a", 2)]


async def test_store_over_rpc_budget_steps_and_samples() -> None:
    budget = 3 * sequence_cost("p0", 100) + sequence_cost("p0", 1)
    async with serving(draft_store_budget_bytes=budget) as (_, client):
        await client.register("r0", "a")
        await client.register("r1", "b")
        await client.open_step(0, {"r0": 1, "r1": 1}, make_tasks(2, 2))
        # the current and the next step take drafts; others are refused per draft, no error
        late = await client.push_drafts(0, "r0", [PregenDraft("p0", 0, [1])])
        early = await client.push_drafts(2, "r0", [PregenDraft("p0", 0, [1])])
        assert late.stored == 1 and early.statuses == [DraftStatus.REJECTED_STEP]
        first = await client.push_drafts(1, "r0", [PregenDraft("p0", s, [s] * 100) for s in range(2)]
                                         + [PregenDraft("p1", 0, [5] * 100, weight_version=3)])
        assert first.stored == 3 and first.store_bytes == first.budget_bytes == budget
        full = await client.push_drafts(1, "r0", [PregenDraft("p1", 1, [1] * 10)])  # no exception
        assert full.statuses == [DraftStatus.REJECTED_FULL] and "full" in full.message
        assert (await client.get_state()).store.sequences == 4
        drafts = await client.fetch_drafts(1, ["p0", "p1", "unknown"])
        assert [(d.prompt_key, d.sample_index) for d in drafts] == [("p0", 0), ("p0", 1),
                                                                   ("p1", 0)]
        assert drafts[2].weight_version == 3 and drafts[1].token_ids == [1] * 100
        await client.open_step(1, {"r0": 1})  # closes 0: drafts of 1 stay for step 1's ranks
        assert len(await client.fetch_drafts(1, ["p0", "p1"])) == 3
        assert await client.fetch_drafts(0, ["p0"]) == []
        await client.close_step(1)  # step 1 is over: its drafts go
        assert await client.fetch_drafts(1, ["p0", "p1"]) == []
        snap = await client.get_state()
        assert (snap.store.sequences, snap.store.bytes) == (0, 0)
        gone = await client.push_drafts(1, "r0", [PregenDraft("p0", 0, [1])])
        assert gone.statuses == [DraftStatus.REJECTED_STEP]


async def test_fetch_splits_batches_that_exceed_the_message_limit() -> None:
    async with serving(max_message_bytes=64 * 1024, max_draft_tokens=10_000) as (_, client):
        await client.register("r0", "a")
        await client.open_step(0, {"r0": 1})
        drafts = [PregenDraft(f"p{i}", s, [i] * 2000) for i in range(8) for s in range(2)]
        for d in drafts:  # one per push: each push is well under the limit
            assert (await client.push_drafts(1, "r0", [d])).stored == 1
        got = await client.fetch_drafts(1, [f"p{i}" for i in range(8)])
        assert [(d.prompt_key, d.sample_index) for d in got] == [
            (d.prompt_key, d.sample_index) for d in drafts]
        assert all(len(d.token_ids) == 2000 for d in got)


async def test_partial_drafts_over_rpc_replace_and_extend() -> None:
    async with serving() as (_, client):
        await client.register("r0", "a")
        await client.open_step(0, {"r0": 1})
        assert (await client.push_drafts(1, "r0", [PregenDraft("p", 0, [1, 2, 3])])).stored == 1
        res = await client.push_drafts(1, "r0", [PregenDraft("p", 0, [4, 5], offset=3),
                                                 PregenDraft("p", 1, [8], offset=2)])
        assert res.statuses == [DraftStatus.STORED, DraftStatus.REJECTED_GAP]
        assert "offset" in res.message
        await client.push_drafts(1, "r0", [PregenDraft("p", 0, [6, 7], offset=1, complete=True,
                                                       weight_version=2)])
        (d,) = await client.fetch_drafts(1, ["p"])
        assert (d.token_ids, d.complete, d.weight_version) == ([1, 6, 7], True, 2)
        await client.push_drafts(1, "r0", [PregenDraft("p", 0, [9])])  # offset 0: replace
        (d,) = await client.fetch_drafts(1, ["p"])
        assert (d.token_ids, d.complete) == ([9], False)


def test_branches_sit_beside_their_draft() -> None:
    s = DraftStore(budget_bytes=10_000)
    assert s.put(1, PregenDraft("p", 0, [1, 2, 3, 4], complete=True)) is DraftStatus.STORED
    assert s.put(1, PregenDraft("p", 0, [1, 9, 8], branch_at=1)) is DraftStatus.STORED
    assert s.put(1, PregenDraft("p", 0, [1, 2, 7], branch_at=2)) is DraftStatus.STORED
    assert s.put(1, PregenDraft("p", 0, [6], branch_at=1, offset=3)) is DraftStatus.STORED
    assert s.put(1, PregenDraft("p", 1, [5])) is DraftStatus.STORED
    got, _ = s.fetch(1, ["p"])
    assert [(d.sample_index, d.branch_at, list(d.token_ids)) for d in got] == [
        (0, None, [1, 2, 3, 4]), (0, 1, [1, 9, 8, 6]), (0, 2, [1, 2, 7]), (1, None, [5])]
    assert s.sequences == 4 and s.drop_through(1) == 4 and s.bytes == 0


async def test_a_complete_branch_does_not_complete_its_task() -> None:
    async with serving() as (_, client):
        await client.register("r0", "a")
        await client.register("r1", "b")  # still decoding: r0's bubble goes on
        await client.open_step(0, {"r0": 1, "r1": 1}, make_tasks(1, 1))
        await client.report_done(0, "r0")
        held = await client.claim_tasks(0, "r0", 1)
        assert len(held.tasks) == 1
        res = await client.push_drafts(1, "r0", [PregenDraft("p0", 0, [3, 4], complete=True,
                                                             branch_at=0)])
        assert res.stored == 1 and (await client.get_state()).claimed_tasks == 1
        res = await client.push_drafts(1, "r0", [PregenDraft("p0", 0, [5, 6], complete=True)])
        assert (await client.get_state()).claimed_tasks == 0
        got = await client.fetch_drafts(1, ["p0"])
        assert [(d.branch_at, d.token_ids) for d in got] == [(None, [5, 6]), (0, [3, 4])]
