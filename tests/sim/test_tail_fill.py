"""Tail-fill in the simulator (modelled): lanes beside a rank's own requests feed the next
step even when no rank has a bubble, cost its shard at most the budget, and a budget of 0
is the simulator without tail-fill."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bubblespec.core.tail_fill import lanes_within
from bubblespec.sim.model import SimConfig, run_mode
from bubblespec.sim.policy import ModeSpec
from bubblespec.sim.pregen import simulate_pregen
from bubblespec.sim.rollout import Requests, build_timeline
from bubblespec.sim.tail_fill import TailFill, shard_means, tail_fill
from tests.sim.test_lookahead import drawn_for

MODE = ModeSpec("bubblespec", 0.5, 2.0, True, 3.0, 6.0)

# every step: equal shards on both ranks, so no rank ever has a bubble
EVEN = [[[300, 300], [300, 300], [300, 300], [300, 300]]] * 3


def run(et, mode: ModeSpec, steps=EVEN):
    cfg = SimConfig(prompts=4, n=2, steps=len(steps), prompt_len=64)
    return run_mode(cfg, 2, mode, et, drawn_for(steps))


def test_lanes_beside_the_shard_feed_a_step_that_had_no_bubble(et):
    off = run(et, MODE)
    on = run(et, replace(MODE, tail_fill=0.2))
    assert off[1].coverage == 0.0 and off[0].pregen_tokens == 0  # no bubble, nothing
    assert on[0].pregen_tokens > 0 and on[1].coverage > 0.0
    assert on[1].cp_forwards < off[1].cp_forwards
    # the lanes cost the shard they run beside, within the budget
    assert off[0].rollout_time_s < on[0].rollout_time_s <= 1.2 * off[0].rollout_time_s
    assert on[2].pregen_tokens == 0  # the last step has no next step to fill


def test_a_zero_budget_is_the_simulator_without_tail_fill(et):
    steps = [[[3000, 50], [50, 50], [50, 50], [50, 50]],
             [[100, 100], [100, 100], [100, 100], [100, 100]],
             [[400, 400], [400, 800], [400, 400], [400, 400]]]
    off, zero = run(et, MODE, steps), run(et, replace(MODE, tail_fill=0.0), steps)
    assert [x.step_time_s for x in off] == [x.step_time_s for x in zero]
    assert [x.pregen_tokens for x in off] == [x.pregen_tokens for x in zero]


def test_lanes_advance_one_forward_per_own_forward_until_the_rank_finishes(et):
    """Two ranks finish together at 1 s after 100 own forwards; rank 0 decodes 2 lanes
    beside them: each lane covers 100 tokens of a 1,000-token response, and nothing else
    runs (no bubble, bubble window)."""
    lengths = np.full((2, 2), 1000)
    tail = TailFill(lanes=np.array([2, 0]), slowdown=np.zeros(2), forwards=np.array([100, 100]))
    pg = simulate_pregen(np.array([1.0, 1.0]), lengths, et, inflight=64, tail=tail)
    assert pg.tail_tokens == pg.pregen_tokens == 200
    assert sorted(pg.covered.tolist()) == [0, 0, 100, 100]
    assert pg.busy_in_bubble.tolist() == [0.0, 0.0]
    # with a bubble after it, rank 0 goes on with its lanes carried over (and more)
    later = simulate_pregen(np.array([1.0, 2.0]), lengths, et, inflight=64, tail=tail)
    assert later.tail_tokens == 200 and later.pregen_tokens > 400
    assert later.covered.min() > 100


def test_the_allowance_is_the_ranks_rule_at_the_shards_mean_batch(et):
    req = Requests(rank=np.array([0, 0, 1]), length=np.array([40, 80, 80]),
                   covered=np.zeros(3, np.int64), acc_cov=np.zeros(3), acc_unc=np.zeros(3),
                   drafted_cov=np.zeros(3), drafted_unc=np.zeros(3), prefill=np.zeros(3),
                   prompt_len=64.0)
    tl = build_timeline(req, 2, 256, et)
    run_mean, tok, ctx = shard_means(tl)
    assert run_mean.tolist() == pytest.approx([1.5, 1.0])  # 2 seqs for 40 fwd, 1 for 40
    assert tok.tolist() == pytest.approx([1.5, 1.0])
    tf = tail_fill(tl, et, 0.05, 8, 64 + 500, 64, 2.0)
    want = lanes_within(et, 0.05, 2, round(ctx[0]), 9, 564, 64)
    assert tf.lanes[0] == want and tf.forwards.tolist() == [80, 80]
    assert (tf.slowdown >= 0).all() and (tf.slowdown <= 0.05).all()
    assert (tf.slowdown[tf.lanes == 0] == 0).all()


def test_copies_run_side_by_side_and_a_record_names_its_budget():
    from bubblespec.bench.paced_record import tail_fill_budget
    from bubblespec.sim.policy import tail_fill_copies

    base = ModeSpec("none", 0.0, 0.0)
    modes = tail_fill_copies([base, MODE], 0.05)
    assert [m.name for m in modes] == ["none", "bubblespec", "bubblespec+tail0.05"]
    assert [m.tail_fill for m in modes] == [0.0, 0.0, 0.05]
    assert tail_fill_copies([base, MODE], 0.0) == [base, MODE]
    assert tail_fill_budget(["--spec-mode=bubblespec", "--tail-fill-budget=0.2"]) == 0.2
    assert tail_fill_budget(["--tail-fill-budget", "0.05", "--pace=h100"]) == 0.05
    assert tail_fill_budget(["--spec-mode=bubblespec"]) == 0.0
