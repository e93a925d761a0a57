"""The gateway: the trainer's one HTTP address in front of the rank servers.

`bubblespec gateway` runs it (`server.main`); `create_app(config)` gives the ASGI app.
See `routes.py` for the routes, `service.py` for what answers them and `rollout.py` for what
a rollout step does.
"""

from __future__ import annotations

from bubblespec.gateway.config import GatewayConfig

__all__ = ["GatewayConfig", "create_app"]


def create_app(config: GatewayConfig):  # -> fastapi.FastAPI (imported lazily)
    """The gateway's ASGI app for `config`."""
    from bubblespec.gateway.server import create_app as _create

    return _create(config)
