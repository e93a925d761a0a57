"""A rank's pre-generation of the next step's tasks in its bubble.

Every claimed task is its own engine request, and the rank keeps up to `inflight` of them
decoding at once, claiming more as each one finishes. A fixed claim batch would instead
shrink to its longest response: the bubble is then spent decoding a batch of one while the
rest of the queue waits, and the long responses (the ones that set the next step's critical
path) start late. Keeping the batch full lets every task progress from the bubble's start.

Stopping: every lane asks `StopWatch` at every decode step; it answers from a flag that the
synchronizer's step stream sets the moment the stop comes (PollStop about every T decode
steps is the fallback), so lanes stop within one decode step of the signal.
Pre-generation ends at the step's stop signal, or, when the gateway opened the step with the
TRAINING window, at the step's close (the rank keeps pre-generating while the trainer
trains); the watch also notes when it first saw the stop signal, so the time and tokens
before it (the bubble) and after it (the training window) are reported apart.
Drafts are pushed as lanes finish (complete ones retire their tasks at once, so no other
rank redoes them) and, on stop, as partial drafts in one batch, each with the step its task
names (a bubble that covered the next step goes on to tasks of the steps after it).
A refresh task (`PregenTask.hint`: the sample's draft stored under older weights) hands the
old draft to the engine as the sample's draft first, so decoding mostly verifies it; a
refresh cut short whose tokens so far agree with the old draft pushes nothing (the stored
draft is the longer one, and agrees where it was checked). A refresh offers its margin
branches when complete (its smallest margins), never streamed: it scans its whole draft in
the bubble's first forwards, when the calibrated threshold still moves with the first flips
reported, and a streamed offer at a transient threshold spent the draft's branch budget at
position 0 in the first measured run (docs/results.md, "Prompts handed several steps
ahead").
With `branches` > 0 the rank asks for top log-probs, each complete keyed draft offers its
`branches` smallest-margin positions to the synchronizer, and the rank also decodes branch
tasks (of any rank's drafts) that the queue hands out after its plain tasks: while other
ranks still decode plain tasks (whose drafts may offer more), a rank with free lanes keeps
asking every `branch_poll_s` instead of ending its pre-generation (`rank/branches.py`).
With `branch_margin` > 0 as well, a draft still decoding offers each position whose keyed
margin falls below it at once, pushed with the partial draft so far (streamed offers).
With a `TailFill` (`rank/tail_fill.py`) the run starts while the rank's shard still decodes,
with at most the lanes the tail-fill budget allows, claims as a tail-fill claim, and goes on
as the bubble's pre-generation when the shard ends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

from bubblespec.engine.types import BatchProgress, GenRequest, GenResult
from bubblespec.protocol.domain import PregenDraft, PregenTask, StepEventKind
from bubblespec.rank.branches import (
    TOP_LOGPROBS,
    MarginWatch,
    branch_draft,
    branch_request,
    branchable,
    offers,
)
from bubblespec.rank.tail_fill import TailFill

log = logging.getLogger(__name__)


class StopWatch:
    """Has pre-generation of `step` to end? Asked by every lane at every decode step, it
    answers from a local flag, set by the synchronizer's step stream (at once), by a
    PollStop RPC about every T decode steps while the stream is not live (the fallback:
    not yet connected, broken, or a daemon that does not know the step), or by a local
    stop. `stop_seen` is (time, `tokens()`: pre-generated tokens so far) when the
    step's stop signal was first seen while pre-generation went on (the TRAINING window;
    None otherwise)."""

    def __init__(self, sync: Any, step: int, rank_id: str, local: asyncio.Event,
                 tokens: Any, poll_every: int = 8, lanes: Any = lambda: 1) -> None:
        self.sync = sync
        self.step = step
        self.rank_id = rank_id
        self.local = local
        self.tokens = tokens
        self.poll_every = poll_every
        self.lanes = lanes
        self.fired = False
        self.polls = 0
        self.streaming = False
        """The step stream is live: the stop comes on it, no polls."""
        self.stop_seen: tuple[float, int] | None = None
        self._calls = 0
        self._poll: asyncio.Future | None = None

    def fire(self) -> None:
        self.fired = True

    def _apply(self, stop: bool, over: bool) -> None:
        if stop and not over and self.stop_seen is None:  # the training window begins
            self.stop_seen = (time.time(), self.tokens())
        self.fired = self.fired or over

    async def poll(self) -> bool:
        """Ask the synchronizer now (PollStop)."""
        self.polls += 1
        self._apply(*await self.sync.poll_pregen(self.step, self.rank_id))
        return self.fired

    async def __call__(self) -> bool:
        if self.fired or self.local.is_set():
            self.fired = True
            return True
        if self.streaming:
            self._calls = 0
            return self.fired
        self._calls += 1  # each lane asks once per decode step: T steps = T x lanes asks
        if self._calls >= self.poll_every * max(1, self.lanes()) and (
                self._poll is None or self._poll.done()):
            self._calls = 0
            self._poll = asyncio.ensure_future(self.poll())
        return self.fired

    async def watch(self) -> None:
        """Follow the step stream; on any event after the step opened, ask whether
        pre-generation is over (the stream does not say which window the step has)."""
        def live(up: bool) -> None:
            self.streaming = up

        async for ev in self.sync.watch_step(self.step, self.rank_id, on_live=live):
            if ev.step == self.step and ev.kind is StepEventKind.OPENED:
                continue
            if ev.step > self.step or ev.kind is StepEventKind.CLOSED:
                self.fired = True
            elif not await self.poll():
                continue
            return


@dataclass
class PregenOutcome:
    """What one bubble's pre-generation did."""

    tokens: int = 0
    tasks: int = 0
    complete: int = 0
    pushed_tokens: int = 0
    branches: int = 0
    """Margin branches decoded (their tokens are in `tokens`)."""
    branch_tokens: int = 0
    """Tokens those branches decoded past their prefix (the branches' share of `tokens`)."""
    streamed_offers: int = 0
    """Branch offers pushed while their draft was still decoding."""
    refreshed: int = 0
    """Refresh tasks decoded (drafts of older weights verified under the current ones)."""
    stopped: bool = False
    """The stop signal (or a local stop) ended it, rather than an empty queue."""
    started_at: float = 0.0
    ended_at: float = 0.0
    stop_seen: tuple[float, int] | None = None
    """(time, tokens pre-generated so far) when the step's stop signal was first seen."""
    tail_end: tuple[float, int] | None = None
    """(time, tokens pre-generated so far) when the rank's shard ended, for a run that
    began beside it (tail-fill); None otherwise."""
    tail_lanes: int = 0
    """Most lanes the tail-fill budget allowed at once beside the shard."""

    def spans(self) -> list[tuple[str, float, float, int]]:
        """(kind, start, end, tokens): the part beside the rank's own shard ("pregen_tail";
        only with tail-fill), the bubble part ("pregen") and the part after the stop signal
        ("pregen_window"; only when pre-generation went on past it). Tokens are those
        decoded in each part (lanes' tokens as they arrive)."""
        if self.ended_at <= self.started_at:
            return []
        # where each part begins: (its kind, time, tokens decoded before it)
        marks = [("pregen_tail" if self.tail_end is not None else "pregen", self.started_at, 0)]
        for kind, cut in (("pregen", self.tail_end), ("pregen_window", self.stop_seen)):
            if cut is not None and marks[-1][1] < cut[0] < self.ended_at:
                marks.append((kind, cut[0], min(max(cut[1], marks[-1][2]), self.tokens)))
        ends = [(t, n) for _, t, n in marks[1:]] + [(self.ended_at, self.tokens)]
        return [(kind, t0, t1, n1 - n0) for (kind, t0, n0), (t1, n1) in zip(marks, ends)]


