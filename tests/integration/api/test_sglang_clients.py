"""A slime-style rollout through the gateway's SGLang-compatible routes, end to end, on a real
2-rank LocalCluster (synchronizer, two vLLM ranks on the embedded model, gateway).

The calls are those of slime's `slime/rollout/sglang_rollout.py`: one `POST /generate` per
sample with `input_ids`, `return_logprob: True` and slime's `sampling_params`, reading
`meta_info.output_token_logprobs` ([logprob, token id, ...]), `meta_info.finish_reason.type`
and `text`; a reward per sample; `POST /update_weights_from_disk` between rollouts; the
drain of `slime/backends/sglang_utils/server_control.py` (`GET /workers`, then
`POST /abort_request {"abort_all": true}` and `GET /v1/loads` until idle). The next
rollout's prompts are passed ahead with `POST /v1/next_prompts` (what a custom rollout
function adds; with `pregen_window: training`, as slime trains between rollouts), and that
rollout fetches pre-generated drafts (> 0 tokens).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from bubblespec.cluster import LocalCluster
from bubblespec.tasks.addchain import EOS_ID, MAX_STEPS
from tests.deploy.helpers import engine_model_dir
from tests.integration.drafts import complete_draft

pytestmark = pytest.mark.engine

#: slime's GenerateState.sampling_params, with the task's response budget and stop token.
SLIME_SP = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 600,
            "stop": None, "stop_token_ids": [EOS_ID], "skip_special_tokens": True,
            "no_stop_trim": True, "spaces_between_special_tokens": False}
N = 2


@pytest.fixture(scope="module")
def cluster(api_cluster: LocalCluster) -> LocalCluster:
    return api_cluster  # shared with the other client-API modules (conftest.py)


@pytest.fixture(scope="module")
def task() -> Any:
    from bubblespec.tasks import default_task

    return default_task()


async def rollout(url: str, prompts: list[list[int]], n: int = N) -> list[dict[str, Any]]:
    """slime's generate_and_rm_group for every prompt: one /generate per sample, at once."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        async def one(ids: list[int]) -> dict[str, Any]:
            r = await http.post("/generate", json={"input_ids": ids, "return_logprob": True,
                                                   "sampling_params": dict(SLIME_SP)})
            assert r.status_code == 200, r.text
            return r.json()

        return list(await asyncio.gather(*(one(p) for p in prompts for _ in range(n))))


def check_answer(out: dict[str, Any], prompt: Any, task: Any) -> None:
    """One answer in SGLang's shape, consistent with itself, and rewarded."""
    meta = out["meta_info"]
    tokens = [t for _, t, _ in meta["output_token_logprobs"]]
    assert tokens == out["output_ids"] and tokens
    assert all(lp <= 0 for lp, _, _ in meta["output_token_logprobs"])
    assert meta["prompt_tokens"] == len(prompt.input_ids) and meta["completion_tokens"] == len(tokens)
    assert meta["finish_reason"]["type"] in ("stop", "length")
    if meta["finish_reason"]["type"] == "stop":
        assert meta["finish_reason"]["matched"] == EOS_ID == tokens[-1]
    assert out["text"] == task.decode(tokens)
    assert 0.0 <= task.reward(prompt, tokens) <= 1.0


