"""The OpenAI-compatible routes on the gateway, without ranks: OpenAI's error body with the
field named in `param` (400 for bad input, never a 5xx), the gateway's limits checked before
a request is queued, the bearer token, chat templates (missing, refusing, sandboxed), and
the `openai` client's own error classes over the in-process app.

The gateway runs in-process with no synchronizer and no rank, so a valid request ends in a
503 "no rank is ready" in OpenAI's error shape; the end-to-end path with real ranks is
tests/integration/api/test_openai_clients.py (and test_openai_chat.py for chat).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from bubblespec.protocol.openai import ChatCompletionIn, CompletionIn
from bubblespec.protocol.sampling import SamplingParams
from tests.gateway.helpers import gateway
from tests.gateway.helpers import vllm_error as oai_error
from tests.hostile.bodies import dumps, mutated, schema_paths

openai = pytest.importorskip("openai")

TOKEN = "oai-token"
CMPL = {"model": "m", "prompt": [1, 5, 6], "max_tokens": 4}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "1 2"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def gw() -> Iterator[TestClient]:
    with gateway(max_prompts=8, max_prompt_tokens=64, max_new_tokens=1000, max_n=64,
                 sglang_quiet_s=0.005, sglang_max_wait_s=0.05) as c:
        yield c


@pytest.fixture(scope="module")
def gw_token() -> Iterator[TestClient]:
    with gateway(token=TOKEN, sglang_quiet_s=0.005) as c:
        yield c


@pytest.mark.parametrize(("body", "param"), [
    ({}, "prompt"),
    ({**CMPL, "prompt": [1, 10**6]}, "prompt[1]"),
    ({**CMPL, "prompt": [[1, 5], [1, 5, 999]]}, "prompt[1][2]"),
    ({**CMPL, "prompt": [1] * 65}, "prompt"),
    ({**CMPL, "prompt": [[1]] * 9}, "prompt"),
    ({**CMPL, "max_tokens": 1001}, "max_tokens"),
    ({**CMPL, "n": 65}, "n"),
    ({**CMPL, "stop_token_ids": [2, 500]}, "stop_token_ids[1]"),
    ({**CMPL, "next_prompts": [[1, 2], [1, 900]]}, "next_prompts[1]"),
    ({**CMPL, "presence_penalty": 2.5}, "presence_penalty"),  # [-2, 2]
    ({**CMPL, "min_tokens": 9, "max_tokens": 4}, "min_tokens"),
    ({**CMPL, "min_p": -0.1}, "min_p"),
    ({**CMPL, "logit_bias": {"a": 1}}, "logit_bias"),
    ({**CMPL, "logprobs": 21}, "logprobs"),  # vLLM's max_logprobs: 20
    ({**CMPL, "echo": True, "prompt_logprobs": -1}, "prompt_logprobs"),
    ({**CMPL, "echo": True, "prompt_logprobs": 3, "stream": True}, "prompt_logprobs"),
    ({**CMPL, "cache_salt": ""}, "cache_salt"),
    ({**CMPL, "stream": "maybe"}, "stream"),
])
def test_completion_bad_input_is_a_400_naming_the_param(gw: TestClient, body: dict[str, Any],
                                                        param: str) -> None:
    oai_error(gw.post("/v1/completions", json=body), 400, param)


def test_bodies_that_are_not_json_objects(gw: TestClient) -> None:
    for raw in (b"{", b"[1, 2]", b"null", b"[" * 5000):
        r = gw.post("/v1/completions", content=raw,
                    headers={"content-type": "application/json"})
        assert r.status_code == 400, (raw[:10], r.text)
        assert r.json()["error"]["param"] in ("body", "prompt"), r.text


def test_without_ranks_a_valid_request_is_a_503_in_openai_shape(gw: TestClient) -> None:
    oai_error(gw.post("/v1/completions", json=CMPL), 503, None)
    oai_error(gw.post("/v1/completions", json={**CMPL, "stream": True}), 503, None)
    oai_error(gw.post("/v1/completions", json={**CMPL, "prompt": "1 2 +"}), 503, None)
    # a key vLLM does not define is ignored, as vLLM's server ignores it
    oai_error(gw.post("/v1/completions", json={**CMPL, "unknown_knob": 1}), 503, None)
    oai_error(gw.post("/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "1"}],
        "stream_options": {"include_usage": True, "newer_flag": 1}, "unknown_knob": 2}),
        400, "messages")  # past the body: the embedded model has no chat template


def test_max_tokens_null_is_what_the_context_leaves(gw_token: TestClient) -> None:
    auth = {"authorization": f"Bearer {TOKEN}"}
    card = gw_token.get("/v1/models").json()["data"][0]  # public: no token needed
    ctx = card["max_model_len"]
    assert card["object"] == "model" and ctx > 0
    r = gw_token.post("/v1/completions", headers=auth,
                      json={**CMPL, "prompt": [1] * ctx, "max_tokens": None})
    oai_error(r, 400, "prompt")  # no room left
    r = gw_token.post("/v1/completions", headers=auth,
                      json={**CMPL, "prompt": [1] * (ctx - 1), "max_tokens": None})
    oai_error(r, 503, None)  # one token of room: valid, then no rank


def test_chat_without_a_template_names_messages(gw: TestClient) -> None:
    oai_error(gw.post("/v1/chat/completions", json=CHAT), 400, "messages")
    oai_error(gw.post("/v1/chat/completions", json={**CHAT, "top_logprobs": 3}), 400,
              "top_logprobs")  # vLLM: top_logprobs needs logprobs true
    oai_error(gw.post("/v1/chat/completions", json={**CHAT, "top_logprobs": 21,
                                                     "logprobs": True}), 400, "top_logprobs")
    oai_error(gw.post("/v1/chat/completions", json={**CHAT, "reasoning_effort": "lots"}), 400,
              "reasoning_effort")


def test_bearer_token_and_the_openai_client(gw_token: TestClient) -> None:
    r = gw_token.post("/v1/completions", json=CMPL)
    assert r.status_code == 401
    r = gw_token.post("/v1/chat/completions", json=CHAT,
                      headers={"authorization": "Bearer wrong"})
    assert r.status_code == 401
    bad = openai.OpenAI(base_url="http://testserver/v1", api_key="wrong", max_retries=0,
                        http_client=gw_token)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="m", prompt=[1, 5])
    good = openai.OpenAI(base_url="http://testserver/v1", api_key=TOKEN, max_retries=0,
                         http_client=gw_token)
    with pytest.raises(openai.BadRequestError) as e:
        good.completions.create(model="m", prompt=[1, 5], frequency_penalty=3.0)
    assert e.value.param == "frequency_penalty" and e.value.status_code == 400
    with pytest.raises(openai.InternalServerError) as e5:  # 503: no rank is ready
        good.completions.create(model="m", prompt=[1, 5], max_tokens=2)
    assert e5.value.status_code == 503
    assert good.models.list().data[0].object == "model"


@pytest.fixture(scope="module")
def template_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's tokenizer with a chat template that refuses a system message."""
    from bubblespec.tasks import default_model_dir

    d = tmp_path_factory.mktemp("chat-tok")
    shutil.copy(Path(default_model_dir()) / "tokenizer.json", d / "tokenizer.json")
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('no system role') }}{% endif %}"
        "{% if m['role'] == 'tool' %}{{ m.__class__.__init__.__globals__ }}{% endif %}"
        "{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}={% endif %}")}))
    return d


