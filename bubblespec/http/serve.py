"""The `main()` every bubblespec service shares: configuration, logging, serving.

`service_main` is the part all three roles share (the synchronizer's gRPC daemon too):
load the role's config model from `--config` file, environment and CLI flags
(`bubblespec/config.py`; a bad value exits 2 naming the field and its source), set up logging,
log the effective configuration (secrets masked), then run the role. `http_main` adds what
the HTTP servers (rank, gateway) share: bind the port first (so that nothing the server starts
before it listens can take it; port 0 picks a free one, which the config then carries),
build the app for that config and serve it with uvicorn until SIGTERM/SIGINT, over HTTPS when
the config's TLS settings name a certificate (`uvicorn_server`, `bubblespec/tls.py`).
"""

from __future__ import annotations

import json
import logging
import socket
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from bubblespec.config import (
    DEFAULT_ENV_PREFIX,
    BaseConfig,
    ConfigError,
    effective_config_dict,
    load_config,
)
from bubblespec.tls import TlsSettings, uvicorn_kwargs

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp

log = logging.getLogger("bubblespec")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: Exit statuses of a service's main(): bad configuration, port already taken.
EXIT_CONFIG = 2
EXIT_BIND = 3


#: A role's config model: fields `log_level`, and `host` and `port` for HTTP roles.
C = TypeVar("C", bound=BaseConfig)


def service_main(model: type[C], argv: Sequence[str] | None, run: Callable[[C], int], *,
                 prog: str, env_prefix: str = DEFAULT_ENV_PREFIX) -> int:
    """Load the `model` config from `argv` + env + file, log it, return `run(config)`."""
    try:
        config = load_config(model, argv, env_prefix=env_prefix, prog=prog)
    except ConfigError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_CONFIG
    logging.basicConfig(level=config.log_level, format=LOG_FORMAT)
    log.info("%s effective config: %s", prog,
             json.dumps(effective_config_dict(config), sort_keys=True))
    return run(config)


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (IPv6 when the host has a colon). Raises OSError."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def uvicorn_server(config: BaseConfig, app: ASGIApp, *, graceful_shutdown_s: int = 5,
                   access_log: bool = False) -> uvicorn.Server:
    """The uvicorn server of an HTTP role's `app`: HTTPS when the config's TLS settings
    (`bubblespec/tls.py`) name a certificate, client certificates required with
    `tls_client_auth`. Serve it with `server.run(sockets=[bind(host, port)])`."""
    import uvicorn

    level: str = getattr(config, "log_level", "INFO")
    ssl_kwargs = uvicorn_kwargs(config) if isinstance(config, TlsSettings) else {}
    return uvicorn.Server(uvicorn.Config(
        app, log_level=level.lower(), access_log=access_log,
        timeout_graceful_shutdown=graceful_shutdown_s, **ssl_kwargs))


def http_main(model: type[C], argv: Sequence[str] | None, build: Callable[[C], ASGIApp], *,
              prog: str, env_prefix: str = DEFAULT_ENV_PREFIX, graceful_shutdown_s: int = 5,
              access_log: bool = False) -> int:
    """`service_main` for an HTTP role: bind, `build(config)` the app, serve it."""

    def run(config: C) -> int:
        host: str = config.host
        port: int = config.port
        try:
            sock = bind(host, port)
        except OSError as e:
            print(f"{prog}: cannot bind {host}:{port}: {e}", file=sys.stderr)
            return EXIT_BIND
        if port == 0:
            config = config.model_copy(update={"port": sock.getsockname()[1]})
        server = uvicorn_server(config, build(config), graceful_shutdown_s=graceful_shutdown_s,
                                access_log=access_log)
        server.run(sockets=[sock])
        return 0

    return service_main(model, argv, run, prog=prog, env_prefix=env_prefix)
