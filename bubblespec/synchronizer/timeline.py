"""Step history: the recorded per-rank timeline of the last K steps, and live step events.

`Timeline` is what shows the bubble: for each step, when it opened, when its stop signal fired, when
it closed, when each rank reported done, and the spans each rank reported. Bounded twice: K
steps, and at most `max_spans_per_rank` spans per rank and step (extra spans are counted as
dropped, not errors, so a chatty rank cannot grow the daemon without bound).

`EventHub` fans step events (OPENED / STOP / CLOSED) out to WatchStep streams. Publishing is
synchronous and cheap (append to a short log, wake waiters), so state changes stay atomic on
the event loop. A follower first gets a snapshot of the current state, then every later event;
one that fell behind the log's window gets a fresh snapshot. Events may repeat (snapshot and
log overlap); consumers dedupe on (kind, step), as `SyncClient` does.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Sequence

from bubblespec.protocol.domain import ShardAssignment, Span, StepEvent, StepTimeline

Snapshot = Callable[[int], list[StepEvent]]


class Timeline:
    """The last `keep_steps` step timelines, oldest first."""

    def __init__(self, keep_steps: int, max_spans_per_rank: int) -> None:
        self.keep_steps = max(1, int(keep_steps))
        self.max_spans_per_rank = int(max_spans_per_rank)
        self._steps: OrderedDict[int, StepTimeline] = OrderedDict()

    def open_step(self, step: int, shards: Sequence[ShardAssignment], unix_s: float) -> None:
        """Start the timeline of `step`, forgetting the oldest steps beyond K."""
        self._steps[step] = StepTimeline(step=step, opened_unix_s=unix_s, shards=list(shards))
        self._steps.move_to_end(step)
        while len(self._steps) > self.keep_steps:
            self._steps.popitem(last=False)

    def mark_stop(self, step: int, unix_s: float) -> None:
        """Record when the stop signal of `step` fired (first time only)."""
        t = self._steps.get(step)
        if t is not None and t.stop_unix_s is None:
            t.stop_unix_s = unix_s

    def mark_closed(self, step: int, unix_s: float) -> None:
        """Record when `step` closed (first time only)."""
        t = self._steps.get(step)
        if t is not None and t.closed_unix_s is None:
            t.closed_unix_s = unix_s

    def mark_done(self, step: int, rank_id: str, unix_s: float) -> None:
        """Record when `rank_id` was done (or lost) in `step` (first time only)."""
        t = self._steps.get(step)
        if t is not None:
            t.done_unix_s.setdefault(rank_id, unix_s)

    def add_spans(self, step: int, rank_id: str, spans: Sequence[Span]) -> tuple[int, int]:
        """Append spans of a rank; return (stored, dropped). Unknown/old step: all dropped."""
        t = self._steps.get(step)
        if t is None:
            return 0, len(spans)
        mine = t.spans.setdefault(rank_id, [])
        room = max(0, self.max_spans_per_rank - len(mine))
        mine.extend(spans[:room])
        stored = min(room, len(spans))
        return stored, len(spans) - stored

    def get(self, step: int) -> StepTimeline | None:
        """The timeline of `step` if it is among the kept ones (spans sorted by start)."""
        t = self._steps.get(step)
        if t is None:
            return None
        spans = {r: sorted(s, key=lambda x: x.start_unix_s) for r, s in sorted(t.spans.items())}
        return StepTimeline(
            step=t.step,
            opened_unix_s=t.opened_unix_s,
            stop_unix_s=t.stop_unix_s,
            closed_unix_s=t.closed_unix_s,
            shards=list(t.shards),
            spans=spans,
            done_unix_s=dict(t.done_unix_s),
        )

    def kept_steps(self) -> list[int]:
        """Steps whose timeline is kept, ascending."""
        return sorted(self._steps)


class EventHub:
    """A bounded log of step events with async followers."""

    def __init__(self, keep: int = 256) -> None:
        self._log: deque[tuple[int, StepEvent]] = deque(maxlen=keep)
        self._seq = 0
        self._wake = asyncio.Event()
        self.closed = False
        self.followers = 0

    def publish(self, event: StepEvent) -> None:
        """Append an event and wake every follower."""
        self._seq += 1
        self._log.append((self._seq, event))
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    def close(self) -> None:
        """End every follower's stream (server shutdown)."""
        self.closed = True
        self._wake.set()

    async def follow(self, from_step: int, snapshot: Snapshot) -> AsyncIterator[StepEvent]:
        """Events of steps >= `from_step`: the snapshot first, then live ones until closed."""
        self.followers += 1
        try:
            seq = self._seq
            for event in snapshot(from_step):
                yield event
            while not self.closed:
                if self._seq == seq:
                    await self._wake.wait()
                    continue
                if self._log[0][0] > seq + 1:  # fell out of the window: resync
                    seq = self._seq
                    for event in snapshot(from_step):
                        yield event
                    continue
                for s, event in list(self._log):
                    if s > seq:
                        seq = s
                        if event.step >= from_step:
                            yield event
        finally:
            self.followers -= 1
