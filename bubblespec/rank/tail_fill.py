"""Tail-fill: pre-generation lanes beside a rank's own requests, before it is done.

A rank whose running batch has shrunk to its last long responses has idle capacity on a
GPU (the forward is memory-bound), so with a tail-fill budget b > 0 its pre-generation of
the next steps' tasks starts while its shard still decodes: the `Pregenerator` keeps at
most `lanes()` lanes, the count the engine-time model allows within a forward (1 + b) x
as long as the shard's own (`core/tail_fill.py`), read from the shard's live
`BatchProgress`. Own requests come first: they are admitted before any lane, and vLLM's
first-come scheduler preempts the latest-admitted sequence when KV memory runs short. A
lane running when the allowance shrinks is not aborted (its context is budgeted at its
full length from the start). When the shard ends, `end()` turns the lanes into the bubble's
pre-generation (up to `pregen_inflight`), without stopping any of them.
"""

from __future__ import annotations

import asyncio
import time

from bubblespec.core.engine_time import EngineTime
from bubblespec.core.tail_fill import lanes_within
from bubblespec.engine.types import BatchProgress


class TailFill:
    """The lane allowance of one shard's tail, live while the shard decodes."""

    def __init__(self, et: EngineTime, budget: float, progress: BatchProgress,
                 lane_tokens: int, max_lanes: int) -> None:
        self.et = et
        self.budget = budget
        self.progress = progress
        self.lane_tokens = lane_tokens
        self.max_lanes = max_lanes
        self.active = True
        self.ended_at: float | None = None
        self.changed = asyncio.Event()
        """Set when the shard ends (the pre-generation loop wakes to fill the bubble)."""
        self.peak = 0
        """Most lanes allowed at once (reported)."""

    def lanes(self) -> int:
        """Lanes allowed now (0 once the shard has ended: the bubble's limit applies)."""
        if not self.active:
            return 0
        p = self.progress
        n = lanes_within(self.et, self.budget, p.running, p.context, self.lane_tokens,
                         p.longest, self.max_lanes)
        self.peak = max(self.peak, n)
        return n

    def end(self) -> None:
        """The shard is done: pre-generation goes on as the bubble's."""
        if self.active:
            self.active = False
            self.ended_at = time.time()
            self.changed.set()
