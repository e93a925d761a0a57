"""One rollout step end to end, and weight updates: what the gateway's POST routes do.

A rollout (one at a time, under a lock): discover live ranks -> close the previous step and
record its bubble figures -> shard the batch (LPT) -> open the step at the synchronizer with
the shard sizes and the next step's pre-generation tasks -> run the shards concurrently,
re-running those of failed ranks (`dispatch`) -> put the samples back in request order ->
learn response lengths -> answer. The synchronizer being unreachable degrades the step
(ranks decode without drafts) and says so in `warnings`; it never fails it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import grpc

from bubblespec.gateway.bubbles import step_bubbles
from bubblespec.gateway.config import GatewayConfig
from bubblespec.gateway.dispatch import (
    DeathFn,
    DispatchError,
    DispatchResult,
    Poisoned,
    dispatch,
)
from bubblespec.gateway.errors import RankCallError
from bubblespec.gateway.prepare import Prepared, Preparer
from bubblespec.gateway.quarantine import Quarantine, describe, fingerprint
from bubblespec.gateway.ranks import Discovery, RankEndpoint, RankPool
from bubblespec.gateway.seeds import lookahead_tasks, resolve_seed_mode, step_seeds
from bubblespec.gateway.shard import (
    AssemblyError,
    LengthEstimator,
    ReplySample,
    WorkItem,
    assemble,
    lpt,
    make_items,
)
from bubblespec.metrics.gateway import GatewayMetrics
from bubblespec.protocol.domain import RankState
from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.gateway import (
    PromptResult,
    RankShard,
    Rerun,
    RolloutCounters,
    RolloutRequest,
    RolloutResponse,
    RolloutSample,
)
from bubblespec.protocol.rank import ShardRequest, StepShard, WeightUpdate
from bubblespec.protocol.sampling import PregenWindow, SamplingParams
from bubblespec.synchronizer.client import SyncClient
from bubblespec.synchronizer.errors import SyncError, SyncUnavailable

log = logging.getLogger("bubblespec.gateway.rollout")

def trainer_field(rank_field: str) -> str:
    """A field a rank refused in its step shard (`requests[2].sampling_params.top_k`) as the
    trainer's rollout request spells it (`sampling_params.top_k`); the shard's request index
    is not the trainer's prompt index, so it is left out."""
    return re.sub(r"^requests\[\d+\]\.", "", rank_field)


def _sample(r: ReplySample, with_logprobs: bool, top: bool) -> RolloutSample:
    """An accepted sample of a rank's reply (`dispatch.check_reply`) with the rank's record."""
    s = r.sample
    return RolloutSample.of(s.meta_info, s.sample_index, s.output_ids,
                            s.output_logprobs if with_logprobs else None,
                            s.output_top_logprobs if top else None)


