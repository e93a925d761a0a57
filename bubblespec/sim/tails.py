"""How fast a response decodes while its pre-generated draft covers it (its head) and after it
left the draft (its tail), as the simulator applies it: accepted draft tokens per forward
per class of head or tail length.

A step waits for its slowest response, and long tails decode slower than short ones (their
siblings, whose text drafts a tail, ended long before), while long covered heads decode
faster than short ones (a short head's last forward ends at the response's end, whatever
the speculation length), so one rate per mode misplaces the critical path.
`ModeSpec.after_flip_by_tail` and `ModeSpec.covered_by_head` hold a rate per class; this
module is their type and the look-up of each length's class. The classes and rates are
measured from paced runs by `bubblespec.calibration.tails`.
"""

from __future__ import annotations

import numpy as np

Rates = tuple[tuple[float, float], ...]
"""((upper edge of the head or tail length, accepted per forward), ...) ascending, the last
edge infinite."""


def class_rate(rates: Rates, tail: np.ndarray) -> np.ndarray:
    """The accepted-per-forward figure of each length's class."""
    edges = np.asarray([e for e, _ in rates[:-1]])
    return np.asarray([r for _, r in rates])[np.searchsorted(edges, tail, side="left")]
