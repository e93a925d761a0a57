"""Bubble figures from a synchronizer timeline."""

from __future__ import annotations

import pytest

from bubblespec.gateway.bubbles import step_bubbles
from bubblespec.protocol.domain import ShardAssignment, Span, SpanKind, StepTimeline

T0 = 1_000_000.0


def test_two_ranks_one_fast_one_slow() -> None:
    t = StepTimeline(
        step=3, opened_unix_s=T0, stop_unix_s=T0 + 10, closed_unix_s=T0 + 12,
        shards=[ShardAssignment("r0", 8), ShardAssignment("r1", 8)],
        spans={"r0": [Span(SpanKind.DECODE, T0, T0 + 4, 100),
                      Span(SpanKind.PREGEN, T0 + 4.5, T0 + 9.5, 300),
                      Span(SpanKind.IDLE, T0 + 9.5, T0 + 10)],
               "r1": [Span(SpanKind.DECODE, T0, T0 + 10, 250)]},
        done_unix_s={"r0": T0 + 4, "r1": T0 + 10})
    b = step_bubbles(t)
    assert b.complete and b.wall_s == pytest.approx(10)
    r0, r1 = b.ranks
    assert (r0.rank_id, r1.rank_id) == ("r0", "r1")
    assert r0.busy_s == pytest.approx(4) and r0.bubble_s == pytest.approx(6)
    assert r0.pregen_s == pytest.approx(5) and r0.idle_s == pytest.approx(1)
    assert r0.bubble_fraction == pytest.approx(0.6) and r0.pregen_share == pytest.approx(5 / 6)
    assert r0.pregen_tokens == 300 and r0.decode_tokens == 100 and r0.done_s == pytest.approx(4)
    assert r1.bubble_s == pytest.approx(0) and r1.bubble_fraction == 0 and r1.pregen_share == 0
    assert b.bubble_fraction == pytest.approx(6 / 20)
    assert b.pregen_share == pytest.approx(5 / 6)
    assert b.pregen_tokens == 300


def test_without_spans_done_times_give_busy_time() -> None:
    t = StepTimeline(step=0, opened_unix_s=T0, stop_unix_s=T0 + 8,
                     shards=[ShardAssignment("a", 1), ShardAssignment("b", 1),
                             ShardAssignment("idle", 0)],
                     done_unix_s={"a": T0 + 2, "b": T0 + 8, "idle": T0})
    b = step_bubbles(t)
    by = {r.rank_id: r for r in b.ranks}
    assert by["a"].busy_s == pytest.approx(2) and by["a"].bubble_s == pytest.approx(6)
    assert by["b"].bubble_s == pytest.approx(0)
    assert by["idle"].busy_s == 0 and by["idle"].bubble_fraction == pytest.approx(1)


def test_spans_are_clipped_to_the_step_and_open_steps_are_provisional() -> None:
    t = StepTimeline(step=1, opened_unix_s=T0, shards=[ShardAssignment("a", 1)],
                     spans={"a": [Span(SpanKind.DECODE, T0 - 5, T0 + 2),
                                  Span(SpanKind.PREGEN, T0 + 2, T0 + 100, 7)]})
    b = step_bubbles(t, now_unix_s=T0 + 4)
    assert not b.complete and b.wall_s == pytest.approx(4)
    a = b.ranks[0]
    assert a.busy_s == pytest.approx(2) and a.pregen_s == pytest.approx(2)
    assert a.idle_s == pytest.approx(0)


def test_zero_wall_is_not_a_division_by_zero() -> None:
    t = StepTimeline(step=1, opened_unix_s=T0, stop_unix_s=T0,
                     shards=[ShardAssignment("a", 0)], done_unix_s={"a": T0})
    b = step_bubbles(t)
    assert b.wall_s == 0 and b.bubble_fraction == 0 and b.ranks[0].bubble_fraction == 0


def test_tail_fill_is_counted_apart_from_the_bubble() -> None:
    """Pre-generation beside a rank's own requests (tail-fill) is inside its busy time: it
    neither shrinks nor fills the bubble, and is reported on its own."""
    t = StepTimeline(
        step=2, opened_unix_s=T0, stop_unix_s=T0 + 10,
        shards=[ShardAssignment("r0", 8), ShardAssignment("r1", 8)],
        spans={"r0": [Span(SpanKind.DECODE, T0, T0 + 6, 100),
                      Span(SpanKind.PREGEN_TAIL, T0 + 2, T0 + 6, 80),
                      Span(SpanKind.PREGEN, T0 + 6, T0 + 10, 200)],
               "r1": [Span(SpanKind.DECODE, T0, T0 + 10, 250)]},
        done_unix_s={"r0": T0 + 6, "r1": T0 + 10})
    b = step_bubbles(t)
    r0 = b.ranks[0]
    assert r0.busy_s == pytest.approx(6) and r0.bubble_s == pytest.approx(4)
    assert r0.pregen_s == pytest.approx(4) and r0.pregen_tokens == 200
    assert r0.tail_pregen_s == pytest.approx(4) and r0.tail_pregen_tokens == 80
    assert b.tail_pregen_tokens == 80 and b.pregen_tokens == 200
