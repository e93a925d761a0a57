"""HTTP bodies of the gateway's SGLang-compatible routes (`bubblespec.gateway.sglang`).

slime and AReaL talk to their rollout servers through SGLang's native HTTP API; these models
spell its request fields the way SGLang's `GenerateReqInput` and `SamplingParams` do, so
that those clients switch to bubblespec by changing the server address. What bubblespec
cannot honour exactly is refused by name (a 400 naming the field) instead of being ignored:

- string stops (`stop`), streaming, images, LoRA adapters: refused when set
  (`stop_token_ids` is the token-level stop).

`json_schema`, `regex` and `ebnf` constrain the sample (the ranks' vLLM builds the grammar;
one the backend cannot build is a 400 naming `sampling_params`).

`frequency_penalty`, `presence_penalty` and `min_new_tokens` are carried to the ranks (vLLM
applies them in speculative verification as in its sampler: exact with drafts, tested in
`tests/engine/test_penalties.py`); so are `min_p` and `logit_bias`, which vLLM applies in its
sampler only, so such a request decodes without drafts (exact, not accelerated); `top_logprobs_num` with `return_logprob` answers
`meta_info.output_top_logprobs`.

Fields clients send that change nothing here are accepted: `skip_special_tokens`,
`spaces_between_special_tokens`, `no_stop_trim` (they shape the returned `text`),
`custom_params`. `max_new_tokens: 0` scores the prompt instead (`gateway/scoring.py`):
with `return_logprob`, `meta_info.input_token_logprobs` from `logprob_start_len` on, as
slime's on-policy distillation teacher reads them (`logprob_start_len` is ignored when
generating). The bubblespec-only fields are `seed_mode` (keyed sampling) and
`next_input_ids` (the next step's prompts, pre-generated in this step's bubble).
Unknown keys are refused (SGLang refuses unknown sampling parameters too).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from bubblespec.protocol import limits as L
from bubblespec.protocol.limits import Seed, TokenIds
from bubblespec.protocol.sample import SampleMeta
from bubblespec.protocol.sampling import (
    PregenWindow,
    SamplingParams,
    SeedMode,
    StructuredOutput,
    clamp_logit_bias,
)
from bubblespec.protocol.weights import version_text

BatchIds = Annotated[list[TokenIds], Field(max_length=L.MAX_LIST)]
Texts = Annotated[list[Annotated[str, Field(max_length=16 * L.MAX_PROMPT_TOKENS)]],
                  Field(max_length=L.MAX_LIST)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SglSamplingParams(_Body):
    """SGLang's `sampling_params` of /generate (the subset bubblespec serves exactly)."""

    max_new_tokens: int = Field(128, ge=0, le=L.MAX_NEW_TOKENS, description=(
        "0: score the prompt, generate nothing (with return_logprob and logprob_start_len "
        ">= 0, meta_info.input_token_logprobs)."))
    temperature: float = Field(1.0, ge=0, le=L.MAX_TEMPERATURE, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: int = Field(-1, ge=-1, le=L.MAX_TOP_K, description="-1 or 0: off.")
    min_p: float = Field(0.0, ge=0, le=1, allow_inf_nan=False)
    frequency_penalty: float = Field(0.0, ge=-L.MAX_ADDITIVE_PENALTY,
                                     le=L.MAX_ADDITIVE_PENALTY, allow_inf_nan=False)
    presence_penalty: float = Field(0.0, ge=-L.MAX_ADDITIVE_PENALTY,
                                    le=L.MAX_ADDITIVE_PENALTY, allow_inf_nan=False)
    repetition_penalty: float = Field(1.0, ge=L.MIN_REPETITION_PENALTY,
                                      le=L.MAX_REPETITION_PENALTY, allow_inf_nan=False)
    logit_bias: dict[str, float] | None = Field(None, description=(
        "Token id (a string, as SGLang takes it) -> bias added to its logit, clamped into "
        "[-100, 100]."))
    json_schema: str | None = Field(None, max_length=L.MAX_STRUCTURED_CHARS, description=(
        "A JSON schema (as JSON text) the sample follows."))
    regex: str | None = Field(None, max_length=L.MAX_STRUCTURED_CHARS)
    ebnf: str | None = Field(None, max_length=L.MAX_STRUCTURED_CHARS,
                             description="A grammar (EBNF/GBNF) the sample follows.")
    min_new_tokens: int = Field(0, ge=0, le=L.MAX_NEW_TOKENS, description=(
        "Stop tokens cannot end the sample before this many tokens (at most "
        "max_new_tokens)."))
    stop: str | list[str] | None = Field(None, description="Only empty: use stop_token_ids.")
    stop_token_ids: list[L.TokenId] | None = Field(None, max_length=L.MAX_STOP_TOKEN_IDS)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = Field(1, ge=1, le=L.MAX_N)
    sampling_seed: Seed | None = Field(None, description="Seed of this request's sample.")
    custom_params: dict[str, Any] | None = Field(None, description="Accepted and ignored.")
    seed_mode: SeedMode = Field(SeedMode.DEFAULT, description="bubblespec: keyed sampling.")

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[int, float] | None:
        return clamp_logit_bias(v)

    @model_validator(mode="after")
    def _one_constraint(self) -> SglSamplingParams:
        self.structured()  # at most one, well formed
        return self

    def structured(self) -> StructuredOutput | None:
        """The constraint of `json_schema`, `regex` or `ebnf` (None: none)."""
        if self.json_schema is None and self.regex is None and self.ebnf is None:
            return None
        return StructuredOutput(json_schema=self.json_schema, regex=self.regex,
                                grammar=self.ebnf)

    @field_validator("min_new_tokens")
    @classmethod
    def _min_within_max(cls, v: int, info: ValidationInfo) -> int:
        if v > info.data.get("max_new_tokens", v):
            raise ValueError("min_new_tokens must be at most max_new_tokens")
        return v

    @field_validator("stop")
    @classmethod
    def _no_stop_strings(cls, v: str | list[str] | None) -> str | list[str] | None:
        if v:
            raise ValueError("string stops are not supported: use stop_token_ids")
        return v

    def to_sampling(self) -> SamplingParams:
        """bubblespec's sampling parameters of one sample of this request (`seed_mode` only
        when the request names it, so that the gateway's hand-off default applies to a step
        that hands prompts ahead, as on the other APIs)."""
        return SamplingParams(
            max_new_tokens=self.max_new_tokens, temperature=self.temperature,
            top_p=self.top_p, top_k=self.top_k, repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            min_tokens=self.min_new_tokens, min_p=self.min_p, logit_bias=self.logit_bias or {},
            structured=self.structured(),
            stop_token_ids=tuple(self.stop_token_ids or ()), ignore_eos=self.ignore_eos,
            **({"seed_mode": self.seed_mode} if "seed_mode" in self.model_fields_set else {}))


def _off(value: Any, name: str, default: Any = None) -> Any:
    if value not in (default, None) and value != [] and value != {}:
        raise ValueError(f"{name} is not supported by bubblespec")
    return value


class GenerateIn(_Body):
    """POST /generate: one prompt (`input_ids` or `text`) or a batch (lists of them)."""

    input_ids: TokenIds | BatchIds | None = None
    text: Annotated[str, Field(max_length=16 * L.MAX_PROMPT_TOKENS)] | Texts | None = None
    sampling_params: SglSamplingParams = Field(default_factory=SglSamplingParams)
    return_logprob: bool = False
    logprob_start_len: int | None = Field(None, ge=-1, description=(
        "With max_new_tokens 0 and return_logprob: the prompt position from which "
        "input_token_logprobs are returned (below the prompt's length; -1 or null: none). "
        "Generating requests return only the output's log-probs."))
    top_logprobs_num: int | None = Field(None, ge=0, le=L.MAX_TOP_LOGPROBS, description=(
        "With return_logprob: the most likely tokens of each output position "
        "(`output_top_logprobs`)."))
    return_text_in_logprobs: bool = False
    stream: bool = False
    rid: str | list[str] | None = Field(None, description="Request id(s), for /abort_request.")
    image_data: Any = None
    lora_path: Any = None
    return_hidden_states: bool = False
    return_routed_experts: bool = False
    custom_logit_processor: Any = None
    next_input_ids: BatchIds | None = Field(
        None, description="bubblespec: the next step's prompts, pre-generated in the bubble "
                          "of the step this request joins.")

    @field_validator("stream", "return_hidden_states", "return_routed_experts")
    @classmethod
    def _false(cls, v: bool, info: Any) -> bool:
        if v:
            raise ValueError(f"{info.field_name} is not supported by bubblespec")
        return v

    @field_validator("image_data", "lora_path", "custom_logit_processor")
    @classmethod
    def _none(cls, v: Any, info: Any) -> Any:
        return _off(v, info.field_name)

    @field_validator("input_ids", "text", "next_input_ids")
    @classmethod
    def _not_empty(cls, v: Any) -> Any:
        if v is not None and (not v or any(not p for p in v if isinstance(p, (list, str)))):
            raise ValueError("empty prompt (or empty batch)")
        return v

    @model_validator(mode="after")
    def _one_prompt_source(self) -> GenerateIn:
        if (self.input_ids is None) == (self.text is None):
            raise ValueError("give exactly one of input_ids and text")
        prompts = self.prompts()
        if isinstance(self.rid, list) and len(self.rid) != len(prompts):
            raise ValueError(f"rid: {len(self.rid)} ids for {len(prompts)} prompts")
        return self

    @property
    def batched(self) -> bool:
        """True when the prompts came as a list (the answer is then a list too)."""
        value = self.input_ids if self.input_ids is not None else self.text
        return isinstance(value, list) and bool(value) and not isinstance(value[0], int)

    def prompts(self) -> list[list[int] | str]:
        """The prompts, each as token ids or as text."""
        value: Any = self.input_ids if self.input_ids is not None else self.text
        if self.batched:
            return list(value)
        return [value]

    def rids(self) -> list[str | None]:
        """The request id of each prompt (None where the caller gave none)."""
        n = len(self.prompts())
        if isinstance(self.rid, list):
            return list(self.rid)
        return [self.rid] * n


class WeightsFromDiskIn(BaseModel):
    """POST /update_weights_from_disk. Other keys SGLang knows (`load_format`, `flush_cache`,
    `abort_all_requests`, ...) are accepted and change nothing here except
    `abort_all_requests` (queued requests are answered with finish reason abort)."""

    model_config = ConfigDict(extra="ignore")

    model_path: str = Field(..., min_length=1, max_length=4096)
    weight_version: Annotated[str | int | None, AfterValidator(version_text)] = Field(
        None, description="A non-negative integer (bubblespec versions are integers); "
                          "default: the ranks' version + 1.")
    abort_all_requests: bool = False

    def version(self) -> int | None:
        return None if self.weight_version is None else int(str(self.weight_version))


class AbortIn(_Body):
    """POST /abort_request: one request by `rid`, or every request (`abort_all`)."""

    rid: str = Field("", max_length=L.MAX_KEY_CHARS)
    abort_all: bool = False
    finished_reason: str | None = None
    abort_message: str | None = None

    @model_validator(mode="after")
    def _something(self) -> AbortIn:
        if not self.rid and not self.abort_all:
            raise ValueError("give rid or abort_all")
        return self


class PauseIn(_Body):
    """POST /pause_generation: `abort` answers queued requests with finish reason abort;
    `retract` and `in_place` keep them queued until /continue_generation."""

    mode: Literal["abort", "retract", "in_place"] = "abort"


class NextPromptsIn(_Body):
    """POST /v1/next_prompts (bubblespec): prompts of the next step, pre-generated in the
    bubble of the next step that starts; or a list of the next steps' batches (the next
    step's first), which later bubbles go on to once the nearer steps are covered."""

    input_ids: BatchIds | Annotated[list[BatchIds], Field(max_length=L.MAX_LOOKAHEAD)] | None = (
        Field(None, min_length=1, description="Required unless the body sets the window only."))
    pregen_window: PregenWindow | None = Field(
        None, description="How long the steps run from now on pre-generate: until the "
        "slowest rank is done ('bubble') or on through the training window until the next "
        "step or weight push ('training'); kept until set again. Default: the gateway's.")

    @field_validator("input_ids")
    @classmethod
    def _not_empty(cls, v: list | None) -> list | None:
        for b in cls._of(v or []):
            for p in b:
                if not p:
                    raise ValueError("a prompt is empty")
        return v

    @model_validator(mode="after")
    def _something(self) -> NextPromptsIn:
        if self.input_ids is None and self.pregen_window is None:
            raise ValueError("give input_ids (or pregen_window alone)")
        return self

    @staticmethod
    def _of(v: list) -> list[list[list[int]]]:
        return v if v and isinstance(v[0], list) and v[0] and isinstance(v[0][0], list) else [v]

    def batches(self) -> list[list[list[int]]]:
        """The prompts as a list of future steps' batches (one batch: a list of one)."""
        return self._of(self.input_ids) if self.input_ids else []


class FinishReason(BaseModel):
    """`meta_info.finish_reason`: stop (with the `matched` token id), length or abort."""

    type: Literal["stop", "length", "abort"]
    matched: int | None = None
    length: int | None = None
    message: str | None = None


class SglSampleMeta(SampleMeta):
    """`meta_info.bubblespec`: the engine's record of the sample (`SampleMeta`, as the rank
    reported it) and the rollout step it ran in."""

    step: int | None = None


class SglMetaInfo(BaseModel):
    """`meta_info` of one answer: SGLang's keys, and bubblespec's record of the sample under
    `bubblespec` (absent for a request aborted before it ran). Keys left unset are not sent
    (`output_token_logprobs` unless asked for, the finish reason's other variants)."""

    id: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    weight_version: str = "0"
    e2e_latency: float = 0.0
    output_token_logprobs: list[tuple[float, int, str | None]] | None = None
    output_top_logprobs: list[list[tuple[float, int, str | None]]] | None = None
    """With `top_logprobs_num`: per output position, [log-prob, token id, text or null] of
    the most likely tokens, most likely first."""
    input_token_logprobs: list[tuple[float | None, int, str | None]] | None = None
    """Prompt scoring (max_new_tokens 0): [log-prob, token id, text or null] of each prompt
    token from logprob_start_len on; the first prompt token's log-prob is null."""
    bubblespec: SglSampleMeta | None = None
