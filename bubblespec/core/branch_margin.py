"""The streamed-branch threshold, calibrated online from the flips a run observes.

A keyed draft offers its one margin branch (docs/design.md section 5) at the first position
whose keyed margin falls below a threshold m while it decodes (streamed), else at its
smallest margin once complete. Which m is right belongs to the model and the update's size
(`bubblespec bench flips`: 0.1 on the embedded model at lr 1e-4, flips at margins
0.0003-0.013 on SmolLM2-135M at lr 1e-6), so a fixed default would be wrong for most users.
This module picks m from the run itself: every response that left its draft by a flip
(not where the draft ended) tells which thresholds would have branched there.

The first position whose margin is below m is always a *running minimum* of the draft's
margins. A draft therefore carries only its running minima, `records` = [(position,
margin)] with strictly falling margins, and a flip at position f is streamed by exactly the
thresholds in (margin at f, margin of the record before f] when f is a record, by none when
it is not (an earlier position has a smaller margin). If f is the draft's smallest margin
and the draft is complete, thresholds at or below its margin also branch there, but only
at the draft's end. `MarginCalibrator` keeps those windows for the last few steps and
returns the grid threshold that the most flips favour: 2 for a streamed hit, 1 for a hit at
the draft's end, ties to the smaller threshold (fewer drafts spend their branch early). Until
a flip is seen it returns 0: offers at the complete draft only.

Pure: no I/O, no engine; the synchronizer owns one (`synchronizer/state.py`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

GRID: tuple[float, ...] = tuple(round(10.0 ** (e / 6), 8) for e in range(-24, 7))
"""Candidate thresholds: 1e-4 to 10, six per decade (keyed margins are perturbed log-prob
gaps divided by the temperature; below 1e-4 a threshold streams almost nothing)."""


@dataclass(frozen=True)
class FlipWindow:
    """The thresholds that would have branched a draft where its response flipped."""

    lo: float
    """The keyed margin at the flip: a threshold must exceed it to stream there."""
    hi: float
    """The previous running minimum (inf: none): a larger threshold streams earlier."""
    at_end: bool
    """The flip is the complete draft's smallest margin: thresholds <= lo branch there at
    the draft's end."""

    def score(self, m: float) -> int:
        """2: threshold m streams the branch at the flip; 1: branches there at the end."""
        if self.lo < m <= self.hi:
            return 2
        return 1 if self.at_end and m <= self.lo else 0


def running_minima(margins: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    """The (position, margin) pairs whose margin is below every earlier one."""
    out: list[tuple[int, float]] = []
    for p, m in margins:
        if not out or m < out[-1][1]:
            out.append((int(p), float(m)))
    return out


def flip_window(records: Sequence[tuple[int, float]], at: int, complete: bool
                ) -> FlipWindow | None:
    """The window of a flip at output position `at` of a draft with running minima
    `records`; None when `at` is not one of them (no threshold branches there)."""
    for j, (p, m) in enumerate(records):
        if p == at:
            hi = records[j - 1][1] if j > 0 else math.inf
            return FlipWindow(lo=m, hi=hi, at_end=complete and j == len(records) - 1)
        if p > at:
            break
    return None


class MarginCalibrator:
    """Flip windows of the last `steps` steps, and the threshold they favour."""

    def __init__(self, steps: int = 4, grid: Sequence[float] = GRID) -> None:
        self.steps = max(1, int(steps))
        self.grid = tuple(sorted(grid))
        self._windows: deque[tuple[int, list[FlipWindow]]] = deque()
        self.flips = 0
        """Flips observed in all (windows or not)."""
        self.missed = 0
        """Of those, flips no threshold branches at (not a running minimum)."""
        self._cached: float | None = None

    def observe(self, step: int, window: FlipWindow | None) -> None:
        """One flip of `step`'s responses (None: at no running minimum)."""
        self.flips += 1
        self._cached = None
        if window is None:
            self.missed += 1
            return
        if self._windows and self._windows[-1][0] == step:
            self._windows[-1][1].append(window)
        else:
            self._windows.append((step, [window]))
        while self._windows and self._windows[0][0] <= step - self.steps:
            self._windows.popleft()

    def windows(self) -> list[FlipWindow]:
        """The flip windows kept (those of the last `steps` steps), oldest first."""
        return [w for _, ws in self._windows for w in ws]

    def threshold(self) -> float:
        """The grid threshold with the highest summed score (0: nothing observed)."""
        if self._cached is None:
            ws = self.windows()
            best, best_score = 0.0, sum(w.at_end for w in ws)  # 0: complete drafts only
            for m in self.grid:
                s = sum(w.score(m) for w in ws)
                if s > best_score:
                    best, best_score = m, s
            self._cached = best
        return self._cached
