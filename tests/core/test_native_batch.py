"""The batch step (one engine step of the proposer for every running request): the native
``step`` against the pure-Python reference in bubblespec.core.batch. Random RL-like batches
(sibling requests decoding live, pre-generated responses that are aligned, diverge and
re-join, budgets running out near the model length, partial prefills) must give identical
drafts and identical per-request counters at every step."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bubblespec.core import DraftParams
from bubblespec.core.backend import implementations, load_native

pytestmark = pytest.mark.skipif(load_native() is None, reason="bubblespec_native is not built")


@st.composite
def batch_case(draw):
    vocab = draw(st.integers(3, 8))
    groups = []
    for _ in range(draw(st.integers(1, 3))):
        base = draw(st.lists(st.integers(0, vocab - 1), min_size=6, max_size=50))
        sibs = []
        for _ in range(draw(st.integers(2, 4))):
            sib = list(base)
            for _ in range(draw(st.integers(0, 4))):
                sib[draw(st.integers(0, len(sib) - 1))] = draw(st.integers(0, vocab - 1))
            sibs.append(sib)
        groups.append(sibs)
    params = DraftParams(max_spec_tokens=draw(st.integers(0, 8)),
                         max_spec_factor=draw(st.sampled_from([0.5, 1.0, 2.0])),
                         min_token_prob=draw(st.sampled_from([0.0, 0.1, 0.4])),
                         use_tree=draw(st.booleans()))
    return (draw(st.integers(2, 10)), groups, params, draw(st.integers(1, 6)),
            draw(st.integers(20, 80)), draw(st.booleans()), draw(st.randoms()))


def state(r) -> tuple:
    return (list(r.stats), r.last_draft, r.last_aligned, r.aligned_on, list(r.tail), r.n_out,
            list(r.out))


def run(impl: dict, case) -> list:
    depth, groups, params, k, max_len, keep_out, rnd = case
    idx = impl["SuffixIndex"](max_depth=depth)
    reqs, truths = [], []
    for gi, sibs in enumerate(groups):
        idx.add_sequence(("prompt", gi), gi, sibs[0][:3])
        for si, truth in enumerate(sibs):
            # pre-generated response: the truth with its second half edited (diverges, then
            # the tail may re-join at the same positions), or none
            pre = truth[:len(truth) // 2] + [(t + 1) % 8 for t in truth[len(truth) // 2:]]
            pre[-3:] = truth[-3:]
            aligned = pre if si % 2 == 0 else None
            if aligned is not None:
                idx.add_sequence(("pre", gi, si), gi, aligned)
            idx.add_sequence(("out", gi, si), gi, [], live=True)
            m = idx.matcher(gi, sibs[0][:3])
            reqs.append(impl["Request"](gi, ("out", gi, si), m, aligned=aligned,
                                        aligned_on=aligned is not None, tail=[], n_out=0,
                                        out=[]))
            truths.append(truth)
    log, pos, drafts = [], [0] * len(reqs), [[] for _ in reqs]
    for _ in range(60):
        sampled, ntok = [], []
        for i, truth in enumerate(truths):
            if pos[i] >= len(truth) or rnd.random() < 0.1:  # done or partial prefill
                sampled.append([])
            else:
                a = 0
                while a < len(drafts[i]) and pos[i] + a < len(truth) \
                        and drafts[i][a] == truth[pos[i] + a]:
                    a += 1
                sampled.append(truth[pos[i]:pos[i] + a + 1])
            pos[i] += len(sampled[-1])
            ntok.append(3 + pos[i])
        if not any(sampled):
            break
        out = impl["step"](idx, reqs, sampled, ntok, k, max_len, params, keep_out=keep_out)
        drafts = [d if s else drafts[i] for i, (d, s) in enumerate(zip(out, sampled))]
        log.append((out, [state(r) for r in reqs], idx.num_tokens))
    return log


@settings(max_examples=60, deadline=None)
@given(batch_case())
def test_batch_step_agrees(case):
    impls = implementations()
    seed = case[-1].random()
    logs = []
    for name in ("python", "native"):
        case[-1].seed(seed)
        logs.append(run(impls[name], case))
    assert logs[1] == logs[0]


def test_step_checks_lengths():
    for impl in implementations().values():
        idx = impl["SuffixIndex"](max_depth=4)
        with pytest.raises(ValueError):
            impl["step"](idx, [], [[1]], [5], 4, 100)
