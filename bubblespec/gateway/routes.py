"""The gateway's HTTP routes (bodies in `bubblespec/protocol/gateway.py` and
`bubblespec/protocol/rank.py`, logic in `service.py`).

Errors are `{"detail", "field"}` with a 4xx for anything the caller got wrong, never a 500:

- POST /v1/rollout  one synchronous rollout step (bearer token when configured)
- POST /v1/weights  reload weights on every rank (bearer token when configured)
- GET  /v1/steps/{step}  the synchronizer's timeline of a step with per-rank bubble figures,
  and the gateway's own summary of the rollout
- GET  /v1/ranks  live ranks and their state; GET /health (live), GET /health_generate
  (ready: synchronizer reachable and >= 1 rank ready), GET /metrics, GET /config

The status page at `/` is added by `status_page.install_status_page`.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path
from fastapi.responses import JSONResponse, Response

from bubblespec.gateway.service import GatewayService
from bubblespec.http.edge import app_service, protected_router
from bubblespec.metrics import CONTENT_TYPE_LATEST
from bubblespec.protocol.gateway import RolloutRequest
from bubblespec.protocol.limits import MAX_STEP
from bubblespec.protocol.rank import WeightUpdate

Gateway = Annotated[GatewayService, Depends(app_service)]

#: Routes anyone may call.
public = APIRouter()
#: Routes that need the bearer token (checked before the body is read).
protected = protected_router()


@protected.post("/v1/rollout")
async def rollout(body: RolloutRequest, gw: Gateway) -> JSONResponse:
    return JSONResponse(await gw.rollout(body))


@protected.post("/v1/weights")
async def weights(body: WeightUpdate, gw: Gateway) -> dict[str, Any]:
    return await gw.update_weights(body)


@public.get("/v1/steps/{step}")
async def step_timeline(gw: Gateway, step: int = Path(..., ge=0, le=MAX_STEP)) -> dict[str, Any]:
    return await gw.step_timeline(step)


@public.get("/v1/ranks")
async def ranks(gw: Gateway) -> dict[str, Any]:
    return await gw.ranks()


@public.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@public.get("/health_generate")
async def health_generate(gw: Gateway) -> dict[str, Any]:
    return await gw.health_generate()


@public.get("/metrics")
async def metrics(gw: Gateway) -> Response:
    return Response(gw.metrics_text(), media_type=CONTENT_TYPE_LATEST)


@public.get("/config")
async def config(gw: Gateway) -> dict[str, Any]:
    return gw.config_dict()
