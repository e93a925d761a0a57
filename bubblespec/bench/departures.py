"""How responses decode after they left their pre-generated drafts, from a paced run's
per-request records, beside suffix decoding on the very same responses.

Issue 33 asks that a response that left its draft decode at least at suffix decoding's rate
after it. With keyed sampling every mode samples the same tokens, so each departed response
of a pre-generating keyed mode can be set beside the same response in `suffix-keyed`.

Per response of a step after step 0, from the records (`train/schedule.request_figures`):
length L, decode steps D, accepted pre-generated tokens P, first divergence f. Its *tail* is
the L - f tokens from f on; the tail's forwards are D less the forwards before f, which are
f less the pre-generated tokens accepted there (a response accepts at most f of them before
it leaves the draft). A departure is one of three kinds:

- *ended*: the draft had ended there (`request_draft_ran_out`: pre-generation was stopped
  before finishing it);
- *caught*: a flip after which the response still accepted pre-generated tokens (P > f: a
  margin branch offered at that position, or the draft again after a re-coupling, went on
  drafting it);
- *flip*: the others, where nothing pre-generated drafted the tail.

Suffix decoding has no departure point, so its side is the whole response's tokens per
forward (L / D of the same response in `suffix-keyed`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bubblespec.bench.modes import ALL_MODES
from bubblespec.protocol.sampling import SeedMode

KINDS = ("ended", "flip", "caught")
"""The kinds of departure, in the order they are printed."""
REFERENCE = "suffix-keyed"
"""The mode that decodes the same tokens without pre-generation."""
RECORDS = ("output_lengths", "request_decode_steps", "request_accepted_pregen",
           "request_first_divergence")


def tail_forwards(length: np.ndarray, steps: np.ndarray, pregen: np.ndarray,
                  at: np.ndarray) -> np.ndarray:
    """Forwards a response spent on its tail from `at` on (at least one)."""
    return np.maximum(1, steps - (at - np.minimum(pregen, at)))


def caught_mask(pregen: np.ndarray, at: np.ndarray, ended: np.ndarray) -> np.ndarray:
    """Departures at a flip after which pre-generated drafting went on (see the module
    docstring)."""
    return (pregen > at) & ~ended


def _arr(steps: Sequence[Mapping[str, Any]], key: str, fill: Any = 0) -> np.ndarray:
    return np.concatenate([np.asarray([[fill if v is None else v for v in row]
                                       for row in s[key]]).ravel() for s in steps])


def departures(steps: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray] | None:
    """Per departed response of the steps after step 0: its index among all responses of
    those steps (`index`), tail tokens, tail forwards and kind (an index into `KINDS`);
    None without per-request records."""
    later = list(steps[1:])
    if not later or not all(all(k in s for k in RECORDS) for s in later):
        return None
    L = _arr(later, "output_lengths")
    D = _arr(later, "request_decode_steps")
    P = _arr(later, "request_accepted_pregen")
    f = _arr(later, "request_first_divergence", -1)
    ended = (_arr(later, "request_draft_ran_out", False).astype(bool)
             if all("request_draft_ran_out" in s for s in later)
             else np.zeros(L.shape, bool))
    hit = (f >= 0) & (f < L)
    idx = np.flatnonzero(hit)
    kind = np.where(ended[hit], 0, np.where(caught_mask(P[hit], f[hit], ended[hit]), 2, 1))
    return {"index": idx, "tail": (L - f)[hit], "forwards": tail_forwards(L[hit], D[hit],
                                                                       P[hit], f[hit]),
            "kind": kind}


def departure_rows(first: Mapping[str, Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per pre-generating keyed mode of one seed's run (with `suffix-keyed` beside it): a row
    for all departures and one per kind: responses, tail tokens per forward, the suffix
    mode's tokens per forward on the same responses, and the share of tails at or above
    suffix's rate on their own response."""
    ref = (first.get(REFERENCE) or {}).get("steps") or []
    if len(ref) < 2 or not all(k in s for s in ref[1:] for k in RECORDS[:2]):
        return {}
    sL, sD = _arr(ref[1:], "output_lengths"), _arr(ref[1:], "request_decode_steps")
    out: dict[str, list[dict[str, Any]]] = {}
    known = {m.name: m for m in ALL_MODES}
    for name, run in first.items():
        mode = known.get(name)
        if mode is None or not mode.pregen or mode.seed_mode is not SeedMode.KEYED:
            continue
        steps = (run or {}).get("steps") or []
        d = departures(steps) if len(steps) == len(ref) else None
        if d is None or not d["index"].size or not np.array_equal(
                _arr(steps[1:], "output_lengths"), sL):
            continue
        rows = []
        for label, sel in [("all", np.ones(d["kind"].shape, bool)),
                           *[(k, d["kind"] == i) for i, k in enumerate(KINDS)]]:
            if not sel.any():
                continue
            i = d["index"][sel]
            own = d["tail"][sel] / d["forwards"][sel]
            rows.append({"kind": label, "responses": int(sel.sum()),
                         "tail_tokens_per_forward": float(d["tail"][sel].sum()
                                                          / d["forwards"][sel].sum()),
                         "suffix_tokens_per_forward": float(sL[i].sum() / max(1, sD[i].sum())),
                         "at_or_above_suffix": float(np.mean(own >= sL[i] / np.maximum(1, sD[i])))})
        out[name] = rows
    return out


def departure_lines(first: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """`departure_rows` as printed lines (none without `suffix-keyed` and the records)."""
    lines = []
    for name, rows in departure_rows(first).items():
        cells = [f"{r['kind']} {r['responses']}: {r['tail_tokens_per_forward']:.2f} vs "
                 f"{r['suffix_tokens_per_forward']:.2f} ({r['at_or_above_suffix']:.0%} at or "
                 "above)" for r in rows]
        lines.append(f"{name}: " + "; ".join(cells))
    return lines
