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


def test_plain_top_logprobs_with_speculation_are_the_models(loop_runner, plain_engine,
                                                            spec_engine) -> None:
    """Plain sampling (vLLM's sampler) draws other tokens with speculation on than off, so
    its alternatives cannot be compared run to run; instead each position's alternatives,
    drafted or not, must be the model's distribution after that output's prefix: the
    engine's own scoring of prompt + output (prompt log-probs with the top TOP, no
    speculation involved) at the same position. A shifted position, a wrong rank or the
    processed (temperature) distribution instead of the raw one fails."""
    reqs = _reqs(1.0)
    base = loop_runner.run(plain_engine.generate(reqs))
    spec = _spec_run(loop_runner, spec_engine, reqs, base)
    _check_shape(spec)
    drafted = sum(s.num_accepted_tokens for r in spec for s in r.samples)
    assert drafted > 0
    full = [(r.input_ids, s) for r, res in zip(reqs, spec) for s in res.samples]
    scored = loop_runner.run(plain_engine.generate(
        [GenRequest(input_ids=list(p) + s.output_ids, score=True, top_logprobs=TOP)
         for p, s in full]))
    worst = 0.0
    for (p, s), sc in zip(full, scored):
        ref = sc.samples[0].prompt_top_logprobs
        for i, (t, pos) in enumerate(zip(s.output_ids, s.top_logprobs)):
            want = ref[len(p) + i]
            assert next(iter(want)) == t  # the scored token is the sampled one
            worst = max(worst, abs(pos[t] - want[t]))
            got_alts = sorted((lp for a, lp in list(pos.items())[1:]), reverse=True)
            want_alts = sorted((lp for a, lp in list(want.items())[1:]), reverse=True)
            assert len(got_alts) == len(want_alts)
            worst = max(worst, *(abs(x - y) for x, y in zip(got_alts, want_alts)))
            for a, lp in pos.items():  # each alternative's value, where scoring lists it
                if a in want:
                    worst = max(worst, abs(lp - want[a]))
    print(f"plain top log-probs vs the scored prefix: largest difference {worst:.2e}")
    assert worst < 2e-3
