"""API behaviour of the draft index: argument errors, lifecycle, eviction rules, examples."""

from __future__ import annotations

import numpy as np
import pytest

from bubblespec.core import Draft, DraftParams, ReferenceIndex, SuffixIndex


def test_example_path_and_tree_draft():
    idx = SuffixIndex(max_depth=8)
    idx.add_sequence("a", "g", [1, 2, 3, 4, 5])
    idx.add_sequence("b", "g", [1, 2, 3, 4, 6])
    idx.add_sequence("c", "g", [1, 2, 3, 7])
    p = DraftParams(max_spec_tokens=4, max_spec_factor=2.0, min_token_prob=0.1)
    d = idx.draft("g", [9, 2, 3], p)
    # "2 3" occurs 3 times, followed by 4 (twice) and 7 (once)
    assert d == Draft([4, 5], [-1, 0], [2 / 3, 1 / 3], 1.0, 2)
    t = idx.draft("g", [9, 2, 3], DraftParams(4, 2.0, 0.0, 0.1, use_tree=True))
    assert t.token_ids == [4, 7, 5, 6] and t.parents == [-1, -1, 0, 0]
    assert t.probs == pytest.approx([2 / 3, 1 / 3, 1 / 3, 1 / 3])


def test_max_tokens_grows_with_match_length():
    idx = SuffixIndex(max_depth=16)
    idx.add_sequence(0, "g", list(range(40)))
    p = DraftParams(max_spec_tokens=10, max_spec_factor=0.5, max_spec_offset=1.0)
    for m in (1, 2, 4, 8, 12):
        d = idx.draft("g", list(range(20 - m, 20)), p)
        assert d.match_len == m
        assert len(d) == min(10, int(m * 0.5 + 1.0))
        assert d.token_ids == list(range(20, 20 + len(d)))


def test_draft_continues_past_max_depth_with_a_sliding_window():
    idx = SuffixIndex(max_depth=4)
    seq = list(range(100))
    idx.add_sequence(0, "g", seq)
    d = idx.draft("g", seq[:10], DraftParams(max_spec_tokens=30, max_spec_factor=10.0))
    assert d.match_len == 4 and d.token_ids == seq[10:40]


def test_a_shorter_match_with_more_evidence_can_win():
    idx = SuffixIndex(max_depth=8)
    idx.add_sequence("a", "g", [9, 1, 2, 3, 5])
    idx.add_sequence("b", "g", [9, 1, 2, 3, 6])
    for i in range(3):
        idx.add_sequence(("c", i), "g", [1, 2, 3, 7, 7, 7, 7])
    p = DraftParams(max_spec_tokens=4, min_token_prob=0.0)
    d = idx.draft("g", [9, 1, 2, 3], p)
    # "9 1 2 3": 5 or 6 at 1/2, then the sequence ends (score 0.5); "1 2 3": 7 at 3/5, 7, 7
    assert d == Draft([7, 7, 7], [-1, 0, 1], [0.6, 0.6, 0.6], 0.6 * 3, 3)
    p1 = DraftParams(max_spec_tokens=4, min_token_prob=0.0, search_shorter=False)
    assert idx.draft("g", [9, 1, 2, 3], p1) == Draft([5], [-1], [0.5], 0.5, 4)


def test_a_shorter_match_with_a_weak_first_token_still_counts():
    idx = SuffixIndex(max_depth=8)
    idx.add_sequence("a", "g", [5, 1, 2])
    for x in range(10):
        idx.add_sequence(x, "g", [1, 2, 20 + x])
    # "5 1 2" ends its sequence (score 0); "1 2" goes on to 10 tokens at 1/11 each
    d = idx.draft("g", [5, 1, 2], DraftParams(max_spec_tokens=4, min_token_prob=0.05))
    assert d == Draft([20], [-1], [1 / 11], 1 / 11, 2)


