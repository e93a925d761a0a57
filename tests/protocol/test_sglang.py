"""The SGLang-compatible bodies: what slime and AReaL send is accepted, what bubblespec cannot
serve exactly is refused naming the field.

The payloads are the shapes of the real clients' code:
- slime `slime/rollout/sglang_rollout.py` (`GenerateState.sampling_params`, `generate`):
  temperature, top_p, top_k, max_new_tokens, stop, stop_token_ids, skip_special_tokens,
  no_stop_trim=True, spaces_between_special_tokens=False, custom_params when top_p != 1,
  sampling_seed in deterministic mode; `return_logprob: True`, `input_ids`;
- AReaL `areal/engine/sglang_remote.py` (`RemoteSGLangEngine.agenerate`): top_p, top_k,
  max_new_tokens, temperature, stop_token_ids, frequency_penalty (0 by default);
  `image_data: None`, `return_logprob: True`, `stream: False`; `update_weights_from_disk`
  sends `{"model_path", "abort_all_request": True}`.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from bubblespec.protocol.sampling import SeedMode
from bubblespec.protocol.sglang import (
    AbortIn,
    GenerateIn,
    NextPromptsIn,
    PauseIn,
    SglSamplingParams,
    WeightsFromDiskIn,
)

SLIME = {"input_ids": [1, 5, 6, 7], "return_logprob": True, "sampling_params": {
    "temperature": 1.0, "top_p": 0.9, "top_k": -1, "max_new_tokens": 64, "stop": None,
    "stop_token_ids": [2], "skip_special_tokens": True, "no_stop_trim": True,
    "spaces_between_special_tokens": False, "custom_params": {"return_top_p_token_ids": True},
    "sampling_seed": 42}}
AREAL = {"input_ids": [1, 5, 6], "image_data": None, "return_logprob": True, "stream": False,
         "sampling_params": {"top_p": 1.0, "top_k": 100000000, "max_new_tokens": 32,
                             "temperature": 1.0, "stop_token_ids": [2],
                             "frequency_penalty": 0.0}}


def field_of(model: Any, body: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as e:
        model.model_validate(body)
    out = ""
    for p in e.value.errors()[0]["loc"]:
        out += f"[{p}]" if isinstance(p, int) else ("." if out else "") + str(p)
    return out


def test_slime_payload_is_accepted_and_maps_to_the_sampling_params() -> None:
    g = GenerateIn.model_validate(SLIME)
    assert not g.batched and g.prompts() == [[1, 5, 6, 7]] and g.rids() == [None]
    sp = g.sampling_params.to_sampling()
    assert (sp.temperature, sp.top_p, sp.top_k, sp.max_new_tokens) == (1.0, 0.9, -1, 64)
    assert sp.stop_token_ids == (2,) and sp.seed_mode is SeedMode.DEFAULT
    assert "seed_mode" not in sp.model_fields_set  # the gateway's hand-off default applies
    named = GenerateIn.model_validate({**SLIME, "sampling_params": {
        **SLIME["sampling_params"], "seed_mode": "default"}}).sampling_params.to_sampling()
    assert "seed_mode" in named.model_fields_set and named.seed_mode is SeedMode.DEFAULT
    assert g.sampling_params.sampling_seed == 42 and g.sampling_params.no_stop_trim


def test_areal_payload_is_accepted() -> None:
    g = GenerateIn.model_validate(AREAL)
    assert g.return_logprob and g.sampling_params.to_sampling().top_k == 100000000


def test_batches_text_rids_and_next_prompts() -> None:
    g = GenerateIn.model_validate({"input_ids": [[1, 2], [3]], "rid": ["a", "b"],
                                   "next_input_ids": [[4, 5]],
                                   "sampling_params": {"n": 4, "seed_mode": "keyed"}})
    assert g.batched and g.prompts() == [[1, 2], [3]] and g.rids() == ["a", "b"]
    assert g.next_input_ids == [[4, 5]] and g.sampling_params.n == 4
    assert g.sampling_params.to_sampling().seed_mode is SeedMode.KEYED
    t = GenerateIn.model_validate({"text": ["1 + 2 =", "3"], "rid": "x"})
    assert t.batched and t.prompts() == ["1 + 2 =", "3"] and t.rids() == ["x", "x"]
    assert GenerateIn.model_validate({"text": "1 + 2 ="}).prompts() == ["1 + 2 ="]


@pytest.mark.parametrize("body,field", [
    ({}, ""),
    ({"input_ids": [1], "text": "a"}, ""),
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": [[1], []]}, "input_ids"),
    ({"input_ids": [1, -1]}, "input_ids"),
    ({"input_ids": [1], "rid": ["a", "b"]}, ""),
    ({"input_ids": [1], "stream": True}, "stream"),
    ({"input_ids": [1], "top_logprobs_num": 21}, "top_logprobs_num"),
    ({"input_ids": [1], "image_data": ["x.png"]}, "image_data"),
    ({"input_ids": [1], "lora_path": "adapter"}, "lora_path"),
    ({"input_ids": [1], "return_routed_experts": True}, "return_routed_experts"),
    ({"input_ids": [1], "regex": "a+"}, "regex"),
    ({"input_ids": [1], "next_input_ids": [[]]}, "next_input_ids"),
    ({"input_ids": [1], "sampling_params": {"min_p": -0.05}}, "sampling_params.min_p"),
    ({"input_ids": [1], "sampling_params": {"logit_bias": {"x": 1}}},
     "sampling_params.logit_bias"),
    ({"input_ids": [1], "sampling_params": {"frequency_penalty": 2.5}},
     "sampling_params.frequency_penalty"),
    ({"input_ids": [1], "sampling_params": {"presence_penalty": -3}},
     "sampling_params.presence_penalty"),
    ({"input_ids": [1], "sampling_params": {"stop": ["</s>"]}}, "sampling_params.stop"),
    ({"input_ids": [1], "sampling_params": {"stop": "x"}}, "sampling_params.stop"),
    ({"input_ids": [1], "sampling_params": {"json_schema": "{x"}},
     "sampling_params.json_schema"),
    ({"input_ids": [1], "sampling_params": {"regex": "a", "ebnf": "root ::= \"a\""}},
     "sampling_params"),
    ({"input_ids": [1], "sampling_params": {"temperature": 3}}, "sampling_params.temperature"),
    ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
    ({"input_ids": [1], "sampling_params": {"n": 0}}, "sampling_params.n"),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}},
     "sampling_params.max_new_tokens"),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
      "logprob_start_len": -2}, "logprob_start_len"),
    ({"input_ids": [1], "sampling_params": {"min_new_tokens": -1}},
     "sampling_params.min_new_tokens"),
    ({"input_ids": [1], "sampling_params": {"repetition_penalty": 0}},
     "sampling_params.repetition_penalty"),
    ({"input_ids": [1], "sampling_params": {"sampling_seed": -1}},
     "sampling_params.sampling_seed"),
    ({"input_ids": [1], "sampling_params": {"seed_mode": "magic"}},
     "sampling_params.seed_mode"),
])
def test_refused_fields_are_named(body: dict[str, Any], field: str) -> None:
    assert field_of(GenerateIn, body).startswith(field)


def test_the_exactly_served_penalty_and_zero_penalties_pass() -> None:
    sp = SglSamplingParams(repetition_penalty=1.2, frequency_penalty=0.0, presence_penalty=0,
                           min_p=0.0, stop=[], top_k=0)
    assert sp.to_sampling().repetition_penalty == 1.2 and sp.to_sampling().top_k == -1


def test_weight_update_bodies() -> None:
    areal = WeightsFromDiskIn.model_validate({"model_path": "/ckpt/3",
                                              "abort_all_request": True})
    assert areal.version() is None and areal.model_path == "/ckpt/3"
    assert WeightsFromDiskIn.model_validate({"model_path": "/c", "weight_version": "7"}
                                            ).version() == 7
    assert WeightsFromDiskIn(model_path="/c", weight_version=8).version() == 8
    for bad in ("default", "-1", "1.5", str(2**60)):
        assert field_of(WeightsFromDiskIn, {"model_path": "/c", "weight_version": bad}
                        ) == "weight_version"
    assert field_of(WeightsFromDiskIn, {"model_path": ""}) == "model_path"


def test_control_bodies() -> None:
    assert AbortIn(rid="r1").rid == "r1" and AbortIn(abort_all=True).abort_all
    assert field_of(AbortIn, {}) == ""
    assert PauseIn().mode == "abort" and PauseIn(mode="in_place").mode == "in_place"
    assert field_of(PauseIn, {"mode": "later"}) == "mode"
    assert NextPromptsIn(input_ids=[[1, 2]]).input_ids == [[1, 2]]
    assert field_of(NextPromptsIn, {"input_ids": []}) == "input_ids"
    assert field_of(NextPromptsIn, {"input_ids": [[1], []]}) == "input_ids"
