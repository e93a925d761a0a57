"""Metrics of the gateway.

Per-request figures (rollout duration, tokens, speculative counters, rank failures) are
updated when a rollout ends; per-step bubble figures come from the synchronizer's timeline
and are observed once a step's figures are final (when the next step starts, by which time
the ranks have filed their pre-generation spans). Names follow `metrics/sync.py`; the
speculative counters mirror vLLM's (`..._spec_decode_num_drafts` etc.).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bubblespec.metrics import DURATION_BUCKETS
from bubblespec.protocol.gateway import RolloutCounters

#: Fractions (bubble fraction, pre-gen share).
FRACTION_BUCKETS: tuple[float, ...] = (0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8,
                                       0.9, 0.95, 0.99, 1.0)


class _LiveRanks(Collector):
    def __init__(self, read: Callable[[], tuple[int, int]]) -> None:
        self._read = read

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        known, ready = self._read()
        yield GaugeMetricFamily("bubblespec_gateway_ranks_known",
                                "Ranks found at the last discovery.", value=known)
        yield GaugeMetricFamily("bubblespec_gateway_ranks_ready",
                                "Ranks ready at the last discovery.", value=ready)


class GatewayMetrics:
    """All gateway metrics, in one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        r = registry
        self.requests = Counter("bubblespec_gateway_requests", "HTTP requests by route and code.",
                                ["route", "code"], registry=r)
        self.request_duration = Histogram(
            "bubblespec_gateway_request_duration_seconds", "HTTP request time by route.",
            ["route"], buckets=DURATION_BUCKETS, registry=r)
        self.rollout_duration = Histogram(
            "bubblespec_gateway_rollout_duration_seconds", "Wall time of a rollout step.",
            buckets=DURATION_BUCKETS, registry=r)
        self.rollout_prompts = Counter("bubblespec_gateway_rollout_prompts",
                                       "Prompts rolled out.", registry=r)
        self.rollout_samples = Counter("bubblespec_gateway_rollout_samples",
                                       "Samples rolled out.", registry=r)
        self.completion_tokens = Counter("bubblespec_gateway_completion_tokens",
                                         "Tokens generated for trainers.", registry=r)
        self.decode_steps = Counter(
            "bubblespec_gateway_decode_steps",
            "Target forward passes, summed over ranks (longest request per rank).", registry=r)
        self.decode_steps_critical = Counter(
            "bubblespec_gateway_decode_steps_critical",
            "Target forward passes of each step's slowest rank.", registry=r)
        self.num_drafts = Counter("bubblespec_gateway_spec_decode_num_drafts",
                                  "Speculative drafts proposed.", registry=r)
        self.num_draft_tokens = Counter("bubblespec_gateway_spec_decode_num_draft_tokens",
                                        "Draft tokens proposed.", registry=r)
        self.num_accepted_tokens = Counter("bubblespec_gateway_spec_decode_num_accepted_tokens",
                                           "Draft tokens accepted.", registry=r)
        self.pregen_accepted_tokens = Counter(
            "bubblespec_gateway_pregen_accepted_tokens",
            "Accepted draft tokens that came from pre-generated responses (as ranks report "
            "them in meta_info.num_accepted_pregen_tokens).", registry=r)
        self.pregen_fetched_tokens = Counter(
            "bubblespec_gateway_pregen_fetched_tokens",
            "Pre-generated draft tokens the ranks fetched at step start.", registry=r)
        self.diverged = Counter(
            "bubblespec_gateway_pregen_diverged_responses",
            "Samples that left their aligned pre-generated response (keyed: a policy update "
            "flipped a token; docs/design.md section 5, divergence counters).", registry=r)
        self.draft_ran_out = Counter(
            "bubblespec_gateway_pregen_draft_ran_out_responses",
            "Of those, samples whose pre-generated response had ended where they left it (the "
            "stop came before pre-generation finished it: the bubble, not a flip).", registry=r)
        self.accepted_after_divergence = Counter(
            "bubblespec_gateway_pregen_accepted_after_divergence_tokens",
            "Accepted draft tokens at or after a sample's first divergence.", registry=r)
        self.recouplings = Counter(
            "bubblespec_gateway_pregen_recouplings",
            "Times samples re-joined their pre-generated response after leaving it.",
            registry=r)
        self.undrafted = Counter(
            "bubblespec_gateway_undrafted_responses",
            "Samples decoded without drafts because of their sampling fields (min_p, "
            "logit_bias: exact, not accelerated).", registry=r)
        self.rank_failures = Counter("bubblespec_gateway_rank_failures",
                                     "Rank calls that failed mid-step.", ["rank"], registry=r)
        self.engine_deaths = Counter(
            "bubblespec_gateway_engine_deaths",
            "Rank engines that died while running a shard of a step.", ["rank"], registry=r)
        self.quarantined = Counter(
            "bubblespec_gateway_quarantined_requests",
            "Requests quarantined after the engines of two ranks died running them.",
            registry=r)
        self.quarantine_refused = Counter(
            "bubblespec_gateway_quarantine_refusals",
            "Requests refused (422) because they were quarantined.", registry=r)
        self.reruns = Counter("bubblespec_gateway_shard_reruns",
                              "Shards re-run on another rank after a failure.", registry=r)
        self.sync_unavailable = Counter(
            "bubblespec_gateway_sync_unavailable",
            "Rollouts that ran without the synchronizer.", registry=r)
        self.step_bubble = Histogram(
            "bubblespec_step_bubble_seconds",
            "Per rank and step: time waiting for slower ranks (wall - decode).", ["rank"],
            buckets=DURATION_BUCKETS, registry=r)
        self.step_pregen = Histogram(
            "bubblespec_step_pregen_seconds", "Per rank and step: bubble time spent "
            "pre-generating.", ["rank"], buckets=DURATION_BUCKETS, registry=r)
        self.step_bubble_fraction = Histogram(
            "bubblespec_step_bubble_fraction", "Per step: summed bubble / summed rank wall.",
            buckets=FRACTION_BUCKETS, registry=r)
        self.step_pregen_share = Histogram(
            "bubblespec_step_pregen_share", "Per step: share of the bubble used for pre-gen.",
            buckets=FRACTION_BUCKETS, registry=r)
        self.pregen_tokens = Counter("bubblespec_step_pregen_tokens",
                                     "Tokens pre-generated in bubbles.", ["rank"], registry=r)
        self.window_pregen_tokens = Counter(
            "bubblespec_step_window_pregen_tokens",
            "Tokens pre-generated after the stop signal, in the training window.", ["rank"],
            registry=r)

    def record_rollout(self, k: RolloutCounters, prompts: int, samples: int,
                       reruns: int) -> None:
        """Count one finished rollout (its summed counters)."""
        self.rollout_prompts.inc(prompts)
        self.rollout_samples.inc(samples)
        self.completion_tokens.inc(k.completion_tokens)
        self.decode_steps.inc(k.decode_steps_total)
        self.decode_steps_critical.inc(k.decode_steps_critical)
        self.num_drafts.inc(k.num_drafts)
        self.num_draft_tokens.inc(k.num_draft_tokens)
        self.num_accepted_tokens.inc(k.num_accepted_tokens)
        self.pregen_accepted_tokens.inc(k.num_accepted_pregen_tokens)
        self.pregen_fetched_tokens.inc(k.drafts_fetched_tokens)
        self.diverged.inc(k.responses_diverged)
        self.draft_ran_out.inc(k.responses_draft_ran_out)
        self.accepted_after_divergence.inc(k.num_accepted_after_divergence)
        self.recouplings.inc(k.num_recouplings)
        self.undrafted.inc(k.responses_undrafted)
        self.reruns.inc(reruns)

    def watch_ranks(self, read: Callable[[], tuple[int, int]]) -> None:
        """Export (known, ready) rank counts by calling `read()` at scrape time."""
        self.registry.register(_LiveRanks(read))