def test_chat_template_refusals_are_400s(template_dir: Path) -> None:
    with gateway(tokenizer=str(template_dir), sglang_quiet_s=0.005) as c:
        r = c.post("/v1/chat/completions", json={
            **CHAT, "messages": [{"role": "system", "content": "x"}]})
        assert "no system role" in oai_error(r, 400, "messages")["message"]
        r = c.post("/v1/chat/completions", json={
            **CHAT, "messages": [{"role": "tool", "content": "x"}]})
        oai_error(r, 400, "messages")  # the sandbox refuses
        r = c.post("/v1/chat/completions", json={
            **CHAT, "messages": [{"role": "user", "content": "1 2 +"}]})
        oai_error(r, 503, None)  # rendered and tokenized; then no rank


def _paths(model: Any) -> list[tuple[str | int, ...]]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    doc = {"components": {"schemas": schema.get("$defs", {})}}
    return sorted(set(schema_paths(doc, schema)), key=lambda p: (len(p), str(p)))


HYPO = settings(max_examples=80, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize(("route", "model", "base"), [
    ("/v1/completions", CompletionIn,
     {**CMPL, "n": 2, "seed": 3, "stop": ["x"], "logprobs": 0, "stream": True,
      "stream_options": {"include_usage": True}, "next_prompts": [[1, 7], "1 2"]}),
    ("/v1/chat/completions", ChatCompletionIn,
     {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "1"}]},
                           {"role": "assistant", "content": "2"}],
      "logprobs": True, "top_logprobs": 0, "chat_template_kwargs": {"a": 1}}),
])
def test_hostile_bodies_never_get_a_5xx(template_dir: Path, route: str, model: Any,
                                        base: dict[str, Any]) -> None:
    """Hostile mutations of a valid body: a 4xx naming a field in OpenAI's shape, or (a valid
    body) the 503 of a gateway without ranks; chat bodies go through a real template."""
    with gateway(tokenizer=str(template_dir), sglang_quiet_s=0.005,
                 max_new_tokens=1000) as gw:
        @given(mutated(base, _paths(model)))
        @HYPO
        def run(case: tuple[str, Any]) -> None:
            what, body = case
            r = gw.post(route, content=dumps(body),
                        headers={"content-type": "application/json"})
            err = r.json()["error"]
            if r.status_code == 503:  # a valid body: no rank to run it on
                assert "no rank" in err["message"], f"{route}: {what}: {r.text}"
            else:
                assert 400 <= r.status_code < 500, f"{route}: {what}: {r.status_code} {r.text}"
                assert err["param"] is not None, f"{route}: {what}: {r.text}"

        run()


