"""Running a step's shards on the ranks concurrently, re-running the shards of failed ranks.

`dispatch` is transport-free: it gets `call(rank_id, items, rerun, timeout_s)` that returns a
rank's `StepShardResult` as JSON (or raises `RankCallError`), so the re-run logic is tested
with plain functions and used with HTTP by `Rollouts`. Guarantees:

- every sample of every item is accepted exactly once, from exactly one reply: a failed
  call's items are re-run as a whole on the ranks still alive (LPT, counting the work they
  still have running), and a reply that does not hold exactly the samples asked for counts
  as a failure of that rank;
- no ranks left, too many re-runs, or the deadline -> an exception naming the ranks;
- a rank that refuses the body (400/422) fails the whole call (re-running would not help);
- a rank whose engine died running the shard (`RankCallError.engine_died`) is reported to
  `on_engine_death`, which may end the step at once (a poison request, `quarantine.py`):
  then no further rank receives the shard;
- a rank that `lost()` names (the synchronizer marked it LOST: no heartbeat) fails its
  running calls at once, which are dropped and re-run: a frozen or partitioned rank never
  answers nor closes its connection, so without this the step would wait for it until the
  deadline. Should it answer later, that reply is not read (its call was cancelled).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from bubblespec.gateway.errors import RankCallError
from bubblespec.gateway.shard import ReplySample, WorkItem, lpt
from bubblespec.protocol.rank import StepShardResult

log = logging.getLogger("bubblespec.gateway.dispatch")

CallFn = Callable[[str, list[WorkItem], bool, float], Awaitable[dict[str, Any]]]
FailFn = Callable[[str, str], Awaitable[None]]
DeathFn = Callable[[str, list[WorkItem], str], "Poisoned | None"]
"""(rank id, the shard's items, why the engine died) -> the step's end, or None to re-run."""
LostFn = Callable[[], Awaitable[set[str]]]
"""The ranks the synchronizer holds LOST now (an empty set when it cannot be asked)."""


@dataclass(frozen=True)
class Poisoned:
    """The step ends because a request killed engines: the 500's message and field."""

    message: str
    field: str


class DispatchError(Exception):
    """The step cannot complete. `status`: 503 (no ranks left / too many re-runs), 504
    (deadline), 400 (a rank refused the body); `ranks`: the ranks at fault."""

    def __init__(self, status: int, message: str, ranks: Sequence[str], field_: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.ranks = list(ranks)
        self.field = field_


@dataclass
class ShardRun:
    """One call to one rank and what came of it."""

    rank_id: str
    items: list[WorkItem]
    rerun: bool
    result: StepShardResult | None = None
    error: str = ""


@dataclass
class DispatchResult:
    samples: dict[int, list[ReplySample]]
    """Per prompt index, the accepted samples."""
    runs: list[ShardRun]
    reruns: list[tuple[str, str, list[int], str]] = field(default_factory=list)
    """(from rank, to rank, prompt indices, reason) per re-run shard."""
    failed: dict[str, str] = field(default_factory=dict)
    """Failed rank -> first reason."""


def check_reply(rank_id: str, items: Sequence[WorkItem], body: Mapping[str, Any]
                ) -> tuple[StepShardResult, dict[int, list[ReplySample]]]:
    """Parse a StepShardResult and check it holds exactly the samples of `items`.

    Returns the parsed result and its samples per prompt index; ValueError otherwise.
    """
    try:
        result = StepShardResult.model_validate(body)
    except ValidationError as e:
        raise ValueError(f"malformed StepShardResult: {e.errors()[0]['msg']} at "
                         f"{'.'.join(map(str, e.errors()[0]['loc']))}") from None
    wanted = {(it.index, it.sample_offset + j) for it in items for j in range(it.n)}
    got: dict[int, list[ReplySample]] = {}
    seen: set[tuple[int, int]] = set()
    for prompt in result.results:
        for s in prompt.samples:
            uid = (prompt.index, s.sample_index)
            if uid not in wanted:
                raise ValueError(f"unexpected sample {s.sample_index} of prompt {prompt.index}")
            if uid in seen:
                raise ValueError(f"sample {s.sample_index} of prompt {prompt.index} twice")
            seen.add(uid)
            if len(s.output_logprobs) not in (0, len(s.output_ids)):
                raise ValueError(f"prompt {prompt.index} sample {s.sample_index}: "
                                 f"{len(s.output_logprobs)} logprobs for "
                                 f"{len(s.output_ids)} tokens")
            top = s.output_top_logprobs
            if top is not None and len(top) != len(s.output_ids):
                raise ValueError(f"prompt {prompt.index} sample {s.sample_index}: "
                                 f"{len(top)} top log-probs for {len(s.output_ids)} tokens")
            got.setdefault(prompt.index, []).append(ReplySample(s, rank_id, prompt.prompt_key))
    missing = sorted(wanted - seen)
    if missing:
        raise ValueError(f"{len(missing)} samples missing, first (prompt, sample) = {missing[0]}")
    return result, got


async def dispatch(assignment: Mapping[str, list[WorkItem]], call: CallFn, *,
                   timeout_s: float, max_reruns: int = 8,
                   on_failure: FailFn | None = None, send_empty: bool = False,
                   on_engine_death: DeathFn | None = None, lost: LostFn | None = None,
                   lost_poll_s: float = 1.0) -> DispatchResult:
    """Run `assignment` (rank -> items); re-run failed shards; see the module docstring.

    `send_empty`: call ranks that got no items too (an empty shard lets a rank report done
    and pre-generate at once); otherwise they are not called. `lost`: asked every
    `lost_poll_s` while calls run, in its own task (a slow answer delays no reply).
    """
    deadline = time.monotonic() + timeout_s
    alive = set(assignment)
    running: dict[asyncio.Task[dict[str, Any]], ShardRun] = {}
    dropped: list[asyncio.Task[dict[str, Any]]] = []
    out = DispatchResult(samples={}, runs=[])

    def start(rank_id: str, items: list[WorkItem], rerun: bool) -> None:
        run = ShardRun(rank_id, items, rerun)
        out.runs.append(run)
        remaining = deadline - time.monotonic()
        task = asyncio.ensure_future(call(rank_id, items, rerun, remaining))
        running[task] = run

    async def poll_lost() -> set[str]:
        await asyncio.sleep(lost_poll_s)
        assert lost is not None
        return await lost()

    def drop_calls(rank_id: str) -> list[ShardRun]:
        """Cancel every call still running on `rank_id`; their runs."""
        runs = []
        for task, other in list(running.items()):
            if other.rank_id == rank_id:
                del running[task]
                task.cancel()
                dropped.append(task)
                runs.append(other)
        return runs

    def same_engine(run: ShardRun) -> list[WorkItem]:
        """The items of `run` and of every other call still running on its rank, those calls
        dropped: they ran in the engine that just died (one death, counted once)."""
        items = list(run.items)
        for other in drop_calls(run.rank_id):
            other.error = run.error
            items += other.items
        return items

    async def fail(run: ShardRun, reason: str, engine_died: bool = False) -> None:
        run.error = reason
        log.warning("rank %s failed (%d prompts%s): %s", run.rank_id, len(run.items),
                    ", re-run shard" if run.rerun else "", reason)
        first = run.rank_id not in out.failed
        out.failed.setdefault(run.rank_id, reason)
        alive.discard(run.rank_id)
        if first and on_failure is not None:
            await on_failure(run.rank_id, reason)
        items = run.items
        if engine_died:
            items = same_engine(run)
            if on_engine_death is not None:
                poisoned = on_engine_death(run.rank_id, items, reason)
                if poisoned is not None:
                    raise DispatchError(500, poisoned.message, sorted(out.failed),
                                        poisoned.field)
        if len(out.reruns) >= max_reruns:
            raise DispatchError(503, f"giving up after {len(out.reruns)} re-runs; last: rank "
                                     f"{run.rank_id}: {reason}", sorted(out.failed))
        if not alive:
            names = ", ".join(f"{r} ({why})" for r, why in sorted(out.failed.items()))
            raise DispatchError(503, f"no rank left to run the step: failed {names}",
                                sorted(out.failed))
        loads = {r: 0.0 for r in alive}
        for other in running.values():
            if other.rank_id in loads:
                loads[other.rank_id] += sum(it.cost for it in other.items)
        for rank_id, its in lpt(items, sorted(alive), loads).items():
            if its:
                out.reruns.append((run.rank_id, rank_id, sorted({it.index for it in its}),
                                   reason))
                start(rank_id, its, True)

    for rank_id, items in assignment.items():
        if items or send_empty:
            start(rank_id, list(items), False)
    watch: asyncio.Task[set[str]] | None = None
    try:
        while running:
            if lost is not None and watch is None:
                watch = asyncio.ensure_future(poll_lost())
            remaining = deadline - time.monotonic()
            waiting: set[asyncio.Future[Any]] = {*running, *([watch] if watch else [])}
            done, _ = await asyncio.wait(waiting, timeout=max(0.0, remaining),
                                         return_when=asyncio.FIRST_COMPLETED)
            polled = watch is not None and watch in done
            done.discard(watch)  # type: ignore[arg-type]
            if not done and time.monotonic() >= deadline:
                pending = sorted({r.rank_id for r in running.values()})
                raise DispatchError(504, f"deadline of {timeout_s:g} s passed waiting for "
                                         f"rank(s) {', '.join(pending)}", pending)
            for task in done:
                run = running.pop(task, None)
                if run is None:  # dropped with its rank's dead engine (`same_engine`)
                    continue
                try:
                    body = task.result()
                    run.result, got = check_reply(run.rank_id, run.items, body)
                except RankCallError as e:
                    if e.bad_request:
                        raise DispatchError(400, f"rank {run.rank_id} refused the shard: "
                                                 f"{e.message}", [run.rank_id], e.field) from None
                    await fail(run, e.message, e.engine_died)
                    continue
                except ValueError as e:
                    await fail(run, f"invalid reply: {e}")
                    continue
                for index, samples in got.items():
                    out.samples.setdefault(index, []).extend(samples)
            if polled:  # after the replies that came in meanwhile: those are kept
                assert watch is not None
                gone = watch.result() if watch.exception() is None else set()
                watch = None
                for rank_id in sorted(gone & {r.rank_id for r in running.values()}):
                    runs = drop_calls(rank_id)
                    await fail(ShardRun(rank_id, [it for r in runs for it in r.items],
                                        any(r.rerun for r in runs)),
                               "LOST at the synchronizer (no heartbeat) while running its "
                               "shard")
                    for r in runs:
                        r.error = out.failed[rank_id]
    finally:
        for task in [*running, *([watch] if watch else [])]:
            task.cancel()
        if running or dropped or watch:
            await asyncio.gather(*running, *dropped, *([watch] if watch else []),
                                 return_exceptions=True)
    return out
