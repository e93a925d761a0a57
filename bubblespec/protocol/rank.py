"""HTTP bodies of a rank server, sent by the gateway (and SGLang-style callers).

Token-in/token-out with SGLang-style names (`input_ids`, `sampling_params`,
`max_new_tokens`, `output_ids`, `meta_info`). Requests forbid unknown keys. A sample's
`meta_info` is the engine's record of it (`SampleMeta`, `protocol/sample.py`), which ignores
keys it does not know, so that a gateway reads the samples of a newer rank.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bubblespec.protocol import limits as L
from bubblespec.protocol.domain import RankState
from bubblespec.protocol.limits import PromptKey, Seeds, Step, TokenIds, TopLogprobs
from bubblespec.protocol.sample import SampleMeta
from bubblespec.protocol.sampling import SamplingParams

ENGINE_DIED_HEADER = "x-bubblespec-engine-died"
"""Set to "1" on a rank's 503 when its engine died while it ran that very call (a shard or a
/generate): the gateway's poison-request policy counts such deaths (`gateway/quarantine.py`)."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ShardRequest(_Body):
    """One prompt of a shard with all its samples (siblings stay on one rank)."""

    index: int = Field(..., ge=0, le=L.MAX_INDEX,
                       description="Position of the prompt in the trainer's batch.")
    input_ids: TokenIds = Field(..., description="Prompt token ids.")
    n: int = Field(1, ge=1, le=L.MAX_N, description="Samples of this prompt on this rank.")
    sample_offset: int = Field(0, ge=0, le=L.MAX_SAMPLE_INDEX,
                               description="Sample index of the first sample.")
    seeds: Seeds | None = Field(None, description="One seed per sample (optional).")
    prompt_key: PromptKey | None = Field(
        None, description="Prompt-group key (default: hash of ids).")
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    top_logprobs: int = Field(0, ge=0, le=L.MAX_TOP_LOGPROBS, description=(
        "Also return, per generated token, the log-probs of this many most likely tokens "
        "(vLLM's `logprobs`: the engine's own, as it computes the sampled token's)."))

    @model_validator(mode="after")
    def _last_sample_index(self) -> ShardRequest:
        if self.sample_offset + self.n - 1 > L.MAX_SAMPLE_INDEX:
            raise ValueError(f"sample_offset + n - 1 must be at most {L.MAX_SAMPLE_INDEX}")
        return self


class StepShard(_Body):
    """POST /v1/step_shard: run this rank's share of a step, then pre-generate (the gateway
    builds this very model; the rank answers a `StepShardResult`)."""

    step: Step
    requests: list[ShardRequest] = Field(default_factory=list, max_length=L.MAX_LIST)
    pregen: bool = Field(True, description="Pre-generate next-step tasks once done.")
    rerun: bool = Field(False, description="Work taken over from a lost rank (no done report).")


class SampleOut(_Body):
    """One sampled response: a sample of a step shard, or an answer of POST /generate."""

    sample_index: int = Field(..., description="Index of the sample among its prompt's.")
    output_ids: list[int] = Field(..., description="Output token ids.")
    output_logprobs: list[float] = Field(..., description=(
        "The target model's log-probability of each output token."))
    output_top_logprobs: TopLogprobs | None = Field(None, description=(
        "When the request asked for `top_logprobs`: per output token, [token id, log-prob] "
        "of the most likely tokens and the sampled one (vLLM's order)."))
    meta_info: SampleMeta = Field(default_factory=SampleMeta, description=(
        "The engine's record of the sample, as the engine filled it: finish_reason, "
        "weight_version, completion_tokens, the speculation counters (decode_steps, "
        "num_drafts, num_draft_tokens, num_accepted_tokens, num_accepted_pregen_tokens) and "
        "the divergence counters (first_divergence, draft_ran_out, "
        "num_accepted_after_divergence, num_recouplings); see `protocol/sample.py`."))


class PromptOut(_Body):
    """All samples of one prompt of a shard."""

    index: int = Field(..., description="Position of the prompt in the trainer's batch.")
    prompt_key: str = Field(..., description="Prompt-group key the samples were drafted under.")
    samples: list[SampleOut]


class StepShardResult(_Body):
    """What a rank answers to /v1/step_shard."""

    step: int
    rank_id: str
    results: list[PromptOut] = Field(..., description="One entry per request of the shard.")
    decode_seconds: float = Field(0.0, description="Wall time the shard took on the rank.")
    drafts_fetched_tokens: int = Field(0, description=(
        "Pre-generated draft tokens the rank fetched from the synchronizer for the shard."))


