"""Every RPC validates its input and names the field at fault; the bearer token is enforced."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bubblespec.protocol.domain import DraftStatus, PregenDraft
from bubblespec.rpc.v1 import synchronizer_pb2 as pb
from bubblespec.synchronizer.client import SyncClient
from bubblespec.synchronizer.errors import FIELD_METADATA_KEY, SyncError

from .helpers import serving, stub

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


def prompt(key: str = "p", tokens: Sequence[int] = (1, 2),
           samples: Sequence[tuple[int, int]] = ((0, 1),), max_new_tokens: int = 8,
           **sampling: Any) -> pb.PregenPrompt:
    return pb.PregenPrompt(
        prompt_key=key, prompt_token_ids=list(tokens), max_new_tokens=max_new_tokens,
        sampling=pb.SamplingParams(**sampling),
        samples=[pb.PregenSample(sample_index=i, seed=s) for i, s in samples])


def shard(rank: str = "r0", n: int = 1) -> pb.ShardAssignment:
    return pb.ShardAssignment(rank_id=rank, num_requests=n)


def span(kind: int = pb.SPAN_KIND_DECODE, start: float = 10.0, end: float = 11.0,
         tokens: int = 0) -> pb.Span:
    return pb.Span(kind=kind, start_unix_s=start, end_unix_s=end, tokens=tokens)


def draft(key: str = "p", index: int = 0, tokens: Sequence[int] = (1,), offset: int = 0
          ) -> pb.Draft:
    return pb.Draft(prompt_key=key, sample_index=index, token_ids=list(tokens), offset=offset)


def offered(complete: bool = True, branch_at: int | None = None, at: int = 1, token: int = 5,
            twice: bool = False, many: int = 0) -> pb.Draft:
    """A draft [1, 2] offering a branch at `at` to `token` (or `many` offers)."""
    offers = [pb.BranchOffer(at=at, token_id=token)] * (2 if twice else 1)
    if many:
        offers = [pb.BranchOffer(at=0, token_id=5)] * many
    return pb.Draft(prompt_key="p", sample_index=0, token_ids=[1, 2], complete=complete,
                    branch_at=branch_at, branch_offers=offers)


def recorded(*records: tuple[int, float], branch_at: int | None = None) -> pb.Draft:
    """A draft [1, 2, 3] carrying margin `records` (position, margin)."""
    return pb.Draft(prompt_key="p", sample_index=0, token_ids=[1, 2, 3], branch_at=branch_at,
                    margin_records=[pb.MarginRecord(at=a, margin=m) for a, m in records])


def flip(key: str = "p", index: int = 0, at: int = 0) -> pb.Flip:
    return pb.Flip(prompt_key=key, sample_index=index, at=at)


CASES = [
    ("RegisterRank", pb.RegisterRankRequest(rank_id=""), INVALID, "rank_id"),
    ("RegisterRank", pb.RegisterRankRequest(rank_id="x" * 300), INVALID, "rank_id"),
    ("RegisterRank", pb.RegisterRankRequest(rank_id="r", capacity=0), INVALID, "capacity"),
    ("RegisterRank", pb.RegisterRankRequest(rank_id="r", weight_version=-1), INVALID,
     "weight_version"),
    ("Heartbeat", pb.HeartbeatRequest(rank_id=""), INVALID, "rank_id"),
    ("Heartbeat", pb.HeartbeatRequest(rank_id="ghost"), NOT_FOUND, "rank_id"),
    ("Heartbeat", pb.HeartbeatRequest(rank_id="r0", state=pb.RANK_STATE_LOST), INVALID, "state"),
    ("Heartbeat", pb.HeartbeatRequest(rank_id="r0", done_step=-2), INVALID, "done_step"),
    ("OpenStep", pb.OpenStepRequest(step=-1, shards=[shard()]), INVALID, "step"),
    ("OpenStep", pb.OpenStepRequest(step=1), INVALID, "shards"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard(), shard()]), INVALID,
     "shards[1].rank_id"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard(n=-1)]), INVALID,
     "shards[0].num_requests"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard("ghost")]), NOT_FOUND,
     "shards[0].rank_id"),
    ("OpenStep", pb.OpenStepRequest(step=0, shards=[shard(n=2)]), INVALID, "step"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(tokens=(1, -5))]), INVALID, "next_prompts[0].prompt_token_ids[1]"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(tokens=())]), INVALID, "next_prompts[0].prompt_token_ids"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(), prompt(key="")]), INVALID, "next_prompts[1].prompt_key"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(), prompt()]), INVALID, "next_prompts[1].prompt_key"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(samples=((-1, 0),))]), INVALID, "next_prompts[0].samples[0].sample_index"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(samples=((0, 0), (0, 1)))]), INVALID, "next_prompts[0].samples[1].sample_index"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(samples=())]), INVALID, "next_prompts[0].samples"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(max_new_tokens=0)]), INVALID, "next_prompts[0].max_new_tokens"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(top_p=0.0)]), INVALID, "next_prompts[0].sampling.top_p"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(temperature=-1.0)]), INVALID, "next_prompts[0].sampling.temperature"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(top_k=-2)]), INVALID, "next_prompts[0].sampling.top_k"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(seed_mode="magic")]), INVALID, "next_prompts[0].sampling.seed_mode"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(repetition_penalty=0.0)]), INVALID,
     "next_prompts[0].sampling.repetition_penalty"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(min_p=1.5)]), INVALID, "next_prompts[0].sampling.min_p"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(logit_bias={5: 300.0})]), INVALID, "next_prompts[0].sampling.logit_bias"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(logit_bias={-1: 1.0})]), INVALID, "next_prompts[0].sampling.logit_bias[0][0]"),
    ("OpenStep", pb.OpenStepRequest(step=1, shards=[shard()], next_prompts=[
        prompt(samples=[(i, i) for i in range(5)])]), INVALID, "next_prompts"),
    ("CloseStep", pb.CloseStepRequest(step=-3), INVALID, "step"),
    ("CloseStep", pb.CloseStepRequest(step=4), PRECONDITION, "step"),
    ("ReportDone", pb.ReportDoneRequest(step=-1, rank_id="r0"), INVALID, "step"),
    ("ReportDone", pb.ReportDoneRequest(step=0, rank_id=""), INVALID, "rank_id"),
    ("ReportDone", pb.ReportDoneRequest(step=0, rank_id="ghost"), NOT_FOUND, "rank_id"),
    ("ReportDone", pb.ReportDoneRequest(step=3, rank_id="r0"), PRECONDITION, "step"),
    ("ReportDone", pb.ReportDoneRequest(step=0, rank_id="r0", flips=[flip(), flip(key="")]),
     INVALID, "flips[1].prompt_key"),
    ("ReportDone", pb.ReportDoneRequest(step=0, rank_id="r0", flips=[flip(at=-1)]), INVALID,
     "flips[0].at"),
    ("ReportDone", pb.ReportDoneRequest(step=0, rank_id="r0", flips=[flip()] * 1025), INVALID,
     "flips"),
    ("ReportDone", pb.ReportDoneRequest(step=0, rank_id="r0", flips=[flip(index=-2)]),
     INVALID, "flips[0].sample_index"),
    ("PollStop", pb.PollStopRequest(step=-1, rank_id="r0"), INVALID, "step"),
    ("PollStop", pb.PollStopRequest(step=0, rank_id=""), INVALID, "rank_id"),
    ("ClaimTasks", pb.ClaimTasksRequest(step=0, rank_id="r0", max_tasks=0), INVALID,
     "max_tasks"),
    ("ClaimTasks", pb.ClaimTasksRequest(step=-1, rank_id="r0", max_tasks=1), INVALID, "step"),
    ("ClaimTasks", pb.ClaimTasksRequest(step=0, rank_id="ghost", max_tasks=1), NOT_FOUND,
     "rank_id"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[draft(tokens=(1, 2, -1))]),
     INVALID, "drafts[0].token_ids[2]"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[pb.Draft(
        prompt_key="p", token_ids_packed=struct.pack("<3i", 1, 2, -1))]),
     INVALID, "drafts[0].token_ids[2]"),
    # packed ids are range-checked for the whole request at once: the bad one is still named
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[
        pb.Draft(prompt_key="p", sample_index=i, token_ids_packed=struct.pack(
            "<8i", *[7] * 5, -1 if i == 1 else 7, 7, 7)) for i in range(2)]),
     INVALID, "drafts[1].token_ids[5]"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[
        pb.Draft(prompt_key="p", sample_index=0, token_ids=[3, 4]),
        pb.Draft(prompt_key="p", sample_index=1, token_ids_packed=struct.pack("<2i", 3, -4))]),
     INVALID, "drafts[1].token_ids[1]"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[pb.Draft(
        prompt_key="p", token_ids_packed=struct.pack("<101i", *[1] * 101))]),
     INVALID, "drafts[0].token_ids"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[pb.Draft(
        prompt_key="p", token_ids_packed=b"\x01\x00\x00")]),
     INVALID, "drafts[0].token_ids_packed"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[pb.Draft(
        prompt_key="p", token_ids=[1], token_ids_packed=struct.pack("<i", 1))]),
     INVALID, "drafts[0].token_ids_packed"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[draft(index=-1)]),
     INVALID, "drafts[0].sample_index"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[draft(offset=-1)]),
     INVALID, "drafts[0].offset"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[
        pb.Draft(prompt_key="p0", sample_index=0, token_ids=[1, 2], branch_at=2)]),
     INVALID, "drafts[0].branch_at"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[offered(branch_at=0)]),
     INVALID, "drafts[0].branch_offers"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[offered(at=2)]),
     INVALID, "drafts[0].branch_offers[0].at"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[offered(token=-1)]),
     INVALID, "drafts[0].branch_offers[0].token_id"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[offered(token=2)]),
     INVALID, "drafts[0].branch_offers[0].token_id"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[offered(twice=True)]),
     INVALID, "drafts[0].branch_offers[1].at"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[offered(many=17)]),
     INVALID, "drafts[0].branch_offers"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[
        recorded((0, 0.5), (1, 0.7))]), INVALID, "drafts[0].margin_records[1].margin"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[
        recorded((1, 0.5), (1, 0.2))]), INVALID, "drafts[0].margin_records[1].at"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[
        recorded((3, 0.5))]), INVALID, "drafts[0].margin_records[0].at"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[
        recorded((0, float("nan")))]), INVALID, "drafts[0].margin_records[0].margin"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[
        recorded((0, 0.5), branch_at=1)]), INVALID, "drafts[0].margin_records"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[draft(), draft(key="")]),
     INVALID, "drafts[1].prompt_key"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[draft(tokens=[1] * 101)]),
     INVALID, "drafts[0].token_ids"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[draft()] * 3), INVALID,
     "drafts"),
    ("PushDrafts", pb.PushDraftsRequest(step=1, rank_id="ghost", drafts=[draft()]), NOT_FOUND,
     "rank_id"),
    ("FetchDrafts", pb.FetchDraftsRequest(step=1), INVALID, "prompt_keys"),
    ("FetchDrafts", pb.FetchDraftsRequest(step=1, prompt_keys=["a", ""]), INVALID,
     "prompt_keys[1]"),
    ("FetchDrafts", pb.FetchDraftsRequest(step=1, prompt_keys=["a", "b", "c"]), INVALID,
     "prompt_keys"),
    ("FetchDrafts", pb.FetchDraftsRequest(step=-1, prompt_keys=["a"]), INVALID, "step"),
    ("ReportSpans", pb.ReportSpansRequest(rank_id="r0", step=0, spans=[span(kind=0)]), INVALID,
     "spans[0].kind"),
    ("ReportSpans", pb.ReportSpansRequest(rank_id="r0", step=0, spans=[span(), span(end=9.0)]),
     INVALID, "spans[1].end_unix_s"),
    ("ReportSpans", pb.ReportSpansRequest(rank_id="r0", step=0, spans=[span(tokens=-1)]),
     INVALID, "spans[0].tokens"),
    ("ReportSpans", pb.ReportSpansRequest(rank_id="", step=0), INVALID, "rank_id"),
    ("GetTimeline", pb.GetTimelineRequest(step=-1), INVALID, "step"),
]


async def test_each_rpc_rejects_bad_input_naming_the_field() -> None:
    limits = {"max_tasks_per_step": 4, "max_draft_tokens": 100, "max_drafts_per_push": 2,
              "max_fetch_keys": 2, "max_key_bytes": 256}
    async with serving(**limits) as (server, client):
        await client.register("r0", "a")
        await client.open_step(0, {"r0": 1})
        channel, raw = stub(server.address)
        failures = []
        for method, request, code, field in CASES:
            try:
                await getattr(raw, method)(request, timeout=2)
                failures.append(f"{method} {field}: no error")
                continue
            except grpc.aio.AioRpcError as e:
                meta = dict(e.trailing_metadata() or ())
                if (e.code(), meta.get(FIELD_METADATA_KEY)) != (code, field) or \
                        not e.details().startswith(field):
                    failures.append(f"{method} {field}: got {e.code()} {meta} {e.details()!r}")
        watch = raw.WatchStep(pb.WatchStepRequest(step=-1, rank_id="r0"))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await watch.read()
        assert err.value.code() is INVALID and err.value.details().startswith("step")
        await channel.close()
        assert not failures, "\n".join(failures)


async def test_oversized_message_is_refused() -> None:
    async with serving(max_message_bytes=64 * 1024) as (server, client):
        await client.register("r0", "a")
        await client.open_step(0, {"r0": 1})
        big = [PregenDraft("p", 0, [70_000] * 40_000)]
        channel, raw = stub(server.address)
        with pytest.raises(grpc.aio.AioRpcError) as e:  # over the daemon's limit: gRPC refuses
            await raw.PushDrafts(pb.PushDraftsRequest(step=1, rank_id="r0", drafts=[
                pb.Draft(prompt_key=d.prompt_key, token_ids=d.token_ids) for d in big]))
        assert e.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        await channel.close()
        res = await client.push_drafts(1, "r0", big)  # the rank-side client degrades
        assert res.stored == 0 and res.statuses == [DraftStatus.UNAVAILABLE]


async def test_bearer_token_guards_mutating_rpcs_only() -> None:
    async with serving(token="s3cret") as (server, client):
        await client.register("r0", "a")  # the helper's client carries the token
        await client.open_step(0, {"r0": 1})
        for token in (None, "wrong"):
            async with SyncClient(server.address, token=token) as other:
                with pytest.raises(SyncError) as e:
                    await other.register("r1", "b")
                assert e.value.code is grpc.StatusCode.UNAUTHENTICATED
                with pytest.raises(SyncError) as e:  # decode path: a config bug, not degraded
                    await other.push_drafts(1, "r0", [PregenDraft("p", 0, [1])])
                assert e.value.code is grpc.StatusCode.UNAUTHENTICATED
                assert not await other.poll_stop(0, "r0")  # reads stay open
                assert (await other.get_state()).current_step == 0
                assert await other.fetch_drafts(1, ["p"]) == []
        channel = grpc.aio.insecure_channel(server.address)
        health = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=2)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        await channel.close()
        assert (await client.push_drafts(1, "r0", [PregenDraft("p", 0, [1])])).stored == 1
