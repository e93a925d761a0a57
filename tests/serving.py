"""Serve an ASGI app for real (uvicorn on loopback, in a thread) for tests that need a live
server: real sockets, keep-alive connections, the client's own HTTP stack."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from bubblespec.cluster import free_ports


@contextlib.contextmanager
def serve_app(app: Any, host: str = "127.0.0.1", port: int | None = None,
              log_level: str = "warning") -> Iterator[str]:
    """Run `app` on `port` (default: a free one) until the block ends; yields its URL."""
    if port is None:
        (port,) = free_ports(1, host)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
