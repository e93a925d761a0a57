"""Seeded requests whose prompts are prefilled in chunks (a batch larger than one step's
token budget): vLLM rewinds such a request's generator after each partial step, which a
CPU generator does not support; before `vllm_glue.install_cpu_generator_rewind` the first
chunked seeded request killed the engine core (found sampling 64 prompts x 4 on the real
model). Every request must complete, plain and speculative, with and without speculation
drafts; without speculation the same batch must sample the same tokens twice (the rewind
restores the generator: a discarded draw leaves no trace; with speculation a plain seeded
sample depends on the drafts, which the first run's responses change)."""

from __future__ import annotations

import random

import pytest

from bubblespec.engine import GenRequest
from bubblespec.protocol.sampling import SamplingParams

pytestmark = pytest.mark.engine


def _chunking_batch(engine, seed: int) -> list[GenRequest]:
    """Distinct long prompts whose total is three step budgets: some prompt is chunked."""
    budget = int(engine.llm.vllm_config.scheduler_config.max_num_batched_tokens)
    length = 300
    rng = random.Random(seed)
    count = 3 * budget // length + 1
    return [GenRequest(input_ids=[rng.randrange(3, 200) for _ in range(length)], n=2,
                       seeds=[seed * 1000 + 2 * i, seed * 1000 + 2 * i + 1],
                       sampling=SamplingParams(max_new_tokens=6, temperature=1.0,
                                               top_k=20 if i % 2 else -1))
            for i in range(count)]


@pytest.mark.parametrize("which", ["plain_engine", "spec_engine"])
def test_seeded_requests_chunked_in_prefill_complete_and_repeat(loop_runner, which,
                                                                request) -> None:
    engine = request.getfixturevalue(which)
    reqs = _chunking_batch(engine, seed=3)
    first = loop_runner.run(engine.generate(reqs))
    assert engine.alive
    assert all(1 <= len(s.output_ids) <= 6 for r in first for s in r.samples)
    if which == "spec_engine":
        return
    again = loop_runner.run(engine.generate(reqs))
    assert [[s.output_ids for s in r.samples] for r in again] == \
        [[s.output_ids for s in r.samples] for r in first]
