"""The pre-generation queue of one step: tasks for step s+1, handed out during step s's bubble.

A step lasts as long as its longest responses, so the queue gives the responses predicted to
be longest their drafts first. Order: rounds of `depth` samples per prompt (samples 0..d-1 of
every prompt, then d..2d-1, ...), so that a bubble cut short still gives drafts to as many
prompts as possible; within a round, prompts by predicted response length, longest first
(ties: in the order the gateway listed them). Without any prediction
this is plain breadth-first over prompts.

Predictions come from :class:`LengthPredictor`: the mean length of the complete responses
pre-generated for the same prompt (prompt keys are content hashes, so a prompt repeated in a
later epoch is recognised), including those completed earlier in this very queue: when a
prompt's first pre-generated sample turns out long, its other samples move up at once (and
down when it turns out short). A prompt without history is predicted the mean over all
prompts known when the queue was made, or, before anything is known, to be longer than any
seen: the first responses to complete are the short ones, so without history a completed
sample moves its prompt back, behind the prompts still unknown.

A min-heap keeps that order also for tasks put back after their rank was lost (a task's heap
entry is replaced when its prompt's prediction changes). Each task is held by at most one
rank; a pushed *complete* draft retires it.

Margin branches (docs/design.md section 5): a keyed draft may offer positions where the
policy is likely to flip, with the runner-up token there (when complete, or streamed while
it still decodes). Each offer becomes a branch
task (the draft's prefix up to it plus the runner-up) that any rank may claim once no plain
task is queued, longest draft first, then in offer order (smallest margin first). So the
ranks that pre-generated nothing, or finished their share, spend the rest of the bubble on
the branches of the drafts most likely to set the next step's critical path, instead of the
rank that made the draft doing them after its own share.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Sequence

from bubblespec.protocol.domain import PregenTask

TaskKey = tuple[str, int]
Priority = tuple[int, float, int, int]
BranchKey = tuple[str, int, int]
"""(prompt key, sample index, branch position)."""


class LengthPredictor:
    """Mean length of the last `keep` complete pre-generated responses per prompt key, for
    at most `max_prompts` prompts (least recently observed go first)."""

    def __init__(self, keep: int = 16, max_prompts: int = 100_000) -> None:
        self.keep = keep
        self.max_prompts = max_prompts
        self._seen: OrderedDict[str, deque[int]] = OrderedDict()
        self._total = 0
        self._count = 0

    def __len__(self) -> int:
        return len(self._seen)

    def observe(self, prompt_key: str, length: int) -> None:
        """A complete response of `length` tokens was generated for `prompt_key`."""
        d = self._seen.pop(prompt_key, None) or deque(maxlen=self.keep)
        d.append(int(length))
        self._total += int(length)
        self._count += 1
        self._seen[prompt_key] = d
        while len(self._seen) > self.max_prompts:
            self._seen.popitem(last=False)

    def predict(self, prompt_key: str) -> float | None:
        """Predicted response length of `prompt_key`; None if never seen."""
        d = self._seen.get(prompt_key)
        return sum(d) / len(d) if d else None

    def mean(self) -> float:
        """Mean of every length observed (infinite before the first)."""
        return self._total / self._count if self._count else math.inf


class TaskQueue:
    """Claimable tasks of `target_step`, with per-rank claims, longest predicted first."""

    def __init__(self, target_step: int, tasks: Sequence[PregenTask],
                 lengths: LengthPredictor | None = None, depth: int = 1) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.target_step = target_step
        self.depth = depth
        self.lengths = lengths
        self._tasks: dict[TaskKey, PregenTask] = {}
        self._pos: dict[str, int] = {}
        self._pred: dict[str, float] = {}  # predicted length per prompt
        self._ver: dict[TaskKey, int] = {}  # a heap entry is valid while its version is current
        unknown = lengths.mean() if lengths is not None else 0.0
        self._by_prompt: dict[str, list[TaskKey]] = {}
        for task in tasks:
            key = (task.prompt_key, task.sample_index)
            self._tasks[key] = task
            self._ver[key] = 0
            if task.prompt_key not in self._pos:
                self._pos[task.prompt_key] = len(self._pos)
                known = lengths.predict(task.prompt_key) if lengths is not None else None
                self._pred[task.prompt_key] = unknown if known is None else known
            self._by_prompt.setdefault(task.prompt_key, []).append(key)
        self._heap: list[tuple[Priority, int, TaskKey]] = [
            (self._priority(k), 0, k) for k in self._tasks]
        heapq.heapify(self._heap)
        self._queued: set[TaskKey] = set(self._tasks)
        self._claimed: dict[TaskKey, str] = {}
        self._claimed_can_branch = 0  # of `_claimed`, tasks whose drafts may offer branches
        self._by_rank: dict[str, set[TaskKey]] = {}
        self.completed = 0
        self._branches: dict[BranchKey, tuple[tuple[int, int, int], PregenTask]] = {}
        self._bheap: list[tuple[tuple[int, int, int], BranchKey]] = []
        self._bqueued: set[BranchKey] = set()
        self._bclaimed: dict[BranchKey, str] = {}
        self._bseq = 0
        self.branches_offered = 0

    def _priority(self, key: TaskKey) -> Priority:
        return (key[1] // self.depth, -self._pred[key[0]], self._pos[key[0]], key[1])

    def _push(self, key: TaskKey) -> None:
        self._ver[key] += 1
        heapq.heappush(self._heap, (self._priority(key), self._ver[key], key))

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def queued(self) -> int:
        """Tasks (plain and branch) waiting for a rank."""
        return len(self._queued) + len(self._bqueued)

    @property
    def claimed(self) -> int:
        """Plain tasks held by a rank and not complete (their drafts may still offer
        branches)."""
        return len(self._claimed)

    @property
    def branchable_claimed(self) -> int:
        """Of those, the ones whose drafts can offer branches (`PregenTask.can_branch`):
        what a branching rank with nothing to claim waits for."""
        return self._claimed_can_branch

    @property
    def branches_claimed(self) -> int:
        """Branch tasks held by a rank and not complete."""
        return len(self._bclaimed)

    def claim(self, rank_id: str, max_tasks: int) -> list[PregenTask]:
        """Hand up to `max_tasks` queued tasks to `rank_id`, in queue order: plain tasks,
        then branch tasks."""
        out: list[PregenTask] = []
        mine = self._by_rank.setdefault(rank_id, set())
        while self._heap and len(out) < max_tasks:
            _, ver, key = heapq.heappop(self._heap)
            # completed while queued, or re-prioritised since: a stale heap entry
            if key not in self._queued or ver != self._ver[key]:
                continue
            self._queued.discard(key)
            self._claimed[key] = rank_id
            self._claimed_can_branch += self._tasks[key].can_branch
            mine.add(key)
            out.append(self._tasks[key])
        while self._bheap and len(out) < max_tasks:
            _, bkey = heapq.heappop(self._bheap)
            if bkey not in self._bqueued:  # completed while queued
                continue
            self._bqueued.discard(bkey)
            self._bclaimed[bkey] = rank_id
            mine.add(bkey)
            out.append(self._branches[bkey][1])
        return out

    def add_branches(self, key: TaskKey, draft: Sequence[int],
                     offers: Sequence[tuple[int, int]]) -> int:
        """Queue the branches that the (complete or partial) draft of task `key` offers,
        (position, runner-up) in the draft's order; offers already queued, past the draft's
        end, or of unknown tasks are skipped. Returns how many were queued."""
        task = self._tasks.get(key)
        if task is None:
            return 0
        n = 0
        for j, (at, tok) in enumerate(offers):
            bkey = (key[0], key[1], int(at))
            if bkey in self._branches or not 0 <= at < len(draft) or draft[at] == tok:
                continue
            self._queue_branch(bkey, len(draft), j, dataclasses.replace(
                task, prefix=[*draft[:at], int(tok)], branch_at=int(at)))
            n += 1
        self.branches_offered += n
        return n

    def continue_branch(self, task: PregenTask, at: int, tokens: Sequence[int]) -> bool:
        """Queue the continuation of a margin branch at `at` of `task`'s sample that an
        earlier bubble cut short after `tokens` (its prefix, runner-up and what it decoded):
        decoding goes on from its end, behind the plain tasks like any branch. False when
        that branch is already queued here."""
        bkey = (task.prompt_key, task.sample_index, int(at))
        if bkey in self._branches:
            return False
        self._queue_branch(bkey, len(tokens), 0, dataclasses.replace(
            task, prefix=list(tokens), branch_at=int(at), hint=()))
        return True

    def _queue_branch(self, bkey: BranchKey, length: int, rank: int, bt: PregenTask) -> None:
        """Queue branch task `bt`: branches of longer drafts first, then by their rank
        among one draft's offers, then first come."""
        self._bseq += 1
        prio = (-length, rank, self._bseq)
        self._branches[bkey] = (prio, bt)
        self._bqueued.add(bkey)
        heapq.heappush(self._bheap, (prio, bkey))

    def complete_branch(self, bkey: BranchKey) -> bool:
        """Retire a branch task (its complete branch draft arrived); True if it was open."""
        if bkey in self._bqueued:
            self._bqueued.discard(bkey)
            return True
        holder = self._bclaimed.pop(bkey, None)
        if holder is None:
            return False
        self._by_rank[holder].discard(bkey)
        return True

    def complete(self, key: TaskKey, length: int | None = None) -> bool:
        """Retire a task (its complete draft of `length` tokens arrived); True if it was open.
        The length also updates the prediction, and with it the order, of the prompt's other
        queued samples."""
        if key not in self._tasks or (key not in self._queued and key not in self._claimed):
            return False
        self._queued.discard(key)
        holder = self._claimed.pop(key, None)
        if holder is not None:
            self._by_rank[holder].discard(key)
            self._claimed_can_branch -= self._tasks[key].can_branch
        self.completed += 1
        if length is not None and self.lengths is not None:
            self.lengths.observe(key[0], length)
            self._pred[key[0]] = self.lengths.predict(key[0]) or 0.0
            for other in self._by_prompt[key[0]]:
                if other in self._queued:
                    self._push(other)
        return True

    def release(self, rank_id: str) -> int:
        """Put every unfinished task held by `rank_id` back in the queue; return how many."""
        keys = self._by_rank.pop(rank_id, set())
        for key in keys:
            if len(key) == 3:  # a branch task
                del self._bclaimed[key]
                self._bqueued.add(key)
                heapq.heappush(self._bheap, (self._branches[key][0], key))
                continue
            del self._claimed[key]
            self._claimed_can_branch -= self._tasks[key].can_branch
            self._queued.add(key)
            self._push(key)
        return len(keys)

    def held_by(self, rank_id: str) -> list[tuple]:
        """Keys of the tasks `rank_id` holds (for tests and state dumps)."""
        return sorted(self._by_rank.get(rank_id, ()))
