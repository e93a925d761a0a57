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

from bubblespec.bench.departures import caught_mask, tail_forwards
from bubblespec.calibration.flips import Flips, flip_caps, ran_out
from bubblespec.sim.tails import Rates, class_rate

if TYPE_CHECKING:
    from bubblespec.bench.paced_record import PacedRun

TAIL_EDGES = (32, 64, 128, 256)
"""Upper edges (tokens) of the length classes of `tail_rates` (after the flip) and
`head_rates` (up to it)."""
MIN_CLASS = 8
"""Fewest flipped responses a tail-length class needs; a sparser one joins the next longer
class (the longest, the previous one)."""

def _records(run: PacedRun, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(lengths, decode steps, accepted pre-generated tokens) per response of the steps after
    step 0; None without per-request records."""
    m = run.modes[name]
    if not all("request_decode_steps" in s and "request_accepted_pregen" in s
               for s in m.steps):
        return None
    return (run.lengths(name)[1:],
            np.stack([np.asarray(s["request_decode_steps"], dtype=np.int64)
                      for s in m.steps[1:]]),
            np.stack([np.asarray(s["request_accepted_pregen"], dtype=np.int64)
                      for s in m.steps[1:]]))


def _tails(run: PacedRun, name: str, caps: np.ndarray | None
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(mask of the flipped responses after step 0, their tail tokens, their tail forwards,
    which of them a margin branch or a re-coupling caught: `caught`); None without
    per-request records or flips."""
    rec = _records(run, name) if caps is not None else None
    if rec is None:
        return None
    L, D, P = rec
    f = caps[1:]
    hit = f < L
    if not hit.any():
        return None
    tail = (L - f)[hit]
    fw = tail_forwards(L[hit], D[hit], P[hit], f[hit])
    return hit, tail, fw, caught_mask(P, f, ran_out(run, name)[1:])[hit]


def caught(run: PacedRun, name: str, caps: np.ndarray | None) -> np.ndarray | None:
    """(steps, prompts, n): True where a response left its draft at a flip and still
    accepted pre-generated tokens after it (more than its flip position: a margin branch,
    or the draft again after a re-coupling, went on drafting it); None without records.
    Such a tail decodes several times faster than one nothing caught (the measured rates
    are in docs/design.md, section 15), so the replay and the projection tell them apart."""
    t = _tails(run, name, caps)
    if t is None:
        return None
    out = np.zeros((run.steps, run.prompts, run.n), dtype=bool)
    out[1:][t[0]] = t[3]
    return out


def caught_share(run: PacedRun, flips: Flips | None = None) -> float:
    """Share of the flips (not a draft's end) that were caught (`caught`), over the first
    pre-generating mode with records, as `flips.flip_stats` counts its flips."""
    for name in run.modes:
        caps = flip_caps(run, name, flips)
        t = _tails(run, name, caps)
        if t is None:
            continue
        hit, _, _, c = t
        real = ~ran_out(run, name)[1:][hit]
        return float(c[real].mean()) if real.any() else 0.0
    return 0.0


def _class_rates(lengths: np.ndarray, forwards: np.ndarray) -> Rates:
    """Accepted per forward per length class (a class's tokens over its forwards, less the
    one token a forward emits), a class with fewer than `MIN_CLASS` responses joined to the
    next longer one (the longest, to the previous one)."""
    cls = np.searchsorted(np.asarray(TAIL_EDGES), lengths, side="left")
    edges = [*map(float, TAIL_EDGES), float("inf")]
    sums: list[list[float]] = []  # [upper edge, tokens, forwards, responses]
    acc = [0.0, 0.0, 0.0]
    for k, edge in enumerate(edges):  # a sparse class joins the next longer one
        sel = cls == k
        acc = [acc[0] + float(lengths[sel].sum()), acc[1] + float(forwards[sel].sum()),
               acc[2] + float(sel.sum())]
        if acc[2] >= MIN_CLASS:
            sums.append([edge, *acc])
            acc = [0.0, 0.0, 0.0]
    if acc[2]:  # sparse longest: with the last class, or alone if none
        if sums:
            last = sums[-1]
            sums[-1] = [last[0], last[1] + acc[0], last[2] + acc[1], last[3] + acc[2]]
        else:
            sums.append([edges[-1], *acc])
    sums[-1][0] = float("inf")
    return tuple((e, max(0.0, t / w - 1.0)) for e, t, w, _ in sums)


def tail_rates(run: PacedRun, name: str, caps: np.ndarray | None,
               kind: bool | None = None) -> Rates:
    """Accepted draft tokens per forward after a flip, per class of tail length: of every
    tail (`kind` None), of the caught ones (True, `caught`) or of the others (False); ()
    without per-request records or such tails."""
    t = _tails(run, name, caps)
    return () if t is None else _kind_rates(t, kind)


def _kind_rates(t: tuple[np.ndarray, ...], kind: bool | None) -> Rates:
    _, tail, fw, c = t
    sel = np.ones(tail.shape, bool) if kind is None else c == kind
    return _class_rates(tail[sel], fw[sel]) if sel.any() else ()


def split_rates(run: PacedRun, name: str, caps: np.ndarray | None) -> tuple[Rates, Rates]:
    """(rates of the tails nothing caught, rates of the caught ones) when some were caught,
    else (rates of every tail, ())."""
    t = _tails(run, name, caps)
    if t is None:
        return (), ()
    if not t[3].any():
        return _kind_rates(t, None), ()
    return _kind_rates(t, False), _kind_rates(t, True)


def _own_class(tail: np.ndarray, c: np.ndarray, rates: Rates, caught_rates: Rates
               ) -> np.ndarray:
    """Tokens per forward of each tail's class (caught tails: `caught_rates` when given)."""
    own = 1.0 + class_rate(rates, tail)
    if caught_rates:
        own = np.where(c, 1.0 + class_rate(caught_rates, tail), own)
    return own


def _heads(run: PacedRun, name: str, caps: np.ndarray | None
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(mask of the responses after step 0 with a measured covered head, their head tokens,
    their head forwards) of a pre-generating mode: the tokens up to the flip (the whole
    response without one) and the forwards spent on them, the flip position less the
    pre-generated tokens accepted there, as in `_tails`. None without per-request records."""
    rec = _records(run, name) if run.modes[name].pregen else None
    if rec is None:
        return None
    L, D, P = rec
    f = np.minimum(L, caps[1:]) if caps is not None else L
    fw = np.where(f < L, f - np.minimum(P, f), D)
    ok = (f > 0) & (fw > 0) & (P > 0)  # a head its draft covered, decoded in forwards
    if not ok.any():
        return None
    return ok, f[ok], fw[ok]


def head_rates(run: PacedRun, name: str, caps: np.ndarray | None) -> Rates:
    """Accepted draft tokens per forward while a response's pre-generated draft covers it,
    per class of head length (tokens up to its flip, or the whole response); () without
    per-request records."""
    h = _heads(run, name, caps)
    return () if h is None else _class_rates(h[1], h[2])


def tail_multipliers(run: PacedRun, name: str, caps: np.ndarray | None, rates: Rates,
                     caught_rates: Rates = ()) -> np.ndarray | None:
    """(steps, prompts, n): each flipped response's measured tokens per tail forward over
    its class's (of the caught tails with `caught_rates`; 1 where none, and in step 0); None
    without per-request records. The replay decodes each tail at its own measured rate
    with these."""
    t = _tails(run, name, caps)
    if t is None or not rates:
        return None
    hit, tail, fw, c = t
    out = np.ones((run.steps, run.prompts, run.n))
    out[1:][hit] = (tail / fw) / _own_class(tail, c, rates, caught_rates)
    return out


def head_multipliers(run: PacedRun, name: str, caps: np.ndarray | None, rates: Rates
                     ) -> np.ndarray | None:
    """(steps, prompts, n): each covered head's measured tokens per forward over its class's
    (`head_rates`; 1 where none, and in step 0); None without per-request records. The
    replay decodes each head at its own measured rate with these."""
    h = _heads(run, name, caps)
    if h is None or not rates:
        return None
    ok, head, fw = h
    out = np.ones((run.steps, run.prompts, run.n))
    own = head / fw - 1.0
    cls = class_rate(rates, head)
    out[1:][ok] = np.where(cls > 0, own / np.where(cls > 0, cls, 1.0), 1.0)
    return out


def whole_multipliers(run: PacedRun, name: str) -> np.ndarray | None:
    """(steps, prompts, n) for a mode that does not pre-generate: each response's measured
    tokens per forward L / D over the mode's pooled sum(L) / sum(D) of the steps after step
    0 (1 where unmeasured); None without per-request records or speculation."""
    m = run.modes[name]
    if (m.pregen or not any(s["draft_tokens"] for s in m.steps)
            or not all("request_decode_steps" in s for s in m.steps)):
        return None
    L = run.lengths(name).astype(float)
    D = np.stack([np.asarray(s["request_decode_steps"], dtype=float) for s in m.steps])
    if not D[1:].sum():
        return None
    out = np.ones(L.shape)
    ok = D > 0
    out[ok] = (L[ok] / D[ok]) / (L[1:].sum() / D[1:].sum())
    return out


def rate_spread(run: PacedRun, name: str, caps: np.ndarray | None) -> tuple[float, ...]:
    """A mode's measured per-request multipliers of tokens per forward over the steps after
    step 0: for a pre-generating mode, each flipped tail's over its class's (caught or not,
    `split_rates`; the tails are
    where its responses differ); for the others, each response's L / D over the pooled
    sum(L) / sum(D) of all of them. () without per-request records."""
    m = run.modes[name]
    if m.pregen:
        (rates, caught_rates), t = split_rates(run, name, caps), _tails(run, name, caps)
        if t is None or not rates:
            return ()
        _, tail, fw, c = t
        return tuple(float(x) for x in (tail / fw) / _own_class(tail, c, rates, caught_rates))
    if len(m.steps) < 2 or not all("request_decode_steps" in s for s in m.steps):
        return ()
    L = run.lengths(name)[1:].ravel().astype(float)
    D = np.concatenate([np.asarray(s["request_decode_steps"], dtype=float).ravel()
                        for s in m.steps[1:]])
    ok = D > 0
    if not ok.any():
        return ()
    return tuple(float(x) for x in (L[ok] / D[ok]) / (L[ok].sum() / D[ok].sum()))
