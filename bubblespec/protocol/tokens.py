"""HTTP bodies of vLLM's token routes on the gateway (`bubblespec.gateway.tokens`): the
token-in/token-out `POST /inference/v1/generate`, `POST /tokenize` and `POST /detokenize`,
in vLLM 0.32's shapes (`vllm/entrypoints/scale_out/token_in_token_out/protocol.py`,
`vllm/entrypoints/serve/tokenize/protocol.py`).

SkyRL's remote inference client and prime-rl's token client sample only through
`/inference/v1/generate`: token ids in, token ids and log-probs out. `sampling_params` takes
vLLM's `SamplingParams` keys with vLLM's defaults (`max_tokens` 16 when given as nothing
else; left out: what the context leaves, as vLLM's server sets it). Refused by name, as on
the OpenAI routes: string stops (the route is token-level: use `stop_token_ids`), `prompt_logprobs`
(served by `/v1/completions` with `echo`), beam search; keys of
`sampling_params` that vLLM's `SamplingParams` does not define (other unknown keys are
ignored, as vLLM's server ignores them). A `seed`
makes the request repeat bit for bit (keyed sampling by that seed, as on the OpenAI routes).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from bubblespec.protocol import limits as L
from bubblespec.protocol.limits import Seed, TokenIds
from bubblespec.protocol.openai import VllmStructuredOutputs
from bubblespec.protocol.sampling import (
    SamplingParams,
    SeedMode,
    allowed_not_empty,
    clamp_logit_bias,
)

DEFAULT_MAX_TOKENS = 16
"""vLLM's `SamplingParams.max_tokens` default."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Request(BaseModel):
    """A top-level body: keys it does not define are ignored, as vLLM's server ignores them
    (`sampling_params` keeps vLLM's `SamplingParams` keys only: an unknown one is refused)."""

    model_config = ConfigDict(extra="ignore")


def _unset(value: Any, name: str, why: str) -> Any:
    if value not in (None, False, 0, 0.0) and value != [] and value != {}:
        raise ValueError(f"{name} is not supported by bubblespec: {why}")
    return value


