"""HTTP plumbing shared by the FastAPI servers: errors that name the field, bearer-token
auth on mutating routes, and a request-body size limit."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from bubblespec.protocol.errors import InvalidRequest


class ServiceUnavailable(Exception):
    """The server cannot serve this yet (engine starting, no rank left): HTTP 503."""

    def __init__(self, detail: str, field: str = "") -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field


class Unauthorized(Exception):
    """Missing or wrong bearer token: HTTP 401."""


def field_of(loc: tuple[Any, ...] | list[Any]) -> str:
    """("body", "prompts", 2, "input_ids", 5) -> "prompts[2].input_ids[5]"."""
    parts = list(loc)
    if parts and parts[0] in ("body", "path", "query", "header") and len(parts) > 1:
        parts = parts[1:]
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + str(p)
    return out


def install_error_handlers(app: FastAPI) -> None:
    """4xx/503 JSON bodies `{"detail": ..., "field": ...}` instead of tracebacks."""

    @app.exception_handler(InvalidRequest)
    async def _invalid(_: Request, e: InvalidRequest) -> JSONResponse:
        return JSONResponse({"detail": str(e), "field": e.field}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError) -> JSONResponse:
        errs = e.errors()
        first = errs[0] if errs else {"loc": (), "msg": "invalid body"}
        field = field_of(first.get("loc", ())) or "body"
        return JSONResponse({"detail": f"{field}: {first.get('msg')}", "field": field,
                             "errors": [{"field": field_of(x.get("loc", ())) or "body",
                                         "msg": x.get("msg")} for x in errs[:20]]},
                            status_code=422)

    @app.exception_handler(ServiceUnavailable)
    async def _unavailable(_: Request, e: ServiceUnavailable) -> JSONResponse:
        return JSONResponse({"detail": e.detail, "field": e.field}, status_code=503)

    @app.exception_handler(Unauthorized)
    async def _unauthorized(_: Request, e: Unauthorized) -> JSONResponse:
        return JSONResponse({"detail": str(e), "field": "authorization"}, status_code=401,
                            headers={"WWW-Authenticate": "Bearer"})


def auth_dependency(token: str | None) -> Callable:
    """A FastAPI dependency requiring `Authorization: Bearer <token>` (no-op without one)."""

    async def check(request: Request) -> None:
        if not token:
            return
        got = request.headers.get("authorization", "")
        if not got.startswith("Bearer ") or not hmac.compare_digest(got[7:], token):
            raise Unauthorized("missing or invalid bearer token")

    return check


def limit_body_size(app: FastAPI, max_bytes: int) -> None:
    """Reject bodies over `max_bytes` with 413 before parsing them."""

    @app.middleware("http")
    async def _limit(request: Request, call_next: Callable) -> JSONResponse:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > max_bytes):
            return JSONResponse({"detail": f"body larger than {max_bytes} bytes",
                                 "field": "body"}, status_code=413)
        return await call_next(request)
