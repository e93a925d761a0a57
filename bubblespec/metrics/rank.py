"""Metrics of a rank server (names mirror vLLM's spec-decode counters where they exist)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from bubblespec.metrics import DURATION_BUCKETS, new_registry
from bubblespec.protocol.domain import RANK_OWN_STATES, RankState

RANK_STATES = tuple(s.value for s in RANK_OWN_STATES)


@dataclass
class RankMetrics:
    """All metrics of one rank process, registered in its own registry."""

    registry: CollectorRegistry
    num_drafts: Counter
    num_draft_tokens: Counter
    num_accepted_tokens: Counter
    decode_steps: Counter
    generation_tokens: Counter
    bubble_seconds: Counter
    pregen_seconds: Counter
    pregen_requests: Counter
    pregen_branches: Counter
    pregen_branch_tokens: Counter
    pregen_offers_streamed: Counter
    pregen_refreshed: Counter
    pregen_tail_tokens: Counter
    pregen_tokens: Counter
    pregen_pushed_tokens: Counter
    drafts_fetched_tokens: Counter
    drafts_peer_tokens: Counter
    shard_duration: Histogram
    request_latency: Histogram
    weight_version: Gauge
    state: Gauge
    engine_alive: Gauge
    engine_restarts: Counter


def new_rank_metrics(rank_id: str) -> RankMetrics:
    """Create a rank's metrics; every series carries the `rank` label."""
    reg = new_registry("rank")
    lab = ["rank"]

    def counter(name: str, doc: str) -> Counter:
        return Counter(name, doc, lab, registry=reg)

    m = RankMetrics(
        registry=reg,
        num_drafts=counter("bubblespec_spec_decode_num_drafts", "Draft proposals made."),
        num_draft_tokens=counter("bubblespec_spec_decode_num_draft_tokens",
                                 "Tokens proposed as drafts."),
        num_accepted_tokens=counter("bubblespec_spec_decode_num_accepted_tokens",
                                    "Draft tokens accepted by verification."),
        decode_steps=counter("bubblespec_decode_steps",
                             "Target forward passes that emitted tokens, summed over requests."),
        generation_tokens=counter("bubblespec_generation_tokens", "Tokens emitted (step shards)."),
        bubble_seconds=counter("bubblespec_bubble_seconds",
                               "Seconds between this rank's done report and the step's stop."),
        pregen_seconds=counter("bubblespec_pregen_seconds",
                               "Seconds of the bubble spent pre-generating."),
        pregen_requests=counter("bubblespec_pregen_requests", "Pre-generation tasks run."),
        pregen_branches=counter("bubblespec_pregen_branches",
                                "Margin branches of keyed drafts decoded (--pregen-branches)."),
        pregen_branch_tokens=counter(
            "bubblespec_pregen_branch_tokens",
            "Tokens margin branches decoded past their prefix (part of pregen tokens)."),
        pregen_offers_streamed=counter(
            "bubblespec_pregen_branch_offers_streamed",
            "Branch offers pushed while their draft still decoded (--pregen-branch-margin)."),
        pregen_refreshed=counter(
            "bubblespec_pregen_refreshed",
            "Pre-generation tasks that refreshed a draft of older weights (handed ahead)."),
        pregen_tail_tokens=counter(
            "bubblespec_pregen_tail_tokens",
            "Tokens pre-generated beside the rank's own requests before it was done "
            "(--tail-fill-budget)."),
        pregen_tokens=counter("bubblespec_pregen_tokens", "Tokens pre-generated."),
        pregen_pushed_tokens=counter("bubblespec_pregen_pushed_tokens",
                                     "Pre-generated tokens stored in the draft store."),
        drafts_fetched_tokens=counter("bubblespec_drafts_fetched_tokens",
                                      "Draft tokens fetched from the store at step start."),
        drafts_peer_tokens=counter("bubblespec_drafts_peer_tokens",
                                   "Of the draft tokens fetched at step start, those read from "
                                   "the ranks that pushed them (--drafts-port)."),
        shard_duration=Histogram("bubblespec_step_shard_duration_seconds",
                                 "Wall time of this rank's shard of a step.", lab,
                                 buckets=DURATION_BUCKETS, registry=reg),
        request_latency=Histogram("bubblespec_request_latency_seconds",
                                  "HTTP request latency.", ["rank", "route"],
                                  buckets=DURATION_BUCKETS, registry=reg),
        weight_version=Gauge("bubblespec_rank_weight_version", "Loaded weight version.", lab,
                             registry=reg),
        state=Gauge("bubblespec_rank_state", "1 for the rank's current state.",
                    ["rank", "state"], registry=reg),
        engine_alive=Gauge("bubblespec_rank_engine_alive",
                           "1 while the rank's engine runs, 0 while it is starting or dead.",
                           lab, registry=reg),
        engine_restarts=counter("bubblespec_rank_engine_restarts",
                                "Engine restarts after the engine died."),
    )
    for c in (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens, m.decode_steps,
              m.generation_tokens, m.bubble_seconds, m.pregen_seconds, m.pregen_requests,
              m.pregen_branches, m.pregen_branch_tokens, m.pregen_offers_streamed,
              m.pregen_refreshed, m.pregen_tokens, m.pregen_tail_tokens, m.pregen_pushed_tokens,
              m.drafts_fetched_tokens, m.drafts_peer_tokens, m.engine_restarts):
        c.labels(rank_id)
    m.engine_alive.labels(rank_id).set(0)
    return m


def set_state(m: RankMetrics, rank_id: str, state: RankState) -> None:
    for s in RANK_STATES:
        m.state.labels(rank_id, s).set(1.0 if s == state.value else 0.0)
