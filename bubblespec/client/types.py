"""Typed results of the bubblespec client (plain dataclasses, built from the gateway's JSON)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


class BubbleSpecError(Exception):
    """A gateway call failed: `status` (HTTP code, 0 when the gateway was not reached),
    `detail` (the gateway's message) and `field` (the request field at fault, or "")."""

    def __init__(self, status: int, detail: str, field: str = "", route: str = "") -> None:
        where = f"{route}: " if route else ""
        at = f" (field {field})" if field else ""
        super().__init__(f"{where}HTTP {status}: {detail}{at}" if status else f"{where}{detail}")
        self.status = status
        self.detail = detail
        self.field = field
        self.route = route


class BubbleSpecUnavailable(BubbleSpecError):
    """The gateway could not be reached, or had no rank to run on (503/504)."""


def _pick(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass(frozen=True)
class Sample:
    """One sampled response of a prompt."""

    sample_index: int
    output_ids: list[int]
    output_logprobs: list[float] | None
    finish_reason: str
    weight_version: int
    completion_tokens: int = 0
    decode_steps: int = 0
    """Target forward passes that produced this response's tokens."""
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_pregen_tokens: int | None = None
    """Accepted draft tokens from pre-generation (None: the rank does not report it)."""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Sample:
        d = {"output_logprobs": None, "finish_reason": "", "weight_version": 0, **d}
        return cls(**_pick(cls, d))


@dataclass(frozen=True)
class PromptResult:
    """All samples of one prompt, in sample order."""

    index: int
    prompt_key: str
    rank_id: str
    input_ids: list[int]
    samples: list[Sample]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PromptResult:
        return cls(index=d["index"], prompt_key=d["prompt_key"], rank_id=d.get("rank_id", ""),
                   input_ids=d.get("input_ids", []),
                   samples=[Sample.from_json(s) for s in d["samples"]])


@dataclass(frozen=True)
class RankShard:
    """What one rank did in a rollout."""

    rank_id: str
    num_prompts: int = 0
    num_samples: int = 0
    decode_seconds: float = 0.0
    drafts_fetched_tokens: int = 0
    decode_steps: int = 0
    completion_tokens: int = 0
    rerun: bool = False
    failed: str = ""


@dataclass(frozen=True)
class Rerun:
    from_rank: str
    to_rank: str
    indices: list[int]
    reason: str


@dataclass(frozen=True)
class RolloutCounters:
    completion_tokens: int = 0
    decode_steps_critical: int = 0
    decode_steps_total: int = 0
    request_decode_steps: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_pregen_tokens: int = 0
    drafts_fetched_tokens: int = 0
    tokens_per_forward: float = 0.0


@dataclass(frozen=True)
class RolloutResult:
    """A rollout step: prompts in request order, each with its `n` samples."""

    step: int
    prompts: list[PromptResult]
    weight_versions: list[int]
    counters: RolloutCounters
    ranks: list[RankShard]
    reruns: list[Rerun]
    wall_s: float
    warnings: list[str]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RolloutResult:
        return cls(step=d["step"], prompts=[PromptResult.from_json(p) for p in d["prompts"]],
                   weight_versions=list(d.get("weight_versions", [])),
                   counters=RolloutCounters(**_pick(RolloutCounters, d.get("counters", {}))),
                   ranks=[RankShard(**_pick(RankShard, r)) for r in d.get("ranks", [])],
                   reruns=[Rerun(**_pick(Rerun, r)) for r in d.get("reruns", [])],
                   wall_s=float(d.get("wall_s", 0.0)), warnings=list(d.get("warnings", [])))

    def output_ids(self) -> list[list[list[int]]]:
        """Per prompt, per sample, the output token ids."""
        return [[s.output_ids for s in p.samples] for p in self.prompts]


@dataclass(frozen=True)
class RankBubble:
    """One rank's share of a step (see `bubblespec.gateway.bubbles`)."""

    rank_id: str
    num_requests: int = 0
    done_s: float | None = None
    busy_s: float = 0.0
    bubble_s: float = 0.0
    pregen_s: float = 0.0
    idle_s: float = 0.0
    bubble_fraction: float = 0.0
    pregen_share: float = 0.0
    pregen_tokens: int = 0
    decode_tokens: int = 0
    spans: int = 0
    stop_lag_s: float | None = None
    window_pregen_s: float = 0.0
    window_pregen_tokens: int = 0


@dataclass(frozen=True)
class StepReport:
    """GET /v1/steps/{step}: the synchronizer's bubble figures and the rollout's summary."""

    step: int
    wall_s: float | None
    complete: bool
    ranks: list[RankBubble]
    bubble_fraction: float | None
    pregen_share: float | None
    pregen_tokens: int
    rollout: dict[str, Any] | None
    timeline: dict[str, Any] | None
    warnings: list[str] = field(default_factory=list)
    window_pregen_tokens: int = 0
    """Tokens pre-generated after the stop signal, in the training window."""

    @property
    def stop_lag_s(self) -> float | None:
        """How long pre-generation ran past the step's stop signal (slowest rank)."""
        return (self.timeline or {}).get("stop_lag_s")

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StepReport:
        t = d.get("timeline") or None
        ranks = [RankBubble(**_pick(RankBubble, r)) for r in (t or {}).get("ranks", [])]
        return cls(step=d["step"], wall_s=t["wall_s"] if t else None,
                   complete=bool(t and t.get("complete")), ranks=ranks,
                   bubble_fraction=t["bubble_fraction"] if t else None,
                   pregen_share=t["pregen_share"] if t else None,
                   pregen_tokens=int(t.get("pregen_tokens", 0)) if t else 0,
                   rollout=d.get("rollout"), timeline=t, warnings=list(d.get("warnings", [])),
                   window_pregen_tokens=int(t.get("window_pregen_tokens", 0)) if t else 0)


@dataclass(frozen=True)
class RankInfo:
    """A rank as GET /v1/ranks lists it."""

    rank_id: str
    url: str
    ready: bool
    state: str = ""
    weight_version: int | None = None
    step: int | None = None
    registered: bool = False
    source: str = ""
    sync_state: str = ""
    error: str = ""


@dataclass(frozen=True)
class WeightsResult:
    """POST /v1/weights: the version every rank now has."""

    weight_version: int
    ranks: dict[str, int]
    skipped: dict[str, str] = field(default_factory=dict)
