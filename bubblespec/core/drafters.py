"""The drafter seam: each drafter answers one candidate draft for a request at an engine
step, and the batch step (`core.batch.choose_draft`) loops over the registered ones.

A drafter reads the request's state (`core.batch.Request`): its aligned pre-generated
continuation, its group matcher, its global-pool matcher. Its candidate states a path
probability per token; `core.candidates.choose` scores every candidate by its calibrated
expected accepted length and keeps the best, ties going to the earlier drafter in
`DRAFTERS`. The native backend registers the same drafters, in the same order, in
native/src/batch.hpp (`DRAFTERS`).

Adding a drafter: a class here with its entry in `DRAFTERS` and its name in
`core.sources.DRAFTER_NAMES` (and the sources that feed it in `core.sources.SOURCES`); in
C++ a function and its entry in batch.hpp's `DRAFTERS`, and its value in request.hpp's
`Src` (with `SRC_NAMES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from bubblespec.core.candidates import Calibration, Candidate, aligned_candidate
from bubblespec.core.draft import DraftParams
from bubblespec.core.sources import DRAFTER_NAMES


class Drafter(Protocol):
    """One kind of candidate draft (the seam)."""

    name: str

    def candidate(self, st: Any, sampled: list[int], aligned: list[int], budget: int,
                  params: DraftParams, calib: Calibration) -> Candidate | None:
        """The candidate for request `st`, which just emitted `sampled`, at this step
        (`aligned`: its aligned continuation, already cut to `budget`), or None. Called
        for every request that emitted tokens, also with a budget of 0: a drafter that keeps
        per-request state (a matcher) updates it then."""
        ...


@dataclass(frozen=True)
class AlignedDrafter:
    """The pre-generated response with the request's own sample index, continued while the
    output equals it (`core.batch.follow_aligned`), with geometric path probabilities."""

    name: str = "aligned"

    def candidate(self, st: Any, sampled: list[int], aligned: list[int], budget: int,
                  params: DraftParams, calib: Calibration) -> Candidate | None:
        return aligned_candidate(aligned, calib.aligned_rate()) if aligned else None


@dataclass(frozen=True)
class MatcherDrafter:
    """A suffix-automaton matcher of the request (attribute `attr`), fed the emitted tokens
    at every step and asked for a draft when the budget allows one."""

    name: str
    attr: str

    def candidate(self, st: Any, sampled: list[int], aligned: list[int], budget: int,
                  params: DraftParams, calib: Calibration) -> Candidate | None:
        m = getattr(st, self.attr)
        if m is None:
            return None
        if budget <= 0:
            m.extend(sampled)
            return None
        d = m.speculate(sampled, params)
        return Candidate(self.name, d.token_ids, d.probs)


DRAFTERS: tuple[Drafter, ...] = (
    AlignedDrafter(),
    MatcherDrafter("group", "matcher"),
    MatcherDrafter("global", "gmatcher"),
)
"""The registered drafters, in tie-break order."""

if tuple(d.name for d in DRAFTERS) != DRAFTER_NAMES:
    raise ImportError("core.drafters.DRAFTERS and core.sources.DRAFTER_NAMES differ")
