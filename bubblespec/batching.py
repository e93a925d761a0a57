"""Per-sample generate calls, batched into bubblespec rollout steps.

RL frameworks ask for one sample per call, all of a rollout at once: slime and AReaL send
one SGLang-style `/generate` per sample (`gateway/sglang.py`), verl's agent loop one
`generate(prompt_ids, sampling_params)` per trajectory (`integrations/verl/server.py`).
bubblespec's unit of work is a synchronous step: a batch sharded over the ranks, whose early
finishers pre-generate the next step's prompts in the bubble. `StepBatcher` sits between
the two; the adapters keep only their own quirks (their wire formats, how a step is run).

- A batch closes when its announced number of calls arrived (`expect`, verl's next-batch
  hook), or after a quiet period without a new call: `idle_s` for an announced batch (a
  trajectory that failed before generating), `quiet_s` otherwise, and at most `max_wait_s`
  after its first call when that is set.
- A closed batch is planned (`plan`): calls grouped by sampling parameters, seeded calls
  apart from unseeded ones (one step each, largest first: a step runs on the callers' seeds
  or on seeds the gateway derives, never on a mix that would drop a caller's seed), and within a group by prompt, each prompt's calls becoming its samples
  in their `order` (a stable sort: arrival order where no order is given). How many samples
  a prompt gets per step (`n`) is the adapter's rule (`NRule`): `equal_counts` (SGLang:
  n = c when every prompt was asked c times, else n = 1 with each call its own prompt)
  or `gcd_of_counts` (verl: n = the gcd of the counts; a prompt with more calls appears
  several times).
- The next step's prompts (`add_next`, or announced with the batch) go with the last step
  of the batch, pre-generated in its bubble; each is used once. Prompts of steps further
  ahead (`add_next(..., ahead=j)`, or a list of batches announced with the batch) go along
  as the later batches of the step's `next_prompts`, and move one step nearer with each
  step run.
- Steps run one at a time (the gateway runs one step at a time); calls that arrive while
  one runs form the next batch. `pause` holds back batches not yet started; queued calls
  can be aborted (answered with no sample and `ABORT_BEFORE_PREFILL`, which AReaL re-sends).

Every call gets its own sample, or the exception of its step.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bubblespec.protocol.gateway import RolloutResponse, RolloutSample
from bubblespec.protocol.sampling import PregenWindow, SamplingParams
from bubblespec.protocol.shapes import is_batch_list

log = logging.getLogger("bubblespec.batching")

#: SGLang's message for a request aborted before it ran (AReaL re-sends those at once).
ABORT_BEFORE_PREFILL = "Abort before prefill"

Prompt = Sequence[int] | str
"""Token ids, or text (the gateway tokenizes it)."""


@dataclass
class Answer:
    """What became of one call: its sample (None: aborted before it ran), its prompt's
    ids, and the step that ran it."""

    sample: RolloutSample | None
    input_ids: list[int]
    step: int | None = None
    message: str = ""


@dataclass(eq=False)
class Ask:
    """One sample a caller asked for."""

    prompt: Prompt
    sampling: SamplingParams
    seed: int | None = None
    rid: str = ""
    order: int = -1
    """Where it goes among its prompt's samples (ascending; -1: as it arrived)."""
    top_logprobs: int = 0
    """Top alternatives per generated token the caller reads (its step asks the ranks for
    the most any of its calls wants)."""
    future: asyncio.Future[Answer] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())

    @property
    def key(self) -> tuple[int, ...] | str:
        return self.prompt if isinstance(self.prompt, str) else tuple(self.prompt)

    def settle(self, answer: Answer | BaseException) -> None:
        """Answer the call (no-op when it was answered, or its caller went away)."""
        if self.future.done():
            return
        if isinstance(answer, BaseException):
            self.future.set_exception(answer)
        else:
            self.future.set_result(answer)


