"""Errors that name the request field at fault, shared by the engine and the HTTP services.

`InvalidRequest` is what the engine raises for a field out of range (an HTTP 400 or a gRPC
INVALID_ARGUMENT at the edge); `ApiError` is any answer a service gives with an HTTP status
and a `{"detail", "field"}` body.
"""

from __future__ import annotations

from collections.abc import Mapping


class InvalidRequest(ValueError):
    """A request field is out of range; `field` names it (HTTP 400 / INVALID_ARGUMENT)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


class ApiError(Exception):
    """A request answered with `status` (4xx/5xx) and `{"detail", "field"}` (plus `headers`,
    e.g. `WWW-Authenticate` on a 401)."""

    def __init__(self, status: int, detail: str, field: str = "",
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(f"{status}: {detail}" + (f" (field {field})" if field else ""))
        self.status = status
        self.detail = detail
        self.field = field
        self.headers = dict(headers) if headers else None
