"""The one SamplingParams: defaults, the top_k convention, ranges and enums that name the
field, and the frozen model's equality and hashing (pre-generation tasks compare it)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from bubblespec.protocol.gateway import RolloutRequest
from bubblespec.protocol.rank import GenerateRequest, ShardRequest
from bubblespec.protocol.sampling import PregenWindow, SamplingParams, SeedMode


def field_at_fault(model: type[BaseModel], body: dict[str, Any]) -> str:
    """The dotted path of the first field `body` gets wrong (as the HTTP edge reports it)."""
    with pytest.raises(ValidationError) as e:
        model.model_validate(body)
    out = ""
    for p in e.value.errors()[0]["loc"]:
        out += f"[{p}]" if isinstance(p, int) else ("." if out else "") + str(p)
    return out


def test_defaults_are_vllm_and_sglang_defaults() -> None:
    sp = SamplingParams()
    assert (sp.max_new_tokens, sp.temperature, sp.top_p, sp.top_k) == (128, 1.0, 1.0, -1)
    assert sp.repetition_penalty == 1.0
    assert sp.stop_token_ids == () and not sp.ignore_eos and sp.seed_mode is SeedMode.DEFAULT


@pytest.mark.parametrize("given", [0, -1])
def test_top_k_off_is_minus_one_whatever_the_caller_sends(given: int) -> None:
    assert SamplingParams(top_k=given).top_k == -1
    assert SamplingParams.model_validate_json(f'{{"top_k": {given}}}').top_k == -1
    body = {"prompts": [{"input_ids": [1]}], "sampling_params": {"top_k": given}}
    assert RolloutRequest.model_validate(body).sampling_params.top_k == -1
    assert SamplingParams(top_k=20).top_k == 20


@pytest.mark.parametrize("sampling,field", [
    ({"max_new_tokens": 0}, "sampling_params.max_new_tokens"),
    ({"temperature": -0.5}, "sampling_params.temperature"),
    ({"temperature": float("nan")}, "sampling_params.temperature"),
    ({"temperature": float("inf")}, "sampling_params.temperature"),
    ({"top_p": 0.0}, "sampling_params.top_p"),
    ({"top_p": float("nan")}, "sampling_params.top_p"),
    ({"top_k": -2}, "sampling_params.top_k"),
    ({"repetition_penalty": 0.0}, "sampling_params.repetition_penalty"),
    ({"repetition_penalty": float("inf")}, "sampling_params.repetition_penalty"),
    ({"seed_mode": "magic"}, "sampling_params.seed_mode"),
    ({"temp": 1.0}, "sampling_params.temp"),
])
@pytest.mark.parametrize("model", [ShardRequest, GenerateRequest, RolloutRequest])
def test_bad_sampling_field_named(model: type[BaseModel], sampling: dict, field: str) -> None:
    body: dict[str, Any] = {"input_ids": [1], "index": 0}
    if model is RolloutRequest:
        body = {"prompts": [{"input_ids": [1]}]}
    elif model is GenerateRequest:
        body = {"input_ids": [1]}
    assert field_at_fault(model, {**body, "sampling_params": sampling}) == field


def test_pregen_window_is_an_enum_named_when_wrong() -> None:
    body = {"prompts": [{"input_ids": [1]}]}
    assert RolloutRequest.model_validate({**body, "pregen_window": "training"}).pregen_window \
        is PregenWindow.TRAINING
    assert RolloutRequest.model_validate(body).pregen_window is None
    assert field_at_fault(RolloutRequest, {**body, "pregen_window": "never"}) == "pregen_window"


def test_seed_mode_reads_strings_and_keyed_needs_a_temperature() -> None:
    assert SamplingParams(seed_mode="keyed").seed_mode is SeedMode.KEYED
    assert SamplingParams(seed_mode="keyed").keyed
    assert not SamplingParams(seed_mode="keyed", temperature=0.0).keyed
    assert not SamplingParams().keyed


def test_frozen_hashable_and_json_round_trip() -> None:
    a = SamplingParams(max_new_tokens=64, temperature=0.7, top_k=20, stop_token_ids=[2, 3],
                       ignore_eos=True, seed_mode="keyed", repetition_penalty=1.3)
    b = SamplingParams.model_validate_json(a.model_dump_json())
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a.model_dump(mode="json")["stop_token_ids"] == [2, 3]
    assert a.model_dump(mode="json")["seed_mode"] == "keyed"
    assert a != a.model_copy(update={"temperature": 0.8})
    with pytest.raises(ValidationError):
        a.temperature = 0.1  # type: ignore[misc]
