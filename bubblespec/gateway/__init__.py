"""The gateway: the trainer's one HTTP address in front of the rank servers.

`bubblespec gateway` runs it (`server.main`); `server.create_app(config)` gives the ASGI app.
See `routes.py` for its own routes and `service.py` for what answers them, `rollout.py` for
what a rollout step does, and `sglang/` and `openai/` for the trainer APIs' fronts over the
services they share (`fronts.py`).
"""

from __future__ import annotations

from bubblespec.gateway.config import GatewayConfig

__all__ = ["GatewayConfig"]
