"""`bubblespec train-demo --resume` (`train/demo.py`, `train/schedule.py`): a run stopped after
a step goes on from its log and checkpoint, and under keyed sampling samples exactly the
tokens of the uninterrupted run; what cannot be resumed is refused before any cluster
starts, naming why."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bubblespec.train import demo
from bubblespec.train.demo import DemoConfig, resume_records, train_demo


def _cfg(out: Path, steps: int = 3, **kw) -> DemoConfig:
    return DemoConfig(steps=steps, prompts=2, n=2, temperature=1.0, seed_mode="keyed",
                      lr=1e-4, seed=0, epoch_steps=0, ranks=1, model=None,
                      rank_arg=["--kv-cache-mib=64"], gateway=None, out=str(out),
                      log_dir=str(out / "logs"), **kw)


def _write(out: Path, cfg: DemoConfig, model: str, steps: int, state: bool = True) -> None:
    out.mkdir(parents=True, exist_ok=True)
    demo.write_log(out, cfg, model, [{"step": k, "mean_reward": 0.0} for k in range(steps)],
                   False)
    if steps and state:
        (out / "weights" / f"v{steps}").mkdir(parents=True)
        (out / "weights" / f"v{steps}" / "trainer_state.pt").write_bytes(b"")


def test_what_cannot_be_resumed_is_refused_naming_why(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, resume=True)
    with pytest.raises(ValueError, match="no log to resume"):
        resume_records(cfg, "m")
    _write(tmp_path, cfg, "m", 2)
    with pytest.raises(ValueError, match=r"--lr 0\.0001 in the log, 0\.001 now"):
        resume_records(dataclasses.replace(cfg, lr=1e-3), "m")
    with pytest.raises(ValueError, match="model 'm' in the log, 'other' now"):
        resume_records(cfg, "other")
    with pytest.raises(ValueError, match="has 2 steps already; pass --steps above 2"):
        resume_records(dataclasses.replace(cfg, steps=2), "m")
    done, at = resume_records(dataclasses.replace(cfg, ranks=4, rank_arg=[]), "m")
    assert len(done) == 2 and at == [2]  # the cluster's settings may change
    (tmp_path / "weights" / "v2" / "trainer_state.pt").unlink()
    with pytest.raises(ValueError, match="no checkpoint of step 1"):
        resume_records(cfg, "m")


class _Stop(Exception):
    """The injected stop: the run dies right after a step's log was written."""


def test_a_run_stopped_after_a_step_resumes_to_the_uninterrupted_runs_tokens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the tiny model, keyed: a 3-step run, and the same run stopped after step 1 (its
    log written, then the process "dies") and resumed. Every step's ids equal the
    uninterrupted run's, the resumed log is complete and says where it was resumed, and
    only the newest checkpoint is kept."""
    from tests.deploy.helpers import engine_model_dir

    model = engine_model_dir()
    if model is None:
        pytest.skip("no model: build bubblespec/assets/tiny-llama")
    whole = train_demo(_cfg(tmp_path / "whole"), model)

    real_write = demo.write_log

    def stop_after_step_1(out, args, model_dir, recs, complete, *rest):
        real_write(out, args, model_dir, recs, complete, *rest)
        if len(recs) == 2 and not complete:
            raise _Stop

    out = tmp_path / "stopped"
    monkeypatch.setattr(demo, "write_log", stop_after_step_1)
    with pytest.raises(_Stop):
        train_demo(_cfg(out), model)
    monkeypatch.setattr(demo, "write_log", real_write)
    assert json.loads((out / "grpo_log.json").read_text())["complete"] is False
    resumed = train_demo(_cfg(out, resume=True), model)
    doc = json.loads((out / "grpo_log.json").read_text())
    assert doc["complete"] is True and doc["resumed_at"] == [2]
    assert [r["step"] for r in resumed] == [0, 1, 2]
    assert [r["output_ids_sha256"] for r in resumed] == [
        r["output_ids_sha256"] for r in whole]
    assert resumed[2]["max_abs_logprob_gap"] < 1e-3  # the pushed weights are the trainer's
    assert sorted(p.name for p in (out / "weights").iterdir()) == ["v3"]
