"""The proposer's per-step choice among draft sources, on a real engine: the right
pre-generated response is drafted (aligned or through the group index), every source's counters add up to the
accepted tokens (up to the tokens cut at max_new_tokens), no draft exceeds k, and the outputs stay those of greedy decoding."""

from __future__ import annotations

import random

import pytest

from bubblespec.engine import GenRequest
from bubblespec.protocol.sampling import SamplingParams
from bubblespec.tasks import default_task

pytestmark = pytest.mark.engine

SOURCES = ("aligned", "group", "global")


def test_source_counters_add_up_and_the_aligned_draft_wins(loop_runner, spec_engine) -> None:
    prompts = default_task().make_prompts(3, 91)
    sp = SamplingParams(max_new_tokens=48, temperature=0.0, ignore_eos=True)
    reqs = [GenRequest(input_ids=list(p.input_ids), n=2, sampling=sp) for p in prompts]
    base = loop_runner.run(spec_engine.generate(reqs))
    loop_runner.run(spec_engine.release_groups([r.group_key() for r in reqs]))
    rng = random.Random(3)
    drafts = []
    for r, res in zip(reqs, base):  # sample 0: its own output; sample 1: noise
        drafts.append((r.group_key(), 0, res.samples[0].output_ids))
        drafts.append((r.group_key(), 1, [rng.randrange(spec_engine.vocab_size)
                                          for _ in range(48)]))
    loop_runner.run(spec_engine.source_stats(reset=True))
    loop_runner.run(spec_engine.add_drafts(drafts))
    again = loop_runner.run(spec_engine.generate(reqs))
    loop_runner.run(spec_engine.release_groups([r.group_key() for r in reqs]))
    src = loop_runner.run(spec_engine.source_stats(reset=True))
    for b, a in zip(base, again):
        for sb, sa in zip(b.samples, a.samples):
            assert sa.output_ids == sb.output_ids
    k = spec_engine.cfg.num_speculative_tokens
    accepted = sum(s.num_accepted_tokens for r in again for s in r.samples)
    # the proposer also counts tokens accepted in a request's last step past max_new_tokens,
    # which vLLM then cuts from the output: at most k - 1 per request
    n_req = sum(len(r.samples) for r in again)
    assert accepted <= sum(src[f"{s}_accepted"] for s in SOURCES) <= accepted + (k - 1) * n_req
    for s in SOURCES:
        assert src[f"{s}_drafted"] <= k * src[f"{s}_wins"]
        assert src[f"{s}_accepted"] <= src[f"{s}_drafted"]
    # the right response is also in the group index (pushed) and in the global pool (the
    # first run's outputs), whose counts claim certainty: every source drafts it, and with
    # greedy decoding both samples of a prompt follow it
    assert src["aligned_wins"] > 0
    assert accepted >= 6 * 35  # of ~6 x 47 available
    assert loop_runner.run(spec_engine.source_stats()) == dict.fromkeys(src, 0)
