"""The streamed-branch threshold calibrated from flips (`core/branch_margin.py`): a flip's
window is exactly the thresholds whose first margin below them is the flip, checked against
a brute-force streaming rule on random drafts; the calibrator picks the threshold most flips
favour and forgets old steps."""

from __future__ import annotations

import math
import random

from bubblespec.core.branch_margin import (
    GRID,
    FlipWindow,
    MarginCalibrator,
    flip_window,
    running_minima,
)


def streamed_at(margins: list[float], m: float) -> int | None:
    """Brute force: where one branch is offered while the draft decodes at threshold m."""
    return next((p for p, x in enumerate(margins) if x < m), None)


def end_offer(margins: list[float]) -> int:
    return min(range(len(margins)), key=lambda p: (margins[p], p))


def test_windows_match_brute_force_streaming() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(1, 40)
        margins = [10 ** rng.uniform(-4, 1) for _ in range(n)]
        recs = running_minima(list(enumerate(margins)))
        complete = rng.random() < 0.7
        for at in range(n):
            w = flip_window(recs, at, complete)
            for m in GRID:
                s = streamed_at(margins, m)
                hit = 2 if s == at else (1 if s is None and complete
                                         and end_offer(margins) == at else 0)
                assert (0 if w is None else w.score(m)) == hit, (margins, at, m)


def test_running_minima_and_window_edges() -> None:
    recs = running_minima([(0, 0.9), (1, 1.2), (2, 0.3), (3, 0.3), (4, 0.01)])
    assert recs == [(0, 0.9), (2, 0.3), (4, 0.01)]
    assert flip_window(recs, 0, True) == FlipWindow(0.9, math.inf, False)
    assert flip_window(recs, 2, True) == FlipWindow(0.3, 0.9, False)
    assert flip_window(recs, 4, True) == FlipWindow(0.01, 0.3, True)
    assert flip_window(recs, 4, False) == FlipWindow(0.01, 0.3, False)  # cut short
    assert flip_window(recs, 3, True) is None  # an earlier position's margin is smaller


def test_calibrator_picks_the_threshold_most_flips_favour() -> None:
    cal = MarginCalibrator(steps=2)
    assert cal.threshold() == 0.0  # no flip yet: offers at complete drafts only
    cal.observe(1, FlipWindow(0.002, 0.02, True))  # ends only: thresholds <= 0.002 reach it
    assert cal.threshold() == min(m for m in GRID if m > 0.002)
    cal.observe(1, FlipWindow(0.05, 0.3, False))
    cal.observe(1, FlipWindow(0.08, 0.5, False))
    cal.observe(1, None)
    assert 0.08 < cal.threshold() <= 0.3 and (cal.flips, cal.missed) == (4, 1)
    # two steps later the step-1 flips are forgotten: only the new one counts
    cal.observe(3, FlipWindow(1.5, math.inf, False))
    assert cal.windows() == [FlipWindow(1.5, math.inf, False)]
    assert 1.5 < cal.threshold() <= 2.2


def test_only_end_hits_keep_the_complete_draft_rule() -> None:
    cal = MarginCalibrator()
    cal.observe(0, FlipWindow(0.00001, 0.00005, True))  # below the grid: 0 scores best
    assert cal.threshold() == 0.0
