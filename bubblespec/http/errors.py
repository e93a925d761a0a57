"""One error type for every HTTP server, and the handlers that give every error one shape.

Every error a bubblespec server answers is JSON `{"detail": "...", "field": "..."}`: `field`
names what the caller got wrong the way the request spells it (`requests[0].input_ids[1]`,
`sampling_params.top_k`, `authorization`, `body`), or is empty when nothing in the request is
at fault. Validation errors add `errors`, the first twenty problems with their fields.

- `ApiError(status, detail, field)` (`bubblespec.protocol.errors`): raised by routes and services for any 4xx/5xx they
  decide on (401 bad token, 409 step conflict, 422 over a configured limit, 503 not ready).
- `InvalidRequest` (raised by the engine's validation): 400.
- `RequestValidationError` (FastAPI's body/path/query parsing): 422, with the field path
  walked through the request body so that pydantic's union-member tags (`list[int]`) and
  JSON character offsets never show up as field names.
- Starlette's own `HTTPException` (404, 405, 413 from the body limit): same shape.

Unexpected exceptions are answered by `bubblespec.http.edge.EdgeMiddleware`, not here:
a handler for `Exception` would run in Starlette's outermost layer, which re-raises after
answering and so makes the server drop the keep-alive connection.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from bubblespec.protocol.errors import ApiError, InvalidRequest

log = logging.getLogger("bubblespec.http")

#: Where FastAPI says a parameter came from (first element of a validation error's `loc`).
_SECTIONS = ("body", "path", "query", "header", "cookie")
#: Errors listed in a 422 body besides the first.
MAX_LISTED_ERRORS = 20


def error_response(status: int, detail: str, field: str = "",
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The JSON error body every route answers with."""
    return JSONResponse({"detail": detail, "field": field}, status_code=status,
                        headers=dict(headers) if headers else None)


def _walk(loc: Sequence[Any], body: Any, missing: bool) -> tuple[str, bool]:
    """(field path, whether a part of `loc` was left out) of a body error's location.

    A part is kept when it leads somewhere in the request body (a key of the object at hand,
    an index of the list at hand) or names the missing key itself; any other part is a tag
    pydantic adds for a union member (`list[int]`) and is left out.
    """
    out, node, skipped = "", body, False
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(part, int) and not isinstance(part, bool) and isinstance(node, list) \
                and 0 <= part < len(node):
            out, node = out + f"[{part}]", node[part]
        elif isinstance(part, str) and isinstance(node, dict) and (
                part in node or (last and missing)):
            out, node = out + ("." if out else "") + part, node.get(part)
        else:
            skipped = True
    return out, skipped


def _locate(error: Mapping[str, Any], body: Any) -> tuple[str, bool]:
    """(field, whether union tags were left out) of one validation error; see `error_field`."""
    loc = list(error.get("loc", ()))
    if error.get("type") == "json_invalid" or loc in ([], ["body"]):
        return "body", False
    if loc[0] == "body":
        field, skipped = _walk(loc[1:], body, error.get("type") == "missing")
        return field or "body", skipped
    out = ""
    for part in loc[1:] if loc[0] in _SECTIONS else loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out or "body", False


def error_field(error: Mapping[str, Any], body: Any = None) -> str:
    """The field of one pydantic/FastAPI validation error, as the request spells it.

    ("body", "prompts", 2, "input_ids", 5) -> "prompts[2].input_ids[5]"; a JSON syntax error
    or an error about the body as a whole -> "body"; ("path", "step") -> "step".
    """
    return _locate(error, body)[0]


def validation_response(exc: RequestValidationError) -> JSONResponse:
    """422 naming the field of the primary problem, and listing the first twenty.

    The primary problem is the first one, except when the body matched none of a union's
    members: then it is the one that got deepest into the body (the member the caller meant).
    """
    errors = list(exc.errors()) or [{"loc": ("body",), "msg": "invalid body"}]
    body = getattr(exc, "body", None)
    located = [_locate(e, body) for e in errors]
    primary = 0
    if any(skipped for _, skipped in located):
        depth = [f.count(".") + f.count("[") for f, _ in located]
        primary = depth.index(max(depth))
    field = located[primary][0]
    listed = [{"field": f, "msg": str(e.get("msg"))}
              for (f, _), e in zip(located[:MAX_LISTED_ERRORS], errors)]
    return JSONResponse({"detail": f"{field}: {errors[primary].get('msg', 'invalid')}",
                         "field": field, "errors": listed}, status_code=422)


def install_error_handlers(app: FastAPI) -> None:
    """Answer `ApiError`, `InvalidRequest`, validation and Starlette HTTP errors as JSON."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        if exc.status >= 500:
            log.warning("%s", exc)
        return error_response(exc.status, exc.detail, exc.field, exc.headers)

    @app.exception_handler(InvalidRequest)
    async def _invalid(_: Request, exc: InvalidRequest) -> JSONResponse:
        return error_response(400, str(exc), exc.field)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        field = "body" if exc.status_code == 413 else ""
        return error_response(exc.status_code, str(exc.detail), field, exc.headers)