def test_shorter_match_search_is_exact_near_the_budget_bound():
    idx = SuffixIndex(max_depth=8)
    idx.add_sequence("a", "g", [9, 1, 2, 3, 4, 5, 5, 5, 5])
    idx.add_sequence("b", "g", [9, 1, 2, 3, 4, 5, 5, 5, 6])
    idx.add_sequence("c", "g", [1, 2, 3, 4, 5, 5, 5, 5])
    idx.add_sequence("d", "g", [1, 2, 3, 4, 5, 5, 5, 5])
    p = DraftParams(max_spec_tokens=4, min_token_prob=0.0)
    # longest match (5 tokens) scores 1 + 1 + 1 + 0.5; "1 2 3 4" scores 1 + 1 + 1 + 0.75
    d = idx.draft("g", [9, 1, 2, 3, 4], p)
    assert (d.match_len, d.score, d.token_ids) == (4, 3.75, [5, 5, 5, 5])


def test_group_vs_global_takes_the_better_score():
    idx = SuffixIndex(max_depth=8)
    idx.add_sequence("g1", "g", [1, 2, 3, 4])
    idx.add_sequence("x", None, [1, 2, 3, 9, 9, 9, 9], to_global=True)
    p = DraftParams(max_spec_tokens=4, max_spec_factor=2.0, min_token_prob=0.0)
    d = idx.draft("g", [1, 2, 3], p)
    assert d.token_ids == [9, 9, 9, 9]  # global path is longer: score 4 > 1
    assert idx.draft("g", [1, 2, 3], p, use_global=False).token_ids == [4]


def test_matcher_sees_a_longer_match_created_by_a_live_sibling():
    idx = SuffixIndex(max_depth=8)
    idx.add_sequence("sib", "g", [5], live=True)
    m = idx.matcher("g", [7, 5])
    assert m.match_len == 1
    idx.extend_sequence("sib", [6])  # sib = 5 6: no longer match for "7 5"
    assert m.match_len == 1
    idx.add_sequence("other", "g", [7, 5, 1], live=True)
    assert m.match_len == 2
    m.advance(1)
    assert m.match_len == 3 and m.continuations() == (1, {})


def test_numpy_tokens_and_validation():
    idx = SuffixIndex(max_depth=4)
    idx.add_sequence(0, "g", np.array([1, 2, 3], dtype=np.int64))
    m = idx.matcher("g", np.array([1, 2], dtype=np.int32))
    assert m.match_len == 2
    m.extend([np.int64(3)])
    assert m.match_len == 3
    for bad in ([1.5], [-1], ["a"], [2**31]):
        with pytest.raises(ValueError):
            idx.add_sequence(("bad", str(bad)), "g", bad)
        with pytest.raises(ValueError):
            m.extend(bad)
    assert m.match_len == 3  # a rejected extend leaves the state alone


def test_argument_errors():
    with pytest.raises(ValueError):
        SuffixIndex(max_depth=0)
    with pytest.raises(ValueError):
        SuffixIndex(token_budget=0)
    with pytest.raises(ValueError):
        SuffixIndex(low_water=1.5)
    for kw in ({"max_spec_tokens": -1}, {"min_token_prob": 1.5}, {"max_spec_factor": -1.0},
               {"max_spec_offset": float("nan")}):
        with pytest.raises(ValueError):
            DraftParams(**kw)
    idx = SuffixIndex()
    idx.add_sequence(1, "g", [1, 2])
    with pytest.raises(ValueError, match="already exists"):
        idx.add_sequence(1, "g", [3])
    with pytest.raises(ValueError, match="finished"):
        idx.extend_sequence(1, [3])
    with pytest.raises(ValueError, match="unknown"):
        idx.extend_sequence(2, [3])
    with pytest.raises(ValueError, match="unknown"):
        idx.remove_sequence(2)
    with pytest.raises(ValueError, match="unknown"):
        idx.remove_group("nope")
    with pytest.raises(ValueError, match="to_global"):
        idx.add_sequence(3, None, [1])
    with pytest.raises(ValueError, match="max_depth"):
        idx.count("g", [1] * 70)
    with pytest.raises(ValueError, match="hashable"):
        idx.add_sequence([1], "g", [1])
    with pytest.raises(ValueError, match="hashable"):
        idx.matcher(["g"])