class VllmSampling(_Body):
    """`sampling_params` of the generate route: vLLM's `SamplingParams` keys."""

    n: int = Field(1, ge=1, le=L.MAX_N)
    temperature: float = Field(1.0, ge=0, le=L.MAX_TEMPERATURE, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: int = Field(0, ge=-1, le=L.MAX_TOP_K, description="0 or -1: off.")
    min_p: float = Field(0.0, ge=0, le=1, allow_inf_nan=False)
    presence_penalty: float = Field(0.0, ge=-L.MAX_ADDITIVE_PENALTY,
                                    le=L.MAX_ADDITIVE_PENALTY, allow_inf_nan=False)
    frequency_penalty: float = Field(0.0, ge=-L.MAX_ADDITIVE_PENALTY,
                                     le=L.MAX_ADDITIVE_PENALTY, allow_inf_nan=False)
    repetition_penalty: float = Field(1.0, ge=L.MIN_REPETITION_PENALTY,
                                      le=L.MAX_REPETITION_PENALTY, allow_inf_nan=False)
    seed: Seed | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[L.TokenId] | None = Field(None, max_length=L.MAX_STOP_TOKEN_IDS)
    ignore_eos: bool = False
    max_tokens: int | None = Field(None, ge=1, le=L.MAX_NEW_TOKENS)
    min_tokens: int = Field(0, ge=0, le=L.MAX_NEW_TOKENS)
    logprobs: int | None = Field(None, ge=0, le=L.MAX_TOP_LOGPROBS, description=(
        "The sampled token's log-prob and the N most likely tokens'."))
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[L.TokenId] | None = Field(None,
                                                      max_length=L.MAX_LOGIT_BIAS_ENTRIES)
    bad_words: list[Annotated[str, Field(min_length=1, max_length=4096)]] | None = Field(
        None, max_length=L.MAX_BAD_WORDS)
    structured_outputs: VllmStructuredOutputs | None = Field(None, description=(
        "One of json, regex, choice, grammar, json_object: the samples are constrained to it."))
    extra_args: dict[str, Any] | None = None
    flat_logprobs: bool = Field(False, description="vLLM: a layout of its Python objects; "
                                                   "no effect on the JSON answer.")
    logprob_token_ids: list[int] | None = None
    output_kind: int | None = Field(None, description="vLLM: how its engine streams; "
                                                      "accepted, no effect here.")
    output_text_buffer_length: int = Field(0, ge=0)
    prompt_logprob_start: int | None = None
    prompt_logprob_token_ids: list[int] | None = None
    repetition_detection: dict[str, Any] | None = None
    routed_experts_prompt_start: int | None = None
    skip_clone: bool = False
    skip_reading_prefix_cache: bool | None = None
    stream_interval: int | None = Field(None, ge=1)
    thinking_token_budget: int | None = None
    trace_decode_token_ids: list[int] | None = None
    watermarking: bool | None = None
    seed_mode: SeedMode | None = Field(None, description="bubblespec: keyed sampling.")

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[int, float] | None:
        return clamp_logit_bias(v)

    @field_validator("allowed_token_ids")
    @classmethod
    def _allowed_not_empty(cls, v: list[int] | None) -> list[int] | None:
        return allowed_not_empty(v)

    @field_validator("extra_args",
                     "logprob_token_ids", "prompt_logprob_start", "prompt_logprob_token_ids",
                     "repetition_detection", "routed_experts_prompt_start",
                     "thinking_token_budget", "trace_decode_token_ids", "watermarking")
    @classmethod
    def _not_built(cls, v: Any, info: ValidationInfo) -> Any:
        return _unset(v, str(info.field_name), "not built")

    @field_validator("stop")
    @classmethod
    def _no_stop_strings(cls, v: Any) -> Any:
        return _unset(v, "stop", "the token route stops on stop_token_ids")

    @field_validator("prompt_logprobs")
    @classmethod
    def _no_prompt_logprobs(cls, v: int | None) -> int | None:
        if v is not None:
            raise ValueError("prompt_logprobs is not supported on this route: POST "
                             "/v1/completions with echo, logprobs 0 and max_tokens 0 scores "
                             "a prompt")
        return v

    @field_validator("min_tokens")
    @classmethod
    def _min_within_max(cls, v: int, info: ValidationInfo) -> int:
        most = info.data.get("max_tokens")
        if most is not None and v > most:
            raise ValueError(f"min_tokens ({v}) must be at most max_tokens ({most})")
        return v

    @field_validator("seed")
    @classmethod
    def _seed_room(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and v + info.data.get("n", 1) - 1 > L.MAX_SEED:
            raise ValueError(f"seed + n - 1 must be at most {L.MAX_SEED}")
        return v

    def to_sampling(self, max_new_tokens: int) -> SamplingParams:
        """bubblespec's sampling parameters of every sample (a seeded request samples keyed
        by its seed unless it names its `seed_mode`)."""
        mode = self.seed_mode if self.seed_mode is not None else (
            SeedMode.KEYED if self.seed is not None else None)
        kw: dict[str, Any] = {} if mode is None else {"seed_mode": mode}
        return SamplingParams(
            max_new_tokens=max_new_tokens, temperature=self.temperature, top_p=self.top_p,
            top_k=self.top_k, repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            min_tokens=self.min_tokens, min_p=self.min_p, logit_bias=self.logit_bias or {},
            structured=None if self.structured_outputs is None
            else self.structured_outputs.constraint(),
            allowed_token_ids=tuple(self.allowed_token_ids or ()),
            bad_words=tuple(self.bad_words or ()),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos, **kw)


class StreamOptions(_Request):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class GenerateTokensIn(_Request):
    """POST /inference/v1/generate: one prompt as token ids."""

    request_id: str | None = Field(None, max_length=4096)
    token_ids: Annotated[TokenIds, Field(min_length=1)]
    sampling_params: VllmSampling = Field(default_factory=VllmSampling)
    model: str | None = Field(None, max_length=4096)
    return_token_ids: bool | None = None
    output_mode: Literal["tokens", "text"] = "tokens"
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=1024)
    priority: int = Field(0, ge=0, le=0, description="Only 0: no priority scheduling.")
    token_offsets: list[tuple[int, int]] | None = Field(None, description=(
        "vLLM: character offsets of the tokens (informational); accepted, not used."))
    reasoning_ended: bool | None = Field(None, description=(
        "vLLM: for structured outputs after reasoning; accepted (structured outputs are not "
        "served)."))
    reasoning_parser_kwargs: dict[str, Any] | None = None
    features: dict[str, Any] | None = None
    content_parts: list[dict[str, Any]] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    next_prompts: Annotated[list[TokenIds], Field(max_length=L.MAX_LIST)] | None = Field(
        None, description="bubblespec: the next step's prompts, pre-generated in the "
                          "bubble of the step this request joins.")


    @field_validator("features", "content_parts")
    @classmethod
    def _text_only(cls, v: Any, info: ValidationInfo) -> Any:
        return _unset(v, str(info.field_name), "the ranks serve text models")

    @field_validator("kv_transfer_params", "ec_transfer_params")
    @classmethod
    def _no_disaggregation(cls, v: Any, info: ValidationInfo) -> Any:
        return _unset(v, str(info.field_name), "disaggregated serving is not served")


class GenerateLogProb(BaseModel):
    token_id: int
    logprob: float
    rank: int | None = None


class GenerateLogProbsContent(GenerateLogProb):
    top_logprobs: list[GenerateLogProb] = Field(default_factory=list)


class GenerateLogProbs(BaseModel):
    content: list[GenerateLogProbsContent] | None = None


class TokenizeIn(_Request):
    """POST /tokenize: a text prompt, or `messages` rendered with the chat template."""

    model: str | None = Field(None, max_length=4096)
    prompt: str | None = Field(None, max_length=16 * L.MAX_PROMPT_TOKENS)
    messages: list[dict[str, Any]] | None = Field(None, max_length=L.MAX_LIST)
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool | None = False

    @field_validator("messages")
    @classmethod
    def _one_of(cls, v: list[dict[str, Any]] | None, info: ValidationInfo) -> Any:
        if v is not None and info.data.get("prompt") is not None:
            raise ValueError("give either prompt or messages, not both")
        return v

    @field_validator("continue_final_message")
    @classmethod
    def _no_continue(cls, v: bool) -> bool:
        return _unset(v, "continue_final_message", "not built yet")


class DetokenizeIn(_Request):
    """POST /detokenize: token ids to text."""

    model: str | None = Field(None, max_length=4096)
    tokens: Annotated[list[Annotated[int, Field(ge=0, le=L.MAX_TOKEN_ID)]],
                      Field(max_length=16 * L.MAX_PROMPT_TOKENS)]
