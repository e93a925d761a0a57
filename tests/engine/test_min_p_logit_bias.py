"""min_p and logit_bias on a speculating engine, against vLLM's own engine without speculation.

vLLM 0.32 loads neither processor in an engine that speculates and its rejection sampler
applies neither to drafted positions. bubblespec loads vLLM's own processors into every
engine (`vllm_glue.install_min_p_and_logit_bias`), so its sampler applies them to each token
it draws itself, and the proposer gives such requests no drafts (`drafts_off`). The
reference is the engine without speculation (`plain_engine`), where vLLM builds both
processors itself: greedy ids and keyed samples of such requests must be identical with
speculation, in one batch with requests that do speculate (drafts right and wrong), and
their counters must show no drafts. Each case has its negative control: without the field
the outputs differ, so the test exercises it (a speculating engine that ignored the field,
vLLM's own behaviour, would fail).
"""

from __future__ import annotations

import random

import pytest

from bubblespec.engine import GenRequest
from bubblespec.protocol.sampling import SamplingParams
from bubblespec.tasks import default_task

pytestmark = pytest.mark.engine

N_PROMPTS = 6


def _ids(results: list) -> list[list[list[int]]]:
    return [[s.output_ids for s in r.samples] for r in results]


def _reqs(sps: list[SamplingParams], seeded: bool) -> list[GenRequest]:
    prompts = default_task().make_prompts(N_PROMPTS, seed=71)
    return [GenRequest(input_ids=list(p.input_ids), n=2, sampling=sp,
                       seeds=[100 * i + j for j in range(2)] if seeded else None)
            for i, (p, sp) in enumerate(zip(prompts, sps))]


def _with_drafts(runner, engine, reqs: list[GenRequest], base: list) -> list:
    """The speculative run, every sample given a draft: the reference output for even
    samples, random tokens for odd ones."""
    rng = random.Random(9)
    drafts = []
    for r, res in zip(reqs, base):
        for s in res.samples:
            wrong = [rng.randrange(engine.vocab_size) for _ in s.output_ids]
            drafts.append((r.group_key(), s.sample_index,
                           wrong if s.sample_index % 2 else s.output_ids))
    runner.run(engine.add_drafts(drafts))
    try:
        return runner.run(engine.generate(reqs))
    finally:
        runner.run(engine.release_groups([r.group_key() for r in reqs]))


def _check(runner, plain, spec, sps: list[SamplingParams], seeded: bool) -> list:
    """Run `sps` (one per prompt) on both engines; identical ids, and the requests with
    min_p or logit_bias undrafted while the others speculate."""
    reqs = _reqs(sps, seeded)
    base = runner.run(plain.generate(reqs))
    out = _with_drafts(runner, spec, reqs, base)
    assert _ids(out) == _ids(base)
    for sp, res in zip(sps, out):
        for s in res.samples:
            assert s.meta.drafts_off == sp.drafts_off
            if sp.drafts_off:
                assert s.meta.num_draft_tokens == 0 and s.meta.decode_steps == len(s.output_ids)
    others = [s for sp, r in zip(sps, out) if not sp.drafts_off for s in r.samples]
    assert sum(s.meta.num_accepted_tokens for s in others) > 0  # the batch did speculate
    return base


def _with(sp: SamplingParams, **fields: object) -> SamplingParams:
    return SamplingParams.model_validate({**sp.model_dump(), **fields})


def _first_tokens(runner, plain, sp: SamplingParams) -> list[int]:
    res = runner.run(plain.generate(_reqs([sp] * N_PROMPTS, seeded=False)))
    return [r.samples[0].output_ids[0] for r in res]


