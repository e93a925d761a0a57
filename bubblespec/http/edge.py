"""The edge every bubblespec HTTP server shares: app assembly, bearer auth, body limit, 500s.

`build_app` makes a server's FastAPI app from its service object and its routers:

- the service object (state and logic of the server) sits in `app.state.service`; routes get
  it through the `app_service` dependency, and the app's lifespan calls its `start()` and
  `stop()`;
- routes on a `protected_router()` need `Authorization: Bearer <token>` when the server has a
  token, checked by `BearerRoute` before FastAPI reads or parses the body, so that a caller
  without the token learns nothing about the body's shape (401, not 422), and compared in
  constant time;
- `EdgeMiddleware`, the outermost layer of the app's own: the body-size limit (413, counted
  while the body streams in, so a chunked body without content-length is cut off too), a JSON
  500 for any unexpected exception that keeps the keep-alive connection usable, and a hook
  that sees every request's route template, status and duration (request metrics);
- the error handlers of `errors.py`.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any, Protocol

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bubblespec.http.errors import error_response, install_error_handlers
from bubblespec.protocol.errors import ApiError

log = logging.getLogger("bubblespec.http")

#: The one answer to a missing or wrong token, on every server.
UNAUTHORIZED = "missing or wrong bearer token"

#: Called once per request with (route template or "unmatched", status code, seconds).
RequestHook = Callable[[str, int, float], None]


class Service(Protocol):
    """What `build_app` needs of a server's service object."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def app_service(request: Request) -> Any:
    """FastAPI dependency: the service object of the app serving `request`."""
    return request.app.state.service


def check_bearer(request: Request) -> None:
    """Raise a 401 `ApiError` unless the request carries the app's bearer token."""
    want: bytes | None = request.app.state.bearer
    if want is None:
        return
    given = request.headers.get("authorization", "").encode("latin-1")
    if not hmac.compare_digest(given, want):
        raise ApiError(401, UNAUTHORIZED, "authorization", {"WWW-Authenticate": "Bearer"})


class BearerRoute(APIRoute):
    """An APIRoute that checks the bearer token before anything reads the request body."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def authorized(request: Request) -> Response:
            check_bearer(request)
            return await handler(request)

        return authorized


def protected_router() -> APIRouter:
    """A router whose routes need the bearer token (`BearerRoute`). The HTTPBearer
    dependency only declares the scheme in the OpenAPI schema; `BearerRoute` enforces it."""
    return APIRouter(route_class=BearerRoute,
                     dependencies=[Depends(HTTPBearer(auto_error=False))])


class EdgeMiddleware:
    """Outermost ASGI layer of the app: body limit, JSON 500s, per-request hook."""

    def __init__(self, app: ASGIApp, max_body_bytes: int,
                 on_request: RequestHook | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.on_request = on_request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.monotonic()
        code, started = 500, False

        async def send_(message: Message) -> None:
            nonlocal code, started
            if message["type"] == "http.response.start":
                code, started = message["status"], True
            await send(message)

        limit = self.max_body_bytes
        seen = 0

        async def receive_() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:  # FastAPI re-raises HTTPException from body reading
                    raise StarletteHTTPException(413, f"body over {limit} bytes")
            return message

        try:
            length = dict(scope.get("headers") or []).get(b"content-length")
            if length is not None and (not length.isdigit() or int(length) > limit):
                await error_response(413, f"body over {limit} bytes", "body")(
                    scope, receive, send_)
                return
            await self.app(scope, receive_, send_)
        except Exception as exc:
            if started:
                raise
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            # answered here and not re-raised: the server keeps the connection open
            await error_response(500, f"internal error: {type(exc).__name__}: {exc}")(
                scope, receive, send_)
        finally:
            if self.on_request is not None:
                route = getattr(scope.get("route"), "path", "unmatched")
                self.on_request(route, code, time.monotonic() - t0)


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    service: Service = app.state.service
    await service.start()
    try:
        yield
    finally:
        await service.stop()


def build_app(title: str, service: Service, routers: Sequence[APIRouter], *,
              token: str | None, max_body_bytes: int,
              on_request: RequestHook | None = None) -> FastAPI:
    """A server's app: `service` in `app.state`, its `routers`, the shared edge around them.

    `token`: the bearer token of the protected routes (None: no auth).
    """
    app = FastAPI(title=title, lifespan=_lifespan)
    app.state.service = service
    app.state.bearer = f"Bearer {token}".encode() if token else None
    install_error_handlers(app)
    app.add_middleware(EdgeMiddleware, max_body_bytes=max_body_bytes, on_request=on_request)
    for router in routers:
        app.include_router(router)
    return app
