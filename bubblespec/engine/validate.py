"""Request validation: every bad field gets an InvalidRequest naming it (never a 500).

Ranges that hold for any engine (temperature >= 0, top_p in (0, 1], the seed mode, ...) are
the protocol's `SamplingParams` model's to check; here are the checks that depend on this
engine (vocabulary, model length) or tie fields together (one seed per sample). Every
token id that enters the engine is checked against its vocabulary: prompts and stop ids
here (pre-generation tasks run through the same `generate`), drafts with `bad_token` in
`RolloutEngine.add_drafts` (a bad draft is dropped there, not refused: it comes from the
draft store, not from the caller).
"""

from __future__ import annotations

from collections.abc import Sequence

from bubblespec.engine.types import GenRequest
from bubblespec.protocol import limits as L
from bubblespec.protocol.errors import InvalidRequest


def bad_token(ids: Sequence[int], vocab_size: int) -> int | None:
    """Position of the first id that is not an int in [0, vocab_size), else None."""
    for i, t in enumerate(ids):
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size:
            return i
    return None


def validate_request(req: GenRequest, vocab_size: int, max_model_len: int) -> None:
    """Raise InvalidRequest for the first field out of range."""
    ids = req.input_ids
    if not ids:
        raise InvalidRequest("input_ids", "empty prompt")
    i = bad_token(ids, vocab_size)
    if i is not None:
        raise InvalidRequest(f"input_ids[{i}]", f"token id {ids[i]!r} outside [0, {vocab_size})")
    if not isinstance(req.n, int) or not 1 <= req.n <= L.MAX_N:
        raise InvalidRequest("n", f"must be an integer in [1, {L.MAX_N}], got {req.n!r}")
    if not 0 <= req.keyed_start <= len(ids):
        raise InvalidRequest("keyed_start", f"must be in [0, {len(ids)}] (the input's "
                                            f"length), got {req.keyed_start}")
    if not 0 <= req.top_logprobs <= 20:
        raise InvalidRequest("top_logprobs", f"must be in [0, 20], got {req.top_logprobs}")
    if req.score:
        if req.n != 1:
            raise InvalidRequest("n", f"a scoring request has one sample, got n={req.n}")
        if len(ids) + 1 > max_model_len:  # vLLM runs one output position (dropped)
            raise InvalidRequest("input_ids", f"a scored prompt has at most "
                                              f"{max_model_len - 1} tokens, got {len(ids)}")
        return
    s = req.sampling
    if len(ids) + s.max_new_tokens > max_model_len:
        raise InvalidRequest("sampling_params.max_new_tokens",
                             f"prompt ({len(ids)}) + max_new_tokens ({s.max_new_tokens}) "
                             f"exceeds the model length {max_model_len}")
    for name in ("stop_token_ids", "allowed_token_ids"):
        listed = getattr(s, name)
        i = bad_token(listed, vocab_size)
        if i is not None:
            raise InvalidRequest(f"sampling_params.{name}[{i}]",
                                 f"token id {listed[i]!r} outside [0, {vocab_size})")
    for t, _ in s.logit_bias:
        if t >= vocab_size:  # vLLM's wording (its SamplingParams refuses these too)
            raise InvalidRequest("sampling_params.logit_bias",
                                 f"token_id(s) [{t}] in logit_bias contain out-of-vocab token "
                                 f"ids. Vocabulary size: {vocab_size}")
    if s.keyed and req.seeds is None:
        raise InvalidRequest("seeds", f"seed_mode '{s.seed_mode.value}' needs one seed per "
                                      "sample")
    if req.seeds is not None:
        if len(req.seeds) != req.n:
            raise InvalidRequest("seeds", f"needs one seed per sample ({req.n}), got "
                                          f"{len(req.seeds)}")
        for i, sd in enumerate(req.seeds):
            if not isinstance(sd, int) or not 0 <= sd <= L.MAX_SEED:
                raise InvalidRequest(f"seeds[{i}]",
                                     f"must be an integer in [0, {L.MAX_SEED}], got {sd!r}")
    last = L.MAX_SAMPLE_INDEX - req.n + 1
    if not isinstance(req.sample_offset, int) or not 0 <= req.sample_offset <= last:
        raise InvalidRequest("sample_offset", f"must be in [0, {last}], got {req.sample_offset!r}")
