"""Margin branches: offered with a rank's complete keyed drafts, decoded by whichever rank
claims them (docs/design.md section 5, "Where updates flip, and margin branching").

A keyed pre-generated draft is the old weights' response under the next step's noise; the
new weights leave it where the update moves another token's perturbed score past the
chosen one's, almost always at the draft's smallest keyed margins and to the runner-up
there (`bubblespec bench flips` records where; docs/results.md, "Where an update flips a
keyed response"). So for each complete draft this rank made,
longest first (the ones most likely to set the next step's critical path), it decodes up to
`budget` branches: the draft's prefix up to its lowest-margin position p, the runner-up
token there, and the rest with the same keyed noise (`GenRequest.keyed_start = p + 1`). A
branch is pushed beside its draft (`PregenDraft.branch_at = p`) and the proposer follows it
when the output takes that token there. Branches are drafts only: verification decides
every token, so sampling is the same with or without them.

Margins come from the engine's top log-probabilities of each draft token
(`core.keyed_noise.keyed_margin`: tokens outside the top `TOP_LOGPROBS` are not seen, which
only ever raises a margin). Position keys only: with context keys the noise after a flip is not the
draft's at the same position anyway.

The rank that made a draft does not decode its branches itself: it offers them with the
draft (`PregenDraft.branch_offers`), the synchronizer queues them behind the step's plain
tasks (`synchronizer/pregen.py`), and any rank with free lanes claims them, so the ranks
that had no plain task left spend their bubble on branches of the longest drafts.

Streamed offers (`--pregen-branch-margin m`): a draft offered only when complete offers
its branch too late where it matters most. The draft that sets the next step's critical
path is a long one, completing near the bubble's end, so a branch at position p of it has
no time left to decode (docs/results.md, "Margin branching, measured"). With a margin threshold the rank
offers a position as soon as the draft decodes it with a keyed margin below m, pushing the
partial draft so far with the offer (`MarginWatch`), and the branch starts p tokens into
the draft instead of at its end. The budget per draft stays `budget`: the complete draft
offers what streaming left of it, at its smallest margins.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from bubblespec.core.keyed_noise import keyed_margin, position_key
from bubblespec.engine.types import GenRequest, GenResult
from bubblespec.protocol.domain import PregenDraft, PregenTask

TOP_LOGPROBS = 20
"""Log-probabilities per token a branching rank asks for while pre-generating. The keyed
runner-up is the best *perturbed* score among the other tokens, often not among the few most
likely, so a short top list misses it at many positions, and the top 20 (vLLM's default
maximum) at few (`pytest -s tests/rank/test_pregen.py -k margins` prints both shares; the
figures are in docs/results.md, "Branching on by default"). Where it is missing the margin
is overstated and the branch point and its token are wrong."""


def branchable(t: PregenTask) -> bool:
    """Tasks whose drafts can be branched: keyed by position, sampled (temperature > 0)
    (`PregenTask.can_branch`; the synchronizer counts those in progress by the same rule)."""
    return t.can_branch


class MarginWatch:
    """The branch offers of one keyed draft, read position by position as it decodes.

    `feed` scans the positions not yet seen; with a `threshold` > 0 each one whose keyed
    margin falls below it is offered at once (streamed: its branch can start while the draft
    is still decoding, which matters for the long drafts that set the critical path and
    complete last), up to `budget` per draft. `final`, once the draft is complete, offers
    the rest of the budget at the smallest margins not offered yet. With threshold 0 this is
    the complete-draft rule alone (`branch_points`)."""

    def __init__(self, seed: int, temperature: float, budget: int, threshold: float = 0.0
                 ) -> None:
        self.seed = seed
        self.temperature = temperature
        self.budget = max(0, int(budget))
        self.threshold = float(threshold)
        self.seen = 0
        self.offered: list[tuple[int, int]] = []
        self._scored: list[tuple[float, int, int]] = []
        self.records: list[tuple[int, float]] = []
        """The draft's running minima of the keyed margin, (position, margin): pushed with
        it so that the synchronizer can calibrate the threshold from where responses flip
        (`core/branch_margin.py`)."""

    def feed(self, tokens: Sequence[int], top: Sequence[dict[int, float]],
             offer: bool = True) -> list[tuple[int, int]]:
        """Scan the new positions; the (position, runner-up) pairs streamed now (none
        without `offer`: a draft cut short only records its margins)."""
        out = []
        for p in range(self.seen, min(len(tokens), len(top))):
            tok, lp = tokens[p], top[p]
            if tok not in lp:
                continue
            m, ru = keyed_margin(lp, tok, position_key(self.seed, p), self.temperature)
            if ru < 0:
                continue
            self._scored.append((m, p, ru))
            if not self.records or m < self.records[-1][1]:
                self.records.append((p, m))
            if offer and m < self.threshold and len(self.offered) + len(out) < self.budget:
                out.append((p, ru))
        self.seen = max(self.seen, min(len(tokens), len(top)))
        self.offered += out
        return out

    def final(self) -> list[tuple[int, int]]:
        """The rest of the budget: the smallest margins not offered yet, ascending."""
        done = {p for p, _ in self.offered}
        left = self.budget - len(self.offered)
        rest = [(m, p, ru) for m, p, ru in self._scored if p not in done]
        out = [(p, ru) for _, p, ru in heapq.nsmallest(max(0, left), rest)]
        self.offered += out
        return out


def branch_points(tokens: list[int], top: list[dict[int, float]], seed: int,
                  temperature: float, budget: int) -> list[tuple[int, int]]:
    """The `budget` (position, runner-up) pairs of the draft's smallest keyed margins,
    ascending by margin (positions without a visible runner-up are skipped)."""
    w = MarginWatch(seed, temperature, budget)
    w.feed(tokens, top)
    return w.final()


def offers(t: PregenTask, g: GenResult, budget: int, watch: MarginWatch | None = None
           ) -> list[tuple[int, int]]:
    """The branches a finished draft offers: its `budget` smallest keyed margins as
    (position, runner-up), less those `watch` already streamed; none for a draft cut short,
    without top log-probs, or of a task that cannot branch."""
    s = g.samples[0] if g.samples else None
    if (budget <= 0 or s is None or s.finish_reason == "abort" or not s.top_logprobs
            or not branchable(t) or t.branch_at is not None):
        return []
    if watch is None:
        return branch_points(list(s.output_ids), s.top_logprobs, t.seed,
                             t.sampling.temperature, budget)
    if len(watch.offered) >= watch.budget:  # streamed it all: no margin left to read
        return []
    return watch.feed(s.output_ids, s.top_logprobs) + watch.final()


def branch_request(t: PregenTask) -> GenRequest | None:
    """The engine request that continues a branch task (None: no token budget left): the
    prompt plus the branch prefix, keyed noise from the position after it."""
    left = t.sampling.max_new_tokens - len(t.prefix)
    if left < 1:
        return None
    return GenRequest(input_ids=list(t.prompt_token_ids) + list(t.prefix), n=1,
                      seeds=[t.seed], sample_offset=t.sample_index, group=t.prompt_key,
                      keyed_start=len(t.prefix),
                      sampling=t.sampling.model_copy(update={"max_new_tokens": left}))


def branch_draft(t: PregenTask, g: GenResult | None) -> PregenDraft:
    """The branch draft of a branch task: its prefix and what the engine continued (None:
    the prefix alone, complete, when it had no budget left)."""
    if g is None:
        return PregenDraft(prompt_key=t.prompt_key, sample_index=t.sample_index,
                           token_ids=list(t.prefix), complete=True, branch_at=t.branch_at)
    s = g.samples[0]
    return PregenDraft(prompt_key=t.prompt_key, sample_index=t.sample_index,
                       token_ids=list(t.prefix) + list(s.output_ids),
                       complete=s.finish_reason != "abort",
                       weight_version=s.weight_version, branch_at=t.branch_at)
