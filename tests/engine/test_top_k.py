"""The exactness contract under top-k, on real vLLM engines (docs/design.md section 2).

A speculative engine sends every decode step through vLLM's rejection sampler, also a step
in which no request got a draft; its top-k masking of the drafted positions once raised on
that empty batch and killed the engine core (`vllm_glue._guard_empty`). So every test here
also runs steps with and without drafts in one batch:

- top-k 1 is greedy decoding, with speculation on and off, plain and keyed sampling, right
  and wrong drafts;
- at top-k K the distribution of short sampled sequences under adversarial drafts equals
  plain decoding's (chi-square), a drafted token outside the top K is never emitted, and the
  biased verifier (negative control) is still caught with top-k set;
- keyed ids are bit-identical with speculation on or off at top-k 1, 5, 20 and the
  vocabulary size, position and context keys;
- a mixed batch (top-k on some requests only, top-p, greedy, keyed and plain, drafts for
  some prompt groups only) completes with well-formed results and the engine stays alive.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from bubblespec.engine import GenRequest
from bubblespec.protocol.sampling import SamplingParams
from tests.engine.test_exactness import (
    N_SAMPLES,
    SEQ_LEN,
    _adversarial_drafts,
    _p_values,
    _sample_counts,
    high_entropy_prompt,
)
from tests.engine_fixtures import model_task

pytestmark = pytest.mark.engine

TOP_K = 3
"""Small enough to mask most of the tiny model's next-token mass at an uncertain context."""


def _ids(results: list) -> list[list[list[int]]]:
    return [[s.output_ids for s in r.samples] for r in results]


def _drafts_for(reqs: list[GenRequest], results: list, vocab: int, seed: int) -> list[tuple]:
    """Per sample: the right response (even samples) or random tokens (odd samples)."""
    rng = random.Random(seed)
    out = []
    for r, res in zip(reqs, results):
        for s in res.samples:
            good = s.output_ids
            toks = good if s.sample_index % 2 == 0 else [rng.randrange(vocab) for _ in good]
            out.append((r.group_key(), s.sample_index, toks))
    return out


def _run_with_drafts(runner, engine, reqs: list[GenRequest], drafts: list[tuple]) -> list:
    runner.run(engine.add_drafts(drafts))
    try:
        return runner.run(engine.generate(reqs))
    finally:
        runner.run(engine.release_groups([r.group_key() for r in reqs]))


@pytest.mark.parametrize("mode", ["default", "keyed"])
def test_top_k_one_is_greedy_with_speculation_on_and_off(loop_runner, plain_engine,
                                                         spec_engine, mode: str) -> None:
    prompts = model_task().make_prompts(5, seed=13)
    eos = model_task().eos_id
    greedy = SamplingParams(max_new_tokens=80, temperature=0.0, stop_token_ids=[eos])
    top1 = SamplingParams(max_new_tokens=80, temperature=1.0, top_k=1, stop_token_ids=[eos],
                          seed_mode=mode)
    n = 4
    seeds = (lambda i: [100 * i + j for j in range(n)]) if mode == "keyed" else (lambda i: None)
    ref = loop_runner.run(plain_engine.generate(
        [GenRequest(input_ids=list(p.input_ids), n=1, sampling=greedy) for p in prompts]))
    reqs = [GenRequest(input_ids=list(p.input_ids), n=n, sampling=top1, seeds=seeds(i))
            for i, p in enumerate(prompts)]
    plain = loop_runner.run(plain_engine.generate(reqs))
    # drafts for the first three prompt groups only: steps with and without drafts
    drafts = [d for d in _drafts_for(reqs, ref, spec_engine.vocab_size, 5)
              if d[0] in {r.group_key() for r in reqs[:3]}]
    drafts += [(g, j, toks) for g, _, toks in drafts for j in range(1, n)]
    spec = _run_with_drafts(loop_runner, spec_engine, reqs, drafts)
    for r, p_res, s_res in zip(ref, plain, spec):
        want = r.samples[0].output_ids
        assert all(s.output_ids == want for s in p_res.samples)
        assert all(s.output_ids == want for s in s_res.samples)
    assert sum(s.num_accepted_tokens for r in spec for s in r.samples) > 0
    assert spec_engine.alive


def _outside_top_k_drafts(counts: Counter, vocab: int) -> tuple[list[list[int]], int]:
    """Drafts of a token never seen in the plain samples (outside the top K at every
    position of this context): a verifier that ignores the top-k mask emits it."""
    seen = {t for seq in counts for t in seq}
    outsider = next(t for t in range(vocab - 1, 0, -1) if t not in seen)
    return [[outsider] * (2 * SEQ_LEN) for _ in range(N_SAMPLES)], outsider


def test_sampled_distribution_unchanged_under_top_k(loop_runner, plain_engine,
                                                    spec_engine) -> None:
    prompt = high_entropy_prompt(loop_runner, plain_engine)
    base = _sample_counts(loop_runner, plain_engine, prompt, 1.0, [], top_k=TOP_K, arm=0)
    spec = _sample_counts(loop_runner, spec_engine, prompt, 1.0, _adversarial_drafts(base),
                          top_k=TOP_K, arm=1)
    p_joint, p_first = _p_values(base, spec)
    assert min(p_joint, p_first) > 1e-3, (
        f"speculation changed the top-k distribution (p={p_joint:.2e}, {p_first:.2e})")
    drafts, outsider = _outside_top_k_drafts(base, spec_engine.vocab_size)
    key = GenRequest(input_ids=prompt).group_key()
    loop_runner.run(spec_engine.add_drafts([(key, i, d) for i, d in enumerate(drafts)]))
    sp = SamplingParams(max_new_tokens=SEQ_LEN, temperature=1.0, top_k=TOP_K, ignore_eos=True)
    res = loop_runner.run(spec_engine.generate([GenRequest(input_ids=prompt, n=300,
                                                           sampling=sp)]))
    loop_runner.run(spec_engine.release_groups([key]))
    emitted = Counter(t for s in res[0].samples for t in s.output_ids)
    assert emitted[outsider] == 0, f"token {outsider}, outside the top {TOP_K}, was emitted"


