"""Per-rank decode timelines of one rollout step, vectorised over all ranks (modelled).

Each rank runs its requests with continuous batching: at most `max_num_seqs` run at once,
admitted first come first served (the rank's prompts in request order, samples 0..n-1), and
every running request advances by one forward per engine step. A request emits L tokens in two
phases: the first c tokens (covered by a pre-generated draft) at 1 + a_cov tokens per forward,
the rest at 1 + a_unc; its forward count per phase is ceil(tokens / rate) (the last forward of
a phase may emit fewer). While running it adds 1 + drafted tokens to every forward it is in,
and its context (prompt + generated so far, linear within a phase) to the KV read.

Because a request's forward count does not depend on the others, the whole step reduces to
event points (admissions, phase switches, completions) per rank; between two points the batch
is constant and the forwards' time is an arithmetic series (engine_time.EngineTime.segment).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from bubblespec.core.engine_time import EngineTime


@dataclass
class Requests:
    """One step's requests, flattened (index = prompt * n + sample)."""

    rank: np.ndarray
    """Rank of each request."""
    length: np.ndarray
    """Response length in tokens (>= 1)."""
    covered: np.ndarray
    """Leading tokens covered by a pre-generated draft (0 <= covered <= length)."""
    acc_cov: np.ndarray
    """Accepted draft tokens per forward in the covered phase."""
    acc_unc: np.ndarray
    """Accepted draft tokens per forward in the uncovered phase."""
    drafted_cov: np.ndarray
    """Drafted (verified) tokens per forward in the covered phase."""
    drafted_unc: np.ndarray
    """Drafted (verified) tokens per forward in the uncovered phase."""
    prefill: np.ndarray
    """Prefill seconds charged when the request is admitted (first sample of a prompt)."""
    prompt_len: float = 0.0
    """Prompt tokens (initial context of every request)."""


@dataclass
class Timeline:
    """Event points of all ranks, sorted by (rank, forward index); state after each point."""

    ranks: int
    kmax: int
    rank: np.ndarray
    k: np.ndarray
    t: np.ndarray
    """Time (s, from the rank's start) at each point, before the point's forwards."""
    running: np.ndarray
    tokens: np.ndarray
    ctx: np.ndarray
    growth: np.ndarray
    impulse: np.ndarray
    finish_t: np.ndarray
    """Per rank: time its last request completed (0 for an empty rank)."""
    finish_k: np.ndarray
    """Per rank: forwards it ran."""
    emitted: np.ndarray
    """Per rank: tokens emitted by the integrated timeline (conservation check)."""
    forwards: np.ndarray
    """Per request: forwards it took."""


def forwards_per_phase(req: Requests) -> tuple[np.ndarray, np.ndarray]:
    """(covered-phase forwards, uncovered-phase forwards) per request."""
    c = req.covered.astype(float)
    u = req.length.astype(float) - c
    f1 = np.where(c > 0, np.ceil(c / (1.0 + req.acc_cov) - 1e-9), 0).astype(np.int64)
    f2 = np.where(u > 0, np.ceil(u / (1.0 + req.acc_unc) - 1e-9), 0).astype(np.int64)
    return f1, f2


def admission(rank: np.ndarray, forwards: np.ndarray, ranks: int,
              max_num_seqs: int) -> np.ndarray:
    """Start forward of each request under FCFS continuous batching with `max_num_seqs`
    slots per rank (requests are admitted in index order within their rank)."""
    start = np.zeros(len(rank), dtype=np.int64)
    counts = np.bincount(rank, minlength=ranks)
    for r in np.nonzero(counts > max_num_seqs)[0]:
        idx = np.nonzero(rank == r)[0]
        heap = [int(f) for f in forwards[idx[:max_num_seqs]]]
        heapq.heapify(heap)
        for i in idx[max_num_seqs:]:
            s = heapq.heappop(heap)
            start[i] = s
            heapq.heappush(heap, s + int(forwards[i]))
    return start


def _seg_cumsum(x: np.ndarray, seg_first: np.ndarray, seg_of: np.ndarray,
                exclusive: bool = False) -> np.ndarray:
    """Cumulative sum restarting at each segment (segments are contiguous runs)."""
    cs = np.cumsum(x)
    base = cs[seg_first] - x[seg_first]
    out = cs - base[seg_of]
    return out - x if exclusive else out


