"""Fault drills on a real cluster: out-of-vocabulary drafts and out-of-range integers, each
followed by a normal rollout that must succeed (also after the gateway restarts)."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import httpx
import pytest

from bubblespec.client import BubbleSpecClient
from bubblespec.cluster import LocalCluster
from bubblespec.gateway.seeds import assign_keys
from bubblespec.protocol.domain import PregenDraft
from bubblespec.synchronizer.client import SyncClient
from bubblespec.synchronizer.errors import SyncError

from .conftest import AUTH, TOKEN

pytestmark = [pytest.mark.engine, pytest.mark.slow]  # CI time (docs/results.md, run 17): make test-slow

SMALL = {"max_new_tokens": 8, "temperature": 1.0}


def model_vocab(cluster: LocalCluster) -> int:
    return int(json.loads((Path(str(cluster.model)) / "config.json").read_text())["vocab_size"])


def normal_rollout(client: BubbleSpecClient, task: Any, seed: int, n: int = 1) -> Any:
    prompts = task.make_prompts(4, seed)
    res = client.rollout(prompts, n=n, sampling_params=SMALL)
    assert [len(p.samples) for p in res.prompts] == [n] * 4
    assert all(s.output_ids for p in res.prompts for s in p.samples)
    return res


async def _push(cluster: LocalCluster, step: int, drafts: list[PregenDraft]) -> Any:
    async with SyncClient(cluster.sync_address, token=TOKEN, timeout_s=10) as sync:
        return await sync.push_drafts(step, "r0", drafts)


def test_out_of_vocab_drafts_are_refused_and_fetching_ranks_keep_serving(
        cluster: LocalCluster, client: BubbleSpecClient, task: Any) -> None:
    vocab = model_vocab(cluster)
    first = normal_rollout(client, task, 801)
    step = first.step + 1
    prompts = task.make_prompts(4, 802)
    keys = assign_keys([list(p.input_ids) for p in prompts])
    with pytest.raises(SyncError) as e:  # every rank would fetch it: refused on push
        asyncio.run(_push(cluster, step, [PregenDraft(keys[0], 0, [1, 2, vocab + 7])]))
    assert e.value.field == "drafts[0].token_ids[2]"
    # the hostile drafts that fit the vocabulary (its edges, noise) are stored and fetched
    rng = random.Random(5)
    drafts = [PregenDraft(k, s, [0, vocab - 1] + [rng.randrange(vocab) for _ in range(30)])
              for k in keys for s in range(2)]
    assert asyncio.run(_push(cluster, step, drafts)).stored == len(drafts)
    res = client.rollout(prompts, n=2, sampling_params=SMALL, step=step)
    assert all(len(p.samples) == 2 for p in res.prompts)
    fetched = {r.rank_id: r.drafts_fetched_tokens for r in res.ranks}
    assert set(fetched) == {"r0", "r1"} and all(fetched.values()), fetched
    normal_rollout(client, task, 803, n=2)


HUGE = [
    ("/v1/rollout", {"step": 2**63 - 1}, "step"),
    ("/v1/rollout", {"step": 10**30}, "step"),
    ("/v1/rollout", {"sampling_params": {"top_k": 2**31}}, "sampling_params.top_k"),
    ("/v1/rollout", {"sampling_params": {"top_k": 10**30}}, "sampling_params.top_k"),
    ("/v1/rollout", {"sampling_params": {"temperature": 1e308}},
     "sampling_params.temperature"),
    ("/v1/rollout", {"sampling_params": {"max_new_tokens": 10**30}},
     "sampling_params.max_new_tokens"),
    ("/v1/rollout", {"n": 2**63}, "n"),
    ("/v1/rollout", {"seeds": [[2**64]]}, "seeds[0][0]"),
    ("/v1/rollout", {"prompts": [{"input_ids": [2**31]}]}, "prompts[0].input_ids[0]"),
    ("/v1/rollout", {"sampling_params": {"stop_token_ids": [10**30]}},
     "sampling_params.stop_token_ids[0]"),
    ("/v1/steps/", str(2**63 - 1), "step"),
    ("rank /v1/step_shard", {"prompt_key": "k" * 5000}, "requests[0].prompt_key"),
    ("rank /v1/step_shard", {"sample_offset": 2**31}, "requests[0].sample_offset"),
    ("rank /generate", {"n": 10**30}, "n"),
]


def _send(cluster: LocalCluster, task: Any, route: str, change: Any) -> httpx.Response:
    ids = list(task.make_prompts(1, 810)[0].input_ids)
    with httpx.Client(timeout=120, headers=AUTH) as http:
        if route == "/v1/steps/":
            return http.get(f"{cluster.gateway_url}/v1/steps/{change}")
        if route == "/v1/rollout":
            body = {"prompts": [{"input_ids": ids}], "sampling_params": SMALL, **change}
            return http.post(f"{cluster.gateway_url}{route}", json=body)
        rank = cluster.rank_urls["r0"]
        if route == "rank /generate":
            return http.post(f"{rank}/generate", json={"input_ids": ids, **change})
        request = {"index": 0, "input_ids": ids, "sampling_params": SMALL, **change}
        return http.post(f"{rank}/v1/step_shard",
                         json={"step": 10**6, "requests": [request], "rerun": True})


def test_out_of_range_integers_are_4xx_and_the_next_rollout_works(
        cluster: LocalCluster, client: BubbleSpecClient, task: Any) -> None:
    failures = []
    for route, change, field in HUGE:
        r = _send(cluster, task, route, change)
        body = r.json()
        if not (400 <= r.status_code < 500 and body.get("field") == field):
            failures.append(f"{route} {change!s:.60}: {r.status_code} {r.text[:200]}")
    assert not failures, "\n".join(failures)
    before = normal_rollout(client, task, 811)
    cluster.kill("gateway")
    cluster.restart("gateway")
    after = normal_rollout(client, task, 812)
    assert after.step > before.step
