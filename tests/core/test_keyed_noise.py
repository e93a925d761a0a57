"""The keyed-noise reference: determinism, independence across keys, and exactness
(keyed samples follow softmax(logits / T)) with a negative control."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare, kstest

from bubblespec.core.keyed_noise import gumbel, keyed_sample, uniforms


def test_uniforms_deterministic_and_in_open_interval() -> None:
    a = uniforms(7, 3, 1000)
    assert np.array_equal(a, uniforms(7, 3, 1000))
    assert a.min() > 0.0 and a.max() < 1.0
    assert not np.array_equal(a, uniforms(7, 4, 1000))
    assert not np.array_equal(a, uniforms(8, 3, 1000))
    assert np.array_equal(uniforms(7, 3, 10), a[:10])  # prefix-stable in the vocab


def test_uniforms_are_uniform_and_gumbel_is_gumbel() -> None:
    u = np.concatenate([uniforms(s, t, 500) for s in range(20) for t in range(20)])
    assert kstest(u, "uniform").pvalue > 1e-3
    g = np.concatenate([gumbel(s, 0, 2000) for s in range(10)])
    assert kstest(g, "gumbel_r").pvalue > 1e-3


def _counts(logits: np.ndarray, seeds: range, **kw: float) -> np.ndarray:
    c = np.zeros(logits.size)
    for s in seeds:
        c[keyed_sample(logits, s, position=5, **kw)] += 1
    return c


def test_keyed_samples_follow_softmax_and_biased_sampler_is_caught() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 1.5, 12)
    for temperature in (1.0, 0.7):
        p = np.exp(logits / temperature)
        p /= p.sum()
        c = _counts(logits, range(6000), temperature=temperature)
        assert chisquare(c, p * c.sum()).pvalue > 1e-3
    # negative control: sampling at the wrong temperature must be detected
    p = np.exp(logits)
    p /= p.sum()
    wrong = _counts(logits, range(6000), temperature=0.8)
    assert chisquare(wrong, p * wrong.sum()).pvalue < 1e-6


def test_top_k_top_p_masks() -> None:
    logits = np.array([3.0, 2.0, 1.0, 0.0, -1.0])
    seen = {keyed_sample(logits, s, 0, top_k=2) for s in range(300)}
    assert seen == {0, 1}
    seen = {keyed_sample(logits, s, 0, top_p=0.5) for s in range(300)}
    assert seen == {0}
    assert keyed_sample(logits, 1, 0, temperature=0) == 0


def test_keyed_top2_is_the_keyed_sample_and_its_runner_up() -> None:
    from bubblespec.core.keyed_noise import keyed_sample_of_key, keyed_top2, position_key

    rng = np.random.default_rng(3)
    for trial in range(200):
        logits = rng.normal(0, 2.0, 40)
        temperature = (1.0, 0.7)[trial % 2]
        key = position_key(trial, trial % 7)
        tok, margin, ru = keyed_top2(logits, key, temperature)
        assert tok == keyed_sample_of_key(logits, key, temperature)
        assert ru != tok and margin >= 0.0
        # the runner-up is the sample once the token is masked out, with the same noise
        masked = logits.copy()
        masked[tok] = -np.inf
        assert ru == keyed_sample_of_key(masked, key, temperature)
        # raising the runner-up's logit by just over the margin (x T) flips the sample to it
        bumped = logits.copy()
        bumped[ru] += temperature * margin * 1.0001 + 1e-9
        assert keyed_sample_of_key(bumped, key, temperature) == ru


def test_keyed_margin_from_top_logprobs_matches_the_full_vocabulary() -> None:
    from bubblespec.core.keyed_noise import (
        gumbel,
        gumbel_of,
        keyed_margin,
        keyed_top2,
        position_key,
    )

    assert np.allclose(gumbel_of(position_key(5, 2), [0, 7, 99]), gumbel(5, 2, 100)[[0, 7, 99]])
    rng = np.random.default_rng(4)
    for trial in range(100):
        logits = rng.normal(0, 3.0, 30)
        logp = logits - np.logaddexp.reduce(logits)
        key = position_key(trial, 3)
        tok, margin, ru = keyed_top2(logits, key)
        full = {int(v): float(logp[v]) for v in range(30)}
        assert keyed_margin(full, tok, key) == pytest.approx((margin, ru))
        top = dict(sorted(full.items(), key=lambda kv: -kv[1])[:4]) | {tok: full[tok]}
        m, r = keyed_margin(top, tok, key)
        assert m >= margin - 1e-9  # fewer rivals: the margin can only grow
        if ru in top:
            assert (m, r) == pytest.approx((margin, ru))
    assert keyed_margin({3: -0.1}, 3, 1) == (float("inf"), -1)
