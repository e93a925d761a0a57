"""`bubblespec train-demo`'s epoch curve: the reward per epoch of a run whose prompts repeat
(the same problems each epoch), its standard error, and the plot that carries it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bubblespec.train.compare import compare, load_log
from bubblespec.train.demo import DemoConfig, epoch_rewards, format_epochs, plot_rewards, write_log


def _records(rewards_per_step: list[list[list[float]]]) -> list[dict]:
    return [{"step": k, "mean_reward": sum(map(sum, g)) / sum(map(len, g)), "rewards": g}
            for k, g in enumerate(rewards_per_step)]


def test_epoch_means_and_standard_errors_pool_the_epochs_samples() -> None:
    recs = _records([[[0, 1], [0, 0]], [[1, 1], [0, 1]],   # epoch 0: 4 of 8
                     [[1, 1], [1, 0]], [[1, 1], [1, 1]],   # epoch 1: 7 of 8
                     [[0, 0], [0, 0]]])                    # cut short: left out
    rows = epoch_rewards(recs, 2)
    assert [r["epoch"] for r in rows] == [0, 1]
    assert [r["steps"] for r in rows] == [[0, 1], [2, 3]]
    assert [r["samples"] for r in rows] == [8, 8]
    assert rows[0]["mean"] == pytest.approx(0.5)
    assert rows[1]["mean"] == pytest.approx(7 / 8)
    # sample variance of four 1s and four 0s: 8 * 0.25 / 7; s.e. = sqrt(var / 8)
    assert rows[0]["se"] == pytest.approx(math.sqrt((8 * 0.25 / 7) / 8))
    text = format_epochs(rows)
    assert "0.500 +- 0.189" in text and "0.875" in text


def test_no_epochs_without_repeats_or_per_sample_rewards() -> None:
    recs = _records([[[1, 0]], [[0, 0]]])
    assert epoch_rewards(recs, 0) == []
    del recs[1]["rewards"]
    assert epoch_rewards(recs, 1) == []


def test_single_sample_epoch_has_no_standard_error() -> None:
    rows = epoch_rewards(_records([[[1.0]]]), 1)
    assert rows[0]["se"] is None and rows[0]["mean"] == 1.0
    assert "1.000 +- -" in format_epochs(rows)


def test_plot_carries_the_epoch_means(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    recs = _records([[[0, 1]], [[1, 1]], [[0, 0]], [[1, 0]]])
    path = tmp_path / "curve.png"
    assert plot_rewards(recs, path, "t", epoch_rewards(recs, 2))
    assert path.stat().st_size > 1000


def test_the_log_written_mid_run_is_whole_marked_partial_and_comparable(tmp_path: Path) -> None:
    """A long run writes its log after every step: a run that dies keeps its steps, the
    file is replaced whole (no temporary left behind), `complete` says whether the run
    finished, and `--compare` reads a partial log over the steps it has."""
    cfg = DemoConfig(steps=3, prompts=2, n=2, temperature=1.0, seed_mode="keyed", lr=1e-4,
                     seed=0, epoch_steps=0, ranks=1, model=None, rank_arg=[], gateway=None,
                     out=str(tmp_path), log_dir=None)
    recs = _records([[[0, 1], [0, 0]], [[1, 1], [0, 1]], [[1, 1], [1, 1]]])
    for r in recs:
        r["decode_steps_critical"] = 10
    assert write_log(tmp_path, cfg, "m", recs[:2], False) is None  # unpaced: no summary
    doc = load_log(tmp_path / "grpo_log.json")
    assert doc["complete"] is False and len(doc["steps"]) == 2
    assert doc["config"]["steps"] == 3 and doc["model"] == "m"
    assert [p.name for p in tmp_path.iterdir()] == ["grpo_log.json"]
    full = dict(doc, steps=recs, complete=True)
    c = compare(doc, full)
    assert c["steps"] == 2 and c["complete"] == (False, True) and c["identical_steps"] == 0
    write_log(tmp_path, cfg, "m", recs, True)
    assert load_log(tmp_path / "grpo_log.json")["complete"] is True
