"""`bubblespec/batching.py`: the rules for n, the order of a prompt's samples, the max-wait
cut, and the next prompts going with the last step of a batch. The adapters' own behaviour
is tested with them (tests/gateway/test_sglang_steps.py, tests/integrations/test_verl_batcher.py)."""

from __future__ import annotations

import asyncio
import time

from bubblespec.batching import Ask, Step, StepBatcher, equal_counts, gcd_of_counts, plan
from bubblespec.gateway.steps import step_request
from bubblespec.protocol.gateway import PromptResult, RolloutResponse, RolloutSample
from bubblespec.protocol.sampling import PregenWindow, SamplingParams

SP = SamplingParams(max_new_tokens=4)
HOT = SamplingParams(max_new_tokens=4, temperature=0.5)


class Steps:
    """Runs each step by answering sample j of prompt i with [prompt[0], j]."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.started: list[float] = []

    async def __call__(self, step: Step) -> RolloutResponse:
        self.steps.append(step)
        self.started.append(time.monotonic())
        return RolloutResponse(step=len(self.steps), prompts=[
            PromptResult(index=i, prompt_key=f"k{i}", rank_id="r0", input_ids=list(p),
                         samples=[RolloutSample(sample_index=j, output_ids=[p[0], j],
                                                finish_reason="length") for j in range(step.n)])
            for i, p in enumerate(step.prompts)])


def test_the_rules_for_n_on_one_batch() -> None:
    async def main() -> None:
        asks = [Ask([1], SP) for _ in range(4)] + [Ask([2], SP) for _ in range(8)]
        (eq,) = plan(asks, equal_counts(1024))
        (g,) = plan(asks, gcd_of_counts)
        assert eq.n == 1 and len(eq.prompts) == 12  # unequal counts: each call a prompt
        assert g.n == 4 and [list(p) for p in g.prompts] == [[1], [2], [2]]
        (same,) = plan(asks[:4] + asks[4:8], equal_counts(1024))
        assert same.n == 4 and len(same.prompts) == 2
        assert plan(asks[:4], equal_counts(3))[0].n == 1  # over max_n

    asyncio.run(main())


def test_order_sorts_a_prompts_samples_and_seeds_follow() -> None:
    async def main() -> None:
        asks = [Ask([5], SP, seed=10 + k, order=k) for k in (2, 0, 1)]
        (s,) = plan(asks, gcd_of_counts)
        assert [a.order for a in s.asks[0]] == [0, 1, 2] and s.seeds == [[10, 11, 12]]
        mixed = plan([Ask([5], SP, seed=1), Ask([6], SP), Ask([7], SP, seed=2)], gcd_of_counts)
        assert sorted(str(s.seeds) for s in mixed) == ["None", "[[1], [2]]"]  # no seed dropped

    asyncio.run(main())


def test_max_wait_cuts_a_batch_that_never_goes_quiet() -> None:
    async def main() -> None:
        run = Steps()
        b = StepBatcher(run, equal_counts(1024), quiet_s=0.05, max_wait_s=0.2)
        t0 = time.monotonic()

        async def trickle() -> None:
            for i in range(30):  # a call every 20 ms: never quiet for 50 ms
                asyncio.ensure_future(b.generate([Ask([i + 1], SP)]))
                await asyncio.sleep(0.02)

        await trickle()
        while b.queue or b.running:
            await asyncio.sleep(0.02)
        assert len(run.steps) >= 2, "the batch was not cut at max_wait_s"
        assert run.started[0] - t0 < 0.4

    asyncio.run(main())


def test_next_prompts_go_with_the_last_step_of_a_batch_once() -> None:
    async def main() -> None:
        run = Steps()
        b = StepBatcher(run, gcd_of_counts, quiet_s=0.02)
        b.add_next([[9], [9], [10]])
        await b.generate([Ask([1], SP), Ask([2], SP), Ask([3], HOT)])
        big, small = run.steps
        assert big.next_prompts is None and small.next_prompts == [[[9], [10]]]
        await b.generate([Ask([1], SP)])
        assert run.steps[2].next_prompts is None and b.steps_run == 3

    asyncio.run(main())


def test_the_callers_pregen_window_goes_with_every_step_until_set_again() -> None:
    async def main() -> None:
        run = Steps()
        b = StepBatcher(run, gcd_of_counts, quiet_s=0.02)
        await b.generate([Ask([1], SP)])
        b.pregen_window = PregenWindow.TRAINING
        await b.generate([Ask([1], SP), Ask([2], HOT)])
        b.pregen_window = PregenWindow.BUBBLE
        await b.generate([Ask([1], SP)])
        assert [s.pregen_window for s in run.steps] == [
            None, PregenWindow.TRAINING, PregenWindow.TRAINING, PregenWindow.BUBBLE]
        assert step_request(run.steps[1]).pregen_window is PregenWindow.TRAINING
        assert step_request(run.steps[0]).pregen_window is None  # the gateway's setting

    asyncio.run(main())
