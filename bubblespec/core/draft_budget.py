"""How many tokens to draft per request in one engine step, chosen from the batch.

A verified draft token is nearly free while a forward stays under the roofline ridge of the
engine-time model (`EngineTime`: the GEMMs are memory-bound), and costs its FLOPs above it.
At 16 rows per rank a fixed draft length of 8 puts 144 tokens in a forward, under an H100's
ridge of 184 for an 8B model; at 128 rows it puts 1,152, and the forward takes several
times as long as one without drafts. Whether that pays depends on how many drafted tokens
are accepted.

`DraftBudget` keeps a running estimate of the per-token acceptance probability p of the
batch's drafts (sample-and-match stops at the first mismatch, so accepted lengths are
geometric: a draft of k tokens yields sum_{j=1..k} p^j accepted tokens on average;
p is estimated as accepted / (accepted + rejections), with decay so it follows the run).
Each request's own p_i is its accepted draft tokens over accepted tokens + rejections (its
drafts cut short; a draft accepted whole, as when its cap binds, has none), shrunk towards the
batch's p by `shrink` pseudo-observations (`request_p`): an aligned pre-generated response
accepted almost whole keeps its p_i near 1 in a batch whose other drafts fail. (Counting
every draft as a rejection would make the estimate self-fulfilling: a cap of 3 accepted
whole would read as p = 0.75 and keep the cap at 3.)
Each step gives each request i its own cap k_i in [0, k_max], maximising expected tokens per
modelled second of the forward:

    (rows + sum of the chosen gains)  /  EngineTime.forward(rows + sum_i k_i, context)

where drafting a j-th token for request i gains p_i^j expected tokens. The gains of one
request fall with j, so taking the m largest gains of the batch gives each request a prefix:
the best m is found by sorting the gains once and scanning m (the cost side counts every
capped token: an upper bound, since sources often draft fewer). At small batches, where a
forward stays under the ridge, caps stay near k_max for every request whose drafts are
accepted at all; at large ones the tokens go to the requests whose drafts pay (an aligned
pre-generated response accepted whole keeps its full length in a batch whose other drafts
fail). When every cap is 0, every `PROBE_EVERY`-th step drafts 1 token for each request so
the estimates keep learning. Pure arithmetic (numpy), shared by the proposer and tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bubblespec.core.engine_time import EngineTime

PROBE_EVERY = 16
"""With a best cap of 0, one step in this many drafts 1 token (keeps p up to date)."""


@dataclass
class DraftBudget:
    """Per-step draft cap from batch size and acceptance (module docstring)."""

    model: EngineTime
    k_max: int
    decay: float = 0.98
    """Weight kept by the past at each step (the estimate's memory is ~1/(1-decay) steps)."""
    prior_accepted: float = 4.0
    prior_rejected: float = 1.0
    """Pseudo-counts of the estimate before any draft was verified (p = 0.8)."""
    shrink: float = 4.0
    """Pseudo-drafts at the batch's p in each request's own estimate (`request_p`)."""
    accepted: float = field(init=False)
    rejected: float = field(init=False)
    _steps_at_zero: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.k_max < 0:
            raise ValueError(f"k_max must be >= 0, got {self.k_max}")
        self.accepted, self.rejected = self.prior_accepted, self.prior_rejected

    @property
    def p(self) -> float:
        """Estimated probability that a drafted token is accepted (given the ones before)."""
        return self.accepted / (self.accepted + self.rejected)

    def observe(self, drafted: np.ndarray, emitted: np.ndarray) -> None:
        """Requests that drafted `drafted[i]` tokens last step emitted `emitted[i]` tokens
        (accepted drafts + 1); requests without a draft are ignored."""
        d = np.asarray(drafted, dtype=np.int64)
        e = np.asarray(emitted, dtype=np.int64)
        had = (d > 0) & (e > 0)
        if not had.any():
            return
        acc = np.minimum(e[had] - 1, d[had])
        self.accepted = self.decay * self.accepted + float(acc.sum())
        self.rejected = self.decay * self.rejected + float((acc < d[had]).sum())

    def request_p(self, accepted: np.ndarray, rejected: np.ndarray) -> np.ndarray:
        """Each request's acceptance probability from its accepted draft tokens and its
        rejections so far, shrunk towards the batch's `p` by `shrink` observations."""
        acc = np.asarray(accepted, dtype=float)
        return (acc + self.shrink * self.p) / (acc + np.asarray(rejected, dtype=float)
                                               + self.shrink)

    def under_ridge(self, rows: int) -> bool:
        """`rows` requests drafting `k_max` each keep the forward under the roofline ridge,
        where a drafted token costs only `t_token`: the caller may skip the caps (and their
        host time) and let every request draft in full. (Measured on the paced bench at 16
        rows per rank: the per-request bookkeeping cost more host time than the caps saved
        there.)"""
        return rows * (1 + self.k_max) <= self.model.ridge

    def caps(self, p: np.ndarray, context: float) -> np.ndarray:
        """Per-request caps [R] (int64) that maximise expected tokens per modelled second
        for requests whose acceptance probabilities are `p` [R] and whose contexts sum to
        `context` tokens (module docstring)."""
        p = np.asarray(p, dtype=float)
        rows = p.shape[0]
        if rows == 0 or self.k_max == 0:
            return np.zeros(rows, dtype=np.int64)
        gains = np.power.outer(p, np.arange(1, self.k_max + 1)).ravel()  # [R * k_max]
        order = np.argsort(-gains, kind="stable")
        m = np.arange(gains.size + 1)
        tokens = rows + np.concatenate([[0.0], np.cumsum(gains[order])])
        seconds = self.model.per_forward(rows + m) + self.model.t_kv * context
        best = int(np.argmax(tokens / seconds))
        return np.bincount(order[:best] // self.k_max, minlength=rows).astype(np.int64)

    def next_caps(self, p: np.ndarray, context: float) -> np.ndarray:
        """`caps`, with a 1-token probe for every request every `PROBE_EVERY` steps while
        every cap is 0."""
        caps = self.caps(p, context)
        if caps.any() or not len(caps):
            self._steps_at_zero = 0
            return caps
        self._steps_at_zero += 1
        return caps + 1 if self._steps_at_zero % PROBE_EVERY == 0 else caps
