"""Decoding measured per response (`calibration/tails.py`): rates per class of tail length
after a flip and of covered head length before it, each response's own rate, and the
per-request spread the replay and the projection draw from (`replay.replay`; the model's
side: `tests/sim/test_flips.py`)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bubblespec.bench.paced_record import PacedRun
from bubblespec.calibration.flips import flip_caps
from bubblespec.calibration.replay import replay
from bubblespec.calibration.report import compare, load
from bubblespec.calibration.tails import (
    MIN_CLASS,
    caught,
    caught_share,
    head_multipliers,
    head_rates,
    rate_spread,
    split_rates,
    tail_multipliers,
    tail_rates,
    whole_multipliers,
)
from bubblespec.core.engine_time import EngineTime
from bubblespec.sim.model import SimConfig, _requests
from bubblespec.sim.policy import ModeSpec
from tests.calibration.test_flips import FIXTURE, _with_divergences


def _with_tails(tmp_path: Path, long_samples: int = 4) -> Path:
    """Every response of the pre-generating modes leaves its draft at 4 (all 4 tokens
    accepted from it): in each prompt the first `long_samples` samples have 300-token tails
    decoded at 1.5 tokens per forward, the others 16-token tails at 2 per forward."""
    doc = json.loads(FIXTURE.read_text())
    for r in doc["runs"]["0"].values():
        for s in r.get("steps", []):
            rows = len(s["output_lengths"])
            n = len(s["output_lengths"][0])
            long = [i < long_samples for i in range(n)]
            s["output_lengths"] = [[304 if x else 20 for x in long]] * rows
            s["request_first_divergence"] = [[4] * n] * rows
            s["request_accepted_pregen"] = [[4] * n] * rows
            s["request_decode_steps"] = [[200 if x else 8 for x in long]] * rows
    path = tmp_path / "paced.json"
    path.write_text(json.dumps(doc))
    return path


def test_tail_rates_are_measured_per_tail_length_class(tmp_path):
    run = PacedRun.load(_with_tails(tmp_path))
    rates = tail_rates(run, "bubblespec", flip_caps(run, "bubblespec"))
    assert rates == ((32.0, pytest.approx(1.0)), (float("inf"), pytest.approx(0.5)))
    assert tail_rates(run, "bubblespec", None) == ()
    assert tail_rates(PacedRun.load(_with_divergences(tmp_path, 3)), "bubblespec",
                      flip_caps(run, "bubblespec")) == ()  # no per-request decode steps
    # one long tail per step after step 0 is too few for a class of its own: it joins the
    # last class, weighted by its tokens and forwards
    run = PacedRun.load(_with_tails(tmp_path, long_samples=0))
    assert tail_rates(run, "bubblespec", flip_caps(run, "bubblespec")) == (
        (float("inf"), pytest.approx(1.0)),)
    doc = json.loads((tmp_path / "paced.json").read_text())
    for s in doc["runs"]["0"]["bubblespec"]["steps"][1:]:
        s["output_lengths"][0][0], s["request_decode_steps"][0][0] = 304, 200
    (tmp_path / "paced.json").write_text(json.dumps(doc))
    run = PacedRun.load(tmp_path / "paced.json")
    assert 2 < MIN_CLASS
    short = (run.steps - 1) * (run.prompts * run.n - 1)
    want = (short * 16 + 2 * 300) / (short * 8 + 2 * 200) - 1.0
    assert tail_rates(run, "bubblespec", flip_caps(run, "bubblespec")) == (
        (float("inf"), pytest.approx(want)),)


def test_long_tails_decode_at_their_class_rate_in_the_replay(tmp_path):
    cfg = SimConfig(prompts=1, n=2, prompt_len=10)
    mode = ModeSpec("m", 0.5, 1.0, True, 7.0, 8.0, accepted_after_flip=2.0,
                    after_flip_by_tail=((32.0, 1.0), (float("inf"), 0.25)))
    req = _requests(cfg, np.array([[42, 300]]), np.zeros(1, np.int64), np.ones((1, 2)),
                    np.ones((1, 2)), np.array([300, 300]), mode, EngineTime.preset("h100"),
                    np.array([10, 10]))
    assert req.acc_unc.tolist() == [1.0, 0.25]  # tails 32 (<= the edge) and 290
    assert req.acc_cov.tolist() == [7.0, 7.0]  # one covered rate without head classes
    heads = replace(mode, covered_by_head=((32.0, 5.0), (float("inf"), 7.5)))
    req = _requests(cfg, np.array([[42, 300]]), np.zeros(1, np.int64), np.ones((1, 2)),
                    np.ones((1, 2)), np.array([40, 300]), heads, EngineTime.preset("h100"),
                    np.array([10, 200]))
    assert req.covered.tolist() == [10, 200]  # each covered up to its flip
    assert req.acc_cov.tolist() == [5.0, 7.5]  # heads of 10 and 200 tokens: their classes
    run, first, _ = load(_with_tails(tmp_path))
    classes, pooled = replay(run, first), replay(run, first, tail_classes=False)
    # the fixture's records carry no divergence counters, so without classes the tails
    # decode at the uncovered rate (below both classes' rates): classes can only speed up
    for name, r in classes.items():
        if run.modes[name].pregen:
            assert r.modelled[1] <= pooled[name].modelled[1], name
        else:
            assert r.modelled == pooled[name].modelled, name
    window = "bubblespec-keyed-window"  # the mode whose drafts cover past the flips here
    assert classes[window].modelled[1] < pooled[window].modelled[1]
    lines, _ = compare(run, first)
    assert any("after-flip acceptance bubblespec by tail length" in line
               and "32:1.00 inf:0.50" in line for line in lines)
    assert any("one pooled after-flip rate: sim_vs_paced_gap" in line for line in lines)


def test_each_tail_at_its_own_rate_and_the_measured_spread(tmp_path):
    path = _with_tails(tmp_path)
    doc = json.loads(path.read_text())
    steps = doc["runs"]["0"]["bubblespec"]["steps"]
    steps[1]["request_decode_steps"][0] = [100] + steps[1]["request_decode_steps"][0][1:]
    for s in doc["runs"]["0"]["suffix"]["steps"]:  # every suffix response at 2 per forward,
        s["request_decode_steps"] = [[max(1, x // 2) for x in row]  # one at 1 per forward
                                     for row in s["output_lengths"]]
    steps = doc["runs"]["0"]["suffix"]["steps"]
    steps[1]["request_decode_steps"][0] = [steps[1]["output_lengths"][0][0]] + \
        steps[1]["request_decode_steps"][0][1:]
    path.write_text(json.dumps(doc))
    run = PacedRun.load(path)
    caps = flip_caps(run, "bubblespec")
    rates = tail_rates(run, "bubblespec", caps)
    mult = tail_multipliers(run, "bubblespec", caps, rates)
    assert mult.shape == (run.steps, run.prompts, run.n) and (mult[0] == 1).all()
    # the one 300-token tail in 100 forwards: 3 per forward over its class's
    assert mult[1, 0, 0] == pytest.approx(3.0 / (1.0 + rates[-1][1]))
    others = np.ones(mult.shape, bool)
    others[1, 0, 0] = False
    assert np.ptp(mult[1:][others[1:] & (np.arange(run.n) < 4)]) < 0.05
    bs = rate_spread(run, "bubblespec", caps)
    assert len(bs) == (run.steps - 1) * run.prompts * run.n  # every response flipped
    sx = np.asarray(rate_spread(run, "suffix", flip_caps(run, "suffix")))
    assert sx.size == (run.steps - 1) * run.prompts * run.n
    assert sx.min() == pytest.approx(sx.max() / 2)  # the slow one: half the others' rate
    assert rate_spread(PacedRun.load(FIXTURE), "suffix", None) == ()  # older records
    run, first, _ = load(path)
    own = replay(run, first, own_rates=True)["bubblespec"]
    classes = replay(run, first)["bubblespec"]
    assert own.modelled[1] <= classes.modelled[1]  # the one faster tail at its own rate
    lines, _ = compare(run, first, draws=2)
    assert any("each response at its own measured rate" in line for line in lines)
    assert any(line.startswith("sim_vs_paced_gap_spread:") for line in lines)
    assert lines[-1].startswith("sim_vs_paced_gap:")


def test_heads_and_whole_responses_at_their_own_rate(tmp_path):
    path = _with_tails(tmp_path)
    doc = json.loads(path.read_text())
    s = doc["runs"]["0"]["bubblespec"]["steps"][1]
    rows = [list(r) for r in s["request_first_divergence"]]
    pre, dec = [list(r) for r in s["request_accepted_pregen"]], [list(r) for r in
                                                                 s["request_decode_steps"]]
    rows[0][5], pre[0][5], dec[0][5] = None, 16, 4  # 20 tokens, never left: 5 per forward
    rows[0][6], pre[0][6] = 10, 6  # left at 10 after 6 accepted: 10 tokens in 4 forwards
    s["request_first_divergence"], s["request_accepted_pregen"] = rows, pre
    s["request_decode_steps"] = dec
    for s in doc["runs"]["0"]["suffix"]["steps"]:  # suffix: 2 per forward, one at 1
        s["request_decode_steps"] = [[max(1, x // 2) for x in row] for row in s["output_lengths"]]
    slow = doc["runs"]["0"]["suffix"]["steps"][1]
    slow["request_decode_steps"][0][0] = slow["output_lengths"][0][0]
    path.write_text(json.dumps(doc))
    run = PacedRun.load(path)
    caps = flip_caps(run, "bubblespec")
    rates = head_rates(run, "bubblespec", caps)
    # two measured heads (the others took no forward: all 4 head tokens from the draft),
    # too few for a class of their own: one class, 30 tokens in 8 forwards
    assert rates == ((float("inf"), pytest.approx(30 / 8 - 1.0)),)
    head = head_multipliers(run, "bubblespec", caps, rates)
    assert head.shape == (run.steps, run.prompts, run.n) and (head[0] == 1).all()
    assert head[1, 0, 5] == pytest.approx(4.0 / rates[0][1])  # 5 a forward: 4 accepted
    assert head[1, 0, 6] == pytest.approx(1.5 / rates[0][1])
    assert head[1, 0, 0] == 1  # its 4 head tokens all came from the draft: no forward
    assert head_multipliers(run, "suffix", None, 2.0) is None  # does not pre-generate
    whole = whole_multipliers(run, "suffix")
    assert whole[1, 0, 0] == pytest.approx(whole[1, 0, 1] / 2)  # the slow one
    assert whole_multipliers(run, "bubblespec") is None
    assert whole_multipliers(run, "nospec") is None  # no speculation: nothing to replay
    run, first, _ = load(path)
    own, pooled = replay(run, first, own_rates=True), replay(run, first)
    assert own["suffix"].modelled[1] > pooled["suffix"].modelled[1]  # slower than pooled
    assert own["nospec"].modelled == pooled["nospec"].modelled


def test_flips_a_branch_caught_decode_their_tails_at_their_own_rates(tmp_path):
    """A flip after which the response still accepted pre-generated tokens (more than its
    flip position: a margin branch drafted on) has a fast tail; one nothing caught, or a
    draft that ended, a slow one. The replay and the projection keep them apart."""
    path = _with_tails(tmp_path, long_samples=0)  # 16-token tails, 2 per forward
    doc = json.loads(path.read_text())
    for s in [s for name in ("bubblespec", "bubblespec-keyed-window")
              for s in doc["runs"]["0"][name]["steps"][1:]]:
        n = len(s["output_lengths"][0])
        # samples 0-3: caught (16 more draft tokens after the flip at 4, tail in 2 forwards)
        s["request_accepted_pregen"] = [[20 if i < 4 else 4 for i in range(n)]
                                        for _ in s["output_lengths"]]
        s["request_decode_steps"] = [[2 if i < 4 else 8 for i in range(n)]
                                     for _ in s["output_lengths"]]
        s["request_draft_ran_out"] = [[i == 7 for i in range(n)] for _ in s["output_lengths"]]
    path.write_text(json.dumps(doc))
    run = PacedRun.load(path)
    caps = flip_caps(run, "bubblespec")
    hit = caught(run, "bubblespec", caps)
    assert not hit[0].any() and hit[1:, :, :4].all() and not hit[1:, :, 4:].any()
    assert caught_share(run) == pytest.approx(4 / 7)  # sample 7's draft ended: not a flip
    slow, fast = split_rates(run, "bubblespec", caps)
    assert slow == ((float("inf"), pytest.approx(16 / 8 - 1.0)),)
    assert fast == ((float("inf"), pytest.approx(16 / 2 - 1.0)),)
    assert split_rates(run, "suffix", flip_caps(run, "suffix")) == ((), ())
    spread = np.asarray(rate_spread(run, "bubblespec", caps))
    assert np.allclose(spread, 1.0)  # each tail at its kind's class rate: no spread left
    run, first, _ = load(path)
    window = "bubblespec-keyed-window"  # the mode whose drafts cover past the flips here
    split = replay(run, first)[window]
    pooled = replay(run, first, tail_classes=False)[window]
    assert split.modelled[1] < pooled.modelled[1]  # the caught tails decode faster
    lines, _ = compare(run, first)
    assert any("of the flips a branch caught bubblespec by tail length" in line
               for line in lines)
