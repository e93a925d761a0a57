"""Structured output (`SamplingParams.structured`) under speculation, on real engines.

vLLM masks every token a constraint forbids in the logits of each sampled and each verified
position (its grammar bitmask covers the drafted positions) and its scheduler drops the
drafted tokens the constraint forbids, so the keyed sampler and verifier draw from the
constrained distribution with drafts as without: greedy ids and keyed samples must be
identical with speculation on and off, drafts right and wrong, in batches with requests
without a constraint, and every output must satisfy its constraint. The negative control:
the same requests without the constraint sample other tokens.
"""

from __future__ import annotations

import math
import random
import re

import pytest

from bubblespec.engine import GenRequest
from bubblespec.protocol.errors import InvalidRequest
from bubblespec.protocol.sampling import SamplingParams
from bubblespec.tasks import default_task

pytestmark = pytest.mark.engine

CHOICES = ("9", "34", "123")


def _task_constraints(task) -> list[dict]:
    """Constraints the embedded model's word-level vocabulary can express (its tokens carry
    no spaces, so neither do these): a choice among digit strings, a regex over them."""
    return [{"choice": list(CHOICES)}, {"regex": "[0-9]{1,2}(1[0-9])+"}]


def _reqs(sps: list[SamplingParams], seeded: bool) -> list[GenRequest]:
    prompts = default_task().make_prompts(len(sps), seed=77)
    return [GenRequest(input_ids=list(p.input_ids), n=2, sampling=sp,
                       seeds=[50 * i + j for j in range(2)] if seeded else None)
            for i, (p, sp) in enumerate(zip(prompts, sps))]


def _ids(results: list) -> list[list[list[int]]]:
    return [[s.output_ids for s in r.samples] for r in results]


def _with_drafts(runner, engine, reqs: list[GenRequest], base: list) -> list:
    rng = random.Random(13)
    drafts = []
    for r, res in zip(reqs, base):
        for s in res.samples:
            wrong = [rng.randrange(engine.vocab_size) for _ in range(12)]
            drafts.append((r.group_key(), s.sample_index,
                           wrong if s.sample_index % 2 else s.output_ids + wrong))
    runner.run(engine.add_drafts(drafts))
    try:
        return runner.run(engine.generate(reqs))
    finally:
        runner.run(engine.release_groups([r.group_key() for r in reqs]))


def _satisfied(task, sp: SamplingParams, ids: list[int]) -> bool:
    body = ids[:-1] if ids and ids[-1] == task.eos_id else ids
    text = "".join(task.decode([t], skip_special=False) for t in body)
    c = sp.structured
    if c is None:
        return True
    if c.choice is not None:
        return text in c.choice
    return re.fullmatch(c.regex or "", text) is not None


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_constrained_outputs_identical_with_speculation(loop_runner, plain_engine,
                                                        spec_engine, temperature) -> None:
    task = default_task()
    base_sp = SamplingParams(max_new_tokens=24, temperature=temperature,
                             stop_token_ids=[task.eos_id],
                             seed_mode="keyed" if temperature else "default")
    cons = _task_constraints(task)
    sps = [SamplingParams.model_validate({**base_sp.model_dump(), "structured": c})
           for c in cons] + [base_sp, base_sp]
    reqs = _reqs(sps, seeded=temperature > 0)
    base = loop_runner.run(plain_engine.generate(reqs))
    out = _with_drafts(loop_runner, spec_engine, reqs, base)
    assert _ids(out) == _ids(base)
    for sp, r in zip(sps, out):
        for s in r.samples:
            assert _satisfied(task, sp, s.output_ids), (sp.structured, s.output_ids)
    assert sum(s.num_accepted_tokens for r in out for s in r.samples) > 0
    free = _ids(loop_runner.run(plain_engine.generate(_reqs([base_sp] * len(sps),
                                                            seeded=temperature > 0))))
    assert all(_ids(base)[i] != free[i] for i in range(len(cons))), \
        "a constraint changed nothing: the test would not exercise it"


def test_a_constraint_the_backend_cannot_build_is_refused(spec_engine) -> None:
    sp = SamplingParams(structured={"grammar": "root ::= (((("})
    with pytest.raises(InvalidRequest) as e:
        spec_engine.validate(GenRequest(input_ids=[1, 2, 3], sampling=sp))
    assert e.value.field == "sampling_params.structured"


def test_a_constraint_no_token_satisfies_ends_well_formed(loop_runner, spec_engine) -> None:
    """A legal request whose constraint leaves no token (a choice outside the allowed
    tokens): vLLM masks every token and samples from nothing; the sample ends, its
    log-probs are numbers (MIN_LOGPROB, as vLLM's server sends -inf, never NaN: JSON has
    neither), and the engine serves the next request."""
    from bubblespec.protocol.limits import MIN_LOGPROB

    task = default_task()
    sp = SamplingParams(max_new_tokens=4, temperature=1.0, stop_token_ids=[task.eos_id],
                        structured={"choice": ["9"]}, allowed_token_ids=(8,))
    (r,) = loop_runner.run(spec_engine.generate([GenRequest(input_ids=[1, 10, 4, 11, 6],
                                                            sampling=sp, seeds=[1])]))
    lps = r.samples[0].output_logprobs
    assert lps and not any(math.isnan(lp) for lp in lps) and min(lps) >= MIN_LOGPROB
    assert spec_engine.alive
    ok = loop_runner.run(spec_engine.generate(_reqs([SamplingParams(max_new_tokens=4)], False)))
    assert ok[0].samples[0].output_ids
