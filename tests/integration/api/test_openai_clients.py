"""The gateway's OpenAI-compatible routes driven by the real `openai` client, end to end, on a
real 2-rank LocalCluster (synchronizer, two vLLM ranks on the embedded model, gateway,
pre-generation on).

What agentic RL frameworks (SkyRL, ART, rLLM, prime-rl) do against vLLM's OpenAI server:
`completions.create` with token-id or text prompts, `n` choices, `logprobs`, `seed`, vLLM's
`return_token_ids` in `extra_body`, streaming, stop strings; a GRPO group sent as concurrent
`AsyncOpenAI` calls, token ids and log-probs read back, a weight update between steps. The
OpenAI answers are checked against the gateway's own rollout API (`POST /v1/rollout` through
`bubblespec.client`): with keyed sampling and the same seeds, the token ids and log-probs
are the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bubblespec.client import BubbleSpecClient
from bubblespec.cluster import LocalCluster
from bubblespec.tasks.addchain import EOS_ID, MAX_STEPS
from tests.deploy.helpers import engine_model_dir

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.engine

KEYED = {"seed_mode": "keyed", "stop_token_ids": [EOS_ID], "return_token_ids": True}


@pytest.fixture(scope="module")
def cluster(api_cluster: LocalCluster) -> LocalCluster:
    return api_cluster  # shared with the other client-API modules (conftest.py)


@pytest.fixture(scope="module")
def task() -> Any:
    from bubblespec.tasks import default_task

    return default_task()


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Any]:
    with openai.OpenAI(base_url=cluster.gateway_url + "/v1", api_key="unused",
                       timeout=300, max_retries=0) as c:
        yield c


def model_of(client: Any) -> str:
    (card,) = client.models.list().data
    return str(card.id)


def check_choice(choice: Any, prompt_ids: list[int], task: Any) -> list[int]:
    """One choice consistent with itself: token ids, log-probs, text, finish reason."""
    ids = choice.token_ids
    assert ids and choice.prompt_token_ids == prompt_ids
    lp = choice.logprobs
    assert len(lp.token_logprobs) == len(ids) == len(lp.tokens) == len(lp.top_logprobs)
    assert all(x <= 0 for x in lp.token_logprobs)
    assert [task.decode([t], skip_special=False) for t in ids] == lp.tokens
    assert choice.finish_reason in ("stop", "length")
    if choice.finish_reason == "stop":
        assert ids[-1] == EOS_ID and choice.stop_reason == EOS_ID
        assert choice.text == task.decode(ids[:-1])
    else:
        assert choice.text == task.decode(ids)
    return list(ids)


def test_completions_token_ids_text_n_and_seeds(client: Any, task: Any) -> None:
    model = model_of(client)
    prompts = [list(p.input_ids) for p in task.make_prompts(2, 5)]
    r = client.completions.create(model=model, prompt=prompts, n=2, max_tokens=60,
                                  temperature=1.0, logprobs=0, seed=11, extra_body=KEYED)
    assert r.object == "text_completion" and r.model == model and len(r.choices) == 4
    assert [c.index for c in r.choices] == [0, 1, 2, 3]  # prompt-major
    outs = [check_choice(c, prompts[c.index // 2], task) for c in r.choices]
    assert r.usage.prompt_tokens == sum(map(len, prompts))
    assert r.usage.completion_tokens == sum(map(len, outs))

    # the same prompts as text, and the same seeds: the same keyed samples
    texts = [task.decode(p) for p in prompts]
    again = client.completions.create(model=model, prompt=texts, n=2, max_tokens=60,
                                      temperature=1.0, logprobs=0, seed=11, extra_body=KEYED)
    assert [c.prompt_token_ids for c in again.choices] == [p for p in prompts for _ in "ab"]
    assert [c.token_ids for c in again.choices] == outs
    assert [c.logprobs.token_logprobs for c in again.choices] == \
        [c.logprobs.token_logprobs for c in r.choices]

    # a single prompt (token ids), greedy: n choices agree
    g = client.completions.create(model=model, prompt=prompts[0], n=2, max_tokens=30,
                                  temperature=0, extra_body={"return_token_ids": True})
    assert g.choices[0].token_ids == g.choices[1].token_ids
    assert g.choices[0].logprobs is None and len(g.choices[0].token_ids) <= 30


def test_keyed_samples_equal_the_gateway_rollout_api(cluster: LocalCluster, client: Any,
                                                     task: Any) -> None:
    """Same prompts, same per-sample seeds, keyed sampling: the OpenAI route and
    POST /v1/rollout return the same token ids and log-probs."""
    prompts = [list(p.input_ids) for p in task.make_prompts(2, 21)]
    seed, n = 1234, 3
    r = client.completions.create(model="any", prompt=prompts, n=n, max_tokens=80,
                                  temperature=1.0, top_p=0.95, logprobs=0, seed=seed,
                                  extra_body=KEYED)
    with BubbleSpecClient(cluster.gateway_url, timeout_s=300) as bs:
        ref = bs.rollout(prompts, n=n, sampling_params={
            "max_new_tokens": 80, "temperature": 1.0, "top_p": 0.95, "seed_mode": "keyed",
            "stop_token_ids": [EOS_ID]}, seeds=[[seed + k for k in range(n)]] * len(prompts))
    want = [s for p in ref.prompts for s in p.samples]
    assert [c.token_ids for c in r.choices] == [s.output_ids for s in want]
    assert [c.logprobs.token_logprobs for c in r.choices] == \
        [s.output_logprobs for s in want]
    assert r.model == "any"  # the name the client gave is echoed


def test_stream_and_stop_strings(client: Any, task: Any) -> None:
    model = model_of(client)
    ids = list(task.make_prompt(4, 9, MAX_STEPS).input_ids)
    full = client.completions.create(model=model, prompt=ids, max_tokens=60, temperature=0,
                                     extra_body={"return_token_ids": True, "ignore_eos": True})
    words = full.choices[0].text.split()
    assert len(words) > 6, full.choices[0].text
    stop = words[5]
    cut = client.completions.create(model=model, prompt=ids, max_tokens=60, temperature=0,
                                    logprobs=0, stop=[stop, "never-there"],
                                    extra_body={"return_token_ids": True, "ignore_eos": True})
    c = cut.choices[0]
    at = full.choices[0].text.index(stop)
    assert c.finish_reason == "stop" and c.stop_reason == stop
    assert c.text == full.choices[0].text[:at]
    # ids up to and including the token that completed the stop string
    assert c.token_ids == full.choices[0].token_ids[:len(c.token_ids)]
    assert stop in task.decode(c.token_ids) and stop not in task.decode(c.token_ids[:-1])
    assert len(c.logprobs.token_logprobs) == len(c.token_ids)
    assert cut.usage.completion_tokens == len(c.token_ids)

    events = list(client.completions.create(
        model=model, prompt=ids, max_tokens=60, temperature=0, n=2, stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True, "ignore_eos": True}))
    texts: dict[int, str] = {}
    reasons = {}
    for e in events:
        for ch in e.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
            if ch.finish_reason:
                reasons[ch.index] = ch.finish_reason
    assert texts == {0: full.choices[0].text, 1: full.choices[0].text}
    assert reasons == {0: "length", 1: "length"}
    assert events[-1].choices == [] and events[-1].usage.completion_tokens == 120


def test_bad_input_is_a_400_naming_the_param(client: Any, task: Any) -> None:
    ids = list(task.make_prompt(1, 2, 3).input_ids)
    cases = [({"presence_penalty": 2.5}, "presence_penalty"), ({"logprobs": 21}, "logprobs"),
             ({"best_of": 4}, "best_of"), ({"suffix": "x"}, "suffix"),
             ({"max_tokens": 0}, "max_tokens"), ({"temperature": 3.0}, "temperature"),
             ({"logit_bias": {"5x": 1.0}}, "logit_bias"),
             ({"logit_bias": {"999999": 1.0}}, "logit_bias")]  # outside the vocabulary
    for kw, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="m", prompt=ids, **kw)
        assert e.value.status_code == 400 and e.value.param == param, (kw, e.value.body)
    for extra, param in [({"min_p": 1.5}, "min_p"),
                         ({"stop_token_ids": [10**6]}, "stop_token_ids[0]")]:
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="m", prompt=ids, extra_body=extra)
        assert e.value.param == param, (extra, e.value.body)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="m", prompt=[ids, [1, 10**5]])
    assert e.value.param == "prompt[1][1]"
    with pytest.raises(openai.BadRequestError) as e:  # the embedded model has no template
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "1"}])
    assert e.value.param == "messages"


def test_grpo_rollout_loop_with_a_weight_update(cluster: LocalCluster, task: Any) -> None:
    """An agentic framework's rollout: every sample of a GRPO group is its own concurrent
    `AsyncOpenAI` call (n=1, a seed per sample), token ids and log-probs read back, a reward
    per sample; the next batch's prompts handed ahead; a weight update between steps."""
    url = cluster.gateway_url
    group = 4
    batches = [[task.make_prompt(3, 7, MAX_STEPS), task.make_prompt(5, 3, 1)],
               [task.make_prompt(9, 4, 40), task.make_prompt(21, 2, 30)]]

    async def rollout(prompts: list[Any], nxt: list[Any] | None) -> list[tuple[Any, Any]]:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", timeout=300,
                                      max_retries=0) as c:
            async def one(p: Any, k: int) -> tuple[Any, Any]:
                extra: dict[str, Any] = {"stop_token_ids": [EOS_ID], "return_token_ids": True}
                if nxt:
                    extra["next_prompts"] = [list(q.input_ids) for q in nxt]
                r = await c.completions.create(model="policy", prompt=list(p.input_ids),
                                               max_tokens=600, temperature=1.0, logprobs=0,
                                               seed=100 + k, extra_body=extra)
                return p, r.choices[0]

            return list(await asyncio.gather(*(one(p, k) for p in prompts
                                               for k in range(group))))

    with httpx.Client(base_url=url, timeout=60) as http, \
            BubbleSpecClient(url, timeout_s=300) as bs:
        v0 = int(http.get("/get_weight_version").json()["weight_version"])
        info0 = http.get("/get_server_info").json()
        first = asyncio.run(rollout(batches[0], batches[1]))
        info1 = http.get("/get_server_info").json()
        assert info1["steps_run"] == info0["steps_run"] + 1  # one group, one step
        for p, ch in first:
            ids = check_choice(ch, list(p.input_ids), task)
            assert 0.0 <= task.reward(p, ids) <= 1.0
            assert ch.bubblespec["weight_version"] == v0
        assert len({ch.bubblespec["step"] for _, ch in first}) == 1
        bs.update_weights(str(engine_model_dir()), version=v0 + 1)
        assert http.get("/get_weight_version").json()["weight_version"] == str(v0 + 1)
        second = asyncio.run(rollout(batches[1], None))
        for p, ch in second:
            check_choice(ch, list(p.input_ids), task)
            assert ch.bubblespec["weight_version"] == v0 + 1
        step = http.get("/get_server_info").json()["last_step"]
        assert {ch.bubblespec["step"] for _, ch in second} == {step}
        summary = http.get(f"/v1/steps/{step}").json()["rollout"]
        print("OpenAI route, step after the weight update:", summary["counters"])
        assert summary["counters"]["drafts_fetched_tokens"] > 0, summary


