"""Turns verl's per-request `generate` calls into bubblespec rollout steps.

verl's agent loop sends one `generate(prompt_ids, sampling_params)` per trajectory, all at
once; bubblespec runs a batch as one synchronous step (`POST /v1/rollout`), sharded over its
ranks, with the next step's prompts pre-generated in the step's bubble. `StepBatcher` sits
between the two:

- the next-batch hook announces a step (`expect`): how many calls make it and the next
  batch's prompt ids; the batch closes as soon as that many calls arrived, or after
  `idle_s` without a new call (a trajectory that failed before generating);
- calls that come without an announcement (a multi-turn agent's later turns, a plain
  `AgentLoopManager`) close after `linger_s` without a new call;
- a closed batch is planned (`plan`): calls grouped by sampling parameters (one step each,
  largest first, the announced next prompts on the last), and within a group by prompt, each
  prompt's calls becoming its samples (`n` = the gcd of the counts; a prompt with more calls
  appears several times);
- steps run one at a time (the gateway runs one step at a time); calls that arrive while one
  runs form the next batch.

Every call's future gets its own sample, or the step's exception.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bubblespec.protocol.gateway import RolloutResponse, RolloutSample
from bubblespec.protocol.sampling import SamplingParams, SeedMode

log = logging.getLogger("bubblespec.integrations.verl")

_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty", "ignore_eos",
                  "stop_token_ids")


def verl_sampling(params: Mapping[str, Any], default_max_new_tokens: int,
                  seed_mode: SeedMode | None = None) -> tuple[SamplingParams, bool]:
    """verl's sampling dict (what `AgentLoopWorker` sends: temperature, top_p, top_k,
    repetition_penalty, logprobs; optionally max_tokens / max_new_tokens) as bubblespec's
    `SamplingParams`, and whether log-probs were asked for. An unknown key is a ValueError
    naming it, rather than a setting silently dropped."""
    p = dict(params)
    logprobs = bool(p.pop("logprobs", False))
    max_new = p.pop("max_tokens", None)
    if max_new is None:
        max_new = p.pop("max_new_tokens", None)
    unknown = sorted(set(p) - set(_SAMPLING_KEYS))
    if unknown:
        raise ValueError(f"sampling_params: bubblespec does not support {', '.join(unknown)}")
    if "stop_token_ids" in p:
        p["stop_token_ids"] = tuple(int(t) for t in p["stop_token_ids"] or ())
    if seed_mode is not None:  # unset: the gateway's choice
        p["seed_mode"] = seed_mode
    sp = SamplingParams(max_new_tokens=max(1, int(max_new or default_max_new_tokens)), **p)
    return sp, logprobs


@dataclass
class Call:
    """One pending `generate` call."""

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    future: asyncio.Future[tuple[int, RolloutSample]]
    request_id: str = ""


def sample_order(call: Call) -> int:
    """Where a call goes among its prompt's samples: verl's `full_determinism` request ids
    (`det-<index in the batch>`) in batch order, others as they arrived (a stable sort), so
    that with keyed sampling each trajectory gets the same seed in every run."""
    rid = call.request_id
    return int(rid[4:]) if rid.startswith("det-") and rid[4:].isdigit() else -1


@dataclass
class Group:
    """One rollout step: `prompts[i]` with its `n` calls `calls[i]` (sample order)."""

    sampling: SamplingParams
    n: int
    prompts: list[tuple[int, ...]] = field(default_factory=list)
    calls: list[list[Call]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.n * len(self.prompts)


def plan(calls: Sequence[Call]) -> list[Group]:
    """The rollout steps of a closed batch (module docstring), largest first."""
    by_sampling: dict[SamplingParams, dict[tuple[int, ...], list[Call]]] = {}
    for c in calls:
        by_sampling.setdefault(c.sampling, {}).setdefault(c.prompt_ids, []).append(c)
    groups = []
    for sp, by_prompt in by_sampling.items():
        n = math.gcd(*(len(cs) for cs in by_prompt.values()))
        g = Group(sampling=sp, n=n)
        for ids, cs in by_prompt.items():
            cs.sort(key=sample_order)
            for k in range(0, len(cs), n):
                g.prompts.append(ids)
                g.calls.append(cs[k:k + n])
        groups.append(g)
    return sorted(groups, key=lambda g: -g.size)


RolloutFn = Callable[[Group, Sequence[Sequence[int]] | None], Awaitable[RolloutResponse]]
"""Runs one group as a step, with the next step's prompts (or None); the gateway's reply."""


@dataclass(frozen=True)
class Expectation:
    """An announced step: `count` calls, then the next batch's prompt ids (or None)."""

    count: int
    next_prompts: list[list[int]] | None


