"""The engine's torch keyed noise equals the numpy reference bit for bit (no engine)."""

from __future__ import annotations

import numpy as np
import torch

from bubblespec.core import keyed_noise as ref
from bubblespec.engine import keyed


def test_uniforms_bit_identical() -> None:
    seeds = [0, 1, 2**40 + 3, 2**63 - 1, 123456789]
    positions = [0, 1, 17, 599, 2**31]
    got = keyed.uniforms(torch.tensor(seeds), torch.tensor(positions), 257).numpy()
    for i, (s, t) in enumerate(zip(seeds, positions)):
        assert np.array_equal(got[i], ref.uniforms(s, t, 257)), (s, t)


def test_keyed_argmax_matches_reference_sample() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2, (64, 300))
    seeds = torch.arange(64) * 7919
    pos = torch.arange(64) % 11
    got = keyed.keyed_argmax(torch.tensor(logits), seeds, pos).tolist()
    want = [ref.keyed_sample(logits[i], int(seeds[i]), int(pos[i])) for i in range(64)]
    assert got == want
