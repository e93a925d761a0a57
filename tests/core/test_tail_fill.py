"""The tail-fill lane allowance (`core/tail_fill.py`): the largest lane count whose modelled
forward stays within the budget, never more, and none without own sequences or budget."""

from __future__ import annotations

import pytest

from bubblespec.core.engine_time import EngineTime
from bubblespec.core.tail_fill import lanes_within

ET = EngineTime.preset("h100")


@pytest.mark.parametrize("own", [1, 3, 16, 64, 250])
@pytest.mark.parametrize("budget", [0.01, 0.05, 0.2, 1.0])
@pytest.mark.parametrize("lane_ctx", [200, 2048, 9000])
def test_the_allowance_is_the_largest_count_within_the_budget(own, budget, lane_ctx):
    own_ctx = own * 1500
    n = lanes_within(ET, budget, own, own_ctx, 9, lane_ctx, 64)
    allowed = (1 + budget) * ET.forward(own, own_ctx)
    assert 0 <= n <= 64
    assert ET.forward(own + 9 * n, own_ctx + n * lane_ctx) <= allowed
    if n < 64:  # one lane more would break the budget
        assert ET.forward(own + 9 * (n + 1), own_ctx + (n + 1) * lane_ctx) > allowed


def test_none_without_budget_own_sequences_or_room():
    assert lanes_within(ET, 0.0, 4, 4000, 9, 600, 64) == 0
    assert lanes_within(ET, 0.05, 0, 0, 9, 600, 64) == 0
    assert lanes_within(ET, 0.05, 4, 4000, 9, 600, 0) == 0


def test_the_allowance_grows_with_the_budget_and_shrinks_with_lane_context():
    by_budget = [lanes_within(ET, b, 2, 3000, 9, 2048, 64) for b in (0.01, 0.05, 0.1, 0.5)]
    assert by_budget == sorted(by_budget) and by_budget[0] < by_budget[-1]
    by_ctx = [lanes_within(ET, 0.1, 2, 3000, 9, c, 64) for c in (256, 2048, 16384)]
    assert by_ctx == sorted(by_ctx, reverse=True) and by_ctx[0] > by_ctx[-1]


def test_a_memory_bound_forward_has_room_a_compute_bound_one_little():
    """Below the ridge extra lanes cost little (the weight read dominates); far above it
    each token costs its FLOPs, so the same budget buys fewer lanes."""
    memory_bound = lanes_within(ET, 0.05, 2, 2000, 9, 600, 64)
    assert memory_bound >= 2
    compute_bound = ET.with_overrides(t_fixed=1e-4, ridge=0.0)
    assert lanes_within(compute_bound, 0.05, 2, 2000, 9, 600, 64) < memory_bound
