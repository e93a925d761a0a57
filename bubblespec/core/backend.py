"""Chooses the draft path's implementation: the native module or the pure-Python reference.

``bubblespec_native`` (C++, built from ``native/`` by ``make install``) holds twins of
:class:`~bubblespec.core.suffix_index.SuffixIndex`, its matchers and drafts, and of the batch
step :func:`~bubblespec.core.batch.step`, with the same names, arguments, results and
errors: identical drafts token for token (the property tests in tests/core hold both to it).
The pure-Python classes stay the reference and the fallback when the native module is absent
(a failed build) or when ``BUBBLESPEC_PURE_PYTHON=1`` is set (tests and benchmarks compare
both in one process through :func:`implementations`).

Usage: ``from bubblespec.core.backend import SuffixIndex, Request, step``
(``extend_requests``: the appends a step left for later).
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

from bubblespec.core import batch as _py_batch
from bubblespec.core import suffix_index as _py_index

FORCE_PURE_ENV = "BUBBLESPEC_PURE_PYTHON"


def load_native() -> ModuleType | None:
    """The native module, or None when it is not installed (or fails to import)."""
    try:
        import bubblespec_native
    except ImportError:
        return None
    return bubblespec_native


def implementations() -> dict[str, dict[str, Any]]:
    """Every available implementation by name ("python", "native" when installed): each a
    dict with ``SuffixIndex``, ``Request``, ``step`` and ``extend_requests``."""
    impls: dict[str, dict[str, Any]] = {
        "python": {"SuffixIndex": _py_index.SuffixIndex, "Request": _py_batch.Request,
                   "step": _py_batch.step, "extend_requests": _py_batch.extend_requests}}
    nat = load_native()
    if nat is not None:
        impls["native"] = {"SuffixIndex": nat.SuffixIndex, "Request": nat.Request,
                           "step": nat.step, "extend_requests": nat.extend_requests}
    return impls


def _choose() -> tuple[str, dict[str, Any]]:
    impls = implementations()
    if os.environ.get(FORCE_PURE_ENV, "") not in ("", "0") or "native" not in impls:
        return "python", impls["python"]
    return "native", impls["native"]


BACKEND, _impl = _choose()
"""Name of the implementation in use: "native" or "python"."""
SuffixIndex = _impl["SuffixIndex"]
Request = _impl["Request"]
step = _impl["step"]
extend_requests = _impl["extend_requests"]

__all__ = ["BACKEND", "FORCE_PURE_ENV", "Request", "SuffixIndex", "extend_requests",
           "implementations", "load_native", "step"]
