"""The proposer's per-step choice among draft sources, on a real engine: the right
pre-generated response is drafted (aligned or through the group index), every source's counters add up to the
accepted tokens (up to the tokens cut at max_new_tokens), no draft exceeds k, and the outputs stay those of greedy decoding."""

from __future__ import annotations

import random

import pytest

from bubblespec.core.sources import DEFAULT_SOURCES
from bubblespec.engine import GenRequest
from bubblespec.protocol.rank import DraftIndexBody
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


def _run(loop_runner, eng, reqs, **sources) -> tuple[list, dict, dict, dict]:
    """One batch with siblings and no pre-generated drafts, plus `sources` (those among
    self, global and global_live that are True; defer_appends apart): (results, drafter
    counters, index stats before and after the release)."""
    defer = sources.pop("defer_appends", False)
    loop_runner.run(eng.set_sources(["siblings", *(s for s, on in sources.items() if on)],
                                    defer_appends=defer))
    loop_runner.run(eng.source_stats(reset=True))
    res = loop_runner.run(eng.generate(reqs))
    src = loop_runner.run(eng.source_stats(reset=True))
    before = loop_runner.run(eng.index_stats())
    loop_runner.run(eng.release_groups([r.group_key() for r in reqs]))
    return res, src, before, loop_runner.run(eng.index_stats())


def _both(loop_runner, eng, reqs, first: dict, second: dict) -> list[tuple[dict, dict, dict]]:
    """`reqs` under two source settings (`_run`), their outputs required identical, then the
    shared engine fixture's sources restored: per setting (source counters, index stats
    before and after the release)."""
    try:
        runs = [_run(loop_runner, eng, reqs, **first), _run(loop_runner, eng, reqs, **second)]
    finally:
        loop_runner.run(eng.set_sources(DEFAULT_SOURCES, defer_appends=False))
    outs = [[s.output_ids for r in res for s in r.samples] for res, *_ in runs]
    assert outs[0] == outs[1]
    return [tuple(rest) for _, *rest in runs]


def test_live_outputs_in_the_global_pool_draft_other_prompts(loop_runner, spec_engine) -> None:
    """The `global_live` source: the global pool holds the responses still being generated, so a
    request drafts from other prompts' live outputs; without it the pool holds finished
    responses only, and fills only as the batch's requests end.
    Greedy outputs are the same either way, and the finished outputs stay in the pool
    after their prompts' batch is released."""
    prompts = default_task().make_prompts(6, 92)
    sp = SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True)
    reqs = [GenRequest(input_ids=list(p.input_ids), n=1, sampling=sp) for p in prompts]
    pool = {"self": False, "global": True}
    (src_off, _, _), (src_on, _, idx) = _both(loop_runner, spec_engine, reqs,
                                               {**pool, "global_live": False},
                                               {**pool, "global_live": True})
    print("global pool, finished only:", src_off, "with live outputs:", src_on)
    # finished-only, the pool fills only as requests end (drafts end some early)
    assert src_on["global_wins"] > 2 * src_off["global_wins"]
    assert src_on["global_accepted"] > src_off["global_accepted"]
    assert idx["global_tokens"] >= 6 * 40  # kept after the release


def test_deferred_appends_draft_from_siblings_and_lose_no_token(loop_runner,
                                                                spec_engine) -> None:
    """`defer_appends`: each step's emitted tokens reach the index after its drafts, on
    the proposer's worker thread. Siblings still draft from each other, the index ends up
    with every token (the last step's appends are waited for), and keyed samples at T=1
    are bit-identical to those drafted with the appends inside the step."""
    prompts = default_task().make_prompts(3, 93)
    sp = SamplingParams(max_new_tokens=40, temperature=1.0, ignore_eos=True,
                        seed_mode="keyed")
    reqs = [GenRequest(input_ids=list(p.input_ids), n=4, sampling=sp,
                       seeds=[11 * i + j for j in range(4)]) for i, p in enumerate(prompts)]
    own = {"self": True, "global": False}
    (src_now, idx_now, _), (src_later, idx_later, _) = _both(
        loop_runner, spec_engine, reqs, {**own, "defer_appends": False},
        {**own, "defer_appends": True})
    print("appends in the step:", src_now, "deferred:", src_later)
    assert idx_later["tokens"] == idx_now["tokens"] and idx_later["append_errors"] == 0
    # every figure the proposer reports is one of the rank's GET /v1/draft_index body
    assert DraftIndexBody.model_validate(idx_later).append_errors == 0
    assert src_later["group_wins"] > 0 and src_later["group_accepted"] > 0
