"""The converted real model served by vLLM: greedy continuations equal a transformers forward
of the same weights, log-probs agree, and keyed sampling is bit-identical with speculation on
or off (right and wrong drafts) on natural-language prompts."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bubblespec.engine import GenRequest
from bubblespec.protocol.sampling import SamplingParams

pytestmark = pytest.mark.engine

GREEDY_TOKENS = 24


@pytest.fixture(scope="module")
def task(real_dir):
    from bubblespec.tasks.wordproblems import WordProblemsTask

    return WordProblemsTask(real_dir)


@pytest.fixture(scope="module")
def hf_model(real_dir):
    import torch
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(real_dir), dtype=torch.float32).eval()


def _logprobs(model, ids: list[int]):
    import torch

    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)


def test_greedy_continuation_equals_transformers(loop_runner, real_plain, hf_model,
                                                 task) -> None:
    """vLLM's greedy tokens are, position by position, the argmax of one transformers
    forward over prompt + continuation (the same as a greedy loop, in one pass)."""
    prompt = list(task.make_prompts(1, seed=7)[0].input_ids)
    req = GenRequest(input_ids=prompt, n=1, sampling=SamplingParams(
        max_new_tokens=GREEDY_TOKENS, temperature=0.0, ignore_eos=True))
    got = loop_runner.run(real_plain.generate([req]))[0].samples[0].output_ids
    assert len(got) == GREEDY_TOKENS
    logp = _logprobs(hf_model, prompt + got)
    ref = [int(logp[len(prompt) - 1 + i].argmax()) for i in range(len(got))]
    assert got == ref, (task.decode(got), task.decode(ref))
    assert len(task.decode(got).split()) > 5  # English words, not a degenerate loop of ids


def test_sampled_logprobs_match_transformers(loop_runner, real_spec, hf_model, task) -> None:
    prompts = task.make_prompts(1, seed=8)
    reqs = [GenRequest(input_ids=list(p.input_ids), n=2, seeds=[11, 12], sampling=SamplingParams(
        max_new_tokens=32, temperature=1.0, stop_token_ids=[task.eos_id])) for p in prompts]
    worst = 0.0
    for req, r in zip(reqs, loop_runner.run(real_spec.generate(reqs))):
        for s in r.samples:
            logp = _logprobs(hf_model, req.input_ids + s.output_ids)
            n_p = len(req.input_ids)
            ref = np.array([float(logp[n_p - 1 + i, t]) for i, t in enumerate(s.output_ids)])
            worst = max(worst, float(np.max(np.abs(ref - np.array(s.output_logprobs)))))
    assert worst < 5e-3, f"vLLM log-probs differ from transformers' by up to {worst}"


def test_keyed_spec_on_off_identical(loop_runner, real_plain, real_spec, task) -> None:
    sp = SamplingParams(max_new_tokens=48, temperature=1.0, stop_token_ids=[task.eos_id],
                        seed_mode="keyed")
    reqs = [GenRequest(input_ids=list(p.input_ids), n=3, sampling=sp,
                       seeds=[100 * i + j for j in range(3)])
            for i, p in enumerate(task.make_prompts(2, seed=9))]
    base = loop_runner.run(real_plain.generate(reqs))
    rng = random.Random(5)
    drafts = []
    for r, res in zip(reqs, base):
        for s in res.samples:
            wrong = [rng.randrange(real_spec.vocab_size) for _ in s.output_ids]
            drafts.append((r.group_key(), s.sample_index,
                           wrong if s.sample_index == 1 else s.output_ids))
    loop_runner.run(real_spec.add_drafts(drafts))
    spec = loop_runner.run(real_spec.generate(reqs))
    loop_runner.run(real_spec.release_groups([r.group_key() for r in reqs]))
    assert [[s.output_ids for s in r.samples] for r in spec] == \
        [[s.output_ids for s in r.samples] for r in base]
    steps = sum(s.decode_steps for r in spec for s in r.samples)
    tokens = sum(len(s.output_ids) for r in spec for s in r.samples)
    assert steps < 0.8 * tokens, "aligned drafts should cut decode steps"


def test_a_weight_push_reaches_the_tied_lm_head(loop_runner, real_plain, real_dir, task,
                                                tmp_path) -> None:
    """SmolLM2 ties its LM head to the embedding, so a pushed checkpoint has no
    `lm_head.weight`. After a push of weights whose embedding changed, vLLM's log-probs must
    be those of transformers on the pushed weights (before the fix in
    `vllm_glue.refresh_tied_head` the CPU engine kept the first head: 0.56 apart)."""
    import shutil

    import torch
    from transformers import LlamaForCausalLM

    pushed = tmp_path / "pushed"
    model = LlamaForCausalLM.from_pretrained(str(real_dir), dtype=torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb.add_(0.02 * torch.randn_like(emb))
    model.save_pretrained(str(pushed))
    shutil.copy2(real_dir / "tokenizer.json", pushed / "tokenizer.json")
    assert model.config.tie_word_embeddings
    prompt = list(task.make_prompts(1, seed=9)[0].input_ids)
    req = GenRequest(input_ids=prompt, n=1, sampling=SamplingParams(
        max_new_tokens=GREEDY_TOKENS, temperature=0.0, ignore_eos=True))
    loop_runner.run(real_plain.update_weights(str(pushed)))
    try:
        s = loop_runner.run(real_plain.generate([req]))[0].samples[0]
    finally:
        loop_runner.run(real_plain.update_weights(str(real_dir)))
    logp = _logprobs(model.eval(), prompt + s.output_ids)
    ref = [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(s.output_ids)]
    worst = max(abs(a - b) for a, b in zip(ref, s.output_logprobs))
    assert worst < 5e-3, f"after the push vLLM's log-probs are {worst} from the pushed weights"
