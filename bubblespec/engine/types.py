"""Plain request/result types of the rollout engine (no vLLM import here).

Requests are token-in/token-out: a prompt as token ids, `n` samples, sampling
parameters and a prompt-group key that ties siblings and pre-generated drafts together.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import Enum


class SpecMode(str, Enum):
    """How the engine speculates (one per engine; the benchmarks compare them)."""

    NONE = "none"  # plain decoding
    NGRAM = "ngram"  # vLLM's prompt-lookup n-gram proposer
    SUFFIX = "suffix"  # vLLM's suffix decoding (arctic-inference tree)
    BUBBLESPEC = "bubblespec"  # bubblespec's suffix index with pre-generated drafts


@dataclass(frozen=True)
class DraftSources:
    """Which sources feed bubblespec's per-prompt-group index (each can be switched off)."""

    pregen: bool = True
    """Responses pre-generated in the previous step's bubble (pushed with add_drafts)."""
    siblings: bool = True
    """Live and finished sibling responses of the same prompt in the current batch."""
    self_context: bool = True
    """The request's own prompt and output (prompt lookup)."""
    history: bool = False
    """Responses to the same prompt from earlier steps (kept across batches)."""
    global_pool: bool = False
    """Recent finished responses to any prompt (one global pool, FIFO under a token budget),
    as SuffixDecoding's global tree: drafts from step 0 on, also while pre-generating. Off
    by default: on the embedded task it did not shorten the critical path (README)."""


class InvalidRequest(ValueError):
    """A request field is out of range; `field` names it (HTTP 400 / INVALID_ARGUMENT)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass
class SamplingSpec:
    """Sampling parameters of one request (SGLang-style names)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed_mode: str = "default"
    """"default": vLLM's sampler; "keyed": keyed Gumbel noise per (seed, position),
    bit-reproducible with speculation on or off (needs a seed per sample)."""


@dataclass
class GenRequest:
    """One prompt with `n` samples. `seeds` (one per sample) make sampling reproducible;
    `group` keys the prompt group (defaults to a hash of the prompt ids)."""

    input_ids: list[int]
    n: int = 1
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    seeds: list[int] | None = None
    group: str | None = None
    sample_offset: int = 0

    def group_key(self) -> str:
        """Prompt-group key: explicit, else a stable hash of the prompt ids."""
        return self.group if self.group is not None else prompt_key(self.input_ids)


def prompt_key(input_ids: list[int]) -> str:
    """Stable short key of a prompt (same ids -> same key across processes)."""
    raw = ",".join(map(str, input_ids)).encode()
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


@dataclass
class SampleResult:
    """One sampled response with its counters."""

    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str
    sample_index: int
    weight_version: int
    decode_steps: int = 0
    """Target forward passes that produced tokens for this request (prefill included)."""
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_pregen_tokens: int = 0
    """Accepted draft tokens that came from the aligned pre-generated response (same prompt,
    sample index and seed); pre-generated tokens drafted through the suffix index are not
    told apart from other index drafts, so this is a lower bound of pre-gen's share."""


@dataclass
class GenResult:
    """All samples of one GenRequest, in sample order."""

    group: str
    samples: list[SampleResult]


def group_token(group: str) -> str:
    """Fixed-width token for a group key, safe inside request ids."""
    return hashlib.blake2b(group.encode(), digest_size=8).hexdigest()


def make_request_id(group: str, sample_index: int, uid: str) -> str:
    """Engine request id carrying the prompt group and sample index to the proposer."""
    return f"bs.{group_token(group)}.{sample_index}.{uid}"


def parse_request_id(req_id: str) -> tuple[str, int, str]:
    """(group token, sample index, base id) of an engine request id.

    vLLM appends "-<random>" to ids it receives; the base id drops it. Ids not made by
    :func:`make_request_id` get their own group (no sharing) and sample index 0."""
    base = req_id.rsplit("-", 1)[0] if "-" in req_id else req_id
    parts = base.split(".")
    if len(parts) == 4 and parts[0] == "bs" and parts[2].isdigit():
        return parts[1], int(parts[2]), base
    return base, 0, base
