"""Declared ranges and the vocabulary at the gRPC boundary: an int64 or uint64 value outside
the protocol's range, or a token id outside the ranks' vocabulary, is INVALID_ARGUMENT naming
the field, nothing of it is stored, and the next normal request works."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from bubblespec.protocol import limits as L
from bubblespec.protocol.domain import PregenDraft, RankState, RankStatus
from bubblespec.rpc.v1 import synchronizer_pb2 as pb
from bubblespec.synchronizer.errors import FIELD_METADATA_KEY, SyncError

from .helpers import serving, stub
from .test_sync_validation import draft, prompt, shard, span

INVALID = grpc.StatusCode.INVALID_ARGUMENT
BIG = 2**63 - 1

RANGE_CASES = [
    ("OpenStep", pb.OpenStepRequest(step=BIG, shards=[shard()]), "step"),
    ("OpenStep", pb.OpenStepRequest(step=L.MAX_STEP + 1, shards=[shard()]), "step"),
    ("CloseStep", pb.CloseStepRequest(step=BIG), "step"),
    ("ReportDone", pb.ReportDoneRequest(step=BIG, rank_id="r0"), "step"),
    ("PollStop", pb.PollStopRequest(step=BIG, rank_id="r0"), "step"),
    ("ClaimTasks", pb.ClaimTasksRequest(step=BIG, rank_id="r0", max_tasks=1), "step"),
    ("FetchDrafts", pb.FetchDraftsRequest(step=BIG, prompt_keys=["a"]), "step"),
    ("GetTimeline", pb.GetTimelineRequest(step=BIG), "step"),
    ("ReportSpans", pb.ReportSpansRequest(rank_id="r0", step=BIG, spans=[span()]), "step"),
    ("ReportSpans", pb.ReportSpansRequest(rank_id="r0", step=0, spans=[span(tokens=BIG)]),
     "spans[0].tokens"),
    ("RegisterRank", pb.RegisterRankRequest(rank_id="r9", weight_version=2**63 - 1),
     "weight_version"),
    ("RegisterRank", pb.RegisterRankRequest(rank_id="r9", vocab_size=-1), "vocab_size"),
    ("Heartbeat", pb.HeartbeatRequest(rank_id="r0", state=pb.RANK_STATE_IDLE,
                                      weight_version=L.MAX_WEIGHT_VERSION + 1),
     "weight_version"),
    ("Heartbeat", pb.HeartbeatRequest(rank_id="r0", state=pb.RANK_STATE_IDLE, step=BIG), "step"),
    ("Heartbeat", pb.HeartbeatRequest(rank_id="r0", state=pb.RANK_STATE_IDLE, done_step=BIG),
     "done_step"),
    ("PushDrafts", pb.PushDraftsRequest(step=BIG, rank_id="r0", drafts=[draft()]), "step"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[
        pb.Draft(prompt_key="p", token_ids=[1], weight_version=BIG)]),
     "drafts[0].weight_version"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[
        draft(index=2**31 - 1)]), "drafts[0].sample_index"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[
        draft(), draft(tokens=[5, 6, 100, 7])]), "drafts[1].token_ids[2]"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(samples=((0, 2**64 - 1),))]), "next_prompts[0].samples[0].seed"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(samples=((2**31 - 1, 0),))]), "next_prompts[0].samples[0].sample_index"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(tokens=(1, 100))]), "next_prompts[0].prompt_token_ids[1]"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(stop_token_ids=[3, 100])]), "next_prompts[0].sampling.stop_token_ids[1]"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(stop_token_ids=[2**31 - 1])]), "next_prompts[0].sampling.stop_token_ids[0]"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(top_k=2**31 - 1, temperature=1e308)]), "next_prompts[0].sampling.temperature"),
]


async def test_out_of_range_values_are_refused_and_nothing_is_stored() -> None:
    async with serving() as (server, client):
        await client.register("r0", "a", vocab_size=100)
        await client.open_step(0, {"r0": 1})
        channel, raw = stub(server.address)
        failures = []
        for method, request, field in RANGE_CASES:
            try:
                await getattr(raw, method)(request, timeout=2)
                failures.append(f"{method} {field}: no error")
            except grpc.aio.AioRpcError as e:
                meta = dict(e.trailing_metadata() or ())
                if (e.code(), meta.get(FIELD_METADATA_KEY)) != (INVALID, field):
                    failures.append(f"{method} {field}: got {e.code()} {meta} {e.details()!r}")
        await channel.close()
        assert not failures, "\n".join(failures)
        state = await client.get_state()
        assert state.current_step == 0 and state.store.sequences == 0
        assert [r.weight_version for r in state.ranks] == [0]
        # the next normal step still works: step + 1 of a refused huge step never happened
        await client.open_step(1, {"r0": 1})
        res = await client.push_drafts(2, "r0", [PregenDraft("p", 0, [1, 99])])
        assert res.stored == 1


async def test_the_smallest_vocabulary_of_the_ranks_bounds_token_ids() -> None:
    async with serving() as (_, client):
        await client.register("r0", "a")  # no vocabulary told: only ids >= 0 are checked
        await client.open_step(0, {"r0": 1})
        assert (await client.push_drafts(1, "r0", [PregenDraft("p", 0, [10**6])])).stored == 1
        await client.register("r1", "b", vocab_size=1000)
        await client.register("r2", "c", vocab_size=500)
        ok = await client.push_drafts(1, "r0", [PregenDraft("q", 0, [499])])
        assert ok.stored == 1
        with pytest.raises(SyncError) as e:
            await client.heartbeat("r0", RankStatus(RankState.IDLE,
                                                    weight_version=L.MAX_WEIGHT_VERSION + 1))
        assert e.value.field == "weight_version"
        with pytest.raises(SyncError) as e:
            await client.push_drafts(1, "r0", [PregenDraft("q", 1, [7, 500])])
        assert e.value.code is INVALID and e.value.field == "drafts[0].token_ids[1]"
        await client.register("r2", "c", vocab_size=2000)  # re-registered with a new model
        assert (await client.push_drafts(1, "r0", [PregenDraft("q", 1, [999])])).stored == 1


async def test_the_vocab_size_setting_bounds_token_ids_before_any_rank_reports() -> None:
    async with serving(vocab_size=64) as (server, client):
        await client.register("r0", "a", vocab_size=1000)
        await client.open_step(0, {"r0": 1})
        channel, raw = stub(server.address)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await raw.PushDrafts(pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[
                draft(tokens=[63, 64])]), timeout=2)
        assert e.value.code() is INVALID and e.value.details().startswith("drafts[0].token_ids[1]")
        await channel.close()


async def test_a_lost_rank_no_longer_narrows_the_vocabulary() -> None:
    async with serving(heartbeat_interval_s=0.05, rank_timeout_s=0.3) as (_, client):
        await client.register("r0", "a", vocab_size=1000)
        await client.register("tiny", "b", vocab_size=10)  # registers, never heartbeats
        await client.open_step(0, {"r0": 1})
        with pytest.raises(SyncError):
            await client.push_drafts(1, "r0", [PregenDraft("p", 0, [500])])
        for _ in range(40):  # r0 heartbeats; "tiny" goes LOST
            await client.heartbeat("r0", RankStatus(RankState.IDLE))
            lost = [r.rank_id for r in (await client.get_state()).ranks
                    if r.state is RankState.LOST]
            if lost == ["tiny"]:
                break
            await asyncio.sleep(0.05)
        assert lost == ["tiny"]
        assert (await client.push_drafts(1, "r0", [PregenDraft("p", 0, [500])])).stored == 1
