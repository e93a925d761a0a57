"""Sampling parameters, the one shape every hop uses (HTTP bodies, pre-generation tasks,
the engine), and the enums of how a request samples and when pre-generation ends.

Names and meanings follow SGLang/vLLM (`max_new_tokens`, `top_k = -1` for off, as SGLang and
verl send it). An incoming `top_k = 0` (vLLM's other spelling of off) is normalised to -1 so
that everything downstream, the protobuf message included, sees one convention. The model is
frozen, hence hashable and comparable: pre-generation tasks of one prompt must agree on it.
"""

from __future__ import annotations

import enum
import json
import math
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from bubblespec.protocol import limits as L


class SeedMode(str, enum.Enum):
    """How a request's seeds drive sampling."""

    DEFAULT = "default"
    """vLLM's sampler, seeded per sample when seeds are given."""
    KEYED = "keyed"
    """Keyed Gumbel noise per (seed, position): bit-reproducible with speculation on or off,
    and pre-generation with the same seeds is coupled to the rollout (needs one seed per
    sample when sampling)."""
    KEYED_CONTEXT = "keyed_context"
    """Keyed Gumbel noise per (seed, preceding 4 tokens, occurrence of that context in the
    response): as exact and reproducible as `keyed`, and a response that leaves its
    pre-generated draft by an inserted or deleted token is coupled to it again once its
    context re-joins the draft's."""


class PregenWindow(str, enum.Enum):
    """When a step's pre-generation (of step + 1) ends."""

    BUBBLE = "bubble"
    """At the stop signal (the slowest rank is done): the inter-rank bubble only."""
    TRAINING = "training"
    """At the step's close (next step or weight push): the bubble and the training window
    after it, for rollout ranks idle while the trainer trains (disaggregated set-ups)."""


