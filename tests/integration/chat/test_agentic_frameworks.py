"""The request shapes agentic RL frameworks send to a vLLM server, sent to the gateway on a
real 2-rank cluster serving the real chat model (SmolLM2-135M-Instruct), with the real
`openai` client where the framework uses it and plain HTTP where it posts JSON itself:

- SkyRL's and prime-rl's token clients: vLLM's token-in/token-out `/inference/v1/generate`
  (token ids in, token ids and log-probs out), with `/tokenize` for the chat prompt;
- fields SkyRL, prime-rl/verifiers, rLLM and ART always send: `logprobs: 1` / `true`,
  `min_tokens`, `top_logprobs`, `return_tokens_as_token_ids`, `add_special_tokens: false`,
  `reasoning_effort: null`, vLLM's `return_token_ids`;
- top log-probs checked against transformers' log-softmax of the same model (values and
  rank: a wrong rank of alternatives fails);
- a seeded request repeats bit for bit across 5 runs batched differently (vLLM's promise);
- rLLM's distillation teacher (`echo` with a generated token and `logprobs: 1`) and vLLM's
  `prompt_logprobs`, values and ranks against transformers;
- structured outputs (`response_format`, `structured_outputs`, SGLang's `regex`) in their
  constraints, and a constraint the ranks cannot build a 400 of its own;
- tool calls: tool_choice "required", a named tool, and "auto" through vLLM's hermes parser;
- a chat continuing an assistant turn (`continue_final_message`, `echo`) with its
  `prompt_logprobs` and `return_prompt_text`;
- an overlong prompt is refused in vLLM's words (verifiers ends a rollout as overlong on
  "maximum context length"), with no internal route in the message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bubblespec.cluster import LocalCluster

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.engine

CHAT = [{"role": "user", "content": "Name three primes, then stop."}]


@pytest.fixture(scope="module")
def cluster(chat_cluster: LocalCluster) -> LocalCluster:
    return chat_cluster  # shared with test_openai_chat.py (conftest.py)


@pytest.fixture(scope="module")
def client(chat_client: Any) -> Any:
    return chat_client


@pytest.fixture(scope="module")
def http(cluster: LocalCluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster.gateway_url, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def chat_ids(http: httpx.Client) -> list[int]:
    r = http.post("/tokenize", json={"messages": CHAT, "add_generation_prompt": True})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["count"] == len(out["tokens"]) and out["max_model_len"] > 0
    return list(out["tokens"])


def test_token_in_token_out_generate(http: httpx.Client, chat_ids: list[int]) -> None:
    """SkyRL's remote inference client / prime-rl's token client."""
    body = {"model": "m", "token_ids": chat_ids, "return_token_ids": True,
            "sampling_params": {"max_tokens": 24, "temperature": 1.0, "n": 2, "seed": 5,
                                "logprobs": 1, "min_tokens": 1, "skip_special_tokens": False}}
    r = http.post("/inference/v1/generate", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["output_mode"] == "tokens" and out["prompt_token_ids"] == chat_ids
    assert len(out["choices"]) == 2
    for c in out["choices"]:
        ids = c["token_ids"]
        assert ids and c["finish_reason"] in ("stop", "length")
        content = c["logprobs"]["content"]
        assert [e["token_id"] for e in content] == ids
        for e in content:  # logprobs 1: the sampled token's entry first
            assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 1
            assert e["top_logprobs"][0]["token_id"] == e["token_id"]
    assert out["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in out["choices"])
    again = http.post("/inference/v1/generate", json=body).json()  # seeded: it repeats
    assert [c["token_ids"] for c in again["choices"]] == [c["token_ids"] for c in out["choices"]]
    text = http.post("/inference/v1/generate", json={**body, "output_mode": "text"}).json()
    first = out["choices"][0]["token_ids"]
    back = http.post("/detokenize", json={"tokens": first}).json()["prompt"]
    assert text["choices"][0]["token_ids"] == first
    assert back.startswith(text["choices"][0]["text"])
    lines = [ln for ln in http.post("/inference/v1/generate", json={
        **body, "stream": True, "stream_options": {"include_usage": True}}).text.splitlines()
        if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) == 4  # two choices, usage, done


def test_completion_fields_frameworks_always_send(client: Any, chat_ids: list[int]) -> None:
    """SkyRL's older remote engine and Tinker forwarding (`logprobs: 1`, `min_tokens: 1`),
    prime-rl's completion environments and rLLM's gateway (`logprobs: true`), rLLM's
    cumulative token mode (`add_special_tokens: false`), verifiers
    (`return_tokens_as_token_ids`)."""
    r = client.completions.create(
        model="m", prompt=chat_ids, max_tokens=16, temperature=1.0, logprobs=1, seed=7,
        extra_body={"min_tokens": 1, "return_token_ids": True,
                    "return_tokens_as_token_ids": True})
    c = r.choices[0]
    assert c.token_ids and len(c.logprobs.tokens) == len(c.token_ids)
    assert c.logprobs.tokens == [f"token_id:{t}" for t in c.token_ids]
    for t, lp, top in zip(c.token_ids, c.logprobs.token_logprobs, c.logprobs.top_logprobs):
        assert f"token_id:{t}" in top and top[f"token_id:{t}"] == lp and 1 <= len(top) <= 2
    raw = httpx.post(str(client.base_url) + "completions", timeout=300, json={
        "model": "m", "prompt": "Two plus two is", "max_tokens": 8, "logprobs": True,
        "add_special_tokens": False, "return_token_ids": True})
    assert raw.status_code == 200, raw.text
    choice = raw.json()["choices"][0]
    assert len(choice["logprobs"]["top_logprobs"][0]) in (1, 2)  # logprobs true = 1


def test_chat_fields_frameworks_always_send(client: Any) -> None:
    """ART (`reasoning_effort: null`, `return_token_ids`), verifiers (`logprobs`,
    `top_logprobs: 1`, `return_tokens_as_token_ids`, `min_tokens`)."""
    r = client.chat.completions.create(
        model="m", messages=CHAT, max_tokens=16, temperature=0.7, logprobs=True,
        top_logprobs=2, reasoning_effort=None,
        extra_body={"return_token_ids": True, "min_tokens": 2, "return_tokens_as_token_ids":
                    True})
    c = r.choices[0]
    assert len(c.token_ids) >= 2 and len(c.logprobs.content) == len(c.token_ids)
    for t, e in zip(c.token_ids, c.logprobs.content):
        assert e.token == f"token_id:{t}" and len(e.top_logprobs) == 2
        assert e.top_logprobs[0].token == e.token  # the sampled token first (vLLM's order)


def test_top_logprobs_equal_transformers(client: Any, chat_ids: list[int],
                                         real_dir: Path) -> None:
    """The alternatives and their log-probs are the model's: transformers' log-softmax of
    the same weights (fp32) at each position of a greedy answer."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    r = client.completions.create(model="m", prompt=chat_ids, max_tokens=6, temperature=0,
                                  logprobs=5, extra_body={"return_token_ids": True,
                                                          "return_tokens_as_token_ids": True})
    c = r.choices[0]
    model = transformers.AutoModelForCausalLM.from_pretrained(str(real_dir),
                                                              torch_dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([chat_ids + c.token_ids[:-1]])).logits[0].float()
    ref = torch.log_softmax(logits[len(chat_ids) - 1:], dim=-1)
    for i, (t, top) in enumerate(zip(c.token_ids, c.logprobs.top_logprobs)):
        best = ref[i].topk(5)
        assert int(best.indices[0]) == t  # greedy: the sampled token is the argmax
        got = {int(k.removeprefix("token_id:")): v for k, v in top.items()}
        assert set(got) == {int(x) for x in best.indices}, (i, got, best)
        for tok, lp in got.items():
            assert abs(lp - float(ref[i, tok])) < 2e-3, (i, tok, lp, float(ref[i, tok]))


