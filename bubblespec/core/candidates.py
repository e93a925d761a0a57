"""Choosing one draft per request and step among several sources, by expected accepted length.

A request may be drafted by several drafters at once (`core.drafters`, named in
`core.sources.DRAFTER_NAMES`): the pre-generated response with its own sample index
("aligned"), its prompt group's suffix automaton (prompt, own output, live and finished
siblings, other pre-generated responses: "group") and the global automaton of recent
responses across prompts ("global", what vLLM's suffix decoding calls its global tree).
Each drafter states a path probability per drafted token; the expected number of
accepted tokens of a path draft is the sum of those probabilities (token i is accepted only
if tokens 0..i are). The stated probabilities are frequency counts, not the target model's,
and their bias differs per drafter: a large global pool gives confident counts for phrasing
that other prompts share but this response may not. So each drafter's claims are rescaled by
what it delivered so far (:class:`Calibration`): accepted tokens over claimed tokens of its
past winning drafts, a running ratio with a prior. A drafter that over-claims then loses to
one that delivers, instead of being switched off.

The aligned response carries no counts: it states p**(i+1) for token i, p being its observed
per-token continuation rate (a geometric estimate with a prior).

The choice is deterministic (ties by the drafters' fixed order, aligned first) and never
exceeds the budget. Drafts never change what is sampled; the choice only decides how many
tokens one verification forward may accept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bubblespec.core.sources import DRAFTER_NAMES


@dataclass(slots=True)
class Candidate:
    """A path draft from one drafter: ``probs[i]`` is the stated probability that tokens
    0..i are all accepted (non-increasing)."""

    source: str
    token_ids: list[int]
    probs: list[float]


@dataclass
class Calibration:
    """Per-drafter running ratio delivered / claimed, plus the aligned continuation rate.

    ``prior`` pseudo-tokens of a ratio of 1 (claims believed until data says otherwise);
    ``aligned_prior`` pseudo-(accepted, stopped) counts of the aligned continuation rate."""

    prior: float = 16.0
    aligned_prior: tuple[float, float] = (9.0, 1.0)
    claimed: dict[str, float] = field(default_factory=lambda: dict.fromkeys(DRAFTER_NAMES, 0.0))
    delivered: dict[str, float] = field(default_factory=lambda: dict.fromkeys(DRAFTER_NAMES, 0.0))
    al_acc: float = 0.0
    al_stop: float = 0.0

    def ratio(self, source: str) -> float:
        """Accepted tokens per claimed token of drafter `source`'s past winning drafts; 1 for
        the aligned drafter, whose claims are calibrated through its rate instead."""
        if source == "aligned":
            return 1.0
        return (self.delivered[source] + self.prior) / (self.claimed[source] + self.prior)

    def aligned_rate(self) -> float:
        """Per-token probability that the aligned response's next token is accepted."""
        a, s = self.aligned_prior
        return (self.al_acc + a) / (self.al_acc + self.al_stop + a + s)

    def record(self, source: str, claimed: float, drafted: int, accepted: int) -> None:
        """A `source` draft of `drafted` tokens claiming `claimed` accepted got `accepted`."""
        if source == "aligned":
            self.al_acc += accepted
            self.al_stop += accepted < drafted
        else:
            self.claimed[source] += claimed
            self.delivered[source] += accepted


def aligned_candidate(token_ids: list[int], rate: float) -> Candidate:
    """The aligned response's next tokens, with geometric path probabilities."""
    probs, p = [], 1.0
    for _ in token_ids:
        p *= rate
        probs.append(p)
    return Candidate("aligned", token_ids, probs)


def expected_accepted(cand: Candidate, budget: int, calib: Calibration) -> float:
    """Expected accepted tokens of `cand` cut to `budget` tokens, rescaled by its drafter's
    record (`Calibration.ratio`)."""
    return sum(cand.probs[:budget]) * calib.ratio(cand.source)


def choose(cands: Sequence[Candidate], budget: int,
           calib: Calibration) -> tuple[Candidate | None, float]:
    """The candidate with the highest expected accepted length, cut to `budget` tokens, and
    its claim before rescaling (what :meth:`Calibration.record` wants back). Ties go to the
    earlier drafter in `DRAFTER_NAMES`; (None, 0.0) if no candidate drafts anything."""
    if budget <= 0:
        return None, 0.0
    best: Candidate | None = None
    best_val = 0.0
    for cand in sorted(cands, key=lambda c: DRAFTER_NAMES.index(c.source)):
        if not cand.token_ids:
            continue
        val = expected_accepted(cand, budget, calib)
        if val > best_val:
            best, best_val = cand, val
    if best is None:
        return None, 0.0
    cut = Candidate(best.source, best.token_ids[:budget], best.probs[:budget])
    return cut, sum(cut.probs)


@dataclass
class DrafterStats:
    """Per-drafter counters over engine steps: wins (steps whose draft came from the drafter),
    drafted tokens and accepted tokens; ``empty``: steps where no source drafted."""

    wins: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DRAFTER_NAMES, 0))
    drafted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DRAFTER_NAMES, 0))
    accepted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DRAFTER_NAMES, 0))
    empty: int = 0

    def as_dict(self) -> dict[str, int]:
        """Flat counters: ``<drafter>_wins``, ``<drafter>_drafted``, ``<drafter>_accepted``,
        ``empty``."""
        out = {"empty": self.empty}
        for s in DRAFTER_NAMES:
            out[f"{s}_wins"] = self.wins[s]
            out[f"{s}_drafted"] = self.drafted[s]
            out[f"{s}_accepted"] = self.accepted[s]
        return out
