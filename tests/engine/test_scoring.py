"""Prompt scoring (`GenRequest.score`): the engine's prompt log-probs equal an independent
scoring pass (a transformers forward of the same model on the same ids), on the plain and
on the speculative engine, alone and in one engine batch with generation requests; a
scoring request has no output, a group of its own, and leaves no drafts behind."""

from __future__ import annotations

import numpy as np
import pytest

from bubblespec.engine.types import GenRequest
from bubblespec.protocol.errors import InvalidRequest
from bubblespec.protocol.sampling import SamplingParams
from tests.engine_fixtures import model_dir, model_task

TOL = 2e-3
"""Largest difference to the float32 transformers pass (the same bound as the output
log-probs' in test_exactness.py: vLLM's CPU kernels sum in another order)."""


@pytest.fixture(scope="module")
def reference():
    """log p(ids[i] | ids[:i]) for i >= 1 by a transformers forward (float32)."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir(), dtype=torch.float32).eval()

    def score(ids: list[int]) -> list[float]:
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        return [float(logp[i - 1, t]) for i, t in enumerate(ids) if i > 0]

    return score


@pytest.fixture(scope="module")
def reference_full():
    """Per position i, log p(. | ids[:i + 1]) over the vocabulary (transformers, float32)."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir(), dtype=torch.float32).eval()

    def rows(ids: list[int]) -> np.ndarray:
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1).numpy()

    return rows


def _check(ids: list[int], got: list[float | None] | None, reference) -> float:
    assert got is not None and len(got) == len(ids)
    assert got[0] is None and all(isinstance(x, float) for x in got[1:])
    return float(np.max(np.abs(np.array(reference(ids)) - np.array(got[1:]))))


def _prompts(n: int) -> list[list[int]]:
    return [list(p.input_ids) for p in model_task().make_prompts(n, 31)]


@pytest.mark.parametrize("engine_name", ["plain_engine", "spec_engine"])
def test_scores_match_transformers_with_generation_in_the_batch(
        request, loop_runner, reference, engine_name) -> None:
    eng = request.getfixturevalue(engine_name)
    prompts = _prompts(4)
    eos = model_task().eos_id
    # a scored response (prompt + a sampled continuation), as a distillation teacher sees it
    gen = loop_runner.run(eng.generate([GenRequest(input_ids=prompts[0], n=1, seeds=[7],
                                                   sampling=SamplingParams(
                                                       max_new_tokens=40,
                                                       stop_token_ids=[eos]))]))
    full = prompts[0] + gen[0].samples[0].output_ids
    scored = [full, *prompts[1:], prompts[1][:2]]
    reqs = [GenRequest(input_ids=ids, score=True) for ids in scored]
    mixed = [GenRequest(input_ids=prompts[2], n=2, seeds=[1, 2],
                        sampling=SamplingParams(max_new_tokens=24, stop_token_ids=[eos])),
             *reqs]
    before = loop_runner.run(eng.index_stats())
    res = loop_runner.run(eng.generate(mixed))
    assert len(res[0].samples) == 2 and all(s.prompt_logprobs is None
                                            for s in res[0].samples)
    worst = 0.0
    for ids, r in zip(scored, res[1:]):
        (s,) = r.samples
        assert s.output_ids == [] and s.output_logprobs == []
        assert s.finish_reason == "length" and s.completion_tokens == 0
        assert s.decode_steps == 0 and s.num_draft_tokens == 0
        worst = max(worst, _check(ids, s.prompt_logprobs, reference))
    assert worst < TOL, f"scored log-probs differ from transformers' by up to {worst}"
    if eng.speculative:  # the scoring groups were released: nothing of them stays
        after = loop_runner.run(eng.index_stats())
        assert after["groups"] <= before["groups"] + 1  # (+1: the generation's own group)


def test_scoring_the_same_prompt_twice_is_identical(loop_runner, spec_engine) -> None:
    """The second scoring of a prompt cannot read the first's prefix cache (vLLM skips it
    for prompt log-probs): both are computed in full and agree."""
    ids = _prompts(1)[0]
    a, b = loop_runner.run(spec_engine.generate([GenRequest(input_ids=ids, score=True)] * 2))
    assert a.samples[0].prompt_logprobs == b.samples[0].prompt_logprobs


def test_scoring_refuses_n_and_too_long(loop_runner, plain_engine) -> None:
    ids = _prompts(1)[0]
    with pytest.raises(InvalidRequest) as e:
        plain_engine.validate(GenRequest(input_ids=ids, n=2, score=True))
    assert e.value.field == "n"
    with pytest.raises(InvalidRequest) as e:
        plain_engine.validate(GenRequest(input_ids=[1] * plain_engine.max_model_len,
                                         score=True))
    assert e.value.field == "input_ids"


def test_prompt_top_alternatives_and_ranks_match_transformers(loop_runner, spec_engine,
                                                              reference_full) -> None:
    """`top_logprobs` on a scoring request: per prompt position the prompt token first, then
    the k most likely tokens in rank order, with the transformers pass's log-probs; each
    prompt token's rank is its rank in the transformers distribution (a wrong rank order or
    a position shifted by one fails)."""
    k = 5
    prompts = _prompts(3)
    res = loop_runner.run(spec_engine.generate(
        [GenRequest(input_ids=ids, score=True, top_logprobs=k) for ids in prompts]))
    for ids, r in zip(prompts, res):
        (s,) = r.samples
        logp = reference_full(ids)
        assert s.prompt_top_logprobs is not None and s.prompt_top_logprobs[0] is None
        assert s.prompt_ranks is not None and s.prompt_ranks[0] is None
        for i in range(1, len(ids)):
            row = logp[i - 1]
            order = np.argsort(-row, kind="stable")
            entries = list(s.prompt_top_logprobs[i].items())
            assert entries[0][0] == ids[i]  # the prompt token first (vLLM's order)
            assert len(entries) in (k, k + 1)  # k when the prompt token is among the top k
            for t, lp in entries:
                assert abs(lp - row[t]) < TOL
            # the alternatives are the k most likely tokens, in rank order
            alts = [lp for _, lp in entries[1:]]
            assert alts == sorted(alts, reverse=True)
            best = sorted((lp for _, lp in entries), reverse=True)[:k]
            assert np.allclose(best, row[order[:k]], atol=TOL)
            rank = int((row > row[ids[i]] + TOL).sum()) + 1  # ties within TOL aside
            assert rank <= s.prompt_ranks[i] <= int((row >= row[ids[i]] - TOL).sum())