def task_request(t: PregenTask, branching: bool = False) -> GenRequest:
    """The engine request of one pre-generation task (one sample, its own seed); with
    `branching`, also the top log-probs its margin branches are chosen by."""
    return GenRequest(input_ids=list(t.prompt_token_ids), n=1, seeds=[t.seed],
                      sample_offset=t.sample_index, group=t.prompt_key, sampling=t.sampling,
                      top_logprobs=TOP_LOGPROBS if branching and branchable(t) else 0)


def task_draft(t: PregenTask, g: GenResult,
               branch_offers: list[tuple[int, int]] | None = None,
               watch: MarginWatch | None = None) -> PregenDraft:
    """The draft of a finished plain task, with the margin branches it offers and, from
    `watch`, the running minima of its keyed margins (a draft cut short has them too)."""
    s = g.samples[0]
    if watch is not None and s.top_logprobs:
        watch.feed(s.output_ids, s.top_logprobs, offer=False)  # only what is left to read
    return PregenDraft(prompt_key=t.prompt_key, sample_index=t.sample_index,
                       token_ids=s.output_ids, complete=s.finish_reason != "abort",
                       weight_version=s.weight_version, branch_offers=branch_offers or (),
                       margin_records=list(watch.records) if watch is not None else ())


def stale_kept(t: PregenTask, d: PregenDraft) -> bool:
    """A refresh cut short whose tokens agree with its old draft so far: the stored draft
    stays (it is longer, and agrees wherever the new weights were checked)."""
    return (not d.complete and len(d.token_ids) <= len(t.hint)
            and list(t.hint[: len(d.token_ids)]) == list(d.token_ids))


