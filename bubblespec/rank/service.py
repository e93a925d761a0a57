"""The rank's service object: the engine and worker it starts, and what its routes answer.

`start()` (the app's lifespan) starts the vLLM engine in the background, so that the server
answers `/health` at once and `/health_generate` 503 until the engine is up; it then registers
at the synchronizer (when one is configured) and heartbeats. Routes that need the engine get
503 naming `engine` before that. Engine-side validation errors name the field the way the
request spells it (`requests[2].input_ids[7]` for a step shard).

Engine liveness: a watcher checks every `engine_check_s` that the engine core still runs.
When it died, the rank reports `engine_dead` (GET /health_generate 503, GET /v1/state, the
heartbeat, the metrics), so the gateway routes around it, and starts a new engine with the
last good weights and their version. The restart budget is a rate (`bubblespec.restarts`):
a death when `engine_restarts` restarts (failed attempts included) already happened within
the last `engine_restart_window_s` makes the process exit with `EXIT_ENGINE`, so that its
supervisor (`LocalCluster`, compose, Kubernetes, Ray) replaces it; deaths spread out further
than that are restarted for as long as the process lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from bubblespec.config import effective_config_dict
from bubblespec.engine.types import GenRequest, SampleResult
from bubblespec.metrics import render
from bubblespec.metrics.rank import new_rank_metrics, set_state
from bubblespec.protocol.domain import RankState
from bubblespec.protocol.errors import ApiError, InvalidRequest
from bubblespec.protocol.keys import prompt_key
from bubblespec.protocol.rank import (
    ENGINE_DIED_HEADER,
    AbortStep,
    CheckSampling,
    DraftIndexBody,
    GenerateRequest,
    HeapBody,
    PaceBody,
    ParseToolCalls,
    RankStateBody,
    ScoredPrompt,
    ScoreRequest,
    ScoreResult,
    ShardRequest,
    StepShard,
    WeightUpdate,
)
from bubblespec.protocol.weights import (
    MEMORY_TAGS,
    TensorBucket,
    WeightBucket,
    WeightGroupOpen,
)
from bubblespec.rank.config import RankConfig
from bubblespec.rank.tool_calls import parse_tool_calls
from bubblespec.rank.worker import RankWorker, to_gen_request, to_sample_out

log = logging.getLogger("bubblespec.rank")

EXIT_ENGINE = 4
"""Exit status of a rank whose engine died when its restart budget (`engine_restarts` per
`engine_restart_window_s`) was spent: its supervisor starts the process again."""


def default_rank_id(cfg: RankConfig) -> str:
    """r<ordinal> under a StatefulSet (hostname name-<n>), else rank-<port>."""
    if cfg.rank_id:
        return cfg.rank_id
    host = socket.gethostname()
    tail = host.rsplit("-", 1)[-1]
    return f"r{tail}" if tail.isdigit() else f"rank-{cfg.port}"


def _is_engine_death(e: BaseException) -> bool:
    """vLLM's EngineDeadError anywhere in the exception's chain."""
    seen: BaseException | None = e
    while seen is not None:
        if type(seen).__name__ == "EngineDeadError":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class RankService:
    """One rank: its engine and worker (started in the background), metrics and routes' logic."""

    def __init__(self, cfg: RankConfig) -> None:
        self.cfg = cfg
        self.rank_id = default_rank_id(cfg)
        self.metrics = new_rank_metrics(self.rank_id)
        self.worker: RankWorker | None = None
        self.engine: Any = None
        self.sync: Any = None
        self.drafts_server: Any = None
        """The rank's DraftPeer server (`drafts_port`), if it serves its drafts."""
        self.start_error: str | None = None
        self.engine_error: str | None = None
        self.released: set[str] = set()
        """The engine's memory released by a colocated trainer (SGLang's tags)."""
        """Why the engine is down while the rank restarts it (None while it runs)."""
        from bubblespec.restarts import RestartWindow  # local: the module's imports are shared

        self.restarts = RestartWindow(cfg.engine_restarts, cfg.engine_restart_window_s)
        """The engine restarts of the last `engine_restart_window_s` (failed ones count)."""
        self._hb_stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        set_state(self.metrics, self.rank_id, RankState.STARTING)

    @property
    def address(self) -> str:
        return self.cfg.advertise_address or f"{self.cfg.host}:{self.cfg.port}"

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the engine in the background (the app's lifespan calls this)."""
        self._tasks.append(asyncio.create_task(self._start()))

    async def _start(self) -> None:
        from bubblespec.engine.engine import RolloutEngine

        try:
            t0 = time.monotonic()
            self.engine = await RolloutEngine.start(self.cfg.engine_config())
            log.info("rank %s: engine ready in %.1f s", self.rank_id, time.monotonic() - t0)
        except Exception as e:  # reported by /health_generate, the process stays up
            log.exception("engine start failed")
            self.start_error = f"engine start failed: {e}"
            return
        if self.cfg.sync_address:
            from bubblespec.synchronizer.client import SyncClient
            from bubblespec.tls import sync_credentials

            tok = self.cfg.sync_token.get_secret_value() if self.cfg.sync_token else None
            self.sync = SyncClient(self.cfg.sync_address, token=tok,
                                   timeout_s=self.cfg.sync_timeout_s,
                                   credentials=sync_credentials(self.cfg))
            if self.cfg.drafts_port >= 0:
                await self._serve_drafts()
            try:
                await self.sync.register(self.rank_id, self.address,
                                         weight_version=self.engine.weight_version,
                                         vocab_size=self.engine.vocab_size)
            except Exception as e:  # noqa: BLE001 (heartbeats keep retrying the registration)
                log.warning("synchronizer not reachable yet (%s); decoding without it", e)
        self.worker = RankWorker(self.cfg, self.rank_id, self.engine, self.sync, self.metrics)
        self.metrics.weight_version.labels(self.rank_id).set(self.engine.weight_version)
        self.metrics.engine_alive.labels(self.rank_id).set(1)
        if self.sync is not None:
            self._tasks.append(asyncio.create_task(self.sync.run_heartbeats(
                self.rank_id, self.worker.status, self._hb_stop)))
        self._tasks.append(asyncio.create_task(self._watch_engine()))

    async def _serve_drafts(self) -> None:
        """Serve this rank's pushed drafts to the other ranks (`RankConfig.drafts_port`);
        a server that cannot bind leaves every draft to the synchronizer."""
        from bubblespec.synchronizer.peer import DraftPeerServer, PeerDrafts, PeerReader
        from bubblespec.tls import server_credentials, sync_credentials

        drafts = PeerDrafts()
        server = DraftPeerServer(drafts, self.cfg.host, self.cfg.drafts_port,
                                 advertise_host=self.address.split("://")[-1].rsplit(":", 1)[0],
                                 credentials=server_credentials(self.cfg))
        try:
            await server.start()
        except RuntimeError as e:
            log.error("rank %s: %s; drafts go through the synchronizer", self.rank_id, e)
            return
        self.drafts_server = server
        self.sync.serve_drafts(drafts, server.address, PeerReader(
            self.cfg.sync_timeout_s, sync_credentials(self.cfg)))
        log.info("rank %s: serving its drafts at %s", self.rank_id, server.address)

    # ------------------------------------------------------------------ engine liveness
    async def _watch_engine(self) -> None:
        """Check the engine every `engine_check_s`; restart it when it died."""
        while True:
            await asyncio.sleep(self.cfg.engine_check_s)
            if self.engine is not None and not self.engine.alive:
                await self._restart_engine()

    async def _restart_engine(self) -> None:
        """Report the engine dead, start a new one with the last good weights (retried while
        the restart budget lasts), or exit with EXIT_ENGINE when `engine_restarts` restarts
        already happened within the last `engine_restart_window_s`."""
        from bubblespec.engine.engine import RolloutEngine

        dead, worker = self.engine, self.worker
        assert worker is not None
        self.engine_error = dead.dead_reason() or "engine died"
        log.error("rank %s: engine died (%s)", self.rank_id, self.engine_error)
        worker._set(RankState.ENGINE_DEAD)
        self.metrics.engine_alive.labels(self.rank_id).set(0)
        await worker.stop_pregen()
        # weights pushed over a process group since the last checkpoint are not on disk:
        # the restarted engine comes back on that checkpoint and its version
        path, version = dead.last_good_path, dead.last_good_version
        try:
            await dead.shutdown()
        except Exception:  # what is left of a dead engine may not stop cleanly
            log.exception("rank %s: shutting the dead engine down failed", self.rank_id)
        while True:
            if self.restarts.spent():
                log.critical("rank %s: engine died and its restart(s) are spent (%d of %d "
                             "allowed within the last %g s; %d in all); exiting with status "
                             "%d", self.rank_id, self.restarts.count(), self.restarts.limit,
                             self.restarts.window_s, self.restarts.total, EXIT_ENGINE)
                logging.shutdown()
                os._exit(EXIT_ENGINE)
            recent = self.restarts.record()
            self.metrics.engine_restarts.labels(self.rank_id).inc()
            self.engine_error = (f"{self.engine_error}; restarting the engine (restart "
                                 f"{recent} of {self.cfg.engine_restarts} allowed within "
                                 f"{self.cfg.engine_restart_window_s:g} s)")
            engine = None
            try:
                engine = await RolloutEngine.start(self.cfg.engine_config())
                await engine.restore(path, version)
                break
            except Exception as e:  # counted as a failed restart
                log.exception("rank %s: engine restart failed", self.rank_id)
                self.engine_error = f"engine restart failed: {e}"
                if engine is not None:
                    await engine.shutdown()
        self.engine = worker.engine = engine
        self.engine_error = None
        worker._set(RankState.IDLE)
        self.metrics.engine_alive.labels(self.rank_id).set(1)
        log.info("rank %s: engine restarted with %s (weight version %d)", self.rank_id, path,
                 version)

    async def stop(self) -> None:
        """Stop pre-generation, heartbeats and the engine."""
        self._hb_stop.set()
        if self.worker is not None:
            await self.worker.stop_pregen()
        for t in self._tasks:
            t.cancel()
        if self.sync is not None:
            await self.sync.close()
        if self.drafts_server is not None:
            await self.drafts_server.stop()
        if self.engine is not None:
            await self.engine.shutdown()

    def _ready(self) -> RankWorker:
        if self.worker is None:
            raise ApiError(503, self.start_error or "engine is starting", "engine")
        if self.engine_error is not None or not self.engine.alive:
            raise ApiError(503, self.engine_error or "the engine died; restarting it",
                           "engine")
        return self.worker

    def _weights_resident(self) -> RankWorker:
        """`_ready`, with the engine's weights in memory (not released)."""
        worker = self._ready()
        if "weights" in self.released:
            raise ApiError(409, "the engine's weights are released: resume them first "
                                "(/resume_memory_occupation with tags [\"weights\"])", "engine")
        return worker

    def _serving(self) -> RankWorker:
        """`_ready`, and the engine's memory not released (colocated trainers)."""
        worker = self._ready()
        if self.released:
            raise ApiError(503, f"the engine's memory is released ({', '.join(sorted(self.released))}"
                                "): resume it first (/resume_memory_occupation)", "engine")
        return worker

    def _validate(self, engine: Any, reqs: list[GenRequest],
                  field: Callable[[int, str], str]) -> None:
        """The engine's checks of each request (`RolloutEngine.validate`), here where the
        request came in, so that errors name `field(index, the engine's field)` as the
        request spells it; the engine then runs them without checking again."""
        for i, r in enumerate(reqs):
            try:
                engine.validate(r)
            except InvalidRequest as e:
                where = field(i, e.field)
                raise ApiError(400, f"{where}: {str(e).removeprefix(f'{e.field}: ')}",
                               where) from None

    # ------------------------------------------------------------------ routes
    def health_generate(self) -> tuple[int, dict[str, Any]]:
        """(status, body) of GET /health_generate: ready once the engine is up."""
        if self.worker is None:
            return 503, {"status": "starting", "detail": self.start_error}
        if self.engine_error is not None or not self.engine.alive:
            return 503, {"status": "engine_dead",
                         "detail": self.engine_error or self.engine.dead_reason()}
        if self.released:
            return 503, {"status": "released", "detail": "memory released: "
                         + ", ".join(sorted(self.released))}
        return 200, {"status": "ready"}

    def state(self) -> RankStateBody:
        w = self.worker
        state = w.state if w else RankState.STARTING
        if w is not None and not self.engine.alive:  # before the watcher noticed
            state = RankState.ENGINE_DEAD
        return RankStateBody(rank_id=self.rank_id, state=state,
                         weight_version=self.engine.weight_version if w else 0,
                         step=w.step if w else None, address=self.address)

    async def step_shard(self, body: StepShard) -> dict[str, Any]:
        """Decode this rank's share of a step (then pre-generate, in the background)."""
        t = time.monotonic()
        worker = self._serving()
        reqs = [to_gen_request(r) for r in body.requests]
        self._validate(worker.engine, reqs, lambda i, f: f"requests[{i}].{f}")
        async with self._engine_death("shard"):
            out = await worker.run_shard(body, reqs)
        self.metrics.request_latency.labels(self.rank_id, "step_shard").observe(
            time.monotonic() - t)
        return out.model_dump()

    async def generate(self, body: GenerateRequest) -> Any:
        """SGLang-style /generate: one sample dict, or a list (batched input or n > 1)."""
        t = time.monotonic()
        worker = self._serving()
        batched = bool(body.input_ids) and isinstance(body.input_ids[0], list)
        prompts = body.input_ids if batched else [body.input_ids]
        reqs = [to_gen_request(ShardRequest(index=i, input_ids=p, n=body.n,
                                            seeds=body.seeds, prompt_key=prompt_key(p),
                                            sampling_params=body.sampling_params))
                for i, p in enumerate(prompts)]
        # the engine names input_ids[j]; a batched request spells it input_ids[i][j]
        self._validate(worker.engine, reqs,
                       lambda i, f: f.replace("input_ids", f"input_ids[{i}]", 1)
                       if batched and f.startswith("input_ids") else f)
        async with self._engine_death("request"):
            res = await worker.engine.generate(reqs, validated=True)
            await worker.engine.release_groups([r.group_key() for r in reqs])
        outs = [to_sample_out(s).model_dump() for g in res for s in g.samples]
        self.metrics.request_latency.labels(self.rank_id, "generate").observe(
            time.monotonic() - t)
        return outs if batched or body.n > 1 else outs[0]

    def tool_calls(self, body: ParseToolCalls) -> dict[str, Any]:
        """POST /v1/tool_calls: vLLM's tool parser over chat outputs (`tool_calls.py`),
        with the engine's tokenizer."""
        worker = self._ready()
        return parse_tool_calls(body, worker.engine.tokenizer).model_dump()

    def check_sampling(self, body: CheckSampling) -> dict[str, Any]:
        """POST /v1/check_sampling: the engine's checks of `body.sampling_params` (a
        structured-output constraint compiled by vLLM's backend), a 400 naming the field it
        refuses; nothing runs."""
        worker = self._ready()
        sp = body.sampling_params.model_copy(update={"max_new_tokens": 1, "min_tokens": 0})
        self._validate(worker.engine, [GenRequest(input_ids=[0], sampling=sp, seeds=[0])],
                       lambda _i, f: f)
        return {}

    async def score(self, body: ScoreRequest) -> dict[str, Any]:
        """POST /v1/score: the prompts' log-probs (`GenRequest.score`), run by the engine
        beside whatever it runs now (a shard, pre-generation) without changing the rank's
        state: scoring is no step and triggers no drafts or pre-generation."""
        t = time.monotonic()
        worker = self._serving()
        reqs = [GenRequest(input_ids=list(p), score=True, top_logprobs=body.top_logprobs)
                for p in body.input_ids]
        self._validate(worker.engine, reqs,
                       lambda i, f: f.replace("input_ids", f"input_ids[{i}]", 1)
                       if f.startswith("input_ids") else f)
        async with self._engine_death("scoring call"):
            res = await worker.engine.generate(reqs, counters=False, validated=True)
        for g in res:
            if g.samples[0].prompt_logprobs is None:
                raise ApiError(503, "the scoring call was aborted", "engine")
        out = ScoreResult(rank_id=self.rank_id,
                          weight_version=res[0].samples[0].weight_version,
                          results=[_scored(g.samples[0]) for g in res])
        self.metrics.request_latency.labels(self.rank_id, "score").observe(
            time.monotonic() - t)
        return out.model_dump()

    @contextlib.asynccontextmanager
    async def _engine_death(self, what: str) -> AsyncIterator[None]:
        """An engine that dies while it runs this call answers 503 with `ENGINE_DIED_HEADER`
        (the gateway counts the death against the call's requests) instead of a 500."""
        engine = self.engine
        try:
            yield
        except Exception as e:
            if engine.alive and not _is_engine_death(e):
                raise
            reason = engine.dead_reason() or f"{type(e).__name__}: {e}"
            raise ApiError(503, f"the engine died while running this {what} ({reason}); the "
                                "rank restarts it", "engine",
                           headers={ENGINE_DIED_HEADER: "1"}) from None

    def abort_step(self, body: AbortStep) -> dict[str, Any]:
        """Abort this rank's shard of `body.step` (see `RankWorker.abort_step`)."""
        return {"rank_id": self.rank_id, "step": body.step,
                "aborted": self._ready().abort_step(body.step)}

    async def update_weights(self, body: WeightUpdate) -> dict[str, Any]:
        """Stop pre-generation, validate and reload the weights, report the new version
        (refusals and failures: see `RolloutEngine.update_weights`)."""
        worker = self._weights_resident()
        await worker.stop_pregen()
        worker._set(RankState.UPDATING_WEIGHTS)
        try:
            v = await worker.engine.update_weights(body.path, body.version, body.force)
        finally:
            if worker.state is RankState.UPDATING_WEIGHTS:
                worker._set(RankState.IDLE if worker.engine.alive else RankState.ENGINE_DEAD)
        self.metrics.weight_version.labels(self.rank_id).set(v)
        return {"rank_id": self.rank_id, "weight_version": v}

    # ---------------------------------------------- memory (colocated trainers)
    async def release_memory(self, tags: list[str] | None) -> dict[str, Any]:
        """Stop pre-generation, then release the engine's memory (vLLM's sleep; `tags` None:
        all of it); generation is refused until every tag is resumed, weight pushes are not.
        Drafts in the synchronizer's store are untouched."""
        worker = self._ready()
        await worker.stop_pregen()
        await worker.engine.release_memory()
        self.released |= set(tags or MEMORY_TAGS)
        worker._set(RankState.RELEASED)
        return {"rank_id": self.rank_id, "released": sorted(self.released)}

    async def resume_memory(self, tags: list[str] | None) -> dict[str, Any]:
        """Resume the released memory of `tags` (None: all); serving again once none is left."""
        worker = self._ready()
        left = self.released - set(tags or MEMORY_TAGS)
        # the last resume wakes everything: vLLM resumes scheduling only when its executor
        # holds no sleeping allocation, and its tags are not SGLang's (no cuda_graph)
        await worker.engine.resume_memory(tags if left else None)
        self.released = left
        if not self.released and worker.state is RankState.RELEASED:
            worker._set(RankState.IDLE)
        return {"rank_id": self.rank_id, "released": sorted(self.released)}

    # ---------------------------------------------- process-group weight pushes
    async def open_weight_group(self, body: WeightGroupOpen) -> dict[str, Any]:
        """Join the trainer's weight group (`RolloutEngine.open_weight_group`)."""
        worker = self._ready()
        await worker.engine.open_weight_group(body.model_dump())
        return {"rank_id": self.rank_id, "group_name": body.group_name,
                "rank": body.rank_offset}

    async def receive_bucket(self, body: WeightBucket) -> dict[str, Any]:
        """Stop pre-generation, then receive one bucket into staging."""
        worker = self._ready()
        await worker.stop_pregen()
        staged = await worker.engine.receive_bucket(body.names, body.dtypes,
                                                    [list(s) for s in body.shapes], body.version,
                                                    body.group_name)
        return {"rank_id": self.rank_id, "staged": staged, "version": body.version}

    async def receive_tensors(self, body: TensorBucket) -> dict[str, Any]:
        """Stop pre-generation, then stage the tensors a colocated trainer handed over."""
        worker = self._ready()
        await worker.stop_pregen()
        staged, whole = await worker.engine.receive_tensors(body.serialized, body.load_format,
                                                            body.version)
        return {"rank_id": self.rank_id, "staged": staged, "complete": whole,
                "version": body.version}

    async def discard_push(self) -> dict[str, Any]:
        """Drop whatever push is staged (a group stays open)."""
        worker = self._ready()
        await worker.engine.discard_push()
        return {"rank_id": self.rank_id, "discarded": True}

    async def commit_weights(self) -> dict[str, Any]:
        """Load the staged push (between batches) and report the new version; with the
        weights released the push is dropped and refused (409)."""
        if "weights" in self.released and self.worker is not None:
            await self.worker.engine.discard_push()
        worker = self._weights_resident()
        await worker.stop_pregen()
        v = await worker.engine.commit_weights()
        self.metrics.weight_version.labels(self.rank_id).set(v)
        return {"rank_id": self.rank_id, "weight_version": v}

    async def close_weight_group(self, name: str | None) -> dict[str, Any]:
        """Leave weight group `name` (None: every group, dropping what is staged)."""
        worker = self._ready()
        await worker.engine.close_weight_group(name)
        return {"rank_id": self.rank_id, "closed": True}

    async def draft_index(self) -> DraftIndexBody:
        """The engine's draft-index fill level (zeros until the engine is up)."""
        if self.worker is None:
            return DraftIndexBody()
        return DraftIndexBody(**await self.worker.engine.index_stats())

    async def heap(self) -> HeapBody:
        """The engine worker's memory split (zeros until the engine is up)."""
        if self.worker is None:
            return HeapBody()
        return HeapBody(**await self.worker.engine.heap_stats())

    async def pace(self) -> PaceBody:
        """The engine's paced-forward counters (zeros until the engine is up or unpaced)."""
        if self.worker is None:
            return PaceBody()
        return PaceBody(**await self.worker.engine.pace_stats())

    def metrics_text(self) -> bytes:
        return render(self.metrics.registry)

    def config_dict(self) -> dict[str, Any]:
        """The effective configuration, and what the running engine serves (`served`: its
        context length and vocabulary; absent until the engine is up)."""
        out: dict[str, Any] = {"rank_id": self.rank_id, **effective_config_dict(self.cfg)}
        if self.engine is not None:
            out["served"] = {"max_model_len": self.engine.max_model_len,
                             "vocab_size": self.engine.vocab_size}
        return out


def _scored(s: SampleResult) -> ScoredPrompt:
    """A scoring request's sample as the /v1/score answer's entry."""
    top = s.prompt_top_logprobs
    return ScoredPrompt(prompt_logprobs=s.prompt_logprobs or [], prompt_ranks=s.prompt_ranks,
                        prompt_top_logprobs=None if top is None else
                        [None if d is None else list(d.items()) for d in top])
