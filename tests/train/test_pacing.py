"""Paced ranks under the GRPO schedule (`bubblespec/train/pacing.py`): each step's modelled
rollout seconds and overruns from the ranks' counters, and `train-demo` on a real paced
cluster carrying them per step, in its log and in its plot."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from bubblespec.engine.pace import RATIO_EDGES
from bubblespec.train.pacing import format_run_pace, run_pace, step_pace
from bubblespec.train.schedule import HEADER, format_row


def _reading(scale: float, forwards: int, overruns: int, drafting_s: float = 0.0) -> dict:
    hist = [0] * (len(RATIO_EDGES) + 1)
    hist[RATIO_EDGES.index(1.0)] = forwards - overruns  # real = paced
    hist[-1] = overruns
    return {"scale": scale, "forwards": forwards, "overruns": overruns, "paced_s": 0.0,
            "real_s": 0.0, "overrun_s": 0.0, "decode_tokens": 0, "draft_tokens": 0,
            "prefill_tokens": 0, "context_tokens": 0, "modelled_s": 0.0,
            "drafting_s": drafting_s, "charged_s": 0.0, "worst_ratio": 0.0,
            "ratio_hist": hist}


def test_step_pace_is_wall_over_scale_with_the_rollouts_overruns() -> None:
    before, after = _reading(150.0, 1000, 3, 0.5), _reading(150.0, 1400, 5, 0.75)
    p = step_pace(before, after, wall_s=30.0)
    assert p is not None
    assert p["modelled_s"] == pytest.approx(0.2) and p["scale"] == 150.0
    assert (p["forwards"], p["overruns"]) == (400, 2) and p["valid"]
    assert p["drafting_s"] == pytest.approx(0.25)
    assert not step_pace(before, _reading(150.0, 1400, 7), 30.0)["valid"]  # 4 of 400: 1%


def test_unpaced_ranks_or_an_empty_rollout_carry_no_paced_figures() -> None:
    assert step_pace(_reading(0.0, 0, 0), _reading(0.0, 0, 0), 5.0) is None
    assert step_pace(_reading(20.0, 10, 0), _reading(20.0, 10, 0), 5.0) is None


def test_run_pace_sums_the_paced_steps_and_judges_all_forwards() -> None:
    steps = [{"pace": {"scale": 100.0, "modelled_s": 0.5, "forwards": 300, "overruns": 2}},
             {"pace": {"scale": 100.0, "modelled_s": 0.25, "forwards": 100, "overruns": 2}}]
    s = run_pace(steps)
    assert s is not None
    assert s["modelled_s"] == pytest.approx(0.75) and s["per_step_modelled_s"] == [0.5, 0.25]
    assert (s["forwards"], s["overruns"], s["valid"]) == (400, 4, False)  # 1.0% is not under
    assert "INVALID" in format_run_pace(s)
    assert run_pace([{"pace": None}, {}]) is None


def test_step_rows_show_modelled_seconds_only_when_paced() -> None:
    row = {"step": 3, "mean_reward": 0.5, "wall_s": 12.0, "decode_steps_critical": 80,
           "tokens_per_forward": 2.5, "pregen_tokens": 10, "accepted_pregen_tokens": 4,
           "max_abs_logprob_gap": 1e-5}
    unpaced = format_row({**row, "pace": None})
    paced = format_row({**row, "pace": {"modelled_s": 0.08, "overruns": 1}})
    assert len(unpaced) == len(paced) == len(HEADER)
    assert unpaced.split()[-2:] == ["-", "-"] and paced.split()[-2:] == ["0.080", "1"]


def test_a_rank_that_does_not_answer_costs_the_step_its_paced_figures_not_the_run() -> None:
    """Injected fault: the probe's GET fails (a rank restarting); the schedule logs it and
    goes on, that step without paced figures."""
    from bubblespec.train.schedule import _read_pace

    def down() -> dict:
        raise httpx.ConnectError("connection refused")

    logs: list[str] = []
    assert _read_pace(down, logs.append, 4) is None
    assert logs == ["step 4: no paced counters (connection refused)"]
    assert _read_pace(None, logs.append, 5) is None and len(logs) == 1
    assert _read_pace(lambda: {"scale": 1.0}, logs.append, 6) == {"scale": 1.0}


@pytest.mark.engine
@pytest.mark.slow  # CI time (docs/results.md, run 17): make test-slow
def test_train_demo_on_paced_ranks_logs_and_plots_modelled_seconds_per_step(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A real GRPO run on a paced 1-rank cluster of the tiny model: every step carries the
    rank's paced forwards and modelled seconds = wall / scale, the run's summary names the
    overruns, the log is written after every step and marked complete at the end, and the
    plot is written."""
    from bubblespec.train.demo import DemoConfig, train_demo
    from tests.deploy.helpers import engine_model_dir

    model = engine_model_dir()
    if model is None:
        pytest.skip("no model: build bubblespec/assets/tiny-llama")
    scale = 4.0
    cfg = DemoConfig(steps=2, prompts=2, n=2, temperature=1.0, seed_mode="keyed", lr=1e-4,
                     seed=0, epoch_steps=0, ranks=1, model=model,
                     rank_arg=["--pace=h100", f"--pace-scale={scale}", "--kv-cache-mib=64"],
                     gateway=None, out=str(tmp_path / "out"), log_dir=str(tmp_path / "logs"))
    from bubblespec.train import demo

    writes: list[tuple[int, bool]] = []
    real_write = demo.write_log

    def spy(out, args, model_dir, recs, complete, *rest):  # the real writer, calls recorded
        writes.append((len(recs), complete))
        return real_write(out, args, model_dir, recs, complete, *rest)

    monkeypatch.setattr(demo, "write_log", spy)
    records = train_demo(cfg, model)
    assert len(records) == 2
    assert writes == [(1, False), (2, False), (2, True)]  # the log after every step
    for r in records:
        p = r["pace"]
        assert p is not None and p["scale"] == scale and p["forwards"] > 0
        assert p["modelled_s"] == pytest.approx(r["wall_s"] / scale)
    doc = json.loads((tmp_path / "out" / "grpo_log.json").read_text())
    assert doc["complete"] is True and not (tmp_path / "out" / "grpo_log.json.tmp").exists()
    assert doc["pace"]["steps"] == 2 and doc["pace"]["forwards"] == sum(
        r["pace"]["forwards"] for r in records)
    assert (tmp_path / "out" / "grpo_reward.png").stat().st_size > 0
    assert "paced rollouts (x4)" in capsys.readouterr().out
