"""SIGTERM handled as Ctrl-C by the long-running commands (`up`, `ray up`, `train-demo`).

A process manager, `kill` or a job scheduler stops a command with SIGTERM, whose default
action ends the process at once: no `finally`, no context manager's exit, so a local
cluster's children would only follow through their death signal. Raised as
KeyboardInterrupt instead, SIGTERM unwinds the command like Ctrl-C: the cluster stops in
order and the command says what it kept.
"""

from __future__ import annotations

import signal
from typing import Any


def _raise_interrupt(_sig: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """From now on SIGTERM raises KeyboardInterrupt in the main thread (call it again after
    a library that installs a handler of its own, as `ray.init` does)."""
    signal.signal(signal.SIGTERM, _raise_interrupt)
