"""Declared ranges of every number that crosses an HTTP or gRPC boundary, stated once.

The protocol models (`sampling`, `rank`, `gateway`) and the synchronizer's gRPC validation
use these same numbers, so a value one boundary accepts is never refused (or, worse, found
to overflow int64 or int32 code) at the next hop. Each bound is inclusive and chosen so that
the arithmetic done on the value still fits its wire type:

- steps and weight versions stay below 2**53 (exact in a JSON double, and `step + 1`, the
  next step, and `version + 1`, the default next version, still fit an int64);
- token ids, top_k, sample indices and counts are int32 on the wire;
- seeds are uint64 on the wire but below 2**63 (vLLM and the keyed-noise generator take
  them as signed 64-bit);
- temperature is within vLLM's [0, 2]; the other floats are finite and bounded.

Out of range is an HTTP 4xx (422, naming the field as the request spells it) or a gRPC
INVALID_ARGUMENT naming the field path; nothing out of range is stored.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field

INT32_MAX = 2**31 - 1

MAX_STEP = 2**53 - 1
"""Largest step id (the next step, `MAX_STEP + 1`, still fits an int64)."""
MAX_WEIGHT_VERSION = 2**53 - 1
"""Largest weight version (a default `version + 1` still fits an int64)."""
MAX_SEED = 2**63 - 1
"""Largest per-sample seed (signed 64-bit in vLLM and the keyed-noise generator)."""
MAX_TOKEN_ID = INT32_MAX - 1
"""Largest token id any model could have (int32 on the wire; the model's vocabulary is the
tighter bound, checked where it is known)."""
MAX_N = 1024
"""Most samples of one prompt in one request."""
MAX_SAMPLE_INDEX = 2**30
"""Largest sample index (`sample_offset + n - 1` stays an int32)."""
MAX_BRANCH_OFFERS = 16
"""Margin branches one complete draft may offer (`PregenDraft.branch_offers`)."""
MAX_FLIPS = 1024
"""Flips one ReportDone carries (a rank reports its first ones; they only calibrate the
streamed-branch threshold, `core/branch_margin.py`)."""
MAX_INDEX = INT32_MAX
"""Largest position of a prompt in a batch."""
MAX_NEW_TOKENS = 2**24
"""Largest max_new_tokens (the engine's model length is the tighter bound)."""
MAX_TOP_K = INT32_MAX
"""Largest top_k (vLLM reads any top_k >= the vocabulary as off)."""
MAX_TEMPERATURE = 2.0
"""vLLM 0.32 refuses a temperature above 2."""
MIN_REPETITION_PENALTY = 0.01
MAX_REPETITION_PENALTY = 100.0
"""Repetition penalties divide or multiply logits: outside [0.01, 100] they only push
logits towards inf/0 (NaN probabilities), so they are refused."""
MAX_ADDITIVE_PENALTY = 2.0
"""presence_penalty and frequency_penalty lie in [-2, 2] (OpenAI's and vLLM's range)."""
MAX_LOGIT_BIAS = 100.0
"""A logit bias lies in [-100, 100]; the API fronts clamp a larger one into it, as vLLM's
`SamplingParams` does (OpenAI's documented range)."""
MAX_LOGIT_BIAS_ENTRIES = 2**18
"""Most biased tokens of one request (more than any vocabulary has)."""
MAX_STRUCTURED_CHARS = 2**20
"""Longest structured-output constraint (a JSON schema's text, a regex, a grammar, all the
choices together), characters."""
MAX_BAD_WORDS = 1024
"""Most bad words of one request."""
MAX_STOP_TOKEN_IDS = 1024
"""Most stop token ids of one request."""
MIN_LOGPROB = -9999.0
"""Log-probs below this (-inf) and NaN (a position where every token was masked: a
constraint the vocabulary cannot satisfy) cross every boundary as this, as vLLM's server and
OpenAI send them (JSON has neither)."""
MAX_TOP_LOGPROBS = 20
"""Most top alternatives per generated token (vLLM's default `max_logprobs`)."""
MAX_PROMPT_TOKENS = 2**24
"""Most token ids of one prompt on the wire (config limits are tighter)."""
MAX_KEY_CHARS = 256
"""Longest prompt key a caller may give (keys made by bubblespec are 16 hex digits)."""
MAX_SPAN_TOKENS = 2**40
"""Most tokens one reported timeline span may count (sums over a step stay in int64)."""
MAX_LIST = 2**20
"""Most entries of any other list in a body (prompts, requests, seeds)."""
MAX_LOOKAHEAD = 64
"""Most future steps one rollout may hand prompts ahead for (the gateway's config is
tighter)."""

Step = Annotated[int, Field(ge=0, le=MAX_STEP)]
WeightVersion = Annotated[int, Field(ge=0, le=MAX_WEIGHT_VERSION)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
TokenIds = Annotated[list[TokenId], Field(max_length=MAX_PROMPT_TOKENS)]
Seeds = Annotated[list[Seed], Field(max_length=MAX_N)]
PromptKey = Annotated[str, Field(min_length=1, max_length=MAX_KEY_CHARS)]
TopLogprobs = list[list[tuple[int, float]]]
"""Per generated token, [token id, log-prob] of the most likely tokens, as the engine gives
them (vLLM's order: the sampled token first, then the top tokens by rank; the sampled token
once)."""


def clamp_logprob(x: float) -> float:
    """`x` as it crosses a boundary: NaN and anything below MIN_LOGPROB as MIN_LOGPROB."""
    return MIN_LOGPROB if math.isnan(x) else max(float(x), MIN_LOGPROB)
