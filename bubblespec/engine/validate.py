"""Request validation: every bad field gets an InvalidRequest naming it (never a 500).

Ranges that hold for any engine (temperature >= 0, top_p in (0, 1], the seed mode, ...) are
the protocol's `SamplingParams` model's to check; here are the checks that depend on this
engine (vocabulary, model length) or tie fields together (one seed per sample).
"""

from __future__ import annotations

from bubblespec.engine.types import GenRequest
from bubblespec.protocol.errors import InvalidRequest

MAX_N = 1024


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
    if len(ids) + s.max_new_tokens > max_model_len:
        raise InvalidRequest("sampling_params.max_new_tokens",
                             f"prompt ({len(ids)}) + max_new_tokens ({s.max_new_tokens}) "
                             f"exceeds the model length {max_model_len}")
    for i, t in enumerate(s.stop_token_ids):
        if not 0 <= t < vocab_size:
            raise InvalidRequest(f"sampling_params.stop_token_ids[{i}]",
                                 f"token id {t!r} outside [0, {vocab_size})")
    if s.keyed and req.seeds is None:
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
