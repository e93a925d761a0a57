"""HTTP bodies of the gateway's OpenAI-compatible routes (`bubblespec.gateway.openai`).

Agentic RL frameworks (SkyRL, ART, rLLM, prime-rl) drive vLLM through its OpenAI API:
`POST /v1/completions` and `POST /v1/chat/completions`, reading token ids and log-probs back
(vLLM's `return_token_ids`). These models spell the request fields as OpenAI and vLLM do
(vLLM's extensions: `top_k`, `repetition_penalty`, `min_tokens`, `stop_token_ids`,
`ignore_eos`, `return_token_ids`, `return_tokens_as_token_ids`, `skip_special_tokens`,
`include_stop_str_in_output`, `add_special_tokens`, `add_generation_prompt`,
`chat_template_kwargs`, `reasoning_effort`), so that a client switches by address. Top
log-probs (`logprobs: N`, `top_logprobs: N`) are the engine's, in vLLM's order; the
penalties and `min_tokens` reach the engine, which applies them in verification too.
`min_p` and `logit_bias` (clamped into [-100, 100] as vLLM clamps it) reach the engine too,
whose sampler applies them; vLLM's verification does not, so such a request decodes without
drafts (exact, not accelerated; its samples' `drafts_off` says so).

What bubblespec cannot serve exactly is refused by name (a 400 whose `param` is the field),
never ignored:

- `best_of` other than n, `use_beam_search`, `suffix`: other sampling procedures;
- `max_tokens: 0` without `echo` (with `echo` it scores the prompt, `gateway/scoring.py`),
  `prompt_logprobs` -1 (the whole vocabulary: vLLM refuses more than 20 too) and
  `prompt_logprobs` > 0 when streaming (as vLLM);
- `tool_choice` "auto" (the default with `tools`) when the gateway runs without
  `--enable-auto-tool-choice --tool-call-parser NAME`, in vLLM's words (vLLM's server
  refuses it the same way); "required" and a named tool are served as vLLM serves them (the
  output constrained to the tool calls' JSON schema), auto with the parser (vLLM's own, run
  on a rank); `tools` are rendered by the chat template, as are the `tool_calls` and `tool`
  turns of the history;
- `response_format` structural_tag, non-text message content: not built;

Keys these models do not define are ignored, as vLLM's server ignores them (logged at
debug). Accepted and without effect on sampling: `model` (echoed back; the gateway serves one
model), `user`, `stream_options`, `spaces_between_special_tokens`, `cache_salt`. `seed`
gives choice k of a prompt the seed `seed + k`, keyed (a seeded request repeats bit for
bit, speculation on or off, unless it names its `seed_mode`). The bubblespec extensions:
`seed_mode` (keyed sampling, `protocol/sampling.py`) and `next_prompts` (the next step's
prompts, token ids or text, pre-generated in the bubble of the step this request joins).
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from bubblespec.protocol import limits as L
from bubblespec.protocol.limits import Seed, TokenIds
from bubblespec.protocol.sampling import (
    SamplingParams,
    SeedMode,
    StructuredOutput,
    allowed_not_empty,
    clamp_logit_bias,
)

log = logging.getLogger("bubblespec.protocol.openai")

MAX_STOP_STRINGS = 64
"""Most stop strings of one request."""
MAX_STOP_CHARS = 1024
"""Longest stop string."""
MAX_TEXT = 16 * L.MAX_PROMPT_TOKENS
"""Longest prompt text or message content, characters (the config's token limit is tighter)."""
DEFAULT_COMPLETION_TOKENS = 16
"""OpenAI's default `max_tokens` of /v1/completions."""

Text = Annotated[str, Field(max_length=MAX_TEXT)]
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
StopStrings = Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)]
NextPrompt = TokenIds | Text
NextPrompts = Annotated[list[NextPrompt], Field(max_length=L.MAX_LIST)]


