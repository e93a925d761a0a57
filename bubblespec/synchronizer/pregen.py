"""The pre-generation queue of one step: tasks for step s+1, handed out during step s's bubble.

Order is breadth-first over prompts: every prompt's sample 0 (in the order the gateway listed
the prompts), then every prompt's sample 1, and so on, so that a bubble cut short still gives
drafts to as many prompts as possible. A min-heap on (sample_index, prompt position) keeps that
order also for tasks put back after their rank was lost. Each task is held by at most one rank;
a pushed *complete* draft retires it.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from bubblespec.protocol.domain import PregenTask

TaskKey = tuple[str, int]


class TaskQueue:
    """Claimable tasks of `target_step`, with per-rank claims."""

    def __init__(self, target_step: int, tasks: Sequence[PregenTask]) -> None:
        self.target_step = target_step
        self._tasks: dict[TaskKey, PregenTask] = {}
        self._priority: dict[TaskKey, tuple[int, int]] = {}
        prompt_pos: dict[str, int] = {}
        for task in tasks:
            key = (task.prompt_key, task.sample_index)
            self._tasks[key] = task
            pos = prompt_pos.setdefault(task.prompt_key, len(prompt_pos))
            self._priority[key] = (task.sample_index, pos)
        self._heap: list[tuple[int, int, TaskKey]] = [(*p, k) for k, p in self._priority.items()]
        heapq.heapify(self._heap)
        self._queued: set[TaskKey] = set(self._tasks)
        self._claimed: dict[TaskKey, str] = {}
        self._by_rank: dict[str, set[TaskKey]] = {}
        self.completed = 0

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def queued(self) -> int:
        """Tasks waiting for a rank."""
        return len(self._queued)

    @property
    def claimed(self) -> int:
        """Tasks held by a rank and not complete."""
        return len(self._claimed)

    def claim(self, rank_id: str, max_tasks: int) -> list[PregenTask]:
        """Hand up to `max_tasks` queued tasks to `rank_id`, breadth-first over prompts."""
        out: list[PregenTask] = []
        mine = self._by_rank.setdefault(rank_id, set())
        while self._heap and len(out) < max_tasks:
            key = heapq.heappop(self._heap)[2]
            if key not in self._queued:  # completed while queued: a stale heap entry
                continue
            self._queued.discard(key)
            self._claimed[key] = rank_id
            mine.add(key)
            out.append(self._tasks[key])
        return out

    def complete(self, key: TaskKey) -> bool:
        """Retire a task (its complete draft arrived); True if it was open."""
        if key not in self._tasks or (key not in self._queued and key not in self._claimed):
            return False
        self._queued.discard(key)
        holder = self._claimed.pop(key, None)
        if holder is not None:
            self._by_rank[holder].discard(key)
        self.completed += 1
        return True

    def release(self, rank_id: str) -> int:
        """Put every unfinished task held by `rank_id` back in the queue; return how many."""
        keys = self._by_rank.pop(rank_id, set())
        for key in keys:
            del self._claimed[key]
            self._queued.add(key)
            heapq.heappush(self._heap, (*self._priority[key], key))
        return len(keys)

    def held_by(self, rank_id: str) -> list[TaskKey]:
        """Keys of the tasks `rank_id` holds (for tests and state dumps)."""
        return sorted(self._by_rank.get(rank_id, ()))