def test_slime_style_rollouts_with_weight_push_and_pregen(cluster: LocalCluster,
                                                          task: Any) -> None:
    url = cluster.gateway_url
    with httpx.Client(base_url=url, timeout=60) as http:
        assert http.get("/health_generate").status_code == 200
        assert http.get("/get_model_info").json()["is_generation"] is True
        v0 = int(http.get("/get_weight_version").json()["weight_version"])
        # one long and one short prompt: the short one's rank has a bubble to pre-generate in
        now = [task.make_prompt(3, 7, MAX_STEPS), task.make_prompt(5, 3, 1)]
        nxt = [task.make_prompt(9, 4, 40), task.make_prompt(21, 2, 30)]
        # slime trains between rollouts: pre-generation goes on through that window until
        # the weight push, so the drafts do not hang on how long this step's bubble is
        # (unseeded samples at temperature 1: the long prompt may end early by chance)
        r = http.post("/v1/next_prompts", json={"input_ids": [list(p.input_ids) for p in nxt],
                                                "pregen_window": "training"})
        assert r.json() == {"success": True, "next_prompts": 2, "next_batches": [2],
                            "pregen_window": "training"}

        first = asyncio.run(rollout(url, [list(p.input_ids) for p in now]))
        for out, p in zip(first, [q for q in now for _ in range(N)]):
            check_answer(out, p, task)
            assert out["meta_info"]["weight_version"] == str(v0)
        steps = {o["meta_info"]["bubblespec"]["step"] for o in first}
        assert len(steps) == 1, steps  # the concurrent requests ran as one step
        (step,) = steps
        deadline = time.monotonic() + 120  # the trainer's turn: the drafts are written
        while not complete_draft(cluster, step + 1, nxt[0].input_ids):
            assert time.monotonic() < deadline, "the next step's draft was never pre-generated"
            time.sleep(0.25)

        model = engine_model_dir()
        r = http.post("/update_weights_from_disk",
                      json={"model_path": str(model), "weight_version": str(v0 + 1)})
        assert r.status_code == 200 and r.json()["success"] is True, r.text
        assert http.get("/get_weight_version").json()["weight_version"] == str(v0 + 1)

        second = asyncio.run(rollout(url, [list(p.input_ids) for p in nxt]))
        for out, p in zip(second, [q for q in nxt for _ in range(N)]):
            check_answer(out, p, task)
            assert out["meta_info"]["weight_version"] == str(v0 + 1)
            assert out["meta_info"]["bubblespec"]["step"] == step + 1
        summary = http.get(f"/v1/steps/{step + 1}").json()["rollout"]
        print("SGLang route, step after the weight push:", summary["counters"])
        assert summary["counters"]["drafts_fetched_tokens"] > 0, summary
        # the window is kept until set again: back to the gateway's for the other modules
        r = http.post("/v1/next_prompts", json={"pregen_window": "bubble"})
        assert r.json() == {"success": True, "next_prompts": 0, "next_batches": [],
                            "pregen_window": "bubble"}


def test_batched_n_greedy_abort_and_drain(cluster: LocalCluster, task: Any) -> None:
    url = cluster.gateway_url
    ids = [list(p.input_ids) for p in task.make_prompts(2, 11)]
    with httpx.Client(base_url=url, timeout=300) as http:
        r = http.post("/generate", json={"input_ids": ids, "return_logprob": True,
                                         "sampling_params": {"temperature": 0, "n": 2,
                                                             "max_new_tokens": 40}})
        outs = r.json()
        assert r.status_code == 200 and len(outs) == 4
        assert outs[0]["output_ids"] == outs[1]["output_ids"]  # greedy: n samples agree
        assert outs[2]["output_ids"] == outs[3]["output_ids"]

        assert http.post("/pause_generation", json={"mode": "in_place"}).status_code == 200

        async def held() -> dict[str, Any]:
            async with httpx.AsyncClient(base_url=url, timeout=60) as a:
                return (await a.post("/generate", json={"input_ids": ids[0], "rid": "held",
                                                        "return_logprob": True})).json()

        async def abort_later() -> dict[str, Any]:
            await asyncio.sleep(0.5)
            async with httpx.AsyncClient(base_url=url, timeout=60) as a:
                loads = (await a.get("/v1/loads")).json()
                assert loads["loads"][0]["num_waiting_reqs"] == 1
                (w,) = (await a.get("/workers")).json()["workers"]
                return (await a.post(w["url"] + "/abort_request", json={"abort_all": True})
                        ).json()

        async def both() -> tuple[dict[str, Any], dict[str, Any]]:
            return await asyncio.gather(held(), abort_later())

        out, aborted = asyncio.run(both())
        assert aborted["aborted_queued"] == 1
        fr = out["meta_info"]["finish_reason"]
        assert fr == {"type": "abort", "message": "Abort before prefill"}
        assert out["output_ids"] == [] and out["meta_info"]["id"] == "held"
        assert http.post("/continue_generation").status_code == 200
        deadline = time.monotonic() + 30
        while any(http.get("/v1/loads").json()["loads"][0][k]
                  for k in ("num_running_reqs", "num_waiting_reqs")):
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_pause_aborts_the_running_step_and_areal_resumes(cluster: LocalCluster,
                                                         task: Any) -> None:
    """AReaL's `RemoteSGLangEngine.agenerate` loop around a weight update: pause_generation
    (mode abort) ends the running requests with finish reason abort and the tokens they
    have; after continue_generation the client re-sends prompt + partial output with the
    remaining budget, and the two parts make one full response.

    A sample whose rank finished before the abort reached it answers with its whole budget
    and finish reason length (a true race on a fast model, not an error); such a sample must
    be complete. The pause is retried on a fresh prompt, at most 3 times, until one lands
    on a running sample."""
    url = cluster.gateway_url
    budget = 600
    sp = {"max_new_tokens": budget, "temperature": 1.0, "ignore_eos": True, "n": 4}

    async def run(ids: list[int]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        async with httpx.AsyncClient(base_url=url, timeout=300) as a:
            long = asyncio.ensure_future(a.post("/generate", json={
                "input_ids": ids, "return_logprob": True, "sampling_params": sp}))
            deadline = time.monotonic() + 60
            while not (await a.get("/v1/loads")).json()["loads"][0]["num_running_reqs"]:
                assert time.monotonic() < deadline and not long.done()
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)
            paused = (await a.post("/pause_generation", json={})).json()
            return (await long).json(), paused

    aborted = 0
    for attempt in range(3):
        ids = list(task.make_prompt(3 + attempt, 7, MAX_STEPS).input_ids)
        outs, paused = asyncio.run(run(ids))
        assert paused["aborted_running"] == 4, paused
        with httpx.Client(base_url=url, timeout=300) as http:
            assert http.post("/continue_generation").status_code == 200
            for out in outs:
                meta = out["meta_info"]
                partial = out["output_ids"]
                assert [t for _, t, _ in meta["output_token_logprobs"]] == partial
                if meta["finish_reason"]["type"] == "length":  # finished before the abort
                    assert len(partial) == budget, meta["finish_reason"]
                    continue
                assert meta["finish_reason"]["type"] == "abort", meta["finish_reason"]
                aborted += 1
                assert 0 < len(partial) < budget
                rest = http.post("/generate", json={
                    "input_ids": ids + partial, "return_logprob": True,
                    "sampling_params": {**sp, "n": 1, "max_new_tokens": budget - len(partial)}})
                assert rest.status_code == 200, rest.text
                tail = rest.json()
                assert tail["meta_info"]["finish_reason"] == {"type": "length",
                                                              "length": budget - len(partial)}
                assert len(partial) + len(tail["output_ids"]) == budget
        if aborted:
            break
    assert aborted, "no pause in 3 attempts reached a running sample"


