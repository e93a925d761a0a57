"""Metrics of the synchronizer daemon.

Event metrics (RPC latency, claimed tasks, rejected drafts, step durations) are updated where
the event happens; level metrics (ranks per state, current step, queue and store fill) are read
from the daemon's state at scrape time by a collector, so no code path has to keep gauges in
step with the state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bubblespec.metrics import DURATION_BUCKETS
from bubblespec.protocol.domain import RankState

#: Label values of `bubblespec_sync_ranks{state}` (always all exported, 0 when empty): every
#: state a heartbeat or the daemon can give a registered rank.
RANK_STATES = tuple(s.value for s in RankState if s is not RankState.STARTING)


@dataclass(frozen=True)
class SyncLevels:
    """Levels read from the daemon's state at scrape time."""

    ranks_by_state: dict[str, int] = field(default_factory=dict)
    step: int | None = None
    step_open: bool = False
    tasks_queued: int = 0
    tasks_claimed: int = 0
    store_sequences: int = 0
    store_tokens: int = 0
    store_bytes: int = 0
    store_budget_bytes: int = 0
    watchers: int = 0
    branch_margin: float = 0.0
    flips_seen: int = 0


class _LevelsCollector(Collector):
    """Turns a `SyncLevels` snapshot into gauges on every scrape."""

    def __init__(self, read: Callable[[], SyncLevels]) -> None:
        self._read = read

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        lv = self._read()
        ranks = GaugeMetricFamily("bubblespec_sync_ranks", "Registered ranks by state.",
                                  labels=["state"])
        for state in RANK_STATES:
            ranks.add_metric([state], lv.ranks_by_state.get(state, 0))
        yield ranks
        plain = [
            ("bubblespec_sync_step", "Current step (-1 before the first).",
             -1 if lv.step is None else lv.step),
            ("bubblespec_sync_step_open", "1 while the current step is open.", int(lv.step_open)),
            ("bubblespec_pregen_tasks_queued", "Pre-generation tasks waiting for a rank.",
             lv.tasks_queued),
            ("bubblespec_pregen_tasks_in_flight", "Pre-generation tasks claimed, not complete.",
             lv.tasks_claimed),
            ("bubblespec_draft_store_sequences", "Draft sequences stored.", lv.store_sequences),
            ("bubblespec_draft_store_tokens", "Draft tokens stored.", lv.store_tokens),
            ("bubblespec_draft_store_bytes", "Accounted bytes of the draft store.",
             lv.store_bytes),
            ("bubblespec_draft_store_budget_bytes", "Byte budget of the draft store.",
             lv.store_budget_bytes),
            ("bubblespec_sync_watchers", "Open WatchStep streams.", lv.watchers),
            ("bubblespec_branch_margin", "Streamed-branch threshold from reported flips.",
             lv.branch_margin),
            ("bubblespec_flips_reported", "Responses reported as flipped off their drafts.",
             lv.flips_seen),
        ]
        for name, doc, value in plain:
            yield GaugeMetricFamily(name, doc, value=value)


class SyncMetrics:
    """All synchronizer metrics, registered in one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.rpc_duration = Histogram(
            "bubblespec_sync_rpc_duration_seconds", "Server-side time per RPC.", ["method"],
            buckets=DURATION_BUCKETS, registry=registry,
        )
        self.rpc_errors = Counter(
            "bubblespec_sync_rpc_errors", "RPCs answered with an error status.",
            ["method", "code"], registry=registry,
        )
        self.step_duration = Histogram(
            "bubblespec_step_duration_seconds", "Step time from OpenStep to its stop signal.",
            buckets=DURATION_BUCKETS, registry=registry,
        )
        self.tasks_claimed = Counter(
            "bubblespec_pregen_tasks_claimed", "Pre-generation tasks handed to ranks.",
            registry=registry,
        )
        self.tasks_handed = Counter(
            "bubblespec_pregen_tasks_handed",
            "Pre-generation tasks opened steps were handed, by what became of them: queued "
            "fresh, queued as a refresh of a draft of older weights, or done (a complete "
            "draft of the step's weights was stored already); branch: a margin branch an "
            "earlier bubble cut short, queued to be continued.", ["kind"], registry=registry,
        )
        for kind in ("fresh", "refresh", "done", "branch"):
            self.tasks_handed.labels(kind)
        self.tasks_requeued = Counter(
            "bubblespec_pregen_tasks_requeued",
            "Claimed tasks put back in the queue (rank lost or restarted).", registry=registry,
        )
        self.tasks_completed = Counter(
            "bubblespec_pregen_tasks_completed", "Tasks whose complete draft was pushed.",
            registry=registry,
        )
        self.branches_offered = Counter(
            "bubblespec_pregen_branches_offered",
            "Margin branch tasks queued from the offers of complete keyed drafts.",
            registry=registry,
        )
        self.drafts_stored = Counter(
            "bubblespec_draft_store_stored", "Draft pushes stored.", registry=registry,
        )
        self.drafts_rejected = Counter(
            "bubblespec_draft_store_rejected", "Draft pushes rejected, by reason.", ["reason"],
            registry=registry,
        )
        self.ranks_lost = Counter(
            "bubblespec_sync_ranks_lost", "Ranks marked LOST after missing heartbeats.",
            registry=registry,
        )

    def watch_levels(self, read: Callable[[], SyncLevels]) -> None:
        """Export the level gauges by calling `read()` at every scrape."""
        self.registry.register(_LevelsCollector(read))
