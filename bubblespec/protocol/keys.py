"""Prompt-group keys, the engine request-id codec and per-sample seeds.

A prompt group (a prompt's samples and the drafts pre-generated for it) is keyed by a stable
hash of its token ids, the same in every process. Engine request ids carry the group and the
sample index to the draft proposer, which only sees vLLM's request ids.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def prompt_key(input_ids: Sequence[int]) -> str:
    """Stable short key of a prompt (same ids -> same key across processes)."""
    raw = ",".join(map(str, input_ids)).encode()
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


def base_key(key: str) -> str:
    """A prompt key without its repeat suffix (`<key>~<k>`: the k-th repeat of a prompt in
    a batch); what response lengths are learned under."""
    return key.split("~", 1)[0]


def group_token(group: str) -> str:
    """Fixed-width token for a group key, safe inside request ids."""
    return hashlib.blake2b(group.encode(), digest_size=8).hexdigest()


def make_request_id(group: str, sample_index: int, uid: str) -> str:
    """Engine request id carrying the prompt group and sample index to the proposer."""
    return f"bs.{group_token(group)}.{sample_index}.{uid}"


def parse_request_id(req_id: str) -> tuple[str, int, str]:
    """(group token, sample index, base id) of an engine request id.

    vLLM appends "-<random>" to ids it receives; the base id drops it. Ids not made by
    :func:`make_request_id` get their own group (no sharing) and sample index 0."""
    base = req_id.rsplit("-", 1)[0] if "-" in req_id else req_id
    parts = base.split(".")
    if len(parts) == 4 and parts[0] == "bs" and parts[2].isdigit():
        return parts[1], int(parts[2]), base
    return base, 0, base


SEED_LIMIT = 2**63
"""Seeds lie in [0, 2^63) (what the engine accepts)."""

_PERSON = b"bubblespec-seed"


def derive_seed(run_seed: int, step: int, key: str, sample_index: int) -> int:
    """The seed of sample `sample_index` of prompt `key` in `step` (deterministic, 63 bits)."""
    h = hashlib.blake2b(f"{run_seed}:{step}:{key}:{sample_index}".encode(), digest_size=8,
                        person=_PERSON)
    return int.from_bytes(h.digest(), "big") % SEED_LIMIT


def derive_seeds(run_seed: int, step: int, key: str, n: int) -> list[int]:
    """Seeds of samples 0..n-1 of prompt `key` in `step`."""
    return [derive_seed(run_seed, step, key, i) for i in range(n)]
