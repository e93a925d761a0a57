"""Drafts with token ids outside the vocabulary never reach the model: the engine drops them
before they enter the draft index, and the proposer (inside vLLM's engine core) drops them
again for any other caller; either way the next batch decodes exactly as without them."""

from __future__ import annotations

import pytest

from bubblespec.engine import GenRequest
from bubblespec.protocol.keys import group_token
from bubblespec.protocol.sampling import SamplingParams
from bubblespec.tasks import default_task

pytestmark = pytest.mark.engine


def _requests(prompts: list, group: str) -> list[GenRequest]:
    sp = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
    return [GenRequest(input_ids=list(p.input_ids), n=2, sampling=sp, group=f"{group}{i}")
            for i, p in enumerate(prompts)]


def _outputs(results: list) -> list[list[list[int]]]:
    return [[s.output_ids for s in r.samples] for r in results]


def test_out_of_vocab_drafts_are_dropped_and_decoding_is_unchanged(loop_runner,
                                                                   spec_engine) -> None:
    eng = spec_engine
    prompts = default_task().make_prompts(2, 61)
    want = _outputs(loop_runner.run(eng.generate(_requests(prompts, "clean"))))
    v = eng.vocab_size
    hostile = [[v], [1, 2, v + 10**6], [2**31 - 1], [-1, 3]]
    good = want[0][0]  # a correct draft for sample 0 of prompt 0 (must still be used)
    items = [(f"bad{i}", s, ids) for i in range(2) for s, ids in enumerate(hostile)]
    dropped = eng.drafts_dropped
    added = loop_runner.run(eng.add_drafts([*items, ("bad0", 0, good)]))
    assert added == len(good) and eng.drafts_dropped == dropped + len(items)
    # straight into the proposer (what the engine's own check would stop): dropped there
    raw = [(group_token(f"bad{i}"), s, ids) for i in range(2) for s, ids in enumerate(hostile)]
    assert loop_runner.run(eng.llm.collective_rpc("bubblespec_add_drafts", args=(raw,))) == [0]
    stats = loop_runner.run(eng.llm.collective_rpc("bubblespec_index_stats"))[0]
    assert stats["drafts_dropped"] >= len(raw)
    res = loop_runner.run(eng.generate(_requests(prompts, "bad")))
    assert _outputs(res) == want
    assert res[0].samples[0].num_accepted_tokens > 0  # the good draft was still drafted
    loop_runner.run(eng.release_groups(["bad0", "bad1", "clean0", "clean1"]))
