"""Plain request/result types of the rollout engine (no vLLM import here).

Requests are token-in/token-out: a prompt as token ids, `n` samples, the protocol's
sampling parameters and a prompt-group key that ties siblings and pre-generated drafts
together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from bubblespec.protocol.keys import prompt_key
from bubblespec.protocol.sample import SampleMeta
from bubblespec.protocol.sampling import SamplingParams

WEIGHT_GROUP_BACKEND = "bubblespec_gloo"
"""The weight-transfer engine every engine starts with (`weight_group.GlooWeightEngine`,
registered with vLLM's factory under this name)."""


class SpecMode(str, Enum):
    """How the engine speculates (one per engine; the benchmarks compare them)."""

    NONE = "none"  # plain decoding
    NGRAM = "ngram"  # vLLM's prompt-lookup n-gram proposer
    SUFFIX = "suffix"  # vLLM's suffix decoding (arctic-inference tree)
    BUBBLESPEC = "bubblespec"  # bubblespec's suffix index with pre-generated drafts


@dataclass
class GenRequest:
    """One prompt with `n` samples. `seeds` (one per sample) make sampling reproducible;
    `group` keys the prompt group (defaults to a hash of the prompt ids)."""

    input_ids: list[int]
    n: int = 1
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seeds: list[int] | None = None
    group: str | None = None
    sample_offset: int = 0
    keyed_start: int = 0
    """Keyed sampling: the output position of the first generated token. A margin branch
    continues a response whose first `keyed_start` tokens end `input_ids`, with the keyed
    noise those positions have in the response (0: a response starts after input_ids)."""
    top_logprobs: int = 0
    """Also return, per generated token, the log-probabilities of the `top_logprobs` most
    likely tokens (raw, before temperature; pre-generation reads keyed margins from them)."""
    score: bool = False
    """Score the prompt instead of sampling a response: the result's one sample carries
    `prompt_logprobs` (the model's log-probability of each prompt token given the ones
    before it), their ranks and, with `top_logprobs`, the most likely tokens at each prompt
    position (`prompt_top_logprobs`), and no output. `n` must be 1 and `sampling` is not used. A scoring request
    runs under a group of its own (never the group of a generation request with the same
    prompt), so it neither drafts from pre-generated responses nor feeds any draft source."""

    def group_key(self) -> str:
        """Prompt-group key: explicit, else a stable hash of the prompt ids."""
        return self.group if self.group is not None else prompt_key(self.input_ids)


@dataclass
class SampleResult:
    """One sampled response: its tokens and the record of it (`SampleMeta`: finish reason,
    weight version, counters), filled once by the engine and carried as it is by the rank
    and the gateway. The record's fields read as attributes too (`s.decode_steps`)."""

    output_ids: list[int]
    output_logprobs: list[float]
    sample_index: int
    meta: SampleMeta
    top_logprobs: list[dict[int, float]] | None = None
    """Per output token, {token id: raw log-probability} of the most likely tokens (and the
    sampled one), when the request asked for `top_logprobs`."""
    prompt_logprobs: list[float | None] | None = None
    """A scoring request's answer (`GenRequest.score`): per prompt token, its raw
    log-probability given the tokens before it (None for the first token, which has no
    context); None for a generation request."""
    prompt_ranks: list[int | None] | None = None
    """A scoring request's: per prompt token, its rank among the vocabulary at its position
    (1: the most likely; None for the first token)."""
    prompt_top_logprobs: list[dict[int, float] | None] | None = None
    """A scoring request with `top_logprobs`: per prompt position, {token id: raw log-prob}
    of the prompt token and the most likely tokens, in vLLM's order (None for the first)."""

    def __getattr__(self, name: str) -> Any:
        if name in SampleMeta.model_fields:  # only reached for names that are not fields
            return getattr(self.meta, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


@dataclass
class GenResult:
    """All samples of one GenRequest, in sample order."""

    group: str
    samples: list[SampleResult]


@dataclass
class BatchProgress:
    """The live shape of one `generate` call, kept by the engine as tokens arrive: how many
    of its sequences still decode and how many KV tokens they read (prompt + output so
    far). A rank's tail-fill sizes its pre-generation lanes from it (`core/tail_fill.py`)."""

    running: int = 0
    context: int = 0
    longest: int = 0
    """Longest prompt + max new tokens of any of its sequences (a lane's context bound)."""
    generated: int = 0
    """Output tokens that arrived so far, over every sequence it followed."""

    def start(self, prompt_len: int, max_new_tokens: int) -> None:
        self.running += 1
        self.context += prompt_len
        self.longest = max(self.longest, prompt_len + max_new_tokens)

    def grew(self, tokens: int) -> None:
        self.context += tokens
        self.generated += tokens

    def ended(self, length: int) -> None:
        """A sequence of `length` tokens (prompt + output) finished or was aborted."""
        self.running = max(0, self.running - 1)
        self.context = max(0, self.context - length)
