"""Context keys (`bubblespec.core.context_keys`): unique within a response, re-coupling after a
shift, the incremental state equal to the batch definition, and exactness on a model that
repeats itself - where a key of the context alone (the negative control) is caught."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from bubblespec.core.context_keys import (
    CONTEXT_LEN,
    ResponseKeys,
    candidate_key,
    context_hash,
    context_only_key,
    next_key,
    response_keys,
)
from bubblespec.core.keyed_noise import keyed_sample_of_key


def test_keys_unique_within_a_response_even_on_repeats() -> None:
    out = [5] * 300 + [1, 2, 3, 4] * 50  # every context repeats many times
    keys = response_keys(9, [1, 2], out)
    assert len(set(keys)) == len(keys) == len(out) + 1


def test_first_unused_rule_survives_hash_collisions() -> None:
    used = {candidate_key(3, context_hash([7, 7]), 0), candidate_key(3, context_hash([7, 7]), 1)}
    assert next_key(3, [7, 7], used) == candidate_key(3, context_hash([7, 7]), 2)
    assert next_key(3, [7, 7], set(), used) == candidate_key(3, context_hash([7, 7]), 2)


def test_keys_recouple_after_an_insertion_and_a_deletion() -> None:
    rng = np.random.default_rng(0)
    prompt = [1, 9, 9]
    a = rng.integers(3, 50_000, 200).tolist()
    ins = a[:60] + [77] + a[60:]  # one token inserted at 60
    dele = a[:90] + a[91:]  # one token deleted at 90
    ka = response_keys(4, prompt, a, extra=0)
    ki = response_keys(4, prompt, ins, extra=0)
    kd = response_keys(4, prompt, dele, extra=0)
    assert ki[:61] == ka[:61] and kd[:91] == ka[:91]
    assert ki[61 + CONTEXT_LEN + 1:] == ka[60 + CONTEXT_LEN + 1:]  # coupled again, shifted
    assert kd[90 + CONTEXT_LEN:] == ka[91 + CONTEXT_LEN:]
    assert ki[61:61 + CONTEXT_LEN] != ka[61:61 + CONTEXT_LEN]  # fresh noise around the edit


@pytest.mark.parametrize("chunk", [1, 3, 17])
def test_incremental_state_equals_the_definition(chunk: int) -> None:
    rng = np.random.default_rng(chunk)
    prompt = rng.integers(0, 20, 7).tolist()
    out = rng.integers(0, 4, 120).tolist()  # small vocab: many repeated contexts
    want = response_keys(11, prompt, out)
    st = ResponseKeys(11, len(prompt))
    seq = prompt + out
    n = len(prompt)
    while n < len(seq):
        n = min(len(seq), n + chunk)
        st.sync(seq[st.sync_start():n], n)
        assert st.keys == want[:n - len(prompt)]
        drafts = out[n - len(prompt):n - len(prompt) + 5]
        ahead = st.lookahead(seq[max(0, n - CONTEXT_LEN):n], drafts, len(drafts) + 1)
        assert ahead == want[n - len(prompt):n - len(prompt) + len(ahead)]
        assert st.keys == want[:n - len(prompt)]  # lookahead leaves the state alone


# A model that repeats itself: a Markov chain over 3 tokens whose next-token logits depend on
# the last token only and favour repeating it, so 4-token contexts recur within a response.
LOGITS = np.log(np.array([[0.70, 0.20, 0.10], [0.15, 0.70, 0.15], [0.25, 0.15, 0.60]]))
LEN = 8


def _processed(logits: np.ndarray, top_p: float) -> np.ndarray:
    p = np.exp(logits - logits.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = np.cumsum(p[order]) - p[order] < top_p
    q = np.zeros_like(p)
    q[order[keep]] = p[order[keep]]
    return q / q.sum()


def _exact_tail(top_p: float) -> np.ndarray:
    """Exact distribution of the last two tokens (9 cells), prompt = [0]."""
    trans = np.stack([_processed(LOGITS[i], top_p) for i in range(3)])
    dist = np.eye(3)[0]
    for _ in range(LEN - 1):
        dist = dist @ trans
    return (dist[:, None] * trans).reshape(-1)


def _sample(seed: int, top_p: float, key_of) -> list[int]:
    seq, used = [0], set()
    for _ in range(LEN):
        key = key_of(seed, seq, used)
        used.add(key)
        seq.append(keyed_sample_of_key(LOGITS[seq[-1]], key, 1.0, top_p=top_p))
    return seq[1:]


def _tail_counts(top_p: float, key_of, n: int = 4000) -> np.ndarray:
    c = np.zeros(9)
    for s in range(n):
        y = _sample(1_000_003 * s + 17, top_p, key_of)
        c[3 * y[-2] + y[-1]] += 1
    return c


def _context_key(seed: int, seq: list[int], used: set[int]) -> int:
    return next_key(seed, seq, used)


def _context_only(seed: int, seq: list[int], used: set[int]) -> int:
    return context_only_key(seed, seq)


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_context_keyed_samples_are_exact_and_the_control_is_caught(top_p: float) -> None:
    exact = _exact_tail(top_p)
    mask = exact > 0
    good = _tail_counts(top_p, _context_key)
    assert good[~mask].sum() == 0
    assert chisquare(good[mask], exact[mask] * good.sum()).pvalue > 1e-3
    bad = _tail_counts(top_p, _context_only)
    assert chisquare(bad[mask], exact[mask] * bad.sum()).pvalue < 1e-6
