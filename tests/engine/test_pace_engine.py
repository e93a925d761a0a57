"""A paced engine on a real vLLM engine: every forward (prefill, decode, verification of
drafts) is counted and lasts at least its paced time, the KV cache sized in MiB and the
worker inside the engine-core process start, and
pacing does not change the tokens (keyed sampling is bit-identical paced or not)."""

from __future__ import annotations

import time

import pytest

from bubblespec.engine import GenRequest
from bubblespec.protocol.sampling import SamplingParams
from bubblespec.tasks import default_task
from tests.engine_fixtures import start_engine

pytestmark = pytest.mark.engine


def _requests(n_prompts: int, max_new: int) -> list[GenRequest]:
    sp = SamplingParams(max_new_tokens=max_new, temperature=1.0, ignore_eos=True,
                        seed_mode="keyed")
    return [GenRequest(input_ids=list(p.input_ids), n=2, sampling=sp, seeds=[7 * i, 7 * i + 1])
            for i, p in enumerate(default_task().make_prompts(n_prompts, 3))]


def test_paced_engine_counts_and_paces_every_forward(loop_runner, spec_engine) -> None:
    eng = start_engine(loop_runner, spec_mode="bubblespec", num_speculative_tokens=8,
                       pace="h100", pace_scale=4.0, kv_cache_mib=64,
                       engine_in_one_process=True)
    try:
        assert loop_runner.run(eng.pace_stats())["forwards"] == 0
        t0 = time.monotonic()
        res = loop_runner.run(eng.generate(_requests(3, 40)))
        wall = time.monotonic() - t0
        st = loop_runner.run(eng.pace_stats())
        samples = [s for r in res for s in r.samples]
        # one forward per decode step of the batch at least (the prefill may be its own)
        assert st["forwards"] >= max(s.decode_steps for s in samples)
        assert st["profile"] == "h100" and st["scale"] == 4.0
        assert st["prefill_tokens"] >= sum(len(r.input_ids) for r in _requests(3, 40)) // 2
        assert st["decode_tokens"] >= sum(len(s.output_ids) for s in samples) - len(samples)
        assert st["draft_tokens"] <= sum(s.num_draft_tokens for s in samples)
        # each forward lasts max(real, paced): the batch took at least the paced time
        assert wall >= 0.95 * st["paced_s"]
        assert st["real_s"] <= st["paced_s"] + st["overrun_s"] + 1e-6
        assert st["modelled_s"] == pytest.approx(st["paced_s"] / 4.0)
        # the proposer's own time was measured inside the forwards and charged on top
        assert 0 < st["drafting_s"] < st["modelled_s"]
        assert st["charged_s"] == pytest.approx(st["drafting_s"])
        # the same keyed tokens as an unpaced engine
        ref = loop_runner.run(spec_engine.generate(_requests(3, 40)))
        assert [[s.output_ids for s in r.samples] for r in res] == \
            [[s.output_ids for s in r.samples] for r in ref]
    finally:
        loop_runner.run(eng.shutdown())
