"""The valid request space against a real speculative engine: drawn batches of legal requests
(every sampling parameter, `tests/valid_space.py`), drafts present for some prompt groups
(pre-generated random or prompt-copied tokens, siblings when n > 1) and absent for others,
all in one batch. Every request completes well formed and the engine stays alive.

`make test` draws a fixed slice (derandomized); `make test-valid-space` draws
`BUBBLESPEC_VALID_EXAMPLES` batches afresh and prints how many requests it ran.
"""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bubblespec.engine import GenRequest
from bubblespec.protocol.sampling import SamplingParams
from tests.engine_fixtures import model_task
from tests.valid_space import examples, prompts, sampling

pytestmark = pytest.mark.engine

LONG = bool(os.environ.get("BUBBLESPEC_VALID_EXAMPLES"))
TALLY = {"batches": 0, "requests": 0, "samples": 0, "seconds": 0.0}


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    print(f"\nvalid space (engine): {TALLY['requests']} requests ({TALLY['samples']} samples) "
          f"in {TALLY['batches']} batches, {TALLY['seconds']:.0f} s, engine deaths 0")


@st.composite
def batches(draw: st.DrawFn, vocab: int, eos: int, bos: int) -> list[tuple[GenRequest, str]]:
    """(request, draft kind) pairs: draft kind none, random, or prompt (copied tokens)."""
    out = []
    for i, ids in enumerate(draw(prompts(vocab, bos, max_size=5))):
        sp = SamplingParams(**draw(sampling(vocab, eos)))
        n = draw(st.integers(1, 4))
        seeds = ([draw(st.integers(0, 2**63 - 1)) for _ in range(n)]
                 if sp.keyed or draw(st.booleans()) else None)
        top = draw(st.sampled_from([0, 0, 1, 5]))
        req = GenRequest(input_ids=ids, n=n, sampling=sp, seeds=seeds, top_logprobs=top,
                         group=f"vs{i}-{draw(st.integers(0, 10**9))}")
        out.append((req, draw(st.sampled_from(["none", "random", "prompt"]))))
    return out


@settings(max_examples=examples(), deadline=None, derandomize=not LONG, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(data=st.data())
def test_drawn_batches_complete_and_the_engine_lives(loop_runner, spec_engine, data) -> None:
    task = model_task()
    vocab = spec_engine.vocab_size
    drawn = data.draw(batches(vocab, task.eos_id, task.bos_id))
    rng = data.draw(st.randoms(use_true_random=False))
    drafts = []
    for req, kind in drawn:
        for j in range(req.n):
            if kind == "random":
                toks = [rng.randrange(vocab) for _ in range(rng.randrange(1, 48))]
            elif kind == "prompt":
                toks = (req.input_ids * 4)[rng.randrange(len(req.input_ids)):][:40]
            else:
                continue
            drafts.append((req.group_key(), j, toks))
    reqs = [r for r, _ in drawn]
    t0 = time.monotonic()
    if drafts:
        loop_runner.run(spec_engine.add_drafts(drafts))
    try:
        res = loop_runner.run(spec_engine.generate(reqs), timeout=300)
    finally:
        if spec_engine.alive:
            loop_runner.run(spec_engine.release_groups([r.group_key() for r in reqs]))
    TALLY["seconds"] += time.monotonic() - t0
    assert spec_engine.alive, f"the engine died on {[r.sampling for r in reqs]}"
    assert len(res) == len(reqs)
    for req, r in zip(reqs, res):
        assert [s.sample_index for s in r.samples] == list(range(req.n))
        for s in r.samples:
            assert 1 <= len(s.output_ids) <= req.sampling.max_new_tokens, req.sampling
            assert all(0 <= t < vocab for t in s.output_ids)
            assert len(s.output_logprobs) == len(s.output_ids)
            assert all(lp <= 1e-4 for lp in s.output_logprobs)
            # error: vLLM ends a sample whose constraint no token satisfies (a legal
            # request: its choice or regex outside allowed_token_ids, say)
            assert s.finish_reason in ("stop", "length") or (
                s.finish_reason == "error" and req.sampling.structured is not None), \
                s.finish_reason
            if s.finish_reason == "length":
                assert len(s.output_ids) == req.sampling.max_new_tokens
            assert s.meta.drafts_off == req.sampling.drafts_off
            if s.meta.drafts_off:  # min_p / logit_bias: decoded without drafts
                assert s.meta.num_draft_tokens == 0
            if req.top_logprobs:
                assert s.top_logprobs is not None and len(s.top_logprobs) == len(s.output_ids)
    TALLY["batches"] += 1
    TALLY["requests"] += len(reqs)
    TALLY["samples"] += sum(r.n for r in reqs)
