"""Pre-generation of the next step by idle ranks (modelled), as the rank worker does it.

The rank (`bubblespec/rank/pregen.py`) keeps up to `inflight` (= `pregen_inflight`, 64)
claimed tasks decoding at once as one continuous batch and claims more from the
synchronizer's queue whenever lanes finish, so the batch stays full while the queue lasts.
The queue is breadth-first (sample 0 of every prompt, then sample 1, ...; first come, first
served across ranks). Each lane stops within one decode step of the stop signal, which the
synchronizer's step stream delivers at once (PollStop every T decode steps is only the
fallback when the stream is down); its partial response is pushed with one RPC. The stop
comes when the slowest rank finished (F_max) in the BUBBLE window, or when the step closes
(F_max + the trainer's time) in the TRAINING window, where every rank, the slowest
included, pre-generates while the trainer trains. A claim at or after the stop is answered
"stop"; a rank that finds the queue empty and has no lane left waits on the stream.

The task of (prompt p, sample j) of step s+1 is taken to produce the prefix of that request's
actual response (same prompt, sample index and keyed seed: docs/design.md section 3), so its
progress when stopped is the number of covered leading positions in step s+1. Prefill is
charged once per prompt and rank (the prompt's KV is then in the rank's prefix cache), at
the first forward after its first task joined.

A task may carry a *head*: the leading tokens of a draft of the same sample made under older
weights that the current weights still agree with (a refresh, `synchronizer/lookahead.py`).
The lane verifies the head at 1 + `head_accepted` tokens per forward (the old draft is its
draft), then generates the rest at the pre-generation rate; its context and progress follow
the two phases (its forwards are charged the pre-generation's drafted tokens throughout).

With tail-fill (`sim.tail_fill`) a rank starts earlier: from its shard's start it decodes its
allowed lanes one forward per own forward (evenly spaced until it finishes; the finish
times passed in already include the lanes' slowdown), claiming from the same queue, then
goes on as above with those lanes carried over. Its tail tokens are counted apart.

Between two events of a rank (a lane finishing, new lanes joining, the stop) its batch is
constant, so the forwards' time is an arithmetic series (`EngineTime.segment`); ranks
interact only through the shared queue, so an event heap over ranks in time order is exact.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from bubblespec.core.engine_time import EngineTime
from bubblespec.sim.tail_fill import TailFill

IDLE_EPS_S = 1e-9
"""Bubbles shorter than this (relative to the step, in seconds) are float noise: no pre-gen."""


@dataclass
class PregenResult:
    """Outcome of one step's pre-generation."""

    covered: np.ndarray
    """Per next-step request (index = prompt * n + sample): covered leading tokens."""
    busy_in_bubble: np.ndarray
    """Per rank: seconds spent pre-generating before F_max."""
    stop_t: np.ndarray
    """Per rank: time it was free for the next step (F_r for ranks that did nothing)."""
    tasks_claimed: int
    pregen_tokens: int
    window_tokens: int = 0
    """Of `pregen_tokens`, those generated after F_max (TRAINING window)."""
    tail_tokens: int = 0
    """Of `pregen_tokens`, those generated beside the ranks' own requests (tail-fill)."""


@dataclass
class _Rank:
    """One rank's pre-generation state."""

    t: float
    start: float
    idx: list[int] = field(default_factory=list)
    """Tasks (request indices) of the running lanes."""
    left: list[int] = field(default_factory=list)
    """Forwards each lane still needs to finish its response."""
    done: list[int] = field(default_factory=list)
    """Forwards each lane has run."""
    prompts: set[int] = field(default_factory=set)
    """Prompts whose prefill this rank computed."""
    prefill_s: float = 0.0
    """Prefill seconds charged to the next forward."""


def breadth_first(prompts: int, n: int) -> np.ndarray:
    """Queue order of the synchronizer: sample 0 of every prompt, then sample 1, ..."""
    return (np.arange(prompts)[None, :] * n + np.arange(n)[:, None]).ravel()