def test_echo_with_generation_and_prompt_logprobs_equal_transformers(
        client: Any, chat_ids: list[int], real_dir: Path) -> None:
    """rLLM's distillation teacher (`echo`, `max_tokens: 1`, `logprobs: 1`) and vLLM's
    `prompt_logprobs`: the prompt's text and tokens come first, each prompt position with
    the prompt token's log-prob and the most likely token's, then the generated token;
    `prompt_logprobs` carries each position's ranks. Values and ranks against transformers'
    log-softmax of the same weights (a shifted position or a wrong rank fails)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    prompt = chat_ids[:24]
    r = client.completions.create(model="m", prompt=prompt, echo=True, max_tokens=1,
                                  logprobs=1, temperature=0,
                                  extra_body={"return_token_ids": True, "prompt_logprobs": 2})
    c = r.choices[0]
    lp = c.logprobs
    assert len(c.token_ids) == 1 and r.usage.completion_tokens == 1
    assert len(lp.tokens) == len(prompt) + 1 and lp.token_logprobs[0] is None
    assert lp.top_logprobs[0] is None and all(len(d) in (1, 2) for d in lp.top_logprobs[1:])
    model = transformers.AutoModelForCausalLM.from_pretrained(str(real_dir),
                                                              torch_dtype=torch.float32)
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([prompt])).logits[0].float(), dim=-1)
    assert int(ref[-1].argmax()) == c.token_ids[0]  # greedy: the generated token
    pl = c.model_extra["prompt_logprobs"]
    assert len(pl) == len(prompt) and pl[0] is None
    for i in range(1, len(prompt)):
        row, t = ref[i - 1], prompt[i]
        assert abs(lp.token_logprobs[i] - float(row[t])) < 2e-3, i
        assert max(lp.top_logprobs[i].values()) == pytest.approx(float(row.max()), abs=2e-3)
        got = {int(k): v for k, v in pl[i].items()}
        assert abs(got[t]["logprob"] - float(row[t])) < 2e-3
        higher = int((row > row[t] + 2e-3).sum())
        assert higher + 1 <= got[t]["rank"] <= int((row >= row[t] - 2e-3).sum()), i
        best = row.topk(2)
        for k in range(2):
            alt = got.get(int(best.indices[k]))
            assert alt is not None and abs(alt["logprob"] - float(best.values[k])) < 2e-3
            assert alt["rank"] == k + 1 or int(best.indices[k]) == t
    assert len(lp.top_logprobs[-1]) in (1, 2)  # the generated token: itself and the top 1


SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"},
                                           "why": {"type": "string", "maxLength": 40}},
          "required": ["answer", "why"], "additionalProperties": False}


def test_structured_outputs_follow_their_constraint(client: Any, http: httpx.Client) -> None:
    """`response_format` json_schema and json_object, vLLM's `structured_outputs` (choice,
    regex) and SGLang's `regex`, sampled on the speculating ranks, each in its constraint; a
    constraint the ranks' backend cannot build is a 400 naming its field, and a request
    beside it in the same moment is answered."""
    import json
    import re

    async def both() -> list[Any]:
        async with openai.AsyncOpenAI(base_url=str(http.base_url).rstrip("/") + "/v1",
                                      api_key="x",
                                      timeout=300, max_retries=0) as ac:
            good = ac.chat.completions.create(
                model="m", messages=CHAT, max_tokens=60, seed=3, n=2,
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "a", "schema": SCHEMA}})
            bad = ac.chat.completions.create(
                model="m", messages=CHAT, max_tokens=8,
                extra_body={"structured_outputs": {"grammar": "root ::= (((("}})
            return await asyncio.gather(good, bad, return_exceptions=True)

    good, bad = asyncio.run(both())
    assert isinstance(bad, openai.BadRequestError) and bad.param == "structured_outputs", bad
    for ch in good.choices:
        if ch.finish_reason == "stop":
            got = json.loads(ch.message.content)
            assert set(got) == {"answer", "why"} and isinstance(got["answer"], int)
        else:  # cut by max_tokens: still a prefix of such an object
            assert ch.message.content.startswith('{"answer"') or \
                ch.message.content.startswith('{ "answer"')
    r = client.chat.completions.create(model="m", messages=CHAT, max_tokens=40, seed=4,
                                       response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = client.completions.create(model="m", prompt="The best prime is", max_tokens=8,
                                  extra_body={"structured_outputs": {"choice": [" two",
                                                                               " seven"]}})
    assert r.choices[0].text in (" two", " seven")
    out = http.post("/generate", json={"text": "Count: ", "sampling_params": {
        "max_new_tokens": 12, "regex": "[0-9]{3}-[0-9]{2}"}})
    assert out.status_code == 200, out.text
    assert re.fullmatch("[0-9]{3}-[0-9]{2}", out.json()["text"]), out.json()["text"]


ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
NOW = {"type": "function", "function": {"name": "now", "description": "The time."}}
ASK = [{"role": "user", "content": "What is 2 + 3? Use the add tool."}]


def test_tool_calls_as_vllm_answers_them(client: Any) -> None:
    """ART's and verifiers' tool environments: tool_choice "required" and a named tool
    (constrained to vLLM's schema of the calls), and "auto" through vLLM's hermes parser on
    a rank. The small chat model does not emit hermes calls by itself, so the "auto" call is
    steered into the hermes format with a structured-output regex (vLLM serves that pair
    too): the parser must find the call in what the model sampled. A plain "auto" answer
    without a call keeps its content."""
    import json

    named = client.chat.completions.create(
        model="m", messages=ASK, tools=[ADD, NOW], max_tokens=40, seed=1,
        tool_choice={"type": "function", "function": {"name": "add"}})
    c = named.choices[0]
    assert c.message.content == "" and len(c.message.tool_calls) == 1
    call = c.message.tool_calls[0]
    assert call.function.name == "add" and call.id.startswith("chatcmpl-tool-")
    if c.finish_reason == "stop":  # named: the choice's own finish reason
        assert set(json.loads(call.function.arguments)) == {"a", "b"}
    req = client.chat.completions.create(model="m", messages=ASK, tools=[ADD, NOW],
                                         max_tokens=60, seed=2, tool_choice="required")
    c = req.choices[0]
    if c.finish_reason == "tool_calls":
        assert c.message.tool_calls and {t.function.name for t in c.message.tool_calls} <= \
            {"add", "now"}
        for t in c.message.tool_calls:
            json.loads(t.function.arguments)
    else:
        assert c.finish_reason == "length" and c.message.tool_calls == []
    steer = '<tool_call>\\{"name": "add", "arguments": \\{"a": [0-9], "b": [0-9]\\}\\}</tool_call>'
    auto = client.chat.completions.create(
        model="m", messages=ASK, tools=[ADD], max_tokens=60, seed=3,
        extra_body={"structured_outputs": {"regex": steer}})
    c = auto.choices[0]
    assert c.finish_reason == "tool_calls", c
    (call,) = c.message.tool_calls
    assert call.function.name == "add" and set(json.loads(call.function.arguments)) == {"a", "b"}
    plain = client.chat.completions.create(model="m", messages=CHAT, tools=[ADD],
                                           max_tokens=12, seed=4)
    c = plain.choices[0]
    assert c.message.tool_calls in (None, []) and c.message.content
    assert c.finish_reason in ("stop", "length")


def test_chat_continues_an_assistant_turn_with_prompt_logprobs(client: Any,
                                                              http: httpx.Client) -> None:
    """vLLM's `continue_final_message` + `echo`: the prompt ends inside the final assistant
    turn (as transformers cuts it) and each answer begins with that turn's text; the
    rendered prompt (`return_prompt_text`) and its `prompt_logprobs` come back, the latter
    equal to the completions route's scoring of the same ids."""
    msgs = [*CHAT, {"role": "assistant", "content": "The first prime is"}]
    r = client.chat.completions.create(
        model="m", messages=msgs, max_tokens=6, temperature=0, extra_body={
            "continue_final_message": True, "add_generation_prompt": False, "echo": True,
            "prompt_logprobs": 1, "return_prompt_text": True, "return_token_ids": True})
    text = r.model_extra["prompt_text"]
    assert text.endswith("The first prime is")
    assert r.choices[0].message.content.startswith("The first prime is")
    ids = r.model_extra["prompt_token_ids"]
    pl = r.model_extra["prompt_logprobs"]
    assert len(pl) == len(ids) and pl[0] is None
    again = http.post("/v1/completions", json={"model": "m", "prompt": ids, "echo": True,
                                               "max_tokens": 0, "logprobs": 0})
    want = again.json()["choices"][0]["logprobs"]["token_logprobs"]
    for i in range(1, len(ids)):
        assert abs(pl[i][str(ids[i])]["logprob"] - want[i]) < 1e-4, i
    with pytest.raises(openai.BadRequestError) as e:  # vLLM's refusal of both
        client.chat.completions.create(model="m", messages=msgs, max_tokens=2,
                                       extra_body={"continue_final_message": True})
    assert e.value.param == "continue_final_message"


def test_seeded_requests_repeat_batched_differently(cluster: LocalCluster,
                                                    chat_ids: list[int]) -> None:
    """`seed` sent five times: alone, beside other requests of the same step, within n=3,
    and on both ranks: the same tokens every time."""
    url = cluster.gateway_url + "/v1/completions"
    base = {"model": "m", "max_tokens": 24, "temperature": 1.0, "return_token_ids": True}
    mine = {**base, "prompt": chat_ids, "seed": 1234}

    async def run(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=300) as h:
            rs = await asyncio.gather(*(h.post(url, json=b) for b in bodies))
        for r in rs:
            assert r.status_code == 200, r.text
        return [r.json() for r in rs]

    others = [{**base, "prompt": chat_ids[:-k], "seed": 10 + k} for k in (1, 2, 3)]  # keyed:
    # the same sampling parameters as `mine`, so they share its steps
    runs = [
        asyncio.run(run([mine]))[0]["choices"][0]["token_ids"],
        asyncio.run(run([mine, *others]))[0]["choices"][0]["token_ids"],
        asyncio.run(run([*others, mine]))[-1]["choices"][0]["token_ids"],
        asyncio.run(run([{**mine, "n": 3}]))[0]["choices"][0]["token_ids"],
        asyncio.run(run([mine, {**mine, "seed": 99}]))[0]["choices"][0]["token_ids"],
    ]
    assert runs[0] and all(r == runs[0] for r in runs), runs


def test_an_overlong_prompt_is_refused_in_vllms_words(client: Any, http: httpx.Client) -> None:
    ctx = client.models.list().data[0].max_model_len
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt=[1] * ctx, max_tokens=4)
    message = str(e.value)
    assert "maximum context length" in message and "/v1/" not in message.replace(
        "/v1/completions", "")
    r = http.post("/inference/v1/generate", json={"token_ids": [1] * ctx})
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"]
