"""Tail-fill in the simulator (modelled): pre-generation lanes beside a rank's own requests.

With a tail-fill budget b (`ModeSpec.tail_fill`, the rank's `--tail-fill-budget`) a rank
claims pre-generation tasks when its shard starts and decodes them beside its own requests,
as many as keep a forward within (1 + b) x the forward of its own sequences
(`core.tail_fill.lanes_within`, the rule the rank applies). The simulator applies the rule
to the rank's shard as a whole rather than forward by forward:

- the allowance is judged at the shard's forward-weighted mean batch (running sequences,
  one token each, and KV context), with a lane counted as the rank counts it: 1 +
  `spec_tokens` tokens and the context of a full-length response;
- those lanes decode one token per own forward (times the pre-generation rate) from the
  shard's start until the rank finishes, refilled from the queue as they finish; after it
  the rank pre-generates as in any bubble, with its tail lanes carried over;
- the rank's own forwards grow by what the lanes add to them at the mean batch (their
  tokens, and half a full response's context each), so its shard finishes that much
  later; a lane's one-off prefill is outside the budget and not charged.

The rank re-judges the allowance at every engine step and never aborts a lane; a mean over
the shard is the modelled stand-in. Pure arithmetic on a built timeline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bubblespec.core.engine_time import EngineTime
from bubblespec.core.tail_fill import lanes_within
from bubblespec.sim.rollout import Timeline


@dataclass
class TailFill:
    """Per rank: the lanes it decodes beside its shard and what they cost it."""

    lanes: np.ndarray
    """Lanes beside the shard (0: none; a rank with no own request gets none)."""
    slowdown: np.ndarray
    """Relative growth of the rank's own forwards while the lanes run (<= the budget)."""
    forwards: np.ndarray
    """The rank's own forwards: the lanes' forwards before it finishes."""


def shard_means(tl: Timeline) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per rank, over its own forwards: mean running sequences, mean tokens per forward and
    mean KV context (zeros for a rank with no forward)."""
    run, tok, ctx = (np.zeros(tl.ranks) for _ in range(3))
    for r in range(tl.ranks):
        i = np.nonzero(tl.rank == r)[0]
        if len(i) < 2:
            continue
        gap = np.diff(tl.k[i]).astype(float)  # forwards from each point to the next
        w = gap.sum()
        if w <= 0:
            continue
        j = i[:-1]
        run[r] = float((tl.running[j] * gap).sum() / w)
        tok[r] = float((tl.tokens[j] * gap).sum() / w)
        ctx[r] = float(((tl.ctx[j] + tl.growth[j] * (gap - 1) / 2.0) * gap).sum() / w)
    return run, tok, ctx


def tail_fill(tl: Timeline, et: EngineTime, budget: float, spec_tokens: int,
              lane_context: float, inflight: int, lane_drafted: float) -> TailFill:
    """The lanes each rank of timeline `tl` decodes beside its shard with budget `budget`
    (lanes counted at 1 + `spec_tokens` tokens and `lane_context` KV tokens, at most
    `inflight`), and the slowdown of its own forwards when the lanes verify `lane_drafted`
    draft tokens each and read half of `lane_context` on average."""
    run, tok, ctx = shard_means(tl)
    lanes = np.array([lanes_within(et, budget, round(float(run[r])), round(float(ctx[r])),
                                   1 + spec_tokens, int(np.ceil(lane_context)), inflight)
                      if run[r] > 0 else 0 for r in range(tl.ranks)], dtype=np.int64)
    slow = np.zeros(tl.ranks)
    for r in np.nonzero(lanes)[0]:
        base = et.forward(tok[r], ctx[r])
        more = et.forward(tok[r] + lanes[r] * (1.0 + lane_drafted),
                          ctx[r] + lanes[r] * lane_context / 2.0)
        slow[r] = min(budget, more / base - 1.0)
    return TailFill(lanes, slow, tl.finish_k.astype(np.int64))
