"""Errors of the synchronizer's gRPC API, shared by the daemon and its client.

A `SyncError` carries the gRPC status code and the request field at fault; the data types the
API exchanges are the protocol's (`bubblespec.protocol.domain`).
"""

from __future__ import annotations

import grpc

#: Trailing-metadata key naming the request field an error is about.
FIELD_METADATA_KEY = "bubblespec-field"


class SyncError(Exception):
    """An RPC failed (or, on the daemon, is about to fail) with a gRPC status code.

    `field` is the request field at fault (e.g. `next_prompts[2].samples[0].seed`), or "".
    """

    def __init__(self, code: grpc.StatusCode, message: str, field: str = "", method: str = ""):
        super().__init__(f"{method + ': ' if method else ''}{code.name}: {message}")
        self.code = code
        self.message = message
        self.field = field
        self.method = method


class SyncUnavailable(SyncError):
    """The synchronizer could not be reached in time (UNAVAILABLE or DEADLINE_EXCEEDED)."""


def invalid(field_path: str, message: str) -> SyncError:
    """INVALID_ARGUMENT about `field_path`; the message starts with the field's name."""
    return SyncError(grpc.StatusCode.INVALID_ARGUMENT, f"{field_path}: {message}", field_path)


def not_found(field_path: str, message: str) -> SyncError:
    """NOT_FOUND about `field_path`."""
    return SyncError(grpc.StatusCode.NOT_FOUND, f"{field_path}: {message}", field_path)


def precondition(field_path: str, message: str) -> SyncError:
    """FAILED_PRECONDITION about `field_path`: a valid request at the wrong moment."""
    return SyncError(grpc.StatusCode.FAILED_PRECONDITION, f"{field_path}: {message}", field_path)
