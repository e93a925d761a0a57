"""Concurrent SGLang-style /generate requests, batched into bubblespec rollout steps.

slime and AReaL send one /generate request per sample, all of a rollout at once (slime's
`generate_and_rm_group` gathers a group's samples; AReaL's workflows call `agenerate`
per sample). bubblespec's unit of work is a synchronous step: a batch sharded over the
ranks, whose early finishers pre-generate the next step's prompts in the bubble. So requests
are queued and the queue becomes one step when it has been quiet for `quiet_s` (or
`max_wait_s` after its first request); requests arriving while a step runs form the next
step. Within a step, requests are grouped by sampling parameters (one rollout per group);
when every prompt of a group was asked the same number of times c (a GRPO group of c
samples), the rollout has n = c, so the samples share a prompt key and seeds follow the same
rule as the next step's pre-generation; otherwise each request is a prompt with n = 1.

The next step's prompts (`next_input_ids`, `POST /v1/next_prompts`) are handed to the first
step that starts after they arrive. Requests still queued can be aborted (answered with
finish reason abort and no tokens, message "Abort before prefill", which AReaL re-sends);
`pause` holds the queue until `resume`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.gateway import PromptIn, RolloutRequest, RolloutResponse, RolloutSample
from bubblespec.protocol.sampling import SamplingParams

log = logging.getLogger("bubblespec.gateway.sglang")

#: What a rollout step is run with (`Rollouts.rollout`).
RunFn = Callable[[RolloutRequest], Awaitable[RolloutResponse]]

#: SGLang's message for a request aborted before it ran (AReaL re-sends those at once).
ABORT_BEFORE_PREFILL = "Abort before prefill"


@dataclass
class Answer:
    """What became of one asked sample: its sample (None: aborted before it ran)."""

    sample: RolloutSample | None
    input_ids: list[int]
    step: int | None = None
    message: str = ""


@dataclass(eq=False)
class Ask:
    """One sample a /generate request asked for."""

    prompt: list[int] | str
    sampling: SamplingParams
    seed: int | None
    rid: str
    future: asyncio.Future[Answer] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())

    @property
    def key(self) -> tuple[int, ...] | str:
        return self.prompt if isinstance(self.prompt, str) else tuple(self.prompt)

    def settle(self, answer: Answer | BaseException) -> None:
        """Answer the request (no-op when its caller went away)."""
        if self.future.done():
            return
        if isinstance(answer, BaseException):
            self.future.set_exception(answer)
        else:
            self.future.set_result(answer)


@dataclass
class Plan:
    """One rollout step for a group of asks, and which sample answers which ask."""

    request: RolloutRequest
    slots: list[tuple[int, int]]
    """Per ask (in group order): (prompt index, sample index) in the rollout's answer."""


def _prompt_in(p: list[int] | str) -> PromptIn:
    return PromptIn(text=p) if isinstance(p, str) else PromptIn(input_ids=list(p))


def plan_step(group: Sequence[Ask], next_prompts: Sequence[list[int]], max_n: int) -> Plan:
    """The rollout of one group of asks with equal sampling (see the module docstring)."""
    order: dict[tuple[int, ...] | str, list[int]] = {}
    for i, a in enumerate(group):
        order.setdefault(a.key, []).append(i)
    counts = {len(ix) for ix in order.values()}
    seeded = all(a.seed is not None for a in group)
    slots: list[tuple[int, int]] = [(0, 0)] * len(group)
    if len(counts) == 1 and (n := counts.pop()) <= max_n:
        prompts = [group[ix[0]].prompt for ix in order.values()]
        seeds: list[list[int]] | None = [] if seeded else None
        for p, ix in enumerate(order.values()):
            for j, i in enumerate(ix):
                slots[i] = (p, j)
            if seeds is not None:
                seeds.append([int(group[i].seed or 0) for i in ix])
    else:
        n = 1
        prompts = [a.prompt for a in group]
        slots = [(i, 0) for i in range(len(group))]
        seeds = [[int(a.seed or 0)] for a in group] if seeded else None
    request = RolloutRequest(
        prompts=[_prompt_in(p) for p in prompts], n=n, sampling_params=group[0].sampling,
        seeds=seeds, next_prompts=[_prompt_in(p) for p in next_prompts] or None,
        return_logprobs=True)
    return Plan(request, slots)


