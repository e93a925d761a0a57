"""Pre-gen queue orders the synchronizer can actually produce, for the simulator.

`longest_first` (in model.py) sorts every single response by its true length with a
log-normal error: an oracle that knows each sample's length. The synchronizer cannot: it
predicts per prompt (`bubblespec/synchronizer/pregen.py`: the mean length of the prompt's
responses seen in earlier epochs), and samples of one prompt differ by their own share of the
variance. These orders model that:

- `predicted`: breadth-first rounds (one sample per prompt per round), prompts within a round
  by predicted length, longest first;
- `predicted_deep`: all samples of the prompt predicted longest, then the next prompt.

The prediction of a prompt is the geometric mean of its n sampled lengths of that step (the
part siblings share, which earlier epochs reveal) times exp(`noise` x N(0, 1)).
"""

from __future__ import annotations

import numpy as np

ORDERS = ("predicted", "predicted_deep")


def predicted_order(lengths: np.ndarray, rng: np.random.Generator, noise: float,
                    deep: bool) -> np.ndarray:
    """Queue order (request indices, prompt * n + sample) for one step of `lengths`
    (prompts, n): by per-prompt predicted length, in rounds of one sample per prompt, or all
    samples of a prompt together (`deep`)."""
    prompts, n = lengths.shape
    pred = np.exp(np.log(np.maximum(lengths, 1)).mean(axis=1)
                  + noise * rng.standard_normal(prompts))
    by_pred = np.argsort(-pred, kind="stable")
    if deep:
        return (by_pred[:, None] * n + np.arange(n)[None, :]).ravel()
    return (by_pred[None, :] * n + np.arange(n)[:, None]).ravel()
