"""Requests through the gateway on a real 2-rank LocalCluster (supervised, as `bubblespec up`
runs it), one cluster for both halves:

The valid request space: drawn legal requests (`tests/valid_space.py`) through the gateway's
own `POST /v1/rollout` and its SGLang-compatible `POST /generate`. Each drawn rollout runs as
two steps: the first hands the second's prompts ahead (pre-generated drafts in the bubble),
the second adds prompts that were not handed ahead (no drafts but siblings). SGLang requests
are sent concurrently, single and batched, so the batcher puts several into one step. Every
request answers 200 well formed; afterwards every rank is ready and no engine was restarted.
`make test` draws a fixed slice (derandomized); `make test-valid-space` draws
`BUBBLESPEC_VALID_EXAMPLES` examples afresh and prints how many requests it ran.

Poison requests: the ranks' engines run with a fault injected on purpose
(`fault_poison_token`: the engine core dies when it schedules a prompt holding that token, as
on an engine bug); the drawn valid prompts never hold it.
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
POISON = 200
"""A token id of the embedded model's vocabulary that its task never uses: the engines die
on a prompt holding it."""
SETTINGS = settings(max_examples=examples(6), deadline=None, derandomize=not LONG,
                    database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow, HealthCheck.data_too_large])
TALLY = {"rollouts": 0, "generate": 0, "samples": 0, "seconds": 0.0}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from local_cluster(tmp_path_factory, rank_args=[
        "--fault-poison-token", str(POISON), "--engine-check-s", "0.5"])
    print(f"\nvalid space (gateway): {TALLY['rollouts']} rollout requests, "
          f"{TALLY['generate']} SGLang requests, {TALLY['samples']} samples, "
          f"{TALLY['seconds']:.0f} s")


@pytest.fixture(scope="module")
def task() -> Any:
    from bubblespec.tasks import default_task

    return default_task()


def _check_sample(s: dict[str, Any], sp: dict[str, Any], logprobs: bool, top: int = 0
                  ) -> None:
    n_out = len(s["output_ids"])
    if s["finish_reason"] == "error":  # vLLM ends a sample whose constraint no token meets
        assert sp.get("structured") is not None and 1 <= n_out <= sp["max_new_tokens"], s
        return
    # a constraint's grammar, once complete, ends the sample (vLLM), min_tokens or not
    least = 1 if sp.get("structured") is not None else max(1, sp.get("min_tokens", 0))
    assert least <= n_out <= sp["max_new_tokens"]
    assert s["finish_reason"] in ("stop", "length"), s
    if logprobs:
        assert len(s["output_logprobs"]) == n_out
    else:
        assert s.get("output_logprobs") is None
    if top:  # vLLM's order: the sampled token first, then the top `top` by rank
        assert len(s["output_top_logprobs"]) == n_out
        for t, pos in zip(s["output_ids"], s["output_top_logprobs"]):
            assert pos[0][0] == t and top <= len(pos) <= top + 1
            ranked = [lp for _, lp in pos[1:]]
            assert ranked == sorted(ranked, reverse=True)
    else:
        assert s.get("output_top_logprobs") is None


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
            _check_sample(s, body["sampling_params"], body["return_logprobs"],
                          body.get("top_logprobs", 0))
    TALLY["rollouts"] += 1
    TALLY["samples"] += len(body["prompts"]) * body["n"]
    return out


@SETTINGS
@given(data=st.data())
def test_drawn_rollouts_through_the_own_api(cluster, task, data) -> None:
    vocab = task.vocab_size
    sp = data.draw(sampling(vocab, task.eos_id, exclude=POISON))
    n = data.draw(st.integers(1, 4))
    first = data.draw(prompts(vocab, task.bos_id, exclude=POISON, max_size=3))
    ahead = data.draw(prompts(vocab, task.bos_id, exclude=POISON, max_size=3))
    fresh = data.draw(prompts(vocab, task.bos_id, exclude=POISON, min_size=0, max_size=2))
    logprobs = data.draw(st.booleans())
    window = data.draw(st.sampled_from([None, "bubble", "training"]))
    body = {"prompts": [{"input_ids": p} for p in first], "n": n, "sampling_params": sp,
            "next_prompts": [{"input_ids": p} for p in ahead], "return_logprobs": logprobs,
            "top_logprobs": data.draw(st.sampled_from([0, 0, 1, 5, 20]))}
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
    sp = draw(sampling(vocab, eos, exclude=POISON))
    sp["min_new_tokens"] = sp.pop("min_tokens")  # SGLang's name
    sp.pop("allowed_token_ids"), sp.pop("bad_words")  # not SGLang's
    c = sp.pop("structured")  # SGLang's constraints: regex (a choice as one), ebnf, json
    if c is not None:
        sp["regex"] = c.get("regex") or "(" + "|".join(c["choice"]) + ")"
    sp.update(n=draw(st.integers(1, 3)), no_stop_trim=draw(st.booleans()),
              skip_special_tokens=draw(st.booleans()))
    if draw(st.booleans()):
        sp["sampling_seed"] = draw(st.integers(0, 2**31))
    ids = draw(prompts(vocab, bos, exclude=POISON, max_size=3))
    body: dict[str, Any] = {"input_ids": ids if draw(st.booleans()) else ids[0],
                            "sampling_params": sp, "return_logprob": draw(st.booleans())}
    if body["return_logprob"] and draw(st.booleans()):
        body["top_logprobs_num"] = draw(st.sampled_from([1, 5, 20]))
    if draw(st.booleans()):
        body["next_input_ids"] = draw(prompts(vocab, bos, exclude=POISON, max_size=2))
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
            if meta["finish_reason"]["type"] == "error":  # a constraint no token meets
                assert "regex" in sp and o["output_ids"], meta
                continue
            least = 1 if "regex" in sp else max(1, sp["min_new_tokens"])  # (as above)
            assert least <= len(o["output_ids"]) <= sp["max_new_tokens"]
            assert meta["finish_reason"]["type"] in ("stop", "length"), meta
            if body["return_logprob"]:
                assert len(meta["output_token_logprobs"]) == len(o["output_ids"])
            if body.get("top_logprobs_num"):
                tops = meta["output_top_logprobs"]
                assert len(tops) == len(o["output_ids"])
                for pos in tops:
                    lps = [e[0] for e in pos]
                    assert len(pos) == body["top_logprobs_num"] and lps == sorted(lps)[::-1]
        TALLY["generate"] += 1
        TALLY["samples"] += count


@pytest.mark.parametrize("seed_mode", ["default", "keyed"])
def test_top_k_1_20_50_and_the_vocabulary_on_both_apis(cluster, task, seed_mode) -> None:
    """The values users send (Qwen recommends top-k 20), each as a two-step rollout whose
    second step decodes with pre-generated drafts, and as SGLang requests."""
    vocab = task.vocab_size
    for i, k in enumerate([1, 20, 50, vocab]):
        sp = {"temperature": 1.0, "top_k": k, "max_new_tokens": 24, "seed_mode": seed_mode,
              "stop_token_ids": [task.eos_id]}
        first, ahead = (task.make_prompts(2, seed=700 + 10 * i + j) for j in range(2))
        ids = [[{"input_ids": list(p.input_ids)} for p in ps] for ps in (first, ahead)]
        _rollout(cluster.gateway_url, {"prompts": ids[0], "n": 2, "sampling_params": sp,
                                       "next_prompts": ids[1], "return_logprobs": True})
        out = _rollout(cluster.gateway_url, {"prompts": ids[1], "n": 2, "sampling_params": sp,
                                             "return_logprobs": True})
        if k == 1:  # top-k 1 is greedy whatever the seeds and drafts
            assert all(len({tuple(s["output_ids"]) for s in p["samples"]}) == 1
                       for p in out["prompts"])
        r = httpx.post(cluster.gateway_url + "/generate", timeout=300, json={
            "input_ids": [list(p.input_ids) for p in first],
            "sampling_params": {**sp, "n": 2}, "return_logprob": True})
        assert r.status_code == 200, r.text
        assert len(r.json()) == 4


def test_every_rank_ready_and_no_engine_restarted(cluster) -> None:
    ranks = httpx.get(cluster.gateway_url + "/v1/ranks", timeout=10).json()["ranks"]
    assert {r["rank_id"] for r in ranks if r["ready"]} == set(cluster.rank_ids)
    for rank, url in cluster.rank_urls.items():
        text = httpx.get(url + "/metrics", timeout=10).text
        restarts = [float(v) for v in re.findall(
            r'^bubblespec_rank_engine_restarts_total\{[^}]*\} (\S+)$', text, re.MULTILINE)]
        assert sum(restarts) == 0, f"{rank} restarted its engine"


# ---------------------------------------------------------------------- poison requests
SP = {"temperature": 1.0, "top_k": 20, "max_new_tokens": 16}


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


@pytest.mark.slow  # CI time (docs/results.md, run 17): make test-slow
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


@pytest.mark.slow  # CI time (docs/results.md, run 17): make test-slow
def test_a_poison_scoring_call_kills_two_engines_then_is_refused(cluster, task) -> None:
    """Scoring runs outside rollout steps but is held to the same rule: at most two engine
    deaths per distinct request, then a 500 naming it and refusals on both APIs."""
    wait_ready(cluster)
    deaths0 = gateway_counter(cluster, "bubblespec_gateway_engine_deaths")
    body = {"input_ids": poison_prompt(5), "return_logprob": True, "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": 0}}
    r = httpx.post(cluster.gateway_url + "/generate", json=body, timeout=600)
    assert r.status_code == 500, r.text
    assert r.json()["field"].startswith("input_ids"), r.text
    assert "quarantined" in r.json()["detail"] and "scoring call" in r.json()["detail"], r.text
    assert gateway_counter(cluster, "bubblespec_gateway_engine_deaths") == deaths0 + 2
    again = httpx.post(cluster.gateway_url + "/generate", json=body, timeout=60)
    assert again.status_code == 400 and again.json()["field"].startswith("input_ids"), again.text
    oai = httpx.post(cluster.gateway_url + "/v1/completions", timeout=60, json={
        "model": "policy", "prompt": poison_prompt(5), "echo": True, "max_tokens": 0,
        "logprobs": 0})
    assert oai.status_code == 400 and "quarantined" in oai.text, oai.text
    assert gateway_counter(cluster, "bubblespec_gateway_engine_deaths") == deaths0 + 2
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
