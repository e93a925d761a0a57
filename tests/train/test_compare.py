"""Two saved `train-demo` runs side by side (`bubblespec/train/compare.py`, `train-demo
--compare`): identical runs are called identical, two runs drawing independent samples of one
policy agree within noise, and a run whose rewards are shifted (what a biased sampler would
do to a curve) is caught, per epoch and paired by problem."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bubblespec.cli import train_demo
from bubblespec.train.compare import NOISE_Z, compare, difference, format_compare

PROMPTS, N, STEPS, K = 8, 8, 20, 4


def _run(seed: int, shift: float = 0.0, sha: bool = False) -> dict:
    """A 20-step log whose problem j of epoch position k has success rate p(k, j) rising by
    epoch, each sample drawn with `seed` (+ `shift` on every rate)."""
    rng = random.Random(seed)
    steps = []
    for s in range(STEPS):
        base = [0.2 + 0.6 * ((s % K) * PROMPTS + j) / (K * PROMPTS) for j in range(PROMPTS)]
        rates = [min(1.0, max(0.0, b + 0.02 * (s // K) + shift)) for b in base]
        rewards = [[float(rng.random() < p) for _ in range(N)] for p in rates]
        steps.append({"step": s, "mean_reward": sum(map(sum, rewards)) / (PROMPTS * N),
                      "rewards": rewards, "decode_steps_critical": 100 + s,
                      "output_ids_sha256": f"s{s}" if sha else f"{seed}-{s}"})
    return {"config": {"epoch_steps": K}, "steps": steps}


def test_identical_runs_are_identical() -> None:
    c = compare(_run(1, sha=True), _run(1, sha=True))
    assert c["identical_steps"] == STEPS and c["within_noise"]
    assert all(e["diff"] == 0 for e in c["epochs"]) and c["paired"]["diff"] == 0
    assert format_compare(c, ("a", "b")).endswith("curves: identical")


def test_independent_samples_of_one_policy_agree_within_noise() -> None:
    """Over 40 pairs of runs of one policy the verdict's one 2-s.e. test calls about 5%
    different (at most 5 of 40 here, 2 expected)."""
    cs = [compare(_run(100 + i), _run(200 + i)) for i in range(40)]
    assert all(c["identical_steps"] == 0 and len(c["epochs"]) == STEPS // K for c in cs)
    assert sum(not c["within_noise"] for c in cs) <= 5
    assert "curves: within noise" in format_compare(
        next(c for c in cs if c["within_noise"]), ("a", "b"))


def test_a_shifted_curve_is_not_within_noise() -> None:
    """+0.1 on every success rate (10 points of reward, what a biased sampler could do to a
    curve) is caught in 40 of 40 pairs, paired by problem."""
    cs = [compare(_run(300 + i), _run(400 + i, shift=0.1)) for i in range(40)]
    assert not any(c["within_noise"] for c in cs)
    assert all(c["paired"]["z"] > NOISE_Z for c in cs)
    assert cs[0]["paired"]["problems"] == STEPS * PROMPTS
    assert "NOT within noise" in format_compare(cs[0], ("a", "b"))


def test_difference_of_means_and_its_standard_error() -> None:
    d = difference((0.5, 0.03), (0.6, 0.04))
    assert d["diff"] == pytest.approx(0.1) and d["se"] == pytest.approx(0.05)
    assert d["z"] == pytest.approx(2.0)
    assert difference((0.5, None), (0.6, 0.04))["z"] is None


def test_runs_without_the_same_epochs_compare_pooled_only() -> None:
    a, b = _run(1), _run(2)
    b["config"]["epoch_steps"] = 0
    c = compare(a, b)
    assert c["epochs"] == [] and c["pooled"] is not None


def test_cli_compare_prints_and_writes(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(_run(7)))
    pb.write_text(json.dumps(_run(8)))
    assert train_demo.main(["--compare", str(pa), str(pb), "--out", str(tmp_path / "c")]) == 0
    assert "paired by problem (160 groups)" in capsys.readouterr().out
    saved = json.loads((tmp_path / "c" / "grpo_compare.json").read_text())
    assert saved["steps"] == STEPS and saved["runs"] == [str(pa), str(pb)]
    assert (tmp_path / "c" / "grpo_compare.png").stat().st_size > 0
    (tmp_path / "empty.json").write_text("{}")
    assert train_demo.main(["--compare", str(pa), str(tmp_path / "empty.json")]) == 1
    assert "not a train-demo log" in capsys.readouterr().err


def test_paced_runs_compare_modelled_seconds_per_step_and_mark_overruns() -> None:
    """Two paced runs: per step each one's modelled rollout seconds, the speed-up over the
    whole run (a / b), and a step whose pacing overran marked as not valid; an unpaced run
    beside a paced one shows '-' and no speed-up; a partial log is named."""
    a, b = _run(1, sha=True), _run(1, sha=True)
    for s in a["steps"]:
        s["pace"] = {"modelled_s": 3.0, "valid": True}
    for s in b["steps"]:
        s["pace"] = {"modelled_s": 1.0, "valid": s["step"] != 5}
    b["complete"] = False
    c = compare(a, b)
    assert len(c["paced_steps"]) == STEPS and c["speedup"] == pytest.approx(3.0)
    assert c["paced_steps"][5] == {"step": 5, "a": 3.0, "b": 1.0, "a_valid": True,
                                   "b_valid": False}
    text = format_compare(c, ("a", "b"))
    assert "   5          3.00         1.00*   3.00x" in text
    assert "a / b 3.00x" in text and "note: b is a partial log" in text
    plain = compare(_run(1), b)
    assert plain["speedup"] is None and plain["paced_steps"][0]["a"] is None
    assert "             -" in format_compare(plain, ("a", "b"))
    assert compare(_run(1), _run(2))["paced_steps"] == []
