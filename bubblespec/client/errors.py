"""Errors of the bubblespec client: what a failed gateway call raises."""

from __future__ import annotations


class BubbleSpecError(Exception):
    """A gateway call failed: `status` (HTTP code, 0 when the gateway was not reached),
    `detail` (the gateway's message) and `field` (the request field at fault, or "")."""

    def __init__(self, status: int, detail: str, field: str = "", route: str = "") -> None:
        where = f"{route}: " if route else ""
        at = f" (field {field})" if field else ""
        super().__init__(f"{where}HTTP {status}: {detail}{at}" if status else f"{where}{detail}")
        self.status = status
        self.detail = detail
        self.field = field
        self.route = route


class BubbleSpecUnavailable(BubbleSpecError):
    """The gateway could not be reached, or had no rank to run on (503/504)."""
