"""Which shape a caller's prompts came in: one batch, or a list of the next steps' batches.

`next_prompts` (and `next_seeds`) may be one batch of prompts or a list of batches
(docs/api.md); the client, the step batcher and the trainer integrations all tell the two
apart the same way, here: by the first non-empty entry. A prompt is text, a mapping, an
object with `input_ids` or a row of token ids (ints, numpy integers, 0-d tensors); an
entry that is none of these is a batch. Pure Python, no numpy or torch import.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any


def is_token_id(x: Any) -> bool:
    """A token id or seed: an int, a numpy integer or a 0-d tensor (not a bool-like row)."""
    return isinstance(x, numbers.Integral) or getattr(x, "ndim", None) == 0


def is_prompt(p: Any) -> bool:
    """One prompt (or seed row): text, a mapping, an object with `input_ids`, or a row of
    token ids."""
    if isinstance(p, (str, Mapping)) or hasattr(p, "input_ids"):
        return True
    first = next(iter(p), None)
    return first is None or is_token_id(first)


def _empty(e: Any) -> bool:
    return not isinstance(e, (str, Mapping)) and not hasattr(e, "input_ids") and len(e) == 0


def is_batch_list(items: Sequence[Any]) -> bool:
    """Is `items` a list of batches (True) rather than one batch of prompts or seed rows?
    Judged by its first non-empty entry; entries that are all empty lists are empty batches
    (a prompt or a seed row is never empty)."""
    first = next((e for e in items if not _empty(e)), None)
    if first is None:
        return len(items) > 0
    return not is_prompt(first)
