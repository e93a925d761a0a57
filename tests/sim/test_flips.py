"""The model's side of flips and per-request spread (`model._requests`, `model.draw_steps`):
a flip caps a response's coverage and its tail decodes at the after-flip rate (a caught
flip's at the caught rate), and a drawn spread scales each request at its quantile. The measured flips, tail rates and spread that
feed them are tested with the calibration (`tests/calibration`)."""

from __future__ import annotations

import numpy as np

from bubblespec.core.engine_time import EngineTime
from bubblespec.sim.model import NO_FLIP, SimConfig, _requests, draw_steps
from bubblespec.sim.policy import ModeSpec
from bubblespec.sim.workload import LengthSource


def test_a_flip_caps_coverage_and_the_tail_decodes_at_its_own_rate():
    cfg = SimConfig(prompts=1, n=2, prompt_len=10)
    mode = ModeSpec("m", 0.5, 1.0, True, 7.0, 8.0)
    L = np.array([[100, 100]])
    args = (cfg, L, np.zeros(1, np.int64), np.ones((1, 2)), np.ones((1, 2)),
            np.array([100, 100]), mode, EngineTime.preset("h100"))
    plain = _requests(*args)
    assert plain.covered.tolist() == [100, 100]
    assert _requests(*args, np.array([30, NO_FLIP])).acc_unc.tolist() == [0.5, 0.5]
    after = ModeSpec("m", 0.5, 1.0, True, 7.0, 8.0, accepted_after_flip=2.0)
    flipped = _requests(*args[:6], after, args[7], np.array([30, NO_FLIP]))
    assert flipped.covered.tolist() == [30, 100]
    assert flipped.acc_unc.tolist() == [2.0, 0.5]  # only the flipped one's tail


def test_drawn_spread_scales_each_request_at_its_quantile():
    cfg = SimConfig(prompts=1, n=3, prompt_len=10)
    et = EngineTime.preset("h100")
    args = (cfg, np.array([[100, 100, 100]]), np.zeros(1, np.int64), np.ones((1, 3)),
            np.ones((1, 3)), np.zeros(3, np.int64))
    plain = ModeSpec("suffix", 1.0, 2.0, rate_spread=(0.5, 1.0, 2.0))
    req = _requests(*args, plain, et, None, None, np.array([0.1, 0.5, 0.9]))
    # tokens per forward 2 x (0.5, 1, 2), less the emitted one; never below no speculation
    assert req.acc_unc.tolist() == [0.0, 1.0, 3.0]
    assert _requests(*args, plain, et).acc_unc.tolist() == [1.0, 1.0, 1.0]
    pre = ModeSpec("bubblespec", 1.0, 2.0, True, 7.0, 8.0,
                   after_flip_by_tail=((float("inf"), 2.0),), rate_spread=(0.5, 2.0))
    req = _requests(cfg, np.array([[100, 100, 100]]), np.zeros(1, np.int64),
                    np.ones((1, 3)), np.ones((1, 3)), np.array([100, 100, 100]), pre, et,
                    np.array([50, 50, 10**9]), None, np.array([0.2, 0.8, 0.8]))
    # only the flipped tails scale (3 per forward x 0.5 and x 2); the unflipped keeps its own
    assert req.acc_unc.tolist() == [0.5, 5.0, 1.0]
    lengths = LengthSource(description="t", groups=[np.array([10, 20, 30])])
    a = draw_steps(SimConfig(prompts=2, n=3, steps=2, flip_share=0.5,
                             flip_positions=(0.5,)), 2, lengths)
    b = draw_steps(SimConfig(prompts=2, n=3, steps=2, flip_share=0.5,
                             flip_positions=(0.5,), rate_spread=True), 2, lengths)
    assert "rate_q" not in a and b["rate_q"].shape == (2, 6)
    for k in a:  # the spread draws after everything else: the other draws do not move
        assert np.array_equal(a[k], b[k]), k


def test_a_caught_flip_decodes_its_tail_at_the_caught_rate():
    cfg = SimConfig(prompts=1, n=3, prompt_len=10)
    mode = ModeSpec("m", 0.5, 1.0, True, 7.0, 8.0, after_flip_by_tail=((float("inf"), 0.5),),
                    after_caught_by_tail=((float("inf"), 6.0),))
    args = (cfg, np.array([[100, 100, 100]]), np.zeros(1, np.int64), np.ones((1, 3)),
            np.ones((1, 3)), np.array([100, 100, 100]), mode, EngineTime.preset("h100"),
            np.array([30, 30, NO_FLIP]))
    req = _requests(*args, None, None, np.array([True, False, True]))
    assert req.acc_unc.tolist() == [6.0, 0.5, 0.5]  # the third never left its draft
    assert _requests(*args).acc_unc.tolist() == [0.5, 0.5, 0.5]  # nothing known caught
    # the caught flips are drawn last: every other draw stays what it was without them
    lengths = LengthSource(description="fixed", groups=[np.array([50, 60, 70])])
    base = SimConfig(prompts=4, n=3, steps=2, flip_share=0.5, flip_positions=(0.5,), seed=3)
    a = draw_steps(base, 2, lengths)
    b = draw_steps(SimConfig(**{**base.__dict__, "caught_share": 0.6}), 2, lengths)
    assert "caught" not in a and b["caught"].shape == (2, 12)
    assert all(np.array_equal(a[k], b[k]) for k in a)
