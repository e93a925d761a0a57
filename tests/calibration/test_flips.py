"""Measured flips in the calibration: where responses left their drafts caps their
coverage in the replay, and the tokens after a flip decode at the measured rate after a
divergence (`calibration/flips.py`, `calibration/replay.py`; the model's side of a flip:
`tests/sim/test_flips.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bubblespec.bench.paced_record import PacedRun
from bubblespec.calibration.flips import flip_caps, load_flips, lost_tokens
from bubblespec.calibration.predict import DEFAULT_CALIBRATION
from bubblespec.calibration.replay import Counts, replay, spec_of
from bubblespec.calibration.report import compare, load
from bubblespec.sim.model import NO_FLIP

FIXTURE = DEFAULT_CALIBRATION
STEP0 = Counts(tokens=5_000, accepted=1_000, drafted=4_500, fetched=0)
"""Counts of a step without pre-generated drafts: the uncovered figures of the specs below."""


def _with_divergences(tmp_path: Path, at: int | None) -> Path:
    """The fixture with every response of the pre-generating modes leaving its draft at
    `at` (None: never), as the paced records now carry it."""
    doc = json.loads(FIXTURE.read_text())
    for r in doc["runs"]["0"].values():
        for s in r.get("steps", []):
            s["request_first_divergence"] = [[at] * len(row) for row in s["output_lengths"]]
    path = tmp_path / "paced.json"
    path.write_text(json.dumps(doc))
    return path


def test_caps_from_the_records_and_from_bench_flips(tmp_path):
    run = PacedRun.load(_with_divergences(tmp_path, 3))
    caps = flip_caps(run, "bubblespec")
    assert caps.shape == (run.steps, run.prompts, run.n) and (caps == 3).all()
    L = run.lengths("bubblespec")
    assert lost_tokens(run, "bubblespec", caps).tolist() == (
        np.maximum(0, L - 3).sum(axis=(1, 2))).tolist()
    assert flip_caps(run, "nospec") is None  # no drafts, no flips
    rows = {"rows": [{"step": 1, "prompt": 2, "sample": 0, "first_divergence": 7},
                     {"step": 1, "prompt": 3, "sample": 1, "first_divergence": None}]}
    (tmp_path / "flips.json").write_text(json.dumps(rows))
    flips = load_flips(tmp_path / "flips.json")
    assert flips == {(1, 2, 0): 7}
    caps = flip_caps(run, "bubblespec", flips)  # bench flips replace the records
    assert caps[1, 2, 0] == 7 and (caps < NO_FLIP).sum() == 1
    assert flip_caps(PacedRun.load(FIXTURE), "bubblespec") is None  # older records
    with pytest.raises(ValueError, match="rows"):
        (tmp_path / "bad.json").write_text("{}")
        load_flips(tmp_path / "bad.json")


def test_the_solved_covered_rate_keeps_the_measured_forwards():
    # 10,000 tokens, 80% fetched, 1,000 of them after flips at 1.0 accepted per forward
    c = Counts(tokens=10_000, accepted=6_000, drafted=9_000, fetched=8_000, lost=1_000,
               after_flip=1.0)
    s = spec_of("bubblespec-keyed", c, True, False, STEP0, "test")
    assert c.coverage == pytest.approx(0.7)
    f = (0.7 * c.tokens / (1 + s.accepted_covered) + 1_000 / 2.0
         + 2_000 / (1 + s.accepted))  # the 30% not fetched, less the flipped tails
    assert f == pytest.approx(c.forwards)
    assert s.accepted_covered > spec_of("x", Counts(10_000, 6_000, 9_000, 8_000), True,
                                        False, STEP0, "t").accepted_covered


def test_flips_slow_only_the_pre_generating_modes(tmp_path):
    path = _with_divergences(tmp_path, 0)  # every response leaves its draft at once
    run, first, _ = load(path)
    with_flips = replay(run, first)
    without = replay(run, first, use_flips=False)
    for name, r in with_flips.items():
        if run.modes[name].pregen:
            assert r.modelled[1] > without[name].modelled[1], name
        else:
            assert r.modelled == without[name].modelled, name
    lines, _ = compare(run, first)
    assert any(line.startswith("[calibration] flips bubblespec:") for line in lines)
    assert any("without the flips: sim_vs_paced_gap" in line for line in lines)


def test_projection_draws_flips_with_the_measured_share(tmp_path):
    from bubblespec.calibration.flips import flip_stats
    from bubblespec.calibration.report import scenario
    from bubblespec.sim.model import draw_steps
    from bubblespec.sim.run import project

    run, first, window = load(_with_divergences(tmp_path, 2))
    share, where = flip_stats(run)
    assert share > 0.9 and where and max(where) < 1.0  # the length-1/2 responses do not
    s = scenario(run, first, window, [8], 3, 0)
    assert s.cfg.flip_share == share and any("measured flips" in n for n in s.notes)
    cfg = s.cfg
    drawn = draw_steps(cfg, 8, s.lengths)
    hit = drawn["flip"] < NO_FLIP
    assert abs(hit.mean() - share) < 0.1
    assert (drawn["flip"][hit] < drawn["lengths"].reshape(cfg.steps, -1)[hit]).all()
    flipped = {x.mode: x.speedup for x in project(s).results}
    no_flips = {x.mode: x.speedup for x in project(scenario(*load(FIXTURE), [8], 3, 0)).results}
    assert flipped["bubblespec"] < no_flips["bubblespec"]
    assert flipped["suffix"] == pytest.approx(no_flips["suffix"])
    ahead = scenario(run, first, window, [8], 3, 0, lookahead=3)  # a what-if: 3 steps ahead
    assert ahead.cfg.lookahead == 3 and s.cfg.lookahead == 1
    assert "flip_refresh" in draw_steps(ahead.cfg, 8, ahead.lengths)


def test_a_draft_that_ran_out_is_not_a_flip(tmp_path):
    """Responses that left their draft where it ended (the records' `request_draft_ran_out`)
    cap the replay's coverage but are not drawn as flips in the projection."""
    from bubblespec.calibration.flips import flip_stats, ran_out

    path = _with_divergences(tmp_path, 2)
    base, _ = flip_stats(PacedRun.load(path))  # every departure a flip
    doc = json.loads(path.read_text())
    for r in doc["runs"]["0"].values():
        for s in r.get("steps", []):
            rows = s["request_first_divergence"]
            # the first prompt's samples ran out of draft, the others flipped
            s["request_draft_ran_out"] = [[p == 0] * len(row) for p, row in enumerate(rows)]
    path.write_text(json.dumps(doc))
    run, _, _ = load(path)
    share, where = flip_stats(run)
    mask = ran_out(run, "bubblespec")
    assert mask[:, 0].all() and not mask[:, 1:].any()
    assert 0 < share < base and where
    assert (flip_caps(run, "bubblespec") == 2).all()  # still caps the replay's coverage


def test_branches_move_the_flips_they_cover(tmp_path):
    rows = {"rows": [
        # covered by one branch, which predicted the whole rest: no flip left
        {"step": 1, "prompt": 0, "sample": 0, "first_divergence": 5, "runner_up_hit": True,
         "margin_rank": 0, "tail": 10, "branch_match": 10},
        # covered, the branch held 3 tokens: the response leaves it at 5 + 1 + 3
        {"step": 1, "prompt": 0, "sample": 1, "first_divergence": 5, "runner_up_hit": True,
         "margin_rank": 1, "tail": 10, "branch_match": 3},
        # not the runner-up: no branch helps
        {"step": 1, "prompt": 1, "sample": 0, "first_divergence": 2, "runner_up_hit": False,
         "margin_rank": 0, "tail": 8}]}
    path = tmp_path / "flips.json"
    path.write_text(json.dumps(rows))
    assert load_flips(path) == {(1, 0, 0): 5, (1, 0, 1): 5, (1, 1, 0): 2}
    assert load_flips(path, 1) == {(1, 0, 1): 5, (1, 1, 0): 2}  # rank 1 needs 2 branches
    assert load_flips(path, 2) == {(1, 0, 1): 9, (1, 1, 0): 2}
    run, _, _ = load(_with_divergences(tmp_path, 0))
    everyone = {(k, j, i): 0 for k in range(run.steps) for j in range(run.prompts)
                for i in range(run.n)}
    from bubblespec.calibration.report import whatif, whatif_lines

    assert "what-if, MODELLED" in whatif_lines(run, {}, everyone, 1)[0]
    got = whatif(run, {}, everyone)
    assert set(got) == {n for n, m in run.modes.items() if m.pregen}
    assert all(b > p for b, p, _ in got.values())  # no flip at all beats a flip at 0


def test_a_split_that_leaves_the_covered_tokens_no_forwards_falls_back():
    # the flipped tails at 0.02 accepted per forward would leave the 6,000 covered tokens
    # 78 of the 4,000 measured forwards (76 accepted a forward, over the cap): the covered
    # phase cannot be solved from them, so the split without flips holds
    c = Counts(tokens=10_000, accepted=6_000, drafted=9_000, fetched=10_000, lost=4_000,
               after_flip=0.02)
    s = spec_of("bubblespec", c, True, False, STEP0, "test")
    plain = spec_of("bubblespec", Counts(10_000, 6_000, 9_000, 6_000), True, False, STEP0, "t")
    assert (s.accepted_covered, s.drafted_covered) == pytest.approx(
        (plain.accepted_covered, plain.drafted_covered))
    assert s.drafted_covered < 64


def test_a_covered_forward_never_verifies_more_than_the_engine_can():
    # 2% of the tokens covered before the flips and every split clamped: the drafted
    # tokens left to the covered forwards would be about 1,000 a forward
    from bubblespec.sim.policy import MAX_ACCEPTED

    c = Counts(tokens=10_000, accepted=6_000, drafted=12_000, fetched=4_200, lost=4_000,
               after_flip=0.5)
    s = spec_of("bubblespec", c, True, False, STEP0, "test")
    assert c.coverage == pytest.approx(0.02)
    assert s.accepted_covered == MAX_ACCEPTED and s.drafted_covered == MAX_ACCEPTED
