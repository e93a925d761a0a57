"""A restart budget as a rate: at most `limit` restarts within any `window_s` seconds.

A process that restarts something (a rank its engine, `LocalCluster` its children) gives up
only when that thing keeps dying faster than the rate allows, not after a fixed number of
restarts in its lifetime: a long-running service survives occasional deaths spread over
days, and still stops a crash loop. `RestartWindow` keeps the times of the recent restarts
(a sliding window); the clock is injectable so the rule is tested without waiting. Pure
standard library, no I/O.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class RestartWindow:
    """The restarts of the last `window_s` seconds, against a budget of `limit` of them.

    `spent()` is True when `limit` restarts already happened within the window, so one
    more would exceed the rate: the caller gives up instead (with `limit` 0 the first death
    gives up). `record()` counts one restart now, successful or not.
    """

    def __init__(self, limit: int, window_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._times: deque[float] = deque()
        self.total = 0
        """Restarts recorded over the whole lifetime (for logs and messages)."""

    def _expire(self, now: float) -> None:
        while self._times and self._times[0] <= now - self.window_s:
            self._times.popleft()

    def count(self) -> int:
        """Restarts within the last `window_s` seconds."""
        self._expire(self._clock())
        return len(self._times)

    def spent(self) -> bool:
        """True when `limit` restarts happened within the window (one more is too many)."""
        return self.count() >= self.limit

    def record(self) -> int:
        """Count one restart now; returns the restarts within the window, this one included."""
        now = self._clock()
        self._expire(now)
        self._times.append(now)
        self.total += 1
        return len(self._times)

    def describe(self) -> str:
        """The budget in words, e.g. '3 restart(s) per 600 s'."""
        return f"{self.limit} restart(s) per {self.window_s:g} s"