def build_timeline(req: Requests, ranks: int, max_num_seqs: int, et: EngineTime,
                   start: np.ndarray | None = None) -> Timeline:
    """Timelines of every rank for `req` (see the module docstring)."""
    f1, f2 = forwards_per_phase(req)
    f = f1 + f2
    if start is None:
        start = admission(req.rank, f, ranks, max_num_seqs)
    c = req.covered.astype(float)
    L = req.length.astype(float)
    g1 = np.divide(c, f1, out=np.zeros_like(c), where=f1 > 0)
    g2 = np.divide(L - c, f2, out=np.zeros_like(c), where=f2 > 0)
    w1, w2 = 1.0 + req.drafted_cov, 1.0 + req.drafted_unc
    first_cov, last_unc = f1 > 0, f2 > 0
    wf, gf = np.where(first_cov, w1, w2), np.where(first_cov, g1, g2)
    wl, gl = np.where(last_unc, w2, w1), np.where(last_unc, g2, g1)
    sw = first_cov & last_unc
    n = len(L)
    p0 = float(req.prompt_len)
    z = np.zeros(n)
    # event arrays: start, switch (only where both phases exist), end
    ev_rank = np.concatenate([req.rank, req.rank[sw], req.rank])
    ev_k = np.concatenate([start, (start + f1)[sw], start + f])
    d_run = np.concatenate([np.ones(n), np.zeros(sw.sum()), -np.ones(n)])
    d_tok = np.concatenate([wf, (w2 - w1)[sw], -wl])
    d_gro = np.concatenate([gf, (g2 - g1)[sw], -gl])
    d_ctx = np.concatenate([np.full(n, p0), z[sw], -(p0 + L)])
    d_imp = np.concatenate([req.prefill.astype(float), z[sw], z])
    kmax = int(ev_k.max()) + 2 if n else 2
    keys = ev_rank.astype(np.int64) * kmax + ev_k
    ukeys, inv = np.unique(keys, return_inverse=True)
    m = len(ukeys)

    def s(x: np.ndarray) -> np.ndarray:
        return np.bincount(inv, weights=x, minlength=m)

    rank, k = ukeys // kmax, ukeys % kmax
    first = np.ones(m, dtype=bool)
    first[1:] = rank[1:] != rank[:-1]
    seg_first = np.nonzero(first)[0]
    seg_of = np.cumsum(first) - 1
    running = _seg_cumsum(s(d_run), seg_first, seg_of)
    tokens = _seg_cumsum(s(d_tok), seg_first, seg_of)
    growth = _seg_cumsum(s(d_gro), seg_first, seg_of)
    gap = np.zeros(m, dtype=np.int64)
    same = ~first[1:]
    gap[:-1] = np.where(same, k[1:] - k[:-1], 0)
    carry = np.zeros(m)
    carry[1:] = np.where(same, growth[:-1] * gap[:-1], 0.0)
    ctx = _seg_cumsum(s(d_ctx) + carry, seg_first, seg_of)
    imp = s(d_imp)
    live = running > 0.5
    seg_t = np.where(live, et.segment(gap, tokens, ctx, growth) + imp, 0.0)
    t = _seg_cumsum(seg_t, seg_first, seg_of, exclusive=True)
    last = np.append(seg_first[1:] - 1, m - 1) if m else np.zeros(0, dtype=np.int64)
    finish_t = np.zeros(ranks)
    finish_k = np.zeros(ranks, dtype=np.int64)
    emitted = np.zeros(ranks)
    if m:
        finish_t[rank[last]] = t[last]
        finish_k[rank[last]] = k[last]
        emitted = np.bincount(rank, weights=growth * gap, minlength=ranks)
    return Timeline(ranks, kmax, rank, k, t, running, tokens, ctx, growth, imp,
                    finish_t, finish_k, emitted, f)


def brute_force_finish(req: Requests, ranks: int, max_num_seqs: int,
                       et: EngineTime) -> np.ndarray:
    """Reference: per-rank finish times by stepping every forward (slow; for tests)."""
    f1, f2 = forwards_per_phase(req)
    f = f1 + f2
    start = admission(req.rank, f, ranks, max_num_seqs)
    c, L = req.covered.astype(float), req.length.astype(float)
    out = np.zeros(ranks)
    for r in range(ranks):
        idx = np.nonzero(req.rank == r)[0]
        if not len(idx):
            continue
        t = 0.0
        for kk in range(int((start[idx] + f[idx]).max())):
            tok, ctx = 0.0, 0.0
            for i in idx:
                j = kk - start[i]
                if not 0 <= j < f[i]:
                    continue
                if j == 0:
                    t += float(req.prefill[i])
                if j < f1[i]:
                    tok += 1 + req.drafted_cov[i]
                    ctx += req.prompt_len + c[i] / f1[i] * j
                else:
                    tok += 1 + req.drafted_unc[i]
                    ctx += req.prompt_len + c[i] + (L[i] - c[i]) / f2[i] * (j - f1[i])
            t += float(et.per_forward(tok)) + et.t_kv * ctx
        out[r] = t
    return out
