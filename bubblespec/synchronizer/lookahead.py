"""The pre-generation queues of one open step: a `TaskQueue` per future step it was handed.

A trainer knows its next batches (an epoch's order is fixed by its sampler's seed), so an
OpenStep of step s may carry tasks for s+1, s+2, ... A bubble serves the nearest step first
(its plain tasks, longest predicted first, then its margin branches) and, once that step's
queue is empty, goes on to the one after: a short step's bubble then pre-generates little
for s+1, but a long step's bubble is not capped at s+1's tasks, so the drafts of a step
come from every bubble before it rather than from its predecessor's alone.

A task whose sample already has a draft in the store (pre-generated in an earlier bubble,
when the trainer handed the same step ahead then too) is not redone from nothing:

- a complete draft of the step's weight version: the task is dropped (it is done);
- any other draft (older weights, or cut short): the task is queued as a *refresh*, with
  the stored tokens as its hint. The rank hands the hint to its engine as the sample's
  draft, so under keyed sampling decoding mostly verifies it (several tokens per forward)
  instead of generating one token per forward. The refreshed draft replaces the stale one
  when pushed; a refresh cut short that agrees with the hint so far leaves the stored draft
  as it is (`rank/pregen.py`).

A margin branch of such a sample that an earlier bubble cut short is continued from where
it stopped (`TaskQueue.continue_branch`: its stored tokens become the branch task's
prefix), behind the step's plain tasks like any branch. A branch matters where the update
flips the response early, and a streamed branch offered near the draft's start is the one
the bubble's stop cuts: without this, a later bubble refreshed the draft but left its branch
cut (docs/results.md, "Keyed rows on two seeds").

Seeds of a future step's tasks are fixed when its prompts are handed ahead (the gateway
derives them from (run seed, step, prompt key, sample index)), so a draft made two steps
early is coupled to its rollout exactly as one made the step before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from bubblespec.protocol.domain import PregenTask
from bubblespec.synchronizer.pregen import LengthPredictor, TaskQueue

Stored = Callable[[int, str, int], "tuple[Any, bool, int] | None"]
"""(step, prompt key, sample index) -> (tokens, complete, weight version) of a stored draft."""
Branches = Callable[[int, str, int], "Sequence[tuple[int, Any, bool]]"]
"""(step, prompt key, sample index) -> (position, tokens, complete) of its stored branches."""


@dataclasses.dataclass
class Handed:
    """What an OpenStep's tasks became: queued fresh, queued as refreshes, or dropped as done."""

    fresh: int = 0
    refresh: int = 0
    done: int = 0
    branches: int = 0
    """Cut branches queued to be continued."""


class Lookahead:
    """Per future step of the open step `opened`, its queue; claims nearest step first."""

    def __init__(self, opened: int, tasks: Sequence[PregenTask],
                 lengths: LengthPredictor | None = None, depth: int = 1,
                 stored: Stored | None = None, weight_version: int | None = None,
                 branches: Branches | None = None) -> None:
        self.opened = opened
        self.handed = Handed()
        self.hinted: set[int] = set()
        """Future steps with refresh tasks (claimed one by one: their hints are sized)."""
        by_step: dict[int, list[PregenTask]] = {}
        cut: list[tuple[int, PregenTask, int, list[int]]] = []
        for t in tasks:
            step = t.step if t.step is not None else opened + 1
            have = stored(step, t.prompt_key, t.sample_index) if stored is not None else None
            if have is not None and branches is not None:
                cut += [(step, t, at, list(tok))
                        for at, tok, whole in branches(step, t.prompt_key, t.sample_index)
                        if not whole and len(tok) > at]
            if have is not None and have[0]:
                tokens, complete, version = have
                if complete and weight_version is not None and version >= weight_version:
                    self.handed.done += 1
                    continue
                t = dataclasses.replace(t, hint=list(tokens))
                self.handed.refresh += 1
                self.hinted.add(step)
            else:
                self.handed.fresh += 1
            by_step.setdefault(step, []).append(
                t if t.step == step else dataclasses.replace(t, step=step))
        for step, *_ in cut:
            by_step.setdefault(step, [])
        self.queues: dict[int, TaskQueue] = {
            s: TaskQueue(s, by_step[s], lengths, depth) for s in sorted(by_step)}
        for step, t, at, tok in cut:
            task = t if t.step == step else dataclasses.replace(t, step=step)
            self.handed.branches += self.queues[step].continue_branch(task, at, tok)

    @classmethod
    def empty(cls, opened: int) -> Lookahead:
        return cls(opened, ())

    def queue_of(self, step: int) -> TaskQueue | None:
        """The queue of future step `step`, if the open step was handed tasks for it."""
        return self.queues.get(step)

    @property
    def target_step(self) -> int:
        """The nearest future step with tasks not yet handed out (step + 1 when none has)."""
        return next((s for s, q in self.queues.items() if q.queued), self.opened + 1)

    @property
    def last_step(self) -> int:
        """The furthest future step handed (step + 1 when none was)."""
        return max(self.queues, default=self.opened + 1)

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues.values())

    @property
    def queued(self) -> int:
        return sum(q.queued for q in self.queues.values())

    @property
    def claimed(self) -> int:
        return sum(q.claimed for q in self.queues.values())

    @property
    def branchable_claimed(self) -> int:
        return sum(q.branchable_claimed for q in self.queues.values())

    def claim(self, rank_id: str, max_tasks: int, max_hint_tokens: int | None = None
              ) -> list[PregenTask]:
        """Up to `max_tasks` tasks, nearest step first (each names its step); once the
        refresh hints handed out reach `max_hint_tokens`, no more (at least one task), so a
        claim's reply stays within the message size."""
        out: list[PregenTask] = []
        hints = 0
        for step, q in self.queues.items():
            sized = max_hint_tokens is not None and step in self.hinted
            while len(out) < max_tasks:
                if max_hint_tokens is not None and out and hints >= max_hint_tokens:
                    return out
                got = q.claim(rank_id, 1 if sized else max_tasks - len(out))
                if not got:
                    break
                out += got
                hints += sum(len(t.hint) for t in got)
        return out

    def release(self, rank_id: str) -> int:
        """Put back every task `rank_id` holds, in every step's queue."""
        return sum(q.release(rank_id) for q in self.queues.values())