async def test_choice_shape_and_stop_strings(gw: TestClient) -> None:
    """One answer as a choice: the stop token's text left out, a stop string cutting the
    text, the ids and log-probs through the token that completed it, the reasons."""
    from bubblespec.batching import ABORT_BEFORE_PREFILL, Answer, Ask
    from bubblespec.protocol.gateway import RolloutSample
    from bubblespec.tasks import default_task

    task = default_task()
    f = gw.app.state.openai
    ids = task.encode("1 2 ; 3 + 4")
    eos = task.eos_id
    sample = RolloutSample(sample_index=0, output_ids=[*ids, eos],
                           output_logprobs=[-0.5] * (len(ids) + 1), finish_reason="stop")

    def choice(body: dict[str, Any], s: RolloutSample | None = sample) -> Any:
        b = CompletionIn.model_validate({**CMPL, **body})
        sp = b.to_sampling(8)
        ask = Ask([1, 5, 6], sp, None, "r")
        return f.choice(3, b, sp, ask, Answer(s, [1, 5, 6], step=9))

    c = choice({"stop_token_ids": [eos]})
    assert (c.text, c.finish_reason, c.stop_reason, c.ids) == ("1 2 ; 3 + 4", "stop", eos,
                                                               [*ids, eos])
    assert c.prompt_ids == [1, 5, 6] and c.index == 3 and c.step == 9
    assert choice({}).stop_reason is None  # EOS without stop_token_ids: vLLM's None
    c = choice({"stop": ["; 3", "4"]})
    assert (c.text, c.finish_reason, c.stop_reason) == ("1 2 ", "stop", "; 3")
    assert c.ids == task.encode("1 2 ; 3") and c.logprobs == [-0.5] * 4
    c = choice({"stop": "3 +", "include_stop_str_in_output": True})
    assert c.text == "1 2 ; 3 +" and c.ids == task.encode("1 2 ; 3 +")
    assert choice({"stop": "never"}).text == "1 2 ; 3 + 4"
    c = choice({}, RolloutSample(sample_index=0, output_ids=ids, output_logprobs=[-1.0] * 5,
                                 finish_reason="length"))
    assert (c.text, c.finish_reason, c.ids) == ("1 2 ; 3 + 4", "length", ids)
    c = f.choice(0, CompletionIn.model_validate(CMPL), CompletionIn.model_validate(
        CMPL).to_sampling(4), Ask([1, 5], SamplingParams(), None, "r"),
        Answer(None, [1, 5], message=ABORT_BEFORE_PREFILL))
    assert (c.text, c.finish_reason, c.ids) == ("", "abort", [])
