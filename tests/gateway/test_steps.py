"""The step batcher the trainer-API fronts share (`bubblespec/batching.py` with the gateway's
adapter `gateway/steps.py`): concurrent requests become one step, GRPO groups
become n > 1, next prompts go to the next step once, aborts, pause and failures.

The batcher is transport-free (it gets the rollout as a function, as `dispatch` does), so
these tests run it with a plain function that answers each sample with a response naming its
prompt and sample index; the real rollout path is in tests/integration/api/test_sglang_clients.py.
"""

from __future__ import annotations

import asyncio

import pytest

from bubblespec.batching import ABORT_BEFORE_PREFILL, Ask, equal_counts, plan
from bubblespec.gateway.steps import step_batcher, step_request
from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.gateway import (
    PromptResult,
    RolloutRequest,
    RolloutResponse,
    RolloutSample,
)
from bubblespec.protocol.sampling import SamplingParams

SP = SamplingParams(max_new_tokens=8)


class Recorder:
    """A rollout function that records its requests and answers [prompt[0], index, j]."""

    def __init__(self, delay_s: float = 0.0, fail: Exception | None = None) -> None:
        self.requests: list[RolloutRequest] = []
        self.delay_s = delay_s
        self.fail = fail

    async def __call__(self, req: RolloutRequest) -> RolloutResponse:
        self.requests.append(req)
        await asyncio.sleep(self.delay_s)
        if self.fail is not None:
            raise self.fail
        prompts = []
        for i, p in enumerate(req.prompts):
            ids = list(p.input_ids or [0])
            samples = [RolloutSample(sample_index=j, output_ids=[ids[0], i, j],
                                     output_logprobs=[-0.5] * 3, finish_reason="length",
                                     weight_version=3) for j in range(req.n)]
            prompts.append(PromptResult(index=i, prompt_key=f"k{i}", rank_id="r0",
                                        input_ids=ids, samples=samples))
        return RolloutResponse(step=len(self.requests) - 1, prompts=prompts)


def asks(prompts: list[list[int]], sp: SamplingParams = SP, seed: int | None = None
         ) -> list[Ask]:
    return [Ask(p, sp, seed, f"rid{i}") for i, p in enumerate(prompts)]


async def test_a_grpo_group_becomes_one_step_with_n() -> None:
    run = Recorder()
    b = step_batcher(run, quiet_s=0.02)
    group = asks([[7, 1]] * 4 + [[8, 1]] * 4)
    b.add_next([[9, 1], [9, 1], [10, 1]])
    answers = await b.generate(group)
    (req,) = run.requests
    assert req.n == 4 and [p.input_ids for p in req.prompts] == [[7, 1], [8, 1]]
    assert [[p.input_ids for p in b] for b in req.next_batches()] == [[[9, 1], [10, 1]]]
    assert [a.sample.output_ids for a in answers if a.sample] == \
        [[7, 0, j] for j in range(4)] + [[8, 1, j] for j in range(4)]
    assert all(a.input_ids in ([7, 1], [8, 1]) and a.step == 0 for a in answers)
    assert b.next_prompts == [] and b.steps_run == 1


async def test_concurrent_requests_are_batched_and_next_prompts_used_once() -> None:
    run = Recorder()
    b = step_batcher(run, quiet_s=0.05)
    b.add_next([[9]])

    async def one(p: list[int], delay: float) -> list[int]:
        await asyncio.sleep(delay)
        (ans,) = await b.generate(asks([p]))
        assert ans.sample is not None
        return ans.sample.output_ids

    outs = await asyncio.gather(*(one([i + 1], 0.002 * i) for i in range(6)))
    assert len(run.requests) == 1 and [o[0] for o in outs] == [1, 2, 3, 4, 5, 6]
    await b.generate(asks([[1]]))
    assert len(run.requests) == 2 and run.requests[1].next_prompts is None


async def test_uneven_counts_and_sampling_groups_and_seeds() -> None:
    run = Recorder()
    b = step_batcher(run, quiet_s=0.02)
    hot = SamplingParams(max_new_tokens=8, temperature=0.5)
    batch = asks([[1], [1], [2]], seed=5) + asks([[3]], sp=hot)
    answers = await b.generate(batch)
    first, second = run.requests
    assert first.n == 1 and [p.input_ids for p in first.prompts] == [[1], [1], [2]]
    assert first.seeds == [[5], [5], [5]] and second.sampling_params == hot
    assert [a.sample.output_ids for a in answers if a.sample] == \
        [[1, 0, 0], [1, 1, 0], [2, 2, 0], [3, 0, 0]]
    (p,) = plan(asks([[1]] * 3), equal_counts(max_n=2))  # over the gateway's largest n
    request = step_request(p)
    assert request.n == 1 and len(request.prompts) == 3


async def test_abort_pause_and_resume() -> None:
    run = Recorder()
    b = step_batcher(run, quiet_s=0.02)
    b.pause()
    waiting = asyncio.ensure_future(b.generate(asks([[1], [2]])))
    await asyncio.sleep(0.1)
    assert run.requests == [] and len(b.queue) == 2
    assert b.abort("rid1") == 1
    b.resume()
    got = await waiting
    assert got[0].sample is not None and got[1].sample is None
    assert got[1].message == ABORT_BEFORE_PREFILL and got[1].input_ids == [2]
    b.pause()
    pending = asyncio.ensure_future(b.generate(asks([[3]])))
    await asyncio.sleep(0.05)
    assert b.abort() == 1 and (await pending)[0].sample is None
    b.resume()
    assert len(run.requests) == 1


async def test_failures_reach_every_caller_and_the_loop_survives() -> None:
    b = step_batcher(Recorder(fail=ApiError(503, "no rank is ready")), quiet_s=0.01)
    with pytest.raises(ApiError) as e:
        await b.generate(asks([[1], [2]]))
    assert e.value.status == 503
    b2 = step_batcher(Recorder(fail=RuntimeError("boom")), quiet_s=0.01)
    with pytest.raises(ApiError) as e:
        await b2.generate(asks([[1]]))
    assert e.value.status == 502 and "boom" in e.value.detail


async def test_a_caller_that_goes_away_does_not_break_the_step() -> None:
    run = Recorder(delay_s=0.05)
    b = step_batcher(run, quiet_s=0.01)
    gone = asyncio.ensure_future(b.generate(asks([[1]])))
    stays = asyncio.ensure_future(b.generate(asks([[2]])))
    await asyncio.sleep(0.03)
    gone.cancel()
    (ans,) = await stays
    assert ans.sample is not None and ans.sample.output_ids[0] == 2
