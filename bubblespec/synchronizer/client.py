"""Async client of the synchronizer, for rank servers and the gateway.

Every unary call carries a deadline (`timeout_s`, per client, overridable per call). Two error
policies, by who calls:

- Decode path (`poll_stop`, `claim_tasks`, `push_drafts`, `fetch_drafts`, `report_spans`,
  `report_done`): degrade, don't block. When the synchronizer is unreachable or has lost the
  state the call refers to (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, RESOURCE_EXHAUSTED,
  FAILED_PRECONDITION, NOT_FOUND), they log once and return a neutral value (False / empty);
  the rank keeps decoding without drafts. A caller bug (INVALID_ARGUMENT, UNAUTHENTICATED, ...)
  still raises `SyncError`.
- Control plane (`register`, `heartbeat`, `open_step`, `close_step`, `get_*`): raise
  `SyncUnavailable` / `SyncError` with the status, the field at fault and the method.

A rank that registered through this client is re-registered automatically (once per call)
when a rank-scoped call gets NOT_FOUND for its rank_id: after a synchronizer restart or after
being marked LOST, the next call just works. `run_heartbeats` keeps that going in the
background. Only plain dataclasses from `types.py` cross this API.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from typing_extensions import Self

from bubblespec.protocol.domain import (
    Claim,
    DraftLocation,
    DraftStatus,
    Flip,
    HeartbeatReply,
    OpenStepResult,
    PregenDraft,
    PregenTask,
    PushResult,
    RankState,
    RankStatus,
    Registration,
    ShardAssignment,
    Span,
    StepEvent,
    StepEventKind,
    StepTimeline,
    SyncSnapshot,
)
from bubblespec.protocol.sampling import PregenWindow
from bubblespec.rpc.v1 import synchronizer_pb2 as pb
from bubblespec.rpc.v1 import synchronizer_pb2_grpc as pb_grpc
from bubblespec.synchronizer import convert as cv
from bubblespec.synchronizer.errors import FIELD_METADATA_KEY, SyncError, SyncUnavailable
from bubblespec.synchronizer.peer import PeerDrafts, PeerReader, in_fetch_order

log = logging.getLogger("bubblespec.synchronizer.client")

_UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
_SOFT = _UNREACHABLE | {grpc.StatusCode.CANCELLED, grpc.StatusCode.RESOURCE_EXHAUSTED,
                        grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND}


def _error(method: str, e: grpc.aio.AioRpcError) -> SyncError:
    """An AioRpcError as SyncError (SyncUnavailable when the daemon was not reachable)."""
    field = ""
    for key, value in e.trailing_metadata() or ():
        if key == FIELD_METADATA_KEY:
            field = value if isinstance(value, str) else value.decode()
    cls = SyncUnavailable if e.code() in _UNREACHABLE else SyncError
    return cls(e.code(), e.details() or "", field, method)


class SyncClient:
    """Async client of one synchronizer (`address` is host:port; over TLS with `credentials`,
    e.g. `bubblespec.tls.sync_credentials(config)`).

    Create it inside the event loop that will use it (e.g. in a FastAPI lifespan): the gRPC
    channel binds to the running loop. One client may serve several ranks.
    """

    def __init__(self, address: str, token: str | None = None, timeout_s: float = 2.0, *,
                 max_message_bytes: int = 64 * 1024 * 1024, fetch_batch: int = 1024,
                 push_batch: int = 512, credentials: grpc.ChannelCredentials | None = None
                 ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.fetch_batch = fetch_batch
        self.push_batch = push_batch
        options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
            ("grpc.keepalive_time_ms", 10_000),
        ]
        self._channel = (grpc.aio.insecure_channel(address, options=options)
                         if credentials is None
                         else grpc.aio.secure_channel(address, credentials, options=options))
        self._stub = pb_grpc.SynchronizerStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._registrations: dict[str, pb.RegisterRankRequest] = {}
        self.registration: dict[str, Registration] = {}
        self._unreachable = False
        self._warned: set[tuple[str, grpc.StatusCode]] = set()
        self.peer: PeerDrafts | None = None
        self.peer_address = ""
        self._peer_reader: PeerReader | None = None
        self.peer_tokens_fetched = 0
        """Draft tokens `fetch_drafts` read from the ranks that pushed them."""

    def serve_drafts(self, drafts: PeerDrafts, address: str, reader: PeerReader) -> None:
        """Rank-to-rank drafts (`synchronizer/peer.py`): keep in `drafts` a copy of every
        draft the synchronizer stores from this client's pushes, served at `address` (a
        `DraftPeerServer`; registrations from here on say so), and fetch drafts through
        `reader` from the ranks that serve them."""
        self.peer, self.peer_address, self._peer_reader = drafts, address, reader
        for request in self._registrations.values():
            request.drafts_address = address

    async def close(self) -> None:
        """Close the channel (and the channels to drafts peers)."""
        if self._peer_reader is not None:
            await self._peer_reader.close()
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ plumbing

    async def _call(self, method: str, request: Any, timeout_s: float | None = None,
                    rank_id: str | None = None) -> Any:
        """Unary call with a deadline; re-registers `rank_id` once on NOT_FOUND(rank_id)."""
        rpc = getattr(self._stub, method)
        for attempt in range(2):
            try:
                reply = await rpc(request, timeout=timeout_s or self.timeout_s,
                                  metadata=self._metadata)
            except grpc.aio.AioRpcError as e:
                err = _error(method, e)
                if (attempt == 0 and rank_id in self._registrations and err.field == "rank_id"
                        and err.code is grpc.StatusCode.NOT_FOUND):
                    log.info("%s: rank %s unknown to the synchronizer: re-registering",
                             method, rank_id)
                    await self._register(self._registrations[rank_id], timeout_s)
                    continue
                raise err from None
            if self._unreachable:
                self._unreachable = False
                log.info("synchronizer %s reachable again", self.address)
            return reply
        raise AssertionError("unreachable")

    async def _soft(self, method: str, request: Any, timeout_s: float | None = None,
                    rank_id: str | None = None) -> Any | None:
        """`_call` for the decode path: None (logged once) instead of synchronizer errors."""
        try:
            return await self._call(method, request, timeout_s, rank_id)
        except SyncError as e:
            if e.code not in _SOFT:
                raise
            self._note_degraded(e)
            return None

    def _note_degraded(self, e: SyncError) -> None:
        if e.code in _UNREACHABLE:
            if not self._unreachable:
                self._unreachable = True
                log.warning("synchronizer %s unreachable (%s): continuing without it",
                            self.address, e)
        elif (e.method, e.code) not in self._warned:
            self._warned.add((e.method, e.code))
            log.warning("synchronizer: %s (continuing; logged once)", e)

    # ------------------------------------------------------------------ health, ranks

    async def wait_ready(self, timeout_s: float = 10.0) -> None:
        """Wait until the health service says SERVING; SyncUnavailable after `timeout_s`."""
        health = health_pb2_grpc.HealthStub(self._channel)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                reply = await health.Check(health_pb2.HealthCheckRequest(service=""),
                                           timeout=max(0.1, min(1.0, deadline - loop.time())))
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            if loop.time() >= deadline:
                raise SyncUnavailable(grpc.StatusCode.UNAVAILABLE,
                                      f"{self.address} not SERVING after {timeout_s} s",
                                      method="wait_ready")
            await asyncio.sleep(0.05)

    async def register(self, rank_id: str, address: str, capacity: int | None = None,
                       weight_version: int = 0, timeout_s: float | None = None,
                       vocab_size: int = 0) -> Registration:
        """Register a rank (remembered for automatic re-registration); raises on failure.
        `vocab_size` (0: not told) bounds the token ids the synchronizer accepts."""
        request = pb.RegisterRankRequest(rank_id=rank_id, address=address, capacity=capacity,
                                         weight_version=weight_version, vocab_size=vocab_size,
                                         drafts_address=self.peer_address)
        self._registrations[rank_id] = request
        return await self._register(request, timeout_s)

    async def _register(self, request: pb.RegisterRankRequest, timeout_s: float | None
                        ) -> Registration:
        r = await self._call("RegisterRank", request, timeout_s)
        reg = Registration(r.heartbeat_interval_s, r.rank_timeout_s, r.poll_every_decode_steps,
                           r.current_step if r.HasField("current_step") else None,
                           r.instance_id, r.max_message_bytes, r.reregistered)
        self.registration[request.rank_id] = reg
        return reg

    async def heartbeat(self, rank_id: str, status: RankStatus | None = None,
                        timeout_s: float | None = None) -> HeartbeatReply:
        """One heartbeat (re-registers if the synchronizer forgot the rank); raises."""
        status = status or RankStatus()
        request = pb.HeartbeatRequest(
            rank_id=rank_id, state=cv.RANK_STATE_TO_PB[status.state],
            weight_version=status.weight_version, step=status.step, done_step=status.done_step)
        r = await self._call("Heartbeat", request, timeout_s, rank_id)
        return HeartbeatReply(r.current_step if r.HasField("current_step") else None, r.stop,
                              r.instance_id)

    async def run_heartbeats(self, rank_id: str, status: Callable[[], RankStatus],
                             stop: asyncio.Event, interval_s: float | None = None,
                             retry_s: float = 0.25) -> None:
        """Heartbeat every interval until `stop` is set; never raises for daemon trouble.

        The rank must have called `register` first (even if that failed: the arguments are
        kept, and the first heartbeat that finds the synchronizer registers the rank).
        While the synchronizer is unreachable the heartbeat is retried every
        `retry_s` (at most the interval), so a restarted daemon hears the rank, and the step
        it reports done, within about that of coming back, not a whole interval later.
        """
        if rank_id not in self._registrations:
            raise ValueError(f"rank {rank_id!r}: call register() before run_heartbeats()")
        while not stop.is_set():
            reg = self.registration.get(rank_id)
            period = interval_s or (reg.heartbeat_interval_s if reg else 1.0)
            try:
                await self.heartbeat(rank_id, status())
            except SyncError as e:
                self._note_degraded(e)
                if e.code in _UNREACHABLE:
                    period = min(period, retry_s)
            except Exception:  # a bad status must not end the heartbeats
                log.exception("heartbeat of rank %s not sent", rank_id)
            try:
                await asyncio.wait_for(stop.wait(), timeout=period)
            except asyncio.TimeoutError:
                pass

    # ------------------------------------------------------------------ steps (gateway)

    async def open_step(self, step: int, shards: Mapping[str, int] | Sequence[ShardAssignment],
                        next_tasks: Sequence[PregenTask] = (), timeout_s: float | None = None,
                        pregen_window: PregenWindow = PregenWindow.BUBBLE,
                        weight_version: int | None = None) -> OpenStepResult:
        """Open `step` with its shard assignment and the pre-generation tasks of the future
        steps (each task's `step`; None: step + 1), which ranks pre-generate until the stop
        signal or, with the TRAINING window, the close; `weight_version` (the version the
        step's ranks run) lets the synchronizer skip or refresh drafts stored earlier;
        raises."""
        if isinstance(shards, Mapping):
            shards = [ShardAssignment(r, n) for r, n in shards.items()]
        request = pb.OpenStepRequest(step=step, shards=[cv.shard_to_pb(s) for s in shards],
                                     next_prompts=cv.tasks_to_prompts(next_tasks),
                                     pregen_window=cv.PREGEN_WINDOW_TO_PB[pregen_window],
                                     weight_version=weight_version)
        r = await self._call("OpenStep", request, timeout_s)
        return OpenStepResult(r.step, r.num_tasks, r.already_open, r.opened_unix_s)

    async def close_step(self, step: int, timeout_s: float | None = None) -> None:
        """Close `step` (drops its drafts and unclaimed tasks); raises."""
        await self._call("CloseStep", pb.CloseStepRequest(step=step), timeout_s)

    async def get_state(self, timeout_s: float | None = None) -> SyncSnapshot:
        """Ranks, current step, queue and store levels; raises."""
        return cv.snapshot_from_pb(await self._call("GetState", pb.GetStateRequest(), timeout_s))

    async def get_timeline(self, step: int, timeout_s: float | None = None) -> StepTimeline:
        """Timeline of a kept step; raises (NOT_FOUND when not kept)."""
        r = await self._call("GetTimeline", pb.GetTimelineRequest(step=step), timeout_s)
        return cv.timeline_from_pb(r.timeline)

    # ------------------------------------------------------------------ steps (ranks)

    async def report_done(self, step: int, rank_id: str, flips: Sequence[Flip] = (),
                          timeout_s: float | None = None) -> bool:
        """Report the rank's shard of `step` done, with the responses that flipped away
        from their drafts; True if the stop signal has fired. Degrades to False; a lost
        report heals through the heartbeat's `done_step` (its flips, which only calibrate
        the branch threshold, are lost)."""
        req = pb.ReportDoneRequest(step=step, rank_id=rank_id,
                                   flips=[cv.flip_to_pb(f) for f in flips])
        r = await self._soft("ReportDone", req, timeout_s, rank_id)
        return False if r is None else r.stop

    async def poll_stop(self, step: int, rank_id: str, timeout_s: float | None = None) -> bool:
        """Has `step`'s stop signal fired? False when the synchronizer is unreachable."""
        return (await self.poll_pregen(step, rank_id, timeout_s))[0]

    async def poll_pregen(self, step: int, rank_id: str, timeout_s: float | None = None
                          ) -> tuple[bool, bool]:
        """(stop signal fired, pre-generation for step + 1 must end): the latter at the stop
        signal or at the close, by the step's window. (False, False) when the synchronizer
        is unreachable, as `poll_stop`: a blip must not end the bubble's work."""
        r = await self._soft("PollStop", pb.PollStopRequest(step=step, rank_id=rank_id),
                             timeout_s)
        return (False, False) if r is None else (r.stop, r.pregen_over)

    async def watch_step(self, step: int, rank_id: str, reconnect_delay_s: float = 0.1,
                         max_reconnect_delay_s: float = 2.0,
                         on_live: Callable[[bool], None] | None = None
                         ) -> AsyncIterator[StepEvent]:
        """Step events from `step` on, across reconnects, each (kind, step) once.

        Long-lived, so no deadline: a dead peer is detected by keepalive pings and the
        stream is re-opened (with backoff) from the newest step seen. Raises SyncError only
        for a bad request. An event of a step > `step` implies `step` is over.
        `on_live(True)` is called when a (re-)opened stream delivers its first message (the
        daemon knows the step: its stop will come on the stream), `on_live(False)` when the
        stream breaks; a caller polls only while it is not live.
        """
        seen: set[tuple[StepEventKind, int]] = set()
        from_step, delay = step, reconnect_delay_s
        while True:
            call = self._stub.WatchStep(pb.WatchStepRequest(step=from_step, rank_id=rank_id),
                                        metadata=self._metadata)
            live = False
            try:
                async for m in call:
                    if not live and on_live is not None:
                        live = True
                        on_live(True)
                    event = cv.event_from_pb(m)
                    delay = reconnect_delay_s
                    if (event.kind, event.step) in seen:
                        continue
                    seen.add((event.kind, event.step))
                    if event.step > from_step:
                        from_step = event.step
                        seen = {k for k in seen if k[1] >= from_step - 1}
                    yield event
            except grpc.aio.AioRpcError as e:
                err = _error("WatchStep", e)
                if err.code not in _SOFT:
                    raise err from None
                self._note_degraded(err)
            finally:
                call.cancel()
                if live and on_live is not None:
                    on_live(False)
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_reconnect_delay_s)

    async def wait_stop(self, step: int, rank_id: str, timeout_s: float | None = None) -> bool:
        """Block until `step`'s stop signal (via WatchStep); False if `timeout_s` passes."""

        async def _wait() -> bool:
            events = self.watch_step(step, rank_id)
            try:
                async for event in events:
                    if event.step > step or event.kind is not StepEventKind.OPENED:
                        return True
                return False
            finally:
                await events.aclose()

        try:
            return await asyncio.wait_for(_wait(), timeout=timeout_s)
        except asyncio.TimeoutError:
            return False

    # ------------------------------------------------------------------ pre-gen and drafts

    async def claim_tasks(self, step: int, rank_id: str, max_tasks: int,
                          timeout_s: float | None = None, tail_fill: bool = False) -> Claim:
        """Claim pre-generation tasks (for step+1) in the rank's bubble, or with `tail_fill`
        while it still decodes its shard; empty when degraded."""
        r = await self._soft(
            "ClaimTasks", pb.ClaimTasksRequest(step=step, rank_id=rank_id, max_tasks=max_tasks,
                                               tail_fill=tail_fill),
            timeout_s, rank_id)
        if r is None:
            return Claim([], step + 1, False, 0)
        return Claim([cv.task_from_pb(t) for t in r.tasks], r.target_step, r.stop, r.remaining,
                     r.in_progress, r.branch_margin)

    async def push_drafts(self, step: int, rank_id: str, drafts: Sequence[PregenDraft],
                          timeout_s: float | None = None) -> PushResult:
        """Push (partial) drafts for `step` in batches; statuses UNAVAILABLE when degraded."""
        statuses: list[DraftStatus] = []
        message, store_bytes, budget = "", 0, 0
        for i in range(0, len(drafts), self.push_batch):
            batch = drafts[i : i + self.push_batch]
            r = await self._soft("PushDrafts", pb.PushDraftsRequest(
                step=step, rank_id=rank_id, drafts=[cv.draft_to_pb(d) for d in batch]),
                timeout_s, rank_id)
            if r is None:
                statuses += [DraftStatus.UNAVAILABLE] * (len(drafts) - len(statuses))
                message = message or "not stored: synchronizer unreachable or push refused"
                break
            got = [cv.DRAFT_STATUS_FROM_PB[s] for s in r.statuses]
            if self.peer is not None:
                self.peer.record(step, batch, got)
            statuses += got
            message = message or r.message
            store_bytes, budget = r.store_bytes, r.budget_bytes
        stored = statuses.count(DraftStatus.STORED)
        return PushResult(statuses, stored, len(statuses) - stored, message, store_bytes, budget)

    async def fetch_drafts(self, step: int, prompt_keys: Sequence[str],
                           timeout_s: float | None = None) -> list[PregenDraft]:
        """All stored drafts of these prompts (every sample); empty when degraded. With
        `serve_drafts`, the bytes of drafts whose owners serve them come from those ranks
        (what they cannot give, from the synchronizer), in the same order."""
        keys = list(dict.fromkeys(prompt_keys))
        if self.peer is not None:
            self.peer.drop_before(step)
        out, located, peers = await self._fetch_batches(step, keys, timeout_s,
                                                        self._peer_reader is not None)
        if not located or self._peer_reader is None:
            return out
        got, missing = await self._peer_reader.fetch(step, located, peers, timeout_s,
                                                     self.peer, self._registrations)
        self.peer_tokens_fetched += sum(len(d.token_ids) for d in got)
        if missing:  # from the synchronizer, which stores every draft
            want = {(x.prompt_key, x.sample_index, x.branch_at) for x in missing}
            fetched, _, _ = await self._fetch_batches(
                step, list(dict.fromkeys(x.prompt_key for x in missing)), timeout_s, False)
            got += [d for d in fetched if (d.prompt_key, d.sample_index, d.branch_at) in want]
        return in_fetch_order(out + got, keys)

    async def _fetch_batches(self, step: int, keys: list[str], timeout_s: float | None,
                             locate: bool
                             ) -> tuple[list[PregenDraft], list[DraftLocation], dict[str, str]]:
        """`_fetch` over `keys` in batches of `fetch_batch`, the replies joined."""
        out: list[PregenDraft] = []
        located: list[DraftLocation] = []
        peers: dict[str, str] = {}
        for i in range(0, len(keys), self.fetch_batch):
            got, where, owners = await self._fetch(step, keys[i : i + self.fetch_batch],
                                                   timeout_s, locate)
            out += got
            located += where
            peers.update(owners)
        return out, located, peers

    async def _fetch(self, step: int, keys: list[str], timeout_s: float | None,
                     locate: bool = False
                     ) -> tuple[list[PregenDraft], list[DraftLocation], dict[str, str]]:
        r = await self._soft("FetchDrafts", pb.FetchDraftsRequest(
            step=step, prompt_keys=keys, packed=True, locate=locate), timeout_s)
        if r is None:
            return [], [], {}
        if r.truncated and len(keys) > 1:  # too big for one reply: split the batch
            mid = len(keys) // 2
            a = await self._fetch(step, keys[:mid], timeout_s, locate)
            b = await self._fetch(step, keys[mid:], timeout_s, locate)
            return a[0] + b[0], a[1] + b[1], {**a[2], **b[2]}
        return ([cv.draft_from_pb(d, lists=True) for d in r.drafts],
                *cv.locations_from_pb(r))

    async def report_spans(self, rank_id: str, step: int, spans: Sequence[Span],
                           timeout_s: float | None = None) -> int:
        """File timeline spans under `step`; returns how many were kept (0 when degraded)."""
        r = await self._soft("ReportSpans", pb.ReportSpansRequest(
            rank_id=rank_id, step=step, spans=[cv.span_to_pb(s) for s in spans]),
            timeout_s, rank_id)
        return 0 if r is None else r.stored


__all__ = ["RankState", "RankStatus", "SyncClient", "SyncError", "SyncUnavailable"]
