"""The native draft index against the pure-Python reference: random call sequences applied
to both in lockstep must give identical drafts (token ids, parents, probabilities and
scores bit for bit), identical matcher states and identical index stats, and fail alike.

Small vocabularies, short sequences and small budgets make clones, branching, eviction,
rebuilds and the global group frequent; ``max_depth`` is small so the depth cap and the
sliding draft window are exercised.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bubblespec.core import DraftParams
from bubblespec.core.backend import implementations, load_native

NATIVE = load_native()
needs_native = pytest.mark.skipif(NATIVE is None, reason="bubblespec_native is not built")

GROUPS = [0, 1, "g", None]
params_strategy = st.builds(
    DraftParams,
    max_spec_tokens=st.integers(0, 10),
    max_spec_factor=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
    max_spec_offset=st.sampled_from([-1.0, 0.0, 1.0, 3.0]),
    min_token_prob=st.sampled_from([0.0, 0.05, 0.1, 0.3, 0.6]),
    use_tree=st.booleans(),
    search_shorter=st.booleans(),
)


def tokens(vocab: int, max_size: int = 20):
    return st.lists(st.integers(0, vocab - 1), max_size=max_size)


@st.composite
def op_lists(draw):
    vocab = draw(st.integers(2, 6))
    toks = tokens(vocab)
    seq = st.integers(0, 5)
    op = st.one_of(
        st.tuples(st.just("add"), seq, st.sampled_from(GROUPS), toks, st.booleans(),
                  st.booleans()),
        st.tuples(st.just("extend"), seq, tokens(vocab, 6)),
        st.tuples(st.just("finish"), seq),
        st.tuples(st.just("remove"), st.lists(seq, min_size=1, max_size=3)),
        st.tuples(st.just("remove_group"), st.sampled_from(GROUPS)),
        st.tuples(st.just("matcher"), st.sampled_from(GROUPS), toks, st.booleans()),
        st.tuples(st.just("speculate"), st.integers(0, 3), tokens(vocab, 4), params_strategy),
        st.tuples(st.just("draft"), st.sampled_from(GROUPS), toks, params_strategy,
                  st.booleans()),
        st.tuples(st.just("query"), st.sampled_from(GROUPS), tokens(vocab, 10)),
    )
    cfg = (draw(st.integers(1, 8)), draw(st.sampled_from([None, 20, 60])),
           draw(st.sampled_from([None, 15, 40])), draw(st.sampled_from([0.5, 0.75, 1.0])))
    return cfg, draw(st.lists(op, min_size=1, max_size=40))


def draft_tuple(d) -> tuple:
    return (list(d.token_ids), list(d.parents), list(d.probs), d.score, d.match_len, len(d))


def apply(index_cls, cfg, ops) -> list:
    """Run ``ops`` on a fresh index; the log of every result, error type and stats."""
    depth, budget, gbudget, low = cfg
    idx = index_cls(max_depth=depth, token_budget=budget, global_token_budget=gbudget,
                    low_water=low)
    matchers = []
    log: list = []
    for op in ops:
        try:
            kind = op[0]
            if kind == "add":
                _, sid, group, toks, live, to_global = op
                idx.add_sequence(sid, group, toks, live=live, to_global=to_global)
            elif kind == "extend":
                idx.extend_sequence(op[1], op[2])
            elif kind == "finish":
                idx.finish_sequence(op[1])
            elif kind == "remove":
                idx.remove_sequences(op[1])
            elif kind == "remove_group":
                idx.remove_group(op[1])
            elif kind == "matcher":
                matchers.append(idx.matcher(op[1], op[2], use_global=op[3]))
            elif kind == "speculate" and matchers:
                m = matchers[op[1] % len(matchers)]
                log.append(draft_tuple(m.speculate(op[2], op[3])))
                log.append((m.match_len, m.global_match_len, m.continuations(),
                            m.continuations(True)))
            elif kind == "draft":
                log.append(draft_tuple(idx.draft(op[1], op[2], op[3], use_global=op[4])))
            elif kind == "query":
                log.append((idx.longest_match(op[1], op[2]), idx.count(op[1], op[2][:depth])))
        except ValueError as e:
            log.append(("ValueError", op[0], type(e).__name__))
        log.append((idx.groups(), idx.num_tokens, idx.num_global_tokens,
                    [idx.sequence_ids(g) for g in GROUPS],
                    [idx.sequence_tokens(s) for s in idx.sequence_ids(None)]))
    return log


@needs_native
@settings(max_examples=150, deadline=None)
@given(op_lists())
def test_random_calls_agree(case):
    cfg, ops = case
    impls = implementations()
    py = apply(impls["python"]["SuffixIndex"], cfg, ops)
    nat = apply(impls["native"]["SuffixIndex"], cfg, ops)
    assert nat == py


@st.composite
def sibling_case(draw):
    """RL-like: siblings copied from one base with edits; one decodes live while drafting."""
    vocab = draw(st.integers(3, 8))
    base = draw(st.lists(st.integers(0, vocab - 1), min_size=8, max_size=60))
    sibs = []
    for _ in range(draw(st.integers(2, 5))):
        sib = list(base)
        for _ in range(draw(st.integers(0, 4))):
            sib[draw(st.integers(0, len(sib) - 1))] = draw(st.integers(0, vocab - 1))
        sibs.append(sib)
    return draw(st.integers(2, 12)), sibs, draw(params_strategy)


@needs_native
@settings(max_examples=150, deadline=None)
@given(sibling_case())
def test_sibling_decode_agrees(case):
    depth, sibs, params = case
    logs = []
    for impl in implementations().values():
        idx = impl["SuffixIndex"](max_depth=depth)
        for i, s in enumerate(sibs[1:]):
            idx.add_sequence(i, "grp", s, to_global=i % 2 == 0)
        idx.add_sequence("out", "grp", [], live=True)
        m = idx.matcher("grp", sibs[0][:2])
        truth, pos, new, log = sibs[0], 2, [], []
        while pos < len(truth):
            if new:
                idx.extend_sequence("out", new)
            d = m.speculate(new, params)
            log.append(draft_tuple(d))
            k = 0
            while k < len(d) and pos + k < len(truth) and d.token_ids[k] == truth[pos + k] \
                    and d.parents[k] == k - 1:
                k += 1
            new = truth[pos:pos + k + 1]
            pos += k + 1
        logs.append(log)
    assert logs[0] == logs[1]


@needs_native
def test_errors_match():
    for impl in implementations().values():
        idx = impl["SuffixIndex"](max_depth=4)
        for bad in ([1, -1], [1.5], ["a"], [2**31]):
            with pytest.raises(ValueError):
                idx.add_sequence("x", 0, bad)
        with pytest.raises(ValueError):
            idx.add_sequence([1], 0, [1])
        with pytest.raises(ValueError):
            idx.add_sequence("x", None, [1])
        idx.add_sequence("x", 0, [1, 2])
        with pytest.raises(ValueError):
            idx.add_sequence("x", 0, [1])
        with pytest.raises(ValueError):
            idx.extend_sequence("x", [3])  # finished
        with pytest.raises(ValueError):
            idx.count(0, [1] * 6)
        for kw in ({"max_depth": 0}, {"max_depth": True}, {"token_budget": 0},
                   {"low_water": 0.0}, {"low_water": 1.5}):
            with pytest.raises(ValueError):
                impl["SuffixIndex"](**kw)


def test_native_module_built():
    """CI builds the native module (make install); a machine where it cannot be built opts
    out with BUBBLESPEC_ALLOW_NO_NATIVE=1 and runs on the pure-Python fallback."""
    if os.environ.get("BUBBLESPEC_ALLOW_NO_NATIVE", "") in ("", "0"):
        assert NATIVE is not None


@needs_native
@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), params_strategy, st.integers(1, 6))
def test_high_fanout_agrees(seed, params, depth):
    """Hundreds of distinct tokens: branching states with many children (the native side's
    hashed transition tables, clones of them) answer as the reference does."""
    import random

    rnd = random.Random(seed)
    seqs = [[rnd.randrange(300) for _ in range(rnd.randrange(50, 400))] for _ in range(4)]
    logs = []
    for impl in implementations().values():
        idx = impl["SuffixIndex"](max_depth=depth)
        for i, s in enumerate(seqs[:3]):
            idx.add_sequence(i, "g", s)
        idx.add_sequence("live", "g", [], live=True)
        m = idx.matcher("g")
        log = []
        for j in range(0, len(seqs[3]), 2):
            idx.extend_sequence("live", seqs[3][j:j + 2])
            log.append(draft_tuple(m.speculate(seqs[3][j:j + 2], params)))
        occ, kids = m.continuations()
        log.append((occ, sorted(kids.items()), idx.count("g", seqs[0][:1]), len(idx.draft(
            "g", seqs[1][:5], params))))
        logs.append(log)
    assert logs[0] == logs[1]


@needs_native
def test_large_automata_agree():
    """Automata of tens of thousands of states (past the native rows' move from the heap to
    their own mapping, which then grows by mremap several times: native/src/rows.hpp),
    extended live, budget-evicted and rebuilt by a removal, answer as the reference does."""
    import random

    rnd = random.Random(7)
    base = [rnd.randrange(400) for _ in range(6000)]
    sibs = [[t if rnd.random() > 0.05 else rnd.randrange(400) for t in base] for _ in range(3)]
    params = DraftParams(max_spec_tokens=12, min_token_prob=0.05)
    logs = []
    for impl in implementations().values():
        # the live extends cross the budget: finished sequences of "g" are evicted mid-way
        idx = impl["SuffixIndex"](max_depth=32, token_budget=15000)
        for i, s in enumerate(sibs[:2]):
            idx.add_sequence(i, "g", s, to_global=True)
        idx.add_sequence("live", "g", [], live=True, to_global=True)
        m = idx.matcher("g", use_global=True)
        log = []
        for j in range(0, len(sibs[2]), 7):
            chunk = sibs[2][j:j + 7]
            idx.extend_sequence("live", chunk)
            d = m.speculate(chunk, params)
            if j % 210 == 0:
                log.append(draft_tuple(d))
        idx.remove_sequences([0])  # evicted from "g" by then, still global: a rebuild
        log.append(draft_tuple(m.speculate(sibs[2][:5], params)))
        idx.add_sequence(9, "h", base)  # a new group on a full budget
        log.append((idx.count("g", base[:3]), idx.count("h", base[:3]),
                    draft_tuple(idx.draft("h", base[100:120], params))))
        logs.append(log)
    assert len(logs) == 2 and logs[0] == logs[1]
