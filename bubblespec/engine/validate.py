"""Request validation: every bad field gets an InvalidRequest naming it (never a 500)."""

from __future__ import annotations

import math

from bubblespec.engine.types import GenRequest, InvalidRequest

MAX_N = 1024


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def validate_request(req: GenRequest, vocab_size: int, max_model_len: int) -> None:
    """Raise InvalidRequest for the first field out of range."""
    ids = req.input_ids
    if not ids:
        raise InvalidRequest("input_ids", "empty prompt")
    for i, t in enumerate(ids):
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size:
            raise InvalidRequest(f"input_ids[{i}]", f"token id {t!r} outside [0, {vocab_size})")
    if not isinstance(req.n, int) or not 1 <= req.n <= MAX_N:
        raise InvalidRequest("n", f"must be an integer in [1, {MAX_N}], got {req.n!r}")
    s = req.sampling
    if not isinstance(s.max_new_tokens, int) or s.max_new_tokens < 1:
        raise InvalidRequest("sampling_params.max_new_tokens",
                             f"must be an integer >= 1, got {s.max_new_tokens!r}")
    if len(ids) + s.max_new_tokens > max_model_len:
        raise InvalidRequest("sampling_params.max_new_tokens",
                             f"prompt ({len(ids)}) + max_new_tokens ({s.max_new_tokens}) "
                             f"exceeds the model length {max_model_len}")
    if not _finite(s.temperature) or s.temperature < 0:
        raise InvalidRequest("sampling_params.temperature",
                             f"must be a finite number >= 0, got {s.temperature!r}")
    if not _finite(s.top_p) or not 0 < s.top_p <= 1:
        raise InvalidRequest("sampling_params.top_p", f"must be in (0, 1], got {s.top_p!r}")
    if not isinstance(s.top_k, int) or (s.top_k != -1 and s.top_k < 1):
        raise InvalidRequest("sampling_params.top_k", f"must be -1 or >= 1, got {s.top_k!r}")
    for i, t in enumerate(s.stop_token_ids):
        if not isinstance(t, int) or not 0 <= t < vocab_size:
            raise InvalidRequest(f"sampling_params.stop_token_ids[{i}]",
                                 f"token id {t!r} outside [0, {vocab_size})")
    if s.seed_mode not in ("default", "keyed"):
        raise InvalidRequest("sampling_params.seed_mode",
                             f"must be 'default' or 'keyed', got {s.seed_mode!r}")
    if s.seed_mode == "keyed" and s.temperature > 0 and req.seeds is None:
        raise InvalidRequest("seeds", "seed_mode 'keyed' needs one seed per sample")
    if req.seeds is not None:
        if len(req.seeds) != req.n:
            raise InvalidRequest("seeds", f"needs one seed per sample ({req.n}), got "
                                          f"{len(req.seeds)}")
        for i, sd in enumerate(req.seeds):
            if not isinstance(sd, int) or not 0 <= sd < 2**63:
                raise InvalidRequest(f"seeds[{i}]", f"must be an integer in [0, 2^63), got {sd!r}")
    if not isinstance(req.sample_offset, int) or req.sample_offset < 0:
        raise InvalidRequest("sample_offset", f"must be >= 0, got {req.sample_offset!r}")