@dataclass
class Step:
    """One rollout step: `prompts[i]` with its `n` calls `asks[i]` (in sample order)."""

    sampling: SamplingParams
    n: int
    prompts: list[Prompt] = field(default_factory=list)
    asks: list[list[Ask]] = field(default_factory=list)
    next_prompts: list[list[list[int]]] | None = None
    """The future steps' prompt ids handed ahead with this step, the next step's first."""
    pregen_window: PregenWindow | None = None
    """How long this step's pre-generation may run (None: the gateway's setting)."""

    @property
    def size(self) -> int:
        return self.n * len(self.prompts)

    @property
    def top_logprobs(self) -> int:
        """The most top alternatives any call of the step wants."""
        return max((a.top_logprobs for asks in self.asks for a in asks), default=0)

    @property
    def seeds(self) -> list[list[int]] | None:
        """Per prompt the seeds of its samples, when every call brought one (else None)."""
        if any(a.seed is None for asks in self.asks for a in asks):
            return None
        return [[int(a.seed or 0) for a in asks] for asks in self.asks]


NRule = Callable[[Sequence[int]], int]
"""How many samples per prompt a step gets, from how often each prompt was asked; it
divides every count."""


def equal_counts(max_n: int) -> NRule:
    """n = c when every prompt was asked c <= `max_n` times (a GRPO group of c samples:
    they share a prompt key, and seeds follow the rule of the next step's pre-generation),
    else 1 (each call its own prompt)."""

    def rule(counts: Sequence[int]) -> int:
        c = set(counts)
        return c.pop() if len(c) == 1 and max(counts) <= max_n else 1

    return rule


def gcd_of_counts(counts: Sequence[int]) -> int:
    """n = the gcd of the counts (a prompt asked k * n times appears k times)."""
    return math.gcd(*counts)


def plan(asks: Sequence[Ask], n_rule: NRule) -> list[Step]:
    """The rollout steps of a closed batch (module docstring), largest first."""
    by_sampling: dict[tuple[SamplingParams, bool], dict[tuple[int, ...] | str, list[Ask]]] = {}
    for a in asks:  # seeded calls apart: a step takes the callers' seeds only if all have one
        by_sampling.setdefault((a.sampling, a.seed is not None), {}).setdefault(
            a.key, []).append(a)
    steps = []
    for (sp, _), by_prompt in by_sampling.items():
        n = n_rule([len(g) for g in by_prompt.values()])
        step = Step(sampling=sp, n=n)
        for group in by_prompt.values():
            group.sort(key=lambda a: a.order)
            for k in range(0, len(group), n):
                step.prompts.append(group[0].prompt)
                step.asks.append(group[k:k + n])
        steps.append(step)
    return sorted(steps, key=lambda s: -s.size)


RunFn = Callable[[Step], Awaitable[RolloutResponse]]
"""Runs one step (with its next prompts); the gateway's answer."""


@dataclass(frozen=True)
class Expectation:
    """An announced batch: `count` calls, then the next batches' prompt ids (or None)."""

    count: int
    next_prompts: list[list[list[int]]] | None


def as_batches(prompts: Sequence[Sequence[int]] | Sequence[Sequence[Sequence[int]]] | None
               ) -> list[list[list[int]]] | None:
    """Prompt ids of the next step, or of the next steps (a list of batches), as a list of
    batches of int lists; None when there are none."""
    if prompts is None or len(prompts) == 0:
        return None
    batches = prompts if is_batch_list(prompts) else [prompts]
    out = [[[int(t) for t in p] for p in b] for b in batches]
    return out if any(out) else None


