"""Top log-probs on real engines (`GenRequest.top_logprobs`, what the OpenAI `logprobs: N` /
`top_logprobs: N` and SGLang's `top_logprobs_num` read).

Per output token the engine returns vLLM's list: the sampled token first, then the N most
likely tokens by rank (the sampled token once). Checked: the shape; the ranking (the tokens
after the first in descending log-prob, and for greedy requests the sampled token is the
rank-1 token: a wrong rank of alternatives fails here); the sampled entry equals the
token's `output_logprobs`; and with keyed sampling the same ids and the same alternatives,
in the same order, with speculation on and off.
"""

from __future__ import annotations

import pytest

from bubblespec.engine import GenRequest
from bubblespec.protocol.sampling import SamplingParams
from bubblespec.tasks import default_task
from tests.engine.test_penalties import _spec_run

pytestmark = pytest.mark.engine

TOP = 5


def _reqs(temperature: float, seed_mode: str = "default") -> list[GenRequest]:
    task = default_task()
    sp = SamplingParams(max_new_tokens=48, temperature=temperature, seed_mode=seed_mode,
                        stop_token_ids=[task.eos_id])
    return [GenRequest(input_ids=list(p.input_ids), n=2, sampling=sp, top_logprobs=TOP,
                       seeds=[31 * i + j for j in range(2)])
            for i, p in enumerate(task.make_prompts(4, seed=61))]


def _check_shape(results: list) -> None:
    for r in results:
        for s in r.samples:
            assert s.top_logprobs is not None and len(s.top_logprobs) == len(s.output_ids)
            for t, lp, pos in zip(s.output_ids, s.output_logprobs, s.top_logprobs):
                entries = list(pos.items())
                assert entries[0][0] == t and entries[0][1] == lp  # the sampled token first
                assert TOP <= len(entries) <= TOP + 1
                ranked = [x for _, x in entries[1:]]
                assert ranked == sorted(ranked, reverse=True)


def test_greedy_samples_the_rank_1_token(loop_runner, plain_engine) -> None:
    res = loop_runner.run(plain_engine.generate(_reqs(0.0)))
    _check_shape(res)
    for r in res:
        for s in r.samples:
            for pos in s.top_logprobs:
                entries = list(pos.values())
                assert entries[0] >= max(entries) - 1e-6, "the argmax is not ranked first"
                assert len(pos) == TOP  # the sampled token is among the top: listed once


def test_keyed_top_logprobs_equal_with_speculation_on_and_off(loop_runner, plain_engine,
                                                              spec_engine) -> None:
    reqs = _reqs(1.0, "keyed")
    base = loop_runner.run(plain_engine.generate(reqs))
    _check_shape(base)
    spec = _spec_run(loop_runner, spec_engine, reqs, base)
    _check_shape(spec)
    drift = 0.0
    for a, b in zip(base, spec):
        for x, y in zip(a.samples, b.samples):
            assert x.output_ids == y.output_ids
            for p, q in zip(x.top_logprobs, y.top_logprobs):
                assert list(p) == list(q)  # the same alternatives in the same order
                drift = max(drift, *(abs(p[t] - q[t]) for t in p))
    print(f"top log-probs, speculation off vs on: largest difference {drift:.2e}")
    assert drift <= 1e-4  # fp32 reduction order at most (bit-identical as measured so far)
