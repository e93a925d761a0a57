"""A rank's step logic: run its shard with drafts from the store, report done, then
pre-generate the next step's tasks in the bubble until the synchronizer says stop (with a
tail-fill budget, already beside the shard's last requests: `rank/tail_fill.py`).

Degrades, never blocks: without a synchronizer (or when it is unreachable) the shard is
decoded without shared drafts and no pre-generation happens; the step still completes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from bubblespec.core.engine_time import EngineTime
from bubblespec.engine.pace import engine_time
from bubblespec.engine.types import BatchProgress, GenRequest, GenResult, SampleResult
from bubblespec.metrics.rank import RankMetrics, set_state
from bubblespec.protocol.domain import Flip, RankState, RankStatus, Span, SpanKind
from bubblespec.protocol.keys import prompt_key
from bubblespec.protocol.limits import MAX_FLIPS
from bubblespec.protocol.rank import PromptOut, SampleOut, ShardRequest, StepShard, StepShardResult
from bubblespec.rank.config import RankConfig
from bubblespec.rank.pregen import Pregenerator, PregenOutcome
from bubblespec.rank.tail_fill import TailFill

log = logging.getLogger(__name__)


def to_gen_request(r: ShardRequest) -> GenRequest:
    return GenRequest(input_ids=list(r.input_ids), n=r.n, seeds=r.seeds,
                      sample_offset=r.sample_offset,
                      group=r.prompt_key or prompt_key(r.input_ids), sampling=r.sampling_params,
                      top_logprobs=r.top_logprobs)


def to_sample_out(s: SampleResult) -> SampleOut:
    """A sample as the rank answers it, with the engine's record as its `meta_info`."""
    top = None if s.top_logprobs is None else [list(d.items()) for d in s.top_logprobs]
    return SampleOut(sample_index=s.sample_index, output_ids=s.output_ids,
                     output_logprobs=s.output_logprobs, output_top_logprobs=top,
                     meta_info=s.meta)


def to_prompt_out(index: int, res: GenResult) -> PromptOut:
    return PromptOut(index=index, prompt_key=res.group,
                     samples=[to_sample_out(s) for s in res.samples])


def flips_of(results: list[GenResult]) -> list[Flip]:
    """The samples that left their pre-generated draft where a token flipped (not where the
    draft ended): the synchronizer calibrates the streamed-branch threshold from them. The
    first `MAX_FLIPS` only: a sample of them is all the calibration needs."""
    return [Flip(g.group, s.sample_index, s.first_divergence) for g in results
            for s in g.samples if s.first_divergence is not None
            and s.draft_ran_out is False][:MAX_FLIPS]