class StepBatcher:
    """Collects `generate` calls into steps and runs them one at a time (module docstring)."""

    def __init__(self, rollout: RolloutFn, linger_s: float = 0.05, idle_s: float = 10.0) -> None:
        self._rollout = rollout
        self.linger_s = linger_s
        self.idle_s = idle_s
        self._pending: list[Call] = []
        self._expected: Expectation | None = None
        self._arrived = asyncio.Event()
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._task: asyncio.Task[None] | None = None
        self.steps: deque[RolloutResponse] = deque(maxlen=64)
        """The last steps run (the gateway's replies)."""

    def expect(self, count: int, next_prompts: Sequence[Sequence[int]] | None) -> None:
        """Announce the next batch: `count` calls; `next_prompts` pre-generated in its steps."""
        if count < 1:
            raise ValueError(f"count must be >= 1, not {count}")
        nxt = [list(map(int, p)) for p in next_prompts] if next_prompts else None
        self._expected = Expectation(count, nxt)
        self._arrived.set()

    def pause(self) -> None:
        """Hold back batches not yet started (verl's abort before a weight sync)."""
        self._resumed.clear()

    def resume(self) -> None:
        self._resumed.set()

    async def submit(self, prompt_ids: Sequence[int], sampling: SamplingParams,
                     request_id: str = "") -> tuple[int, RolloutSample]:
        """Queue one call; its (step, sample) once its step ran."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run_forever())
        fut: asyncio.Future[tuple[int, RolloutSample]] = (
            asyncio.get_running_loop().create_future())
        self._pending.append(Call(tuple(int(t) for t in prompt_ids), sampling, fut, request_id))
        self._arrived.set()
        return await fut

    async def _close_batch(self) -> tuple[list[Call], Expectation | None]:
        """Wait for the first call, then until the announced count or a quiet period."""
        while not self._pending:
            self._arrived.clear()
            await self._arrived.wait()
        while True:
            exp = self._expected
            if exp is not None and len(self._pending) >= exp.count:
                break
            self._arrived.clear()
            quiet = self.idle_s if exp is not None else self.linger_s
            try:
                await asyncio.wait_for(self._arrived.wait(), quiet)
            except asyncio.TimeoutError:
                if exp is not None:
                    log.warning("step closed with %d of %d announced calls after %.1f s "
                                "without a new one", len(self._pending), exp.count, quiet)
                break
        exp = self._expected
        take = exp.count if exp is not None else len(self._pending)
        batch, self._pending = self._pending[:take], self._pending[take:]
        self._expected = None
        return batch, exp

    async def _run_forever(self) -> None:
        while True:
            batch, exp = await self._close_batch()
            await self._resumed.wait()
            await self._run(batch, exp.next_prompts if exp is not None else None)

    async def _run(self, batch: list[Call], next_prompts: list[list[int]] | None) -> None:
        groups = plan(batch)
        for i, g in enumerate(groups):
            nxt = next_prompts if i == len(groups) - 1 else None
            try:
                res = await self._rollout(g, nxt)
            except Exception as e:  # noqa: BLE001 (every caller of the step sees why it failed)
                for cs in g.calls:
                    for c in cs:
                        if not c.future.done():
                            c.future.set_exception(e)
                continue
            self.steps.append(res)
            for cs, pr in zip(g.calls, res.prompts):
                for c, s in zip(cs, pr.samples):
                    if not c.future.done():  # a cancelled caller
                        c.future.set_result((res.step, s))
            for cs in g.calls:
                for c in cs:
                    if not c.future.done():
                        c.future.set_exception(RuntimeError(
                            f"step {res.step}: the gateway answered without this sample"))
