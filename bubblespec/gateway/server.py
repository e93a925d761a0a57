"""The gateway: `bubblespec gateway [--port P] [--sync-address H:P] [--ranks ...] [--token T]`.

FastAPI + uvicorn: the routes of `routes.py` answered by a `GatewayService` (`service.py`),
the trainer APIs' fronts (`sglang/`, `openai/`, `tokens/`) over the services they share (`fronts.py`),
behind the shared HTTP edge (`bubblespec.http`: bearer auth, body limit, error shape), with
request metrics by route and the status page at `/`.
"""

from __future__ import annotations

import sys

from fastapi import FastAPI

from bubblespec.gateway import routes
from bubblespec.gateway.config import ENV_PREFIX, GatewayConfig
from bubblespec.gateway.fronts import FrontServices
from bubblespec.gateway.openai import install_openai
from bubblespec.gateway.prepare import Preparer
from bubblespec.gateway.service import GatewayService
from bubblespec.gateway.sglang import install_sglang
from bubblespec.gateway.status_page import install_status_page
from bubblespec.gateway.tokens import install_tokens
from bubblespec.http.edge import build_app
from bubblespec.http.serve import http_main


def create_app(config: GatewayConfig, preparer: Preparer | None = None) -> FastAPI:
    """The gateway's ASGI app (clients opened in its lifespan)."""
    service = GatewayService(config, preparer)
    app = build_app("bubblespec gateway", service, [routes.protected, routes.public],
                    token=config.token.get_secret_value() if config.token else None,
                    max_body_bytes=config.max_body_bytes, on_request=service.observe_request)
    fronts = FrontServices(config, lambda: service.rollouts)  # one step batcher for both APIs
    install_sglang(app, fronts)  # SGLang's native API: /generate, /update_weights_from_disk, ...
    install_openai(app, fronts)  # OpenAI's: /v1/completions, /v1/chat/completions, /v1/models
    install_tokens(app, fronts)  # vLLM's: /inference/v1/generate, /tokenize, /detokenize
    install_status_page(app)  # GET / : ranks and the last steps' timelines, from the routes
    return app


def main(argv: list[str] | None = None) -> int:
    """Entry point of `bubblespec gateway`: parse config, log it, serve until SIGTERM/SIGINT."""
    return http_main(GatewayConfig, argv, create_app, prog="bubblespec gateway",
                     env_prefix=ENV_PREFIX)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