class GenerateRequest(_Body):
    """POST /generate: SGLang-style single or batched token-in generation. The answer is
    one `SampleOut`, or a list of them (per prompt, its `n` samples) when `input_ids` is a
    batch or n > 1."""

    input_ids: TokenIds | Annotated[list[TokenIds], Field(max_length=L.MAX_LIST)]
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    n: int = Field(1, ge=1, le=L.MAX_N)
    seeds: Seeds | None = None


class ScoreRequest(_Body):
    """POST /v1/score: the model's log-probability of every token of each prompt given the
    tokens before it (vLLM's prompt log-probs), without generating. Not a step: the rank's
    state, step and pre-generation are untouched, and the prompts draft from nothing and
    feed no draft source (each runs in a group of its own, `GenRequest.score`)."""

    input_ids: Annotated[list[TokenIds], Field(min_length=1, max_length=L.MAX_LIST,
                                               description="The prompts to score.")]
    top_logprobs: int = Field(0, ge=0, le=L.MAX_TOP_LOGPROBS, description=(
        "Also the log-probs of this many most likely tokens at each prompt position."))


class CheckSampling(_Body):
    """POST /v1/check_sampling: would this rank's engine take these sampling parameters?
    (A structured-output constraint is compiled by its vLLM's backend.) A 400 names the
    field it refuses; 200 `{}` when it takes them. Nothing runs."""

    sampling_params: SamplingParams


class ParseToolCalls(_Body):
    """POST /v1/tool_calls: vLLM's tool parser `parser` over each output of a chat request
    (`request`, the body as the caller sent it to /v1/chat/completions), as vLLM's server
    parses tool_choice "auto": the parser adjusts the request, the output's tokens are
    decoded as the adjusted request says, and the parser extracts the calls."""

    parser: str = Field(..., min_length=1, max_length=256)
    request: dict[str, Any]
    outputs: Annotated[list[TokenIds], Field(max_length=L.MAX_N)]


class ParsedToolCall(_Body):
    id: str
    name: str
    arguments: str


class ParsedOutput(_Body):
    """One output parsed: its tool calls (none: `tools_called` false) and its content."""

    tools_called: bool
    tool_calls: list[ParsedToolCall]
    content: str | None


class ParsedToolCalls(_Body):
    results: list[ParsedOutput]


class ScoredPrompt(_Body):
    """One scored prompt: per token, its log-probability given the tokens before it."""

    prompt_logprobs: list[float | None] = Field(..., description=(
        "One per prompt token; the first is null (no context to score it from)."))
    prompt_ranks: list[int | None] | None = Field(None, description=(
        "Per prompt token, its rank at its position (1: the most likely); the first null."))
    prompt_top_logprobs: list[list[tuple[int, float]] | None] | None = Field(
        None, description="With top_logprobs: per position, [token id, log-prob] of the "
                          "prompt token and the most likely tokens (vLLM's order); the "
                          "first null.")


class ScoreResult(_Body):
    """What a rank answers to /v1/score: one entry per prompt, in order."""

    rank_id: str
    weight_version: int = Field(..., description="Weights the prompts were scored with.")
    results: list[ScoredPrompt]


class WeightUpdate(_Body):
    """POST /v1/weights: reload safetensors from a directory visible to the rank.

    The checkpoint is validated against the running model before anything changes; versions
    only go up (an older or equal one is refused with 409 unless `force` is set)."""

    path: str = Field(..., min_length=1, max_length=4096)
    version: L.WeightVersion | None = Field(
        None, description="New weight version (default: current + 1).")
    force: bool = Field(False, description="Accept a version that is not newer than the "
                                           "loaded one (e.g. rolling back to a checkpoint).")


class AbortStep(_Body):
    """POST /v1/abort_step: end this rank's shard of `step` early (finish reason abort, the
    tokens generated so far returned), as SGLang's abort of running requests does."""

    step: Step


class RankStateBody(_Body):
    """GET /v1/state of a rank (the heartbeat's `RankState` enum is the synchronizer's view)."""

    rank_id: str
    state: RankState = Field(..., description="starting | idle | decoding | pregen | "
                                               "updating_weights | released | engine_dead")
    weight_version: int
    step: int | None = None
    address: str = ""