class _Body(BaseModel):
    """A request body as vLLM's server reads one (`OpenAIBaseModel`): keys it does not define
    are ignored (logged at debug), so that a client sending a newer or another server's
    field is served as vLLM would serve it."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="wrap")
    @classmethod
    def _log_ignored(cls, data: Any, handler: Any) -> Any:
        result = handler(data)
        if isinstance(data, dict):
            ignored = data.keys() - cls.model_fields.keys()
            if ignored:
                log.debug("%s: ignored fields %s (as vLLM's server ignores them)",
                          cls.__name__, sorted(ignored))
        return result


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")


AUTO_TOOLS_REFUSED = ('"auto" tool choice requires --enable-auto-tool-choice and '
                      "--tool-call-parser to be set")
"""vLLM's answer to tool_choice "auto" (the default with tools) without a tool-call parser
(the gateway's `--enable-auto-tool-choice --tool-call-parser NAME` turn it on)."""
NOT_BUILT = {
    "logprob_token_ids": "log-probs of chosen tokens are not built (top_logprobs is)",
    "repetition_detection": "not built",
    "thinking_token_budget": "reasoning budgets are not built",
    "watermarking": "not built",
    "vllm_xargs": "the ranks take no custom sampling arguments",
    "kv_transfer_params": "disaggregated prefill is not served",
    "ec_transfer_params": "disaggregated encoders are not served",
    "mm_payload": "the ranks serve text models",
    "return_mm_kwargs": "the ranks serve text models",
    "return_token_offsets": "not built",
    "routed_experts_prompt_start": "expert routing is not returned",
}
"""vLLM's request fields the gateway refuses when set, and why."""


def _unset(value: Any, name: str, why: str) -> Any:
    if value not in (None, False) and value != [] and value != {}:
        raise ValueError(f"{name} is not supported by bubblespec: {why}")
    return value


def tool_calls_schema(tools: list[dict[str, Any]], named: str | None,
                      parallel: bool | None) -> dict[str, Any]:
    """vLLM's JSON schema of the output for tool_choice "required" (an array of at least
    one {name, parameters}, at most one when `parallel` is false) or for the `named` tool
    (its parameters)."""
    def params(fn: dict[str, Any]) -> dict[str, Any]:
        p = fn.get("parameters")
        return p if isinstance(p, dict) and p else {"type": "object", "properties": {}}

    fns = [t["function"] for t in tools]
    if named is not None:
        return params(next(f for f in fns if f["name"] == named))
    defs: dict[str, Any] = {}
    items = []
    for f in fns:
        p = dict(params(f))
        defs.update(p.pop("$defs", {}) or {})
        items.append({"properties": {"name": {"type": "string", "enum": [f["name"]]},
                                     "parameters": p},
                      "required": ["name", "parameters"]})
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": {"type": "object", "anyOf": items}}
    if parallel is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def _prompt_logprobs_range(v: int | None, stream: bool) -> int | None:
    """vLLM's checks of `prompt_logprobs` (its default `max_logprobs` 20 bounds it)."""
    if v is None:
        return v
    if v == -1 or v > L.MAX_TOP_LOGPROBS:  # -1: the whole vocabulary (vLLM's words)
        raise ValueError(f"Requested prompt logprobs of {v}, which is greater than max "
                         f"allowed: {L.MAX_TOP_LOGPROBS}")
    if v < 0:
        raise ValueError("`prompt_logprobs` must be a positive value or -1.")
    if v > 0 and stream:
        raise ValueError("`prompt_logprobs` are not available when `stream=True`.")
    return v


class StreamOptions(_Body):
    """`stream_options`: `include_usage` adds a last chunk with the usage."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(_Body):
    """`response_format.json_schema`: a named schema (OpenAI's shape)."""

    name: str | None = Field(None, max_length=4096)
    description: str | None = None
    json_schema: dict[str, Any] | bool = Field(True, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    """`response_format`: text, any JSON object, or JSON following a schema."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _kind(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format json_schema needs json_schema.schema")
        if self.type == "structural_tag":
            raise ValueError("response_format structural_tag is not supported by bubblespec "
                             "(json_schema, json_object and vLLM's structured_outputs are)")
        return self

    def constraint(self) -> StructuredOutput | None:
        if self.type == "json_object":
            return StructuredOutput(json_object=True)
        if self.type == "json_schema" and self.json_schema is not None:
            return StructuredOutput(json_schema=self.json_schema.json_schema)
        return None


class VllmStructuredOutputs(_Body):
    """vLLM's `structured_outputs`: exactly one of json (a schema), regex, choice, grammar,
    json_object; its whitespace options and structural tags are refused (not carried)."""

    json_: dict[str, Any] | bool | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    @field_validator("disable_any_whitespace", "disable_additional_properties",
                     "whitespace_pattern", "structural_tag")
    @classmethod
    def _options(cls, v: Any, info: ValidationInfo) -> Any:
        return _unset(v, f"structured_outputs.{info.field_name}", "not carried to the ranks")

    @model_validator(mode="after")
    def _builds(self) -> VllmStructuredOutputs:
        self.constraint()  # exactly one kind, each well formed
        return self

    def constraint(self) -> StructuredOutput:
        return StructuredOutput(json_schema=self.json_, regex=self.regex,
                                choice=None if self.choice is None else tuple(self.choice),
                                grammar=self.grammar, json_object=bool(self.json_object))


class SamplingFields(_Body):
    """The sampling fields both routes share (OpenAI's and vLLM's names)."""

    model: str | None = Field(None, max_length=4096, description="Echoed back.")
    n: int = Field(1, ge=1, le=L.MAX_N, description="Choices per prompt.")
    temperature: float | None = Field(None, ge=0, le=L.MAX_TEMPERATURE, allow_inf_nan=False,
                                      description="Default 1.")
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=-1, le=L.MAX_TOP_K, description="-1 or 0: off.")
    min_p: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    repetition_penalty: float | None = Field(
        None, ge=L.MIN_REPETITION_PENALTY, le=L.MAX_REPETITION_PENALTY, allow_inf_nan=False)
    presence_penalty: float | None = Field(None, ge=-L.MAX_ADDITIVE_PENALTY,
                                           le=L.MAX_ADDITIVE_PENALTY, allow_inf_nan=False)
    frequency_penalty: float | None = Field(None, ge=-L.MAX_ADDITIVE_PENALTY,
                                            le=L.MAX_ADDITIVE_PENALTY, allow_inf_nan=False)
    logit_bias: dict[str, float] | None = None
    min_tokens: int = Field(0, ge=0, le=L.MAX_NEW_TOKENS)
    stop: StopString | StopStrings | None = Field(
        None, description="Strings that end a choice (cut after sampling, as vLLM does).")
    stop_token_ids: list[L.TokenId] | None = Field(None, max_length=L.MAX_STOP_TOKEN_IDS)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    seed: Seed | None = Field(None, description="Choice k of a prompt samples with seed + k.")
    seed_mode: SeedMode | None = Field(None, description="bubblespec: keyed sampling.")
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = Field(False, description="vLLM: choices carry token_ids and "
                                                      "the prompt's token ids.")
    return_tokens_as_token_ids: bool = Field(
        False, description="vLLM: tokens in log-probs spelled `token_id:<id>`, not as text.")
    user: str | None = Field(None, max_length=4096)
    add_special_tokens: bool | None = Field(
        None, description="vLLM: add the tokenizer's special tokens (BOS) to a text prompt; "
                          "default true on completions, false on chat (the template writes "
                          "them).")
    spaces_between_special_tokens: bool = Field(
        True, description="vLLM: accepted; a fast tokenizer's decoding (vLLM's and the "
                          "gateway's) does not read it.")
    cache_salt: str | None = Field(
        None, min_length=1, max_length=1024,
        description="vLLM: salts the prefix cache; accepted, not forwarded: it does not "
                    "change what is sampled (see docs/api.md).")
    request_id: str | None = Field(None, max_length=4096,
                                   description="vLLM: the answer's id (`cmpl-<id>`).")
    priority: int = Field(0, ge=0, le=0, description="vLLM: only 0 (the ranks schedule "
                                                     "first come, first served).")
    session_id: str | None = Field(None, max_length=4096,
                                   description="vLLM: a routing hint; accepted, no effect.")
    stream_interval: int | None = Field(
        None, ge=1, description="vLLM: tokens per streamed chunk; accepted (a choice is sent "
                                "in one chunk when its step ends).")
    truncate_prompt_tokens: int | None = Field(
        None, ge=-1, le=L.MAX_PROMPT_TOKENS,
        description="vLLM: keep only this many prompt tokens (-1: the context length).")
    truncation_side: Literal["left", "right"] | None = Field(
        None, description="vLLM: which end truncate_prompt_tokens cuts (default left).")
    length_penalty: float = Field(1.0, description="vLLM: beam search only; only 1.")
    allowed_token_ids: list[L.TokenId] | None = Field(
        None, max_length=L.MAX_LOGIT_BIAS_ENTRIES,
        description="vLLM: only these tokens are sampled.")
    bad_words: list[Annotated[str, Field(min_length=1, max_length=4096)]] | None = Field(
        None, max_length=L.MAX_BAD_WORDS, description="vLLM: words that are not sampled.")
    logprob_token_ids: list[int] | None = None
    response_format: ResponseFormat | None = Field(None, description=(
        "text, json_object or json_schema: the choices are constrained to it."))
    structured_outputs: VllmStructuredOutputs | None = Field(None, description=(
        "vLLM: one of json, regex, choice, grammar, json_object."))
    repetition_detection: dict[str, Any] | None = None
    thinking_token_budget: int | None = None
    watermarking: bool | None = None
    vllm_xargs: dict[str, Any] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    mm_payload: Any = None
    return_mm_kwargs: bool | None = None
    return_token_offsets: bool | None = None
    routed_experts_prompt_start: int | None = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_decoding_backend: Any = None
    guided_whitespace_pattern: Any = None

    @field_validator("guided_json", "guided_regex", "guided_choice", "guided_grammar",
                     "guided_decoding_backend", "guided_whitespace_pattern")
    @classmethod
    def _removed_guided(cls, v: Any, info: ValidationInfo) -> Any:
        return _unset(v, str(info.field_name), "vLLM removed the guided-decoding fields (its "
                                               "server ignores them: the output would not be "
                                               "constrained), and constrained decoding is not "
                                               "built")

    @field_validator("structured_outputs")
    @classmethod
    def _one_constraint(cls, v: VllmStructuredOutputs | None,
                        info: ValidationInfo) -> VllmStructuredOutputs | None:
        fmt = info.data.get("response_format")
        if v is not None and fmt is not None and fmt.type != "text":
            raise ValueError("send response_format or structured_outputs, not both")
        return v

    @property
    def structured(self) -> StructuredOutput | None:
        """The constraint `response_format` or `structured_outputs` asks for (None: none)."""
        if self.structured_outputs is not None:
            return self.structured_outputs.constraint()
        return None if self.response_format is None else self.response_format.constraint()

    @property
    def structured_field(self) -> str:
        """The field that carries the constraint (what a refusal of it names)."""
        return "structured_outputs" if self.structured_outputs is not None else \
            "response_format"

    @field_validator("allowed_token_ids")
    @classmethod
    def _allowed_not_empty(cls, v: list[int] | None) -> list[int] | None:
        return allowed_not_empty(v)

    @field_validator("logprob_token_ids",
                     "repetition_detection", "thinking_token_budget",
                     "watermarking", "vllm_xargs", "kv_transfer_params", "ec_transfer_params",
                     "mm_payload", "return_mm_kwargs", "return_token_offsets",
                     "routed_experts_prompt_start")
    @classmethod
    def _vllm_not_built(cls, v: Any, info: ValidationInfo) -> Any:
        return _unset(v, str(info.field_name), NOT_BUILT.get(str(info.field_name), "not built"))

    @field_validator("length_penalty")
    @classmethod
    def _beam_only(cls, v: float) -> float:
        if v != 1.0:
            raise ValueError("length_penalty applies to beam search, which is not served")
        return v
    next_prompts: NextPrompts | None = Field(
        None, description="bubblespec: the next step's prompts (token ids or text), "
                          "pre-generated in the bubble of the step this request joins.")

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[int, float] | None:
        return clamp_logit_bias(v)

    @field_validator("seed")
    @classmethod
    def _seed_room(cls, v: int | None, info: ValidationInfo) -> int | None:
        n = info.data.get("n", 1)
        if v is not None and v + n - 1 > L.MAX_SEED:
            raise ValueError(f"seed + n - 1 must be at most {L.MAX_SEED}")
        return v

    @field_validator("next_prompts")
    @classmethod
    def _next_not_empty(cls, v: list[Any] | None) -> list[Any] | None:
        if v is not None and any(not p for p in v):
            raise ValueError("a next prompt is empty")
        return v

    def stops(self) -> list[str]:
        """The stop strings (none: [])."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def to_sampling(self, max_new_tokens: int) -> SamplingParams:
        """bubblespec's sampling parameters of every choice of this request. `seed_mode` only
        when given, so the gateway's hand-off default applies otherwise; a request with a
        `seed` and no `seed_mode` samples keyed by its seed, so that it repeats bit for bit
        (alone or batched, speculation on or off), as vLLM promises of a seeded request."""
        kw: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "top_k": -1 if self.top_k is None else self.top_k,
            "repetition_penalty": 1.0 if self.repetition_penalty is None
            else self.repetition_penalty,
            "presence_penalty": self.presence_penalty or 0.0,
            "frequency_penalty": self.frequency_penalty or 0.0,
            "min_tokens": self.min_tokens, "min_p": self.min_p or 0.0,
            "structured": self.structured,
            "allowed_token_ids": tuple(self.allowed_token_ids or ()),
            "bad_words": tuple(self.bad_words or ()),
            "logit_bias": self.logit_bias or {},
            "stop_token_ids": tuple(self.stop_token_ids or ()), "ignore_eos": self.ignore_eos}
        if self.seed_mode is not None:
            kw["seed_mode"] = self.seed_mode
        elif self.seed is not None:  # a seeded request repeats, speculation on or off
            kw["seed_mode"] = SeedMode.KEYED
        return SamplingParams(**kw)

    @property
    def num_top_logprobs(self) -> int:
        """Top alternatives per generated token the choices carry (the routes' fields)."""
        return 0

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionIn(SamplingFields):
    """POST /v1/completions: `prompt` is text, token ids, or a list of either."""

    prompt: TokenIds | Annotated[list[TokenIds], Field(max_length=L.MAX_LIST)] | Text | \
        Annotated[list[Text], Field(max_length=L.MAX_LIST)]
    max_tokens: int | None = Field(DEFAULT_COMPLETION_TOKENS, ge=0, le=L.MAX_NEW_TOKENS,
                                   description="null: what the context leaves; 0 (with "
                                   "echo): score the prompt, generate nothing.")
    logprobs: int | None = Field(None, ge=0, le=L.MAX_TOP_LOGPROBS, description=(
        "The sampled token's log-prob and the N most likely tokens' (vLLM's meaning)."))
    echo: bool = False
    best_of: int | None = Field(None, ge=1, le=L.MAX_N)
    prompt_embeds: Any = None
    suffix: str | None = None
    use_beam_search: bool = False
    prompt_logprobs: int | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, v: Any) -> Any:
        if not v or (isinstance(v, list) and any(isinstance(p, (list, str)) and not p
                                                 for p in v)):
            raise ValueError("empty prompt (or empty list of prompts)")
        if isinstance(v, str) and not v.strip() or isinstance(v, list) and any(
                isinstance(p, str) and not p.strip() for p in v):
            raise ValueError("a text prompt is blank")
        return v

    @property
    def num_top_logprobs(self) -> int:
        """Top alternatives per generated token the choices carry."""
        return self.logprobs or 0

    @property
    def prompt_top(self) -> int | None:
        """Top alternatives per prompt token the prompts are scored with (vLLM's rule:
        `prompt_logprobs`, else `logprobs` when echoing); None: the prompts are not scored."""
        if self.prompt_logprobs is not None:
            return self.prompt_logprobs
        return self.logprobs if self.echo else None

    @field_validator("prompt_logprobs")
    @classmethod
    def _prompt_logprobs(cls, v: int | None, info: ValidationInfo) -> int | None:
        return _prompt_logprobs_range(v, bool(info.data.get("stream")))

    @field_validator("prompt_embeds")
    @classmethod
    def _no_embeds(cls, v: Any) -> Any:
        return _unset(v, "prompt_embeds", "the ranks take token ids")

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and v != info.data.get("n", 1):
            raise ValueError("best_of other than n is not supported (every sample is returned)")
        return v

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        return _unset(v, "suffix", "insertion is not a left-to-right rollout")

    @field_validator("use_beam_search")
    @classmethod
    def _no_beam(cls, v: bool) -> bool:
        return _unset(v, "use_beam_search", "rollouts sample")

    def prompts(self) -> list[list[int] | str]:
        """The prompts, each token ids or text."""
        p: Any = self.prompt
        if isinstance(p, str):
            return [p]
        if p and isinstance(p[0], int):
            return [list(p)]
        return list(p)


class TextPart(_Body):
    """A text part of a message's content (other part types are refused)."""

    type: Literal["text"]
    text: Text


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(..., max_length=4096)
    arguments: str | dict[str, Any] = Field(default="{}")


class ToolCall(BaseModel):
    """A tool call of an earlier assistant turn, as OpenAI spells it."""

    model_config = ConfigDict(extra="allow")

    id: str | None = Field(None, max_length=4096)
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    """One message of the conversation. Keys besides role/content/name (a template may read
    them, e.g. `reasoning_content`) are passed to the chat template as they are; so are an
    assistant turn's `tool_calls` and a tool turn's `tool_call_id`."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | Annotated[list[TextPart], Field(max_length=L.MAX_LIST)] | None = None
    name: str | None = Field(None, max_length=4096)
    tool_calls: Annotated[list[ToolCall], Field(max_length=L.MAX_LIST)] | None = None
    tool_call_id: str | None = Field(None, max_length=4096)

    def template_dict(self) -> dict[str, Any]:
        """The message as the chat template sees it: text parts joined by newlines (as vLLM
        does for string-content templates), unset keys left out, and a tool call's
        `arguments` given as JSON text parsed into a dict, as vLLM hands them to templates
        that iterate them."""
        d = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            d["content"] = "\n".join(p.text for p in self.content)
        elif self.content is None:
            d["content"] = ""
        for call in d.get("tool_calls") or []:
            args = call.get("function", {}).get("arguments")
            if isinstance(args, str):
                try:
                    parsed = json.loads(args)
                except ValueError:
                    continue  # the template gets the text as the client sent it
                if isinstance(parsed, dict):
                    call["function"]["arguments"] = parsed
        return d


class ChatCompletionIn(SamplingFields):
    """POST /v1/chat/completions: `messages` rendered with the model's chat template."""

    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=L.MAX_LIST)]
    max_tokens: int | None = Field(None, ge=1, le=L.MAX_NEW_TOKENS)
    max_completion_tokens: int | None = Field(
        None, ge=1, le=L.MAX_NEW_TOKENS, description="Wins over max_tokens; neither: what "
                                                     "the context leaves.")
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=L.MAX_TOP_LOGPROBS, description=(
        "With logprobs: the N most likely tokens of each position (vLLM's meaning)."))
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="Extra variables of the chat template (e.g. enable_thinking).")
    include_reasoning: bool = Field(
        True, description="vLLM: with a reasoning parser; accepted (no parser: the reply is "
                          "the content).")
    documents: list[dict[str, str]] | None = Field(
        None, max_length=L.MAX_LIST, description="vLLM: passed to the chat template.")
    chat_template: str | None = None
    echo: bool = False
    prompt_logprobs: int | None = None
    use_beam_search: bool = False
    return_prompt_text: bool | None = None
    media_io_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | \
        None = Field(None, description="vLLM: passed to the chat template (with "
                                       "enable_thinking unless the kwargs set it).")
    tools: Annotated[list[dict[str, Any]], Field(max_length=L.MAX_LIST)] | None = Field(
        None, description="Rendered into the chat template (its `tools` variable).")
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _with_logprobs(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v and not info.data.get("logprobs"):
            raise ValueError("when using top_logprobs, logprobs must be set to true")
        return v

    @property
    def num_top_logprobs(self) -> int:
        """Top alternatives per generated token the choices carry."""
        return (self.top_logprobs or 0) if self.logprobs else 0

    @field_validator("continue_final_message")
    @classmethod
    def _continue(cls, v: bool, info: ValidationInfo) -> bool:
        if v and info.data.get("add_generation_prompt", True):
            raise ValueError("Cannot set both `continue_final_message` and "
                             "`add_generation_prompt` to True.")  # vLLM's words
        return v

    @field_validator("prompt_logprobs")
    @classmethod
    def _chat_prompt_logprobs(cls, v: int | None, info: ValidationInfo) -> int | None:
        return _prompt_logprobs_range(v, bool(info.data.get("stream")))

    @property
    def prompt_top(self) -> int | None:
        """Top alternatives per prompt token the rendered prompt is scored with (vLLM's
        rule: `prompt_logprobs`, else `top_logprobs` when echoing); None: not scored."""
        if self.prompt_logprobs is not None:
            return self.prompt_logprobs
        return (self.top_logprobs or 0) if self.echo and self.logprobs else None

    @field_validator("chat_template")
    @classmethod
    def _no_request_template(cls, v: str | None) -> str | None:
        return _unset(v, "chat_template", "the model's chat template is used (vLLM refuses a "
                                          "request's template too unless its server is run "
                                          "with --trust-request-chat-template)")

    @field_validator("use_beam_search", "media_io_kwargs", "mm_processor_kwargs")
    @classmethod
    def _chat_not_built(cls, v: Any, info: ValidationInfo) -> Any:
        return _unset(v, str(info.field_name), "not built on chat")

    @field_validator("tools")
    @classmethod
    def _tools(cls, v: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if v == []:
            raise ValueError("`tools` must not be an empty array. Either provide at least "
                             "one tool or omit the field entirely.")
        for i, t in enumerate(v or []):
            fn = t.get("function") if isinstance(t, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise ValueError(f"tools[{i}] needs function.name")  # noqa: TRY004 (pydantic)
        return v

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: Any, info: ValidationInfo) -> Any:
        """vLLM's checks: "none", "auto", "required" or a named tool among `tools`."""
        tools = info.data.get("tools")
        if v in (None, "none"):
            return v
        if not tools:
            raise ValueError("When using `tool_choice`, `tools` must be set.")
        fmt = info.data.get("response_format")  # vLLM refuses a constraint beside a named
        # tool; "required"'s schema of the calls replaces one (vLLM's to_sampling_params)
        if isinstance(v, dict) and (info.data.get("structured_outputs") is not None or (
                fmt is not None and fmt.type != "text")):
            raise ValueError("You can only either use constraints for structured outputs or "
                             "tools, not both.")
        if v in ("auto", "required"):
            return v
        if not isinstance(v, dict):
            raise ValueError(  # noqa: TRY004 (pydantic reports ValueErrors only)
                f"Invalid value for `tool_choice`: {v}! Only named tools, "
                '"none", "auto" or "required" are supported.')
        fn = v.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError('Invalid `function` in `tool_choice`! Correct usage: '
                             '`{"type": "function", "function": {"name": "my_function"}}`')
        if fn["name"] not in {t["function"]["name"] for t in tools}:
            raise ValueError("The tool specified in `tool_choice` does not match any of the "
                             "specified `tools`")
        return v

    @property
    def tool_mode(self) -> Literal["none", "auto", "required", "named"]:
        """How tools are used: `tools` without `tool_choice` is "auto" (vLLM's default)."""
        if not self.tools or self.tool_choice == "none":
            return "none"
        if self.tool_choice in (None, "auto"):
            return "auto"
        return "required" if self.tool_choice == "required" else "named"

    @property
    def named_tool(self) -> str | None:
        return self.tool_choice["function"]["name"] if self.tool_mode == "named" else None

    @property
    def structured(self) -> StructuredOutput | None:
        """The constraint of `response_format` / `structured_outputs`, or, for tool_choice
        "required" or a named tool, vLLM's JSON schema of the tool calls."""
        if self.tool_mode in ("required", "named"):
            return StructuredOutput(json_schema=tool_calls_schema(
                self.tools or [], self.named_tool, self.parallel_tool_calls))
        return super().structured


    def template_kwargs(self) -> dict[str, Any]:
        """The chat template's extra variables, as vLLM builds them: `reasoning_effort`
        (and `enable_thinking` from it unless the caller's kwargs set it), then the caller's
        `chat_template_kwargs`."""
        extra: dict[str, Any] = {} if self.documents is None else {"documents": self.documents}
        if self.tools:
            extra["tools"] = self.tools
        user = self.chat_template_kwargs or {}
        if self.reasoning_effort is not None:
            extra["reasoning_effort"] = self.reasoning_effort
            if "enable_thinking" not in user:
                extra["enable_thinking"] = self.reasoning_effort != "none"
        return {**extra, **user}

    @property
    def max_tokens_field(self) -> str:
        """The field that set the budget (named when it is refused)."""
        return "max_completion_tokens" if self.max_completion_tokens is not None \
            else "max_tokens"

    @property
    def budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens


# ---------------------------------------------------------------------- answers

class Usage(_Reply):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class PromptLogprob(_Reply):
    """vLLM's `Logprob` of a prompt position's entry."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


class CompletionLogprobs(_Reply):
    """OpenAI's completion log-probs: per token its text, log-prob, offset, and the sampled
    token with the N most likely ones (`top_logprobs`)."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(_Reply):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = Field(None, description="stop, length or abort.")
    stop_reason: int | str | None = Field(
        None, description="vLLM: the stop token id or stop string that ended the choice "
                          "(None for EOS, length, abort).")
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = Field(None, description=(
        "vLLM: per prompt token (the first null), the prompt token's and the most likely "
        "tokens' log-prob, rank and text, keyed by token id."))
    bubblespec: dict[str, Any] | None = Field(
        None, description="bubblespec: step, weight_version and speculation counters.")


class CompletionOut(_Reply):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None


class ChatTokenLogprob(_Reply):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[dict[str, Any]] = Field(default_factory=list)


class ChatLogprobs(_Reply):
    content: list[ChatTokenLogprob] | None = None


class FunctionCallOut(_Reply):
    name: str
    arguments: str


class ToolCallOut(_Reply):
    id: str
    type: str = "function"
    function: FunctionCallOut


class ChatMessageOut(_Reply):
    role: str = "assistant"
    content: str | None = None
    tool_calls: list[ToolCallOut] = Field(default_factory=list)


class ChatChoice(_Reply):
    index: int
    message: ChatMessageOut
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    bubblespec: dict[str, Any] | None = Field(
        None, description="bubblespec: step, weight_version and speculation counters.")


class ChatCompletionOut(_Reply):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = Field(None, description=(
        "vLLM: with prompt_logprobs (or echo with logprobs), the rendered prompt's."))
    prompt_text: str | None = Field(None, description="vLLM: with return_prompt_text, the "
                                                      "rendered prompt.")
    system_fingerprint: str | None = None


class ModelCard(_Reply):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "bubblespec"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(_Reply):
    object: str = "list"
    data: list[ModelCard]


class ErrorDetail(_Reply):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorOut(_Reply):
    """OpenAI's error body."""

    error: ErrorDetail