def test_areal_remote_engine_through_a_pause(cluster: LocalCluster, task: Any) -> None:
    """AReaL's own client (`areal.engine.sglang_remote.RemoteSGLangEngine`, areal 1.0.4):
    `agenerate` against the gateway, interrupted by the pause AReaL sends before a weight
    update; its loop re-sends prompt + partial output and ends with one full response.
    Skipped unless areal imports (see tests/README.md for the install line)."""
    sglang_remote = pytest.importorskip("areal.engine.sglang_remote")
    from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig
    from areal.api.io_struct import ModelRequest

    url = cluster.gateway_url
    engine = sglang_remote.RemoteSGLangEngine(InferenceEngineConfig(
        backend="sglang:d1", setup_timeout=60, request_timeout=300, request_retries=1))
    engine.initialize(addr=url.removeprefix("http://"))
    ids = list(task.make_prompt(3, 7, MAX_STEPS).input_ids)
    budget = 600
    samples = 8  # one GRPO group, sent as AReaL sends it: one agenerate per sample

    async def run() -> Any:
        gens = asyncio.gather(*(engine.agenerate(ModelRequest(
            input_ids=ids, gconfig=GenerationHyperparameters(
                max_new_tokens=budget, ignore_eos=True, stop_token_ids=[])))
            for _ in range(samples)))
        async with httpx.AsyncClient(base_url=url, timeout=60) as a:
            deadline = time.monotonic() + 60
            while not (await a.get("/v1/loads")).json()["loads"][0]["num_running_reqs"]:
                assert time.monotonic() < deadline and not gens.done()
                await asyncio.sleep(0.02)
            paused = (await a.post("/pause_generation", json={})).json()
            await asyncio.sleep(0.3)
            await a.post("/continue_generation", json={})
        return await gens, paused

    try:
        resps, paused = asyncio.run(run())
    finally:
        engine.destroy()
    assert paused["aborted_running"] == samples, paused
    for resp in resps:
        assert resp.stop_reason == "length" and len(resp.output_tokens) == budget
        assert len(resp.output_logprobs) == budget
        assert all(lp <= 0 for lp in resp.output_logprobs)
