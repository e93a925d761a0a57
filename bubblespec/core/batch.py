"""One proposer engine step for a whole batch of requests: the reference implementation.

Per request with newly emitted tokens: count the step, and the accepted tokens of its last
draft (recorded against the draft's drafter in the calibration and the per-drafter counters);
append the tokens to the request's live sequence in the index; continue the aligned
pre-generated response while the output still equals it (keyed noise makes it a coupled
prediction); ask every registered drafter (`core.drafters`: the aligned response, the
request's group matcher, its global-pool matcher when it has one) for a candidate and send
the one with the highest calibrated expected accepted length
(:mod:`bubblespec.core.candidates`). This is the engine proposer's per-request loop; the
native backend (``bubblespec_native.step``) is held to it token for token, counters and
calibration included (see :mod:`bubblespec.core.backend`).

Requests are processed in batch order and each one's record updates the calibration the
next one is chosen with, so the result depends on the order, as in the engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from bubblespec.core.candidates import Calibration, DrafterStats, choose
from bubblespec.core.draft import DraftParams
from bubblespec.core.drafters import DRAFTERS

RESYNC = 4
"""After the output leaves the aligned pre-generated response, drafting from it resumes once
the last RESYNC output tokens equal the response's tokens at the same positions: keyed noise
is keyed by position, so a response that re-joins its draft at the same offset is coupled
to it again."""


@dataclass(slots=True)
class DraftCounters:
    """One request's draft counters, from the batch step to its sample's `SampleMeta`. A new
    counter is a field here, the same name in `BUBBLESPEC_COUNTERS` of
    native/src/request.hpp, and its publishers (`Engine._collect`, `SampleMeta`)."""

    steps: int = 0
    """Engine steps that emitted tokens for the request."""
    drafts: int = 0
    """Steps that proposed a draft."""
    draft_tokens: int = 0
    accepted: int = 0
    """Drafted tokens accepted."""
    accepted_pregen: int = 0
    """Of those, from the aligned pre-generated response."""
    accepted_after_divergence: int = 0
    """Accepted at or after the first divergence from the aligned response (any source)."""
    first_divergence: int = -1
    """Output position where the output first left a non-empty aligned response; -1: none."""
    recouplings: int = 0
    """Times the output re-joined the aligned response after a divergence."""
    ran_out: int = 0
    """1 when the first divergence was the aligned response's end (cut short by a stop)."""

    @classmethod
    def of(cls, counters: Any) -> DraftCounters:
        """A copy of `counters`: a `DraftCounters`, or the native Request's {name: value}."""
        if isinstance(counters, DraftCounters):
            return dataclasses.replace(counters)
        return cls(**counters)


@dataclass
class Request:
    """Drafting state of one running request."""

    group: Hashable  # index group the request matches against
    seq_id: Hashable  # its live output sequence in the index
    matcher: Any  # over the request's group
    gmatcher: Any = None  # over the global pool (when it is on)
    _: KW_ONLY
    counters: DraftCounters = field(default_factory=DraftCounters)
    last_draft: int = 0
    last_src: str = ""  # drafter of the last draft ("" when it came from elsewhere)
    last_claim: float = 0.0  # its expected accepted tokens as the drafter stated them
    aligned: list[int] | None = None  # pre-generated response with this sample index
    aligned_on: bool = True  # output equals the aligned response so far (or re-synced)
    tail: list[int] = field(default_factory=list)  # the last RESYNC output tokens
    n_out: int = 0  # output tokens so far
    out: list[int] = field(default_factory=list)  # the output (kept when asked to)

    def follow_branch(self, tokens: list[int], pos: int) -> None:
        """Make a margin branch the aligned response: the output left the aligned one at
        output position `pos` with the branch's token (counted as the first divergence
        from the pre-generated response, if it is the first)."""
        self.aligned = list(tokens)
        self.aligned_on = True
        if self.counters.first_divergence < 0:
            self.counters.first_divergence = pos


def take_branch(st: Any, al: list[int], sampled: list[int],
                branches: list[tuple[int, list[int]]]) -> list[int] | None:
    """Before the step: if the newly `sampled` tokens leave `al`, the aligned response of
    `st` (passed in: the caller keeps it, reading it back from a native Request would copy
    it every step), at a position where one of its margin `branches` (branch position,
    tokens) takes the sampled token, and the branch equals the output before that, follow
    the branch (the engine step then continues it as the aligned response) and return it;
    else None."""
    if not st.aligned_on or not branches:
        return None
    start = st.n_out
    for j, t in enumerate(sampled):
        pos = start + j
        if pos < len(al) and al[pos] == t:
            continue
        for at, toks in branches:
            if (at == pos and pos < len(toks) and toks[pos] == t
                    and toks[:pos] == al[:pos]):
                st.follow_branch(toks, pos)
                return toks
        return None
    return None


