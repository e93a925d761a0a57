"""One proposer engine step for a whole batch of requests: the reference implementation.

Per request with newly emitted tokens: count the step (and the accepted tokens of its last
draft), append the tokens to the request's live sequence in the index, continue the aligned
pre-generated response while the output still equals it (keyed noise makes it a coupled
prediction), otherwise extend the request's matcher and draft from the index. This is the
per-request loop of the engine proposer, kept here so that the native backend
(``bubblespec_native.step``) can be held to it token for token; see
:mod:`bubblespec.core.backend`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bubblespec.core.draft import DraftParams
from bubblespec.core.matcher import DEFAULT_PARAMS
from bubblespec.core.suffix_index import SuffixIndex

RESYNC = 4
"""After the output leaves the aligned pre-generated response, drafting from it resumes once
the last RESYNC output tokens equal the response's tokens at the same positions: keyed noise
is keyed by position, so a response that re-joins its draft at the same offset is coupled
to it again."""


@dataclass
class Request:
    """Drafting state of one running request."""

    group: Hashable  # index group the request matches against
    seq_id: Hashable  # its live output sequence in the index
    matcher: Any
    # steps, drafts, draft tokens, accepted, accepted from the aligned pre-generated response
    stats: list[int] = field(default_factory=lambda: [0, 0, 0, 0, 0])
    last_draft: int = 0
    last_aligned: bool = False  # the last draft came from the aligned pre-generated response
    aligned: list[int] | None = None  # pre-generated response with this sample index
    aligned_on: bool = True  # output equals the aligned response so far (or re-synced)
    tail: list[int] = field(default_factory=list)  # the last RESYNC output tokens
    n_out: int = 0  # output tokens so far
    out: list[int] = field(default_factory=list)  # the output (kept when asked to)

    def aligned_draft(self, sampled: list[int], budget: int) -> list[int]:
        """`follow_aligned` of this request."""
        return follow_aligned(self, sampled, budget)


def follow_aligned(st: Any, sampled: list[int], budget: int) -> list[int]:
    """Continue the aligned pre-generated response of `st` (a `Request`, or the engine
    proposer's per-request state with the same fields) while the output still equals it;
    after a divergence, [] until the last RESYNC output tokens equal it at the same
    positions again."""
    start = st.n_out
    st.n_out += len(sampled)
    st.tail = (st.tail + list(sampled))[-RESYNC:]
    al = st.aligned
    if al is None:
        return []
    if st.aligned_on and al[start : st.n_out] != sampled:
        st.aligned_on = False
    if not st.aligned_on:
        n = st.n_out
        if n < RESYNC or al[n - RESYNC : n] != st.tail:
            return []
        st.aligned_on = True
    return al[st.n_out : st.n_out + max(budget, 0)]


def step(index: SuffixIndex, reqs: Sequence[Request], sampled: Sequence[list[int]],
         num_tokens: Sequence[int], k: int, max_model_len: int,
         params: DraftParams = DEFAULT_PARAMS, *, extend_index: bool = True,
         keep_out: bool = False) -> list[list[int]]:
    """Drafts for one engine step: ``reqs[i]`` emitted ``sampled[i]`` and holds
    ``num_tokens[i]`` tokens (before drafts); a draft has at most
    ``min(k, max_model_len - num_tokens[i] - 1)`` tokens. ``extend_index``: append the
    emitted tokens to each request's live sequence; ``keep_out``: keep them in ``out``."""
    if hasattr(num_tokens, "tolist"):
        num_tokens = num_tokens.tolist()
    if len(reqs) < len(sampled) or len(num_tokens) < len(sampled):
        raise ValueError("step: reqs and num_tokens need one entry per sampled list")
    out: list[list[int]] = []
    for i, new in enumerate(sampled):
        st = reqs[i]
        if not new:  # partial prefill: nothing emitted, nothing to draft
            out.append([])
            continue
        stats = st.stats
        stats[0] += 1
        if keep_out:
            st.out.extend(new)
        if st.last_draft:
            stats[3] += len(new) - 1
            if st.last_aligned:
                stats[4] += len(new) - 1
        if extend_index:
            index.extend_sequence(st.seq_id, new)
        budget = min(k, max_model_len - int(num_tokens[i]) - 1)
        tokens = st.aligned_draft(new, budget)
        st.last_aligned = bool(tokens)
        if tokens or budget <= 0:
            st.matcher.extend(new)
        else:
            tokens = st.matcher.speculate(new, params).token_ids[:budget]
        st.last_draft = len(tokens)
        if tokens:
            stats[1] += 1
            stats[2] += len(tokens)
        out.append(tokens)
    return out
