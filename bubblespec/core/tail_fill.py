"""How many pre-generation lanes a rank may decode beside its own requests (tail-fill).

On a GPU a decode forward is memory-bound below the roofline ridge: its time is mostly the
weight read (`EngineTime.t_fixed`), so a rank whose batch has shrunk to its last long
responses could decode more sequences in the same forwards for little extra time. A rank
with a tail-fill budget b adds lanes while the engine-time model says

    forward(own tokens + lanes x lane tokens, own context + lanes x lane context)
        <= (1 + b) x forward(own tokens, own context)

Both sides are judged conservatively: each own sequence counts one token (drafts verified
would make the base forward, and so the allowance, larger), each lane counts 1 + the most
tokens a step drafts, and a lane's context is the longest a sequence can grow to (prompt +
max new tokens), which its KV read reaches at the end of its draft. A lane's prefill is a
one-off (`t_flop` per prompt token) and is not in the budget; the paced bench charges it
and reports the critical path with and without tail-fill. Pure arithmetic, no engine.
"""

from __future__ import annotations

from bubblespec.core.engine_time import EngineTime


def lanes_within(et: EngineTime, budget: float, own_seqs: int, own_context: int,
                 lane_tokens: int, lane_context: int, max_lanes: int) -> int:
    """Most lanes (0..`max_lanes`) that keep the forward within (1 + `budget`) x the
    forward of the rank's own `own_seqs` sequences reading `own_context` KV tokens; 0 when
    the rank has no own sequence left (the bubble proper has begun) or `budget` <= 0."""
    if budget <= 0 or own_seqs <= 0 or max_lanes <= 0:
        return 0
    base = et.forward(own_seqs, own_context)
    allowed = (1.0 + budget) * base
    # forward() is increasing in the lane count: find the largest count by bisection
    lo, hi = 0, max_lanes
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if et.forward(own_seqs + mid * lane_tokens, own_context + mid * lane_context) <= allowed:
            lo = mid
        else:
            hi = mid - 1
    return lo
