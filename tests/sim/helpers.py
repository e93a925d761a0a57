"""Request generators for the simulator tests (all figures modelled)."""

from __future__ import annotations

import numpy as np

from bubblespec.sim.rollout import Requests


def make_requests(rng: np.random.Generator, ranks: int, size: int, covered: bool = True,
                  prompt_len: float = 64.0, max_len: int = 60) -> Requests:
    """Small random requests with both phases, drafts and prefill impulses."""
    L = rng.integers(1, max_len, size=size)
    c = np.where(rng.random(size) < 0.5, rng.integers(0, max_len, size=size), 0) if covered \
        else np.zeros(size, dtype=np.int64)
    c = np.minimum(c, L)
    return Requests(rank=rng.integers(0, ranks, size=size), length=L, covered=c,
                    acc_cov=rng.uniform(0, 3, size), acc_unc=rng.uniform(0, 1.5, size),
                    drafted_cov=rng.uniform(3, 6, size), drafted_unc=rng.uniform(1.5, 3, size),
                    prefill=np.where(rng.random(size) < 0.3, 0.004, 0.0), prompt_len=prompt_len)