def test_openai_and_sglang_requests_share_a_step(cluster: LocalCluster, task: Any) -> None:
    """Concurrent OpenAI and SGLang requests with the same sampling parameters go through
    the one step batcher: one rollout step serves both."""
    url = cluster.gateway_url
    ids = [list(p.input_ids) for p in task.make_prompts(2, 31)]
    sp = {"max_new_tokens": 30, "temperature": 1.0, "stop_token_ids": [EOS_ID],
          "seed_mode": "keyed"}

    async def both() -> tuple[Any, Any]:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", timeout=300,
                                      max_retries=0) as c, \
                httpx.AsyncClient(base_url=url, timeout=300) as http:
            sgl = http.post("/generate", json={"input_ids": ids[0], "return_logprob": True,
                                               "sampling_params": {**sp, "n": 2,
                                                                   "sampling_seed": 5}})
            oai = c.completions.create(model="m", prompt=ids[1], n=2, max_tokens=30,
                                       temperature=1.0, seed=5, extra_body={
                                           "stop_token_ids": [EOS_ID], "seed_mode": "keyed",
                                           "return_token_ids": True})
            return await asyncio.gather(sgl, oai)

    with httpx.Client(base_url=url, timeout=60) as http:
        before = http.get("/get_server_info").json()["steps_run"]
        sgl, oai = asyncio.run(both())
        info = http.get("/get_server_info").json()
    assert sgl.status_code == 200, sgl.text
    assert info["steps_run"] == before + 1
    assert {o["meta_info"]["bubblespec"]["step"] for o in sgl.json()} == {info["last_step"]}
    assert {c.bubblespec["step"] for c in oai.choices} == {info["last_step"]}
    assert len(oai.choices) == 2 and all(c.token_ids for c in oai.choices)