class StructuredOutput(BaseModel):
    """A constraint on what is sampled, vLLM's `StructuredOutputsParams`: exactly one of a
    JSON schema, any JSON object, a regular expression, a choice among strings, or a
    grammar (EBNF/GBNF or Lark, as vLLM's backends read them). The ranks' vLLM masks every
    token the constraint forbids, at drafted positions too, and drops the drafted tokens it
    forbids, so speculation stays exact."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    json_schema: str | None = Field(None, max_length=L.MAX_STRUCTURED_CHARS, description=(
        "A JSON schema, as JSON text (a mapping is taken and written as compact JSON, its "
        "keys in their order: the output's properties follow it)."))
    json_object: bool = Field(False, description="Any JSON object.")
    regex: str | None = Field(None, max_length=L.MAX_STRUCTURED_CHARS)
    choice: tuple[Annotated[str, Field(max_length=L.MAX_STRUCTURED_CHARS)], ...] | None = \
        Field(None, min_length=1, max_length=4096)
    grammar: str | None = Field(None, max_length=L.MAX_STRUCTURED_CHARS)

    @field_validator("json_schema", mode="before")
    @classmethod
    def _schema_text(cls, v: object) -> object:
        if isinstance(v, (dict, bool)):
            return json.dumps(v, separators=(",", ":"))  # key order kept: it orders the output
        if isinstance(v, str):
            try:
                parsed = json.loads(v)
            except ValueError:
                raise ValueError("not a JSON schema: the text is not JSON") from None
            if not isinstance(parsed, (dict, bool)):  # pydantic reports ValueErrors only
                raise ValueError("a JSON schema is an object (or true/false)")  # noqa: TRY004
        return v

    @field_validator("grammar")
    @classmethod
    def _grammar_not_blank(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("a grammar cannot be empty")
        return v

    @field_validator("regex")
    @classmethod
    def _no_nul(cls, v: str | None) -> str | None:
        if v is not None and "\x00" in v:
            raise ValueError("a regex must not contain a NUL character")
        return v

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutput:
        kinds = [k for k in ("json_schema", "regex", "choice", "grammar")
                 if getattr(self, k) is not None] + (["json_object"] if self.json_object
                                                     else [])
        if len(kinds) != 1:
            raise ValueError(f"exactly one kind of constraint, got {kinds or 'none'}")
        if self.choice is not None and sum(map(len, self.choice)) > L.MAX_STRUCTURED_CHARS:
            raise ValueError(f"the choices hold more than {L.MAX_STRUCTURED_CHARS} characters")
        return self

    def vllm_kwargs(self) -> dict[str, Any]:
        """The `StructuredOutputsParams` keyword arguments of this constraint."""
        if self.json_schema is not None:
            return {"json": self.json_schema}
        if self.json_object:
            return {"json_object": True}
        if self.choice is not None:
            return {"choice": list(self.choice)}
        return {"regex": self.regex} if self.regex is not None else {"grammar": self.grammar}


class SamplingParams(BaseModel):
    """Sampling parameters of a request (vLLM/SGLang meaning)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: int = Field(128, ge=1, le=L.MAX_NEW_TOKENS,
                                description="Most tokens to generate.")
    temperature: float = Field(1.0, ge=0, le=L.MAX_TEMPERATURE, allow_inf_nan=False,
                               description="0 = greedy; at most 2 (vLLM's limit).")
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: int = Field(-1, ge=-1, le=L.MAX_TOP_K, description="-1 = off (0 is read as -1).")
    repetition_penalty: float = Field(
        1.0, ge=L.MIN_REPETITION_PENALTY, le=L.MAX_REPETITION_PENALTY, allow_inf_nan=False,
        description="Divides positive logits (multiplies negative ones) of tokens already in "
                    "the prompt or the output, as vLLM does; 1 = off, > 1 discourages repeats.")
    presence_penalty: float = Field(
        0.0, ge=-L.MAX_ADDITIVE_PENALTY, le=L.MAX_ADDITIVE_PENALTY, allow_inf_nan=False,
        description="Subtracted from the logit of every token already in the output, as vLLM "
                    "does; 0 = off.")
    frequency_penalty: float = Field(
        0.0, ge=-L.MAX_ADDITIVE_PENALTY, le=L.MAX_ADDITIVE_PENALTY, allow_inf_nan=False,
        description="Times a token's count in the output, subtracted from its logit, as vLLM "
                    "does; 0 = off.")
    min_tokens: int = Field(0, ge=0, le=L.MAX_NEW_TOKENS, description=(
        "EOS and the stop token ids cannot end a response before this many tokens (vLLM's "
        "min_tokens); at most max_new_tokens."))
    min_p: float = Field(0.0, ge=0, le=1, allow_inf_nan=False, description=(
        "Tokens less likely than min_p times the most likely one are not sampled (vLLM's "
        "min_p; 0 = off). A sample with it decodes without drafts (`drafts_off`)."))
    logit_bias: tuple[tuple[L.TokenId, float], ...] = Field(
        (), max_length=L.MAX_LOGIT_BIAS_ENTRIES, description=(
            "(token id, bias) pairs, each bias in [-100, 100] added to that token's logit "
            "before penalties and temperature (vLLM's logit_bias; a mapping is taken too). "
            "A sample with it decodes without drafts (`drafts_off`)."))
    allowed_token_ids: tuple[L.TokenId, ...] = Field(
        (), max_length=L.MAX_LOGIT_BIAS_ENTRIES, description=(
            "Only these tokens are sampled (vLLM's allowed_token_ids; empty: any token). "
            "vLLM masks the others at drafted positions too: exact under speculation."))
    bad_words: tuple[Annotated[str, Field(min_length=1, max_length=4096)], ...] = Field(
        (), max_length=L.MAX_BAD_WORDS, description=(
            "Words whose tokens are not sampled where they would complete the word (vLLM's "
            "bad_words, tokenized by the ranks; applied at drafted positions too)."))
    structured: StructuredOutput | None = Field(None, description=(
        "A constraint on the response (JSON schema, JSON object, regex, choice, grammar), "
        "applied by the ranks' vLLM at every sampled and verified position."))
    stop_token_ids: tuple[L.TokenId, ...] = Field(
        (), max_length=L.MAX_STOP_TOKEN_IDS, description="Token ids that end a response.")
    ignore_eos: bool = False
    seed_mode: SeedMode = Field(SeedMode.DEFAULT, description=(
        "keyed: keyed Gumbel noise per (seed, position); bit-reproducible with speculation "
        "on or off, and pre-generation with the same seeds is coupled to the rollout. "
        "keyed_context: the same, keyed per (seed, last 4 tokens, occurrence), so the "
        "coupling survives an inserted or deleted token."))

    @field_validator("top_k")
    @classmethod
    def _top_k_off(cls, v: int) -> int:
        return -1 if v == 0 else v

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _bias_pairs(cls, v: object) -> object:
        """A mapping (token id -> bias, ids as ints or digit strings, as JSON spells them)
        or pairs, to pairs sorted by token id, so that equal biases compare equal (what is
        not a pair is left for the field's validation to name)."""
        pairs = list(v.items()) if isinstance(v, dict) else v
        if not isinstance(pairs, (list, tuple)) or not all(
                isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
            return v
        keyed = [(_token_key(t), b) for t, b in pairs]
        return tuple(sorted(keyed, key=lambda p: p[0] if isinstance(p[0], int) else -1))

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, v: tuple[tuple[int, float], ...]) -> tuple[tuple[int, float], ...]:
        for t, b in v:
            if not -L.MAX_LOGIT_BIAS <= b <= L.MAX_LOGIT_BIAS:
                raise ValueError(f"the bias of token {t} ({b}) is outside "
                                 f"[-{L.MAX_LOGIT_BIAS:g}, {L.MAX_LOGIT_BIAS:g}]")
        if len({t for t, _ in v}) != len(v):
            raise ValueError("a token id is biased twice")
        return v

    @model_validator(mode="after")
    def _min_within_max(self) -> SamplingParams:
        if self.min_tokens > self.max_new_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be at most max_new_tokens "
                             f"({self.max_new_tokens})")
        return self

    @property
    def drafts_off(self) -> tuple[str, ...]:
        """The fields that make a sample decode without drafts, one token per step: vLLM
        applies min_p and logit_bias in its sampler but not in speculative verification, so
        the ranks never draft for such a sample (exact, not accelerated). Empty: it drafts."""
        return (("min_p",) if self.min_p > 0 else ()) + (
            ("logit_bias",) if self.logit_bias else ())

    @property
    def keyed(self) -> bool:
        """Keyed-noise sampling is in effect (keyed seed mode, temperature > 0)."""
        return self.seed_mode in (SeedMode.KEYED, SeedMode.KEYED_CONTEXT) and self.temperature > 0

    @property
    def keyed_by_context(self) -> bool:
        """Keyed sampling with context keys (`keyed_context`)."""
        return self.seed_mode is SeedMode.KEYED_CONTEXT and self.temperature > 0


