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


@pytest.mark.parametrize("journal", [True, False])
def test_the_restart_drill_loses_nothing_with_the_journal(journal: bool) -> None:
    """The daemon SIGKILLed in step 1's bubble and started again: the step completes on
    both; with the journal no acknowledged draft is lost, without it they all are."""
    cfg = ControlPlaneConfig(ranks=6, procs=2, steps=3, prompts_per_rank=1, samples=4,
                             draft_tokens=64, step_s=2.0, chunk=32, chunk_ms=40.0,
                             poll_ms=40.0, stop_by="stream", restart_at_step=1,
                             journal=journal)
    out = run(cfg)
    drill = out["steps"][1]["restart"]
    assert drill is not None and all(s["restart"] is None for i, s in
                                     enumerate(out["steps"]) if i != 1)
    lost = drill["lost"]
    assert lost["acked_before_kill"] > 0  # the kill came after drafts were acknowledged
    assert drill["downtime_s"] > 0 and drill["ranks_back_s"] >= drill["downtime_s"]
    if journal:
        assert drill["restored"]["step"] == 1 and drill["restored"]["ranks"] == 6
        assert lost["lost_before_kill"] == 0 and lost["lost_after_restart"] == 0
    else:
        assert drill["restored"]["step"] is None
        assert lost["lost_before_kill"] == lost["acked_before_kill"]
    assert out["steps"][2]["calls"]["ReportDone"]["n"] == 6  # the next step ran
