"""The engine's torch keyed noise equals the numpy reference bit for bit (no engine)."""

from __future__ import annotations

import numpy as np
import torch

from bubblespec.core import keyed_noise as ref
from bubblespec.core.context_keys import response_keys
from bubblespec.engine import keyed


def test_uniforms_bit_identical() -> None:
    seeds = [0, 1, 2**40 + 3, 2**63 - 1, 123456789]
    positions = [0, 1, 17, 599, 2**31]
    keys = [keyed.position_key(s, t) for s, t in zip(seeds, positions)]
    assert keys == [int(ref.position_key(s, t)) for s, t in zip(seeds, positions)]
    got = keyed.uniforms_of_keys(keyed.key_tensor(keys), 257).numpy()
    for i, (s, t) in enumerate(zip(seeds, positions)):
        assert np.array_equal(got[i], ref.uniforms(s, t, 257)), (s, t)


def test_keyed_argmax_matches_reference_sample() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2, (64, 300))
    seeds = [7919 * i for i in range(64)]
    pos = [i % 11 for i in range(64)]
    keys = keyed.key_tensor([keyed.position_key(s, t) for s, t in zip(seeds, pos)])
    got = keyed.keyed_argmax(torch.tensor(logits), keys).tolist()
    want = [ref.keyed_sample(logits[i], seeds[i], pos[i]) for i in range(64)]
    assert got == want


def test_context_keyed_argmax_matches_reference_sample() -> None:
    rng = np.random.default_rng(2)
    logits = rng.normal(0, 2, (40, 300))
    out = rng.integers(0, 5, 39).tolist()
    keys = response_keys(77, [1, 2, 3], out)
    got = keyed.keyed_argmax(torch.tensor(logits), keyed.key_tensor(keys)).tolist()
    assert got == [ref.keyed_sample_of_key(logits[i], keys[i]) for i in range(40)]
