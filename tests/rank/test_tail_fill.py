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
from bubblespec.protocol.sampling import SamplingParams
from bubblespec.rank.pregen import Pregenerator
from bubblespec.rank.tail_fill import TailFill
from bubblespec.tasks import default_task

from ..synchronizer.helpers import serving
from .test_pregen import direct, tasks_for

pytestmark = pytest.mark.engine


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
            for r in ("me", "other"):
                await sync.register(r, r)
            await sync.open_step(0, {"me": 1, "other": 1}, tasks)
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
            for r in ("me", "other"):
                await sync.register(r, r)
            await sync.open_step(0, {"me": 1, "other": 1}, tasks)
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