def follow_aligned(st: Any, sampled: list[int], budget: int) -> list[int]:
    """Continue the aligned pre-generated response of `st` (a `Request`) while the output
    still equals it; after a divergence, [] until the last RESYNC output tokens equal it at
    the same positions again.

    Also keeps the divergence counters of ``st.counters`` (`DraftCounters`): the first
    divergence (a different token, or past the response's end), the tokens of the last
    draft accepted at or after it (from any source: what drafting saves once the coupling
    broke), the re-couplings, and whether the divergence was the response running out."""
    start = st.n_out
    st.n_out += len(sampled)
    st.tail = (st.tail + list(sampled))[-RESYNC:]
    al = st.aligned
    if al is None:
        return []
    c = st.counters
    if st.aligned_on and al[start : st.n_out] != sampled:
        st.aligned_on = False
        if c.first_divergence < 0 and al:  # an empty pre-generated response is none
            c.first_divergence = start + next((j for j, t in enumerate(sampled)
                                               if start + j >= len(al) or al[start + j] != t),
                                              len(sampled))
            c.ran_out = int(c.first_divergence >= len(al))
    if c.first_divergence >= 0 and st.last_draft:
        c.accepted_after_divergence += max(0, start + len(sampled) - 1
                                           - max(start, c.first_divergence))
    if not st.aligned_on:
        n = st.n_out
        if n < RESYNC or al[n - RESYNC : n] != st.tail:
            return []
        st.aligned_on = True
        c.recouplings += 1
    return al[st.n_out : st.n_out + max(budget, 0)]


def choose_draft(st: Request, sampled: list[int], aligned: list[int], budget: int,
                 params: DraftParams, calib: Calibration, src: DrafterStats) -> list[int]:
    """Ask every registered drafter for its candidate for `st` and keep the one with the
    highest expected accepted length; count the winner (or an empty step)."""
    cands = [c for d in DRAFTERS
             if (c := d.candidate(st, sampled, aligned, budget, params, calib)) is not None]
    best, claim = choose(cands, budget, calib)
    if best is None:
        st.last_src, st.last_claim = "", 0.0
        src.empty += 1
        return []
    st.last_src, st.last_claim = best.source, claim
    src.wins[best.source] += 1
    src.drafted[best.source] += len(best.token_ids)
    return best.token_ids


def extend_requests(index: Any, reqs: Sequence[Request], sampled: Sequence[list[int]],
                    ) -> None:
    """The appends a `step` with ``extend_index=False`` left: each non-empty ``sampled[i]``
    to the live sequence of ``reqs[i]``, in order, in one ``index.extend_sequences`` call
    (checked whole first). The engine proposer's deferred appends
    (``defer_appends``) run this on a worker thread after sending the drafts."""
    if len(reqs) < len(sampled):
        raise ValueError("extend_requests: one request per sampled list")
    rows = [i for i, new in enumerate(sampled) if len(new)]
    index.extend_sequences([reqs[i].seq_id for i in rows], [list(sampled[i]) for i in rows])


def step(index: Any, reqs: Sequence[Request], sampled: Sequence[list[int]],
         num_tokens: Sequence[int], k: int, max_model_len: int, params: DraftParams,
         calib: Calibration, src: DrafterStats, *, extend_index: bool = True,
         keep_out: bool = False, drafts: Sequence[Sequence[int]] | None = None,
         caps: Sequence[int] | None = None) -> list[list[int]]:
    """Drafts for one engine step: ``reqs[i]`` emitted ``sampled[i]`` and holds
    ``num_tokens[i]`` tokens (before drafts); a draft has at most
    ``min(k, max_model_len - num_tokens[i] - 1)`` tokens.

    ``extend_index``: append the emitted tokens to each request's live sequence in `index`;
    ``keep_out``: keep them in ``out``; ``drafts``: send ``drafts[i]`` (cut to the budget)
    instead of choosing among the sources (the wrapped vLLM proposers), counted the same way;
    ``caps``: a further cap per request (`core.draft_budget`), None for none.
    """
    if hasattr(num_tokens, "tolist"):
        num_tokens = num_tokens.tolist()
    n = len(sampled)
    if hasattr(caps, "tolist"):
        caps = caps.tolist()
    if len(reqs) < n or len(num_tokens) < n or (drafts is not None and len(drafts) < n) or (
            caps is not None and len(caps) < n):
        raise ValueError("step: reqs, num_tokens, drafts and caps need one entry per sampled "
                         "list")
    if len({id(r) for r in reqs[:n]}) < n:
        raise ValueError("step: a request appears twice in the batch")
    out: list[list[int]] = []
    for i, new in enumerate(sampled):
        st = reqs[i]
        if not new:  # partial prefill: nothing emitted, nothing to draft
            out.append([])
            continue
        new = list(new)
        c = st.counters
        c.steps += 1
        if keep_out:
            st.out.extend(new)
        if st.last_draft:
            acc = len(new) - 1
            c.accepted += acc
            if st.last_src:
                if st.last_src == "aligned":
                    c.accepted_pregen += acc
                calib.record(st.last_src, st.last_claim, st.last_draft, acc)
                src.accepted[st.last_src] += acc
        if extend_index:
            index.extend_sequence(st.seq_id, new)
        budget = min(k if caps is None else min(k, int(caps[i])),
                     max_model_len - int(num_tokens[i]) - 1)
        aligned = follow_aligned(st, new, budget)
        if drafts is not None:
            tokens = list(drafts[i])[:max(budget, 0)]
            st.matcher.extend(new)
        else:
            tokens = choose_draft(st, new, aligned, budget, params, calib, src)
        st.last_draft = len(tokens)
        if tokens:
            c.drafts += 1
            c.draft_tokens += len(tokens)
        out.append(tokens)
    return out
