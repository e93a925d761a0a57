"""The gateway: `bubblespec gateway [--port P] [--sync-address H:P] [--ranks ...] [--token T]`.

FastAPI + uvicorn. Routes (bodies in `bubblespec.protocol.gateway`; errors are
`{"detail", "field"}` with a 4xx for anything the caller got wrong, never a 500):

- POST /v1/rollout  one synchronous rollout step (bearer token when configured)
- POST /v1/weights  reload weights on every rank (bearer token when configured)
- GET  /v1/steps/{step}  the synchronizer's timeline of a step with per-rank bubble figures,
  and the gateway's own summary of the rollout
- GET  /v1/ranks  live ranks and their state; GET /health (live), GET /health_generate
  (ready: synchronizer reachable and >= 1 rank ready), GET /metrics, GET /config
- GET  /  the status page (`status_page.py`): ranks and the last steps' bubbles
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import Depends, FastAPI, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bubblespec.config import ConfigError, effective_config_dict, load_config
from bubblespec.gateway.bubbles import step_bubbles
from bubblespec.gateway.config import ENV_PREFIX, GatewayConfig
from bubblespec.gateway.prepare import Preparer
from bubblespec.gateway.ranks import RankPool
from bubblespec.gateway.rollout import Rollouts
from bubblespec.metrics import CONTENT_TYPE_LATEST, new_registry, render
from bubblespec.metrics.gateway import GatewayMetrics
from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.gateway import RolloutRequest
from bubblespec.protocol.rank import WeightUpdate
from bubblespec.synchronizer.client import SyncClient
from bubblespec.synchronizer.errors import SyncError
from bubblespec.web import field_of

log = logging.getLogger("bubblespec.gateway")


def error_response(status: int, detail: str, field: str = "",
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail, "field": field}, status_code=status, headers=headers)


class EdgeMiddleware:
    """Outermost ASGI layer: request metrics by route template, and the body size limit."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, metrics: GatewayMetrics) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.monotonic()
        status = {"code": 500}

        async def send_(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            length = dict(scope.get("headers") or []).get(b"content-length")
            if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
                await error_response(413, f"body over {self.max_body_bytes} bytes",
                                     "body")(scope, receive, send_)
                return
            seen = 0

            async def receive_() -> Message:
                nonlocal seen
                message = await receive()
                if message["type"] == "http.request":
                    seen += len(message.get("body", b""))
                    if seen > self.max_body_bytes:  # FastAPI re-raises HTTPException
                        raise StarletteHTTPException(413, f"body over {self.max_body_bytes} "
                                                          "bytes")
                return message

            await self.app(scope, receive_, send_)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", "unmatched")
            self.metrics.requests.labels(label, str(status["code"])).inc()
            self.metrics.request_duration.labels(label).observe(time.monotonic() - t0)


def create_app(config: GatewayConfig, preparer: Preparer | None = None) -> FastAPI:
    """The gateway's ASGI app (state set up in its lifespan)."""
    registry = new_registry("gateway")
    metrics = GatewayMetrics(registry)
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        sync = None
        if config.sync_address:
            token = config.sync_token.get_secret_value() if config.sync_token else None
            sync = SyncClient(config.sync_address, token=token, timeout_s=config.sync_timeout_s)
        http = httpx.AsyncClient(limits=httpx.Limits(max_connections=256,
                                                     max_keepalive_connections=64))
        pool = RankPool(config, http, sync)
        rollouts = Rollouts(config, pool, sync, metrics, preparer)
        metrics.watch_ranks(rollouts.rank_counts)
        state.update(sync=sync, pool=pool, rollouts=rollouts)
        log.info("gateway on %s:%d (synchronizer: %s, static ranks: %s, auth: %s)",
                 config.host, config.port, config.sync_address or "none",
                 ", ".join(config.ranks) or "none", "bearer token" if config.token else "none")
        try:
            yield
        finally:
            await http.aclose()
            if sync is not None:
                await sync.close()

    app = FastAPI(title="bubblespec gateway", lifespan=lifespan)
    app.add_middleware(EdgeMiddleware, max_body_bytes=config.max_body_bytes, metrics=metrics)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_r: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0]
        field = field_of(err.get("loc", ()))
        if err.get("type") == "json_invalid":
            field = "body"
        msg = str(err.get("msg", "invalid"))
        others = [{"field": field_of(e.get("loc", ())) or "body", "msg": str(e.get("msg"))}
                  for e in exc.errors()[:20]]
        return JSONResponse({"detail": f"{field or 'body'}: {msg}", "field": field or "body",
                             "errors": others}, status_code=422)

    @app.exception_handler(ApiError)
    async def _gateway_error(_r: Request, exc: ApiError) -> JSONResponse:
        if exc.status >= 500:
            log.warning("%s", exc)
        return error_response(exc.status, exc.detail, exc.field)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_r: Request, exc: StarletteHTTPException) -> JSONResponse:
        field = "body" if exc.status_code == 413 else ""
        return error_response(exc.status_code, str(exc.detail), field,
                              getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _crash(_r: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")

    def require_token(request: Request) -> None:
        if config.token is None:
            return
        given = request.headers.get("authorization", "")
        want = f"Bearer {config.token.get_secret_value()}"
        if not hmac.compare_digest(given.encode(), want.encode()):
            raise ApiError(401, "missing or wrong bearer token", "authorization")

    def rollouts() -> Rollouts:
        return state["rollouts"]

    @app.post("/v1/rollout", dependencies=[Depends(require_token)])
    async def rollout(body: RolloutRequest) -> Response:
        resp = await rollouts().rollout(body)
        return JSONResponse(resp.model_dump(exclude_none=True))

    @app.post("/v1/weights", dependencies=[Depends(require_token)])
    async def weights(body: WeightUpdate) -> dict[str, Any]:
        return await rollouts().update_weights(body)

    @app.get("/v1/steps/{step}")
    async def step_timeline(step: int = Path(..., ge=0, lt=2**63)) -> dict[str, Any]:
        ro = rollouts()
        summary = ro.summaries.get(step)
        out: dict[str, Any] = {"step": step, "timeline": None, "rollout": summary,
                               "warnings": []}
        sync: SyncClient | None = state["sync"]
        if sync is None:
            out["warnings"].append("no synchronizer configured: no timeline")
        else:
            try:
                t = await sync.get_timeline(step, timeout_s=config.sync_timeout_s)
                out["timeline"] = step_bubbles(t).as_dict()
            except SyncError as e:
                if summary is None:
                    status = 404 if e.code.name == "NOT_FOUND" else 503
                    raise ApiError(status, f"synchronizer: {e.message}", "step") from None
                out["warnings"].append(f"no timeline: {e}")
        return out

    @app.get("/v1/ranks")
    async def ranks() -> dict[str, Any]:
        d = await rollouts().discover()
        snap = d.snapshot
        return {"ranks": [r.as_dict() for r in d.ranks], "ready": len(d.ready),
                "sync_ok": d.sync_ok, "sync_error": d.sync_error,
                "current_step": snap.current_step if snap else None,
                "last_step": rollouts().last_step}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/health_generate")
    async def health_generate() -> dict[str, Any]:
        d = await rollouts().discover()
        if state["sync"] is not None and not d.sync_ok:
            raise ApiError(503, f"synchronizer unreachable: {d.sync_error}")
        if not d.ready:
            known = "; ".join(f"{r.rank_id}: {r.error or r.state}" for r in d.ranks) or "none"
            raise ApiError(503, f"no rank ready (known: {known})")
        return {"status": "ready", "ranks_ready": len(d.ready), "ranks_known": len(d.ranks)}

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(render(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/config")
    async def config_route() -> dict[str, Any]:
        return effective_config_dict(config)

    from bubblespec.gateway.status_page import install_status_page

    install_status_page(app)  # GET / : ranks and the last steps' timelines, from the routes above
    app.state.metrics = metrics
    app.state.gateway = state
    return app


def main(argv: list[str]) -> int:
    """Entry point of `bubblespec gateway`: parse config, log it, serve until SIGTERM/SIGINT."""
    try:
        config = load_config(GatewayConfig, argv, env_prefix=ENV_PREFIX,
                             prog="bubblespec gateway")
    except ConfigError as e:
        print(f"bubblespec gateway: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.info("effective config: %s", json.dumps(effective_config_dict(config), sort_keys=True))
    import uvicorn

    uvicorn.run(create_app(config), host=config.host, port=config.port,
                log_level=config.log_level.lower(), access_log=False,
                timeout_graceful_shutdown=5)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