def test_greedy_logit_bias_and_min_p_identical_with_speculation(loop_runner, plain_engine,
                                                               spec_engine) -> None:
    eos = default_task().eos_id
    sp = SamplingParams(max_new_tokens=48, temperature=0.0, stop_token_ids=[eos])
    first = _first_tokens(loop_runner, plain_engine, sp)
    # even prompts: their greedy first token banned (-100) and another favoured (+3); odd
    # prompts speculate, but prompt 1 has min_p (greedy: its ids stay, its drafts go)
    sps = [_with(sp, logit_bias={first[i]: -100.0, (first[i] + 1) % 50: 3.0})
           if i % 2 == 0 else sp for i in range(N_PROMPTS)]
    sps[1] = _with(sp, min_p=0.3)
    base = _check(loop_runner, plain_engine, spec_engine, sps, seeded=False)
    for i in range(0, N_PROMPTS, 2):  # the bias did change the output
        assert all(s.output_ids[0] != first[i] for s in base[i].samples)


def test_keyed_min_p_and_logit_bias_identical_with_speculation(loop_runner, plain_engine,
                                                              spec_engine) -> None:
    eos = default_task().eos_id
    sp = SamplingParams(max_new_tokens=48, temperature=1.0, stop_token_ids=[eos],
                        seed_mode="keyed")
    free = _ids(loop_runner.run(plain_engine.generate(_reqs([sp] * N_PROMPTS, seeded=True))))
    # prompt 2 bans the first token its samples drew unbiased, prompt 4 too, with min_p
    sps = [_with(sp, **extra) for extra in (
        {"min_p": 0.3}, {}, {"logit_bias": {free[2][0][0]: -100.0, 7: 1.5}}, {},
        {"min_p": 0.1, "logit_bias": {free[4][1][0]: -100.0}}, {})]
    base = _ids(_check(loop_runner, plain_engine, spec_engine, sps, seeded=True))
    for i in (0, 2, 4):  # negative control: the same seeds without the fields differ
        assert base[i] != free[i], f"prompt {i}: the field changed nothing"


def test_extra_args_path_is_vllms_own_meaning(loop_runner, plain_engine) -> None:
    """On the engine without speculation, where vLLM takes min_p and logit_bias as fields,
    the extra-args path gives the same tokens as vLLM's own (greedy with a bias; vLLM's
    seeded sampler with min_p and a bias), so the speculating engine's reference is vLLM's
    meaning, not bubblespec's reading of it."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.sampling_params import RequestOutputKind

    from bubblespec.engine.sampling import vllm_sampling

    eos = default_task().eos_id
    prompts = default_task().make_prompts(3, seed=72)
    cases = [SamplingParams(max_new_tokens=32, temperature=0.0, stop_token_ids=[eos],
                            logit_bias={5: 4.0, 9: -100.0}),
             SamplingParams(max_new_tokens=32, temperature=1.0, stop_token_ids=[eos],
                            min_p=0.2, logit_bias={4: 2.0})]

    async def run(params: object, ids: list[int], rid: str) -> list[int]:
        out: list[int] = []
        async for o in plain_engine.llm.generate({"prompt_token_ids": ids}, params,
                                                 request_id=rid):
            out.extend(o.outputs[0].token_ids)
        return out

    for c, sp in enumerate(cases):
        changed = False
        for j, p in enumerate(prompts):
            ids = list(p.input_ids)
            ours = vllm_sampling(sp, seed=11 + j)
            free = vllm_sampling(_with(sp, min_p=0.0, logit_bias={}), seed=11 + j)
            native = VllmSamplingParams(
                n=1, temperature=sp.temperature, max_tokens=sp.max_new_tokens,
                stop_token_ids=list(sp.stop_token_ids), seed=11 + j, min_p=sp.min_p,
                logit_bias=dict(sp.logit_bias), detokenize=False,
                output_kind=RequestOutputKind.DELTA)
            a = loop_runner.run(run(ours, ids, f"extra-{c}-{j}"))
            b = loop_runner.run(run(native, ids, f"native-{c}-{j}"))
            assert a == b and a, (c, j)
            changed |= a != loop_runner.run(run(free, ids, f"free-{c}-{j}"))
        assert changed, f"case {c}: the fields changed nothing"
