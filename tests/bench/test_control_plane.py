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
                             poll_ms=40.0, stop_by=stop_by, heartbeat_s=0.2,
                             out=str(tmp_path / "cp.json"))
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


def test_the_fetch_burst_from_the_ranks_that_pushed_the_drafts(tmp_path) -> None:
    # every draft fetched in step 1 was pushed in step 0's bubble by a rank of one of the
    # worker processes, which serves it: every fetched token comes from a peer
    cfg = ControlPlaneConfig(ranks=6, procs=2, steps=2, prompts_per_rank=1, samples=4,
                             draft_tokens=96, step_s=0.8, chunk=32, chunk_ms=40.0,
                             stop_by="stream", drafts_from="peers")
    s = run(cfg)["summary"]
    assert s["fetch_peer_tokens"] == 6 * 1 * 4 * 96
    assert 0 < s["locate_s_per_draft"] < 1e-3


def test_a_ranks_push_pattern_pushes_each_draft_once() -> None:
    # lanes at 200 tokens/s: a 40-token draft completes in 0.2 s and is pushed once; at the
    # stop, the lanes still decoding push what they have in one batch per rank
    cfg = ControlPlaneConfig(ranks=4, procs=2, steps=2, prompts_per_rank=2, samples=4,
                             draft_tokens=40, step_s=1.0, lanes=4, chunk_ms=20.0,
                             stop_by="stream", lane_tokens_per_s=200.0, heartbeat_s=0.2)
    out = run(cfg)
    s, first = out["summary"], out["steps"][0]
    # step 0's bubble had 4 x 2 x 4 = 32 tasks to decode: every rank pushed at most once
    # per finished lane batch plus once at the stop, far fewer calls than drafts
    assert 0 < first["calls"]["PushDrafts"]["n"] <= 32
    assert s["calls_per_rank_step"] > 0 and s["heartbeats_per_rank_s"] > 0


@pytest.mark.parametrize("journal", [True, False])
def test_the_restart_drill_loses_nothing_with_the_journal(journal: bool) -> None:
    """The daemon SIGKILLed in step 1's bubble and started again: the step completes on
    both; with the journal no acknowledged draft is lost, without it they all are."""
    cfg = ControlPlaneConfig(ranks=6, procs=2, steps=3, prompts_per_rank=1, samples=4,
                             draft_tokens=64, step_s=2.0, chunk=32, chunk_ms=40.0,
                             poll_ms=40.0, stop_by="stream", restart_at_step=1,
                             journal=journal, heartbeat_s=1.0)
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
