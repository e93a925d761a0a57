"""Poison requests on a real 2-rank LocalCluster (supervised, as `bubblespec up` runs it):
the ranks' engines are started with a fault injected on purpose (`fault_poison_token`: the
engine core dies when it schedules a prompt holding that token, as on an engine bug).

- One poison rollout kills at most two engines: the first death re-runs the shard, the
  second ends the step with a 500 naming the request and its sampling parameters. The same
  request is then refused with a 422 (own API) / 400 (SGLang API) naming the prompt, before
  any rank sees it. The ranks restart their engines and serve normal rollouts on every rank.
- The drill (`slow`, `make test-drills`): 20 poison requests in a row (4 distinct prompts,
  5 times each, as a client that retries would send them), each answered with the 500, a
  refusal, or a 503 while no rank is ready, never a hang; the ranks spend their restart
  budget and the supervisor restarts them; afterwards normal rollouts succeed on every rank.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bubblespec.cluster import LocalCluster
from tests.cluster.helpers import local_cluster

pytestmark = pytest.mark.engine

POISON = 200
"""A token id of the embedded model's vocabulary that its task never uses."""
SP = {"temperature": 1.0, "top_k": 20, "max_new_tokens": 16}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from local_cluster(tmp_path_factory, rank_args=[
        "--fault-poison-token", str(POISON), "--engine-check-s", "0.5"])


def poison_prompt(k: int) -> list[int]:
    return [1, 9, 10 + k, 4, POISON, 5, 11, 6]


def wait_ready(c: LocalCluster, every: bool = True, timeout_s: float = 300) -> None:
    """Until the gateway sees every rank (or one, with `every` False) ready."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ranks = httpx.get(c.gateway_url + "/v1/ranks", timeout=5).json()["ranks"]
        except (httpx.HTTPError, ValueError, KeyError):
            ranks = []
        ready = {r["rank_id"] for r in ranks if r.get("ready")}
        if (ready >= set(c.rank_ids)) if every else ready:
            return
        time.sleep(0.5)
    raise AssertionError(f"ranks not ready after {timeout_s:g} s")


def rollout(c: LocalCluster, prompts: list[list[int]], n: int = 2, **kw: Any) -> httpx.Response:
    body = {"prompts": [{"input_ids": p} for p in prompts], "n": n, "sampling_params": SP, **kw}
    return httpx.post(c.gateway_url + "/v1/rollout", json=body, timeout=600)


def gateway_counter(c: LocalCluster, name: str) -> float:
    text = httpx.get(c.gateway_url + "/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(rf"^{name}(?:_total)?(?:{{[^}}]*}})? (\S+)$",
                                            text, re.MULTILINE))


def serves_every_rank(c: LocalCluster, task: Any, times: int = 2) -> None:
    for i in range(times):
        prompts = [list(p.input_ids) for p in task.make_prompts(4, seed=500 + i)]
        r = rollout(c, prompts)
        assert r.status_code == 200, r.text
        served = {rk["rank_id"] for rk in r.json()["ranks"] if rk["num_samples"] > 0}
        assert served == set(c.rank_ids), r.json()["ranks"]


@pytest.fixture(scope="module")
def task() -> Any:
    from bubblespec.tasks import default_task

    return default_task()


def test_a_poison_request_kills_two_engines_then_is_refused(cluster, task) -> None:
    wait_ready(cluster)
    r = rollout(cluster, [list(p.input_ids) for p in task.make_prompts(1, seed=1)]
                + [poison_prompt(0)])
    assert r.status_code == 500, r.text
    body = r.json()
    assert body["field"] == "prompts[1]", body
    assert "quarantined" in body["detail"] and "top_k=20" in body["detail"], body
    assert gateway_counter(cluster, "bubblespec_gateway_engine_deaths") == 2
    # the same request again: refused before any rank sees it, own API and SGLang API
    again = rollout(cluster, [poison_prompt(0)])
    assert again.status_code == 422 and again.json()["field"] == "prompts[0]", again.text
    sgl = httpx.post(cluster.gateway_url + "/generate", timeout=60, json={
        "input_ids": poison_prompt(0), "sampling_params": {**SP, "n": 2}})
    assert sgl.status_code == 400 and sgl.json()["field"] == "input_ids", sgl.text
    assert gateway_counter(cluster, "bubblespec_gateway_engine_deaths") == 2
    wait_ready(cluster)
    serves_every_rank(cluster, task)


@pytest.mark.slow
def test_drill_twenty_poison_requests_in_a_row(cluster, task) -> None:
    wait_ready(cluster)
    deaths0 = gateway_counter(cluster, "bubblespec_gateway_engine_deaths")
    answers: list[int] = []
    t0 = time.monotonic()
    for i in range(20):
        k = 1 + i % 4
        wait_ready(cluster, every=False)
        t = time.monotonic()
        r = rollout(cluster, [poison_prompt(k)])
        assert time.monotonic() - t < 300
        answers.append(r.status_code)
        body = r.json()
        if r.status_code == 500:
            assert body["field"] == "prompts[0]" and "quarantined" in body["detail"], body
        elif r.status_code == 422:
            assert body["field"] == "prompts[0]", body
        else:
            assert r.status_code == 503, body  # every rank was down at that moment
    deaths = gateway_counter(cluster, "bubblespec_gateway_engine_deaths") - deaths0
    print(f"\npoison drill: answers {answers}, {deaths:g} engine deaths, "
          f"{time.monotonic() - t0:.0f} s")
    assert deaths <= 2 * 4, "a poison request killed more than two engines"
    assert answers.count(422) >= 20 - 4 * 3
    wait_ready(cluster)
    serves_every_rank(cluster, task, times=3)
    print(f"poison drill: every rank serving {time.monotonic() - t0:.0f} s after the first")
