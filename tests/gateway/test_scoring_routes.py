"""Prompt scoring's routes on the gateway without ranks: SGLang's `max_new_tokens: 0` and
OpenAI's `echo` + `max_tokens: 0` refuse bad input with a 400 naming the field before any
rank is asked, answer a valid scoring call with 503 "no rank is ready" (never a 500), and
answer a prompt echo that asks for no log-probs without a rank. The scored values are
checked end to end in tests/integration/api/test_scoring.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from .helpers import gateway

TEACHER = {"input_ids": [1, 5, 6], "return_logprob": True, "logprob_start_len": 0,
           "sampling_params": {"temperature": 0, "max_new_tokens": 0,
                               "skip_special_tokens": False}}
ECHO = {"model": "m", "prompt": [1, 5, 6], "echo": True, "max_tokens": 0, "logprobs": 0}


@pytest.fixture(scope="module")
def gw() -> Iterator[TestClient]:
    with gateway(max_prompts=4, max_prompt_tokens=8, max_new_tokens=8,
                 sglang_quiet_s=0.005) as c:
        yield c


def field_of(r: Any, status: int) -> str:
    assert r.status_code == status, r.text
    return r.json()["field"]


@pytest.mark.parametrize(("body", "field"), [
    ({**TEACHER, "logprob_start_len": 3}, "logprob_start_len"),
    ({**TEACHER, "logprob_start_len": -2}, "logprob_start_len"),
    ({**TEACHER, "input_ids": [[1, 5, 6], [1, 5]], "logprob_start_len": 2},
     "logprob_start_len"),
    ({**TEACHER, "input_ids": [1] * 17}, "input_ids"),
    ({**TEACHER, "input_ids": [[1], [1] * 17]}, "input_ids[1]"),
    ({**TEACHER, "input_ids": [[1]] * 5}, "input_ids"),
    ({**TEACHER, "sampling_params": {"max_new_tokens": -1}}, "sampling_params.max_new_tokens"),
])
def test_sglang_scoring_refusals_name_the_field(gw: TestClient, body: dict[str, Any],
                                                field: str) -> None:
    assert field_of(gw.post("/generate", json=body), 400) == field


def test_sglang_scoring_without_ranks(gw: TestClient) -> None:
    r = gw.post("/generate", json=TEACHER)
    assert field_of(r, 503) == "ranks" and "no rank is ready" in r.json()["detail"]
    r = gw.post("/generate", json={"input_ids": [[1, 5], [1, 6]], "rid": ["a", "b"],
                                   "sampling_params": {"max_new_tokens": 0, "n": 2}})
    assert r.status_code == 200, r.text
    outs = r.json()
    assert [o["meta_info"]["id"] for o in outs] == ["a-0", "a-1", "b-0", "b-1"]
    for o in outs:
        assert o["output_ids"] == [] and o["text"] == ""
        assert o["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
        assert "input_token_logprobs" not in o["meta_info"]


@pytest.mark.parametrize(("body", "param"), [
    ({**ECHO, "echo": False}, "max_tokens"),
    ({**ECHO, "prompt_logprobs": -1}, "prompt_logprobs"),  # the whole vocabulary
    ({**ECHO, "prompt_logprobs": 21}, "prompt_logprobs"),
    ({**ECHO, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ({**ECHO, "prompt": [1] * 17}, "prompt"),
    ({**ECHO, "prompt": [[1], [1] * 17]}, "prompt[1]"),
])
def test_openai_echo_refusals_name_the_param(gw: TestClient, body: dict[str, Any],
                                             param: str) -> None:
    r = gw.post("/v1/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_openai_echo_without_ranks(gw: TestClient) -> None:
    r = gw.post("/v1/completions", json=ECHO)
    assert r.status_code == 503 and r.json()["error"]["param"] == "ranks", r.text
    r = gw.post("/v1/completions", json={**ECHO, "logprobs": None, "n": 2})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["finish_reason"] for c in out["choices"]] == ["length", "length"]
    assert out["choices"][0]["logprobs"] is None and out["choices"][0]["text"]
    assert out["usage"] == {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3}


def test_return_token_ids_by_default_as_arts_vllm() -> None:
    """`--return-token-ids`: every OpenAI answer carries token ids unless the request says
    false (ART's vLLM is patched this way, its clients never send the field)."""
    with gateway(return_token_ids=True) as c:
        body = {**ECHO, "logprobs": None}  # echo, nothing generated: no rank is called
        got = c.post("/v1/completions", json=body).json()["choices"][0]
        assert got["prompt_token_ids"] == [1, 5, 6] and got["token_ids"] == []
        assert got["text"] == ""  # echo with token ids: vLLM leaves the prompt text out
        off = c.post("/v1/completions", json={**body, "return_token_ids": False})
        assert "prompt_token_ids" not in off.json()["choices"][0]