class Rollouts:
    """The rollout and weight-update logic behind the gateway's routes."""

    def __init__(self, config: GatewayConfig, pool: RankPool, sync: SyncClient | None,
                 metrics: GatewayMetrics, preparer: Preparer | None = None) -> None:
        self.config = config
        self.pool = pool
        self.sync = sync
        self.metrics = metrics
        self.preparer = preparer or Preparer(config)
        self.estimator = LengthEstimator(config.length_ema, config.length_keys)
        self.quarantine = Quarantine(hold_s=config.quarantine_s,
                                     suspect_s=max(config.quarantine_s, 60.0))
        self.lock = asyncio.Lock()
        self.last_step: int | None = None
        self.handed_ahead = False  # the last step passed next prompts ahead
        self.summaries: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self.last_discovery: Discovery | None = None
        self._unobserved: list[int] = []

    # ------------------------------------------------------------------ helpers

    async def discover(self) -> Discovery:
        d = await self.pool.discover()
        self.last_discovery = d
        return d

    def rank_counts(self) -> tuple[int, int]:
        d = self.last_discovery
        return (0, 0) if d is None else (len(d.ranks), len(d.ready))

    def next_step(self, d: Discovery) -> int:
        """The number of the next step when the caller gives none: one past the last step
        this gateway ran, else one past the synchronizer's current step."""
        if self.last_step is not None:
            return self.last_step + 1
        cur = d.snapshot.current_step if d.snapshot is not None else None
        return 0 if cur is None else cur + 1

    async def _drain_pregen(self, d: Discovery) -> None:
        """Ranks stop pre-generating within T decode steps of the stop signal, then push
        their drafts; wait (bounded) so the next step's fetch sees every draft."""
        deadline = time.monotonic() + self.config.pregen_drain_s
        busy = [r for r in d.ready if r.state == "pregen"]
        while busy and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            probed = await asyncio.gather(*(self.pool.probe(r) for r in busy))
            busy = [r for r in probed if r.state == "pregen"]

    async def _close_previous(self, sync_ok: bool, close: bool = True) -> None:
        """Close the previous step (ends pre-generation in its training window)."""
        if self.sync is None or not sync_ok or self.last_step is None or not close:
            return
        try:
            await self.sync.close_step(self.last_step, timeout_s=self.config.sync_timeout_s)
        except SyncError as e:
            log.info("close_step(%d): %s", self.last_step, e)

    async def _observe_finished(self, sync_ok: bool) -> None:
        """Record the bubble figures of the steps now final."""
        if self.sync is None or not sync_ok:
            return
        t = self.config.sync_timeout_s
        for step in self._unobserved[-4:]:
            try:
                b = step_bubbles(await self.sync.get_timeline(step, timeout_s=t))
            except SyncError:
                continue
            m = self.metrics
            m.step_bubble_fraction.observe(b.bubble_fraction)
            m.step_pregen_share.observe(b.pregen_share)
            for r in b.ranks:
                m.step_bubble.labels(r.rank_id).observe(r.bubble_s)
                m.step_pregen.labels(r.rank_id).observe(r.pregen_s)
                m.pregen_tokens.labels(r.rank_id).inc(r.pregen_tokens)
                m.window_pregen_tokens.labels(r.rank_id).inc(r.window_pregen_tokens)
        self._unobserved.clear()

    @staticmethod
    def _current_ranks(ready: list[RankEndpoint], warnings: list[str]) -> list[RankEndpoint]:
        """Ready ranks at the newest weight version (stale ones would break on-policy)."""
        versions = [r.weight_version for r in ready if r.weight_version is not None]
        if not versions:
            return ready
        newest = max(versions)
        stale = [r for r in ready if r.weight_version is not None and r.weight_version < newest]
        for r in stale:
            warnings.append(f"rank {r.rank_id} left out: weight version {r.weight_version} "
                            f"< {newest}")
        return [r for r in ready if r not in stale]

    async def _open(self, step: int, assignment: dict[str, list[WorkItem]],
                    ranks: dict[str, RankEndpoint], tasks: list, warnings: list[str],
                    window: PregenWindow = PregenWindow.BUBBLE) -> bool:
        """Open the step at the synchronizer; False (with a warning) when it is unreachable."""
        shards = {r: sum(it.n for it in items) for r, items in assignment.items()
                  if ranks[r].registered}
        if self.sync is None:
            return False
        if not shards:
            warnings.append("no rank is registered at the synchronizer: no pre-generation")
            return False
        versions = [ranks[r].weight_version for r in shards
                    if ranks[r].weight_version is not None]
        try:
            await self.sync.open_step(step, shards, tasks, timeout_s=self.config.sync_timeout_s,
                                      pregen_window=window,
                                      weight_version=max(versions) if versions else None)
            return True
        except SyncUnavailable as e:
            warnings.append(f"synchronizer unreachable ({e.code.name}): ranks decode without "
                            "drafts, no pre-generation this step")
            self.metrics.sync_unavailable.inc()
            return False
        except SyncError as e:
            if e.code is grpc.StatusCode.INVALID_ARGUMENT and e.field == "step":
                raise ApiError(409, e.message, "step") from None
            if e.code is grpc.StatusCode.INVALID_ARGUMENT and e.field.startswith("next_prompts"):
                raise ApiError(422, f"synchronizer: {e.message}", e.field) from None
            if e.field.startswith("shards"):
                raise  # a rank went away between discovery and OpenStep: caller retries
            raise ApiError(502, f"synchronizer refused OpenStep: {e}") from None

    # ------------------------------------------------------------------ rollout

    async def rollout(self, req: RolloutRequest) -> RolloutResponse:
        """Run one step (see the module docstring); ApiError for what the trainer sees."""
        prep = self.preparer.prepare(req)
        self.check_quarantine(prep.prompts, req.sampling_params)
        async with self.lock:
            t0 = time.monotonic()
            resp = await self._rollout(req, prep, t0)
            self.metrics.rollout_duration.observe(time.monotonic() - t0)
            return resp

    def check_quarantine(self, prompts: list[list[int]], sampling: SamplingParams,
                         field_of: Callable[[int], str] = lambda i: f"prompts[{i}]") -> None:
        """422 naming the first quarantined request among `prompts` (`quarantine.py`)."""
        try:
            self.quarantine.check(prompts, sampling, field_of)
        except ApiError:
            self.metrics.quarantine_refused.inc()
            raise

    def _on_engine_death(self, prep: Prepared, sampling: SamplingParams) -> DeathFn:
        """The dispatch hook: count the death against the shard's requests, and end the step
        when one of them is now quarantined (a 500 naming it, no further rank gets it)."""

        def hook(rank_id: str, items: list[WorkItem], reason: str) -> Poisoned | None:
            params = describe(sampling)
            reqs = {}
            for it in items:
                what = (f"request prompts[{it.index}] ({len(it.input_ids)} prompt tokens, key "
                        f"{it.key}; sampling {params})")
                reqs[it.index] = (fingerprint(prep.prompts[it.index], sampling), what)
            got = self.engine_died(rank_id, reason, reqs)
            if got is None:
                return None
            first, names = got
            return Poisoned(f"{names}: quarantined for {self.quarantine.hold_s:g} s (refused "
                            "with 422 until then) and sent to no further rank",
                            f"prompts[{first}]")

        return hook

    def engine_died(self, rank_id: str, reason: str,
                    reqs: dict[int, tuple[str, str]]) -> tuple[int, str] | None:
        """Count an engine death against the requests it ran (index -> (fingerprint, what)),
        for rollout shards and scoring calls alike; (the first index now quarantined, the
        reasons) when one is, else None."""
        self.metrics.engine_deaths.labels(rank_id).inc()
        held = self.quarantine.engine_died(rank_id, reason, list(reqs.values()))
        if not held:
            return None
        self.metrics.quarantined.inc(len(held))
        held_fps = {h.fingerprint for h in held}  # (quarantine_s 0: held, never refused)
        first = min(i for i, (fp, _) in reqs.items() if fp in held_fps)
        names = "; ".join(h.reason() for h in held)
        log.error("quarantined %d request(s): %s", len(held), names)
        return first, names

    async def _rollout(self, req: RolloutRequest, prep: Prepared, t0: float) -> RolloutResponse:
        c = self.config
        warnings: list[str] = []
        d = await self.discover()
        if self.sync is not None and not d.sync_ok:
            warnings.append(f"synchronizer unreachable: {d.sync_error}; ranks decode without "
                            "drafts, no pre-generation this step")
            self.metrics.sync_unavailable.inc()
        step = req.step if req.step is not None else self.next_step(d)
        # close first: ranks pre-generating through the training window stop at the close
        await self._close_previous(d.sync_ok, close=step != self.last_step)
        await self._drain_pregen(d)
        await self._observe_finished(d.sync_ok)
        ready = self._current_ranks(d.ready, warnings)
        if not ready:
            known = "; ".join(f"{r.rank_id}: {r.error or r.state}" for r in d.ranks) or "none"
            raise ApiError(503, f"no rank is ready (known ranks: {known})")
        hands_ahead = prep.hands_ahead and req.pregen
        sp = resolve_seed_mode(req.sampling_params, hands_ahead or self.handed_ahead,
                               c.handoff_seed_mode)
        self.handed_ahead = hands_ahead
        seeds = step_seeds(c.run_seed, step, prep.keys, req.n, prep.seeds)
        tasks = []
        if hands_ahead:
            tasks = lookahead_tasks(c.run_seed, step, prep.next_batches, req.n, sp,
                                    prep.next_seeds)
        by_id = {r.rank_id: r for r in ready}
        opened = False
        for _attempt in range(3):
            items = make_items(prep.keys, prep.prompts, req.n, seeds, self.estimator,
                               sp.max_new_tokens, len(by_id), c.split_samples)
            assignment = lpt(items, sorted(by_id))
            if not d.sync_ok:
                break
            try:
                opened = await self._open(step, assignment, by_id, tasks, warnings,
                                          PregenWindow(req.pregen_window or c.pregen_window))
                break
            except SyncError as e:  # a rank named in the shards is gone: leave it out
                bad = next((r for r in sorted(assignment) if repr(r) in e.message), None)
                if bad is None or len(by_id) == 1:
                    raise ApiError(502, f"synchronizer refused OpenStep: {e}") from None
                warnings.append(f"rank {bad} left out: {e.message}")
                by_id.pop(bad)
        else:
            warnings.append("could not open the step at the synchronizer: no pre-generation")
        self.last_step = step
        if opened:
            self._unobserved.append(step)

        # without the synchronizer there is nothing to claim and no stop signal to wait for
        pregen = req.pregen and opened

        async def call(rank_id: str, its: list[WorkItem], rerun: bool, timeout_s: float
                       ) -> dict[str, Any]:
            body = StepShard(step=step, pregen=pregen, rerun=rerun, requests=[
                ShardRequest(index=it.index, input_ids=list(it.input_ids), n=it.n,
                             sample_offset=it.sample_offset, prompt_key=it.key,
                             seeds=None if it.seeds is None else list(it.seeds),
                             sampling_params=sp, top_logprobs=req.top_logprobs)
                for it in its])
            return await self.pool.post(by_id[rank_id], "/v1/step_shard",
                                        body.model_dump(mode="json"), timeout_s)

        async def on_failure(rank_id: str, reason: str) -> None:
            self.metrics.rank_failures.labels(rank_id).inc()
            warnings.append(f"rank {rank_id} failed mid-step: {reason}")
            if opened and self.sync is not None:  # the stop signal must not wait for it
                await self.sync.report_done(step, rank_id, timeout_s=c.sync_timeout_s)

        async def lost() -> set[str]:
            snapshot, _ = await self.pool.sync_snapshot()
            if snapshot is None:  # unreachable or restarting: nothing known to be lost
                return set()
            return {r.rank_id for r in snapshot.ranks if r.state is RankState.LOST}

        remaining = c.rollout_timeout_s - (time.monotonic() - t0)
        try:
            res = await dispatch(assignment, call, timeout_s=remaining,
                                 max_reruns=c.max_reruns, on_failure=on_failure,
                                 send_empty=bool(tasks) and opened,
                                 on_engine_death=self._on_engine_death(prep, req.sampling_params),
                                 lost=lost if self.sync is not None else None,
                                 lost_poll_s=c.lost_poll_s)
        except DispatchError as e:
            raise ApiError(e.status, str(e), trainer_field(e.field)) from None
        if res.failed:  # re-run and completed: no longer suspects of an engine death
            self.quarantine.cleared([fingerprint(p, req.sampling_params) for p in prep.prompts])
        try:
            ordered = assemble(req.n, len(prep.prompts), res.samples)
        except AssemblyError as e:  # dispatch checked every reply: a bug if it happens
            raise ApiError(502, f"incomplete results: {e}") from None
        return self._respond(step, req, sp, prep, ordered, res, by_id, warnings, t0)

    def _respond(self, step: int, req: RolloutRequest, sp: SamplingParams, prep: Prepared,
                 ordered: list[list[dict[str, Any]]], res: DispatchResult,
                 ranks: dict[str, RankEndpoint], warnings: list[str], t0: float
                 ) -> RolloutResponse:
        prompts: list[PromptResult] = []
        per_rank: dict[str, RankShard] = {r: RankShard(rank_id=r) for r in sorted(ranks)}
        for index, samples in enumerate(ordered):
            out = [_sample(s, req.return_logprobs, req.top_logprobs > 0) for s in samples]
            rank_ids = sorted({s.rank_id for s in samples})
            prompts.append(PromptResult(index=index, prompt_key=prep.keys[index],
                                        rank_id=",".join(rank_ids),
                                        input_ids=prep.prompts[index], samples=out))
            self.estimator.observe(prep.keys[index],
                                   sum(s.completion_tokens for s in out) / len(out))
            for s, o in zip(samples, out):
                rs = per_rank[s.rank_id]
                rs.num_samples += 1
                rs.completion_tokens += o.completion_tokens
                rs.decode_steps = max(rs.decode_steps, o.decode_steps)
            for r in rank_ids:
                per_rank[r].num_prompts += 1
        for run in res.runs:
            rs = per_rank[run.rank_id]
            rs.rerun = rs.rerun or run.rerun
            if run.result is not None:
                rs.decode_seconds += run.result.decode_seconds
                rs.drafts_fetched_tokens += run.result.drafts_fetched_tokens
        for r, why in res.failed.items():
            per_rank[r].failed = why
        samples_all = [s for p in prompts for s in p.samples]
        k = RolloutCounters.of(samples_all, list(per_rank.values()))
        wall = time.monotonic() - t0
        resp = RolloutResponse(
            step=step, prompts=prompts, counters=k, ranks=list(per_rank.values()),
            seed_mode=sp.seed_mode,
            weight_versions=sorted({s.weight_version for s in samples_all}),
            reruns=[Rerun(from_rank=a, to_rank=b, indices=ix, reason=why)
                    for a, b, ix, why in res.reruns],
            wall_s=wall, warnings=warnings)
        self._record(resp, len(samples_all))
        return resp

    def _record(self, resp: RolloutResponse, num_samples: int) -> None:
        k = resp.counters
        self.metrics.record_rollout(k, len(resp.prompts), num_samples, len(resp.reruns))
        self.summaries[resp.step] = {
            "step": resp.step, "wall_s": resp.wall_s, "num_prompts": len(resp.prompts),
            "num_samples": num_samples, "weight_versions": resp.weight_versions,
            "counters": k.model_dump(), "ranks": [r.model_dump() for r in resp.ranks],
            "reruns": [r.model_dump() for r in resp.reruns], "warnings": resp.warnings}
        while len(self.summaries) > self.config.keep_steps:
            self.summaries.popitem(last=False)

    # ------------------------------------------------------------------ weights

    async def update_weights(self, body: WeightUpdate) -> dict[str, Any]:
        """Reload weights on every ready rank, all to the same version. When every rank
        refused (4xx: a checkpoint that does not match the model, a version that does not
        go up), the gateway answers that refusal itself; other failures are 502 naming the
        ranks that failed and those that took the weights."""
        async with self.lock:
            d = await self.discover()
            ready = d.ready
            if not ready:
                raise ApiError(503, "no rank is ready to take the weights")
            version = body.version
            if version is None:
                version = max((r.weight_version or 0 for r in ready), default=0) + 1
            payload = {"path": body.path, "version": version, "force": body.force}
            results = await asyncio.gather(*(
                self.pool.post(r, "/v1/weights", payload, self.config.weights_timeout_s)
                for r in ready), return_exceptions=True)
            versions: dict[str, int] = {}
            errors: list[RankCallError] = []
            for r, out in zip(ready, results):
                if isinstance(out, RankCallError):
                    errors.append(out)
                elif isinstance(out, BaseException):
                    raise out
                else:
                    versions[r.rank_id] = int(out.get("weight_version", version))
            if errors:
                ok = ", ".join(f"{r} (version {v})" for r, v in sorted(versions.items()))
                bad = "; ".join(str(e) for e in errors)
                statuses = {e.status for e in errors}
                if not versions and all(s is not None and 400 <= s < 500 for s in statuses):
                    status = statuses.pop() if len(statuses) == 1 else 400
                    raise ApiError(status, f"weight update refused: {bad}",
                                   errors[0].field or "path")
                raise ApiError(502, f"weight update failed: {bad}"
                                        + (f"; updated: {ok}" if ok else ""))
            skipped = {r.rank_id: r.error or r.state for r in d.ranks if not r.ready}
            return {"weight_version": version, "ranks": versions, "skipped": skipped}
