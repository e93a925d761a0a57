"""HTTP bodies of the gateway: what the trainer sends and gets back (pure pydantic).

Requests forbid unknown keys; limits that depend on the gateway's config (most prompts,
largest n, vocabulary size) are checked by `Rollouts.prepare`, with the same error shape:
`{"detail": "...", "field": "prompts[2].input_ids[5]"}`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bubblespec.api import SamplingParams, WeightUpdate

TokenId = Annotated[int, Field(ge=0)]
Seed = Annotated[int, Field(ge=0, lt=2**63)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PromptIn(_Body):
    """One prompt: token ids, or text tokenized by the gateway (exactly one of the two)."""

    input_ids: list[TokenId] | None = Field(None, description="Prompt token ids.")
    text: str | None = Field(None, description="Prompt text (tokenized with BOS).")

    @model_validator(mode="after")
    def _one_of(self) -> PromptIn:
        if (self.input_ids is None) == (self.text is None):
            raise ValueError("give exactly one of input_ids and text")
        if self.input_ids is not None and not self.input_ids:
            raise ValueError("input_ids must not be empty")
        if self.text is not None and not self.text.strip():
            raise ValueError("text must not be empty")
        return self


class RolloutRequest(_Body):
    """POST /v1/rollout: `n` samples for each prompt of the batch, as one synchronous step."""

    step: int | None = Field(None, ge=0, description="Step number (default: the next one).")
    prompts: list[PromptIn] = Field(..., min_length=1)
    n: int = Field(1, ge=1, description="Samples per prompt.")
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    seeds: list[list[Seed]] | None = Field(
        None, description="Per prompt, one seed per sample (default: derived from run seed).")
    next_prompts: list[PromptIn] | None = Field(
        None, description="The next step's prompts, pre-generated in this step's bubble.")
    next_seeds: list[list[Seed]] | None = Field(
        None, description="Seeds the next step will use (default: derived from run seed).")
    return_logprobs: bool = Field(True, description="Include output_logprobs.")
    pregen: bool = Field(True, description="Let ranks that finish early pre-generate.")
    pregen_window: Literal["bubble", "training"] | None = Field(
        None, description="Pre-generate until the slowest rank is done ('bubble') or on "
        "through the training window until the next step or weight push ('training'; "
        "for rollout ranks that idle while the trainer trains). Default: the gateway's.")


class SampleResult(_Body):
    sample_index: int
    output_ids: list[int]
    output_logprobs: list[float] | None = None
    finish_reason: str = ""
    weight_version: int = 0
    completion_tokens: int = 0
    decode_steps: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_pregen_tokens: int | None = Field(
        None, description="Accepted draft tokens that came from pre-generation (when the "
                          "rank reports it).")


class PromptResult(_Body):
    index: int
    prompt_key: str
    rank_id: str = Field(..., description="Rank that produced the samples (several: comma list).")
    input_ids: list[int]
    samples: list[SampleResult]


class RankShard(_Body):
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


class Rerun(_Body):
    """A shard re-run after its rank failed."""

    from_rank: str
    to_rank: str
    indices: list[int]
    reason: str


class RolloutCounters(_Body):
    completion_tokens: int = 0
    decode_steps_critical: int = Field(0, description="Forward passes of the slowest rank.")
    decode_steps_total: int = Field(0, description="Forward passes summed over ranks.")
    request_decode_steps: int = Field(0, description="Sum of per-request forward passes.")
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_pregen_tokens: int = 0
    drafts_fetched_tokens: int = 0
    tokens_per_forward: float = Field(0.0, description="completion / request_decode_steps.")


class RolloutResponse(_Body):
    step: int
    prompts: list[PromptResult]
    weight_versions: list[int]
    counters: RolloutCounters
    ranks: list[RankShard]
    reruns: list[Rerun] = Field(default_factory=list)
    wall_s: float
    warnings: list[str] = Field(default_factory=list)


__all__ = [
    "PromptIn", "PromptResult", "RankShard", "Rerun", "RolloutCounters",
    "RolloutRequest", "RolloutResponse", "SampleResult", "SamplingParams", "WeightUpdate",
]
