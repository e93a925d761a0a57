"""Hypothesis strategies for the valid request space: every legal combination of sampling
parameters, as the engine, the gateway's own API and its SGLang API take them.

The long runs draw many more examples (`BUBBLESPEC_VALID_EXAMPLES`, the `slow` suites,
`make test-valid-space`); `make test` keeps a fast slice.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import strategies as st

from bubblespec.protocol import limits as L

FAST_EXAMPLES = 12
"""Drawn batches per test in `make test`."""


def examples(fast: int = FAST_EXAMPLES) -> int:
    """How many batches to draw: `BUBBLESPEC_VALID_EXAMPLES`, else the fast slice."""
    return int(os.environ.get("BUBBLESPEC_VALID_EXAMPLES") or fast)


def top_ks(vocab: int) -> st.SearchStrategy[int]:
    """Off (-1 and 0), 1, small, the vocabulary size and beyond it (vLLM reads any top-k at
    or above the vocabulary as off)."""
    return st.sampled_from([-1, 0, 1, 2, 5, 20, 50, vocab - 1, vocab, vocab + 7, L.MAX_TOP_K])


@st.composite
def sampling(draw: st.DrawFn, vocab: int, eos: int, max_new: int = 40, exclude: int = -1
             ) -> dict[str, Any]:
    """One legal `sampling_params` body (the protocol's names); no stop id `exclude`."""
    temperature = draw(st.sampled_from([0.0, 0.0, 0.3, 0.7, 1.0, 1.0, 1.3, L.MAX_TEMPERATURE]))
    budget = draw(st.integers(1, max_new))
    out: dict[str, Any] = {
        "max_new_tokens": budget,
        "min_tokens": draw(st.sampled_from([0, 0, 0, 1, budget // 2, budget])),
        "presence_penalty": draw(st.sampled_from([0.0, 0.0, 0.5, -L.MAX_ADDITIVE_PENALTY,
                                                  L.MAX_ADDITIVE_PENALTY])),
        "frequency_penalty": draw(st.sampled_from([0.0, 0.0, 0.7, -1.0,
                                                   L.MAX_ADDITIVE_PENALTY])),
        "temperature": temperature,
        "top_p": draw(st.sampled_from([1.0, 1.0, 0.95, 0.8, 0.5, 0.1, 1e-6])),
        "top_k": draw(top_ks(vocab)),
        "repetition_penalty": draw(st.sampled_from(
            [1.0, 1.0, 1.1, 1.5, L.MIN_REPETITION_PENALTY, L.MAX_REPETITION_PENALTY])),
        "ignore_eos": draw(st.booleans()),
        "seed_mode": draw(st.sampled_from(["default", "keyed", "keyed_context"])),
        # min_p and logit_bias decode without drafts; drawn often enough to share batches
        "min_p": draw(st.sampled_from([0.0, 0.0, 0.0, 0.05, 0.5, 1.0])),
        "logit_bias": draw(st.one_of(st.just({}), st.just({}), st.dictionaries(
            token_ids(vocab, exclude),
            st.sampled_from([-L.MAX_LOGIT_BIAS, -5.0, 0.0, 2.5, L.MAX_LOGIT_BIAS]),
            min_size=1, max_size=3))),
        "allowed_token_ids": draw(st.one_of(st.just([]), st.just([]), st.lists(
            token_ids(vocab, exclude), min_size=1, max_size=12, unique=True))),
        "bad_words": draw(st.sampled_from([[], [], [], ["7"], [";", "+ 3"], ["1 2"]])),
        # structured outputs the embedded model's word-level vocabulary can satisfy
        "structured": draw(st.sampled_from([None, None, None, {"choice": ["9", "34", "123"]},
                                            {"regex": "[0-9]{1,4}"}])),
    }
    stops = draw(st.lists(token_ids(vocab, exclude), max_size=3))
    if draw(st.booleans()):
        stops.append(eos)
    out["stop_token_ids"] = stops
    return out


def token_ids(vocab: int, exclude: int = -1) -> st.SearchStrategy[int]:
    """Any token id of the vocabulary but `exclude` (a drill's engine-killing token)."""
    return st.integers(0, vocab - 1).filter(lambda t: t != exclude)


def prompts(vocab: int, bos: int, min_size: int = 1, max_size: int = 4, exclude: int = -1
            ) -> st.SearchStrategy[list[list[int]]]:
    """Prompts of 1-24 token ids, a BOS first (a task-like context) or not; none holds
    `exclude`."""
    body = st.lists(token_ids(vocab, exclude), min_size=1, max_size=24)
    one = st.one_of(body, body.map(lambda ids: [bos, *ids]))
    return st.lists(one, min_size=min_size, max_size=max_size)
