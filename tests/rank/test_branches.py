"""Margin branches on a rank (`rank/branches.py`): which positions a draft offers (the
smallest keyed margins, read from top log-probs), and the requests and drafts a claimed
branch task makes."""

from __future__ import annotations

import numpy as np

from bubblespec.core.branch_margin import running_minima
from bubblespec.core.keyed_noise import keyed_top2, position_key
from bubblespec.engine.types import GenResult, SampleResult
from bubblespec.protocol.domain import PregenTask
from bubblespec.protocol.sample import SampleMeta
from bubblespec.protocol.sampling import SamplingParams
from bubblespec.rank.branches import (
    MarginWatch,
    branch_draft,
    branch_points,
    branch_request,
    branchable,
    offers,
)


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
    meta = SampleMeta(finish_reason=finish, weight_version=1, completion_tokens=len(tokens))
    return GenResult("p", [SampleResult(tokens, [0.0] * len(tokens), 0, meta,
                                        top_logprobs=top)])


def test_branch_points_are_the_smallest_margins_with_their_runner_ups() -> None:
    toks, tops, margins, rus = _draft(seed=9, n=40)
    got = branch_points(toks, tops, seed=9, temperature=1.0, budget=3)
    want = sorted(range(40), key=lambda p: margins[p])[:3]
    assert got == [(p, rus[p]) for p in want]


def test_margin_watch_streams_below_its_threshold_and_ends_with_the_smallest() -> None:
    toks, tops, margins, rus = _draft(seed=5, n=60, rng_seed=4)
    order = sorted(range(60), key=lambda p: margins[p])
    cut = (margins[order[2]] + margins[order[3]]) / 2  # three positions below it
    w = MarginWatch(5, 1.0, budget=2, threshold=cut)
    got = []
    for n in range(0, 61, 7):  # tokens arrive a few at a time, as the engine streams them
        got += w.feed(toks[:n], tops[:n])
    below = sorted(order[:3])
    assert got == [(p, rus[p]) for p in below[:2]]  # the first two in decoding order
    assert w.final() == [] and w.offered == got  # the budget is spent
    at_once = MarginWatch(5, 1.0, budget=2, threshold=cut)
    assert at_once.feed(toks, tops) == got  # one call, three below: still two
    w1 = MarginWatch(5, 1.0, budget=2, threshold=(margins[order[0]] + margins[order[1]]) / 2)
    streamed = w1.feed(toks, tops)
    assert streamed == [(order[0], rus[order[0]])]
    assert w1.final() == [(order[1], rus[order[1]])]  # the rest: the next smallest margin
    w0 = MarginWatch(5, 1.0, budget=3)  # threshold 0: nothing streams
    assert w0.feed(toks, tops) == [] and w0.final() == [(p, rus[p]) for p in order[:3]]
    assert w0.final() == []


def test_a_watch_records_the_running_minima_it_reads() -> None:
    """The records pushed with a draft (the synchronizer calibrates the streamed threshold
    from them) are the running minima of the true margins, streamed or read at the end,
    and a draft cut short records its margins without offering."""
    toks, tops, margins, _ = _draft(seed=3, n=50, rng_seed=9)
    want = running_minima(list(enumerate(margins)))
    w = MarginWatch(3, 1.0, budget=1, threshold=0.5)
    for n in range(0, 51, 9):
        w.feed(toks[:n], tops[:n])
    w.feed(toks, tops)
    assert [p for p, _ in w.records] == [p for p, _ in want]
    assert np.allclose([m for _, m in w.records], [m for _, m in want])
    cut = MarginWatch(3, 1.0, budget=1, threshold=100.0)
    assert cut.feed(toks, tops, offer=False) == [] and cut.offered == []
    assert cut.records == w.records


def test_offers_requests_and_drafts_of_branch_tasks() -> None:
    toks, tops, margins, rus = _draft(3, 30, rng_seed=2)
    t = _task()
    got = offers(t, _result(toks, tops), 2)
    assert [at for at, _ in got] == sorted(range(30), key=lambda p: margins[p])[:2]
    assert offers(t, _result(toks, tops), 0) == []  # branching off
    # a watch that saw nothing while decoding: what it would have streamed comes at the end
    w = MarginWatch(3, 1.0, 2, threshold=100.0)
    assert offers(t, _result(toks, tops), 2, w) == [(0, rus[0]), (1, rus[1])]
    assert offers(t, _result(toks, tops, finish="abort"), 2) == []  # cut short: no branch
    assert offers(_task(mode="keyed_context"), _result(toks, tops), 2) == []  # context keys
    assert offers(t, _result(toks, None), 2) == []  # no log-probs
    at, ru = got[0]
    bt = PregenTask("p", [1, 2], 0, seed=3, sampling=t.sampling, prefix=toks[:at] + [ru],
                    branch_at=at)
    assert offers(bt, _result(toks, tops), 2) == []  # a branch offers no branches
    req = branch_request(bt)
    assert req is not None and req.input_ids == [1, 2] + toks[:at] + [ru]
    assert req.keyed_start == at + 1 and req.seeds == [3] and req.top_logprobs == 0
    assert req.sampling.max_new_tokens == 50 - (at + 1)
    d = branch_draft(bt, _result([7, 8], None))
    assert d.branch_at == at and list(d.token_ids) == toks[:at] + [ru, 7, 8] and d.complete
    assert not branch_draft(bt, _result([7], None, "abort")).complete
    assert branchable(_task()) and not branchable(_task(mode="default"))
    full = PregenTask("p", [1, 2], 0, seed=3, sampling=_task(max_new=3).sampling,
                      prefix=[1, 2, 3], branch_at=2)
    assert branch_request(full) is None  # no budget left: the prefix is the whole branch
    assert list(branch_draft(full, None).token_ids) == [1, 2, 3]
