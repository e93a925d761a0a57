"""The valid request space through the gateway's APIs on a real 2-rank LocalCluster: drawn
legal requests (`tests/valid_space.py`) through the gateway's own `POST /v1/rollout` and its
SGLang-compatible `POST /generate`. Each drawn rollout runs as two steps: the first hands the
second's prompts ahead (pre-generated drafts in the bubble), the second adds prompts that
were not handed ahead (no drafts but siblings). SGLang requests are sent concurrently, single
and batched, so the batcher puts several into one step. Every request answers 200 well
formed; afterwards every rank is ready and no engine was restarted.

`make test` draws a fixed slice (derandomized); `make test-valid-space` draws
`BUBBLESPEC_VALID_EXAMPLES` examples afresh and prints how many requests it ran.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bubblespec.cluster import LocalCluster
from tests.cluster.helpers import local_cluster
from tests.valid_space import examples, prompts, sampling

pytestmark = pytest.mark.engine

LONG = bool(os.environ.get("BUBBLESPEC_VALID_EXAMPLES"))
SETTINGS = settings(max_examples=examples(8), deadline=None, derandomize=not LONG,
                    database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow, HealthCheck.data_too_large])
TALLY = {"rollouts": 0, "generate": 0, "samples": 0, "seconds": 0.0}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from local_cluster(tmp_path_factory)
    print(f"\nvalid space (gateway): {TALLY['rollouts']} rollout requests, "
          f"{TALLY['generate']} SGLang requests, {TALLY['samples']} samples, "
          f"{TALLY['seconds']:.0f} s")


@pytest.fixture(scope="module")
def task() -> Any:
    from bubblespec.tasks import default_task

    return default_task()


def _check_sample(s: dict[str, Any], sp: dict[str, Any], logprobs: bool) -> None:
    n_out = len(s["output_ids"])
    assert 1 <= n_out <= sp["max_new_tokens"]
    assert s["finish_reason"] in ("stop", "length"), s
    if logprobs:
        assert len(s["output_logprobs"]) == n_out
    else:
        assert s.get("output_logprobs") is None


def _rollout(url: str, body: dict[str, Any]) -> dict[str, Any]:
    t0 = time.monotonic()
    r = httpx.post(url + "/v1/rollout", json=body, timeout=300)
    TALLY["seconds"] += time.monotonic() - t0
    assert r.status_code == 200, (body, r.text)
    out = r.json()
    assert len(out["prompts"]) == len(body["prompts"])
    for p in out["prompts"]:
        assert [s["sample_index"] for s in p["samples"]] == list(range(body["n"]))
        for s in p["samples"]:
            _check_sample(s, body["sampling_params"], body["return_logprobs"])
    TALLY["rollouts"] += 1
    TALLY["samples"] += len(body["prompts"]) * body["n"]
    return out


@SETTINGS
@given(data=st.data())
def test_drawn_rollouts_through_the_own_api(cluster, task, data) -> None:
    vocab = task.vocab_size
    sp = data.draw(sampling(vocab, task.eos_id))
    n = data.draw(st.integers(1, 4))
    first = data.draw(prompts(vocab, task.bos_id, max_size=3))
    ahead = data.draw(prompts(vocab, task.bos_id, max_size=3))
    fresh = data.draw(prompts(vocab, task.bos_id, min_size=0, max_size=2))
    logprobs = data.draw(st.booleans())
    window = data.draw(st.sampled_from([None, "bubble", "training"]))
    body = {"prompts": [{"input_ids": p} for p in first], "n": n, "sampling_params": sp,
            "next_prompts": [{"input_ids": p} for p in ahead], "return_logprobs": logprobs}
    if window:
        body["pregen_window"] = window
    _rollout(cluster.gateway_url, body)
    body2 = {"prompts": [{"input_ids": p} for p in ahead + fresh], "n": n,
             "sampling_params": sp, "return_logprobs": logprobs}
    if data.draw(st.booleans()):  # seeds of the trainer's own
        body2["seeds"] = [[data.draw(st.integers(0, 2**63 - 1)) for _ in range(n)]
                          for _ in ahead + fresh]
    _rollout(cluster.gateway_url, body2)


@st.composite
def sglang_requests(draw: st.DrawFn, vocab: int, eos: int, bos: int) -> dict[str, Any]:
    """One legal SGLang /generate body: single or batched ids, n, sampling_seed, the
    output-formatting flags slime and AReaL send."""
    sp = draw(sampling(vocab, eos))
    sp.update(n=draw(st.integers(1, 3)), no_stop_trim=draw(st.booleans()),
              skip_special_tokens=draw(st.booleans()))
    if draw(st.booleans()):
        sp["sampling_seed"] = draw(st.integers(0, 2**31))
    ids = draw(prompts(vocab, bos, max_size=3))
    body: dict[str, Any] = {"input_ids": ids if draw(st.booleans()) else ids[0],
                            "sampling_params": sp, "return_logprob": draw(st.booleans())}
    if draw(st.booleans()):
        body["next_input_ids"] = draw(prompts(vocab, bos, max_size=2))
    return body


@SETTINGS
@given(data=st.data())
def test_drawn_concurrent_requests_through_the_sglang_api(cluster, task, data) -> None:
    bodies = data.draw(st.lists(sglang_requests(task.vocab_size, task.eos_id, task.bos_id),
                                min_size=1, max_size=5))

    async def send() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=cluster.gateway_url, timeout=300) as http:
            return list(await asyncio.gather(*(http.post("/generate", json=b)
                                               for b in bodies)))

    t0 = time.monotonic()
    replies = asyncio.run(send())
    TALLY["seconds"] += time.monotonic() - t0
    for body, r in zip(bodies, replies):
        assert r.status_code == 200, (body, r.text)
        sp = body["sampling_params"]
        batched = isinstance(body["input_ids"][0], list)
        count = (len(body["input_ids"]) if batched else 1) * sp["n"]
        out = r.json()
        outs = out if isinstance(out, list) else [out]
        assert len(outs) == count
        for o in outs:
            meta = o["meta_info"]
            assert 1 <= len(o["output_ids"]) <= sp["max_new_tokens"]
            assert meta["finish_reason"]["type"] in ("stop", "length"), meta
            if body["return_logprob"]:
                assert len(meta["output_token_logprobs"]) == len(o["output_ids"])
        TALLY["generate"] += 1
        TALLY["samples"] += count


def test_every_rank_ready_and_no_engine_restarted(cluster) -> None:
    ranks = httpx.get(cluster.gateway_url + "/v1/ranks", timeout=10).json()["ranks"]
    assert {r["rank_id"] for r in ranks if r["ready"]} == set(cluster.rank_ids)
    for rank, url in cluster.rank_urls.items():
        text = httpx.get(url + "/metrics", timeout=10).text
        restarts = [float(v) for v in re.findall(
            r'^bubblespec_rank_engine_restarts_total\{[^}]*\} (\S+)$', text, re.MULTILINE)]
        assert sum(restarts) == 0, f"{rank} restarted its engine"
