"""Paced ranks under the GRPO schedule: each step's modelled rollout seconds and overruns.

A rank started paced (`--pace=h100 --pace-scale=S`, e.g. `bubblespec train-demo
--rank-arg=--pace=h100 --rank-arg=--pace-scale=150`) makes every forward last the engine-time
model's GPU time x S (`bubblespec.engine.pace`), so a rollout's wall seconds / S are modelled
GPU seconds whatever this machine's cores, as long as its forwards did not overrun. A probe
reads every rank's GET /v1/pace before and after each rollout; `step_pace` turns the two
readings into the step's paced figures (modelled rollout seconds, forwards, overruns,
validity), so a learning curve can carry rollout time per step as a GPU would spend it.
Unpaced ranks report a scale of 0: their steps carry no paced figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from bubblespec.engine.pace import MAX_OVERRUN_SHARE, merge_stats, stats_delta

PACE_TIMEOUT_S = 60.0
"""Deadline of one rank's GET /v1/pace. The rank answers between two engine steps (its
counters live in the engine's worker), and a paced step lasts S x its modelled time: a
prefill of tens of modelled milliseconds at x200-x500 holds the answer back for seconds,
and at 10 s a 20-step paced run lost two steps' figures."""


def rank_pace(rank_urls: Mapping[str, str],
              timeout_s: float = PACE_TIMEOUT_S) -> dict[str, dict[str, Any]]:
    """Every rank's GET /v1/pace (paced-forward counters since its engine started)."""
    out = {}
    for rid, url in rank_urls.items():
        r = httpx.get(url + "/v1/pace", timeout=timeout_s)
        r.raise_for_status()
        out[rid] = r.json()
    return out


class PaceProbe:
    """The ranks' paced counters added up, read on each call (what `run_grpo` reads before
    and after each rollout)."""

    def __init__(self, rank_urls: Mapping[str, str], timeout_s: float = PACE_TIMEOUT_S):
        self.rank_urls = dict(rank_urls)
        self.timeout_s = timeout_s

    def __call__(self) -> dict[str, Any]:
        return merge_stats(rank_pace(self.rank_urls, self.timeout_s).values())


def step_pace(before: Mapping[str, Any], after: Mapping[str, Any],
              wall_s: float) -> dict[str, Any] | None:
    """One rollout's paced figures from the ranks' counters before and after it (`PaceProbe`
    readings) and its wall seconds: `modelled_s` = wall / scale (the rollout as the modelled
    GPU would take it), the forwards of all ranks in it (pre-generation in the bubble too)
    and how many overran, `valid` (under 1% overran), the proposer's seconds, and the scale
    that would have kept the overruns under 1%. None when the ranks are not paced."""
    d = stats_delta(after, before)
    scale = float(d.get("scale") or 0.0)
    if scale <= 0 or d["forwards"] <= 0:
        return None
    return {"scale": scale, "modelled_s": float(wall_s) / scale,
            "forwards": int(d["forwards"]), "overruns": int(d["overruns"]),
            "overrun_share": d["overrun_share"], "valid": bool(d["valid"]),
            "drafting_s": float(d["drafting_s"]), "scale_for_valid": d["scale_for_valid"]}


def run_pace(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The paced figures of a whole run (its steps' `pace`): modelled rollout seconds in all
    and per step, forwards, overruns and validity over all steps; None if no step was
    paced."""
    steps = [r.get("pace") for r in records]
    paced = [p for p in steps if p]
    if not paced:
        return None
    forwards = sum(p["forwards"] for p in paced)
    overruns = sum(p["overruns"] for p in paced)
    return {"scale": paced[0]["scale"], "steps": len(paced),
            "modelled_s": sum(p["modelled_s"] for p in paced),
            "per_step_modelled_s": [p["modelled_s"] if p else None for p in steps],
            "forwards": forwards, "overruns": overruns,
            "valid": overruns < MAX_OVERRUN_SHARE * forwards}


def format_run_pace(s: Mapping[str, Any]) -> str:
    """`run_pace` as one line."""
    return (f"paced rollouts (x{s['scale']:g}): {s['modelled_s']:.2f} modelled GPU s over "
            f"{s['steps']} steps; {s['overruns']} of {s['forwards']} forwards overran "
            f"({'valid' if s['valid'] else 'INVALID: raise --pace-scale'})")
