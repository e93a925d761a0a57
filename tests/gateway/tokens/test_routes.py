"""vLLM's token routes on the gateway without ranks (`gateway/tokens/`): bad input is a 400
naming the field in vLLM's error shape, a valid generate request reaches the ranks (a 503
here), the tokenizer's two directions answer in vLLM's shapes, and the bearer token guards
them. The routes against a real cluster: tests/integration/chat/test_agentic_frameworks.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bubblespec.tasks import default_task
from tests.gateway.helpers import gateway, vllm_error

TOKEN = "tok-token"
GEN = {"model": "m", "token_ids": [1, 5, 6], "sampling_params": {"max_tokens": 4}}


@pytest.fixture(scope="module")
def gw() -> Iterator[TestClient]:
    with gateway(max_prompts=8, max_prompt_tokens=64, max_new_tokens=1000, max_n=64,
                 sglang_quiet_s=0.005, sglang_max_wait_s=0.05) as c:
        yield c


@pytest.mark.parametrize(("body", "param"), [
    ({}, "token_ids"),
    ({**GEN, "token_ids": []}, "token_ids"),
    ({**GEN, "token_ids": [1, 10**6]}, "token_ids[1]"),
    ({**GEN, "token_ids": [1] * 65}, "token_ids"),
    ({**GEN, "sampling_params": {"max_tokens": 1001}}, "sampling_params.max_tokens"),
    ({**GEN, "sampling_params": {"n": 65}}, "sampling_params.n"),
    ({**GEN, "sampling_params": {"logprobs": 21}}, "sampling_params.logprobs"),
    ({**GEN, "sampling_params": {"min_p": 1.1}}, "sampling_params.min_p"),
    ({**GEN, "sampling_params": {"logit_bias": {"5.5": 1.0}}}, "sampling_params.logit_bias"),
    ({**GEN, "sampling_params": {"stop": ["x"]}}, "sampling_params.stop"),
    ({**GEN, "sampling_params": {"prompt_logprobs": 1}}, "sampling_params.prompt_logprobs"),
    ({**GEN, "sampling_params": {"max_tokens": 2, "min_tokens": 3}},
     "sampling_params.min_tokens"),
    ({**GEN, "sampling_params": {"presence_penalty": 2.5}}, "sampling_params.presence_penalty"),
    ({**GEN, "sampling_params": {"stop_token_ids": [2, 900]}},
     "sampling_params.stop_token_ids[1]"),
    ({**GEN, "output_mode": "words"}, "output_mode"),
    ({**GEN, "priority": 3}, "priority"),
    ({**GEN, "sampling_params": {"max_tokenz": 4}}, "sampling_params.max_tokenz"),
])
def test_generate_bad_input_is_a_400_naming_the_param(gw: TestClient, body: dict[str, Any],
                                                      param: str) -> None:
    vllm_error(gw.post("/inference/v1/generate", json=body), 400, param)


def test_a_valid_generate_reaches_the_ranks(gw: TestClient) -> None:
    for body in (GEN, {**GEN, "stream": True}, {**GEN, "sampling_params": {
            "max_tokens": 8, "min_tokens": 2, "logprobs": 5, "seed": 3, "n": 2,
            "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
            "top_k": 0, "skip_special_tokens": False, "detokenize": True}},
            {**GEN, "output_mode": "text", "cache_salt": "s" * 43, "return_token_ids": True},
            {**GEN, "unknown_knob": 1}):  # ignored, as vLLM's server ignores it
        vllm_error(gw.post("/inference/v1/generate", json=body), 503, None)


def test_a_prompt_that_fills_the_context_in_vllms_words(gw: TestClient) -> None:
    ctx = gw.get("/v1/models").json()["data"][0]["max_model_len"]
    with gateway(max_prompt_tokens=ctx + 8, max_new_tokens=16) as big:
        r = big.post("/inference/v1/generate", json={**GEN, "token_ids": [1] * ctx})
    err = vllm_error(r, 400, "token_ids")
    assert err["message"].startswith(f"This model's maximum context length is {ctx} tokens")


def test_tokenize_and_detokenize(gw: TestClient) -> None:
    task = default_task()
    r = gw.post("/tokenize", json={"model": "m", "prompt": "1 2 ; 3 + 4"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["tokens"] == task.encode("1 2 ; 3 + 4", add_bos=True)  # BOS: vLLM's default
    assert out["count"] == len(out["tokens"])
    assert out["max_model_len"] > 0 and out["token_strs"] is None
    plain = gw.post("/tokenize", json={"prompt": "1 2", "add_special_tokens": False,
                                       "return_token_strs": True}).json()
    assert plain["tokens"] == task.encode("1 2", add_bos=False)
    assert plain["token_strs"] == [task.decode([t], skip_special=False)
                                   for t in plain["tokens"]]
    back = gw.post("/detokenize", json={"tokens": out["tokens"]})
    assert back.status_code == 200
    assert back.json()["prompt"] == task.decode(out["tokens"], skip_special=False)
    vllm_error(gw.post("/detokenize", json={"tokens": [1, 10**6]}), 400, "tokens[1]")
    vllm_error(gw.post("/tokenize", json={"model": "m"}), 400, "prompt")
    vllm_error(gw.post("/tokenize", json={"prompt": "1", "messages": []}), 400, "messages")
    vllm_error(gw.post("/tokenize", json={"messages": [{"role": "user", "content": "x"}]}),
               400, "messages")  # the embedded model has no chat template


def test_the_bearer_token_guards_the_token_routes() -> None:
    with gateway(token=TOKEN) as gw:
        for route, body in (("/inference/v1/generate", GEN), ("/tokenize", {"prompt": "1"}),
                            ("/detokenize", {"tokens": [1]})):
            assert gw.post(route, json=body).status_code == 401
        ok = gw.post("/detokenize", json={"tokens": [1]},
                     headers={"authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200
