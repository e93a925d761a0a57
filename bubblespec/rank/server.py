"""`bubblespec rank`: the FastAPI rollout server of one rank (one vLLM engine).

The routes of `routes.py`, answered by a `RankService` (`service.py`: the engine, started in
the background, and the worker that runs step shards and pre-generation), behind the shared
HTTP edge (`bubblespec.http`: bearer auth on the mutating routes, body limit, error shape).
"""

from __future__ import annotations

import os
import sys

from fastapi import FastAPI

from bubblespec.http.edge import build_app
from bubblespec.http.serve import http_main
from bubblespec.rank import routes
from bubblespec.rank.config import ENV_PREFIX, RankConfig
from bubblespec.rank.service import RankService


def create_app(cfg: RankConfig) -> FastAPI:
    """The rank's ASGI app; its lifespan starts the engine in the background."""
    return build_app("bubblespec rank", RankService(cfg), [routes.public, routes.protected],
                     token=cfg.token.get_secret_value() if cfg.token else None,
                     max_body_bytes=cfg.max_body_bytes)


def _serve_app(cfg: RankConfig) -> FastAPI:
    # vLLM's CPU backend reads its KV-cache size from the environment when the engine starts
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.kv_cache_gib))
    return create_app(cfg)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `bubblespec rank`. The port is bound before the engine starts: vLLM
    opens ports of its own while it starts, and one could otherwise take it."""
    return http_main(RankConfig, argv, _serve_app, prog="bubblespec rank",
                     env_prefix=ENV_PREFIX, graceful_shutdown_s=10, access_log=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
