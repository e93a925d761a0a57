"""The aligned pre-generated draft in the proposer: followed while the output equals it,
dropped at a divergence, resumed when the output re-joins it at the same positions (keyed
noise is keyed by position), never for a shifted re-join."""

from __future__ import annotations

from bubblespec.core.batch import RESYNC, Request, follow_aligned

AL = list(range(100, 140))


def req() -> Request:
    return Request(group="g", seq_id=("out", "r", 0), matcher=None, aligned=list(AL))


def step(st: Request, sampled: list[int], budget: int = 3) -> list[int]:
    return follow_aligned(st, sampled, budget)


def test_follows_the_aligned_response_while_equal() -> None:
    st = req()
    assert step(st, [100]) == [101, 102, 103]
    assert step(st, [101, 102, 103, 104]) == [105, 106, 107]  # 3 accepted + bonus


def test_divergence_drops_it_until_a_same_position_rejoin() -> None:
    st = req()
    step(st, AL[:5])
    assert step(st, [7]) == []  # position 5 differs
    for i in range(6, 6 + RESYNC - 1):
        assert step(st, [AL[i]]) == []  # not enough matching context yet
    i = 6 + RESYNC - 1
    assert step(st, [AL[i]]) == AL[i + 1: i + 4]  # re-joined at the same positions


def test_shifted_rejoin_does_not_resume() -> None:
    st = req()
    step(st, AL[:5])
    step(st, [7])  # an inserted token: the output is now AL shifted by one
    for i in range(5, 5 + 2 * RESYNC):
        assert step(st, [AL[i]]) == []
