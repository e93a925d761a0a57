"""Sharding a step over ranks: work items, LPT assignment, response-length estimates.

A work item is one prompt with a contiguous run of its samples (normally all `n`, so that
siblings share drafts on one rank). Items go to ranks by LPT (longest processing time first,
each to the least-loaded rank), with an item's expected work = samples x expected response
length of its prompt, learned from earlier steps. Results are put back in request order by
`assemble`, which also checks that every sample came back exactly once.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from bubblespec.protocol.keys import base_key
from bubblespec.protocol.rank import SampleOut


@dataclass(frozen=True)
class WorkItem:
    """Samples `sample_offset .. sample_offset+n-1` of prompt `index` (key `key`)."""

    index: int
    key: str
    input_ids: tuple[int, ...]
    sample_offset: int
    n: int
    seeds: tuple[int, ...] | None
    cost: float

    @property
    def uid(self) -> tuple[int, int]:
        """(prompt index, first sample index): unique within a step."""
        return self.index, self.sample_offset


class LengthEstimator:
    """Expected response length per prompt key: an EMA of observed mean lengths.

    Unseen keys get the running mean over all observations (so one batch of fresh prompts
    is balanced by count, and a mix of known and fresh prompts is not skewed), or the
    request's max_new_tokens before anything was observed. Bounded: the least recently
    observed keys are forgotten beyond `max_keys`.
    """

    def __init__(self, alpha: float = 0.5, max_keys: int = 1_000_000) -> None:
        self.alpha = alpha
        self.max_keys = max_keys
        self._by_key: OrderedDict[str, float] = OrderedDict()
        self._global: float | None = None

    def __len__(self) -> int:
        return len(self._by_key)

    def observe(self, key: str, mean_len: float) -> None:
        """Record the mean response length of a prompt in a step."""
        key = base_key(key)
        old = self._by_key.pop(key, None)
        self._by_key[key] = mean_len if old is None else old + self.alpha * (mean_len - old)
        while len(self._by_key) > self.max_keys:
            self._by_key.popitem(last=False)
        g = self._global
        self._global = mean_len if g is None else g + 0.1 * (mean_len - g)

    def estimate(self, key: str, max_new_tokens: int) -> float:
        """Expected response length of prompt `key` (at least 1, at most max_new_tokens)."""
        value = self._by_key.get(base_key(key), self._global)
        if value is None:
            return float(max_new_tokens)
        return float(min(max(value, 1.0), max_new_tokens))


def _chunks(n: int, parts: int) -> list[tuple[int, int]]:
    """(offset, count) of `parts` near-equal runs covering 0..n-1."""
    parts = max(1, min(parts, n))
    base, extra = divmod(n, parts)
    out, offset = [], 0
    for j in range(parts):
        count = base + (1 if j < extra else 0)
        out.append((offset, count))
        offset += count
    return out


def make_items(keys: Sequence[str], prompts: Sequence[Sequence[int]], n: int,
               seeds: Sequence[Sequence[int]] | None, estimator: LengthEstimator,
               max_new_tokens: int, num_ranks: int = 1, split: bool = False) -> list[WorkItem]:
    """Work items of a batch. With `split` and fewer prompts than ranks, each prompt's
    samples are cut into runs so that every rank can get work; otherwise one item per prompt."""
    parts = 1
    if split and 0 < len(prompts) < num_ranks:
        parts = math.ceil(num_ranks / len(prompts))
    items = []
    for i, (key, ids) in enumerate(zip(keys, prompts)):
        per_sample = estimator.estimate(key, max_new_tokens)
        for offset, count in _chunks(n, parts):
            s = None if seeds is None else tuple(seeds[i][offset:offset + count])
            items.append(WorkItem(i, key, tuple(ids), offset, count, s, count * per_sample))
    return items


def lpt(items: Iterable[WorkItem], ranks: Sequence[str],
        loads: Mapping[str, float] | None = None) -> dict[str, list[WorkItem]]:
    """Assign items to ranks, longest first, each to the currently least-loaded rank.

    `loads` are the ranks' starting loads (work already running there). Every rank appears
    in the result (possibly with no items); each rank's items are in request order.
    """
    if not ranks:
        raise ValueError("no ranks to assign work to")
    heap = [((loads or {}).get(r, 0.0), j, r) for j, r in enumerate(ranks)]
    heapq.heapify(heap)
    out: dict[str, list[WorkItem]] = {r: [] for r in ranks}
    for item in sorted(items, key=lambda it: (-it.cost, it.uid)):
        load, j, rank = heapq.heappop(heap)
        out[rank].append(item)
        heapq.heappush(heap, (load + item.cost, j, rank))
    for assigned in out.values():
        assigned.sort(key=lambda it: it.uid)
    return out


def loads_of(assignment: Mapping[str, Sequence[WorkItem]]) -> dict[str, float]:
    """Total expected work per rank."""
    return {r: sum(it.cost for it in items) for r, items in assignment.items()}


class AssemblyError(ValueError):
    """A result does not match what was asked (missing, repeated or unknown samples)."""


@dataclass(frozen=True, slots=True)
class ReplySample:
    """One sample a rank's reply holds, as the gateway accepted it (`dispatch.check_reply`):
    the rank's typed record and where it came from."""

    sample: SampleOut
    rank_id: str
    prompt_key: str


def assemble(n: int, num_prompts: int, samples: Mapping[int, Sequence[ReplySample]]
             ) -> list[list[ReplySample]]:
    """Per prompt index 0..num_prompts-1, its samples sorted by sample index, each of
    0..n-1 exactly once."""
    out = []
    for index in range(num_prompts):
        got = sorted(samples.get(index, ()), key=lambda s: s.sample.sample_index)
        indices = [s.sample.sample_index for s in got]
        if indices != list(range(n)):
            raise AssemblyError(f"prompt {index}: got sample indices {indices}, "
                                f"expected 0..{n - 1}")
        out.append(got)
    return out