def test_live_lifecycle_and_removal():
    idx = SuffixIndex(max_depth=6)
    idx.add_sequence("a", "g", [1, 2], live=True, to_global=True)
    idx.extend_sequence("a", [3, 4])
    assert idx.sequence_tokens("a") == [1, 2, 3, 4]
    assert idx.count("g", [2, 3]) == 1 and idx.count(None, [3, 4]) == 1
    idx.finish_sequence("a")
    with pytest.raises(ValueError):
        idx.extend_sequence("a", [5])
    idx.add_sequence("b", "g", [2, 3, 9])
    m = idx.matcher("g", [2, 3])
    assert m.continuations() == (2, {4: 1, 9: 1})
    idx.remove_sequence("a")
    assert m.continuations() == (1, {9: 1})
    assert idx.count(None, [3]) == 0 and idx.num_global_tokens == 0
    idx.remove_group("g")
    assert idx.groups() == [] and idx.num_tokens == 0
    assert m.match_len == 0 and len(m.draft()) == 0
    idx.add_sequence("c", "g", [2, 3, 8])  # the matcher follows the re-created group
    assert m.match_len == 2 and m.continuations() == (1, {8: 1})
    idx.matcher("empty")
    assert "empty" in idx.groups()
    idx.remove_group("empty")
    assert "empty" not in idx.groups()


def test_live_sequences_are_never_evicted():
    idx = SuffixIndex(max_depth=4, token_budget=10)
    idx.add_sequence("live", "a", [1] * 6, live=True)
    idx.add_sequence("old", "b", [2] * 3)
    idx.add_sequence("new", "c", [3] * 4)  # 13 > 10: "b" (LRU, finished) goes, "a" stays
    assert idx.groups() == ["a", "c"] and idx.num_tokens == 10
    idx.extend_sequence("live", [1] * 6)  # 16 > 10: only "c" can go
    assert idx.groups() == ["a"] and idx.sequence_ids("a") == ["live"]
    assert idx.num_tokens == 12  # live data alone may exceed the budget
    idx.finish_sequence("live")
    idx.add_sequence("x", "a", [4])  # now the oldest finished sequences of "a" go
    assert idx.sequence_ids("a") == ["x"]


def test_eviction_order_is_least_recently_used():
    idx = SuffixIndex(max_depth=4, token_budget=9)
    for g in "abc":
        idx.add_sequence(g, g, [1, 2, 3])
    idx.matcher("a")  # using a group makes it recent
    idx.add_sequence("d", "d", [4, 5, 6])
    assert idx.groups() == ["c", "a", "d"]


def test_compact_mode_gives_identical_answers():
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 6, size=200).tolist() for _ in range(5)]
    a, b = SuffixIndex(16), SuffixIndex(16, compact=True)
    ref = ReferenceIndex(16)
    for i, s in enumerate(seqs):
        a.add_sequence(i, "g", s)
        b.add_sequence(i, "g", s)
        ref.add(i, "g", s)
    p = DraftParams(max_spec_tokens=8, max_spec_factor=2.0, min_token_prob=0.05)
    for _ in range(20):
        ctx = rng.integers(0, 6, size=12).tolist()
        assert a.draft("g", ctx, p) == b.draft("g", ctx, p) == ref.draft("g", ctx, p)
    assert 0 < b.nbytes() < a.nbytes()


def test_high_fanout_states_match_reference():
    """Root and common-token states with many children (memoised best child, filtered
    tree expansion) against the reference, before and after the group grows."""
    rng = np.random.default_rng(1)
    idx, ref = SuffixIndex(max_depth=6), ReferenceIndex(6)
    for i in range(6):
        s = rng.integers(0, 40, size=80).tolist()
        idx.add_sequence(i, "g", s, live=True)
        ref.add(i, "g", s)
    for round_ in range(3):
        for tree in (False, True):
            for minp, offset in ((0.0, 2.0), (0.02, 2.0), (0.03, 6.0), (0.2, 2.0)):
                p = DraftParams(max_spec_tokens=12, max_spec_offset=offset,
                                min_token_prob=minp, use_tree=tree)
                for ctx in ([], [99], rng.integers(0, 40, size=5).tolist()):
                    assert idx.draft("g", ctx, p) == ref.draft("g", ctx, p)
        # a burst of one token changes the root's most frequent child: no stale memo
        extra = [39 - round_] * (60 * (round_ + 1)) + rng.integers(0, 40, size=10).tolist()
        idx.extend_sequence(round_, extra)
        ref.extend(round_, extra)
        p = DraftParams(max_spec_offset=1.0, min_token_prob=0.0)
        assert idx.draft("g", [], p).token_ids == [39 - round_]
