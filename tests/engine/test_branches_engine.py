"""Margin branches on real engines: a keyed request that starts at an output position
(`GenRequest.keyed_start`) continues a response exactly as the response itself went on, for
position and context keys; the engine's top log-probs give every keyed token a non-negative
margin (the sampler's own choice, seen through its noise); and a spec engine given a draft
that flips at one position plus the branch that takes the flip follows the branch: same
tokens, fewer forwards."""

from __future__ import annotations

import random

import pytest

from bubblespec.core.keyed_noise import keyed_margin, position_key
from bubblespec.engine import GenRequest
from bubblespec.protocol.sampling import SamplingParams
from tests.engine_fixtures import model_task

pytestmark = pytest.mark.engine


def _sp(max_new: int, mode: str = "keyed") -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new, temperature=1.0, seed_mode=mode,
                          stop_token_ids=[model_task().eos_id])


@pytest.mark.parametrize("mode", ["keyed", "keyed_context"])
def test_a_keyed_start_continues_the_response_in_place(loop_runner, plain_engine,
                                                       mode: str) -> None:
    prompt = list(model_task().make_prompts(1, seed=41)[0].input_ids)
    (full,) = loop_runner.run(plain_engine.generate([GenRequest(
        input_ids=prompt, n=3, sampling=_sp(300, mode), seeds=[5, 6, 7], top_logprobs=4)]))
    for s, seed in zip(full.samples, (5, 6, 7)):
        out = s.output_ids
        assert len(s.top_logprobs) == len(out) and all(t in lp for t, lp in
                                                       zip(out, s.top_logprobs))
        if mode == "keyed":  # every keyed token wins against the top tokens under its noise
            margins = [keyed_margin(lp, t, position_key(seed, p))[0]
                       for p, (t, lp) in enumerate(zip(out, s.top_logprobs))]
            assert min(margins) >= -1e-3, min(margins)
        f = len(out) // 2
        (cont,) = loop_runner.run(plain_engine.generate([GenRequest(
            input_ids=prompt + out[:f + 1], n=1, sampling=_sp(300 - f - 1, mode),
            seeds=[seed], keyed_start=f + 1)]))
        assert cont.samples[0].output_ids == out[f + 1:]


def test_the_spec_engine_follows_a_branch_that_takes_the_flip(loop_runner, plain_engine,
                                                              spec_engine) -> None:
    prompts = model_task().make_prompts(4, seed=43)
    reqs = [GenRequest(input_ids=list(p.input_ids), n=2, sampling=_sp(400),
                       seeds=[100 + 10 * i, 101 + 10 * i]) for i, p in enumerate(prompts)]
    base = loop_runner.run(plain_engine.generate(reqs))
    rng = random.Random(5)
    flipped, branches = [], []
    for r, res in zip(reqs, base):
        for s in res.samples:
            out = s.output_ids
            f = len(out) // 3
            wrong = (out[f] + 1) % spec_engine.vocab_size
            # the draft flips at f to another token and its own tail (random ids: nothing
            # of the truth's tail is in it); the branch at f is the truth
            tail = [rng.randrange(spec_engine.vocab_size) for _ in out[f + 1:]]
            flipped.append((r.group_key(), s.sample_index, out[:f] + [wrong] + tail))
            branches.append((r.group_key(), s.sample_index, list(out), f))

    def run(with_branches: bool) -> tuple[list, int, dict]:
        loop_runner.run(spec_engine.add_drafts(flipped + (branches if with_branches else [])))
        res = loop_runner.run(spec_engine.generate(reqs))
        stats = loop_runner.run(spec_engine.index_stats())
        loop_runner.run(spec_engine.release_groups([r.group_key() for r in reqs]))
        return ([[s.output_ids for s in x.samples] for x in res],
                sum(s.decode_steps for x in res for s in x.samples), stats)

    ids0, steps0, _ = run(False)
    ids1, steps1, stats = run(True)
    truth = [[s.output_ids for s in x.samples] for x in base]
    assert ids0 == ids1 == truth  # drafts never change what is sampled
    assert stats["branches_taken"] >= len(branches) - 1
    assert steps1 < 0.8 * steps0, (steps1, steps0)
