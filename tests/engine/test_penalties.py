"""Penalties, min_tokens, allowed_token_ids and bad_words under speculation, on real engines.

vLLM 0.32 applies the repetition, presence and frequency penalties to the logits that
verification uses (each drafted position sees the output so far plus the drafts before it,
`RejectionSampler.apply_logits_processors`) and to the bonus token's (`Sampler`, outputs plus
every draft), masks the stop tokens of a response short of `min_tokens` at each drafted
position (`MinTokensLogitsProcessor.apply_with_spec_decode`), and masks the tokens outside
`allowed_token_ids` and those completing a bad word (outputs plus the drafts before each
position) there too; the keyed sampler draws from those same processed logits. So such a request is as exact with speculation as without:
greedy ids and keyed samples are identical with speculation on and off, drafts right or
wrong. Each case has its negative control: the same requests without the parameter sample
differently (else the test would not exercise it).
"""

from __future__ import annotations

import random

import pytest

from bubblespec.engine import GenRequest
from bubblespec.protocol.sampling import SamplingParams
from bubblespec.tasks import default_task

pytestmark = pytest.mark.engine

PENALTY = 1.3
CASES = {"repetition_penalty": {"repetition_penalty": PENALTY},
         "presence_penalty": {"presence_penalty": 1.5},
         "frequency_penalty": {"frequency_penalty": 1.0},
         "min_tokens": {"min_tokens": 60},
         # the eos, separators and single digits only (the model's answers use larger
         # numbers), and two of its frequent tokens banned
         "allowed_token_ids": {"allowed_token_ids": tuple(range(2, 18))},
         "bad_words": {"bad_words": ("7", ";")}}
"""Each parameter at a value that changes the embedded model's outputs."""
OFF = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
       "min_tokens": 0, "allowed_token_ids": (), "bad_words": ()}


def _ids(results: list) -> list[list[list[int]]]:
    return [[s.output_ids for s in r.samples] for r in results]


def _reqs(sp: SamplingParams, n: int, seeded: bool = False) -> list[GenRequest]:
    prompts = default_task().make_prompts(6, seed=53)
    return [GenRequest(input_ids=list(p.input_ids), n=n, sampling=sp,
                       seeds=[100 * i + j for j in range(n)] if seeded else None)
            for i, p in enumerate(prompts)]


def _spec_run(runner, spec_engine, reqs: list[GenRequest], base: list) -> list:
    """Speculative run with drafts: the plain outputs for even samples, random for odd."""
    rng = random.Random(5)
    drafts = []
    for r, res in zip(reqs, base):
        for s in res.samples:
            good = s.output_ids
            wrong = [rng.randrange(spec_engine.vocab_size) for _ in good]
            drafts.append((r.group_key(), s.sample_index, wrong if s.sample_index % 2 else good))
    runner.run(spec_engine.add_drafts(drafts))
    out = runner.run(spec_engine.generate(reqs))
    runner.run(spec_engine.release_groups([r.group_key() for r in reqs]))
    assert sum(s.num_accepted_tokens for r in out for s in r.samples) > 0
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_penalised_identical_with_speculation(loop_runner, plain_engine,
                                                     spec_engine, case: str) -> None:
    eos = default_task().eos_id
    sp = SamplingParams(max_new_tokens=160, temperature=0.0, stop_token_ids=[eos],
                        **CASES[case])
    reqs = _reqs(sp, n=2)
    base = loop_runner.run(plain_engine.generate(reqs))
    assert _ids(_spec_run(loop_runner, spec_engine, reqs, base)) == _ids(base)
    if case in ("repetition_penalty", "min_tokens", "allowed_token_ids", "bad_words"):
        # the others move greedy ids of the embedded model too little to flip them (the
        # keyed test has their controls)
        unpenalised = _reqs(sp.model_copy(update={case: OFF[case]}), n=2)
        assert _ids(loop_runner.run(plain_engine.generate(unpenalised))) != _ids(base), \
            f"{case} changed nothing: the test would not exercise it"


@pytest.mark.parametrize("case", sorted(CASES))
def test_keyed_penalised_identical_with_speculation(loop_runner, plain_engine,
                                                    spec_engine, case: str) -> None:
    sp = SamplingParams(max_new_tokens=160, temperature=1.0,
                        stop_token_ids=[default_task().eos_id], seed_mode="keyed",
                        **CASES[case])
    reqs = _reqs(sp, n=2, seeded=True)
    base = loop_runner.run(plain_engine.generate(reqs))
    assert _ids(_spec_run(loop_runner, spec_engine, reqs, base)) == _ids(base)
    if case == "min_tokens":
        assert all(len(s.output_ids) >= 60 for r in base for s in r.samples)
    kept = {"allowed_token_ids": lambda t: 2 <= t < 18,
            "bad_words": lambda t: t not in (15, 7)}.get(case)  # "7" is 15, ";" is 7
    if kept is not None:
        assert all(kept(t) for r in base for s in r.samples for t in s.output_ids)
    unpenalised = _reqs(sp.model_copy(update={case: OFF[case]}), n=2, seeded=True)
    assert _ids(loop_runner.run(plain_engine.generate(unpenalised))) != _ids(base)

