"""Randomized property tests: SuffixIndex against the brute-force ReferenceIndex.

Small vocabularies (2-5 tokens) and short sequences make repeats, branching, clones and
end-of-sequence occurrences frequent; ``max_depth`` is small so the depth cap and the sliding
draft window are exercised.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bubblespec.core import DraftParams, ReferenceIndex, SuffixIndex

SETTINGS = settings(max_examples=200, deadline=None)


def seqs_strategy(vocab: int, max_len: int = 24, max_seqs: int = 5):
    seq = st.lists(st.integers(0, vocab - 1), max_size=max_len)
    # (group 0/1, to_global, tokens)
    return st.lists(st.tuples(st.integers(0, 1), st.booleans(), seq), min_size=1,
                    max_size=max_seqs)


params_strategy = st.builds(
    DraftParams,
    max_spec_tokens=st.integers(0, 10),
    max_spec_factor=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
    max_spec_offset=st.sampled_from([-1.0, 0.0, 1.0, 3.0]),
    min_token_prob=st.sampled_from([0.0, 0.05, 0.1, 0.3, 0.6]),
    use_tree=st.booleans(),
    search_shorter=st.booleans(),
)


@st.composite
def scenario(draw):
    vocab = draw(st.integers(2, 5))
    depth = draw(st.integers(1, 8))
    seqs = draw(seqs_strategy(vocab))
    ctx = draw(st.lists(st.integers(0, vocab - 1), max_size=16))
    compact = draw(st.booleans())
    return vocab, depth, seqs, ctx, compact


@st.composite
def sibling_scenario(draw):
    """RL-like: siblings copied from one base with random edits, the context taken from a
    sibling, so long shared stretches, forks and shorter-but-better matches are common."""
    vocab = draw(st.integers(3, 8))
    depth = draw(st.integers(2, 10))
    base = draw(st.lists(st.integers(0, vocab - 1), min_size=4, max_size=30))
    seqs = []
    for _ in range(draw(st.integers(2, 5))):
        sib = list(base)
        for _ in range(draw(st.integers(0, 3))):
            i = draw(st.integers(0, len(sib) - 1))
            sib[i] = draw(st.integers(0, vocab - 1))
        seqs.append((0, draw(st.booleans()), sib))
    src = seqs[draw(st.integers(0, len(seqs) - 1))][2]
    cut = draw(st.integers(1, len(src)))
    ctx = src[max(0, cut - draw(st.integers(1, 12))):cut]
    return vocab, depth, seqs, ctx, draw(st.booleans())


def build(depth: int, seqs, compact: bool = False) -> tuple[SuffixIndex, ReferenceIndex]:
    idx = SuffixIndex(max_depth=depth, compact=compact)
    ref = ReferenceIndex(depth)
    for i, (g, to_global, toks) in enumerate(seqs):
        idx.add_sequence(i, g, toks, to_global=to_global)
        ref.add(i, g, toks, to_global)
    return idx, ref


@SETTINGS
@given(scenario())
def test_counts_and_longest_match(sc):
    _, depth, seqs, ctx, compact = sc
    idx, ref = build(depth, seqs, compact)
    for g in (0, 1, None):
        assert idx.longest_match(g, ctx) == ref.longest_match(g, ctx)
        # every substring (<= depth + 1 tokens) of the context and of the stored sequences
        probes = [ctx] + [s for _, _, s in seqs]
        for s in probes:
            for i in range(len(s) + 1):
                for k in range(min(depth + 1, len(s) - i) + 1):
                    assert idx.count(g, s[i:i + k]) == ref.count(g, s[i:i + k])


@SETTINGS
@given(scenario())
def test_matcher_continuations(sc):
    _, depth, seqs, ctx, compact = sc
    idx, ref = build(depth, seqs, compact)
    m = idx.matcher(0, ctx)
    l = m.match_len
    assert l == ref.longest_match(0, ctx)
    total, nxt = m.continuations()
    window = ctx[len(ctx) - l:] if l else []
    rtotal, rnxt = ref.continuations(0, window)
    assert total == ref.count(0, window)
    assert rtotal == total or not window
    assert {c: k for c, k in nxt.items()} == dict(rnxt)
    assert sum(nxt.values()) <= total


@SETTINGS
@given(st.one_of(scenario(), sibling_scenario()), params_strategy)
def test_drafts_equal_reference(sc, params):
    _, depth, seqs, ctx, compact = sc
    idx, ref = build(depth, seqs, compact)
    for g in (0, 1):
        got = idx.draft(g, ctx, params)
        want = ref.draft(g, ctx, params)
        assert got == want
        assert idx.matcher(g, ctx).draft(params) == want


def check_tree(d, ref: ReferenceIndex, group, ctx, params: DraftParams) -> None:
    """Structural and probabilistic checks of a tree draft against reference counts."""
    n = len(d.token_ids)
    assert n == len(d.parents) == len(d.probs)
    assert n <= params.budget(d.match_len)
    assert d.score == pytest.approx(sum(d.probs))
    seen = set()
    paths: list[list[int]] = []
    base = list(ctx[len(ctx) - d.match_len:]) if d.match_len else []
    for i, (tok, par, p) in enumerate(zip(d.token_ids, d.parents, d.probs)):
        assert -1 <= par < i  # parents come first
        assert (par, tok) not in seen  # distinct children
        seen.add((par, tok))
        prefix = [] if par < 0 else paths[par]
        window = (base + prefix)[-ref.max_depth:] if base + prefix else []
        total, nxt = ref.conditional(group, window)
        parent_p = 1.0 if par < 0 else d.probs[par]
        assert nxt[tok] > 0
        assert p == pytest.approx(parent_p * nxt[tok] / total)
        assert p >= params.min_token_prob
        assert p <= parent_p + 1e-12
        paths.append(prefix + [tok])


@SETTINGS
@given(scenario(), params_strategy)
def test_tree_draft_structure(sc, params):
    _, depth, seqs, ctx, compact = sc
    tree = DraftParams(params.max_spec_tokens, params.max_spec_factor,
                       params.max_spec_offset, params.min_token_prob, use_tree=True,
                       search_shorter=params.search_shorter)
    idx, ref = build(depth, seqs, compact)
    d = idx.draft(0, ctx, tree, use_global=False)
    check_tree(d, ref, 0, ctx, tree)
    # from the same match, the best-first tree starts with the greedy path's first token
    # (the most likely child), and scores at least as much as the path (same budget)
    one = DraftParams(params.max_spec_tokens, params.max_spec_factor,
                      params.max_spec_offset, params.min_token_prob, search_shorter=False)
    p = idx.draft(0, ctx, one, use_global=False)
    t = idx.draft(0, ctx, DraftParams(*[getattr(one, f) for f in (
        "max_spec_tokens", "max_spec_factor", "max_spec_offset", "min_token_prob")],
        use_tree=True, search_shorter=False), use_global=False)
    assert t.match_len == p.match_len
    if len(p):
        assert t.token_ids[0] == p.token_ids[0] and t.probs[0] == p.probs[0]
    assert t.score >= p.score - 1e-9


# op: ("ext", seq, tokens) extends a live sibling; ("adv", tokens) advances the request;
# ("acc", k, bonus) accepts k tokens of the current draft plus a bonus token; with
# ``self_live`` the request's own output is also a live sequence of the group (as the rank
# proposer stores it), extended before the matcher at every step.
op_strategy = st.one_of(
    st.tuples(st.just("ext"), st.integers(0, 2), st.lists(st.integers(0, 3), min_size=1,
                                                            max_size=3)),
    st.tuples(st.just("adv"), st.lists(st.integers(0, 3), min_size=1, max_size=3)),
    st.tuples(st.just("acc"), st.integers(0, 6), st.integers(0, 3)),
)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.lists(st.tuples(st.integers(0, 1), st.booleans(),
                                             st.lists(st.integers(0, 3), max_size=6)),
                                   min_size=3, max_size=3),
       st.lists(op_strategy, max_size=30), params_strategy, st.booleans(), st.booleans())
def test_live_extension_while_matching(depth, live, ops, params, compact, self_live):
    idx = SuffixIndex(max_depth=depth, compact=compact)
    ref = ReferenceIndex(depth)
    for i, (g, to_global, toks) in enumerate(live):
        idx.add_sequence(i, g, toks, live=True, to_global=to_global)
        ref.add(i, g, toks, to_global)
    if self_live:
        idx.add_sequence("self", 0, [], live=True)
        ref.add("self", 0, [])
    m = idx.matcher(0)
    ctx: list[int] = []

    def emit(new: list[int]) -> None:
        if self_live:
            idx.extend_sequence("self", new)
            ref.extend("self", new)
        m.extend(new)
        ctx.extend(new)

    for op in ops:
        if op[0] == "ext":
            idx.extend_sequence(op[1], op[2])
            ref.extend(op[1], op[2])
        elif op[0] == "adv":
            emit(op[1])
        else:
            d = m.draft(params)
            emit(d.token_ids[:op[1]] + [op[2]] if not params.use_tree else [op[2]])
        assert m.match_len == ref.longest_match(0, ctx)
        assert m.global_match_len == ref.longest_match(None, ctx)
        assert m.draft(params) == ref.draft(0, ctx, params)


@settings(max_examples=100, deadline=None)
@given(scenario(), st.sets(st.integers(0, 4)), params_strategy)
def test_removal_equals_rebuild(sc, remove, params):
    _, depth, seqs, ctx, compact = sc
    idx, _ = build(depth, seqs, compact)
    before = {g: idx.matcher(g, ctx) for g in (0, 1)}
    gone = [i for i in remove if i < len(seqs)]
    idx.remove_sequences(gone)
    kept = [s if i not in gone else None for i, s in enumerate(seqs)]
    fresh, ref = build(depth, [s for s in kept if s is not None], compact)
    for g in (0, 1, None):
        assert idx.longest_match(g, ctx) == ref.longest_match(g, ctx)
        assert idx.count(g, ctx[-2:]) == ref.count(g, ctx[-2:])
        assert set(idx.sequence_ids(g)) == {
            i for i, s in enumerate(seqs)
            if i not in gone and (s[0] == g if g is not None else s[1])}
    for g in (0, 1):
        want = ref.draft(g, ctx, params)
        assert idx.draft(g, ctx, params) == want == fresh.draft(g, ctx, params)
        assert before[g].draft(params) == want  # matchers made before removal re-sync
        assert before[g].match_len == ref.longest_match(g, ctx)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.lists(st.integers(0, 3), max_size=12)),
                min_size=1, max_size=12),
       st.integers(5, 40), st.integers(1, 6), st.lists(st.integers(0, 3), max_size=8))
def test_eviction_keeps_budget_and_equals_rebuild(adds, budget, depth, ctx):
    idx = SuffixIndex(max_depth=depth, token_budget=budget, global_token_budget=budget)
    last_use: dict[int, int] = {}
    for i, (g, toks) in enumerate(adds):
        idx.add_sequence(i, g, toks, to_global=True)
        last_use[g] = i
        assert idx.num_tokens <= budget
        assert idx.num_global_tokens <= budget
        if len(toks) <= int(budget * idx.low_water):  # evictions drop older data first
            assert i in idx.sequence_ids(g) and i in idx.sequence_ids(None)
        # groups are kept in LRU order: the survivors are the most recently written ones
        alive = idx.groups()
        assert alive == sorted(alive, key=lambda k: last_use[k])
    ref = ReferenceIndex(depth)
    for g in idx.groups():
        for sid in idx.sequence_ids(g):
            ref.add(sid, g, idx.sequence_tokens(sid))
    for sid in idx.sequence_ids(None):
        ref.add(("global", sid), None, idx.sequence_tokens(sid))
    assert idx.num_tokens == sum(len(s) for g in idx.groups() for s in ref.seqs(g))
    params = DraftParams(max_spec_tokens=6, max_spec_offset=2.0, min_token_prob=0.05)
    for g in idx.groups():
        assert idx.longest_match(g, ctx) == ref.longest_match(g, ctx)
        assert idx.draft(g, ctx, params) == ref.draft(g, ctx, params)
    assert idx.longest_match(None, ctx) == ref.longest_match(None, ctx)
    for t in range(4):
        assert idx.count(None, [t]) == ref.count(None, [t])
