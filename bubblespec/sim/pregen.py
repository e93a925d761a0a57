"""Pre-generation in the bubble of one step (modelled), as the rank worker does it.

A rank that finished its shard of step s at F_r < F_max (the slowest rank's finish) claims
`claim` tasks of step s+1 from the synchronizer's queue (breadth-first: sample 0 of every
prompt, then sample 1, ...; first done, first served), generates them as one batch with plain
decoding (1 token per forward, old weights), pushes the (possibly partial) responses, and
claims again. (The rank itself keeps up to `pregen_inflight` = 64 tasks decoding and
refills each lane as it finishes, `bubblespec/rank/pregen.py`; a batch of that size is the
model, which is exact while the queue fits in one batch.) While a batch runs it polls
PollStop every T decode steps; the first poll at or after F_max stops it (answer after one RPC
latency). A claim made at or after F_max is answered "stop". A rank that finds the queue empty
waits on the stop stream (no lag). So a rank's stop lag is at most T forwards of its batch,
plus the prefill of a batch claimed just before F_max, plus two RPCs: the T polling lag bound
(tests/sim/test_pregen.py checks it).

The task of (prompt p, sample j) of step s+1 is taken to produce the prefix of that request's
actual response (same prompt, sample index and keyed seed: docs/design.md section 3), so its
progress when stopped is the number of covered leading positions in step s+1.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from bubblespec.sim.engine_time import EngineTime

IDLE_EPS_S = 1e-9
"""Bubbles shorter than this (relative to the step, in seconds) are float noise: no pre-gen."""


@dataclass
class PregenResult:
    """Outcome of one bubble's pre-generation."""

    covered: np.ndarray
    """Per next-step request (index = prompt * n + sample): covered leading tokens."""
    busy_in_bubble: np.ndarray
    """Per rank: seconds spent pre-generating (claim RPC, prefill, decode) before F_max."""
    stop_t: np.ndarray
    """Per rank: time it was free for the next step (F_r for ranks that did nothing)."""
    tasks_claimed: int
    pregen_tokens: int


@dataclass
class BatchProfile:
    """Timeline of one pre-generation batch whose tasks all start at forward 0."""

    breaks: np.ndarray
    """Forward indices 0, then each task's completion (sorted)."""
    tcum: np.ndarray
    """Seconds elapsed at each break."""
    running: np.ndarray
    """Tasks running in [breaks[i], breaks[i+1])."""
    growth: np.ndarray
    """Tokens emitted per forward by the running tasks in that interval."""
    tokens: np.ndarray
    """Forward tokens (1 + drafted per running task) in that interval."""
    prompt_len: float

    @classmethod
    def build(cls, lengths: np.ndarray, prompt_len: float, et: EngineTime,
              accepted: float = 0.0, drafted: float = 0.0) -> BatchProfile:
        """Profile of tasks of `lengths` decoded at 1 + `accepted` tokens per forward."""
        f = np.ceil(lengths / (1.0 + accepted) - 1e-9).astype(np.int64)
        order = np.argsort(f, kind="stable")
        fs, g = f[order], (lengths[order] / f[order]).astype(float)
        breaks = np.concatenate([[0], fs])
        running = len(fs) - np.arange(len(fs), dtype=float)
        growth = np.cumsum(g[::-1])[::-1]
        tokens = running * (1.0 + drafted)
        m = np.diff(breaks).astype(float)
        ctx0 = running * prompt_len + growth * breaks[:-1]
        seg = et.segment(m, tokens, ctx0, growth)
        return cls(breaks, np.concatenate([[0.0], np.cumsum(seg)]), running, growth, tokens,
                   prompt_len)

    @property
    def end(self) -> int:
        return int(self.breaks[-1])

    def time_at(self, k: int, et: EngineTime) -> float:
        """Seconds for the first `k` forwards."""
        if k >= self.breaks[-1]:
            return float(self.tcum[-1])
        i = int(np.searchsorted(self.breaks, k, side="right") - 1)
        b = float(self.breaks[i])
        ctx0 = self.running[i] * self.prompt_len + self.growth[i] * b
        return float(self.tcum[i] + et.segment(k - b, self.tokens[i], ctx0, self.growth[i]))


