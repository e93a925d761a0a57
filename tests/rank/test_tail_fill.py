"""Tail-fill (`rank/tail_fill.py`, `rank/pregen.py`) on a real engine and a real
synchronizer: a rank still decoding its shard pre-generates beside it within its budget,
its own responses are the tokens they are without tail-fill (keyed), the lanes' drafts are
the rollout's exact samples, and the run goes on as the bubble's when the shard ends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bubblespec.core.engine_time import EngineTime
from bubblespec.engine.types import BatchProgress, GenRequest
from bubblespec.metrics.rank import new_rank_metrics
from bubblespec.protocol.domain import SpanKind
from bubblespec.protocol.rank import ShardRequest, StepShard
from bubblespec.protocol.sampling import SamplingParams
from bubblespec.rank.config import RankConfig
from bubblespec.rank.pregen import Pregenerator
from bubblespec.rank.tail_fill import TailFill
from bubblespec.rank.worker import RankWorker, to_gen_request
from bubblespec.tasks import default_task

from ..synchronizer.helpers import serving
from .test_pregen import direct, tasks_for

pytestmark = pytest.mark.engine


async def open_step_zero(sync: Any, tasks: list[Any]) -> None:
    """Ranks "me" (under test) and "other" (the straggler), step 0 open with `tasks`."""
    for r in ("me", "other"):
        await sync.register(r, r)
    await sync.open_step(0, {"me": 1, "other": 1}, tasks)


def own_requests(prompts: list[Any]) -> list[GenRequest]:
    """A shard of keyed requests, one long enough to leave a tail."""
    return [GenRequest(input_ids=list(p.input_ids), n=2, seeds=[31 * i + 1, 31 * i + 2],
                       group=f"own{i}",
                       sampling=SamplingParams(temperature=1.0, seed_mode="keyed",
                                               max_new_tokens=160, ignore_eos=i == 0))
            for i, p in enumerate(prompts)]


def test_lanes_run_beside_the_shard_and_go_on_into_the_bubble(loop_runner: Any,
                                                              spec_engine: Any) -> None:
    task = default_task()
    tasks = tasks_for(task.make_prompts(4, 41), 2, 60)
    own = own_requests(task.make_prompts(2, 42))

    async def go() -> None:
        alone = await spec_engine.generate(own)  # the shard without tail-fill
        async with serving(rank_timeout_s=120.0) as (_, sync):
            await open_step_zero(sync, tasks)
            progress = BatchProgress()
            tail = TailFill(EngineTime.preset("h100"), 0.05, progress, lane_tokens=9,
                            max_lanes=4)
            run = asyncio.create_task(Pregenerator(
                spec_engine, sync, "me", 0, inflight=4, poll_every=4,
                local_stop=asyncio.Event(), branch_poll_s=0.02, tail=tail).run())
            shard = await spec_engine.generate(own, progress=progress)
            assert (progress.running, progress.context) == (0, 0)
            assert progress.generated == sum(len(s.output_ids) for g in shard for s in g.samples)
            await sync.report_done(0, "me")
            tail.end()
            await sync.report_done(0, "other")
            out = await asyncio.wait_for(run, 120)
            # keyed: the shard's tokens do not depend on the lanes decoding beside it
            assert [[s.output_ids for s in g.samples] for g in shard] == \
                [[s.output_ids for s in g.samples] for g in alone]
            assert out.tail_end is not None and out.tail_end[1] > 0, out
            assert 1 <= out.tail_lanes <= 4
            kinds = [k for k, *_ in out.spans()]
            assert kinds[0] == "pregen_tail" and kinds[-1] == "pregen", kinds
            assert sum(n for *_, n in out.spans()) == out.tokens
            stored = {(d.prompt_key, d.sample_index): list(d.token_ids)
                      for d in await sync.fetch_drafts(1, sorted({t.prompt_key for t in tasks}))}
            assert stored and out.pushed_tokens == sum(map(len, stored.values()))
            again = await spec_engine.generate([direct(t) for t in tasks])
            for t, g in zip(tasks, again):  # each draft is a prefix of the exact sample
                d = stored.get((t.prompt_key, t.sample_index))
                if d is not None:
                    assert d == g.samples[0].output_ids[: len(d)]

    loop_runner.run(go())


def test_without_budget_nothing_runs_beside_the_shard(loop_runner: Any,
                                                      spec_engine: Any) -> None:
    task = default_task()
    tasks = tasks_for(task.make_prompts(2, 43), 1, 30)
    own = own_requests(task.make_prompts(1, 44))

    async def go() -> None:
        async with serving(rank_timeout_s=120.0) as (_, sync):
            await open_step_zero(sync, tasks)
            progress = BatchProgress()
            tail = TailFill(EngineTime.preset("h100"), 1e-6, progress, lane_tokens=9,
                            max_lanes=4)
            run = asyncio.create_task(Pregenerator(
                spec_engine, sync, "me", 0, inflight=4, poll_every=4,
                local_stop=asyncio.Event(), branch_poll_s=0.02, tail=tail).run())
            await spec_engine.generate(own, progress=progress)
            assert (await sync.get_state()).claimed_tasks == 0
            await sync.report_done(0, "me")
            tail.end()
            out = await asyncio.wait_for(run, 120)
            assert out.tail_end is not None and out.tail_end[1] == 0
            assert out.tail_lanes == 0 and out.complete == 2  # the bubble did them

    loop_runner.run(go())


def test_a_rank_with_a_budget_pregenerates_beside_its_shard_then_in_its_bubble(
        loop_runner: Any, spec_engine: Any) -> None:
    """The rank worker end to end (`--tail-fill-budget`): its state stays "decoding" while
    lanes run beside the shard, its timeline files a pregen_tail span inside its busy time
    and a pregen span after it, and the tail tokens are counted."""
    task = default_task()
    tasks = tasks_for(task.make_prompts(4, 45), 2, 60)
    own = own_requests(task.make_prompts(2, 46))
    shard = StepShard(step=0, requests=[
        ShardRequest(index=i, input_ids=r.input_ids, n=r.n, seeds=r.seeds, prompt_key=r.group,
                     sampling_params=r.sampling) for i, r in enumerate(own)])

    async def go() -> None:
        async with serving(rank_timeout_s=120.0) as (_, sync):
            await open_step_zero(sync, tasks)
            cfg = RankConfig(rank_id="me", tail_fill_budget=0.05, pregen_inflight=4,
                             pregen_branches=0)
            m = new_rank_metrics("me")
            w = RankWorker(cfg, "me", spec_engine, sync, m)
            states: list[str] = []

            async def watch() -> None:
                while True:
                    states.append(w.state)
                    await asyncio.sleep(0.02)

            watcher = asyncio.create_task(watch())
            out = await w.run_shard(shard, [to_gen_request(r) for r in shard.requests])
            assert out.step == 0 and len(out.results) == 2
            await sync.report_done(0, "other")
            await asyncio.wait_for(w._pregen_task, 120)
            watcher.cancel()
            assert "pregen" not in states[: states.index("decoding") + 1]
            spans = (await sync.get_timeline(0)).spans["me"]
            kinds = [s.kind for s in spans]
            assert SpanKind.DECODE in kinds and SpanKind.PREGEN_TAIL in kinds, kinds
            decode = next(s for s in spans if s.kind is SpanKind.DECODE)
            tail = next(s for s in spans if s.kind is SpanKind.PREGEN_TAIL)
            assert decode.start_unix_s <= tail.start_unix_s < tail.end_unix_s
            assert tail.end_unix_s <= decode.end_unix_s + 0.5 and tail.tokens > 0
            tail_tokens = m.registry.get_sample_value("bubblespec_pregen_tail_tokens_total",
                                                      {"rank": "me"})
            assert tail_tokens == tail.tokens

    loop_runner.run(go())
