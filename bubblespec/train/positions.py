"""Where responses leave their aligned pre-generated drafts, by position in the response.

A keyed pre-generated draft of a sample is the sample itself under the previous weights; the
response follows it until the update changes a sampled token (a *flip*) or the draft ends
(pre-generation was stopped before finishing it). Whether a real model's gap to the tiny
one comes from the model (flips: how far an update moves its keyed choices, which depends on
the policy's entropy where it samples) or from the workload (drafts that end: bubbles too
short to pre-generate whole responses) is read per position class from two sources:

- `survival_by_position`: from each response's own counters (`first_divergence`,
  `draft_ran_out`, `num_accepted_pregen_tokens`), per class of output positions, the tokens
  responses were still on their drafts (`exposed`), the flips and draft ends in the class,
  and the per-token survival 1 - flips / exposed, the figure the coupling bench measures;
- `entropy_by_position`: the policy's per-token entropy at the sampled positions (the
  trainer computes it in the forward it takes anyway), per class, and at the flips.

A response counts as having a draft when it left one (`first_divergence` set) or accepted
tokens from it; one with neither had no aligned draft (or a draft of nothing) and is left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

POSITION_EDGES = (32, 128, 256)
"""Class boundaries (output positions): 0-31, 32-127, 128-255, 256 and on."""


def class_labels(edges: Sequence[int] = POSITION_EDGES) -> list[str]:
    """"0-31", "32-127", ..., "256+" for `edges`."""
    lo = [0, *edges]
    return [f"{a}-{b - 1}" for a, b in zip(lo, edges)] + [f"{lo[-1]}+"]


def position_class(pos: int, edges: Sequence[int] = POSITION_EDGES) -> int:
    """Index of the class of output position `pos`."""
    return sum(pos >= e for e in edges)


def _on_draft(sample: Mapping[str, Any]) -> int | None:
    """Output positions the response spent on its aligned draft (None: it had none)."""
    div = sample.get("first_divergence")
    if div is not None:
        return int(div)
    if int(sample.get("num_accepted_pregen_tokens") or 0) > 0:
        return len(sample.get("output_ids") or ())
    return None


def survival_by_position(samples: Sequence[Mapping[str, Any]],
                         edges: Sequence[int] = POSITION_EDGES) -> list[dict[str, Any]]:
    """Per position class: tokens exposed on a draft, flips and draft ends there, and the
    per-token survival (None where nothing was exposed). `samples`: `RolloutSample` dicts."""
    rows = [{"positions": label, "exposed": 0, "flips": 0, "ran_out": 0}
            for label in class_labels(edges)]
    bounds = [0, *edges]
    for s in samples:
        end = _on_draft(s)
        if end is None:
            continue
        for i, row in enumerate(rows):
            hi = bounds[i + 1] if i + 1 < len(bounds) else end
            row["exposed"] += max(0, min(end, hi) - bounds[i])
        div = s.get("first_divergence")
        if div is not None:
            key = "ran_out" if s.get("draft_ran_out") else "flips"
            rows[position_class(int(div), edges)][key] += 1
    for row in rows:
        row["survival"] = (1.0 - row["flips"] / row["exposed"] if row["exposed"] else None)
    return rows


def entropy_by_position(entropies: Sequence[Sequence[float]],
                        flips: Sequence[int | None] = (),
                        edges: Sequence[int] = POSITION_EDGES) -> dict[str, Any]:
    """Mean per-token entropy (nats) of the responses `entropies` (one list per response,
    by output position) per position class and over all, and at the flip positions `flips`
    (one per response, None where it did not flip)."""
    sums = [0.0] * (len(edges) + 1)
    counts = [0] * (len(edges) + 1)
    for ent in entropies:
        for pos, h in enumerate(ent):
            c = position_class(pos, edges)
            sums[c] += h
            counts[c] += 1
    at = [ent[f] for ent, f in zip(entropies, flips) if f is not None and 0 <= f < len(ent)]
    total = sum(counts)
    return {"mean": sum(sums) / total if total else None, "tokens": total,
            "by_position": [{"positions": label, "tokens": n, "mean": s / n if n else None}
                            for label, s, n in zip(class_labels(edges), sums, counts)],
            "at_flips": sum(at) / len(at) if at else None, "flips": len(at)}


def pooled(records: Sequence[Mapping[str, Any]], first_step: int = 1) -> list[dict[str, Any]]:
    """The steps' `positions` (survival) and `entropy` (the trainer's) summed per class over
    the records of steps >= `first_step` (step 0 has no pre-generated drafts): one row per
    class with exposed tokens, flips, draft ends, survival and mean entropy."""
    use = [r for r in records if int(r.get("step", 0)) >= first_step]
    rows: list[dict[str, Any]] = []
    for r in use:
        ent = {e["positions"]: e for e in ((r.get("entropy") or {}).get("by_position") or [])}
        for i, row in enumerate(r.get("positions") or []):
            if i == len(rows):
                rows.append({"positions": row["positions"], "exposed": 0, "flips": 0,
                             "ran_out": 0, "entropy_sum": 0.0, "entropy_tokens": 0})
            acc = rows[i]
            for k in ("exposed", "flips", "ran_out"):
                acc[k] += int(row.get(k) or 0)
            e = ent.get(row["positions"]) or {}
            if e.get("mean") is not None:
                acc["entropy_sum"] += e["mean"] * e["tokens"]
                acc["entropy_tokens"] += e["tokens"]
    for acc in rows:
        acc["survival"] = 1.0 - acc["flips"] / acc["exposed"] if acc["exposed"] else None
        n = acc.pop("entropy_tokens")
        acc["entropy"] = acc.pop("entropy_sum") / n if n else None
    return rows


def format_pooled(rows: Sequence[Mapping[str, Any]]) -> str:
    """`pooled` as a small table."""
    def f(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    head = (f"{'positions':>10} {'on draft':>9} {'flips':>6} {'ran out':>7} "
            f"{'survival/tok':>12} {'entropy':>8}")
    lines = [head]
    lines += [f"{r['positions']:>10} {r['exposed']:>9} {r['flips']:>6} {r['ran_out']:>7} "
              f"{f(r['survival'], '.4f'):>12} {f(r['entropy'], '.3f'):>8}" for r in rows]
    return "\n".join(lines)
