"""Where responses leave their pre-generated drafts, by position class (`train/positions.py`):
exposure, flips and draft ends from each response's own counters, entropy per class and at
the flips, and the pooled table over steps."""

from __future__ import annotations

import pytest

from bubblespec.train.positions import (
    class_labels,
    entropy_by_position,
    format_pooled,
    pooled,
    position_class,
    survival_by_position,
)


def sample(length: int, div: int | None, ran_out: bool | None = None,
           acc_pregen: int = 0) -> dict:
    return {"output_ids": [7] * length, "first_divergence": div, "draft_ran_out": ran_out,
            "num_accepted_pregen_tokens": acc_pregen}


def test_classes_cover_every_position_once() -> None:
    assert class_labels() == ["0-31", "32-127", "128-255", "256+"]
    assert [position_class(p) for p in (0, 31, 32, 127, 128, 255, 256, 10_000)] == [
        0, 0, 1, 1, 2, 2, 3, 3]
    assert class_labels((10,)) == ["0-9", "10+"]


def test_survival_counts_exposure_up_to_the_divergence_and_the_kind_of_ending() -> None:
    rows = survival_by_position([
        sample(300, 40, ran_out=False),   # on its draft for 0-39, flipped at 40
        sample(200, 150, ran_out=True),   # on its draft for 0-149, the draft ended at 150
        sample(100, None, acc_pregen=60),  # followed its draft to the end: 0-99
        sample(500, None),                 # no aligned draft: left out
    ])
    assert [r["positions"] for r in rows] == class_labels()
    assert [r["exposed"] for r in rows] == [32 * 3, 8 + 96 + 68, 22, 0]
    assert [r["flips"] for r in rows] == [0, 1, 0, 0]
    assert [r["ran_out"] for r in rows] == [0, 0, 1, 0]
    assert rows[1]["survival"] == pytest.approx(1 - 1 / 172)
    assert rows[0]["survival"] == 1.0 and rows[3]["survival"] is None
    # a flip at position 0 is exposure 0 with one flip: survival is not defined by it alone
    only = survival_by_position([sample(10, 0, ran_out=False)])
    assert only[0]["flips"] == 1 and only[0]["exposed"] == 0 and only[0]["survival"] is None


def test_entropy_per_class_and_at_the_flips() -> None:
    ent = [[1.0] * 40 + [3.0] * 10, [0.5] * 20]
    e = entropy_by_position(ent, [40, None])
    assert e["tokens"] == 70 and e["mean"] == pytest.approx((40 + 30 + 10) / 70)
    assert [r["tokens"] for r in e["by_position"]] == [52, 18, 0, 0]
    assert e["by_position"][0]["mean"] == pytest.approx((32 + 10) / 52)
    assert e["by_position"][1]["mean"] == pytest.approx((8 + 30) / 18)
    assert e["by_position"][2]["mean"] is None
    assert e["at_flips"] == 3.0 and e["flips"] == 1
    assert entropy_by_position([], [])["mean"] is None


def test_pooled_sums_steps_after_the_first_and_weights_entropy_by_tokens() -> None:
    step = {"positions": survival_by_position([sample(64, 40, ran_out=False)]),
            "entropy": entropy_by_position([[1.0] * 64], [40])}
    other = {"positions": survival_by_position([sample(64, None, acc_pregen=10)]),
             "entropy": entropy_by_position([[2.0] * 16], [])}
    rows = pooled([{"step": 0, **other}, {"step": 1, **step}, {"step": 2, **other}])
    assert [r["exposed"] for r in rows] == [64, 40, 0, 0]
    assert rows[1]["flips"] == 1 and rows[1]["survival"] == pytest.approx(1 - 1 / 40)
    assert rows[0]["entropy"] == pytest.approx((32 * 1.0 + 16 * 2.0) / 48)
    assert rows[1]["entropy"] == 1.0 and rows[2]["entropy"] is None
    table = format_pooled(rows)
    assert "32-127" in table and "0.9750" in table
    assert pooled([]) == []
