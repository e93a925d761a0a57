"""`bubblespec bench soak`: the pure figures (slopes, budgets, final lines, process walk) and
the whole code path on a real 2-rank local cluster for a few short steps (report fields;
marked `slow`: it starts its own cluster, outside `make test`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bubblespec.bench.soak import ProcessTable, SoakConfig, descendants, read_rss_kib, run_soak
from bubblespec.bench.soak_figures import SoakStep, final_lines, growth_pct_per_100, summarize
from tests.deploy.helpers import engine_model_dir


def step(k: int, rss: int, store: int = 100, tokens: int = 50) -> SoakStep:
    idx = {"tokens": tokens, "token_budget": 1000, "global_tokens": 0,
           "global_token_budget": 10}
    return SoakStep(k, 1.0, 0.1, k + 1, 10, {"sync": rss, "r0": 2 * rss},
                    {"bytes": store, "budget_bytes": 1000}, {"r0": {**idx, "tokens": 0}},
                    {"r0": idx})


def test_growth_is_the_least_squares_slope_in_percent_per_100_steps() -> None:
    assert growth_pct_per_100([100.0] * 30) == 0.0
    assert growth_pct_per_100([100.0 + 0.01 * k for k in range(101)]) == pytest.approx(
        1.0, rel=1e-2)
    assert growth_pct_per_100([100.0 - 0.02 * k for k in range(101)]) < -1.9
    assert growth_pct_per_100([5.0]) == 0.0


def test_summary_leaves_out_the_warmup_and_checks_budgets() -> None:
    records = [step(k, 1000 if k >= 5 else 100 * k) for k in range(40)]
    s = summarize(records, warmup=5)
    assert s["rss_growth_pct_per_100_steps"] == {"sync": 0.0, "r0": 0.0}
    assert s["store"] == {"max_bytes": 100, "budget_bytes": 1000}
    assert s["index"]["r0"]["max_tokens"] == 50 and s["index"]["r0"]["after_step_max_tokens"] == 0
    assert s["flat"]
    over = summarize([*records[:-1], step(39, 1000, store=2000)], warmup=5)
    assert not over["flat"]
    growing = summarize([step(k, 1000 + 10 * k) for k in range(40)], warmup=5)
    assert growing["rss_growth_pct_per_100_steps"]["sync"] > 50 and not growing["flat"]
    lines = final_lines(s)
    assert lines[0] == "soak_rss_growth_pct_per_100_steps: sync=+0.00 r0=+0.00"
    assert lines[1] == "soak_rss_growth_pct_per_100_steps_last_half: sync=+0.00 r0=+0.00"
    assert lines[2] == "soak_store_max_vs_budget: 100/1000 bytes"
    assert lines[-1].startswith("soak_flat: yes")


def heap_step(k: int, anon_kib: int, in_use: int, shapes: int) -> SoakStep:
    rec = step(k, 1000)
    rec.heap = {"r0": {"rss_kib": anon_kib + 500, "rss_anon_kib": anon_kib,
                       "rss_file_kib": 500, "malloc_in_use": in_use,
                       "malloc_free": 2**20, "shapes": shapes}}
    return rec


def test_heap_attribution_splits_the_change_and_finds_the_last_new_shape() -> None:
    # memory that grows with the shapes seen and stops when they stop: a filling cache
    records = [heap_step(k, 1000 + 10 * min(k, 30), 2**20 * min(k, 30), min(k, 30))
               for k in range(60)]
    h = summarize(records, warmup=10)["heap"]["r0"]
    assert h["after_warmup_mib"]["rss_anon_kib"] == pytest.approx(200 / 1024, abs=0.01)
    assert h["after_warmup_mib"]["malloc_in_use"] == 20.0
    assert h["after_warmup_mib"]["malloc_free"] == 0.0
    assert h["last_half_mib"]["malloc_in_use"] == 0.0
    assert h["shapes"] == {"after_warmup": 10, "half": 30, "last": 30}
    assert h["last_new_shape_step"] == 30
    assert h["in_use_growth_pct_per_100_steps_last_half"] == 0.0
    line = next(ln for ln in final_lines(summarize(records, warmup=10))
                if ln.startswith("soak_worker_heap_mib"))
    assert "malloc in use +20.0" in line and "shapes 10->30->30 (last new at step 30)" in line
    # a leak: memory in use that keeps rising with no new shape
    leak = summarize([heap_step(k, 1000, 2**20 * k, 5) for k in range(60)], warmup=10)
    assert leak["heap"]["r0"]["last_half_mib"]["malloc_in_use"] == 29.0
    assert leak["heap"]["r0"]["last_new_shape_step"] is None
    assert leak["heap"]["r0"]["in_use_growth_pct_per_100_steps_last_half"] > 100
    assert summarize([step(k, 1000) for k in range(5)], warmup=1)["heap"] == {}


def test_process_walk_finds_children_and_their_rss(tmp_path: Path) -> None:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in descendants(os.getpid())
        table = ProcessTable({"me": os.getpid()})
        assert table.pids["me"] == os.getpid() and f"me_child{child.pid}" in table.pids
        assert read_rss_kib(os.getpid()) > 1000 and table.rss_kib()["me"] > 1000
    finally:
        child.kill()
        child.wait()
    assert read_rss_kib(child.pid) is None


@pytest.mark.engine
@pytest.mark.slow
def test_soak_on_a_local_cluster_reports_every_process(tmp_path: Path) -> None:
    model = engine_model_dir()
    if model is None:
        pytest.skip("no model: build bubblespec/assets/tiny-llama or set BUBBLESPEC_TEST_MODEL")
    cfg = SoakConfig(steps=3, prompts=2, n=2, max_new_tokens=16, warmup=1, every=1,
                     model=model, out=str(tmp_path))
    lines: list[str] = []
    summary = run_soak(cfg, log=lines.append)
    doc = json.loads((tmp_path / "soak.json").read_text())
    assert (tmp_path / "soak.png").stat().st_size > 1000
    steps = doc["steps"]
    assert [s["weight_version"] for s in steps] == [1, 2, 3]
    assert [s["step"] for s in steps] == sorted(s["step"] for s in steps)
    names = set(steps[-1]["rss_kib"])
    assert {"sync", "gateway", "r0", "r1", "r0_enginecore", "r1_enginecore"} <= names
    assert all(v > 10_000 for v in steps[-1]["rss_kib"].values() if v)
    assert all(s["store"]["budget_bytes"] > 0 and s["rollout_s"] > 0 for s in steps)
    assert all(s["index"][r]["token_budget"] > 0 for s in steps for r in ("r0", "r1"))
    assert set(summary["rss_growth_pct_per_100_steps"]) == names
    assert summary["index"]["r0"]["max_tokens"] <= summary["index"]["r0"]["token_budget"]
    assert [ln.split(":")[0] for ln in lines[-7:]] == [
        "soak_rss_growth_pct_per_100_steps", "soak_rss_growth_pct_per_100_steps_last_half",
        "soak_store_max_vs_budget", "soak_index_max_vs_budget", "soak_worker_heap_mib",
        "soak_step_latency_s", "soak_flat"]
    # the worker's memory split, step by step, from inside the vLLM worker process
    heaps = [s["heap"][r] for s in steps for r in ("r0", "r1")]
    assert all(h["rss_kib"] > 100_000 and h["malloc_in_use"] > 0 for h in heaps)
    assert all(h["rss_anon_kib"] + h["rss_file_kib"] <= h["rss_kib"] + 1024 for h in heaps)
    assert all(h["forwards"] > 0 and 0 < h["shapes"] <= h["forwards"] for h in heaps)
    assert [s["heap"]["r0"]["forwards"] for s in steps] == sorted(
        s["heap"]["r0"]["forwards"] for s in steps)
    assert set(summary["heap"]) == {"r0", "r1"}
    assert summary["heap"]["r0"]["shapes"]["last"] == steps[-1]["heap"]["r0"]["shapes"]
