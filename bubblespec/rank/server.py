"""`bubblespec rank`: the FastAPI rollout server of one rank (one vLLM engine).

Routes: `POST /v1/step_shard`, `POST /generate`, `POST /v1/weights`, `GET /v1/state`,
`GET /health` (live), `GET /health_generate` (ready once the engine is up), `GET /metrics`,
`GET /config`. Bad input answers 4xx naming the field; mutating routes need the bearer
token when one is configured.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, Response

from bubblespec.config import ConfigError, effective_config_dict, load_config
from bubblespec.metrics import CONTENT_TYPE_LATEST, render
from bubblespec.metrics.rank import new_rank_metrics, set_state
from bubblespec.protocol.keys import prompt_key
from bubblespec.protocol.rank import (
    GenerateRequest,
    RankStateBody,
    ShardRequest,
    StepShard,
    WeightUpdate,
)
from bubblespec.rank.config import ENV_PREFIX, RankConfig
from bubblespec.rank.worker import RankWorker, to_gen_request
from bubblespec.web import (
    ServiceUnavailable,
    auth_dependency,
    install_error_handlers,
    limit_body_size,
)

log = logging.getLogger("bubblespec.rank")


def default_rank_id(cfg: RankConfig) -> str:
    """r<ordinal> under a StatefulSet (hostname name-<n>), else rank-<port>."""
    if cfg.rank_id:
        return cfg.rank_id
    host = socket.gethostname()
    tail = host.rsplit("-", 1)[-1]
    return f"r{tail}" if tail.isdigit() else f"rank-{cfg.port}"


class RankServer:
    """The app plus the engine/worker it starts in the background."""

    def __init__(self, cfg: RankConfig) -> None:
        self.cfg = cfg
        self.rank_id = default_rank_id(cfg)
        self.metrics = new_rank_metrics(self.rank_id)
        self.worker: RankWorker | None = None
        self.engine: Any = None
        self.sync: Any = None
        self.start_error: str | None = None
        self._hb_stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        set_state(self.metrics, self.rank_id, "starting")
        self.app = self._build_app()

    @property
    def address(self) -> str:
        return self.cfg.advertise_address or f"{self.cfg.host}:{self.cfg.port}"

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

            tok = self.cfg.sync_token.get_secret_value() if self.cfg.sync_token else None
            self.sync = SyncClient(self.cfg.sync_address, token=tok,
                                   timeout_s=self.cfg.sync_timeout_s)
            try:
                await self.sync.register(self.rank_id, self.address,
                                         weight_version=self.engine.weight_version)
            except Exception as e:  # heartbeats keep retrying the registration
                log.warning("synchronizer not reachable yet (%s); decoding without it", e)
        self.worker = RankWorker(self.cfg, self.rank_id, self.engine, self.sync, self.metrics)
        self.metrics.weight_version.labels(self.rank_id).set(self.engine.weight_version)
        if self.sync is not None:
            self._tasks.append(asyncio.create_task(self.sync.run_heartbeats(
                self.rank_id, self.worker.status, self._hb_stop)))

    async def _stop(self) -> None:
        self._hb_stop.set()
        if self.worker is not None:
            await self.worker.stop_pregen()
        for t in self._tasks:
            t.cancel()
        if self.sync is not None:
            await self.sync.close()
        if self.engine is not None:
            await self.engine.shutdown()

    def _ready(self) -> RankWorker:
        if self.worker is None:
            raise ServiceUnavailable(self.start_error or "engine is starting", "engine")
        return self.worker

    def _build_app(self) -> FastAPI:
        @asynccontextmanager
        async def lifespan(app: FastAPI):  # noqa: ANN202
            starter = asyncio.create_task(self._start())
            yield
            starter.cancel()
            await self._stop()

        app = FastAPI(title="bubblespec rank", lifespan=lifespan)
        install_error_handlers(app)
        limit_body_size(app, self.cfg.max_body_bytes)
        token = self.cfg.token.get_secret_value() if self.cfg.token else None
        auth = [Depends(auth_dependency(token))]
        lat = self.metrics.request_latency

        @app.get("/health")
        async def health() -> dict:
            return {"status": "ok"}

        @app.get("/health_generate")
        async def health_generate() -> Response:
            if self.worker is None:
                return JSONResponse({"status": "starting", "detail": self.start_error},
                                    status_code=503)
            return JSONResponse({"status": "ready"})

        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(render(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

        @app.get("/config")
        async def config() -> dict:
            return {"rank_id": self.rank_id, **effective_config_dict(self.cfg)}

        @app.get("/v1/state", response_model=RankStateBody)
        async def state() -> RankStateBody:
            w = self.worker
            return RankStateBody(rank_id=self.rank_id, state=w.state if w else "starting",
                                 weight_version=self.engine.weight_version if w else 0,
                                 step=w.step if w else None, address=self.address)

        @app.post("/v1/step_shard", dependencies=auth)
        async def step_shard(body: StepShard) -> Response:
            t = time.monotonic()
            out = await self._ready().run_shard(body)
            lat.labels(self.rank_id, "step_shard").observe(time.monotonic() - t)
            return JSONResponse(out.model_dump())

        @app.post("/generate", dependencies=auth)
        async def generate(body: GenerateRequest) -> Response:
            t = time.monotonic()
            worker = self._ready()
            batched = bool(body.input_ids) and isinstance(body.input_ids[0], list)
            prompts = body.input_ids if batched else [body.input_ids]
            reqs = [to_gen_request(ShardRequest(index=i, input_ids=p, n=body.n,
                                                seeds=body.seeds, prompt_key=prompt_key(p),
                                                sampling_params=body.sampling_params))
                    for i, p in enumerate(prompts)]
            res = await worker.engine.generate(reqs)
            await worker.engine.release_groups([r.group_key() for r in reqs])
            outs = [{"output_ids": s.output_ids, "output_logprobs": s.output_logprobs,
                     "meta_info": {"finish_reason": s.finish_reason,
                                   "weight_version": s.weight_version,
                                   "decode_steps": s.decode_steps,
                                   "num_accepted_tokens": s.num_accepted_tokens,
                                   "completion_tokens": len(s.output_ids)}}
                    for g in res for s in g.samples]
            lat.labels(self.rank_id, "generate").observe(time.monotonic() - t)
            return JSONResponse(outs if batched or body.n > 1 else outs[0])

        @app.post("/v1/weights", dependencies=auth)
        async def weights(body: WeightUpdate) -> dict:
            worker = self._ready()
            await worker.stop_pregen()
            worker._set("updating_weights")
            try:
                v = await worker.engine.update_weights(body.path, body.version)
            finally:
                worker._set("idle")
            self.metrics.weight_version.labels(self.rank_id).set(v)
            return {"rank_id": self.rank_id, "weight_version": v}

        return app


def main(argv: list[str] | None = None) -> int:
    """Entry point of `bubblespec rank`."""
    try:
        cfg = load_config(RankConfig, argv, env_prefix=ENV_PREFIX, prog="bubblespec rank")
    except ConfigError as e:
        print(f"bubblespec rank: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=cfg.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.kv_cache_gib))
    # bind before the engine starts: vLLM opens ports of its own while it starts (~20 s),
    # and one of them could otherwise take the port this rank was given
    family = socket.AF_INET6 if ":" in cfg.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((cfg.host, cfg.port))
    except OSError as e:
        print(f"bubblespec rank: cannot bind {cfg.host}:{cfg.port}: {e}", file=sys.stderr)
        return 3
    if cfg.port == 0:
        cfg = cfg.model_copy(update={"port": sock.getsockname()[1]})
    server = RankServer(cfg)
    log.info("rank %s config: %s", server.rank_id, effective_config_dict(cfg))
    config = uvicorn.Config(server.app, log_level=cfg.log_level.lower(),
                            timeout_graceful_shutdown=10)
    uvicorn.Server(config).run(sockets=[sock])
    return 0
