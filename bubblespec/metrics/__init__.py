"""Small Prometheus helpers shared by every bubblespec process.

Each process (or each server object, in tests that run several in one process) owns a
`CollectorRegistry` made by `new_registry`, which already holds `bubblespec_build_info`.
Conventions: `bubblespec_` prefix, base units (seconds, bytes), counters declared without
`_total` (prometheus_client appends it on exposition), `DURATION_BUCKETS` up to 2,500 s.
"""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    disable_created_metrics,
    generate_latest,
    start_http_server,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

disable_created_metrics()  # no `_created` series: they double every counter for nothing

#: Seconds, from 100 us (one RPC) to ~40 min (one long rollout step).
DURATION_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0,
)

__all__ = [
    "CONTENT_TYPE_LATEST",
    "DURATION_BUCKETS",
    "new_registry",
    "package_version",
    "render",
    "serve_metrics",
]


def package_version() -> str:
    """The installed bubblespec version ("unknown" when run from a bare checkout)."""
    try:
        return metadata.version("bubblespec")
    except metadata.PackageNotFoundError:
        return "unknown"


def new_registry(role: str) -> CollectorRegistry:
    """A fresh registry holding `bubblespec_build_info{version,role,python} 1`."""
    registry = CollectorRegistry(auto_describe=True)
    info = Gauge(
        "bubblespec_build_info",
        "Build of this bubblespec process (value 1).",
        ["version", "role", "python"],
        registry=registry,
    )
    info.labels(package_version(), role, platform.python_version()).set(1)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """Text exposition of `registry`, for a `/metrics` route (content type CONTENT_TYPE_LATEST)."""
    return generate_latest(registry)


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "0.0.0.0") -> tuple[Any, int]:
    """Serve `registry` at http://host:port/metrics in a daemon thread.

    Returns (server, bound port); call `server.shutdown()` and `server.server_close()` to stop.
    Port 0 picks a free port.
    """
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server, int(server.server_port)