class StepBatcher:
    """The queue of asked samples and the task that runs it as steps (module docstring)."""

    def __init__(self, run: RunFn, n_rule: NRule, quiet_s: float = 0.05,
                 max_wait_s: float | None = None, idle_s: float = 10.0) -> None:
        self._run = run
        self.n_rule = n_rule
        self.quiet_s = quiet_s
        self.max_wait_s = max_wait_s
        self.idle_s = idle_s
        self.queue: list[Ask] = []
        self.running: list[Ask] = []
        """The calls of the step running now."""
        self.steps: deque[RolloutResponse] = deque(maxlen=64)
        """The last steps run (the gateway's answers)."""
        self.steps_run = 0
        self._next: list[dict[tuple[int, ...], None]] = []
        """Per future step (the next one first), the prompts handed ahead for it."""
        self.pregen_window: PregenWindow | None = None
        """The pre-generation window of the steps run from now on, as the callers that hand
        prompts ahead set it (None: the gateway's); a slime trainer that trains between
        rollouts asks for `training`, so that the drafts do not hang on the bubble's length."""
        self._expected: Expectation | None = None
        self._arrived: asyncio.Event | None = None
        self._resumed: asyncio.Event | None = None
        self._paused = False
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ callers
    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def next_prompts(self) -> list[list[int]]:
        """Prompts waiting to go with the last step of the next batch, for the step after."""
        return [list(p) for p in self._next[0]] if self._next else []

    @property
    def next_batches(self) -> list[list[list[int]]]:
        """Every future step's waiting prompts, the next step's first."""
        return [[list(p) for p in b] for b in self._next]

    def add_next(self, prompts: Sequence[Sequence[int]], ahead: int = 0) -> int:
        """Queue prompts of the step `ahead` steps after the next one (repeats dropped);
        how many are waiting for that step now."""
        while len(self._next) <= ahead:
            self._next.append({})
        for p in prompts:
            self._next[ahead][tuple(int(t) for t in p)] = None
        return len(self._next[ahead])

    def expect(self, count: int, next_prompts: Sequence[Any] | None) -> None:
        """Announce the next batch: `count` calls; `next_prompts` (the next step's prompt
        ids, or a list of the next steps' batches) pre-generated in its steps."""
        if count < 1:
            raise ValueError(f"count must be >= 1, not {count}")
        self._expected = Expectation(count, as_batches(next_prompts))
        self._wake()

    async def generate(self, asks: Sequence[Ask]) -> list[Answer]:
        """Queue `asks` and wait for their answers (the step's exception if it failed)."""
        self.queue.extend(asks)
        self._wake()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())
        return list(await asyncio.gather(*(a.future for a in asks)))

    def abort(self, rid: str | None = None) -> int:
        """Answer queued calls (all, or those of `rid`) with an abort; how many."""
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

    # ------------------------------------------------------------------ the loop
    def _wake(self) -> None:
        if self._arrived is not None:
            self._arrived.set()

    async def _close(self) -> tuple[list[Ask], Expectation | None] | None:
        """Wait until the announced count arrived or the batch went quiet, then take it
        (None: paused meanwhile, or every queued call was answered)."""
        t0 = time.monotonic()
        while True:
            exp = self._expected
            if exp is not None and len(self.queue) >= exp.count:
                break
            quiet = self.idle_s if exp is not None else self.quiet_s
            if self.max_wait_s is not None:
                quiet = min(quiet, max(0.0, t0 + self.max_wait_s - time.monotonic()))
            self._arrived = asyncio.Event()
            try:
                await asyncio.wait_for(self._arrived.wait(), quiet)
            except asyncio.TimeoutError:
                if exp is not None:
                    log.warning("step closed with %d of %d announced calls after %.1f s "
                                "without a new one", len(self.queue), exp.count, quiet)
                break
            if self.max_wait_s is not None and time.monotonic() - t0 >= self.max_wait_s:
                break
        if self._paused:
            return None
        exp, self._expected = self._expected, None
        take = exp.count if exp is not None else len(self.queue)
        batch, self.queue = self.queue[:take], self.queue[take:]
        batch = [a for a in batch if not a.future.done()]
        return (batch, exp) if batch else None

    async def _loop(self) -> None:
        while self.queue:
            while self._paused and self._resumed is not None:
                await self._resumed.wait()
            closed = await self._close()
            if closed is None:
                continue
            batch, exp = closed
            steps = plan(batch, self.n_rule)
            for i, step in enumerate(steps):
                step.pregen_window = self.pregen_window
                if i == len(steps) - 1:
                    if exp is not None:
                        step.next_prompts = exp.next_prompts
                    else:  # every waiting step moves one step nearer
                        step.next_prompts = as_batches(self.next_batches)
                        self._next = self._next[1:]
                await self._step(step)

    async def _step(self, step: Step) -> None:
        asks = [a for group in step.asks for a in group]
        self.running = asks
        try:
            res = await self._run(step)
        except Exception as e:  # noqa: BLE001 (every caller of the step hears why it failed)
            for a in asks:
                a.settle(e)
            return
        finally:
            self.running = []
        self.steps_run += 1
        self.steps.append(res)
        for group, pr in zip(step.asks, res.prompts):
            for a, s in zip(group, pr.samples):
                a.settle(Answer(s, list(pr.input_ids), res.step))
        for a in asks:
            a.settle(RuntimeError(f"step {res.step}: the gateway answered without this sample"))