def first_poll_reaching(need: float, poll_every: int, prof: BatchProfile,
                        et: EngineTime) -> int | None:
    """Forward index of the first poll (multiples of `poll_every`) whose elapsed time is
    >= `need`, if it comes before the batch completes; else None."""
    end = prof.end
    last = (end - 1) // poll_every  # polls at j * poll_every < end, j = 1..last
    if last < 1:
        return None
    if prof.time_at(last * poll_every, et) < need:
        return None
    lo, hi = 1, last
    while lo < hi:  # elapsed time is monotone in the poll index
        mid = (lo + hi) // 2
        if prof.time_at(mid * poll_every, et) >= need:
            hi = mid
        else:
            lo = mid + 1
    return lo * poll_every


def breadth_first(prompts: int, n: int) -> np.ndarray:
    """Queue order of the synchronizer: sample 0 of every prompt, then sample 1, ..."""
    return (np.arange(prompts)[None, :] * n + np.arange(n)[:, None]).ravel()


def simulate_pregen(finish: np.ndarray, next_lengths: np.ndarray, et: EngineTime,
                    poll_every: int = 8, claim: int = 16, rpc_s: float = 0.5e-3,
                    prompt_len: float = 0.0, accepted: float = 0.0,
                    drafted: float = 0.0, order: np.ndarray | None = None) -> PregenResult:
    """Pre-generation of step s+1 (lengths `next_lengths`, shape (prompts, n)) in the bubble
    of a step whose ranks finished at `finish` (see the module docstring). Pre-generation
    decodes at 1 + `accepted` tokens per forward verifying `drafted` draft tokens (default
    plain decoding: breadth-first batches hold no siblings to draft from). `order` replaces
    the breadth-first queue (request indices, prompt * n + sample)."""
    if poll_every < 1 or claim < 1:
        raise ValueError("poll_every and claim must be >= 1")
    prompts, n = next_lengths.shape
    ranks = len(finish)
    fmax = float(finish.max()) if ranks else 0.0
    # breadth-first queue: (p, j) in order j-major; request index = p * n + j
    if order is None:
        order = breadth_first(prompts, n)
    flat = next_lengths.ravel()
    covered = np.zeros(prompts * n, dtype=np.int64)
    busy = np.zeros(ranks)
    stop_t = finish.astype(float).copy()
    q = 0
    eps = IDLE_EPS_S * max(1.0, fmax)  # float noise of equal work is not a bubble
    heap = [(float(finish[r]), int(r)) for r in range(ranks) if finish[r] < fmax - eps]
    heapq.heapify(heap)
    prefill_s = prompt_len * et.t_flop
    while heap:
        t, r = heapq.heappop(heap)
        if t >= fmax:  # this claim is answered "stop"
            stop_t[r] = t
            continue
        if q >= len(order):  # queue empty: wait on the stop stream, free at F_max
            stop_t[r] = fmax
            continue
        idx = order[q:q + claim]
        q += len(idx)
        lens = flat[idx]
        t0 = t + rpc_s + prefill_s * len(idx)
        prof = BatchProfile.build(lens, prompt_len, et, accepted, drafted)
        kp = first_poll_reaching(fmax - t0, poll_every, prof, et)
        if kp is None:  # batch completes
            covered[idx] = lens
            t_end = t0 + float(prof.tcum[-1]) + rpc_s  # push drafts
            busy[r] += min(t_end, fmax) - t
            heapq.heappush(heap, (t_end, r))
        else:
            rate = lens / np.ceil(lens / (1.0 + accepted) - 1e-9)
            covered[idx] = np.minimum(lens, np.floor(rate * kp + 1e-9)).astype(np.int64)
            t_stop = t0 + prof.time_at(kp, et) + rpc_s
            busy[r] += fmax - t
            stop_t[r] = t_stop
    return PregenResult(covered, busy, stop_t, int(q), int(covered.sum()))
