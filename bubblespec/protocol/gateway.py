"""HTTP bodies of the gateway: what the trainer sends and gets back, and what the Python
client parses.

Requests forbid unknown keys; limits that depend on the gateway's config (most prompts,
largest n, vocabulary size) are checked by the gateway's `Preparer`, with the same error
shape: `{"detail": "...", "field": "prompts[2].input_ids[5]"}`. Responses ignore unknown
keys, so that a client keeps working against a newer gateway.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bubblespec.protocol import limits as L
from bubblespec.protocol.limits import Seeds, Step, TokenIds, TopLogprobs
from bubblespec.protocol.sample import SampleMeta, SampleTotals
from bubblespec.protocol.sampling import PregenWindow, SamplingParams, SeedMode
from bubblespec.protocol.shapes import is_batch_list

SeedLists = Annotated[list[Seeds], Field(max_length=L.MAX_LIST)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")


class PromptIn(_Body):
    """One prompt: token ids, or text tokenized by the gateway (exactly one of the two)."""

    input_ids: TokenIds | None = Field(None, description="Prompt token ids.")
    text: str | None = Field(None, max_length=16 * L.MAX_PROMPT_TOKENS,
                             description="Prompt text (tokenized with BOS).")

    @model_validator(mode="after")
    def _one_of(self) -> PromptIn:
        if (self.input_ids is None) == (self.text is None):
            raise ValueError("give exactly one of input_ids and text")
        if self.input_ids is not None and not self.input_ids:
            raise ValueError("input_ids must not be empty")
        if self.text is not None and not self.text.strip():
            raise ValueError("text must not be empty")
        return self


PromptList = Annotated[list[PromptIn], Field(max_length=L.MAX_LIST)]
PromptBatches = Annotated[list[PromptList], Field(min_length=1, max_length=L.MAX_LOOKAHEAD)]
SeedBatches = Annotated[list[SeedLists], Field(min_length=1, max_length=L.MAX_LOOKAHEAD)]


class RolloutRequest(_Body):
    """POST /v1/rollout: `n` samples for each prompt of the batch, as one synchronous step."""

    step: Step | None = Field(None, description="Step number (default: the next one).")
    prompts: PromptList = Field(..., min_length=1)
    n: int = Field(1, ge=1, le=L.MAX_N, description="Samples per prompt.")
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    seeds: SeedLists | None = Field(
        None, description="Per prompt, one seed per sample (default: derived from run seed).")
    next_prompts: PromptList | PromptBatches | None = Field(
        None, description="The next step's prompts, pre-generated in this step's bubble; or "
        "a list of the next steps' prompt batches (the next step's first), so that a bubble "
        "that has covered the next step goes on to the ones after it.")
    next_seeds: SeedLists | SeedBatches | None = Field(
        None, description="Seeds the next step(s) will use, shaped like next_prompts "
        "(default: derived from run seed).")
    return_logprobs: bool = Field(True, description="Include output_logprobs.")
    top_logprobs: int = Field(0, ge=0, le=L.MAX_TOP_LOGPROBS, description=(
        "Also return, per generated token, the log-probs of this many most likely tokens "
        "(`output_top_logprobs`; vLLM's `logprobs`)."))
    pregen: bool = Field(True, description="Let ranks that finish early pre-generate.")
    pregen_window: PregenWindow | None = Field(
        None, description="Pre-generate until the slowest rank is done ('bubble') or on "
        "through the training window until the next step or weight push ('training'; "
        "for rollout ranks that idle while the trainer trains). Default: the gateway's.")


    def next_batches(self) -> list[list[PromptIn]]:
        """`next_prompts` as a list of future steps' batches (one batch: a list of one)."""
        return _batches(self.next_prompts)

    def next_seed_batches(self) -> list[list[list[int]]] | None:
        """`next_seeds` as a list of future steps' seed lists, like `next_batches`."""
        return None if self.next_seeds is None else _batches(self.next_seeds)


def _batches(value: list) -> list:
    """A one-batch form (a list of prompts / of seed lists) wrapped as a list of batches."""
    if value is None or not value:
        return []
    return list(value) if is_batch_list(value) else [value]


class RolloutSample(SampleMeta):
    """One sampled response of a prompt: its tokens and the record the engine filled for it
    (`SampleMeta`'s fields, carried from the rank as they are). Unknown keys are ignored."""

    sample_index: int
    output_ids: list[int]
    output_logprobs: list[float] | None = None
    output_top_logprobs: TopLogprobs | None = Field(None, description=(
        "With `top_logprobs`: per output token, [token id, log-prob] of the most likely "
        "tokens and the sampled one (vLLM's order: the sampled token first)."))

    @classmethod
    def of(cls, meta: SampleMeta, sample_index: int, output_ids: list[int],
           output_logprobs: list[float] | None,
           output_top_logprobs: TopLogprobs | None = None) -> RolloutSample:
        """The sample with the engine's record `meta`."""
        return cls(sample_index=sample_index, output_ids=output_ids,
                   output_logprobs=output_logprobs, output_top_logprobs=output_top_logprobs,
                   **dict(meta))

    @property
    def meta(self) -> SampleMeta:
        """The engine's record of this sample."""
        return SampleMeta(**{k: getattr(self, k) for k in SampleMeta.model_fields})


class PromptResult(_Reply):
    """All samples of one prompt, in sample order."""

    index: int
    prompt_key: str
    rank_id: str = Field(..., description="Rank that produced the samples (several: comma list).")
    input_ids: list[int]
    samples: list[RolloutSample]


