"""A request's choices as the OpenAI routes hold them before they are answered, and how the
request spells the fields an internal error may name."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from bubblespec.protocol.limits import TopLogprobs
from bubblespec.protocol.openai import Usage


@dataclass(frozen=True)
class Names:
    """How this request spells the fields an internal error may name."""

    prompt: str
    """`prompt` or `messages`."""
    budget: str
    """`max_tokens` or `max_completion_tokens`."""
    batched: bool = False
    """The prompts came as a list (name them `prompt[i]`)."""

    def of(self, internal: str) -> str:
        """A field of the internal rollout body (`prompts[1].input_ids[5]`,
        `sampling_params.max_new_tokens`) as this request spells it."""
        m = re.match(r"(next_)?prompts\[(\d+)\](?:\.(?:input_ids|text))?(\[\d+\])?", internal)
        if m:
            if m.group(1):
                return f"next_prompts[{m.group(2)}]"
            if self.prompt != "prompt":
                return self.prompt
            return self.prompt + (f"[{m.group(2)}]" if self.batched else "") + (m.group(3) or "")
        if internal.startswith(("prompts", "input_ids")):
            return self.prompt
        if internal.startswith("next_prompts"):
            return "next_prompts"
        if internal.startswith("seeds"):
            return "seed"
        if internal == "sampling_params.max_new_tokens":
            return self.budget
        return internal.removeprefix("sampling_params.")


@dataclass
class Choice:
    """One sampled choice, cut at its stop string if one occurred."""

    index: int
    prompt_ids: list[int]
    ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    stop_reason: int | str | None = None
    step: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    """bubblespec's figures of the sample (step, weight version, speculation counters)."""
    top: TopLogprobs | None = None
    """Per token, [token id, log-prob] of the sampled token and the most likely ones
    (vLLM's order), when the request asked for top alternatives."""
    text_ids: list[int] = field(default_factory=list)
    """The tokens `text` was decoded from (the stop token left out, as vLLM's text leaves
    it out)."""


@dataclass
class Sampled:
    """What a request got: its prompts' ids and its choices, prompt-major."""

    prompts: list[list[int]]
    choices: list[Choice] = field(default_factory=list)

    def usage(self) -> Usage:
        p = sum(len(ids) for ids in self.prompts)
        c = sum(len(ch.ids) for ch in self.choices)
        return Usage(prompt_tokens=p, completion_tokens=c, total_tokens=p + c)