class DraftIndexBody(_Body):
    """GET /v1/draft_index of a rank: the proposer's draft index against its budgets (all 0
    while the engine starts or runs without speculation)."""

    groups: int = 0
    live_requests: int = 0
    tokens: int = Field(0, description="Tokens in keyed groups (bounded by token_budget).")
    token_budget: int = 0
    global_tokens: int = 0
    global_token_budget: int = 0
    bytes: int = Field(0, description="Approximate bytes held by the index.")
    aligned: int = Field(0, description="Pre-generated responses kept for aligned drafting.")
    finished_stats: int = Field(0, description="Per-request counters not yet collected.")
    drafts_dropped: int = Field(0, description="Drafts dropped for token ids outside the "
                                               "vocabulary.")
    branches: int = Field(0, description="Drafts that have margin branches kept.")
    branches_taken: int = Field(0, description="Times a response followed a margin branch "
                                               "(since the engine started).")
    append_errors: int = Field(0, description="Deferred draft-index appends that failed "
                                              "(--defer-appends; since the last "
                                              "configuration).")
    draft_cap_rows: int = Field(0, description="Decoding requests x engine steps whose draft "
                                "cap the batch chose (`core.draft_budget`; since the last "
                                "configuration).")
    draft_cap_sum: int = Field(0, description="Sum of those caps (their mean: the sum over "
                               "the rows).")
    drafts_off_requests: int = Field(0, description=(
        "Running requests that decode without drafts (min_p or logit_bias)."))
    undrafted_steps: int = Field(0, description=(
        "Requests x engine steps decoded without drafts for their min_p or logit_bias "
        "(since the last configuration)."))


class HeapBody(_Body):
    """GET /v1/heap of a rank: what its vLLM worker process's memory is made of (all 0
    while the engine starts; fields absent on a platform without them stay 0). The first
    call starts counting forward shapes."""

    rss_kib: int = 0
    rss_anon_kib: int = Field(0, description="Anonymous resident memory (heap, arenas, "
                                             "anonymous maps).")
    rss_file_kib: int = Field(0, description="File-backed resident memory (libraries, "
                                             "mapped files).")
    rss_shmem_kib: int = 0
    vm_data_kib: int = 0
    malloc_arena: int = Field(0, description="Bytes of glibc's arenas (mallinfo2 arena).")
    malloc_mmapped: int = Field(0, description="Bytes in separately mapped large blocks.")
    malloc_in_use: int = Field(0, description="Bytes allocated by malloc's callers (torch's "
                                              "CPU tensors, oneDNN, Python).")
    malloc_free: int = Field(0, description="Bytes free inside the arenas.")
    malloc_top_pad: int = Field(0, description="Releasable bytes at the top of the heap.")
    forwards: int = Field(0, description="Forwards since the first call.")
    shapes: int = Field(0, description="Distinct scheduled-token counts of those forwards.")


class PaceBody(_Body):
    """GET /v1/pace of a rank: its paced forwards since the engine started (all 0 when the
    rank is not paced; seconds are wall seconds, `modelled_s` = paced_s / scale)."""

    profile: str = "off"
    scale: float = 0.0
    forwards: int = 0
    overruns: int = Field(0, description="Forwards whose real work exceeded the paced time.")
    overrun_share: float = 0.0
    valid: bool = Field(True, description="Under 1% of the forwards overran.")
    paced_s: float = 0.0
    real_s: float = 0.0
    overrun_s: float = 0.0
    worst_ratio: float = Field(0.0, description="Largest real / paced time of a forward.")
    ratio_hist: list[int] = Field(default_factory=list,
                                  description="Forwards per bucket of real / paced time.")
    ratio_p50: float = 0.0
    ratio_p99: float = 0.0
    scale_for_valid: float = Field(0.0, description="Scale x ratio_p99: the pace scale that "
                                   "would have kept the overruns under 1%.")
    modelled_s: float = 0.0
    decode_tokens: int = 0
    draft_tokens: int = 0
    prefill_tokens: int = 0
    context_tokens: int = 0
    drafting_s: float = Field(0.0, description="Proposer CPU seconds measured in paced "
                              "forwards (modelled seconds).")
    charged_s: float = Field(0.0, description="Of those, the seconds charged on top of the "
                             "forwards (included in paced_s x 1/scale, i.e. modelled_s).")
    forward_s: float = Field(0.0, description="Modelled seconds of the forwards alone "
                             "(engine-time model, engine host overhead included).")
    product_host_s: float = Field(0.0, description="Measured host seconds of the keyed sampler "
                                  "and verifier, charged (modelled seconds).")
    keyed_device_s: float = Field(0.0, description="Modelled device seconds of the keyed "
                                  "kernels, charged.")
    keyed_elements: int = Field(0, description="Position x vocabulary elements of the keyed "
                                "kernels (the modelled model's vocabulary).")
    keyed_launches: int = Field(0, description="Kernel launches of the keyed kernels.")
    async_hidden_s: float = Field(0.0, description="Modelled seconds hidden by overlapping "
                                  "host and GPU work (async scheduling, no speculation).")
    between_s: float = Field(0.0, description="Of product_host_s, the product's calls into "
                             "the engine between steps (drafts added, groups released, "
                             "counters read).")
