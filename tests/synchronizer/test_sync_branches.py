"""Margin branch tasks in the pre-generation queue (`synchronizer/pregen.py`): offered with a
complete draft or streamed with a partial one, handed out after every plain task (longest draft first, then smallest
margin first), retired by their complete branch draft, put back when their rank is lost;
and end to end through the daemon, with `in_progress` telling idle ranks to keep asking."""

from __future__ import annotations

from bubblespec.protocol.domain import Flip, PregenDraft
from bubblespec.synchronizer.pregen import TaskQueue

from .helpers import make_tasks, open_with_idle_ranks, serving


def test_branches_come_after_plain_tasks_longest_draft_first() -> None:
    q = TaskQueue(1, make_tasks(2, 2))
    first = q.claim("a", 3)
    assert q.add_branches(("p0", 0), [1, 2, 3], [(1, 9), (0, 8)]) == 2
    assert q.add_branches(("p1", 0), [4, 5, 6, 7, 8], [(3, 6)]) == 1
    # already offered, past the end, the draft's own token, an unknown task: skipped
    assert q.add_branches(("p0", 0), [1, 2, 3], [(1, 9), (3, 1), (2, 3)]) == 0
    assert q.add_branches(("p9", 0), [1], [(0, 2)]) == 0
    assert (q.queued, q.claimed, q.branches_offered) == (4, 3, 3)
    got = q.claim("b", 10)
    assert [(t.prompt_key, t.sample_index, t.branch_at) for t in got] == [
        ("p1", 1, None), ("p1", 0, 3), ("p0", 0, 1), ("p0", 0, 0)]
    assert [list(t.prefix) for t in got[1:]] == [[4, 5, 6, 6], [1, 9], [8]]
    assert got[1].seed == first[1].seed and got[1].sampling == first[1].sampling
    assert (q.queued, q.claimed, q.branches_claimed) == (0, 4, 3)


def test_only_tasks_that_can_branch_keep_idle_ranks_waiting() -> None:
    """A branching rank with nothing to claim waits while claimed tasks may still offer
    branches: keyed ones; plain-sampling drafts never do, so it need not wait for them."""
    plain, keyed = TaskQueue(1, make_tasks(1, 2)), TaskQueue(1, make_tasks(1, 2, keyed=True))
    plain.claim("a", 2)
    keyed.claim("a", 2)
    assert (plain.claimed, plain.branchable_claimed) == (2, 0)
    assert (keyed.claimed, keyed.branchable_claimed) == (2, 2)
    keyed.complete(("p0", 0))
    assert keyed.branchable_claimed == 1


def test_a_branch_is_retired_by_its_draft_and_requeued_with_a_lost_rank() -> None:
    q = TaskQueue(1, make_tasks(1, 1))
    q.claim("a", 1)
    q.add_branches(("p0", 0), [1, 2, 3, 4], [(2, 7), (1, 5)])
    assert q.complete_branch(("p0", 0, 1))  # done while queued (another rank had it once)
    (b,) = q.claim("b", 5)
    assert b.branch_at == 2 and q.queued == 0
    assert q.release("b") == 1 and q.queued == 1  # rank b lost: the branch goes back
    (again,) = q.claim("c", 5)
    assert again == b and q.complete_branch(("p0", 0, 2))
    assert not q.complete_branch(("p0", 0, 2)) and q.held_by("c") == []


async def test_offers_become_tasks_for_an_idle_rank_through_the_daemon() -> None:
    async with serving() as (_, client):
        await open_with_idle_ranks(client, make_tasks(1, 2, keyed=True))
        held = await client.claim_tasks(0, "r0", 8)
        assert len(held.tasks) == 2
        idle = await client.claim_tasks(0, "r1", 8)  # nothing yet, but r0 may offer some
        assert (idle.tasks, idle.remaining, idle.in_progress) == ([], 0, 2)
        res = await client.push_drafts(1, "r0", [PregenDraft(
            "p0", 0, [3, 4, 5], complete=True, branch_offers=[(1, 9)])])
        assert res.stored == 1
        got = await client.claim_tasks(0, "r1", 8)
        assert [(t.branch_at, list(t.prefix)) for t in got.tasks] == [(1, [3, 9])]
        assert got.in_progress == 1  # sample 1 is still decoding on r0
        await client.push_drafts(1, "r1", [PregenDraft("p0", 0, [3, 9, 6], complete=True,
                                                       branch_at=1)])
        await client.push_drafts(1, "r0", [PregenDraft("p0", 1, [2], complete=True)])
        done = await client.claim_tasks(0, "r1", 8)
        assert (done.tasks, done.in_progress, done.remaining) == ([], 0, 0)
        drafts = await client.fetch_drafts(1, ["p0"])
        assert [(d.sample_index, d.branch_at, list(d.token_ids)) for d in drafts] == [
            (0, None, [3, 4, 5]), (0, 1, [3, 9, 6]), (1, None, [2])]


