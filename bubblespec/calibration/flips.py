"""Measured flips for the calibration: where each response of a paced run left its
pre-generated draft (a policy update flipped a keyed token there, docs/design.md section 5),
so that the replay covers a response by its draft only up to that position.

Sources: the paced records' own `request_first_divergence` (runs recorded after it was
added), or the rows of a `bubblespec bench flips` JSON of the same schedule (same task,
prompts, n, seed and learning rate: it samples the same tokens with the keyed reference).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bubblespec.sim.model import NO_FLIP

if TYPE_CHECKING:
    from bubblespec.bench.paced_record import PacedRun

Flips = dict[tuple[int, int, int], int]
"""(step, prompt, sample) -> output position where the response left its pre-generated
draft (a flip)."""


def load_flips(path: str | Path, branches: int = 0) -> Flips:
    """The flips of a `bubblespec bench flips` JSON (the same schedule: its prompts and
    seeds), for a paced run whose records predate per-request first divergences.

    `branches` > 0: the what-if of margin branching with that many branches per draft at
    its lowest-margin positions: a flip that one of them covers (the runner-up at one of
    those positions) moves to where the response left the branch, as `bench flips`
    measured it (the whole rest: no flip)."""
    doc = json.loads(Path(path).read_text())
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list):  # a bad file, reported like the paced.json checks
        raise ValueError(f"{path}: rows: expected the rows of `bubblespec bench flips`")  # noqa: TRY004
    out: Flips = {}
    for r in rows:
        f = r.get("first_divergence")
        if f is None:
            continue
        rank = r.get("margin_rank")
        if branches > 0 and r.get("runner_up_hit") and rank is not None and rank < branches:
            match = int(r.get("branch_match", 0))
            if match >= int(r.get("tail", 0)):
                continue  # the branch predicted the whole rest
            f = int(f) + 1 + match
        out[(int(r["step"]), int(r["prompt"]), int(r["sample"]))] = int(f)
    return out


def flip_caps(run: PacedRun, name: str, flips: Flips | None = None) -> np.ndarray | None:
    """(steps, prompts, n) output position of each response's flip (NO_FLIP: none) of a
    pre-generating mode: from `flips` when given, else from the records' own
    `request_first_divergence`; None when neither is there. A first divergence at the end
    of a draft cut short also caps: the replay's covered count already stops there."""
    m = run.modes[name]
    if not m.pregen:
        return None
    caps = np.full((run.steps, run.prompts, run.n), NO_FLIP, dtype=np.int64)
    if flips is not None:
        for (k, j, i), f in flips.items():
            if k < run.steps and j < run.prompts and i < run.n:
                caps[k, j, i] = f
        return caps
    if not all("request_first_divergence" in s for s in m.steps):
        return None
    for k, s in enumerate(m.steps):
        for j, row in enumerate(s["request_first_divergence"]):
            for i, f in enumerate(row):
                if f is not None:
                    caps[k, j, i] = int(f)
    return caps


def lost_tokens(run: PacedRun, name: str, caps: np.ndarray | None) -> np.ndarray:
    """Per step: tokens of the responses after their flip."""
    if caps is None:
        return np.zeros(run.steps)
    L = run.lengths(name)
    return np.maximum(0, L - np.minimum(caps, L)).sum(axis=(1, 2)).astype(float)


def ran_out(run: PacedRun, name: str) -> np.ndarray:
    """(steps, prompts, n): True where the records say the response left its draft because
    the draft had ended there (`request_draft_ran_out`: pre-generation stopped before
    finishing it), not at a flip; all False for records without it."""
    out = np.zeros((run.steps, run.prompts, run.n), dtype=bool)
    for k, s in enumerate(run.modes[name].steps[:run.steps]):
        for j, row in enumerate((s.get("request_draft_ran_out") or [])[:run.prompts]):
            for i, v in enumerate(row[:run.n]):
                out[k, j, i] = bool(v)
    return out


def flip_stats(run: PacedRun, flips: Flips | None = None) -> tuple[float, tuple[float, ...]]:
    """(share of the responses after step 0 that left their draft, where: shares of their
    lengths) over the pre-generating modes' flips (the simulator's `flip_share` and
    `flip_positions`); (0, ()) when no flip is known. From the records, a response that
    left its draft where the draft ended is not a flip: the model's own pre-generation
    decides how far drafts reach, so counting those as flips would count the bubble twice."""
    for name in run.modes:
        caps = flip_caps(run, name, flips)
        if caps is None:
            continue
        L = run.lengths(name)[1:]
        hit = caps[1:] < np.minimum(L, NO_FLIP)
        if flips is None:
            hit &= ~ran_out(run, name)[1:]
        return (float(hit.mean()) if hit.size else 0.0,
                tuple(float(x) for x in (caps[1:][hit] / L[hit])))
    return 0.0, ()

