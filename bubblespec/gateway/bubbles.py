"""Bubble figures of a step from the synchronizer's timeline.

For each rank of a step (wall = open -> stop signal, i.e. until the slowest rank was done):

- busy (decode) seconds: its decode spans, clipped to the step; without spans, open -> done;
- bubble seconds: wall - busy (the time it waited for slower ranks);
- pre-gen seconds: its pre-generation spans inside the step's wall; pre-gen tokens: theirs;
- idle seconds: bubble - pre-gen (the bubble left unused);
- bubble fraction: bubble / wall; pre-gen share: pre-gen / bubble;
- window pre-gen seconds and tokens: pre-generation after the stop signal, in the training
  window (steps opened with the TRAINING pre-gen window; outside the step's wall);
- tail pre-gen seconds and tokens: pre-generation beside the rank's own requests before it
  was done (tail-fill; inside its busy time, not its bubble).

Spans of a step are those the rank filed under it (pre-generation during step s is filed
under s, for step s+1's drafts).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, fields

from bubblespec.protocol.domain import Span, SpanKind, StepTimeline
from bubblespec.protocol.gateway import RankBubble


@dataclass
class StepBubbles:
    step: int
    opened_unix_s: float
    stop_unix_s: float | None
    closed_unix_s: float | None
    wall_s: float
    complete: bool
    """True once the stop signal fired (before that, figures are provisional)."""
    ranks: list[RankBubble]
    bubble_fraction: float
    """Summed bubble over summed wall of all ranks."""
    pregen_share: float
    """Summed pre-gen over summed bubble."""
    pregen_tokens: int
    stop_lag_s: float | None = None
    """Largest stop lag of any rank: how long pre-generation ran past the stop signal."""
    window_pregen_s: float = 0.0
    window_pregen_tokens: int = 0
    """Pre-generation in the training window, after the stop signal (all ranks)."""
    tail_pregen_tokens: int = 0
    """Pre-generation beside the ranks' own requests (tail-fill, all ranks)."""

    def as_dict(self) -> dict:
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "ranks"},
                "ranks": [r.model_dump() for r in self.ranks]}


def _clipped(spans: Sequence[Span], kind: SpanKind, lo: float, hi: float) -> tuple[float, int]:
    """(seconds inside [lo, hi], tokens) of the spans of one kind."""
    seconds, tokens = 0.0, 0
    for s in spans:
        if s.kind is not kind:
            continue
        seconds += max(0.0, min(s.end_unix_s, hi) - max(s.start_unix_s, lo))
        tokens += s.tokens
    return seconds, tokens


def _ratio(a: float, b: float) -> float:
    return a / b if b > 1e-12 else 0.0


def step_bubbles(t: StepTimeline, now_unix_s: float | None = None) -> StepBubbles:
    """The bubble figures of one step (see the module docstring)."""
    end = t.stop_unix_s
    complete = end is not None
    if end is None:
        end = t.closed_unix_s or (time.time() if now_unix_s is None else now_unix_s)
    wall = max(0.0, end - t.opened_unix_s)
    shards = {s.rank_id: s.num_requests for s in t.shards}
    rank_ids = sorted(set(shards) | set(t.spans))
    ranks = []
    for r in rank_ids:
        spans = t.spans.get(r, [])
        busy, decode_tokens = _clipped(spans, SpanKind.DECODE, t.opened_unix_s, end)
        done = t.done_unix_s.get(r)
        done_s = None if done is None else max(0.0, done - t.opened_unix_s)
        if not any(s.kind is SpanKind.DECODE for s in spans):
            busy = min(wall, done_s) if done_s is not None else (0.0 if shards.get(r) == 0
                                                                 else wall)
        busy = min(busy, wall)
        pregen, pregen_tokens = _clipped(spans, SpanKind.PREGEN, t.opened_unix_s, end)
        bubble = max(0.0, wall - busy)
        pregen = min(pregen, bubble)
        ends = [s.end_unix_s for s in spans if s.kind is SpanKind.PREGEN]
        lag = max(0.0, max(ends) - t.stop_unix_s) if ends and t.stop_unix_s else None
        win_s, win_tokens = _clipped(spans, SpanKind.PREGEN_WINDOW, 0.0, float("inf"))
        tail_s, tail_tokens = _clipped(spans, SpanKind.PREGEN_TAIL, 0.0, float("inf"))
        ranks.append(RankBubble(
            rank_id=r, num_requests=shards.get(r, 0), done_s=done_s, busy_s=busy,
            bubble_s=bubble, pregen_s=pregen, idle_s=max(0.0, bubble - pregen),
            bubble_fraction=_ratio(bubble, wall), pregen_share=_ratio(pregen, bubble),
            pregen_tokens=pregen_tokens, decode_tokens=decode_tokens, spans=len(spans),
            stop_lag_s=lag, window_pregen_s=win_s, window_pregen_tokens=win_tokens,
            tail_pregen_s=tail_s, tail_pregen_tokens=tail_tokens))
    total_bubble = sum(r.bubble_s for r in ranks)
    return StepBubbles(
        step=t.step, opened_unix_s=t.opened_unix_s, stop_unix_s=t.stop_unix_s,
        closed_unix_s=t.closed_unix_s, wall_s=wall, complete=complete, ranks=ranks,
        bubble_fraction=_ratio(total_bubble, wall * len(ranks)),
        pregen_share=_ratio(sum(r.pregen_s for r in ranks), total_bubble),
        pregen_tokens=sum(r.pregen_tokens for r in ranks),
        stop_lag_s=max((r.stop_lag_s for r in ranks if r.stop_lag_s is not None), default=None),
        window_pregen_s=sum(r.window_pregen_s for r in ranks),
        window_pregen_tokens=sum(r.window_pregen_tokens for r in ranks),
        tail_pregen_tokens=sum(r.tail_pregen_tokens for r in ranks))