async def test_a_partial_draft_streams_an_offer_that_an_idle_rank_takes_at_once() -> None:
    async with serving() as (_, client):
        await open_with_idle_ranks(client, make_tasks(1, 1, keyed=True))
        (task,) = (await client.claim_tasks(0, "r0", 8)).tasks
        # r0's draft is 3 tokens in, with a small margin at 1: it offers that branch now
        res = await client.push_drafts(1, "r0", [PregenDraft(
            "p0", 0, [3, 4, 5], complete=False, branch_offers=[(1, 9)])])
        assert res.stored == 1
        got = await client.claim_tasks(0, "r1", 8)
        assert [(t.branch_at, list(t.prefix), t.seed) for t in got.tasks] == [
            (1, [3, 9], task.seed)]
        assert got.in_progress == 1  # the draft itself still decodes on r0
        # the complete draft replaces the partial one; offering 1 again queues nothing new
        await client.push_drafts(1, "r0", [PregenDraft(
            "p0", 0, [3, 4, 5, 6, 7], complete=True, branch_offers=[(1, 9), (3, 2)])])
        last = await client.claim_tasks(0, "r1", 8)
        assert [(t.branch_at, list(t.prefix)) for t in last.tasks] == [(3, [3, 4, 5, 2])]
        drafts = await client.fetch_drafts(1, ["p0"])
        assert [(d.branch_at, list(d.token_ids), d.complete) for d in drafts] == [
            (None, [3, 4, 5, 6, 7], True)]


async def test_reported_flips_calibrate_the_streamed_branch_threshold() -> None:
    """Ranks push keyed drafts with their margin records; where a response of the next step
    flips away from its draft (ReportDone), the synchronizer reads the records there and
    every claim carries the threshold that would have streamed the branch at the flip."""
    async with serving() as (server, client):
        await open_with_idle_ranks(client, make_tasks(1, 3))
        assert (await client.claim_tasks(0, "r0", 8)).branch_margin == 0.0  # nothing seen
        records = [(0, 2.0), (4, 0.5), (9, 0.05)]
        await client.push_drafts(1, "r0", [
            PregenDraft("p0", 0, list(range(20)), complete=True, margin_records=records),
            PregenDraft("p0", 1, list(range(20)), complete=True, margin_records=records),
            PregenDraft("p0", 2, list(range(20)), complete=True)])  # no records: not read
        await client.report_done(0, "slow")
        await client.close_step(0)
        await client.open_step(1, {"r0": 1, "r1": 1, "slow": 1}, make_tasks(1, 1))
        # sample 0 flipped at 9 (smallest margin: streamed by (0.05, 0.5]), sample 1 at 5
        # (no record: no threshold branches there), sample 2 has no records
        await client.report_done(1, "r0", [Flip("p0", 0, 9), Flip("p0", 1, 5),
                                           Flip("p0", 2, 3), Flip("p9", 0, 1)])
        m = (await client.claim_tasks(1, "r0", 8)).branch_margin
        assert 0.05 < m <= 0.5
        # the flip at 4 favours (0.5, 2.0]; one each: the tie goes to the smaller threshold
        await client.report_done(1, "r1", [Flip("p0", 1, 4)])
        assert (await client.claim_tasks(1, "r1", 8)).branch_margin == m
        levels = server.state.levels()  # exported as bubblespec_branch_margin and _flips_
        assert (levels.branch_margin, levels.flips_seen) == (m, 3)  # p9, p0/2: no records


def test_the_count_of_branchable_claims_follows_claims_completions_and_releases() -> None:
    q = TaskQueue(1, make_tasks(1, 2, keyed=True) + make_tasks(2, 1)[1:])  # p1 s0: plain
    q.claim("a", 3)
    assert (q.claimed, q.branchable_claimed) == (3, 2)
    assert q.release("a") == 3 and (q.claimed, q.branchable_claimed) == (0, 0)
    q.claim("b", 3)
    q.complete(("p0", 1))
    assert (q.claimed, q.branchable_claimed) == (2, 1)
    q.complete(("p1", 0))
    assert (q.claimed, q.branchable_claimed) == (1, 1)
