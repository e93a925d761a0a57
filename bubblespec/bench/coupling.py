"""How much of a new keyed response its own pre-generated draft predicts, after the first
divergence too: position keys against context keys (`bubblespec bench flips --seed-mode`).

A keyed draft is a coupled prediction of the new response exactly where the two responses
draw the same noise. With position keys that is the same output position, so after the
first divergence the draft predicts again only if the output re-joins it at the same
positions (the proposer's rule: the last `RESYNC` tokens equal the draft's there). With
context keys the noise of output position t is keyed by (the last `CONTEXT_LEN` tokens,
how often that context already occurred in the response), so the new response draws the
draft's noise again wherever it has the same context with the same occurrence index, at
whatever shift: a local insertion or deletion re-couples it.

`follow` replays a drafter that predicts only from the response's own draft, one token per
position (no sibling, no suffix index, no branch), with the re-alignment rule of the key
kind; its tokens predicted after the first divergence are what coupling alone gives the
tail. Pure: no model, no engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bubblespec.core.batch import RESYNC
from bubblespec.core.context_keys import CONTEXT_LEN


def context_slots(prompt_tail: Sequence[int], tokens: Sequence[int]) -> list[tuple]:
    """Per output position t (and one past the end): (the last CONTEXT_LEN tokens before t,
    prompt included; how many earlier output positions had that context), the pair that
    keys t's noise under context keys (without hash collisions)."""
    seq = [*prompt_tail[-CONTEXT_LEN:], *tokens]
    off = len(seq) - len(tokens)
    seen: dict[tuple, int] = {}
    out = []
    for t in range(len(tokens) + 1):
        ctx = tuple(seq[max(0, off + t - CONTEXT_LEN):off + t])
        j = seen.get(ctx, 0)
        seen[ctx] = j + 1
        out.append((ctx, j))
    return out


def follow(draft: Sequence[int], new: Sequence[int], by_context: bool,
           prompt_tail: Sequence[int] = ()) -> dict[str, Any]:
    """Replay a drafter that follows `draft` to predict `new` (see the module docstring).

    Returns `predicted` (tokens of `new` the draft predicted), `tail_predicted` (those after
    the first divergence: positions > it), `tail` (positions after the first divergence)
    and `recouplings` (re-alignments after which the draft predicted at least one token)."""
    by_slot: dict[tuple, int] = {}
    if by_context:
        for q, slot in enumerate(context_slots(prompt_tail, draft)):
            by_slot.setdefault(slot, q)
        slots = context_slots(prompt_tail, new)
    q: int | None = 0  # draft position aligned with the next output position
    first: int | None = None
    predicted = tail_predicted = recouplings = 0
    fresh = False  # re-aligned, and nothing predicted since
    for t, tok in enumerate(new):
        if q is not None and q < len(draft) and draft[q] == tok:
            predicted += 1
            if first is not None:
                tail_predicted += 1
                recouplings += fresh
            fresh = False
            q += 1
            continue
        if first is None:
            first = t
        q, fresh = None, False
        n = t + 1  # output tokens so far: re-align for position n
        if by_context:
            q = by_slot.get(slots[n])
        elif n >= RESYNC and n <= len(draft) and list(draft[n - RESYNC:n]) == list(
                new[n - RESYNC:n]):
            q = n
        fresh = q is not None
    if first is None and len(new) != len(draft):
        first = min(len(new), len(draft))
    tail = 0 if first is None else max(0, len(new) - first - 1)
    return {"predicted": predicted, "tail_predicted": tail_predicted, "tail": tail,
            "recouplings": recouplings}


def coupling_figures(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Totals over rows carrying `follow`'s figures (pure): tokens, predicted share, tail
    share after the first divergence, re-couplings; and the same for each step's longest
    response (the one that sets the critical path)."""
    def agg(rs: Sequence[dict[str, Any]]) -> dict[str, Any]:
        toks = sum(r["length"] for r in rs)
        pred = sum(r["follow"]["predicted"] for r in rs)
        tail = sum(r["follow"]["tail"] for r in rs)
        tpred = sum(r["follow"]["tail_predicted"] for r in rs)
        return {"responses": len(rs), "tokens": toks, "predicted": pred,
                "predicted_share": pred / toks if toks else None, "tail": tail,
                "tail_predicted": tpred, "tail_share": tpred / tail if tail else None,
                "recouplings": sum(r["follow"]["recouplings"] for r in rs)}

    steps = sorted({r["step"] for r in rows})
    longest = [max((r for r in rows if r["step"] == s), key=lambda r: r["length"])
               for s in steps]
    return {"all": agg(rows), "longest": agg(longest)}