def simulate_pregen(finish: np.ndarray, next_lengths: np.ndarray, et: EngineTime,
                    inflight: int = 64, rpc_s: float = 0.5e-3, prompt_len: float = 0.0,
                    accepted: float = 0.0, drafted: float = 0.0,
                    order: np.ndarray | None = None, window_s: float = 0.0,
                    head: np.ndarray | None = None, head_accepted: float = 0.0,
                    tail: TailFill | None = None) -> PregenResult:
    """Pre-generation of step s+1 (lengths `next_lengths`, shape (prompts, n)) by the ranks of
    a step that finished at `finish` (see the module docstring). Lanes decode at 1 +
    `accepted` tokens per forward verifying `drafted` draft tokens (default plain
    decoding); `order` replaces the breadth-first queue (request indices, prompt * n +
    sample); `window_s` > 0 is the TRAINING window: pre-generation goes on until
    F_max + window_s on every rank. `head` (per task, optional): tokens of an older draft
    the lane verifies first at 1 + `head_accepted` per forward (a refresh). `tail`: the
    lanes each rank decodes beside its own requests from time 0 (tail-fill)."""
    if inflight < 1 or window_s < 0:
        raise ValueError("inflight must be >= 1 and window_s >= 0")
    prompts, n = next_lengths.shape
    ranks = len(finish)
    fmax = float(finish.max()) if ranks else 0.0
    end = fmax + window_s
    order = breadth_first(prompts, n) if order is None else order
    flat = next_lengths.ravel()
    rate = 1.0 + accepted
    prog = _Progress(flat, rate, 1.0 + head_accepted, head)
    need = prog.need
    covered = np.zeros(prompts * n, dtype=np.int64)
    busy = np.zeros(ranks)
    stop_t = finish.astype(float).copy()
    eps = IDLE_EPS_S * max(1.0, fmax)  # float noise of equal work is not a bubble
    lanes = np.zeros(ranks, np.int64) if tail is None else tail.lanes
    state = {r: _Rank(0.0 if lanes[r] else float(finish[r]), float(finish[r]))
             for r in range(ranks) if lanes[r] or (
                 finish[r] < end - eps and (window_s > 0 or finish[r] < fmax - eps))}
    heap = [(s.t, r) for r, s in state.items()]
    heapq.heapify(heap)
    q = 0
    window_tok = tail_tok = 0.0
    while heap:
        _, r = heapq.heappop(heap)
        s = state[r]
        beside = s.t < finish[r] - eps  # tail-fill: its own requests still decode
        if s.t < end and q < len(order):  # claim the free lanes
            if not s.idx and not beside:
                s.t += rpc_s  # an idle rank waits for the claim; a busy one keeps decoding
            take = order[q:q + (lanes[r] if beside else inflight) - len(s.idx)]
            q += len(take)
            for i in take:
                s.idx.append(int(i))
                s.left.append(int(need[i]))
                s.done.append(0)
                if i // n not in s.prompts:
                    s.prompts.add(int(i // n))
                    s.prefill_s += prompt_len * et.t_flop
        if beside:  # a lane's prefill is outside the budget (not charged)
            s.prefill_s = 0.0
        if not s.idx:  # nothing to decode: free (waits on the stream)
            stop_t[r] = max(s.t, float(finish[r]))
            busy[r] = max(0.0, min(s.t, fmax) - s.start)
            continue
        left, done = np.asarray(s.left), np.asarray(s.done)
        in_head = done < prog.head_fwd[s.idx]  # a head's end changes the lane's growth
        m = int(min(left.min(), (prog.head_fwd[s.idx] - done)[in_head].min(initial=left.min())))
        ks = np.arange(1, m + 1, dtype=float)
        n_lanes = float(len(left))
        grow = float(np.where(in_head, prog.head_rate, rate).sum())
        ctx0 = float((prompt_len + prog.tokens(s.idx, done)).sum())
        if beside:  # one lane forward per own forward, until the rank finishes
            dt = float(finish[r]) / max(1, int(tail.forwards[r]))
            rem = max(1, int(np.ceil((float(finish[r]) - s.t) / dt - 1e-9)))
            m = min(m, rem)
            ks = ks[:m]
            ts = np.minimum(s.t + dt * ks, float(finish[r]))
            if m == rem:
                ts[-1] = float(finish[r])
        else:
            ts = s.t + s.prefill_s + et.segment(ks, n_lanes * (1.0 + drafted), ctx0, grow)
        if ts[-1] >= end:  # stopped: the first forward that ends at or after the stop
            k = int(np.searchsorted(ts, end, side="left")) + 1
            t_stop = float(ts[k - 1])
            reached = prog.tokens(s.idx, done + k)
            if beside:
                tail_tok += float((reached - prog.tokens(s.idx, done)).sum())
            for i, t in zip(s.idx, reached):
                covered[i] = int(np.floor(t + 1e-9))
            window_tok += _tokens_after(fmax, s.t, ts[:k], grow) if window_s else 0.0
            stop_t[r] = t_stop + rpc_s  # push the partial drafts
            busy[r] = max(0.0, min(t_stop, fmax) - s.start)
            continue
        if window_s:
            window_tok += _tokens_after(fmax, s.t, ts, grow)
        if beside:
            tail_tok += float((prog.tokens(s.idx, done + m) - prog.tokens(s.idx, done)).sum())
        s.t, s.prefill_s = float(ts[-1]), 0.0
        keep = []
        for j, i in enumerate(s.idx):
            if left[j] == m:
                covered[i] = int(flat[i])
            else:
                keep.append(j)
        s.idx = [s.idx[j] for j in keep]
        s.left = [int(left[j] - m) for j in keep]
        s.done = [int(done[j] + m) for j in keep]
        heapq.heappush(heap, (s.t, r))
    tokens = int(covered.sum())
    return PregenResult(covered, busy, stop_t, int(q), tokens, round(window_tok),
                        round(tail_tok))


class _Progress:
    """Tokens a lane has after d forwards: its head (if any) at `head_rate` per forward,
    then the rest at `rate`, never more than the response."""

    def __init__(self, flat: np.ndarray, rate: float, head_rate: float,
                 head: np.ndarray | None) -> None:
        self.flat, self.rate = flat.astype(float), rate
        self.head = (np.zeros(len(flat)) if head is None
                     else np.minimum(np.asarray(head, dtype=float), self.flat))
        self.head_rate = head_rate
        self.head_fwd = np.ceil(self.head / head_rate - 1e-9).astype(np.int64)
        self.need = self.head_fwd + np.ceil((self.flat - self.head) / rate - 1e-9).astype(
            np.int64)

    def tokens(self, idx: list[int], done: np.ndarray) -> np.ndarray:
        h, f = self.head[idx], self.head_fwd[idx]
        d = np.asarray(done, dtype=float)
        t = np.where(d <= f, np.minimum(h, d * self.head_rate), h + (d - f) * self.rate)
        return np.minimum(t, self.flat[idx])


def _tokens_after(fmax: float, t0: float, ends: np.ndarray, per_forward: float) -> float:
    """Tokens of the forwards ending after `fmax` (the TRAINING window's share)."""
    if len(ends) == 0 or ends[-1] <= fmax:
        return 0.0
    return per_forward * float((ends > max(fmax, t0)).sum())