class Pregenerator:
    """Runs one bubble: claim, decode up to `inflight` tasks at once, push, until stop."""

    def __init__(self, engine: Any, sync: Any, rank_id: str, step: int, inflight: int,
                 poll_every: int, local_stop: asyncio.Event, branches: int = 0,
                 branch_poll_s: float = 0.25, branch_margin: float | str = 0.0,
                 tail: TailFill | None = None) -> None:
        self.engine = engine
        self.sync = sync
        self.rank_id = rank_id
        self.step = step
        self.inflight = inflight
        self.lanes: dict[asyncio.Task, PregenTask] = {}
        self.branches = max(0, int(branches))
        self.branch_poll_s = branch_poll_s
        self.auto_margin = branch_margin == "auto"
        self.branch_margin = 0.0 if self.auto_margin else max(0.0, float(branch_margin))
        self.watches: dict[asyncio.Task, MarginWatch] = {}
        self._streams: set[asyncio.Task] = set()
        self._streamed = 0
        self.progress = BatchProgress()
        """The lanes' live shape; `generated` counts the tokens they decoded so far."""
        self.stop = StopWatch(sync, step, rank_id, local_stop, lambda: self.progress.generated,
                              poll_every, lambda: len(self.lanes))
        self.target = step + 1
        self.tail = tail
        """A `TailFill` while the rank's shard still decodes (None: a bubble's run)."""

    async def run(self) -> PregenOutcome:
        out = PregenOutcome(started_at=time.time())
        lanes = self.lanes
        groups: set[str] = set()
        exhausted = waiting = False
        tail = self.tail is not None
        watcher = asyncio.create_task(self.stop.watch())
        try:
            while True:
                if tail and not self._tail_mark(out):
                    tail = exhausted = False  # the shard ended: claim again for the bubble
                limit = min(self.inflight, self.tail.lanes()) if tail else self.inflight
                room = limit - len(lanes)
                if room > 0 and (tail or not exhausted) and not await self.stop():
                    claim = await self.sync.claim_tasks(self.step, self.rank_id, room,
                                                        tail_fill=tail)
                    self.target = claim.target_step
                    if self.auto_margin:  # the synchronizer's calibrated threshold
                        self.branch_margin = claim.branch_margin
                    if claim.stop:
                        self.stop.fire()
                    # with branches on, plain tasks still decoding elsewhere may offer more
                    waiting = (self.branches > 0 and not claim.stop and not claim.tasks
                               and claim.in_progress > 0)
                    exhausted = claim.stop or (not claim.tasks and not waiting)
                    for t in claim.tasks:
                        if t.step is None:  # a synchronizer that names no step per task
                            t = dataclasses.replace(t, step=claim.target_step)
                        self._start(t)
                        groups.add(t.prompt_key)
                    out.tasks += sum(t.branch_at is None for t in claim.tasks)
                if tail and not self.stop.fired:  # beside the shard: wake for a finished
                    # lane, the shard's end, or a tick (the allowance changes as the shard's
                    # own sequences finish)
                    await self._push(out, await self._next_done(tail=True))
                    continue
                if not lanes:
                    if not waiting or await self.stop():
                        break
                    await asyncio.sleep(self.branch_poll_s)
                    continue
                await self._push(out, await self._next_done(tail=False, waiting=waiting))
        finally:
            watcher.cancel()
            for lane in lanes:  # only on an error: do not leave requests decoding
                lane.cancel()
            for push in self._streams:
                push.cancel()
            if groups:
                await self.engine.release_groups(sorted(groups))
        out.stopped = self.stop.fired
        out.streamed_offers = self._streamed
        out.ended_at = time.time()
        out.stop_seen = self.stop.stop_seen
        if self.tail is not None:
            out.tail_lanes = self.tail.peak
        return out

    def _tail_mark(self, out: PregenOutcome) -> bool:
        """Is the run still beside the rank's shard? Notes when the shard ended."""
        if self.tail is None:
            return False
        if not self.tail.active and out.tail_end is None:
            out.tail_end = (self.tail.ended_at or time.time(), self.progress.generated)
        return self.tail.active

    async def _next_done(self, tail: bool, waiting: bool = False
                         ) -> list[tuple[PregenTask, asyncio.Task]]:
        """Wait for finished lanes (with `tail` also for the shard's end or a tick; with
        `waiting` for a tick) and take them out of the running set."""
        waits: list[asyncio.Future] = list(self.lanes)
        ended = None
        if tail:
            ended = asyncio.ensure_future(self.tail.changed.wait())
            waits.append(ended)
        timeout = self.branch_poll_s if tail or waiting else None
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED,
                                         timeout=timeout)
        finally:
            if ended is not None:
                ended.cancel()
        return [(self.lanes.pop(d), d) for d in done if d in self.lanes]

    def _start(self, t: PregenTask) -> None:
        """A lane for a claimed task: a plain task, or a branch task (its prefix first)."""
        watch = None
        if t.branch_at is None:
            req: GenRequest | None = task_request(t, self.branches > 0)
            if req.top_logprobs:
                # a refresh verifies its old draft several tokens a forward, so it completes
                # early: it offers at its smallest margins when complete, not streamed at a
                # threshold that the bubble's first flip reports may still be moving
                watch = MarginWatch(t.seed, t.sampling.temperature, self.branches,
                                    0.0 if t.hint else self.branch_margin)
        else:
            req = branch_request(t)
        lane = asyncio.create_task(self._lane(req, t, watch))
        self.lanes[lane] = t
        if watch is not None:
            self.watches[lane] = watch

    async def _lane(self, req: GenRequest | None, t: PregenTask,
                    watch: MarginWatch | None) -> GenResult | None:
        if req is None:  # a branch without token budget left: its prefix is the draft
            return None
        if t.hint:  # a refresh: the old draft is this sample's draft
            await self.engine.add_drafts([(t.prompt_key, t.sample_index, list(t.hint))])
        observe = None
        if watch is not None and watch.threshold > 0:
            def observe(_: int, ids: list[int], top: list | None) -> None:
                if top is not None and len(watch.offered) < watch.budget:
                    new = watch.feed(ids, top)
                    if new:
                        self._stream(t, list(ids), new, watch)
        results = await self.engine.generate([req], should_stop=self.stop, poll_every=1,
                                             counters=False, observe=observe,
                                             progress=self.progress)
        return results[0]

    def _stream(self, t: PregenTask, ids: list[int], new: list[tuple[int, int]],
                watch: MarginWatch) -> None:
        """Push the partial draft so far with the offers just found (a streamed offer)."""
        d = PregenDraft(prompt_key=t.prompt_key, sample_index=t.sample_index, token_ids=ids,
                        complete=False, weight_version=self.engine.weight_version,
                        branch_offers=new,
                        margin_records=list(watch.records))
        log.info("streamed branch offer: %s/%d at %s, %d tokens decoded", t.prompt_key,
                 t.sample_index, [p for p, _ in new], len(ids))
        push = asyncio.ensure_future(self.sync.push_drafts(self._step_of(t), self.rank_id,
                                                           [d]))
        self._streams.add(push)
        push.add_done_callback(self._streamed_done)
        self._streamed += len(new)

    def _streamed_done(self, push: asyncio.Task) -> None:
        self._streams.discard(push)
        if not push.cancelled() and push.exception() is not None:
            log.warning("streamed branch offer failed: %r", push.exception())

    async def _push(self, out: PregenOutcome, finished: list[tuple[PregenTask, Any]]) -> None:
        if self._streams:  # a partial draft pushed later would replace the complete one
            await asyncio.gather(*list(self._streams), return_exceptions=True)
        drafts = []
        for t, lane in finished:
            watch = self.watches.pop(lane, None)
            if lane.exception() is not None:
                log.warning("pre-generation of %s/%d failed: %r", t.prompt_key, t.sample_index,
                            lane.exception())
                continue
            if t.branch_at is not None:
                d = branch_draft(t, lane.result())
                out.branches += 1
                log.info("branch %s/%d@%d: %d tokens decoded%s", t.prompt_key, t.sample_index,
                         t.branch_at, len(d.token_ids) - len(t.prefix),
                         "" if d.complete else ", cut at the stop")
                out.tokens += len(d.token_ids) - len(t.prefix)
                out.branch_tokens += len(d.token_ids) - len(t.prefix)
            else:
                g = lane.result()
                d = task_draft(t, g, offers(t, g, self.branches, watch), watch)
                out.tokens += len(d.token_ids)
                out.complete += d.complete
                if t.hint:
                    out.refreshed += 1
                    if stale_kept(t, d):
                        continue
            if d.token_ids:
                drafts.append((self._step_of(t), d))
        for step in sorted({s for s, _ in drafts}):
            batch = [d for s, d in drafts if s == step]
            res = await self.sync.push_drafts(step, self.rank_id, batch)
            out.pushed_tokens += sum(len(d.token_ids) for d, st in zip(batch, res.statuses)
                                     if st.value == "stored")

    def _step_of(self, t: PregenTask) -> int:
        """The step a task's draft is pushed for."""
        return t.step if t.step is not None else self.target