def allowed_not_empty(ids: list[int] | None) -> list[int] | None:
    """An API's `allowed_token_ids`: None (any token) or a non-empty list, as vLLM's
    `SamplingParams` refuses an empty one (in its words)."""
    if ids is not None and not ids:
        raise ValueError("allowed_token_ids is not None and empty!")
    return ids


def clamp_logit_bias(raw: dict[Any, float] | None) -> dict[int, float] | None:
    """An API's `logit_bias` as vLLM's `SamplingParams` reads it: keys converted to token
    ids (a key that is not an integer, or a negative one, is refused in vLLM's words; the
    vocabulary bound is the ranks'), each bias clamped into [-100, 100]; a bias that is not
    a number (NaN) is refused."""
    if raw is None:
        return None
    bad = [t for t in raw if _token_key(t) is t and not isinstance(t, int)]
    if bad:
        raise ValueError(f"logit_bias contains key(s) that cannot be converted to integer "
                         f"token IDs: {bad!r}")
    if any(math.isnan(b) for b in raw.values()):
        raise ValueError("logit_bias holds a bias that is not a number")
    out = {int(_token_key(t)): min(L.MAX_LOGIT_BIAS, max(-L.MAX_LOGIT_BIAS, float(b)))
           for t, b in raw.items()}
    if len(out) > L.MAX_LOGIT_BIAS_ENTRIES:
        raise ValueError(f"logit_bias biases {len(out)} tokens, at most "
                         f"{L.MAX_LOGIT_BIAS_ENTRIES}")
    outside = sorted(t for t in out if not 0 <= t <= L.MAX_TOKEN_ID)
    if outside:
        raise ValueError(f"token_id(s) {outside} in logit_bias contain out-of-vocab token ids")
    return out


def _token_key(t: object) -> object:
    """A logit-bias key as a token id: JSON object keys are strings ("42" is token 42);
    anything else is left for the field's validation to refuse."""
    if isinstance(t, str) and t.strip().lstrip("-").isdigit():
        return int(t)
    return t
