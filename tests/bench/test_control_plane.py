"""`bubblespec bench control-plane` on a few ranks: a real daemon and worker processes with
real gRPC clients; every call kind a rank makes is served, the stop reaches every rank, the
next step's drafts are fetched, and the figures add up."""

from __future__ import annotations

import json

import pytest

from bubblespec.bench.control_plane import ControlPlaneConfig, requirement, run


@pytest.mark.parametrize("stop_by", ["poll", "stream"])
def test_a_few_ranks_against_one_daemon(tmp_path, stop_by: str) -> None:
    cfg = ControlPlaneConfig(ranks=6, procs=2, steps=2, prompts_per_rank=1, samples=4,
                             draft_tokens=96, step_s=0.8, chunk=32, chunk_ms=40.0,
                             poll_ms=40.0, stop_by=stop_by, out=str(tmp_path / "cp.json"))
    out = run(cfg)
    assert json.loads((tmp_path / "cp.json").read_text())["summary"] == out["summary"]
    s = out["summary"]
    assert set(s["calls"]) >= {"FetchDrafts", "ReportDone", "ClaimTasks", "PushDrafts",
                               "Heartbeat", "PollStop" if stop_by == "poll" else "WatchStep"}
    later = out["steps"][1]
    assert later["calls"]["FetchDrafts"]["n"] == 6 and later["calls"]["ReportDone"]["n"] == 6
    # every rank saw the stop, after the last report and within a few polls of it
    assert 0 <= s["stop_latency_max_s"] < 5.0
    assert s["fetch_burst_s"] is not None and s["daemon_rss_mib"] > 0
    r = requirement(cfg, s, 1024)
    assert r["calls_per_s"] > s["calls_per_s"] and r["daemon_cores_needed"] >= 0
