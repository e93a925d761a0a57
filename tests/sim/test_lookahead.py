"""Prompts handed several steps ahead, in the simulator (modelled): a long bubble goes on to
the step after next, a short step no longer starves the one after it, drafts made earlier
are refreshed or flip earlier, and one step ahead is what the simulator always did."""

from __future__ import annotations

import numpy as np
import pytest

from bubblespec.sim.model import NO_FLIP, Drafts, SimConfig, draw_steps, run_mode
from bubblespec.sim.policy import ModeSpec
from bubblespec.sim.pregen import breadth_first
from bubblespec.sim.workload import LengthSource

MODE = ModeSpec("bubblespec", 0.5, 2.0, True, 3.0, 6.0)


def drawn_for(lengths: list[list[list[int]]]) -> dict[str, np.ndarray]:
    """Hand-made steps: prompts 0-1 on rank 0, the rest on rank 1."""
    L = np.asarray(lengths, dtype=np.int64)
    steps, prompts, n = L.shape
    assign = np.tile((np.arange(prompts) >= prompts // 2).astype(np.int64), (steps, 1))
    return {"lengths": L, "assign": assign, "mult": np.ones(L.shape),
            "mult_cov": np.ones(L.shape),
            "pregen_order": np.stack([breadth_first(prompts, n)] * steps)}


# step 0: one long response on rank 0 (rank 1 has a long bubble); step 1: equal shards, no
# bubble; step 2: long again; step 3: short
STEPS = [[[3000, 50], [50, 50], [50, 50], [50, 50]],
         [[100, 100], [100, 100], [100, 100], [100, 100]],
         [[400, 400], [400, 800], [400, 400], [400, 400]],
         [[100, 100], [100, 100], [100, 100], [100, 100]]]


def run(et, lookahead: int, drawn: dict[str, np.ndarray]):
    cfg = SimConfig(prompts=4, n=2, steps=4, prompt_len=64, lookahead=lookahead)
    return run_mode(cfg, 2, MODE, et, drawn)


def test_a_long_bubble_covers_the_step_after_a_short_one(et):
    one, two = run(et, 1, drawn_for(STEPS)), run(et, 2, drawn_for(STEPS))
    assert one[1].coverage == pytest.approx(1.0) and two[1].coverage == pytest.approx(1.0)
    assert one[2].coverage == 0.0  # step 1 had no bubble: nothing for step 2
    assert two[2].coverage > 0.5  # step 0's bubble went on to step 2
    assert two[2].rollout_time_s < 0.8 * one[2].rollout_time_s
    assert two[0].pregen_tokens > one[0].pregen_tokens


def test_drafts_that_flip_at_once_when_aged_give_nothing_more(et):
    """Every draft used two updates after it was made flips at its first token and every
    refresh finds nothing valid: handing two steps ahead adds nothing to step 2."""
    drawn = drawn_for(STEPS)
    shape = drawn["lengths"].reshape(4, -1).shape
    drawn["flip"] = np.full(shape, NO_FLIP, dtype=np.int64)
    drawn["flip_aged"] = np.zeros(shape, dtype=np.int64)
    drawn["flip_refresh"] = np.zeros(shape, dtype=np.int64)
    one, two = run(et, 1, drawn), run(et, 2, drawn)
    assert two[2].coverage == one[2].coverage == 0.0
    assert two[2].rollout_time_s == pytest.approx(one[2].rollout_time_s)


def test_one_step_ahead_draws_and_runs_as_before(et):
    cfg = SimConfig(prompts_per_rank=2, n=4, steps=3, flip_share=0.3,
                    flip_positions=(0.2, 0.5))
    lengths = LengthSource.default(median=200, max_new_tokens=1000)
    d1 = draw_steps(cfg, 4, lengths)
    d2 = draw_steps(SimConfig(**{**cfg.__dict__, "lookahead": 2}), 4, lengths)
    assert "flip_aged" not in d1 and "flip_aged" in d2
    for key in d1:  # the draws a single step ahead uses are unchanged by lookahead
        np.testing.assert_array_equal(d1[key], d2[key])


def test_drafts_keep_the_old_one_when_a_refresh_stops_short():
    d = Drafts(4)
    d.update(5, 2, np.array([10, 0, 30, 7]), np.zeros(4), np.array([50, 50, 30, 50]))
    cov, made = d.covered(5), d.made(5)
    assert cov.tolist() == [10, 0, 30, 7] and made.tolist() == [2, -1, 2, 2]
    # bubble 3 refreshes: past the head (new draft), short of it (old kept), a complete
    # response re-verified to its end (new), not reached (old kept)
    d.update(5, 3, np.array([12, 0, 30, 4]), np.array([10, 0, 30, 7]),
             np.array([50, 50, 30, 50]))
    cov, made = d.take(5)
    assert cov.tolist() == [12, 0, 30, 7] and made.tolist() == [3, -1, 3, 2]
    assert d.covered(5).tolist() == [0, 0, 0, 0]  # taken
