"""The per-step choice among draft sources: highest expected accepted length, deterministic,
never over budget, and a source that over-claims is demoted by its record, not switched off."""

from __future__ import annotations

import random

from bubblespec.core import DraftParams, SuffixIndex
from bubblespec.core.candidates import (
    Calibration,
    Candidate,
    DrafterStats,
    aligned_candidate,
    choose,
    expected_accepted,
)
from bubblespec.core.sources import DRAFTER_NAMES


def cand(source: str, n: int, p: float) -> Candidate:
    return Candidate(source, list(range(n)), [p ** (i + 1) for i in range(n)])


def test_highest_expected_accepted_length_wins() -> None:
    cal = Calibration()
    best, claim = choose([cand("group", 8, 0.5), cand("global", 3, 0.95)], 8, cal)
    assert best is not None and best.source == "global"
    assert abs(claim - sum(0.95 ** (i + 1) for i in range(3))) < 1e-12


def test_never_exceeds_the_budget_and_cuts_before_comparing() -> None:
    cal = Calibration()
    for budget in range(6):
        best, claim = choose([cand("group", 10, 0.99), cand("global", 2, 0.999)], budget, cal)
        if budget == 0:
            assert best is None and claim == 0.0
            continue
        assert best is not None and len(best.token_ids) <= budget
        assert len(best.probs) == len(best.token_ids)
    # cut to 2 tokens the long confident draft no longer beats the slightly surer short one
    best, _ = choose([cand("group", 10, 0.99), cand("global", 2, 0.999)], 2, cal)
    assert best is not None and best.source == "global"


def test_deterministic_and_ties_by_source_order() -> None:
    cal = Calibration()
    cs = [cand("global", 4, 0.9), cand("group", 4, 0.9), aligned_candidate([1, 2, 3, 4], 0.9)]
    for _ in range(3):
        random.Random(1).shuffle(cs)
        best, _ = choose(cs, 4, cal)
        assert best is not None and best.source == "aligned"
    best, _ = choose([cand("global", 4, 0.9), cand("group", 4, 0.9)], 4, cal)
    assert best is not None and best.source == "group"
    assert DRAFTER_NAMES[0] == "aligned"


def test_empty_candidates_draft_nothing() -> None:
    assert choose([], 4, Calibration()) == (None, 0.0)
    assert choose([Candidate("group", [], [])], 4, Calibration()) == (None, 0.0)


def test_over_claiming_source_is_demoted_by_its_record() -> None:
    cal = Calibration()
    g, gl = cand("group", 4, 0.6), cand("global", 4, 0.8)
    assert choose([g, gl], 4, cal)[0].source == "global"  # type: ignore[union-attr]
    for _ in range(50):  # the global pool claims ~2.3 tokens per draft and delivers 0.2
        cal.record("global", expected_accepted(gl, 4, cal) / cal.ratio("global"), 4, 0)
        cal.record("global", 2.3, 4, 1) if _ % 5 == 0 else None
    assert cal.ratio("global") < 0.2
    assert choose([g, gl], 4, cal)[0].source == "group"  # type: ignore[union-attr]
    # it still wins where it alone drafts
    assert choose([gl], 4, cal)[0].source == "global"  # type: ignore[union-attr]


def test_aligned_rate_follows_its_record() -> None:
    cal = Calibration()
    r0 = cal.aligned_rate()
    for _ in range(20):
        cal.record("aligned", 0.0, 8, 8)  # fully accepted
    assert cal.aligned_rate() > r0
    for _ in range(1000):
        cal.record("aligned", 0.0, 8, 0)  # rejected at once
    assert cal.aligned_rate() < 0.2
    c = aligned_candidate([5, 6, 7], 0.5)
    assert c.probs == [0.5, 0.25, 0.125]


def test_source_stats_counters() -> None:
    st = DrafterStats()
    st.wins["group"] += 2
    st.drafted["group"] += 7
    st.accepted["group"] += 3
    st.empty += 1
    d = st.as_dict()
    assert d["group_wins"] == 2 and d["group_drafted"] == 7 and d["group_accepted"] == 3
    assert d["empty"] == 1 and d["aligned_wins"] == 0 and d["global_accepted"] == 0


def test_group_and_global_matchers_give_comparable_candidates() -> None:
    """The proposer's two matchers: the group one without the global pool and a global-only
    one; each candidate's probabilities are its path probabilities (non-increasing)."""
    idx = SuffixIndex(max_depth=16)
    idx.add_sequence("s", "g", [1, 2, 3, 4, 5, 6])
    idx.add_sequence("o", None, [1, 2, 3, 9, 9, 9, 1, 2, 3, 9], to_global=True)
    params = DraftParams(max_spec_tokens=4, max_spec_offset=4)
    gm = idx.matcher("g", [7, 1, 2], use_global=False)
    om = idx.matcher(None, [7, 1, 2])
    dg, do = gm.speculate([3], params), om.speculate([3], params)
    assert dg.token_ids[:3] == [4, 5, 6] and do.token_ids[0] == 9
    for d in (dg, do):
        assert all(a >= b for a, b in zip(d.probs, d.probs[1:]))
    best, _ = choose([Candidate("group", dg.token_ids, dg.probs),
                      Candidate("global", do.token_ids, do.probs)], 4, Calibration())
    assert best is not None and best.source == "group"
