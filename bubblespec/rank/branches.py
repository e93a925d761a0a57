"""Margin branches: offered with a rank's complete keyed drafts, decoded by whichever rank
claims them (docs/design.md section 5, "Where updates flip, and margin branching").

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

The rank that made a draft does not decode its branches itself: it offers them with the
draft (`PregenDraft.branch_offers`), the synchronizer queues them behind the step's plain
tasks (`synchronizer/pregen.py`), and any rank with free lanes claims them, so the ranks
that had no plain task left spend their bubble on branches of the longest drafts.
"""

from __future__ import annotations

import heapq

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


def offers(t: PregenTask, g: GenResult, budget: int) -> list[tuple[int, int]]:
    """The branches a finished draft offers: its `budget` smallest keyed margins as
    (position, runner-up); none for a draft cut short, without top log-probs, or of a task
    that cannot branch."""
    s = g.samples[0] if g.samples else None
    if (budget <= 0 or s is None or s.finish_reason == "abort" or not s.top_logprobs
            or not branchable(t) or t.branch_at is not None):
        return []
    return branch_points(list(s.output_ids), s.top_logprobs, t.seed, t.sampling.temperature,
                         budget)


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
