"""How fast a response decodes after it left its pre-generated draft (its tail), as the
simulator applies it: accepted draft tokens per forward per class of tail length.

A step waits for its slowest response, and long tails decode slower than short ones (their
siblings, whose text drafts a tail, ended long before), so one after-flip rate per mode
misplaces the critical path. `ModeSpec.after_flip_by_tail` holds a rate per class; this
module is its type and the look-up of each tail's class. The classes and rates are measured
from paced runs by `bubblespec.calibration.tails`.
"""

from __future__ import annotations

import numpy as np

Rates = tuple[tuple[float, float], ...]
"""((upper edge of the tail length, accepted per forward), ...) ascending, the last edge
infinite."""


def class_rate(rates: Rates, tail: np.ndarray) -> np.ndarray:
    """The accepted-per-forward figure of each tail's class."""
    edges = np.asarray([e for e, _ in rates[:-1]])
    return np.asarray([r for _, r in rates])[np.searchsorted(edges, tail, side="left")]
