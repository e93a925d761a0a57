"""Random RL-like batches for the batch-step tests: prompt groups of sibling requests that
decode live (each emits the accepted prefix of its last draft plus one token of its own
response), pre-generated responses aligned to some of them (diverging, then re-joining at
the same positions), a global pool of finished responses with per-request global matchers,
budgets that run out near the model length, partial prefills, a token budget small enough
to evict stored responses mid-step, optionally drafts given from outside (the wrapped
vLLM proposers), and optionally the appends deferred (the step drafts first, then
``extend_sequences`` appends what it emitted, as the proposer's ``defer_appends`` does). ``drive`` runs one implementation and logs
every step's drafts, every request's state, the calibration and the per-source counters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from bubblespec.core import DraftParams
from bubblespec.core.batch import DraftCounters
from bubblespec.core.candidates import Calibration, DrafterStats


@dataclass
class Case:
    depth: int
    groups: list[list[list[int]]]  # per group, per request: its response
    pool: list[list[int]]  # finished responses in the global pool
    params: DraftParams
    k: int
    max_len: int
    keep_out: bool
    extend_index: bool
    use_global: bool
    given: bool  # drafts come from outside
    prior: float
    token_budget: int | None
    rnd: Any
    defer: bool = False  # extend_sequences after the step instead of appends inside it


@st.composite
def batch_case(draw: Callable) -> Case:
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
    pool = draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=30),
                         max_size=3))
    params = DraftParams(max_spec_tokens=draw(st.integers(0, 8)),
                         max_spec_factor=draw(st.sampled_from([0.5, 1.0, 2.0])),
                         min_token_prob=draw(st.sampled_from([0.0, 0.1, 0.4])),
                         use_tree=draw(st.booleans()))
    return Case(draw(st.integers(2, 10)), groups, pool, params, draw(st.integers(1, 6)),
                draw(st.integers(20, 80)), draw(st.booleans()), draw(st.booleans()),
                draw(st.booleans()), draw(st.integers(0, 4)) == 0,
                draw(st.sampled_from([0.5, 4.0, 16.0])),
                draw(st.sampled_from([None, None, 60, 150])), draw(st.randoms()),
                draw(st.booleans()))


def state(r: Any) -> tuple:
    return (DraftCounters.of(r.counters), r.last_draft, r.last_src, r.last_claim, r.aligned_on, list(r.tail),
            r.n_out, list(r.out))


def books(cal: Calibration, src: DrafterStats) -> tuple:
    return (dict(cal.claimed), dict(cal.delivered), cal.al_acc, cal.al_stop, src.as_dict())


def drive(index_cls: type, request_cls: type, step: Callable, case: Case,
          steps: int = 60, extend: Callable | None = None) -> list:
    """Run `case` through `step` (deferred appends through `extend`, the implementation's
    ``extend_requests``); the log of every step."""
    c = case
    idx = index_cls(max_depth=c.depth, token_budget=c.token_budget)
    for pi, toks in enumerate(c.pool):
        idx.add_sequence(("glob", pi), None, toks, to_global=True)
    reqs, truths = [], []
    for gi, sibs in enumerate(c.groups):
        idx.add_sequence(("prompt", gi), gi, sibs[0][:3])
        for si, truth in enumerate(sibs):
            # pre-generated response: the truth with its second half edited (diverges, then
            # its tail re-joins at the same positions), or none
            pre = truth[:len(truth) // 2] + [(t + 1) % 8 for t in truth[len(truth) // 2:]]
            pre[-3:] = truth[-3:]
            aligned = pre if si % 2 == 0 else None
            if aligned is not None:
                idx.add_sequence(("pre", gi, si), gi, aligned)
            idx.add_sequence(("out", gi, si), gi, [], live=True)
            m = idx.matcher(gi, sibs[0][:3], use_global=False)
            gm = idx.matcher(None, sibs[0][:3]) if c.use_global else None
            reqs.append(request_cls(gi, ("out", gi, si), m, gm, aligned=aligned,
                                    aligned_on=aligned is not None, tail=[], n_out=0, out=[]))
            truths.append(truth)
    cal, src = Calibration(prior=c.prior), DrafterStats()
    log: list = []
    pos, drafts = [0] * len(reqs), [[] for _ in reqs]
    for _ in range(steps):
        sampled, ntok = [], []
        for i, truth in enumerate(truths):
            if pos[i] >= len(truth) or c.rnd.random() < 0.1:  # done or partial prefill
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
        given = None
        if c.given:
            given = [truth[pos[i]:pos[i] + c.rnd.randrange(c.k + 2)] if c.rnd.random() < 0.7
                     else [c.rnd.randrange(8)] for i, truth in enumerate(truths)]
        defer = c.defer and c.extend_index and extend is not None
        out = step(idx, reqs, sampled, ntok, c.k, c.max_len, c.params, cal, src,
                   extend_index=c.extend_index and not defer, keep_out=c.keep_out,
                   drafts=given)
        if defer:
            extend(idx, reqs, sampled)
        drafts = [d if s else drafts[i] for i, (d, s) in enumerate(zip(out, sampled))]
        log.append((out, [state(r) for r in reqs], books(cal, src), idx.num_tokens))
    return log
