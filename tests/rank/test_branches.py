"""Margin branches on a rank (`rank/branches.py`): which positions branch (the smallest
keyed margins, read from top log-probs), longest drafts first, and the requests and drafts
a branch makes."""

from __future__ import annotations

import numpy as np

from bubblespec.core.keyed_noise import keyed_top2, position_key
from bubblespec.engine.types import GenResult, SampleResult
from bubblespec.protocol.domain import PregenTask
from bubblespec.protocol.sampling import SamplingParams
from bubblespec.rank.branches import BranchQueue, branch_points, branchable


def _task(seed: int = 3, mode: str = "keyed", max_new: int = 50) -> PregenTask:
    return PregenTask("p", [1, 2], 0, seed=seed,
                      sampling=SamplingParams(max_new_tokens=max_new, temperature=1.0,
                                              seed_mode=mode))


def _draft(seed: int, n: int, vocab: int = 12, rng_seed: int = 0
           ) -> tuple[list[int], list[dict[int, float]], list[float], list[int]]:
    """A keyed draft over random logits: tokens, full-vocabulary 'top log-probs', and the
    true margins and runner-ups."""
    rng = np.random.default_rng(rng_seed)
    toks, tops, margins, rus = [], [], [], []
    for p in range(n):
        logits = rng.normal(0, 2.0, vocab)
        logp = logits - np.logaddexp.reduce(logits)
        tok, m, ru = keyed_top2(logits, position_key(seed, p))
        toks.append(tok)
        tops.append({v: float(logp[v]) for v in range(vocab)})
        margins.append(m)
        rus.append(ru)
    return toks, tops, margins, rus


def _result(tokens: list[int], top: list[dict[int, float]] | None, finish: str = "stop"
            ) -> GenResult:
    return GenResult("p", [SampleResult(tokens, [0.0] * len(tokens), finish, 0, 1,
                                        top_logprobs=top)])


def test_branch_points_are_the_smallest_margins_with_their_runner_ups() -> None:
    toks, tops, margins, rus = _draft(seed=9, n=40)
    got = branch_points(toks, tops, seed=9, temperature=1.0, budget=3)
    want = sorted(range(40), key=lambda p: margins[p])[:3]
    assert got == [(p, rus[p]) for p in want]


def test_queue_takes_longest_drafts_first_and_builds_requests_and_drafts() -> None:
    q = BranchQueue(budget=1)
    short, long_ = _draft(3, 10, rng_seed=1), _draft(3, 30, rng_seed=2)
    q.add(_task(), _result(short[0], short[1]))
    q.add(_task(), _result(long_[0], long_[1]))
    q.add(_task(), _result(long_[0], long_[1], finish="abort"))  # cut short: no branch
    q.add(_task(mode="keyed_context"), _result(long_[0], long_[1]))  # context keys: none
    q.add(_task(), _result(long_[0], None))  # no log-probs: none
    assert len(q) == 2
    first, second = q.take(5)
    assert len(first.prefix) > 0 and first.prefix[:-1] == long_[0][:first.at]
    assert second.prefix[:-1] == short[0][:second.at] and q.made == 2
    req = first.request()
    assert req.input_ids == [1, 2] + first.prefix and req.keyed_start == first.at + 1
    assert req.sampling.max_new_tokens == 50 - len(first.prefix) and req.seeds == [3]
    d = first.draft(_result([7, 8], None))
    assert d.branch_at == first.at and list(d.token_ids) == first.prefix + [7, 8]
    assert d.complete and not first.draft(_result([7], None, "abort")).complete
    assert branchable(_task()) and not branchable(_task(mode="default"))
    from bubblespec.rank.branches import Branch
    assert Branch(_task(max_new=3), [1, 2, 3], 2).request() is None  # no budget left