class RankShard(_Reply):
    """What one rank did in this rollout."""

    rank_id: str
    num_prompts: int = 0
    num_samples: int = 0
    decode_seconds: float = 0.0
    drafts_fetched_tokens: int = 0
    decode_steps: int = Field(0, description="Longest request's forward passes on this rank.")
    completion_tokens: int = 0
    rerun: bool = False
    failed: str = Field("", description="Why the rank's shard was lost (empty: fine).")


class Rerun(_Reply):
    """A shard re-run after its rank failed."""

    from_rank: str
    to_rank: str
    indices: list[int]
    reason: str


class RolloutCounters(SampleTotals, _Reply):
    """Counters of a rollout: its samples' sums (`SampleTotals`) and its ranks' figures."""

    decode_steps_critical: int = Field(0, description="Forward passes of the slowest rank.")
    decode_steps_total: int = Field(0, description="Forward passes summed over ranks.")
    drafts_fetched_tokens: int = 0
    tokens_per_forward: float = Field(0.0, description="completion / request_decode_steps.")

    @classmethod
    def of(cls, samples: Sequence[SampleMeta], ranks: list[RankShard]) -> RolloutCounters:
        """The step's counters: sums over its samples, the slowest rank's forward passes
        and the sum over ranks."""
        k = cls(**SampleTotals.sums(samples),
                decode_steps_critical=max((r.decode_steps for r in ranks), default=0),
                decode_steps_total=sum(r.decode_steps for r in ranks),
                drafts_fetched_tokens=sum(r.drafts_fetched_tokens for r in ranks))
        if k.request_decode_steps:
            k.tokens_per_forward = k.completion_tokens / k.request_decode_steps
        return k


class RolloutResponse(_Reply):
    """A rollout step: prompts in request order, each with its `n` samples."""

    step: int
    prompts: list[PromptResult]
    seed_mode: SeedMode = SeedMode.DEFAULT
    """The seed mode the step sampled with (the gateway's `handoff_seed_mode` when the
    request left it unset and hands prompts ahead, see docs/design.md section 3)."""
    weight_versions: list[int] = Field(default_factory=list)
    counters: RolloutCounters = Field(default_factory=RolloutCounters)
    ranks: list[RankShard] = Field(default_factory=list)
    reruns: list[Rerun] = Field(default_factory=list)
    wall_s: float = 0.0
    warnings: list[str] = Field(default_factory=list)

    def output_ids(self) -> list[list[list[int]]]:
        """Per prompt, per sample, the output token ids."""
        return [[s.output_ids for s in p.samples] for p in self.prompts]


class WeightsResult(_Reply):
    """POST /v1/weights: the version every rank now has."""

    weight_version: int
    ranks: dict[str, int]
    skipped: dict[str, str] = Field(default_factory=dict)


class RankEntry(_Reply):
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


class RankBubble(_Reply):
    """One rank's share of a step (computed by `bubblespec.gateway.bubbles`)."""

    rank_id: str
    num_requests: int = 0
    done_s: float | None = Field(
        None, description="Seconds from open to the rank's done report (null: not reported).")
    busy_s: float = 0.0
    bubble_s: float = 0.0
    pregen_s: float = 0.0
    idle_s: float = 0.0
    bubble_fraction: float = 0.0
    pregen_share: float = 0.0
    pregen_tokens: int = 0
    decode_tokens: int = 0
    spans: int = 0
    stop_lag_s: float | None = Field(
        None, description="Stop signal -> end of the rank's last bubble pre-generation span "
                          "(null: no pre-generation).")
    window_pregen_s: float = 0.0
    window_pregen_tokens: int = 0
    tail_pregen_s: float = Field(
        0.0, description="Pre-generation beside the rank's own requests before it was done "
                         "(tail-fill), seconds.")
    tail_pregen_tokens: int = 0


class StepReport(_Reply):
    """GET /v1/steps/{step}: the synchronizer's bubble figures and the rollout's summary.

    The route nests the figures under `timeline`; they are lifted to the top level here."""

    step: int
    wall_s: float | None = None
    complete: bool = False
    ranks: list[RankBubble] = Field(default_factory=list)
    bubble_fraction: float | None = None
    pregen_share: float | None = None
    pregen_tokens: int = 0
    rollout: dict[str, Any] | None = None
    timeline: dict[str, Any] | None = None
    warnings: list[str] = Field(default_factory=list)
    window_pregen_tokens: int = Field(
        0, description="Tokens pre-generated after the stop signal, in the training window.")
    tail_pregen_tokens: int = Field(
        0, description="Tokens pre-generated beside the ranks' own requests (tail-fill).")

    @model_validator(mode="before")
    @classmethod
    def _lift_timeline(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        t = data.get("timeline") or {}
        lifted = {"wall_s": t.get("wall_s"), "complete": bool(t.get("complete")),
                  "ranks": t.get("ranks", []), "bubble_fraction": t.get("bubble_fraction"),
                  "pregen_share": t.get("pregen_share"),
                  "pregen_tokens": int(t.get("pregen_tokens", 0)),
                  "window_pregen_tokens": int(t.get("window_pregen_tokens", 0)),
                  "tail_pregen_tokens": int(t.get("tail_pregen_tokens", 0))}
        return {**lifted, **data, "timeline": data.get("timeline") or None}

    @property
    def stop_lag_s(self) -> float | None:
        """How long pre-generation ran past the step's stop signal (slowest rank)."""
        return (self.timeline or {}).get("stop_lag_s")