def test_negative_control_biased_verifier_is_caught_under_top_k(loop_runner, plain_engine,
                                                                biased_engine) -> None:
    prompt = high_entropy_prompt(loop_runner, plain_engine)
    base = _sample_counts(loop_runner, plain_engine, prompt, 1.0, [], top_k=TOP_K, arm=0)
    bad = _sample_counts(loop_runner, biased_engine, prompt, 1.0, _adversarial_drafts(base),
                         top_k=TOP_K, arm=1)
    p_joint, p_first = _p_values(base, bad)
    assert min(p_joint, p_first) < 1e-6, (
        f"the top-k test failed to catch a verifier that over-accepts drafts "
        f"(p={p_joint:.2e}, {p_first:.2e})")


@pytest.mark.parametrize("mode", ["keyed", "keyed_context"])
def test_keyed_spec_on_off_identical_under_top_k(loop_runner, plain_engine, spec_engine,
                                                 mode: str) -> None:
    """One batch: top-k 1, 5, 20 and the vocabulary size, one prompt each, drafts for
    every other prompt (right for even samples, random for odd ones)."""
    prompts = model_task().make_prompts(8, seed=37)
    eos = model_task().eos_id
    vocab = spec_engine.vocab_size
    ks = [1, 5, 20, vocab]
    reqs = [GenRequest(input_ids=list(p.input_ids), n=4,
                       sampling=SamplingParams(max_new_tokens=120, temperature=1.0,
                                               top_k=ks[i % len(ks)], stop_token_ids=[eos],
                                               seed_mode=mode),
                       seeds=[7 + 1000 * i + j for j in range(4)])
            for i, p in enumerate(prompts)]
    base = loop_runner.run(plain_engine.generate(reqs))
    drafted = {r.group_key() for r in reqs[::2]}
    drafts = [d for d in _drafts_for(reqs, base, vocab, 11) if d[0] in drafted]
    spec = _run_with_drafts(loop_runner, spec_engine, reqs, drafts)
    assert _ids(spec) == _ids(base)
    assert sum(s.num_accepted_tokens for r in spec for s in r.samples) > 0
    assert spec_engine.alive


def test_mixed_batch_with_and_without_top_k_and_drafts(loop_runner, plain_engine,
                                                       spec_engine) -> None:
    """Every legal kind of request in one batch, drafts for half the prompt groups: each
    completes well formed, keyed and greedy ones equal the plain engine's, the engine lives."""
    task = model_task()
    eos, vocab = task.eos_id, spec_engine.vocab_size
    kinds = [
        {"temperature": 1.0},
        {"temperature": 1.0, "top_k": TOP_K},
        {"temperature": 0.7, "top_k": 1},
        {"temperature": 1.0, "top_k": vocab},
        {"temperature": 1.0, "top_p": 0.8, "top_k": 10},
        {"temperature": 0.0, "top_k": 5},
        {"temperature": 1.0, "top_k": 2, "seed_mode": "keyed"},
        {"temperature": 1.3, "top_k": 50, "top_p": 0.9, "seed_mode": "keyed_context"},
        {"temperature": 1.0, "top_k": 8, "repetition_penalty": 1.2, "seed_mode": "keyed"},
        {"temperature": 1.0, "top_k": 4, "ignore_eos": True, "max_new_tokens": 40},
    ]
    prompts = task.make_prompts(len(kinds), seed=53)
    reqs = []
    for i, (p, kw) in enumerate(zip(prompts, kinds)):
        kw = {"max_new_tokens": 100, "stop_token_ids": [eos], **kw}
        if kw.get("ignore_eos"):
            kw.pop("stop_token_ids")
        sp = SamplingParams(**kw)
        seeds = [31 * i + j for j in range(3)] if sp.keyed else None
        reqs.append(GenRequest(input_ids=list(p.input_ids), n=3, sampling=sp, seeds=seeds))
    base = loop_runner.run(plain_engine.generate(reqs))
    drafted = {r.group_key() for r in reqs[1::2]}
    drafts = [d for d in _drafts_for(reqs, base, vocab, 17) if d[0] in drafted]
    spec = _run_with_drafts(loop_runner, spec_engine, reqs, drafts)
    for req, b, s in zip(reqs, base, spec):
        assert [x.sample_index for x in s.samples] == list(range(req.n))
        for x in s.samples:
            assert 1 <= len(x.output_ids) <= req.sampling.max_new_tokens
            assert len(x.output_logprobs) == len(x.output_ids)
            assert x.finish_reason in ("stop", "length")
        exact = req.sampling.keyed or req.sampling.temperature == 0 or req.sampling.top_k == 1
        if exact:
            assert [x.output_ids for x in s.samples] == [x.output_ids for x in b.samples], (
                f"{req.sampling} differs with speculation on")
    assert spec_engine.alive and plain_engine.alive
