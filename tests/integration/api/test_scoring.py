"""Prompt scoring end to end on a real 2-rank LocalCluster (synchronizer, two speculative vLLM
ranks on the embedded model, gateway): SGLang's `/generate` with `max_new_tokens: 0`, and
OpenAI's `/v1/completions` with `echo` + `max_tokens: 0` through the real `openai` client.

The SGLang calls are exactly slime's on-policy distillation teacher request
(`slime/rollout/on_policy_distillation.py`: `input_ids` = prompt + response, sampling_params
{temperature 0, max_new_tokens 0, skip_special_tokens false}, `return_logprob: true`,
`logprob_start_len: 0`), read as slime reads it (`meta_info.input_token_logprobs[1:]`, each
item's [0]). Every returned log-prob is checked against an independent scoring pass: a
float32 transformers forward of the same model on the same ids. Scoring runs no rollout
step (`steps_run` and `last_step` do not move), also while a rollout runs beside it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest

from bubblespec.cluster import LocalCluster
from bubblespec.tasks.addchain import EOS_ID
from tests.deploy.helpers import engine_model_dir

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.engine

TOL = 2e-3
"""Largest difference to the float32 transformers pass (as tests/engine/test_scoring.py)."""


def teacher_payload(ids: list[int]) -> dict[str, Any]:
    """slime's `_build_payload` of an on-policy distillation teacher call."""
    return {"input_ids": ids,
            "sampling_params": {"temperature": 0, "max_new_tokens": 0,
                                "skip_special_tokens": False},
            "return_logprob": True, "logprob_start_len": 0}


@pytest.fixture(scope="module")
def cluster(api_cluster: LocalCluster) -> LocalCluster:
    return api_cluster  # shared with the other client-API modules (conftest.py)


@pytest.fixture(scope="module")
def task() -> Any:
    from bubblespec.tasks import default_task

    return default_task()


