"""After-flip decoding measured per response (`calibration/tails.py`): rates per tail-length
class, each tail's own rate, and the per-request spread the replay and the projection draw
from (`replay.replay`; the model's side: `tests/sim/test_flips.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bubblespec.bench.paced_record import PacedRun
from bubblespec.calibration.flips import flip_caps
from bubblespec.calibration.replay import replay
from bubblespec.calibration.report import compare, load
from bubblespec.calibration.tails import MIN_CLASS, rate_spread, tail_multipliers, tail_rates
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
    own = replay(run, first, own_tails=True)["bubblespec"]
    classes = replay(run, first)["bubblespec"]
    assert own.modelled[1] <= classes.modelled[1]  # the one faster tail at its own rate
    lines, _ = compare(run, first, draws=2)
    assert any("each tail at its own measured rate" in line for line in lines)
    assert any(line.startswith("sim_vs_paced_gap_spread:") for line in lines)
    assert lines[-1].startswith("sim_vs_paced_gap:")
