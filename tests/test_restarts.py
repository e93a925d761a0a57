"""`bubblespec.restarts.RestartWindow`: the restart budget is a rate (a sliding window over
an injected clock), not a lifetime count."""

from __future__ import annotations

import pytest

from bubblespec.restarts import RestartWindow


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_spent_after_limit_restarts_within_the_window() -> None:
    clock = Clock()
    w = RestartWindow(3, 600.0, clock)
    for i in range(3):
        assert not w.spent()
        assert w.record() == i + 1
        clock.now += 10
    assert w.spent() and w.count() == 3 and w.total == 3


def test_old_restarts_leave_the_window() -> None:
    clock = Clock()
    w = RestartWindow(2, 60.0, clock)
    w.record()
    clock.now += 30
    w.record()
    assert w.spent()
    clock.now += 30  # the first restart is exactly one window old: out
    assert w.count() == 1 and not w.spent()
    w.record()
    assert w.spent()
    clock.now += 30.001
    assert w.count() == 1


def test_deaths_spread_out_never_spend_the_budget() -> None:
    clock = Clock()
    w = RestartWindow(1, 100.0, clock)
    for _ in range(50):  # one death every 101 s, forever
        assert not w.spent()
        w.record()
        clock.now += 101
    assert w.total == 50 and w.count() == 0


def test_zero_limit_is_spent_at_once() -> None:
    w = RestartWindow(0, 600.0, Clock())
    assert w.spent()


def test_bad_budgets_are_refused() -> None:
    with pytest.raises(ValueError, match="limit"):
        RestartWindow(-1, 10.0)
    with pytest.raises(ValueError, match="window_s"):
        RestartWindow(1, 0.0)
    assert RestartWindow(3, 600.0).describe() == "3 restart(s) per 600 s"