@pytest.fixture(scope="module")
def reference() -> Callable[[list[int]], list[float]]:
    """log p(ids[i] | ids[:i]) for i >= 1, by a float32 transformers forward."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(engine_model_dir(),
                                             dtype=torch.float32).eval()

    def score(ids: list[int]) -> list[float]:
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        return [float(logp[i - 1, t]) for i, t in enumerate(ids) if i > 0]

    return score


@pytest.fixture(scope="module")
def sequences(cluster: LocalCluster, task: Any) -> list[list[int]]:
    """Prompt + sampled response of a few prompts (what a teacher scores)."""
    prompts = [list(p.input_ids) for p in task.make_prompts(3, 41)]
    with httpx.Client(base_url=cluster.gateway_url, timeout=300) as http:
        r = http.post("/generate", json={"input_ids": prompts, "sampling_params": {
            "max_new_tokens": 48, "stop_token_ids": [EOS_ID], "sampling_seed": 5}})
        assert r.status_code == 200, r.text
        return [p + o["output_ids"] for p, o in zip(prompts, r.json())]


def worst_diff(ids: list[int], lps: list[float | None], reference: Any) -> float:
    assert len(lps) == len(ids) and lps[0] is None and None not in lps[1:]
    return float(np.max(np.abs(np.array(reference(ids)) - np.array(lps[1:]))))


def test_slime_teacher_requests_match_an_independent_scoring_pass(
        cluster: LocalCluster, sequences: list[list[int]], reference: Any, task: Any) -> None:
    url = cluster.gateway_url
    with httpx.Client(base_url=url, timeout=300) as http:
        before = http.get("/get_server_info").json()

        async def teacher_calls() -> list[httpx.Response]:  # slime: one call per sample
            async with httpx.AsyncClient(base_url=url, timeout=300) as a:
                return list(await asyncio.gather(*(a.post("/generate", json=teacher_payload(s))
                                                   for s in sequences)))

        worst = 0.0
        for ids, r in zip(sequences, asyncio.run(teacher_calls())):
            assert r.status_code == 200, r.text
            out = r.json()
            meta = out["meta_info"]
            assert out["output_ids"] == [] and out["text"] == ""
            assert meta["finish_reason"] == {"type": "length", "length": 0}
            assert meta["prompt_tokens"] == len(ids) and meta["completion_tokens"] == 0
            assert meta["output_token_logprobs"] == []
            items = meta["input_token_logprobs"]
            assert [t for _, t, _ in items] == ids and all(x is None for _, _, x in items)
            # slime's post_process_rewards: item[0] of every entry but the first
            teacher = [item[0] for item in items[1:]]
            assert all(isinstance(x, float) and x <= 0 for x in teacher)
            worst = max(worst, worst_diff(ids, [lp for lp, _, _ in items], reference))
        assert worst < TOL, f"teacher log-probs differ from transformers' by up to {worst}"

        # a batch, from a later position, with token texts; bit-identical to the singles
        single = [r.json()["meta_info"]["input_token_logprobs"]
                  for r in asyncio.run(teacher_calls())]
        r = http.post("/generate", json={**teacher_payload(sequences), "logprob_start_len": 3,
                                         "return_text_in_logprobs": True})
        assert r.status_code == 200, r.text
        for ids, one, out in zip(sequences, single, r.json()):
            items = out["meta_info"]["input_token_logprobs"]
            assert [t for _, t, _ in items] == ids[3:]
            assert [lp for lp, _, _ in items] == [lp for lp, _, _ in one[3:]]
            assert [x for _, _, x in items] == [task.decode([t], skip_special=False)
                                                for t in ids[3:]]

        # no log-probs asked: the prompt is echoed, no rank is called
        r = http.post("/generate", json={"input_ids": sequences[0],
                                         "sampling_params": {"max_new_tokens": 0}})
        assert r.status_code == 200 and r.json()["output_ids"] == []
        assert "input_token_logprobs" not in r.json()["meta_info"]
        after = http.get("/get_server_info").json()
        assert (after["steps_run"], after["last_step"]) == (before["steps_run"],
                                                            before["last_step"])


def test_scoring_beside_a_running_rollout_is_no_step(cluster: LocalCluster,
                                                     sequences: list[list[int]],
                                                     reference: Any, task: Any) -> None:
    """A rollout step and teacher calls at the same time: the step's samples come back as
    usual, the scores are exact, and only the rollout counts as a step."""
    url = cluster.gateway_url
    prompts = [list(p.input_ids) for p in task.make_prompts(4, 43)]

    async def both() -> tuple[list[httpx.Response], list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=url, timeout=300) as a:
            gen = [a.post("/generate", json={"input_ids": p, "sampling_params": {
                "max_new_tokens": 64, "stop_token_ids": [EOS_ID]}}) for p in prompts]
            score = [a.post("/generate", json=teacher_payload(s)) for s in sequences]
            res = await asyncio.gather(*gen, *score)
            return list(res[:len(gen)]), list(res[len(gen):])

    with httpx.Client(base_url=url, timeout=60) as http:
        before = http.get("/get_server_info").json()["steps_run"]
        gen, scored = asyncio.run(both())
        after = http.get("/get_server_info").json()["steps_run"]
    assert all(r.status_code == 200 and r.json()["output_ids"] for r in gen)
    assert 1 <= after - before <= len(prompts)  # the rollout's steps, none for scoring
    for ids, r in zip(sequences, scored):
        assert r.status_code == 200, r.text
        lps = [lp for lp, _, _ in r.json()["meta_info"]["input_token_logprobs"]]
        assert worst_diff(ids, lps, reference) < TOL


def test_bad_scoring_input_is_a_400_naming_the_field(cluster: LocalCluster,
                                                      sequences: list[list[int]]) -> None:
    ids = sequences[0]
    cases = [({**teacher_payload(ids), "logprob_start_len": len(ids)}, "logprob_start_len"),
             ({**teacher_payload(ids), "logprob_start_len": -2}, "logprob_start_len"),
             ({**teacher_payload([ids, ids[:2]]), "logprob_start_len": 2},
              "logprob_start_len"),
             (teacher_payload([1, 10**5]), "input_ids[1]"),
             (teacher_payload([ids, [1, 3, 10**5]]), "input_ids[1][2]"),
             (teacher_payload([1] * 1024), "input_ids")]
    with httpx.Client(base_url=cluster.gateway_url, timeout=60) as http:
        for body, field in cases:
            r = http.post("/generate", json=body)
            assert r.status_code == 400 and r.json()["field"] == field, (field, r.text)


def test_openai_echo_scores_the_prompt(cluster: LocalCluster, sequences: list[list[int]],
                                       reference: Any, task: Any) -> None:
    with openai.OpenAI(base_url=cluster.gateway_url + "/v1", api_key="unused", timeout=300,
                       max_retries=0) as client:
        got = client.completions.create(model="m", prompt=sequences, echo=True, max_tokens=0,
                                        logprobs=0, extra_body={"return_token_ids": True})
        assert len(got.choices) == len(sequences)
        assert got.usage.completion_tokens == 0
        assert got.usage.prompt_tokens == sum(map(len, sequences))
        for ids, ch in zip(sequences, got.choices):
            lp = ch.logprobs
            assert ch.finish_reason == "length" and ch.prompt_token_ids == ids
            assert ch.text == ""  # echo with return_token_ids: vLLM leaves the prompt's text out
            assert lp.tokens == [task.decode([t], skip_special=False) for t in ids]
            assert lp.text_offset == list(np.cumsum([0] + [len(t) for t in lp.tokens[:-1]]))
            assert lp.top_logprobs[0] is None
            assert [d[t] for d, t in zip(lp.top_logprobs[1:], lp.tokens[1:])] == \
                lp.token_logprobs[1:]
            assert worst_diff(ids, lp.token_logprobs, reference) < TOL

        text = task.decode(sequences[1])
        got = client.completions.create(model="m", prompt=text, echo=True, max_tokens=0,
                                        logprobs=0)
        assert got.choices[0].text == text
        ids = task.encode(text, add_bos=True)
        assert worst_diff(ids, got.choices[0].logprobs.token_logprobs, reference) < TOL

        got = client.completions.create(model="m", prompt=sequences[0], echo=True,
                                        max_tokens=0)  # no logprobs: the prompt echoed
        assert got.choices[0].logprobs is None and got.choices[0].text == task.decode(
            sequences[0])
        for kw, param in [({"echo": True, "max_tokens": 4,
                            "extra_body": {"prompt_logprobs": 21}}, "prompt_logprobs"),
                          ({"max_tokens": 0}, "max_tokens"),
                          ({"echo": True, "max_tokens": 0, "logprobs": 0,
                            "prompt": [[1, 5], [1, 10**5]]}, "prompt[1][1]")]:
            with pytest.raises(openai.BadRequestError) as e:
                client.completions.create(**{"model": "m", "prompt": sequences[0], **kw})
            assert e.value.status_code == 400 and e.value.param == param, (kw, e.value.body)
