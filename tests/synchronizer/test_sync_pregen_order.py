"""Pre-generation queue order: longest predicted responses first within breadth-first rounds,
predictions from complete pre-generated responses (earlier epochs and this very queue)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from bubblespec.protocol.domain import PregenTask
from bubblespec.synchronizer.pregen import LengthPredictor, TaskQueue

from .helpers import make_tasks


def keys(tasks: Sequence[PregenTask]) -> list[tuple[str, int]]:
    return [(t.prompt_key, t.sample_index) for t in tasks]


def test_without_predictions_it_is_breadth_first() -> None:
    q = TaskQueue(1, make_tasks(3, 2), LengthPredictor())
    assert keys(q.claim("a", 6)) == [(f"p{p}", s) for s in range(2) for p in range(3)]


def test_prompts_seen_long_in_an_earlier_epoch_go_first() -> None:
    lp = LengthPredictor()
    for length in (10, 30):
        lp.observe("p2", length)  # mean 20
    lp.observe("p0", 5)
    q = TaskQueue(1, make_tasks(3, 2), lp)
    # p1 never seen: predicted the mean of all lengths (15), between p2 (20) and p0 (5)
    assert keys(q.claim("a", 3)) == [("p2", 0), ("p1", 0), ("p0", 0)]
    assert q.release("a") == 3  # requeued tasks keep the order
    assert keys(q.claim("b", 6)) == [("p2", 0), ("p1", 0), ("p0", 0),
                                     ("p2", 1), ("p1", 1), ("p0", 1)]


def test_depth_takes_several_samples_of_a_prompt_per_round() -> None:
    lp = LengthPredictor()
    lp.observe("p1", 50)
    lp.observe("p0", 10)
    q = TaskQueue(1, make_tasks(2, 4), lp, depth=2)
    assert keys(q.claim("a", 8)) == [("p1", 0), ("p1", 1), ("p0", 0), ("p0", 1),
                                     ("p1", 2), ("p1", 3), ("p0", 2), ("p0", 3)]


def test_without_history_a_completed_sample_moves_its_prompt_back() -> None:
    q = TaskQueue(1, make_tasks(3, 3), LengthPredictor())
    assert keys(q.claim("a", 3)) == [("p0", 0), ("p1", 0), ("p2", 0)]
    assert q.complete(("p1", 0), 10)
    assert q.complete(("p2", 0), 90)
    assert not q.complete(("p2", 0), 90)  # once only, and observed once
    assert keys(q.claim("b", 6)) == [("p0", 1), ("p2", 1), ("p1", 1),
                                     ("p0", 2), ("p2", 2), ("p1", 2)]
    assert (q.queued, q.claimed, q.completed) == (0, 7, 2)


def test_a_long_completed_sample_moves_its_siblings_up() -> None:
    lp = LengthPredictor()
    for p in ("p0", "p1", "p2"):
        lp.observe(p, 20)
    q = TaskQueue(1, make_tasks(3, 2), lp)
    assert keys(q.claim("a", 3)) == [("p0", 0), ("p1", 0), ("p2", 0)]
    assert q.complete(("p2", 0), 80)  # p2 now 50 on average, ahead of p0 and p1
    assert keys(q.claim("b", 3)) == [("p2", 1), ("p0", 1), ("p1", 1)]


def test_predictor_keeps_recent_and_bounded() -> None:
    lp = LengthPredictor(keep=2, max_prompts=2)
    assert lp.predict("x") is None and lp.mean() == float("inf")
    for length in (100, 4, 6):
        lp.observe("a", length)
    assert lp.predict("a") == 5.0  # the last two
    lp.observe("b", 1)
    lp.observe("c", 1)
    assert len(lp) == 2 and lp.predict("b") == 1.0 and lp.predict("a") is None
    assert lp.mean() == 112 / 5
    with pytest.raises(ValueError, match="depth"):
        TaskQueue(1, (), lp, depth=0)