class RankWorker:
    """Owns the engine of one rank and its conversation with the synchronizer."""

    def __init__(self, cfg: RankConfig, rank_id: str, engine: Any, sync: Any | None,
                 metrics: RankMetrics) -> None:
        self.cfg = cfg
        self.rank_id = rank_id
        self.engine = engine
        self.sync = sync
        self.m = metrics
        self.state = RankState.IDLE
        self.step: int | None = None
        self.done_step: int | None = None
        self._pregen_task: asyncio.Task | None = None
        self._pregen_stop = asyncio.Event()
        self.aborted_step: int | None = None
        """A step whose shard is aborted (`abort_step`): its samples end with what they have."""
        set_state(metrics, rank_id, RankState.IDLE)

    def _set(self, state: RankState) -> None:
        self.state = state
        set_state(self.m, self.rank_id, state)

    def status(self) -> RankStatus:
        """What the heartbeat reports."""
        return RankStatus(state=self.state, weight_version=self.engine.weight_version,
                          step=self.step, done_step=self.done_step)

    async def stop_pregen(self) -> None:
        """Stop a running pre-generation (its partial drafts are pushed) and wait for it."""
        task = self._pregen_task
        if task is not None and not task.done():
            self._pregen_stop.set()
            await asyncio.gather(task, return_exceptions=True)
        self._pregen_task = None

    def abort_step(self, step: int) -> bool:
        """Abort the shard of `step` if it is decoding (within `poll_every` engine steps its
        unfinished samples end with finish reason abort and the tokens they have); whether
        it was decoding."""
        self.aborted_step = step
        return self.state is RankState.DECODING and self.step == step

    # ------------------------------------------------------------------ shard
    async def run_shard(self, shard: StepShard, reqs: list[GenRequest]) -> StepShardResult:
        """Decode this rank's share of `shard.step`, then start pre-generation. `reqs` are
        its requests as the engine runs them, checked by the caller (`RankService`, where
        the shard came in: `engine.validate` with the shard's field names)."""
        if not shard.rerun:
            await self.stop_pregen()
        t0 = time.time()
        self._set(RankState.DECODING)
        self.step = shard.step
        fetched = await self._fetch_drafts(shard.step, reqs)

        async def aborted() -> bool:
            return self.aborted_step == shard.step

        tail = self._tail_fill(shard)
        if tail is not None:
            self._pregen_stop = asyncio.Event()
            self._pregen_task = asyncio.create_task(self._pregen(shard.step, t0, tail))
        try:
            results = await self.engine.generate(reqs, should_stop=aborted,
                                                 poll_every=self.cfg.poll_every,
                                                 validated=True,
                                                 progress=None if tail is None
                                                 else tail.progress)
        except BaseException:
            if tail is not None:  # no bubble follows a failed shard
                self._pregen_stop.set()
                tail.end()
            raise
        finally:
            await self.engine.release_groups([r.group_key() for r in reqs])
        t1 = time.time()
        tokens = self._count(results)
        self.m.shard_duration.labels(self.rank_id).observe(t1 - t0)
        out = StepShardResult(step=shard.step, rank_id=self.rank_id,
                              results=[to_prompt_out(r.index, g)
                                       for r, g in zip(shard.requests, results)],
                              decode_seconds=t1 - t0, drafts_fetched_tokens=fetched)
        if self.sync is not None:  # done first: it may fire the stop signal
            if not shard.rerun:
                await self.sync.report_done(shard.step, self.rank_id, flips_of(results))
            await self.sync.report_spans(self.rank_id, shard.step,
                                         [Span(SpanKind.DECODE, t0, t1, tokens)])
        if not shard.rerun:
            self.done_step = shard.step
        self._set(RankState.IDLE)
        if tail is not None:  # the lanes beside the shard go on as the bubble's
            tail.end()
            if self._pregen_task is not None and not self._pregen_task.done():
                self._set(RankState.PREGEN)
        elif shard.pregen and not shard.rerun and self.sync is not None:
            self._pregen_stop = asyncio.Event()
            self._pregen_task = asyncio.create_task(self._pregen(shard.step, t1))
        return out

    def _tail_fill(self, shard: StepShard) -> TailFill | None:
        """The tail-fill allowance of this shard (None: off, or no bubble follows it)."""
        c = self.cfg
        if (c.tail_fill_budget <= 0 or self.sync is None or not shard.pregen
                or shard.rerun):
            return None
        et = engine_time(c.pace) if c.pace != "off" else EngineTime.preset(c.tail_fill_gpu)
        lane_tokens = 1 + (c.num_speculative_tokens if self.engine.speculative else 0)
        return TailFill(et, c.tail_fill_budget, BatchProgress(), lane_tokens,
                        c.pregen_inflight)

    def _count(self, results: list[GenResult]) -> int:
        tokens = 0
        lab = self.rank_id
        for g in results:
            for s in g.samples:
                tokens += len(s.output_ids)
                self.m.decode_steps.labels(lab).inc(s.decode_steps)
                self.m.num_drafts.labels(lab).inc(s.num_drafts)
                self.m.num_draft_tokens.labels(lab).inc(s.num_draft_tokens)
                self.m.num_accepted_tokens.labels(lab).inc(s.num_accepted_tokens)
        self.m.generation_tokens.labels(lab).inc(tokens)
        return tokens

    async def _fetch_drafts(self, step: int, reqs: list[GenRequest]) -> int:
        if self.sync is None or not self.engine.speculative or "pregen" not in self.cfg.sources:
            return 0
        peer_before = self.sync.peer_tokens_fetched
        drafts = await self.sync.fetch_drafts(step, sorted({r.group_key() for r in reqs}))
        self.m.drafts_peer_tokens.labels(self.rank_id).inc(
            self.sync.peer_tokens_fetched - peer_before)
        items = [(d.prompt_key, d.sample_index, list(d.token_ids), d.branch_at)
                 for d in drafts if d.token_ids]
        if items:
            await self.engine.add_drafts(items)
        n = sum(len(i[2]) for i in items)
        self.m.drafts_fetched_tokens.labels(self.rank_id).inc(n)
        return n

    # ------------------------------------------------------------------ pre-generation
    async def _pregen(self, step: int, done_at: float, tail: TailFill | None = None) -> None:
        """Pre-generate next-step tasks (see `rank/pregen.py`) until the stop signal (or the
        close, in the TRAINING window), then idle until the stop signal or a local stop
        (next shard, weight update). With `tail`, it starts beside the shard (which sets
        the rank's state) and the bubble begins when the shard ends."""
        assert self.sync is not None
        if tail is None:
            self._set(RankState.PREGEN)
        out = PregenOutcome()
        try:
            out = await Pregenerator(self.engine, self.sync, self.rank_id, step,
                                     self.cfg.pregen_inflight, self.cfg.poll_every,
                                     self._pregen_stop, self.cfg.pregen_branches,
                                     branch_margin=self.cfg.pregen_branch_margin,
                                     tail=tail).run()
        except Exception:  # pre-generation is best effort: never take the rank down
            log.exception("pre-generation of step %d failed", step + 1)
        t1 = time.time()
        if self.state is RankState.PREGEN:
            self._set(RankState.IDLE)
        lab = self.rank_id
        self.m.pregen_requests.labels(lab).inc(out.tasks)
        self.m.pregen_branches.labels(lab).inc(out.branches)
        self.m.pregen_branch_tokens.labels(lab).inc(out.branch_tokens)
        self.m.pregen_offers_streamed.labels(lab).inc(out.streamed_offers)
        self.m.pregen_refreshed.labels(lab).inc(out.refreshed)
        self.m.pregen_tokens.labels(lab).inc(out.tokens)
        if out.tail_end is not None:
            self.m.pregen_tail_tokens.labels(lab).inc(out.tail_end[1])
        self.m.pregen_pushed_tokens.labels(lab).inc(out.pushed_tokens)
        if out.ended_at > out.started_at:
            spans = [Span(SpanKind(k), a, b, n) for k, a, b, n in out.spans()]
            await self.sync.report_spans(lab, step, spans)
            self.m.pregen_seconds.labels(lab).inc(out.ended_at - out.started_at)
        if not out.stopped and not self._pregen_stop.is_set():
            await self._wait_stop_or_cancel(step)
        t2 = time.time()
        if t2 > t1:
            await self.sync.report_spans(lab, step, [Span(SpanKind.IDLE, t1, t2, 0)])
        if tail is not None:
            done_at = tail.ended_at or t2
        self.m.bubble_seconds.labels(lab).inc(max(0.0, t2 - done_at))

    async def _wait_stop_or_cancel(self, step: int) -> None:
        """Idle until the step's stop signal or a local stop (next shard, weight update)."""
        waiter = asyncio.create_task(self.sync.wait_stop(step, self.rank_id, timeout_s=3600))
        local = asyncio.create_task(self._pregen_stop.wait())
        await asyncio.wait([waiter, local], return_when=asyncio.FIRST_COMPLETED)
        for t in (waiter, local):
            t.cancel()
