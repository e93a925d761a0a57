"""`bubblespec train-demo --resume` (`train/demo.py`, `train/schedule.py`,
`cli/train_demo.py`): a run stopped after a step (by SIGTERM, as a scheduler stops it) goes
on from its log and checkpoint, and under keyed sampling samples exactly the tokens of the
uninterrupted run; what cannot be resumed is refused before any cluster
starts, naming why."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bubblespec.train import demo
from bubblespec.train.demo import DemoConfig, resume_records, train_demo
from tests.cluster.helpers import REPO_ROOT


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


def _cli(cfg: DemoConfig, model: str) -> list[str]:
    return [sys.executable, "-m", "bubblespec.cli.main", "train-demo", "--steps", str(cfg.steps),
            "--prompts", str(cfg.prompts), "--n", str(cfg.n), "--seed-mode", cfg.seed_mode,
            "--lr", str(cfg.lr), "--ranks", str(cfg.ranks), "--model", model,
            *[f"--rank-arg={a}" for a in cfg.rank_arg], "--out", cfg.out,
            "--log-dir", str(cfg.log_dir)]


def _logged_steps(out: Path) -> int:
    try:
        return len(json.loads((out / "grpo_log.json").read_text())["steps"])
    except (OSError, ValueError, KeyError):  # not written yet
        return 0


@pytest.mark.slow  # two 3-step demo runs with their clusters (about 2 min): `make test-slow`
def test_a_run_stopped_by_sigterm_resumes_to_the_uninterrupted_runs_tokens(
        tmp_path: Path) -> None:
    """On the tiny model, keyed: a 3-step run in process, and the same run as the command,
    sent SIGTERM once its log holds step 0 (as a scheduler or `kill` stops it). The command
    stops its cluster in order (no process of it is left), says what its log kept and exits
    130; then `--resume` gives the uninterrupted run's ids at every step, its log is complete
    and says where it was resumed, and only the newest checkpoint is kept."""
    from tests.deploy.helpers import engine_model_dir

    model = engine_model_dir()
    if model is None:
        pytest.skip("no model: build bubblespec/assets/tiny-llama")
    whole = train_demo(_cfg(tmp_path / "whole"), model)

    out = tmp_path / "stopped"
    out.mkdir()
    with (tmp_path / "stdout").open("w") as o, (tmp_path / "stderr").open("w") as e:
        run = subprocess.Popen(_cli(_cfg(out), model), cwd=REPO_ROOT, stdout=o, stderr=e)
    try:
        deadline = time.monotonic() + 240
        while _logged_steps(out) < 1:
            assert run.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
            assert time.monotonic() < deadline, "no step logged in 240 s"
            time.sleep(0.05)
        family = psutil.Process(run.pid).children(recursive=True)
        assert family  # the cluster's processes
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    err = (tmp_path / "stderr").read_text()
    kept = _logged_steps(out)
    assert run.returncode == 130, err
    assert f"holds {kept} step(s); the same command with --resume goes on" in err
    assert 1 <= kept < 3, err  # stopped between step 0 and the end
    _, alive = psutil.wait_procs(family, timeout=5)
    assert not alive, alive  # none of its processes is left
    assert json.loads((out / "grpo_log.json").read_text())["complete"] is False

    resumed = train_demo(_cfg(out, resume=True), model)
    doc = json.loads((out / "grpo_log.json").read_text())
    assert doc["complete"] is True and doc["resumed_at"] == [kept]
    assert [r["step"] for r in resumed] == [0, 1, 2]
    assert [r["output_ids_sha256"] for r in resumed] == [
        r["output_ids_sha256"] for r in whole]
    assert resumed[kept]["max_abs_logprob_gap"] < 1e-3  # the pushed weights are the trainer's
    assert sorted(p.name for p in (out / "weights").iterdir()) == ["v3"]
