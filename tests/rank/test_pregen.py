"""The rank's pre-generation loop (`bubblespec/rank/pregen.py`) on a real engine and a real
synchronizer: lanes refill from the queue, drafts are exactly what the real rollout would
sample with the same keyed seeds, and the stop signal (or the close, in the training
window) ends it with partial drafts pushed."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from itertools import pairwise
from typing import Any

import pytest

from bubblespec.core.branch_margin import FlipWindow
from bubblespec.engine.types import GenRequest
from bubblespec.protocol.domain import PregenTask
from bubblespec.protocol.sampling import PregenWindow, SamplingParams
from bubblespec.rank.branches import branch_request, offers
from bubblespec.rank.pregen import Pregenerator, task_draft, task_request
from bubblespec.tasks import default_task
from bubblespec.tasks.addchain import MAX_STEPS

from ..synchronizer.helpers import eventually, open_with_idle_ranks, serving

pytestmark = pytest.mark.engine

KEYED = SamplingParams(temperature=1.0, seed_mode="keyed")


def tasks_for(prompts: list[Any], samples: int, max_new_tokens: int) -> list[PregenTask]:
    keyed = KEYED.model_copy(update={"max_new_tokens": max_new_tokens})
    return [PregenTask(f"q{i}", list(p.input_ids), s, seed=7919 * i + s, sampling=keyed)
            for i, p in enumerate(prompts) for s in range(samples)]


def direct(t: PregenTask) -> GenRequest:
    return GenRequest(input_ids=list(t.prompt_token_ids), n=1, seeds=[t.seed],
                      sample_offset=t.sample_index, group=f"direct-{t.prompt_key}",
                      sampling=SamplingParams(max_new_tokens=t.max_new_tokens, temperature=1.0,
                                              seed_mode="keyed"))


def test_lanes_drain_the_queue_with_exact_drafts(loop_runner: Any, spec_engine: Any) -> None:
    task = default_task()
    tasks = tasks_for(task.make_prompts(3, 5), 2, 40)

    async def go() -> None:
        async with serving(rank_timeout_s=120.0) as (_, sync):
            for r in ("fast", "slow"):
                await sync.register(r, r)
            await sync.open_step(0, {"fast": 1, "slow": 1}, tasks)
            await sync.report_done(0, "fast")
            out = await Pregenerator(spec_engine, sync, "fast", 0, inflight=4, poll_every=4,
                                     local_stop=asyncio.Event()).run()
            assert (out.tasks, out.complete, out.stopped) == (6, 6, False)
            assert [k for k, *_ in out.spans()] == ["pregen"]
            stored = {(d.prompt_key, d.sample_index): list(d.token_ids)
                      for d in await sync.fetch_drafts(1, sorted({t.prompt_key for t in tasks}))}
            assert out.pushed_tokens == out.tokens == sum(map(len, stored.values()))
            again = await spec_engine.generate([direct(t) for t in tasks])
            for t, g in zip(tasks, again):  # keyed: the draft is the rollout's exact sample
                assert stored[(t.prompt_key, t.sample_index)] == g.samples[0].output_ids

    loop_runner.run(go())


def test_a_bubble_goes_on_to_later_steps_and_refreshes_stale_drafts(loop_runner: Any,
                                                                    spec_engine: Any) -> None:
    """Tasks handed for steps 1 and 2: one bubble drafts both (each pushed for its step, each
    the rollout's exact keyed sample). Handed step 2 again after a weight push, the stored
    drafts come back as refreshes: the engine is given the old draft, so the refresh decodes
    the same tokens mostly from it (the aligned source's accepted tokens)."""
    import dataclasses

    task = default_task()
    near = tasks_for(task.make_prompts(2, 21), 1, 40)
    far = [dataclasses.replace(t, prompt_key=f"f{t.prompt_key}", step=2)
           for t in tasks_for(task.make_prompts(2, 22), 2, 40)]

    async def go() -> None:
        async with serving(rank_timeout_s=120.0) as (_, sync):
            for r in ("fast", "slow"):
                await sync.register(r, r)
            await sync.open_step(0, {"fast": 1, "slow": 1}, near + far, weight_version=0)
            await sync.report_done(0, "fast")
            out = await Pregenerator(spec_engine, sync, "fast", 0, inflight=2, poll_every=4,
                                     local_stop=asyncio.Event()).run()
            assert (out.tasks, out.complete, out.refreshed) == (6, 6, 0)
            got1 = await sync.fetch_drafts(1, sorted({t.prompt_key for t in near}))
            got2 = await sync.fetch_drafts(2, sorted({t.prompt_key for t in far}))
            assert (len(got1), len(got2)) == (2, 4)
            stored = {(d.prompt_key, d.sample_index): list(d.token_ids) for d in got2}
            again = await spec_engine.generate([direct(t) for t in far])
            for t, g in zip(far, again):
                assert stored[(t.prompt_key, t.sample_index)] == g.samples[0].output_ids
            await sync.report_done(0, "slow")
            # step 1, after a weight push (version 1 at the synchronizer; the engine's
            # weights are the same, so every old token is accepted)
            await sync.open_step(1, {"fast": 1, "slow": 1}, far, weight_version=1)
            await sync.report_done(1, "fast")
            await spec_engine.source_stats(reset=True)
            out = await Pregenerator(spec_engine, sync, "fast", 1, inflight=2, poll_every=4,
                                     local_stop=asyncio.Event()).run()
            src = await spec_engine.source_stats()
            assert (out.tasks, out.complete, out.refreshed) == (4, 4, 4)
            after = {(d.prompt_key, d.sample_index): list(d.token_ids)
                     for d in await sync.fetch_drafts(2, sorted({t.prompt_key for t in far}))}
            assert after == stored
            # each refresh is given its old draft: a forward accepts up to k = 8 of its
            # tokens and samples one more, so about 8 of every 9 tokens come from it (a
            # refresh costs ~1/9 of the forwards of decoding from nothing)
            assert src["aligned_accepted"] >= 0.75 * out.tokens, src
            assert src["aligned_wins"] <= out.tokens / 8, src

    loop_runner.run(go())


def test_a_cut_refresh_that_agrees_with_its_old_draft_keeps_the_stored_one() -> None:
    from bubblespec.protocol.domain import PregenDraft
    from bubblespec.rank.pregen import stale_kept

    t = PregenTask("p", [1], 0, 5, KEYED, step=3, hint=[4, 5, 6, 7])
    cut = lambda ids, complete=False: PregenDraft("p", 0, ids, complete)
    assert stale_kept(t, cut([4, 5]))  # agrees so far: the longer stored draft stays
    assert stale_kept(t, cut([]))
    assert not stale_kept(t, cut([4, 9]))  # flipped under the new weights: replace it
    assert not stale_kept(t, cut([4, 5], complete=True))  # complete: the fresh one
    assert not stale_kept(t, cut([4, 5, 6, 7, 8]))  # longer than the old draft


def run_until_stopped(runner: Any, engine: Any, window: PregenWindow) -> tuple[Any, dict]:
    """Pre-generate long responses; fire the stop signal after some progress, then (after
    more progress, in the training window) close the step."""
    task = default_task()
    long = [task.make_prompt(3, 7, MAX_STEPS), task.make_prompt(11, 9, MAX_STEPS)]
    tasks = tasks_for(long, 2, 600)

    async def progress(tokens: int) -> None:
        mark = engine.tokens_generated
        await eventually(lambda: engine.tokens_generated >= mark + tokens, timeout_s=60)

    async def go() -> tuple[Any, dict]:
        async with serving(rank_timeout_s=120.0) as (_, sync):
            for r in ("fast", "slow"):
                await sync.register(r, r)
            await sync.open_step(0, {"fast": 1, "slow": 1}, tasks, pregen_window=window)
            await sync.report_done(0, "fast")
            run = asyncio.create_task(Pregenerator(engine, sync, "fast", 0, inflight=8,
                                                   poll_every=2,
                                                   local_stop=asyncio.Event()).run())
            await progress(40)
            await sync.report_done(0, "slow")  # the stop signal
            if window is PregenWindow.BUBBLE:  # ends within T decode steps of it
                out = await asyncio.wait_for(run, 10)
                running_after_stop = False
            else:
                await progress(40)
                running_after_stop = not run.done()
                await sync.close_step(0)
                out = await asyncio.wait_for(run, 10)
            drafts = await sync.fetch_drafts(1, ["q0", "q1"])
            return out, {"running_after_stop": running_after_stop,
                         "drafts": {(d.prompt_key, d.sample_index): d for d in drafts}}

    return runner.run(go())


def test_bubble_window_stops_at_the_stop_signal(loop_runner: Any, spec_engine: Any) -> None:
    out, seen = run_until_stopped(loop_runner, spec_engine, PregenWindow.BUBBLE)
    assert out.stopped and out.tasks == 4
    assert out.complete < 4 and len(seen["drafts"]) == 4  # partial drafts were pushed
    assert any(not d.complete and d.token_ids for d in seen["drafts"].values())
    assert [k for k, *_ in out.spans()] == ["pregen"]  # all of it in the bubble


def test_training_window_goes_on_until_the_close(loop_runner: Any, spec_engine: Any) -> None:
    out, seen = run_until_stopped(loop_runner, spec_engine, PregenWindow.TRAINING)
    assert out.stopped and seen["running_after_stop"] and len(seen["drafts"]) == 4
    kinds = [(k, n) for k, _, _, n in out.spans()]
    assert [k for k, _ in kinds] == ["pregen", "pregen_window"]
    assert all(n > 0 for _, n in kinds) and sum(n for _, n in kinds) == out.tokens


def test_an_idle_rank_decodes_the_branches_another_rank_offers(loop_runner: Any,
                                                                 spec_engine: Any) -> None:
    """Rank "maker" holds every plain task; rank "idle" (branching on) finds none, keeps
    asking while they are in progress, then claims and decodes the branches the maker's
    complete keyed drafts offer; each branch is the draft's prefix, the runner-up token, and
    the keyed continuation the engine gives for that prefix."""
    task = default_task()
    tasks = tasks_for(task.make_prompts(2, 5), 2, 40)

    async def go() -> None:
        async with serving(rank_timeout_s=120.0) as (_, sync):
            await open_with_idle_ranks(sync, tasks, ("maker", "idle"))
            assert len((await sync.claim_tasks(0, "maker", 8)).tasks) == len(tasks)
            idle = Pregenerator(spec_engine, sync, "idle", 0, inflight=8, poll_every=4,
                                local_stop=asyncio.Event(), branches=1, branch_poll_s=0.05)
            run = asyncio.create_task(idle.run())
            await asyncio.sleep(0.3)
            assert not run.done()  # nothing to claim yet, but the maker may still offer
            made = await spec_engine.generate([task_request(t, branching=True) for t in tasks])
            drafts = [task_draft(t, g, offers(t, g, 1)) for t, g in zip(tasks, made)]
            assert all(len(d.branch_offers) == 1 for d in drafts)
            await sync.push_drafts(1, "maker", drafts)
            out = await asyncio.wait_for(run, 60)
            assert (out.tasks, out.branches) == (0, len(tasks))
            stored = await sync.fetch_drafts(1, sorted({t.prompt_key for t in tasks}))
            by_key = {(d.prompt_key, d.sample_index, d.branch_at): list(d.token_ids)
                      for d in stored}
            # what the branches cost: the tokens each decoded past its prefix (up to and
            # including the runner-up token), all of this rank's pre-generated tokens here
            past = sum(len(ids) - at - 1 for (_, _, at), ids in by_key.items() if at is not None)
            assert out.branch_tokens == out.tokens == past
            cut: list[tuple[list[int], Any]] = []
            for t, d in zip(tasks, drafts):
                (at, ru), = d.branch_offers
                branch = by_key[(t.prompt_key, t.sample_index, at)]
                assert branch[:at] == list(d.token_ids)[:at] and branch[at] == ru
                bt = PregenTask(t.prompt_key, t.prompt_token_ids, t.sample_index, t.seed,
                                t.sampling, prefix=branch[:at + 1], branch_at=at)
                req = branch_request(bt)
                if req is not None:
                    req.group = f"direct-{t.prompt_key}"
                    (again,) = await spec_engine.generate([req])
                    assert branch[at + 1:] == again.samples[0].output_ids
                # a branch a stop cut after a few tokens, continued from there (a later
                # bubble, `TaskQueue.continue_branch`): the rest of the same branch
                end = min(len(branch) - 1, at + 4)
                more = branch_request(dataclasses.replace(bt, prefix=branch[:end]))
                if more is not None:
                    more.group = f"cont-{t.prompt_key}-{t.sample_index}"
                    cut.append((branch[end:], more))
            rest = await spec_engine.generate([r for _, r in cut])
            assert [want for want, _ in cut] == [list(g.samples[0].output_ids) for g in rest]

    loop_runner.run(go())


def test_a_decoding_draft_streams_its_offers_before_it_completes(loop_runner: Any,
                                                                 spec_engine: Any) -> None:
    """With a margin threshold that every position meets, each keyed draft offers its first
    two positions (with a visible runner-up) while it decodes: pushed as a partial draft, a
    prefix of the complete one, which follows with no offer left in its budget; the complete
    drafts are still exactly the keyed samples, and the branches get decoded."""
    task = default_task()
    tasks = tasks_for(task.make_prompts(2, 6), 2, 40)

    async def go() -> None:
        async with serving(rank_timeout_s=120.0) as (_, sync):
            await open_with_idle_ranks(sync, tasks, ("maker", "idle"))
            pushes: list[Any] = []
            real_push = sync.push_drafts

            async def spy(step: int, rank: str, drafts: list[Any]) -> Any:
                pushes.extend(drafts)
                return await real_push(step, rank, drafts)

            sync.push_drafts = spy
            maker = Pregenerator(spec_engine, sync, "maker", 0, inflight=8, poll_every=4,
                                 local_stop=asyncio.Event(), branches=2, branch_poll_s=0.05,
                                 branch_margin=100.0)
            out = await asyncio.wait_for(maker.run(), 120)
            assert out.complete == len(tasks) and out.streamed_offers == 2 * len(tasks)
            direct_out = await spec_engine.generate([direct(t) for t in tasks])
            for t, g in zip(tasks, direct_out):
                mine = [d for d in pushes if (d.prompt_key, d.sample_index, d.branch_at)
                        == (t.prompt_key, t.sample_index, None)]
                done = [d for d in mine if d.complete]
                assert len(done) == 1 and mine[-1] is done[0]  # the complete one came last
                assert list(done[0].token_ids) == g.samples[0].output_ids
                assert not done[0].branch_offers  # the stream spent the budget
                recs = list(done[0].margin_records)  # running minima, for calibration
                assert recs and all(a[0] < b[0] and a[1] > b[1] for a, b in pairwise(recs))
                offered = [(o, list(d.token_ids)) for d in mine if not d.complete
                           for o in d.branch_offers]
                assert len(offered) == 2
                for (at, ru), ids in offered:
                    assert ids == list(done[0].token_ids)[:len(ids)] and at < len(ids)
                    assert ru != ids[at]
            # with lanes free, the maker claimed and decoded the branches itself
            assert out.branches == 2 * len(tasks)
            stored = await sync.fetch_drafts(1, sorted({t.prompt_key for t in tasks}))
            assert sum(d.branch_at is not None for d in stored) == 2 * len(tasks)

    loop_runner.run(go())


def test_auto_margin_streams_at_the_synchronizers_calibrated_threshold(
        loop_runner: Any, spec_engine: Any) -> None:
    """`--pregen-branch-margin auto`: before any flip the threshold is 0 (offers with the
    complete draft only); once the synchronizer has seen flips, each claim carries its
    calibrated threshold and the rank streams offers below it while drafts decode."""
    task = default_task()
    tasks = tasks_for(task.make_prompts(2, 7), 2, 40)

    async def run(server: Any, sync: Any) -> tuple[Any, Any]:
        await open_with_idle_ranks(sync, tasks, ("maker", "idle"))
        maker = Pregenerator(spec_engine, sync, "maker", 0, inflight=8, poll_every=4,
                             local_stop=asyncio.Event(), branches=1, branch_poll_s=0.05,
                             branch_margin="auto")
        return maker, await asyncio.wait_for(maker.run(), 120)

    async def go() -> None:
        async with serving(rank_timeout_s=120.0) as (server, sync):
            maker, out = await run(server, sync)
            assert maker.branch_margin == 0.0 and out.streamed_offers == 0
            assert out.complete == len(tasks) and out.branches == len(tasks)
        async with serving(rank_timeout_s=120.0) as (server, sync):
            server.state.margins.observe(0, FlipWindow(9.0, math.inf, False))
            maker, out = await run(server, sync)
            assert maker.branch_margin == server.state.margins.threshold() > 9.0
            assert out.streamed_offers >= 1

    loop_runner.run(go())


def test_engine_margins_are_the_reference_full_vocabulary_margins(loop_runner: Any,
                                                                  spec_engine: Any) -> None:
    """The keyed margins a branching rank reads from the engine's top log-probs are the
    keyed reference's full-vocabulary margins wherever the runner-up is among them, and it
    is at >= 98% of positions, so every draft's smallest margin, where it offers a branch,
    is the reference's. The top 4 of the same log-probs (what ranks first asked for) miss
    the runner-up far more often. Prints both shares (`pytest -s`: docs/results.md, "Branching on by default")."""
    pytest.importorskip("transformers")
    import numpy as np
    from transformers import AutoModelForCausalLM

    from bubblespec.bench.flips import decode_rows
    from bubblespec.core.keyed_noise import keyed_margin, position_key
    from bubblespec.rank.branches import TOP_LOGPROBS
    from bubblespec.tasks import default_model_dir

    task = default_task()
    tasks = tasks_for(task.make_prompts(16, 11), 2, 200)
    res = loop_runner.run(spec_engine.generate([task_request(t, branching=True)
                                                for t in tasks]))
    model = AutoModelForCausalLM.from_pretrained(str(default_model_dir())).eval()
    ref = decode_rows(model, [t.prompt_token_ids for t in tasks], [t.seed for t in tasks],
                      [0] * len(tasks), [200] * len(tasks), int(task.eos_id))
    seen = seen4 = same_min = positions = 0
    for t, g, r in zip(tasks, res, ref):
        s = g.samples[0]
        assert s.output_ids == r.tokens  # the reference sampler's tokens
        got = [keyed_margin(lp, tok, position_key(t.seed, p))
               for p, (tok, lp) in enumerate(zip(s.output_ids, s.top_logprobs))]
        for p, ((m, ru), m_ref, ru_ref) in enumerate(zip(got, r.margins, r.runner_ups)):
            positions += 1
            lp = s.top_logprobs[p]
            top4 = dict(sorted(lp.items(), key=lambda kv: -kv[1])[:4])
            top4[s.output_ids[p]] = lp[s.output_ids[p]]  # the engine adds the sampled token
            seen4 += keyed_margin(top4, s.output_ids[p], position_key(t.seed, p))[1] == ru_ref
            if ru == ru_ref:
                seen += 1
                assert abs(m - m_ref) < 1e-3
            else:  # the runner-up was not among the top log-probs: the margin is overstated
                assert m > m_ref
        same_min += int(np.argmin([m for m, _ in got])) == int(np.argmin(r.margins))
    print(f"keyed runner-up among the engine's top {TOP_LOGPROBS} log-probs at {seen} of "
          f"{positions} positions ({seen / positions:.1%}), among the top 4 at {seen4} "
          f"({seen4 / positions:.1%}); smallest margin where the reference has it in "
          f"{same_min} of {len(tasks)} drafts")
    assert positions > 1000 and seen >= 0.98 * positions and seen4 < seen
    assert same_min >= 0.9 * len(tasks)
