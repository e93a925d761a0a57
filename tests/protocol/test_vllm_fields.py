"""The gateway's vLLM-compatible bodies take every field vLLM 0.32's own protocol classes
define, read from vLLM itself: a vLLM upgrade that adds a request field fails here until the
gateway takes it (with vLLM's meaning, or refused by name with the reason).

Besides vLLM's fields, each body has only bubblespec's named extensions."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from bubblespec.protocol.openai import ChatCompletionIn, CompletionIn
from bubblespec.protocol.tokens import GenerateTokensIn, VllmSampling

pytest.importorskip("vllm")

EXTENSIONS = {"next_prompts", "seed_mode"}
"""bubblespec's own request fields (documented in docs/api.md)."""
CLIENT_ONLY = {"best_of"}
"""Fields the openai client still sends that vLLM 0.32 dropped (refused unless n)."""
REMOVED_GUIDED = {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                  "guided_decoding_backend", "guided_whitespace_pattern"}
"""vLLM's removed guided-decoding fields: its server ignores them (the output is then not
constrained) with a warning; the gateway refuses them by name instead."""


def vllm_classes() -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest

    return {"completion": set(CompletionRequest.model_fields),
            "chat": set(ChatCompletionRequest.model_fields),
            "generate": set(GenerateRequest.model_fields),
            "sampling": {f for f in SamplingParams.__struct_fields__ if not f.startswith("_")}}


OURS: dict[str, type[BaseModel]] = {"completion": CompletionIn, "chat": ChatCompletionIn,
                                    "generate": GenerateTokensIn, "sampling": VllmSampling}


@pytest.mark.parametrize("name", sorted(OURS))
def test_every_vllm_field_is_taken(name: str) -> None:
    theirs = vllm_classes()[name]
    ours = set(OURS[name].model_fields)
    assert not theirs - ours, f"vLLM fields the gateway does not take: {sorted(theirs - ours)}"
    assert ours - theirs <= EXTENSIONS | CLIENT_ONLY | REMOVED_GUIDED, sorted(ours - theirs)


def test_unknown_fields_are_ignored_as_vllm_ignores_them() -> None:
    """A key vLLM does not define is ignored (vLLM's `OpenAIBaseModel`), and the comparison
    above would see it if the gateway declared it (the negative control)."""
    body = CompletionIn.model_validate({"prompt": [1], "max_tokenz": 3})
    assert body.max_tokens == 16 and "max_tokenz" not in vllm_classes()["completion"]
    assert "max_tokenz" not in CompletionIn.model_fields
    with pytest.raises(ValidationError):  # a removed guided field is refused, not ignored
        CompletionIn.model_validate({"prompt": [1], "guided_json": {"type": "object"}})
