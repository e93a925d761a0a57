"""The step batcher of the verl plugin (`bubblespec/batching.py` with verl's adapter
`integrations/verl/batcher.py`): verl's per-trajectory `generate` calls become
bubblespec rollout steps (grouping, sample order, announced and unannounced batches, one
step at a time, failures reach every caller). The rollout function stands for the gateway
and answers each prompt's sample i with [prompt..., i]: what each caller gets back is then
checkable. The real gateway path is `test_verl_ray.py`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from bubblespec.batching import Step, gcd_of_counts, plan
from bubblespec.integrations.verl.batcher import submit as submit_to
from bubblespec.integrations.verl.batcher import verl_ask, verl_batcher, verl_sampling
from bubblespec.protocol.gateway import PromptResult, RolloutResponse, RolloutSample
from bubblespec.protocol.sampling import SamplingParams, SeedMode

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)
HOT = SamplingParams(temperature=1.0, max_new_tokens=8)


class Gateway:
    """Records each step it is asked to run; sample i of a prompt is [*prompt, 100 + i]."""

    def __init__(self, delay_s: float = 0.0, fail: bool = False) -> None:
        self.steps: list[tuple[list[tuple[int, ...]], int, SamplingParams, object]] = []
        self.delay_s = delay_s
        self.fail = fail
        self.running = 0
        self.max_running = 0

    async def __call__(self, g: Step) -> RolloutResponse:
        nxt: Sequence[Sequence[int]] | None = g.next_prompts
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await asyncio.sleep(self.delay_s)
            if self.fail:
                raise RuntimeError("gateway down")
            self.steps.append((list(g.prompts), g.n, g.sampling, nxt))
            prompts = [PromptResult(index=i, prompt_key=f"k{i}", rank_id="r0", input_ids=list(p),
                                    samples=[RolloutSample(sample_index=j,
                                                           output_ids=[*p, 100 + j],
                                                           output_logprobs=[-0.5] * (len(p) + 1),
                                                           finish_reason="stop")
                                             for j in range(g.n)])
                       for i, p in enumerate(g.prompts)]
            return RolloutResponse(step=len(self.steps), prompts=prompts)
        finally:
            self.running -= 1


def test_verl_sampling_maps_the_agent_loops_dict() -> None:
    sp, logprobs = verl_sampling({"temperature": 0.7, "top_p": 0.9, "top_k": -1,
                                  "repetition_penalty": 1.0, "logprobs": True}, 64,
                                 SeedMode.KEYED)
    assert logprobs and sp.max_new_tokens == 64 and sp.temperature == 0.7 and sp.top_p == 0.9
    assert sp.seed_mode is SeedMode.KEYED
    sp, logprobs = verl_sampling({"temperature": 0, "max_tokens": 5}, 64)
    assert not logprobs and sp.max_new_tokens == 5
    assert verl_sampling({"max_new_tokens": 7}, 64)[0].max_new_tokens == 7
    with pytest.raises(ValueError, match="min_p"):
        verl_sampling({"temperature": 1.0, "min_p": 0.1}, 64)


def test_plan_groups_by_sampling_then_prompt() -> None:
    async def planned() -> list[Step]:
        call = verl_ask
        calls = [call((1,), HOT), call((2,), HOT), call((1,), HOT), call((2,), HOT),
                 call((1,), GREEDY), call((3,), HOT), call((3,), HOT), call((3,), HOT),
                 call((3,), HOT)]
        return plan(calls, gcd_of_counts)

    groups = asyncio.run(planned())
    assert [g.sampling for g in groups] == [HOT, GREEDY]  # largest first
    hot = groups[0]
    assert hot.n == 2 and hot.prompts == [(1,), (2,), (3,), (3,)]  # 4 calls: twice n
    assert [len(cs) for cs in hot.asks] == [2, 2, 2, 2]
    assert groups[1].n == 1 and groups[1].prompts == [(1,)]


def test_announced_batch_runs_as_one_step_with_next_prompts() -> None:
    async def main() -> None:
        gw = Gateway()
        b = verl_batcher(gw, linger_s=0.01, idle_s=5.0)
        b.expect(4, [[7, 8]])
        outs = await asyncio.gather(*[submit_to(b, p, HOT) for p in ([1, 2], [3], [1, 2], [3])])
        assert len(gw.steps) == 1
        prompts, n, sp, nxt = gw.steps[0]
        assert prompts == [(1, 2), (3,)] and n == 2 and sp == HOT and nxt == [[[7, 8]]]
        # each caller gets its own sample of its own prompt
        assert [s.output_ids for _, s in outs] == [[1, 2, 100], [3, 100], [1, 2, 101], [3, 101]]
        assert {step for step, _ in outs} == {1}

    asyncio.run(main())


def test_batches_announced_several_steps_ahead_go_with_the_step() -> None:
    async def main() -> None:
        gw = Gateway()
        b = verl_batcher(gw, linger_s=0.01, idle_s=5.0)
        b.expect(1, [[[7, 8], [9]], [[10]]])
        await submit_to(b, [1], HOT)
        assert gw.steps[0][3] == [[[7, 8], [9]], [[10]]]

    asyncio.run(main())


def test_prompts_added_ahead_move_one_step_nearer_per_step() -> None:
    async def main() -> None:
        gw = Gateway()
        b = verl_batcher(gw, linger_s=0.01)
        assert b.add_next([[5]]) == 1 and b.add_next([[6], [6]], ahead=1) == 1
        await submit_to(b, [1], HOT)
        await submit_to(b, [2], HOT)
        await submit_to(b, [3], HOT)
        assert [st[3] for st in gw.steps] == [[[[5]], [[6]]], [[[6]]], None]

    asyncio.run(main())


def test_unannounced_calls_close_after_linger_and_steps_do_not_overlap() -> None:
    async def main() -> None:
        gw = Gateway(delay_s=0.05)
        b = verl_batcher(gw, linger_s=0.02)
        first = [asyncio.ensure_future(submit_to(b, [i], GREEDY)) for i in range(3)]
        await asyncio.sleep(0.03)  # the first batch closed and runs
        second = [asyncio.ensure_future(submit_to(b, [9], GREEDY))]
        res = await asyncio.gather(*first, *second)
        assert [len(s[0]) for s in gw.steps] == [3, 1]
        assert gw.max_running == 1
        assert [step for step, _ in res] == [1, 1, 1, 2]

    asyncio.run(main())


def test_announced_batch_short_of_its_count_closes_after_idle() -> None:
    async def main() -> None:
        gw = Gateway()
        b = verl_batcher(gw, linger_s=0.01, idle_s=0.1)
        b.expect(3, None)
        outs = await asyncio.gather(submit_to(b, [1], HOT), submit_to(b, [1], HOT))
        assert len(outs) == 2 and gw.steps[0][1] == 2

    asyncio.run(main())


def test_a_failed_step_fails_each_of_its_calls_and_pause_holds_batches() -> None:
    async def main() -> None:
        gw = Gateway(fail=True)
        b = verl_batcher(gw, linger_s=0.01)
        res = await asyncio.gather(submit_to(b, [1], HOT), submit_to(b, [2], HOT),
                                   return_exceptions=True)
        assert all(isinstance(r, RuntimeError) and "gateway down" in str(r) for r in res)
        gw.fail = False
        b.pause()
        task = asyncio.ensure_future(submit_to(b, [3], HOT))
        await asyncio.sleep(0.1)
        assert not task.done() and not gw.steps
        b.resume()
        _, s = await task
        assert s.output_ids == [3, 100]

    asyncio.run(main())


def test_expect_refuses_an_empty_step() -> None:
    b = verl_batcher(Gateway())
    with pytest.raises(ValueError):
        b.expect(0, None)


def test_full_determinism_request_ids_fix_each_trajectorys_sample() -> None:
    """verl's `full_determinism` sends `det-<batch index>` request ids: the samples of a
    prompt go to the calls in batch order, whatever order the calls arrived in."""
    async def main() -> None:
        gw = Gateway()
        b = verl_batcher(gw, linger_s=0.01)
        b.expect(4, None)
        outs = await asyncio.gather(*[submit_to(b, [5], HOT, f"det-{i}") for i in (3, 0, 2, 1)])
        assert [s.output_ids[-1] - 100 for _, s in outs] == [3, 0, 2, 1]

    asyncio.run(main())
