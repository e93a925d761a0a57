"""How fast a response decodes after it left its pre-generated draft (its tail), measured
per response from a paced run's records, for the simulator's replay and projection (the
simulator applies the rates per tail-length class with `bubblespec.sim.tails`).

Why this exists: a step waits for its slowest response, and the tails that set it decode
far slower than the average tail: long tails slower than short ones (their siblings, whose
text drafts a tail, ended long before), and within a class of tail length the per-response
rate spreads widely. One pooled after-flip rate overstated the replay's speed-up; the
measured figures are in docs/design.md, section 15.

Per flipped response of the steps after step 0: tail tokens L - f over tail forwards
D - (f - accepted pre-generated tokens, at most f), from its recorded decode steps D and
accepted pre-generated tokens (`request_decode_steps`, `request_accepted_pregen`). The
forwards before the flip are the flip position less the draft tokens accepted there: a
response accepts its pre-generated draft up to the flip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from bubblespec.sim.tails import Rates, class_rate

if TYPE_CHECKING:
    from bubblespec.bench.paced_record import PacedRun

TAIL_EDGES = (32, 64, 128, 256)
"""Upper edges (tokens after the flip) of the tail-length classes of `tail_rates`."""
MIN_CLASS = 8
"""Fewest flipped responses a tail-length class needs; a sparser one joins the next longer
class (the longest, the previous one)."""

def _tails(run: PacedRun, name: str, caps: np.ndarray | None
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(mask of the flipped responses after step 0, their tail tokens, their tail forwards);
    None without per-request records or flips."""
    m = run.modes[name]
    if caps is None or not all("request_decode_steps" in s and "request_accepted_pregen" in s
                               for s in m.steps):
        return None
    L = run.lengths(name)[1:]
    D = np.stack([np.asarray(s["request_decode_steps"], dtype=np.int64) for s in m.steps[1:]])
    P = np.stack([np.asarray(s["request_accepted_pregen"], dtype=np.int64)
                  for s in m.steps[1:]])
    f = caps[1:]
    hit = f < L
    if not hit.any():
        return None
    tail = (L - f)[hit]
    fw = np.maximum(1, D[hit] - (f[hit] - np.minimum(P[hit], f[hit])))
    return hit, tail, fw


def tail_rates(run: PacedRun, name: str, caps: np.ndarray | None) -> Rates:
    """Accepted draft tokens per forward after a flip, per class of tail length (a class's
    tail tokens over its tail forwards, less the one token a forward emits); () without
    per-request records."""
    t = _tails(run, name, caps)
    if t is None:
        return ()
    _, tail, fw = t
    cls = np.searchsorted(np.asarray(TAIL_EDGES), tail, side="left")
    edges = [*map(float, TAIL_EDGES), float("inf")]
    sums: list[list[float]] = []  # [upper edge, tail tokens, tail forwards, responses]
    acc = [0.0, 0.0, 0.0]
    for k, edge in enumerate(edges):  # a sparse class joins the next longer one
        sel = cls == k
        acc = [acc[0] + float(tail[sel].sum()), acc[1] + float(fw[sel].sum()),
               acc[2] + float(sel.sum())]
        if acc[2] >= MIN_CLASS:
            sums.append([edge, *acc])
            acc = [0.0, 0.0, 0.0]
    if acc[2]:  # sparse longest tails: with the last class, or alone if none
        if sums:
            last = sums[-1]
            sums[-1] = [last[0], last[1] + acc[0], last[2] + acc[1], last[3] + acc[2]]
        else:
            sums.append([edges[-1], *acc])
    sums[-1][0] = float("inf")
    return tuple((e, max(0.0, t / w - 1.0)) for e, t, w, _ in sums)


def tail_multipliers(run: PacedRun, name: str, caps: np.ndarray | None, rates: Rates
                     ) -> np.ndarray | None:
    """(steps, prompts, n): each flipped response's measured tokens per tail forward over
    its class's (1 where none, and in step 0); None without per-request records. The
    replay decodes each tail at its own measured rate with these."""
    t = _tails(run, name, caps)
    if t is None or not rates:
        return None
    hit, tail, fw = t
    out = np.ones((run.steps, run.prompts, run.n))
    out[1:][hit] = (tail / fw) / (1.0 + class_rate(rates, tail))
    return out


def rate_spread(run: PacedRun, name: str, caps: np.ndarray | None) -> tuple[float, ...]:
    """A mode's measured per-request multipliers of tokens per forward over the steps after
    step 0: for a pre-generating mode, each flipped tail's over its class's (the tails are
    where its responses differ); for the others, each response's L / D over the pooled
    sum(L) / sum(D) of all of them. () without per-request records."""
    m = run.modes[name]
    if m.pregen:
        rates, t = tail_rates(run, name, caps), _tails(run, name, caps)
        if t is None or not rates:
            return ()
        _, tail, fw = t
        return tuple(float(x) for x in (tail / fw) / (1.0 + class_rate(rates, tail)))
    if len(m.steps) < 2 or not all("request_decode_steps" in s for s in m.steps):
        return ()
    L = run.lengths(name)[1:].ravel().astype(float)
    D = np.concatenate([np.asarray(s["request_decode_steps"], dtype=float).ravel()
                        for s in m.steps[1:]])
    ok = D > 0
    if not ok.any():
        return ()
    return tuple(float(x) for x in (L[ok] / D[ok]) / (L[ok].sum() / D[ok].sum()))
