"""The synchronizer's state machine: ranks, the current step, its stop signal, its queue.

Every method is synchronous and runs on the server's event loop, so each RPC's effect is
atomic without locks. Methods take already-validated domain values (see `validate.py`) and
raise `SyncError` (NOT_FOUND / FAILED_PRECONDITION) for requests that are well-formed but do
not fit the state. Choices worth knowing:

- Only one step is current. OpenStep(s) must be newer than the current step, except that
  re-opening the *same, still open* step with byte-identical content is accepted as an
  idempotent retry (`already_open`); anything else is INVALID_ARGUMENT.
- A rank is done for step s when it reports done, heartbeats `done_step >= s`, has 0 requests
  in s, is not in s's shards at all, or is marked LOST. Done is sticky within a step.
- A LOST (or unknown) rank gets NOT_FOUND on rank-scoped mutating RPCs: it must re-register,
  which always succeeds. Its claimed tasks went back to the queue when it was lost.
- Late or early calls are answered, not failed, where the race is normal: PollStop of any
  step other than the current one says stop; ClaimTasks after the stop returns nothing;
  pushes to a step outside the accepting window get a per-draft REJECTED_STEP.
"""

from __future__ import annotations

import logging
import time
import uuid
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from bubblespec.core.branch_margin import MarginCalibrator, flip_window
from bubblespec.metrics.sync import SyncLevels, SyncMetrics
from bubblespec.protocol.domain import (
    DraftStatus,
    Flip,
    OpenStepResult,
    PregenDraft,
    PregenTask,
    PushResult,
    RankState,
    ShardAssignment,
    Span,
    StepEvent,
    StepEventKind,
    StepTimeline,
    SyncSnapshot,
)
from bubblespec.protocol.sampling import PregenWindow
from bubblespec.synchronizer.config import SyncConfig
from bubblespec.synchronizer.errors import invalid, not_found, precondition
from bubblespec.synchronizer.lookahead import Lookahead
from bubblespec.synchronizer.pregen import LengthPredictor, TaskQueue
from bubblespec.synchronizer.ranks import RankRegistry
from bubblespec.synchronizer.store import DraftStore
from bubblespec.synchronizer.timeline import EventHub, Timeline

log = logging.getLogger(__name__)


@dataclass
class StepRecord:
    """The current step."""

    step: int
    shards: dict[str, int]
    content_key: bytes
    queue: Lookahead
    """Tasks of the future steps it was handed (`lookahead.py`)."""
    opened_unix_s: float
    opened_mono: float
    done: set[str] = field(default_factory=set)
    stop_unix_s: float | None = None
    closed_unix_s: float | None = None
    pregen_window: PregenWindow = PregenWindow.BUBBLE

    @property
    def pending(self) -> list[str]:
        """Participating ranks not done yet."""
        return sorted(r for r in self.shards if r not in self.done)


