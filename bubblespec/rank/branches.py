"""Margin branches: what a rank pre-generates once the queue is drained (docs/design.md
section 5, "Where updates flip, and margin branching").

A keyed pre-generated draft is the old weights' response under the next step's noise; the
new weights leave it where the update moves another token's perturbed score past the
chosen one's, almost always at the draft's smallest keyed margins and to the runner-up
there (measured by `bubblespec bench flips`). So for each complete draft this rank made,
longest first (the ones most likely to set the next step's critical path), it decodes up to
`budget` branches: the draft's prefix up to its lowest-margin position p, the runner-up
token there, and the rest with the same keyed noise (`GenRequest.keyed_start = p + 1`). A
branch is pushed beside its draft (`PregenDraft.branch_at = p`) and the proposer follows it
when the output takes that token there. Branches are drafts only: verification decides
every token, so sampling is the same with or without them.

Margins come from the engine's top log-probabilities of each draft token
(`core.keyed_noise.keyed_margin`: tokens outside the top few are not seen, which only ever
raises a margin). Position keys only: with context keys the noise after a flip is not the
draft's at the same position anyway.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from bubblespec.core.keyed_noise import keyed_margin, position_key
from bubblespec.engine.types import GenRequest, GenResult
from bubblespec.protocol.domain import PregenDraft, PregenTask

TOP_LOGPROBS = 4
"""Log-probabilities per token a branching rank asks for while pre-generating."""


def branchable(t: PregenTask) -> bool:
    """Tasks whose drafts can be branched: keyed by position, sampled (temperature > 0)."""
    sp = t.sampling
    return sp.keyed and not sp.keyed_by_context and sp.temperature > 0


def branch_points(tokens: list[int], top: list[dict[int, float]], seed: int,
                  temperature: float, budget: int) -> list[tuple[int, int]]:
    """The `budget` (position, runner-up) pairs of the draft's smallest keyed margins,
    ascending by margin (positions without a visible runner-up are skipped)."""
    scored = []
    for p, (tok, lp) in enumerate(zip(tokens, top)):
        if tok not in lp:
            continue
        m, ru = keyed_margin(lp, tok, position_key(seed, p), temperature)
        if ru >= 0:
            scored.append((m, p, ru))
    return [(p, ru) for _, p, ru in heapq.nsmallest(budget, scored)]


@dataclass(frozen=True)
class Branch:
    """One branch to decode: the draft's task, its prefix (draft[:at] + runner-up)."""

    task: PregenTask
    prefix: list[int]
    at: int

    def request(self) -> GenRequest | None:
        """The engine request that continues the branch (None: no token budget left)."""
        left = self.task.sampling.max_new_tokens - len(self.prefix)
        if left < 1:
            return None
        return GenRequest(input_ids=list(self.task.prompt_token_ids) + self.prefix, n=1,
                          seeds=[self.task.seed], sample_offset=self.task.sample_index,
                          group=self.task.prompt_key, keyed_start=len(self.prefix),
                          sampling=self.task.sampling.model_copy(
                              update={"max_new_tokens": left}))

    def draft(self, g: GenResult) -> PregenDraft:
        s = g.samples[0]
        return PregenDraft(prompt_key=self.task.prompt_key, sample_index=self.task.sample_index,
                           token_ids=self.prefix + list(s.output_ids),
                           complete=s.finish_reason != "abort",
                           weight_version=s.weight_version, branch_at=self.at)


class BranchQueue:
    """Branches of this rank's complete drafts, longest draft first."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._heap: list[tuple[int, int, Branch]] = []
        self._n = 0
        self.made = 0

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, t: PregenTask, g: GenResult) -> None:
        """Queue the branches of a finished draft (complete, keyed by position, with top
        log-probs); others are ignored."""
        s = g.samples[0] if g.samples else None
        if (s is None or s.finish_reason == "abort" or not s.top_logprobs
                or not branchable(t)):
            return
        tokens = list(s.output_ids)
        for at, ru in branch_points(tokens, s.top_logprobs, t.seed, t.sampling.temperature,
                                    self.budget):
            self._n += 1
            heapq.heappush(self._heap, (-len(tokens), self._n,
                                        Branch(t, tokens[:at] + [ru], at)))

    def take(self, n: int) -> list[Branch]:
        """Up to `n` branches to decode now."""
        out = []
        while self._heap and len(out) < n:
            out.append(heapq.heappop(self._heap)[2])
        self.made += len(out)
        return out
