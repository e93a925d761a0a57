"""Per-prompt predicted pre-gen orders of the simulator: a permutation of the step's requests,
prompts by predicted length, in breadth-first rounds or prompt by prompt."""

from __future__ import annotations

import numpy as np

from bubblespec.sim.pregen_order import predicted_order


def test_orders_are_permutations_by_predicted_prompt_length() -> None:
    lengths = np.array([[10, 12], [500, 400], [60, 50]])
    rng = np.random.default_rng(0)
    deep = predicted_order(lengths, rng, 0.0, deep=True)
    assert deep.tolist() == [2, 3, 4, 5, 0, 1]  # prompt 1, then 2, then 0; all samples each
    rounds = predicted_order(lengths, rng, 0.0, deep=False)
    assert rounds.tolist() == [2, 4, 0, 3, 5, 1]  # sample 0 of 1, 2, 0; then sample 1
    noisy = predicted_order(lengths, np.random.default_rng(1), 5.0, deep=True)
    assert sorted(noisy.tolist()) == list(range(6))
