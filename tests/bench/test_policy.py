"""`bench policy`'s figures from samples: endings, lengths per number of operations, the
B0 reward and the share of groups whose rewards differ (the GRPO signal)."""

from __future__ import annotations

import pytest

from bubblespec.bench.policy import length_row, summarise, table


def test_length_row() -> None:
    r = length_row([10, 20, 30, 40])
    assert (r["count"], r["median"], r["max"], r["mean"]) == (4, 25.0, 40.0, 25.0)
    assert r["p90"] == 40.0 and r["cv"] == pytest.approx((125 ** 0.5) / 25)
    assert length_row([7])["cv"] == 0.0


def test_summarise_counts_endings_rewards_and_signal() -> None:
    samples = [
        {"group": 0, "steps": 1, "length": 40, "ended": True, "reward": 1.0},
        {"group": 0, "steps": 1, "length": 50, "ended": True, "reward": 0.0},
        {"group": 1, "steps": 4, "length": 120, "ended": True, "reward": 1.0},
        {"group": 1, "steps": 4, "length": 384, "ended": False, "reward": 1.0},
    ]
    fig = summarise(samples, 384)
    assert fig["ended_share"] == 0.75 and fig["reward"] == 0.75
    assert fig["groups_with_signal"] == 0.5  # group 0 differs, group 1 does not
    assert list(fig["by_steps"]) == [1, 4]
    assert fig["by_steps"][1]["median"] == 45.0 and fig["by_steps"][4]["max"] == 384.0
    text = table(fig)
    assert "75.0% end with <|im_end|> inside 384 tokens" in text and "B0 reward 0.750" in text
