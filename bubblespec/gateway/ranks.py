"""The rank servers as the gateway sees them: discovery, state probes and HTTP calls.

Live ranks come from two places: the ranks registered (and not LOST) at the synchronizer,
with the address they advertised, and a static `ranks` list from the config. Each candidate
is probed (`GET /v1/state`, short deadline) for its rank id, state and weight version; it is
ready when it answers and is past "starting" with a live engine (not "engine_dead"). Every
call has a deadline.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import httpx

from bubblespec.gateway.config import GatewayConfig
from bubblespec.gateway.errors import RankCallError
from bubblespec.protocol.domain import RankState, SyncSnapshot
from bubblespec.protocol.rank import ENGINE_DIED_HEADER
from bubblespec.synchronizer.client import SyncClient
from bubblespec.synchronizer.errors import SyncError

log = logging.getLogger("bubblespec.gateway.ranks")

NOT_READY_STATES = ("", "starting", RankState.ENGINE_DEAD.value, "released")
"""Rank states (GET /v1/state) in which the gateway sends a rank no work ("released": a
colocated trainer released the engine's memory; weight calls still reach it)."""


def normalize_url(address: str, scheme: str = "http") -> str:
    """`host:port` -> `<scheme>://host:port` (URLs kept, trailing slash dropped); the gateway
    passes "https" when its calls use TLS (`tls_ca` set)."""
    address = address.strip().rstrip("/")
    return address if "://" in address else f"{scheme}://{address}"


@dataclass
class RankEndpoint:
    """A rank server: where it is, what the synchronizer and the rank itself say."""

    rank_id: str
    url: str
    source: str
    registered: bool = False
    sync_state: str = ""
    last_heartbeat_age_s: float | None = None
    state: str = ""
    weight_version: int | None = None
    step: int | None = None
    error: str = ""

    @property
    def ready(self) -> bool:
        return not self.error and self.state not in NOT_READY_STATES

    @property
    def takes_weights(self) -> bool:
        """Ready, or with its memory released (a colocated trainer pushes weights then)."""
        return self.ready or (not self.error and self.state == "released")

    def as_dict(self) -> dict[str, Any]:
        return {"rank_id": self.rank_id, "url": self.url, "source": self.source,
                "registered": self.registered, "sync_state": self.sync_state,
                "last_heartbeat_age_s": self.last_heartbeat_age_s, "state": self.state,
                "weight_version": self.weight_version, "step": self.step, "ready": self.ready,
                "error": self.error}


@dataclass
class Discovery:
    """The outcome of one discovery round."""

    ranks: list[RankEndpoint]
    sync_ok: bool
    sync_error: str = ""
    snapshot: SyncSnapshot | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def ready(self) -> list[RankEndpoint]:
        return [r for r in self.ranks if r.ready]


def _error_text(response: httpx.Response) -> tuple[str, str]:
    """(detail, field) of an error response from a bubblespec server (or its raw text)."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500], ""
    if isinstance(body, dict):
        detail = body.get("detail", body)
        return (detail if isinstance(detail, str) else str(detail)[:500]), str(
            body.get("field") or "")
    return str(body)[:500], ""


class RankPool:
    """Finds ranks and talks to them over one shared `httpx.AsyncClient`."""

    def __init__(self, config: GatewayConfig, http: httpx.AsyncClient,
                 sync: SyncClient | None) -> None:
        self.config = config
        self.http = http
        self.sync = sync
        token = config.rank_token.get_secret_value() if config.rank_token else None
        self._auth = {"authorization": f"Bearer {token}"} if token else {}
        self._scheme = "https" if config.tls_client else "http"

    def _timeout(self, total_s: float) -> httpx.Timeout:
        total_s = max(0.05, total_s)
        return httpx.Timeout(total_s, connect=min(self.config.connect_timeout_s, total_s))

    async def sync_snapshot(self) -> tuple[SyncSnapshot | None, str]:
        """The synchronizer's state, or (None, why not)."""
        if self.sync is None:
            return None, "no synchronizer configured"
        try:
            return await self.sync.get_state(timeout_s=self.config.sync_timeout_s), ""
        except SyncError as e:
            return None, str(e)

    async def probe(self, ep: RankEndpoint) -> RankEndpoint:
        """Fill `ep` from the rank's GET /v1/state (sets `error` when it does not answer)."""
        try:
            r = await self.http.get(f"{ep.url}/v1/state",
                                    timeout=self._timeout(self.config.probe_timeout_s))
            if r.status_code != 200:
                ep.error = f"GET /v1/state: HTTP {r.status_code}: {_error_text(r)[0]}"
                return ep
            body = r.json()
            ep.rank_id = str(body.get("rank_id") or ep.rank_id)
            ep.state = str(body.get("state", ""))
            ep.weight_version = body.get("weight_version")
            ep.step = body.get("step")
        except (httpx.HTTPError, ValueError) as e:
            ep.error = f"GET /v1/state: {type(e).__name__}: {e}".rstrip(": ")
        return ep

    async def discover(self) -> Discovery:
        """Ranks from the synchronizer and the static list, probed concurrently."""
        snapshot, sync_error = await self.sync_snapshot()
        candidates: list[RankEndpoint] = []
        lost: list[RankEndpoint] = []
        if snapshot is not None and self.config.discover_ranks:
            for info in snapshot.ranks:
                ep = RankEndpoint(info.rank_id, normalize_url(info.address, self._scheme), "sync",
                                  registered=info.state is not RankState.LOST,
                                  sync_state=info.state.value,
                                  last_heartbeat_age_s=info.last_heartbeat_age_s)
                (candidates if ep.registered else lost).append(ep)
        for address in self.config.ranks:
            url = normalize_url(address, self._scheme)
            candidates.append(RankEndpoint(url, url, "static"))
        await asyncio.gather(*(self.probe(ep) for ep in candidates))
        known = {info.rank_id: info for info in (snapshot.ranks if snapshot else [])}
        merged: dict[str, RankEndpoint] = {}
        for ep in candidates:
            info = known.get(ep.rank_id)
            if ep.source == "static" and info is not None:
                ep.registered = info.state is not RankState.LOST
                ep.sync_state = info.state.value
                ep.last_heartbeat_age_s = info.last_heartbeat_age_s
            old = merged.get(ep.rank_id)
            if old is None:
                merged[ep.rank_id] = ep
            elif old.error and not ep.error:  # keep the endpoint that answered
                ep.source = "sync+static"
                merged[ep.rank_id] = ep
            else:
                old.source = "sync+static"
        for ep in lost:
            if ep.rank_id not in merged:
                ep.error = "LOST at the synchronizer"
                merged[ep.rank_id] = ep
        ranks = sorted(merged.values(), key=lambda e: e.rank_id)
        return Discovery(ranks, snapshot is not None, sync_error, snapshot)

    async def post(self, ep: RankEndpoint, route: str, body: dict[str, Any],
                   timeout_s: float) -> dict[str, Any]:
        """POST a JSON body to a rank; the JSON reply, or RankCallError."""
        try:
            r = await self.http.post(f"{ep.url}{route}", json=body, headers=self._auth,
                                     timeout=self._timeout(timeout_s))
        except httpx.TimeoutException as e:
            raise RankCallError(ep.rank_id, f"POST {route}: no answer within the deadline "
                                            f"({type(e).__name__})") from None
        except httpx.HTTPError as e:
            raise RankCallError(ep.rank_id, f"POST {route}: {type(e).__name__}: {e}") from None
        if r.status_code != 200:
            detail, field_ = _error_text(r)
            raise RankCallError(ep.rank_id, f"POST {route}: HTTP {r.status_code}: {detail}",
                                r.status_code, field_, bad_request=r.status_code in (400, 422),
                                engine_died=r.headers.get(ENGINE_DIED_HEADER) == "1")
        try:
            body = r.json()
        except ValueError:
            raise RankCallError(ep.rank_id, f"POST {route}: reply is not JSON") from None
        if not isinstance(body, dict):
            raise RankCallError(ep.rank_id, f"POST {route}: reply is not a JSON object")
        return body
