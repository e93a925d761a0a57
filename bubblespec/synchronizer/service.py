"""gRPC servicer of `bubblespec.rpc.v1.Synchronizer`: auth, validation, conversion, metrics.

Each unary handler is a plain synchronous method wrapped by `_rpc`, which checks the bearer
token on mutating RPCs, times the call, journals what changed the state (`journal.py`, when
the daemon keeps one) before the reply leaves, and turns a `SyncError` into the matching
status with the field path in the message and in the `bubblespec-field` trailing metadata.
Handler bodies never await, so every RPC applies to the state atomically; `replay` applies a
journal through the same bodies.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc

from bubblespec.metrics.sync import SyncMetrics
from bubblespec.rpc.v1 import synchronizer_pb2 as pb
from bubblespec.rpc.v1 import synchronizer_pb2_grpc as pb_grpc
from bubblespec.synchronizer import convert as cv
from bubblespec.synchronizer.config import SyncConfig
from bubblespec.synchronizer.errors import FIELD_METADATA_KEY, SyncError
from bubblespec.synchronizer.journal import JOURNALED, Journal
from bubblespec.synchronizer.state import SyncState
from bubblespec.synchronizer.validate import Validator

log = logging.getLogger("bubblespec.synchronizer")

Body = Callable[[Any, Any], Any]


async def _abort(context: grpc.aio.ServicerContext, err: SyncError) -> None:
    trailing = ((FIELD_METADATA_KEY, err.field),) if err.field else ()
    await context.abort(err.code, err.message, trailing_metadata=trailing)


def _rpc(mutating: bool) -> Callable[[Body], Callable[..., Any]]:
    """Wrap a synchronous handler body with auth (if `mutating`), timing and error mapping."""

    def wrap(body: Body) -> Callable[..., Any]:
        method = body.__name__

        @functools.wraps(body)
        async def handler(self: SynchronizerService, request: Any,
                          context: grpc.aio.ServicerContext) -> Any:
            start = time.perf_counter()
            try:
                if mutating:
                    self.authorize(context)
                reply = body(self, request)
                if self.journal is not None and method in JOURNALED:
                    self._journal(method, request, reply)
                return reply
            except SyncError as e:
                self.metrics.rpc_errors.labels(method, e.code.name).inc()
                await _abort(context, e)
            except Exception:
                log.exception("%s failed", method)
                self.metrics.rpc_errors.labels(method, "INTERNAL").inc()
                await context.abort(grpc.StatusCode.INTERNAL, f"{method}: internal error")
            finally:
                self.metrics.rpc_duration.labels(method).observe(time.perf_counter() - start)

        return handler

    return wrap


class SynchronizerService(pb_grpc.SynchronizerServicer):
    """The Synchronizer service over one `SyncState`."""

    def __init__(self, state: SyncState, config: SyncConfig, metrics: SyncMetrics) -> None:
        self.state = state
        self.config = config
        self.metrics = metrics
        self.v = Validator(config, state.ranks.is_lost)
        token = config.token.get_secret_value() if config.token else ""
        self._expected_auth = f"Bearer {token}".encode() if token else None
        self.journal: Journal | None = None
        """Where acknowledged requests go (`attach_journal`); None: not kept."""

    # ------------------------------------------------------------------ journal

    def replay(self, records: Sequence[tuple[str, Any]]) -> tuple[int, int]:
        """Apply journaled requests through the handler bodies, in order (no auth: they
        were authorized when first served); (applied, refused). A refusal (a request the
        replayed state no longer takes) is logged and skipped."""
        applied = refused = 0
        for method, request in records:
            body = getattr(type(self), method).__wrapped__
            try:
                body(self, request)
                applied += 1
            except SyncError as e:
                refused += 1
                log.warning("journal replay: %s refused (%s)", method, e)
        return applied, refused

    def attach_journal(self, journal: Journal) -> None:
        """Journal every acknowledged state change from now on."""
        self.journal = journal

    def _journal(self, method: str, request: Any, reply: Any) -> None:
        """Append one acknowledged request, unless it changed nothing; on a write error the
        daemon goes on without a journal (logged: a restart would then lose its state)."""
        if ((method == "PushDrafts" and not reply.stored)
                or (method == "ClaimTasks" and not reply.tasks)
                or (method == "OpenStep" and reply.already_open)):
            return
        assert self.journal is not None
        try:
            self.journal.append(method, request)
            if method == "OpenStep":
                self.journal.compact(request.step)
        except OSError:
            log.exception("journal %s: write failed; going on WITHOUT a journal",
                          self.journal.path)
            self.metrics.rpc_errors.labels("journal", "INTERNAL").inc()
            self.journal = None

    def authorize(self, context: grpc.aio.ServicerContext) -> None:
        """UNAUTHENTICATED unless the configured bearer token came in `authorization`."""
        if self._expected_auth is None:
            return
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                got = value.encode() if isinstance(value, str) else value
                if hmac.compare_digest(got, self._expected_auth):
                    return
                break
        raise SyncError(grpc.StatusCode.UNAUTHENTICATED,
                        "missing or wrong bearer token (metadata `authorization: Bearer <t>`)",
                        "authorization")

    # ------------------------------------------------------------------ ranks

    @_rpc(mutating=True)
    def RegisterRank(self, r: pb.RegisterRankRequest) -> pb.RegisterRankResponse:
        self.v.register(r)
        capacity = r.capacity if r.HasField("capacity") else None
        known = self.state.register(r.rank_id, r.address, capacity, r.weight_version,
                                    r.drafts_address)
        self.v.learn_vocab(r.rank_id, r.vocab_size)
        log.info("rank %s %sregistered (%s)", r.rank_id, "re-" if known else "", r.address)
        cur = self.state.current
        c = self.config
        return pb.RegisterRankResponse(
            heartbeat_interval_s=c.heartbeat_interval_s, rank_timeout_s=c.rank_timeout_s,
            poll_every_decode_steps=c.poll_every_decode_steps,
            current_step=cur.step if cur else None, instance_id=self.state.instance_id,
            max_message_bytes=c.max_message_bytes, reregistered=known,
        )

    @_rpc(mutating=True)
    def Heartbeat(self, r: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        self.v.heartbeat(r)
        self.state.heartbeat(
            r.rank_id, cv.RANK_STATE_FROM_PB[r.state], r.weight_version,
            r.step if r.HasField("step") else None,
            r.done_step if r.HasField("done_step") else None,
        )
        cur = self.state.current
        return pb.HeartbeatResponse(
            current_step=cur.step if cur else None,
            stop=cur is not None and cur.stop_unix_s is not None,
            instance_id=self.state.instance_id,
        )

    # ------------------------------------------------------------------ steps

    @_rpc(mutating=True)
    def OpenStep(self, r: pb.OpenStepRequest) -> pb.OpenStepResponse:
        self.v.open_step(r)
        key = hashlib.sha256(r.SerializeToString(deterministic=True)).digest()
        res = self.state.open_step(r.step, [cv.shard_from_pb(s) for s in r.shards],
                                   cv.prompts_to_tasks(r.next_prompts, r.step), key,
                                   cv.PREGEN_WINDOW_FROM_PB[r.pregen_window],
                                   cv._opt(r, "weight_version"))
        if not res.already_open:
            log.info("step %d opened: %d ranks, %d pre-gen tasks", r.step, len(r.shards),
                     res.num_tasks)
        return pb.OpenStepResponse(step=res.step, num_tasks=res.num_tasks,
                                   already_open=res.already_open,
                                   opened_unix_s=res.opened_unix_s)

    @_rpc(mutating=True)
    def CloseStep(self, r: pb.CloseStepRequest) -> pb.CloseStepResponse:
        self.v.step(r.step)
        closed, drafts, tasks = self.state.close_step(r.step)
        return pb.CloseStepResponse(step=r.step, closed_unix_s=closed, dropped_drafts=drafts,
                                    dropped_tasks=tasks)

    @_rpc(mutating=True)
    def ReportDone(self, r: pb.ReportDoneRequest) -> pb.ReportDoneResponse:
        self.v.report_done(r)
        stop, pending, over = self.state.report_done(r.step, r.rank_id,
                                                     [cv.flip_from_pb(f) for f in r.flips])
        return pb.ReportDoneResponse(stop=stop, pending_rank_ids=pending, step_over=over)

    @_rpc(mutating=False)
    def PollStop(self, r: pb.PollStopRequest) -> pb.PollStopResponse:
        self.v.step_and_rank(r)
        cur = self.state.current
        return pb.PollStopResponse(stop=self.state.poll_stop(r.step),
                                   current_step=cur.step if cur else None,
                                   pregen_over=self.state.pregen_over(r.step))

    async def WatchStep(self, r: pb.WatchStepRequest,
                        context: grpc.aio.ServicerContext) -> AsyncIterator[pb.StepEvent]:
        """Server stream of step events from `r.step` on (not wrapped: it is long-lived)."""
        try:
            self.v.step_and_rank(r)
        except SyncError as e:
            self.metrics.rpc_errors.labels("WatchStep", e.code.name).inc()
            await _abort(context, e)
        async for event in self.state.events.follow(r.step, self.state.event_snapshot):
            yield cv.event_to_pb(event)

    # ------------------------------------------------------------------ pre-gen, drafts

    @_rpc(mutating=True)
    def ClaimTasks(self, r: pb.ClaimTasksRequest) -> pb.ClaimTasksResponse:
        self.v.claim(r)
        tasks, target, stop, remaining, busy = self.state.claim(r.step, r.rank_id, r.max_tasks,
                                                                r.tail_fill)
        return pb.ClaimTasksResponse(tasks=[cv.task_to_pb(t) for t in tasks],
                                     target_step=target, stop=stop, remaining=remaining,
                                     in_progress=busy,
                                     branch_margin=self.state.margins.threshold())

    @_rpc(mutating=True)
    def PushDrafts(self, r: pb.PushDraftsRequest) -> pb.PushDraftsResponse:
        self.v.push(r)
        res = self.state.push(r.step, r.rank_id, [cv.draft_from_pb(d) for d in r.drafts])
        return pb.PushDraftsResponse(
            statuses=[cv.DRAFT_STATUS_TO_PB[s] for s in res.statuses], stored=res.stored,
            rejected=res.rejected, message=res.message, store_bytes=res.store_bytes,
            budget_bytes=res.budget_bytes,
        )

    @_rpc(mutating=False)
    def FetchDrafts(self, r: pb.FetchDraftsRequest) -> pb.FetchDraftsResponse:
        self.v.fetch(r)
        if r.locate:
            drafts, located, owners, truncated = self.state.locate(r.step, r.prompt_keys)
            return pb.FetchDraftsResponse(
                drafts=[cv.draft_to_pb(d, r.packed) for d in drafts], truncated=truncated,
                located=[cv.located_to_pb(k, a) for k, a in located],
                owners=[o for o, _ in owners], owner_addresses=[a for _, a in owners])
        drafts, truncated = self.state.fetch(r.step, r.prompt_keys)
        return pb.FetchDraftsResponse(drafts=[cv.draft_to_pb(d, r.packed) for d in drafts],
                                      truncated=truncated)

    # ------------------------------------------------------------------ timeline, state

    @_rpc(mutating=True)
    def ReportSpans(self, r: pb.ReportSpansRequest) -> pb.ReportSpansResponse:
        self.v.spans(r)
        stored, dropped = self.state.report_spans(r.rank_id, r.step,
                                                  [cv.span_from_pb(s) for s in r.spans])
        return pb.ReportSpansResponse(stored=stored, dropped=dropped)

    @_rpc(mutating=False)
    def GetTimeline(self, r: pb.GetTimelineRequest) -> pb.GetTimelineResponse:
        self.v.step(r.step)
        return pb.GetTimelineResponse(timeline=cv.timeline_to_pb(self.state.get_timeline(r.step)),
                                      kept_steps=self.state.timeline.kept_steps())

    @_rpc(mutating=False)
    def GetState(self, r: pb.GetStateRequest) -> pb.GetStateResponse:
        return cv.snapshot_to_pb(self.state.snapshot())