class StepBatcher:
    """The queue of asked samples and the task that runs it as steps (one at a time)."""

    def __init__(self, run: RunFn, quiet_s: float = 0.05, max_wait_s: float = 1.0,
                 max_n: int = 1024) -> None:
        self._run = run
        self.quiet_s = quiet_s
        self.max_wait_s = max_wait_s
        self.max_n = max_n
        self.queue: list[Ask] = []
        self.running: list[Ask] = []
        self._next: dict[tuple[int, ...], None] = {}
        self._paused = False
        self._resumed: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.steps_run = 0

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def next_prompts(self) -> list[list[int]]:
        """Prompts waiting to be handed to the next step that starts."""
        return [list(p) for p in self._next]

    def add_next(self, prompts: Sequence[Sequence[int]]) -> int:
        """Queue the next step's prompts (repeats dropped); how many are waiting now."""
        for p in prompts:
            self._next[tuple(int(t) for t in p)] = None
        return len(self._next)

    async def generate(self, asks: Sequence[Ask]) -> list[Answer]:
        """Queue `asks` and wait for their answers (ApiError when their step failed)."""
        self.queue.extend(asks)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop())
        return list(await asyncio.gather(*(a.future for a in asks)))

    def abort(self, rid: str | None = None) -> int:
        """Answer queued asks (all, or those of `rid`) with an abort; how many."""
        hit = [a for a in self.queue if rid is None or a.rid == rid]
        self.queue = [a for a in self.queue if a not in hit]
        for a in hit:
            ids = [] if isinstance(a.prompt, str) else list(a.prompt)
            a.settle(Answer(None, ids, message=ABORT_BEFORE_PREFILL))
        return len(hit)

    def pause(self) -> None:
        """Start no new step until `resume` (a step already running completes)."""
        self._paused = True
        self._resumed = asyncio.Event()

    def resume(self) -> None:
        self._paused = False
        if self._resumed is not None:
            self._resumed.set()

    async def _gather(self) -> None:
        """Wait until no ask arrived for `quiet_s`, at most `max_wait_s`."""
        t0 = time.monotonic()
        while True:
            seen = len(self.queue)
            await asyncio.sleep(self.quiet_s)
            if len(self.queue) == seen or time.monotonic() - t0 >= self.max_wait_s:
                return

    async def _loop(self) -> None:
        while self.queue:
            while self._paused and self._resumed is not None:
                await self._resumed.wait()
            await self._gather()
            if self._paused:
                continue
            batch = [a for a in self.queue if not a.future.done()]
            self.queue = []
            groups: dict[SamplingParams, list[Ask]] = {}
            for a in batch:
                groups.setdefault(a.sampling, []).append(a)
            for group in groups.values():
                await self._step(group)

    async def _step(self, group: list[Ask]) -> None:
        next_prompts = self.next_prompts
        self._next.clear()
        try:
            plan = plan_step(group, next_prompts, self.max_n)
        except ValueError as e:  # a pydantic limit of the rollout body
            for a in group:
                a.settle(ApiError(400, str(e), "input_ids"))
            return
        self.running = group
        try:
            resp = await self._run(plan.request)
        except ApiError as e:
            for a in group:
                a.settle(e)
            return
        except Exception as e:  # each caller must hear of it, not the loop
            log.exception("SGLang step failed")
            for a in group:
                a.settle(ApiError(502, f"rollout failed: {type(e).__name__}: {e}"))
            return
        finally:
            self.running = []
        self.steps_run += 1
        for a, (p, j) in zip(group, plan.slots):
            prompt = resp.prompts[p]
            a.settle(Answer(prompt.samples[j], prompt.input_ids, resp.step))