class SyncState:
    """Ranks, step lifecycle, pre-generation queue, draft store, timeline and events."""

    def __init__(self, config: SyncConfig, metrics: SyncMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.instance_id = uuid.uuid4().hex[:12]
        self.ranks = RankRegistry(config.rank_timeout_s)
        self.current: StepRecord | None = None
        self.closed_through = -1  # every step <= this is over
        self.store = DraftStore(config.draft_store_budget_bytes)
        self.lengths = LengthPredictor()  # orders the pre-gen queue: longest predicted first
        self.margins = MarginCalibrator()  # the streamed-branch threshold, from reported flips
        self.timeline = Timeline(config.timeline_keep_steps, config.max_spans_per_rank_step)
        self.events = EventHub()

    # ------------------------------------------------------------------ ranks

    def register(self, rank_id: str, address: str, capacity: int | None, weight_version: int,
                 drafts_address: str = "") -> bool:
        """(Re-)register a rank; True if it was known. A live re-registration means the rank
        process restarted, so its claimed tasks go back to the queue."""
        known = self.ranks.register(rank_id, address, capacity, weight_version, drafts_address)
        if known and self.current is not None:
            self._requeue(rank_id)
        return known

    def heartbeat(self, rank_id: str, state: RankState, weight_version: int, step: int | None,
                  done_step: int | None) -> None:
        """Record a heartbeat; a `done_step` covering the current step counts as ReportDone."""
        self.ranks.heartbeat(rank_id, state, weight_version, step, done_step)
        cur = self.current
        if done_step is not None and cur is not None and done_step >= cur.step:
            self._mark_done(cur, rank_id)

    def reap(self) -> list[str]:
        """Mark ranks without a recent heartbeat LOST: done for the step, tasks requeued."""
        lost = self.ranks.reap()
        for rank_id in lost:
            self.metrics.ranks_lost.inc()
            if self.current is not None:
                self._requeue(rank_id)
                self._mark_done(self.current, rank_id)
        return lost

    def _requeue(self, rank_id: str) -> None:
        assert self.current is not None
        n = self.current.queue.release(rank_id)
        if n:
            self.metrics.tasks_requeued.inc(n)

    # ------------------------------------------------------------------ steps

    def open_step(self, step: int, shards: Sequence[ShardAssignment],
                  tasks: Sequence[PregenTask], content_key: bytes,
                  pregen_window: PregenWindow = PregenWindow.BUBBLE,
                  weight_version: int | None = None) -> OpenStepResult:
        """Open `step` (closing the current one) with its shards and the tasks of the future
        steps (step + 1 where a task names none); `weight_version`, the version its ranks
        run, decides which stored drafts are done and which are refreshed (`lookahead.py`)."""
        cur = self.current
        if cur is not None and step == cur.step and cur.closed_unix_s is None:
            if content_key == cur.content_key:
                return OpenStepResult(step, len(cur.queue), True, cur.opened_unix_s)
            raise invalid("step", f"step {step} is already open with different content")
        if step <= self.closed_through or (cur is not None and step <= cur.step):
            newest = cur.step if cur is not None else self.closed_through
            raise invalid("step", f"step {step} is not newer than the current step {newest}")
        for i, shard in enumerate(shards):
            if shard.rank_id not in self.ranks:
                raise not_found(f"shards[{i}].rank_id", f"rank {shard.rank_id!r} is not registered")
            if self.ranks.is_lost(shard.rank_id):
                raise precondition(f"shards[{i}].rank_id", f"rank {shard.rank_id!r} is LOST")
        if cur is not None and cur.closed_unix_s is None:
            self._close(cur)
        now = time.time()
        queue = Lookahead(step, tasks, self.lengths, self.config.pregen_depth,
                          self.store.version_of, weight_version, self.store.branches_of)
        h = queue.handed
        for kind, n in (("fresh", h.fresh), ("refresh", h.refresh), ("done", h.done),
                        ("branch", h.branches)):
            if n:
                self.metrics.tasks_handed.labels(kind).inc(n)
        if h.refresh or h.done:
            log.info("step %d: %d pre-generation tasks new, %d refreshes of older drafts, "
                     "%d already done at weight version %s, %d cut branches to continue",
                     step, h.fresh, h.refresh, h.done, weight_version, h.branches)
        rec = StepRecord(step, {s.rank_id: s.num_requests for s in shards}, content_key,
                         queue, now, time.monotonic(), pregen_window=pregen_window)
        self.current = rec
        self.timeline.open_step(step, shards, now)
        self.events.publish(StepEvent(StepEventKind.OPENED, step, now))
        for shard in shards:
            if shard.num_requests == 0:
                self._mark_done(rec, shard.rank_id)
        self._maybe_stop(rec)
        return OpenStepResult(step, len(rec.queue), False, now)

    def close_step(self, step: int) -> tuple[float, int, int]:
        """Close `step` (idempotent for steps already over); (closed time, drafts, tasks)."""
        cur = self.current
        if cur is None or step > cur.step:
            raise precondition("step", f"step {step} is not open (current: {self._cur_text()})")
        if step < cur.step or cur.closed_unix_s is not None:
            past = self.timeline.get(step)
            closed = past.closed_unix_s if past is not None else None
            return closed or time.time(), 0, 0
        dropped_tasks = cur.queue.queued
        dropped_drafts = self._close(cur)
        assert cur.closed_unix_s is not None
        return cur.closed_unix_s, dropped_drafts, dropped_tasks

    def _close(self, rec: StepRecord) -> int:
        """Fire the stop signal if needed, then close: drafts of steps <= rec.step go."""
        self._fire_stop(rec)
        rec.closed_unix_s = time.time()
        self.closed_through = rec.step
        rec.queue = Lookahead.empty(rec.step)
        self.timeline.mark_closed(rec.step, rec.closed_unix_s)
        self.events.publish(StepEvent(StepEventKind.CLOSED, rec.step, rec.closed_unix_s))
        return self.store.drop_through(rec.step)

    def report_done(self, step: int, rank_id: str, flips: Sequence[Flip] = ()
                    ) -> tuple[bool, list[str], bool]:
        """A rank finished its shard; returns (stop fired, pending ranks, step over). Its
        `flips` calibrate the streamed-branch threshold (`core/branch_margin.py`): each is
        read against its draft's margin records, where the draft has them."""
        self.ranks.require_live(rank_id)
        cur = self._require_step(step)
        if cur is None:
            return True, [], True
        before = self.margins.threshold()
        for f in flips:
            got = self.store.records_of(step, f.prompt_key, f.sample_index)
            if got is not None and got[0]:
                self.margins.observe(step, flip_window(got[0], f.at, got[1]))
        if self.margins.threshold() != before:
            log.info("step %d: branch margin threshold %.4g -> %.4g (%d flip windows)", step,
                     before, self.margins.threshold(), len(self.margins.windows()))
        self._mark_done(cur, rank_id)
        return cur.stop_unix_s is not None, cur.pending, False

    def poll_stop(self, step: int) -> bool:
        """True once `step`'s stop fired, and for any step that is not the current one."""
        cur = self.current
        return cur is None or cur.step != step or cur.stop_unix_s is not None

    def pregen_over(self, step: int) -> bool:
        """Must pre-generation of step + 1 end? At the stop signal (BUBBLE window) or at the
        close (TRAINING window); always for a step that is not the current one."""
        cur = self.current
        if cur is None or cur.step != step or cur.closed_unix_s is not None:
            return True
        return cur.pregen_window is PregenWindow.BUBBLE and cur.stop_unix_s is not None

    def _require_step(self, step: int) -> StepRecord | None:
        """The current record if `step` is current and open; None if `step` is over."""
        cur = self.current
        if cur is None or step > cur.step:
            raise precondition("step", f"step {step} is not open (current: {self._cur_text()})")
        if step < cur.step or cur.closed_unix_s is not None:
            return None
        return cur

    def _cur_text(self) -> str:
        return "none" if self.current is None else str(self.current.step)

    def _mark_done(self, rec: StepRecord, rank_id: str) -> None:
        if rank_id not in rec.shards or rank_id in rec.done or rec.closed_unix_s is not None:
            return
        rec.done.add(rank_id)
        self.timeline.mark_done(rec.step, rank_id, time.time())
        self._maybe_stop(rec)

    def _maybe_stop(self, rec: StepRecord) -> None:
        if not rec.pending:
            self._fire_stop(rec)

    def _fire_stop(self, rec: StepRecord) -> None:
        if rec.stop_unix_s is not None:
            return
        rec.stop_unix_s = time.time()
        self.metrics.step_duration.observe(time.monotonic() - rec.opened_mono)
        self.timeline.mark_stop(rec.step, rec.stop_unix_s)
        self.events.publish(StepEvent(StepEventKind.STOP, rec.step, rec.stop_unix_s))

    def event_snapshot(self, from_step: int) -> list[StepEvent]:
        """Current state as events, for a new WatchStep follower of steps >= `from_step`."""
        cur = self.current
        if cur is None or cur.step < from_step:
            return []
        out = []
        if from_step < cur.step:  # the watched step is over
            past = self.timeline.get(from_step)
            when = past.stop_unix_s if past and past.stop_unix_s else cur.opened_unix_s
            out.append(StepEvent(StepEventKind.STOP, from_step, when))
        out.append(StepEvent(StepEventKind.OPENED, cur.step, cur.opened_unix_s))
        if cur.stop_unix_s is not None:
            out.append(StepEvent(StepEventKind.STOP, cur.step, cur.stop_unix_s))
        if cur.closed_unix_s is not None:
            out.append(StepEvent(StepEventKind.CLOSED, cur.step, cur.closed_unix_s))
        return out

    # ------------------------------------------------------------------ pre-generation, drafts

    def claim(self, step: int, rank_id: str, max_tasks: int, tail_fill: bool = False
              ) -> tuple[list[PregenTask], int, bool, int, int]:
        """Tasks for a rank in its bubble: (tasks, target step, stop, remaining queued,
        plain tasks in progress on some rank whose drafts may still offer branches). With
        `tail_fill` a rank still decoding its shard claims too (lanes beside its own
        requests, within its tail-fill budget)."""
        self.ranks.require_live(rank_id)
        cur = self._require_step(step)
        if cur is None or self.pregen_over(step):
            return [], step + 1, True, 0, 0
        if rank_id in cur.shards and rank_id not in cur.done and not tail_fill:
            raise precondition(
                "rank_id", f"rank {rank_id!r} has not reported done for step {step}: "
                "pre-generation only runs in the bubble")
        # refresh hints travel in the reply: 4 bytes a token, half the message for them
        tasks = cur.queue.claim(rank_id, min(max_tasks, self.config.max_tasks_per_claim),
                                self.config.max_message_bytes // 8)
        if tasks:
            self.metrics.tasks_claimed.inc(len(tasks))
        return (tasks, cur.queue.target_step, False, cur.queue.queued,
                cur.queue.branchable_claimed)

    def accepts_drafts_for(self, step: int) -> bool:
        """Drafts are taken for the current step and the future steps it was handed (at
        least the next one), while not over."""
        cur = self.current
        return cur is not None and self.closed_through < step <= max(cur.step + 1,
                                                                      cur.queue.last_step)

    def push(self, step: int, rank_id: str, drafts: Sequence[PregenDraft]) -> PushResult:
        """Store drafts; per-draft statuses; complete drafts retire their tasks."""
        self.ranks.require_live(rank_id)
        cur = self.current
        if not self.accepts_drafts_for(step):
            statuses = [DraftStatus.REJECTED_STEP] * len(drafts)
            why = f"step {step} does not take drafts (current: {self._cur_text()})"
        else:
            statuses = [self.store.put(step, d, rank_id) for d in drafts]
            why = ""
            queue = cur.queue.queue_of(step) if cur is not None else None
            if queue is not None:
                for d, st in zip(drafts, statuses):
                    if st is not DraftStatus.STORED:
                        continue
                    if d.complete:
                        self._completed(step, queue, d)
                    elif d.branch_offers:  # streamed: offered while the draft decodes
                        self._offered(step, queue, d)
        stored = sum(s is DraftStatus.STORED for s in statuses)
        rejected = len(statuses) - stored
        if stored:
            self.metrics.drafts_stored.inc(stored)
        for st in set(statuses) - {DraftStatus.STORED}:
            self.metrics.drafts_rejected.labels(st.value).inc(statuses.count(st))
        if DraftStatus.REJECTED_FULL in statuses:
            why = (f"draft store full ({self.store.bytes} of {self.store.budget_bytes} bytes); "
                   "keep going without storing more")
        elif DraftStatus.REJECTED_GAP in statuses and not why:
            why = "offset past the stored draft's length: resend from offset 0"
        return PushResult(statuses, stored, rejected, why, self.store.bytes,
                          self.store.budget_bytes)

    def _completed(self, step: int, queue: TaskQueue, d: PregenDraft) -> None:
        """A complete draft was stored for the queue's step: retire its task (a branch
        retires its branch task) and queue the branches it offers."""
        key, length = (d.prompt_key, d.sample_index), d.offset + len(d.token_ids)
        if d.branch_at is not None:
            queue.complete_branch((*key, d.branch_at))
            return
        if queue.complete(key, length):
            self.metrics.tasks_completed.inc()
        self._offered(step, queue, d)

    def _offered(self, step: int, queue: TaskQueue, d: PregenDraft) -> None:
        """Queue the branches a stored draft (complete or partial) offers."""
        if not d.branch_offers:
            return
        tokens = self.store.tokens_of(step, d.prompt_key, d.sample_index)
        if tokens is not None:
            self.metrics.branches_offered.inc(
                queue.add_branches((d.prompt_key, d.sample_index), tokens, d.branch_offers))

    def fetch(self, step: int, prompt_keys: Sequence[str]) -> tuple[list[PregenDraft], bool]:
        """Stored drafts of the given prompts, capped to fit in one reply."""
        return self.store.fetch(step, prompt_keys, int(self.config.max_message_bytes * 0.9))

    def locate(self, step: int, prompt_keys: Sequence[str]
               ) -> tuple[list[PregenDraft], list[tuple[str, array]], list[tuple[str, str]],
                          bool]:
        """`fetch`, with the drafts of live ranks that serve their own located instead
        (`DraftStore.locate`): (drafts, located, (owner, its drafts address) by index,
        truncated)."""
        peers = self.ranks.draft_peers()
        drafts, located, owners, truncated = self.store.locate(
            step, prompt_keys, peers, int(self.config.max_message_bytes * 0.9))
        return drafts, located, [(o, peers[o]) for o in owners], truncated

    # ------------------------------------------------------------------ timeline, state

    def report_spans(self, rank_id: str, step: int, spans: Sequence[Span]) -> tuple[int, int]:
        """File spans under `step`; (stored, dropped). Spans of forgotten steps are dropped."""
        self.ranks.require_live(rank_id)
        cur = self.current
        if cur is None or step > cur.step:
            raise precondition("step", f"step {step} is not open (current: {self._cur_text()})")
        return self.timeline.add_spans(step, rank_id, spans)

    def get_timeline(self, step: int) -> StepTimeline:
        """The timeline of a kept step (NOT_FOUND otherwise)."""
        t = self.timeline.get(step)
        if t is None:
            raise not_found("step", f"no timeline for step {step} (kept: "
                                    f"{self.timeline.kept_steps()})")
        return t

    def snapshot(self) -> SyncSnapshot:
        """Everything GetState reports."""
        cur = self.current
        return SyncSnapshot(
            instance_id=self.instance_id,
            current_step=cur.step if cur else None,
            step_open=cur is not None and cur.closed_unix_s is None,
            stopped=cur is not None and cur.stop_unix_s is not None,
            ranks=self.ranks.infos(),
            done_rank_ids=sorted(cur.done) if cur else [],
            pending_rank_ids=cur.pending if cur else [],
            queued_tasks=cur.queue.queued if cur else 0,
            claimed_tasks=cur.queue.claimed if cur else 0,
            store=self.store.stats(),
        )

    def levels(self) -> SyncLevels:
        """Gauge values for the metrics collector (read at scrape time)."""
        cur = self.current
        return SyncLevels(
            ranks_by_state=self.ranks.count_by_state(),
            step=cur.step if cur else None,
            step_open=cur is not None and cur.closed_unix_s is None,
            tasks_queued=cur.queue.queued if cur else 0,
            tasks_claimed=cur.queue.claimed if cur else 0,
            store_sequences=self.store.sequences,
            store_tokens=self.store.tokens,
            store_bytes=self.store.bytes,
            store_budget_bytes=self.store.budget_bytes,
            watchers=self.events.followers,
            branch_margin=self.margins.threshold(),
            flips_seen=self.margins.flips,
        )
