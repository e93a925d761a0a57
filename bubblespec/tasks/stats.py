"""Rollout statistics: is a batch of sampled responses shaped like an RL rollout?

Used by the training script's evaluation and by benchmarks to report, for n samples per
prompt: the mean reward, the response-length distribution (median, p99 and their ratio: the
long tail that makes the bubble) and how alike sibling responses are (what makes them good
drafts for each other). Pure Python + numpy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import combinations

import numpy as np


def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """Levenshtein distance between two token sequences (O(len(a) * len(b)))."""
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return len(a)
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, y in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y))
        prev = cur
    return prev[-1]


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def length_stats(lengths: Sequence[int]) -> dict[str, float]:
    """Median, mean, p90, p99, max of response lengths and the p99/median ratio."""
    arr = np.asarray(lengths, dtype=float)
    med = float(np.median(arr))
    p99 = float(np.percentile(arr, 99))
    return {
        "median": med,
        "mean": float(arr.mean()),
        "p90": float(np.percentile(arr, 90)),
        "p99": p99,
        "max": float(arr.max()),
        "p99_over_median": p99 / med if med else float("inf"),
    }


def sibling_stats(groups: Sequence[Sequence[Sequence[int]]]) -> dict[str, float]:
    """How alike the responses of one prompt are, averaged over all sibling pairs.

    ``similarity`` is 1 - edit distance / longer length; ``prefix_fraction`` is the shared
    prefix over the longer length; ``identical`` the fraction of pairs that are equal.
    """
    sims, prefs, same = [], [], []
    for group in groups:
        for a, b in combinations(group, 2):
            longer = max(len(a), len(b), 1)
            sims.append(1.0 - edit_distance(a, b) / longer)
            prefs.append(shared_prefix(a, b) / longer)
            same.append(float(list(a) == list(b)))
    if not sims:
        return {"similarity": float("nan"), "prefix_fraction": float("nan"),
                "identical": float("nan"), "pairs": 0}
    return {
        "similarity": float(np.mean(sims)),
        "prefix_fraction": float(np.mean(prefs)),
        "identical": float(np.mean(same)),
        "pairs": len(sims),
    }


def rollout_report(prompts: Sequence[object], responses: Sequence[Sequence[Sequence[int]]],
                   reward: Callable[[object, Sequence[int]], float]) -> dict[str, object]:
    """Reward, length and sibling statistics of ``responses[i][j]`` (sample j of prompt i).

    Responses are token ids as generated (a trailing ``<eos>`` counts as a token, as in
    vLLM's ``num_generation_tokens``).
    """
    rewards = [reward(p, r) for p, group in zip(prompts, responses) for r in group]
    lengths = [len(r) for group in responses for r in group]
    by_prompt = [float(np.mean([reward(p, r) for r in g])) for p, g in zip(prompts, responses)]
    mixed = sum(1 for m in by_prompt if 0.0 < m < 1.0)
    return {
        "prompts": len(prompts),
        "samples": len(rewards),
        "mean_reward": float(np.mean(rewards)),
        "prompts_with_mixed_reward": mixed / max(len(prompts), 1),
        "length": length_stats(lengths),
        "siblings": sibling_stats(responses),
    }


def format_report(rep: dict[str, object]) -> str:
    """A few human-readable lines of a :func:`rollout_report`."""
    ln, sib = rep["length"], rep["siblings"]
    return (
        f"{rep['prompts']} prompts x {rep['samples'] // max(rep['prompts'], 1)} samples: "
        f"mean reward {rep['mean_reward']:.3f} "
        f"(prompts with mixed reward {rep['prompts_with_mixed_reward']:.2f})\n"
        f"length: median {ln['median']:.0f}, mean {ln['mean']:.1f}, p90 {ln['p90']:.0f}, "
        f"p99 {ln['p99']:.0f}, max {ln['max']:.0f}, p99/median {ln['p99_over_median']:.2f}\n"
        f"siblings: similarity {sib['similarity']:.3f}, shared-prefix fraction "
        f"{sib['prefix_fraction']:.3f}, identical pairs {sib['identical']:.3f}"
    )
