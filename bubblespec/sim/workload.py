"""Response lengths and the assignment of prompts to ranks, for the simulator.

Lengths come from an empirical distribution (a JSON file, for instance dumped by
`bubblespec bench service`) or, without one, from a clearly labelled synthetic default:

- `[int, ...]`: lengths of single responses, drawn i.i.d. (siblings uncorrelated);
- `{"lengths": [...]}`: the same;
- `{"by_prompt": [[...], ...]}` (optionally with "lengths"): one list per prompt group; a step
  draws a group per prompt and its n samples from that group's list (without replacement when
  the group has at least n), which keeps the correlation between siblings.

The synthetic default is log-normal: median 2,000 tokens, p99/median = 6 (sigma = ln 6 /
2.326 = 0.77), half of the log-variance shared by the n samples of a prompt (sibling
correlation 0.5 in log length), capped at max_new_tokens = 16,384. These are assumptions that
resemble published long-CoT RL traces (long tail, truncation at the cap), not measurements.
"""

from __future__ import annotations

import heapq
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

Z99 = 2.3263478740408408
"""Standard normal 99th percentile."""


@dataclass
class LengthSource:
    """Where per-request response lengths come from, and how to draw a step's worth."""

    description: str
    flat: np.ndarray | None = None
    groups: list[np.ndarray] = field(default_factory=list)
    median: float = 2000.0
    tail_ratio: float = 6.0
    sibling_corr: float = 0.5
    max_new_tokens: int = 16384
    scale: float = 1.0

    @property
    def synthetic(self) -> bool:
        return self.flat is None and not self.groups

    @classmethod
    def default(cls, median: float = 2000.0, tail_ratio: float = 6.0, sibling_corr: float = 0.5,
                max_new_tokens: int = 16384) -> LengthSource:
        """The synthetic log-normal default (see the module docstring)."""
        if median < 1 or tail_ratio <= 1 or not 0 <= sibling_corr <= 1:
            raise ValueError("need median >= 1, tail_ratio > 1, 0 <= sibling_corr <= 1")
        return cls(description=(f"SYNTHETIC log-normal lengths: median {median:g}, p99/median "
                                f"{tail_ratio:g}, sibling corr {sibling_corr:g}, cap "
                                f"{max_new_tokens}"),
                   median=median, tail_ratio=tail_ratio, sibling_corr=sibling_corr,
                   max_new_tokens=max_new_tokens)

    @classmethod
    def from_json(cls, path: str | Path, scale: float = 1.0) -> LengthSource:
        """Load a lengths file (formats in the module docstring); `scale` multiplies every
        length (to map a small model's task onto longer responses, keeping the shape)."""
        data = json.loads(Path(path).read_text())
        flat, groups = None, []
        if isinstance(data, list):
            flat = data
        elif isinstance(data, dict) and ("lengths" in data or "by_prompt" in data):
            flat = data.get("lengths")
            groups = data.get("by_prompt") or []
        else:
            raise ValueError(f"{path}: expected a list of ints or an object with 'lengths' "
                             "and/or 'by_prompt'")

        def arr(xs: object, what: str) -> np.ndarray:
            a = np.asarray(xs, dtype=float)
            if a.ndim != 1 or a.size == 0 or not np.all(np.isfinite(a)) or np.any(a < 0):
                raise ValueError(f"{path}: {what} must be a non-empty list of lengths >= 0")
            return np.maximum(1, np.round(a * scale)).astype(np.int64)

        g = [arr(x, f"by_prompt[{i}]") for i, x in enumerate(groups)]
        f = arr(flat, "lengths") if flat is not None else None
        if f is None and not g:
            raise ValueError(f"{path}: no lengths")
        n = sum(len(x) for x in g) if g else len(f)
        kind = f"{len(g)} prompt groups" if g else "i.i.d. lengths (no sibling correlation)"
        sc = f", scaled x{scale:g}" if scale != 1.0 else ""
        return cls(description=f"empirical lengths from {path}: {n} responses, {kind}{sc}",
                   flat=f, groups=g, scale=scale)

    def sample(self, rng: np.random.Generator, prompts: int, n: int) -> np.ndarray:
        """Lengths of one step: an int array of shape (prompts, n), each >= 1."""
        if self.groups:
            pick = rng.integers(0, len(self.groups), size=prompts)
            out = np.empty((prompts, n), dtype=np.int64)
            for p, gi in enumerate(pick):
                g = self.groups[gi]
                out[p] = rng.choice(g, size=n, replace=len(g) < n)
            return out
        if self.flat is not None:
            return rng.choice(self.flat, size=(prompts, n))
        sigma = math.log(self.tail_ratio) / Z99
        sp, ss = sigma * math.sqrt(self.sibling_corr), sigma * math.sqrt(1 - self.sibling_corr)
        logs = (math.log(self.median) + sp * rng.standard_normal((prompts, 1))
                + ss * rng.standard_normal((prompts, n)))
        return np.clip(np.round(np.exp(logs)), 1, self.max_new_tokens).astype(np.int64)


def length_stats(lengths: np.ndarray) -> dict[str, float]:
    """Median, mean, p90, p99, max and p99/median of an array of lengths."""
    x = np.asarray(lengths, dtype=float).ravel()
    med = float(np.median(x))
    p99 = float(np.percentile(x, 99))
    return {"median": med, "mean": float(x.mean()), "p90": float(np.percentile(x, 90)),
            "p99": p99, "max": float(x.max()), "p99_over_median": p99 / max(med, 1.0)}


def assign_prompts(lengths: np.ndarray, ranks: int, how: str = "round_robin",
                   lpt_noise: float = 0.5, rng: np.random.Generator | None = None) -> np.ndarray:
    """Rank of each prompt (all n samples of a prompt go to one rank).

    - `round_robin`: prompt p -> rank p mod R. This is what the gateway's LPT does for fresh
      prompts (equal estimates, ties broken by request order).
    - `lpt`: longest processing time first on an *estimate* of each prompt's work (its true
      total length times exp(N(0, lpt_noise)), standing in for the gateway's history-based
      estimate; lpt_noise = 0 is an oracle that real systems cannot reach).
    """
    prompts = lengths.shape[0]
    if how == "round_robin":
        return np.arange(prompts, dtype=np.int64) % ranks
    if how != "lpt":
        raise ValueError(f"unknown assignment {how!r} (round_robin or lpt)")
    rng = rng or np.random.default_rng(0)
    est = lengths.sum(axis=1) * np.exp(lpt_noise * rng.standard_normal(prompts))
    order = np.lexsort((np.arange(prompts), -est))
    out = np.empty(prompts, dtype=np.int64)
    if ranks >= prompts:
        out[order] = np.arange(prompts)
        return out
    heap = [(0.0, r) for r in range(ranks)]
    for p in order:
        load, r = heapq.heappop(heap)
        out[p] = r
        heapq.heappush(heap, (load + float(est[p]), r))
    return out
