"""Timeline: per-rank spans and step open/stop/close times of the last K steps."""

from __future__ import annotations

import time

import grpc
import pytest

from bubblespec.protocol.domain import Span, SpanKind
from bubblespec.rpc.v1 import synchronizer_pb2 as pb
from bubblespec.synchronizer.errors import SyncError

from .helpers import serving, stub


async def test_timeline_records_spans_done_and_step_times() -> None:
    async with serving(timeline_keep_steps=2, max_spans_per_rank_step=3) as (server, client):
        await client.register("r0", "a")
        await client.register("r1", "b")
        t0 = time.time()
        await client.open_step(0, {"r0": 2, "r1": 2})
        assert await client.report_spans("r0", 0, [
            Span(SpanKind.PREGEN, t0 + 2, t0 + 3, 40), Span(SpanKind.DECODE, t0, t0 + 2, 100)]) == 2
        assert await client.report_spans("r1", 0, [Span(SpanKind.DECODE, t0, t0 + 3, 150)]) == 1
        await client.report_done(0, "r0")
        await client.report_done(0, "r1")
        # the per-rank cap drops extra spans without an error
        assert await client.report_spans("r0", 0, [Span(SpanKind.IDLE, t0 + 3, t0 + 4)] * 2) == 1
        tl = await client.get_timeline(0)
        assert tl.step == 0 and tl.opened_unix_s >= t0 - 1
        assert tl.stop_unix_s is not None and tl.stop_unix_s >= tl.opened_unix_s
        assert tl.closed_unix_s is None
        assert [(s.rank_id, s.num_requests) for s in tl.shards] == [("r0", 2), ("r1", 2)]
        assert [s.kind for s in tl.spans["r0"]] == [SpanKind.DECODE, SpanKind.PREGEN,
                                                    SpanKind.IDLE]  # sorted by start
        assert tl.spans["r1"][0].tokens == 150
        assert set(tl.done_unix_s) == {"r0", "r1"}
        assert max(tl.done_unix_s.values()) == pytest.approx(tl.stop_unix_s, abs=0.01)

        await client.open_step(1, {"r0": 1})
        assert (await client.get_timeline(0)).closed_unix_s is not None
        await client.open_step(2, {"r0": 1})  # keeps 2 steps: step 0 is forgotten
        with pytest.raises(SyncError) as e:
            await client.get_timeline(0)
        assert e.value.code is grpc.StatusCode.NOT_FOUND and e.value.field == "step"
        assert await client.report_spans("r0", 0, [Span(SpanKind.IDLE, t0, t0 + 1)]) == 0
        channel, raw = stub(server.address)
        reply = await raw.GetTimeline(pb.GetTimelineRequest(step=2))
        assert list(reply.kept_steps) == [1, 2]
        with pytest.raises(grpc.aio.AioRpcError) as err:  # spans of a future step
            await raw.ReportSpans(pb.ReportSpansRequest(
                rank_id="r0", step=9, spans=[pb.Span(kind=pb.SPAN_KIND_IDLE, start_unix_s=1,
                                                     end_unix_s=2)]))
        assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        await channel.close()
