"""The gateway's service object: what its routes (`routes.py`) answer, and the state behind it.

It owns the clients the gateway keeps open while it runs (the synchronizer's gRPC client, the
pooled HTTP client towards the ranks) and the `Rollouts` that does the work (`rollout.py`);
it answers the read-only routes (step timelines, ranks, readiness) from them. Errors are
`ApiError`s with the status and field the caller sees.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from bubblespec.config import effective_config_dict
from bubblespec.gateway.bubbles import step_bubbles
from bubblespec.gateway.config import GatewayConfig
from bubblespec.gateway.prepare import Preparer
from bubblespec.gateway.ranks import RankPool
from bubblespec.gateway.rollout import Rollouts
from bubblespec.metrics import new_registry, render
from bubblespec.metrics.gateway import GatewayMetrics
from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.gateway import RolloutRequest
from bubblespec.protocol.rank import WeightUpdate
from bubblespec.synchronizer.client import SyncClient
from bubblespec.synchronizer.errors import SyncError
from bubblespec.tls import http_verify, sync_credentials

log = logging.getLogger("bubblespec.gateway")


class GatewayService:
    """The gateway's state (clients, rollouts, metrics) and the logic of its routes."""

    def __init__(self, config: GatewayConfig, preparer: Preparer | None = None) -> None:
        self.config = config
        self.preparer = preparer
        self.registry = new_registry("gateway")
        self.metrics = GatewayMetrics(self.registry)
        self.sync: SyncClient | None = None
        self._http: httpx.AsyncClient | None = None
        self._rollouts: Rollouts | None = None

    async def start(self) -> None:
        """Open the clients and set up the rollouts (the app's lifespan calls this)."""
        c = self.config
        if c.sync_address:
            token = c.sync_token.get_secret_value() if c.sync_token else None
            self.sync = SyncClient(c.sync_address, token=token, timeout_s=c.sync_timeout_s,
                                   credentials=sync_credentials(c))
        self._http = httpx.AsyncClient(limits=httpx.Limits(max_connections=256,
                                                           max_keepalive_connections=64),
                                       verify=http_verify(c))
        pool = RankPool(c, self._http, self.sync)
        self._rollouts = Rollouts(c, pool, self.sync, self.metrics, self.preparer)
        self.metrics.watch_ranks(self._rollouts.rank_counts)
        log.info("gateway on %s:%d (synchronizer: %s, static ranks: %s, auth: %s, tls: %s, "
                 "tls to ranks and synchronizer: %s)",
                 c.host, c.port, c.sync_address or "none", ", ".join(c.ranks) or "none",
                 "bearer token" if c.token else "none",
                 ("mutual" if c.tls_client_auth else "server") if c.tls_server else "off",
                 "on" if c.tls_client else "off")

    async def stop(self) -> None:
        """Close the clients."""
        if self._http is not None:
            await self._http.aclose()
        if self.sync is not None:
            await self.sync.close()

    @property
    def rollouts(self) -> Rollouts:
        if self._rollouts is None:
            raise ApiError(503, "the gateway is starting")
        return self._rollouts

    def observe_request(self, route: str, code: int, seconds: float) -> None:
        """Request metrics by route template (the edge's per-request hook)."""
        self.metrics.requests.labels(route, str(code)).inc()
        self.metrics.request_duration.labels(route).observe(seconds)

    async def rollout(self, body: RolloutRequest) -> dict[str, Any]:
        resp = await self.rollouts.rollout(body)
        return resp.model_dump(exclude_none=True)

    async def update_weights(self, body: WeightUpdate) -> dict[str, Any]:
        return await self.rollouts.update_weights(body)

    async def step_timeline(self, step: int) -> dict[str, Any]:
        """The synchronizer's timeline of `step` with per-rank bubbles, and our summary."""
        summary = self.rollouts.summaries.get(step)
        out: dict[str, Any] = {"step": step, "timeline": None, "rollout": summary,
                               "warnings": []}
        if self.sync is None:
            out["warnings"].append("no synchronizer configured: no timeline")
            return out
        try:
            t = await self.sync.get_timeline(step, timeout_s=self.config.sync_timeout_s)
            out["timeline"] = step_bubbles(t).as_dict()
        except SyncError as e:
            if summary is None:
                status = 404 if e.code.name == "NOT_FOUND" else 503
                raise ApiError(status, f"synchronizer: {e.message}", "step") from None
            out["warnings"].append(f"no timeline: {e}")
        return out

    async def ranks(self) -> dict[str, Any]:
        """Live ranks and their state, as the last discovery found them."""
        d = await self.rollouts.discover()
        snap = d.snapshot
        return {"ranks": [r.as_dict() for r in d.ranks], "ready": len(d.ready),
                "sync_ok": d.sync_ok, "sync_error": d.sync_error,
                "current_step": snap.current_step if snap else None,
                "last_step": self.rollouts.last_step}

    async def health_generate(self) -> dict[str, Any]:
        """Ready: the synchronizer (when configured) answers and at least one rank is ready."""
        d = await self.rollouts.discover()
        if self.sync is not None and not d.sync_ok:
            raise ApiError(503, f"synchronizer unreachable: {d.sync_error}")
        if not d.ready:
            known = "; ".join(f"{r.rank_id}: {r.error or r.state}" for r in d.ranks) or "none"
            raise ApiError(503, f"no rank ready (known: {known})")
        return {"status": "ready", "ranks_ready": len(d.ready), "ranks_known": len(d.ranks)}

    def metrics_text(self) -> bytes:
        return render(self.registry)

    def config_dict(self) -> dict[str, Any]:
        return effective_config_dict(self.config)
