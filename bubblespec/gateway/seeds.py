"""Prompt keys and per-sample seeds of a step, and the future steps' pre-generation tasks.

Keyed-noise sampling (docs/design.md section 3) couples a pre-generated response with the real one
only when both use the same seed for the same (prompt, sample index). So seeds are a pure
function of (run seed, step, prompt key, sample index): the gateway derives step s+1's seeds
when it hands out step s+1's pre-generation tasks during step s, and derives the very same
seeds when the trainer rolls out step s+1 without giving seeds.

Prompt keys: `prompt_key(ids)` for the first occurrence of a prompt in a batch, and
`<key>~<k>` for its k-th repeat, so that repeated prompts get their own samples (own seeds,
own drafts) instead of colliding in the draft store.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from bubblespec.protocol.domain import PregenTask
from bubblespec.protocol.keys import derive_seeds, prompt_key
from bubblespec.protocol.sampling import SamplingParams, SeedMode


def assign_keys(prompts: Sequence[Sequence[int]]) -> list[str]:
    """Prompt-group key of each prompt of a batch; repeats get `~1`, `~2`, ... suffixes."""
    seen: Counter[str] = Counter()
    keys = []
    for ids in prompts:
        base = prompt_key(list(ids))
        k = seen[base]
        seen[base] += 1
        keys.append(base if k == 0 else f"{base}~{k}")
    return keys


def step_seeds(run_seed: int, step: int, keys: Sequence[str], n: int,
               given: Sequence[Sequence[int]] | None = None) -> list[list[int]]:
    """Seeds of every prompt of a step: the trainer's when given, else derived."""
    if given is not None:
        return [list(s) for s in given]
    return [derive_seeds(run_seed, step, k, n) for k in keys]


def pregen_tasks(run_seed: int, next_step: int, prompts: Sequence[Sequence[int]], n: int,
                 sampling: SamplingParams, seeds: Sequence[Sequence[int]] | None = None
                 ) -> list[PregenTask]:
    """Pre-generation tasks for `next_step`: n samples per distinct next prompt, prompt-major.

    Keys and seeds are exactly those `next_step`'s rollout of the same prompts will use.
    """
    keys = assign_keys(prompts)
    all_seeds = step_seeds(run_seed, next_step, keys, n, seeds)
    return [
        PregenTask(prompt_key=key, prompt_token_ids=list(ids), sample_index=i,
                   seed=all_seeds[p][i], sampling=sampling, step=next_step)
        for p, (key, ids) in enumerate(zip(keys, prompts)) for i in range(n)
    ]


def lookahead_tasks(run_seed: int, step: int, batches: Sequence[Sequence[Sequence[int]]],
                    n: int, sampling: SamplingParams,
                    seeds: Sequence[Sequence[Sequence[int]]] | None = None
                    ) -> list[PregenTask]:
    """Pre-generation tasks of every future step handed ahead at `step`: batch j is step
    `step` + 1 + j's prompts, nearest step first (`pregen_tasks` per batch)."""
    return [t for j, batch in enumerate(batches)
            for t in pregen_tasks(run_seed, step + 1 + j, batch, n, sampling,
                                  None if seeds is None else seeds[j])]


def resolve_seed_mode(sampling: SamplingParams, handoff: bool, handoff_mode: SeedMode
                      ) -> SamplingParams:
    """The sampling a step runs with: `handoff_mode` (the gateway's `handoff_seed_mode`) for a
    step that hands next prompts ahead or whose prompts were handed ahead, when the request
    leaves `seed_mode` unset and samples (temperature > 0); else the request's own.

    Why keyed by default there: keyed sampling is as exact as vLLM's sampler and couples a
    rollout to the drafts pre-generated for it with the same seeds, so far more of them are
    accepted (docs/results.md, "Branching on by default"). A request that names its seed mode keeps it.
    """
    if (not handoff or "seed_mode" in sampling.model_fields_set or sampling.temperature == 0
            or handoff_mode is SeedMode.DEFAULT):
        return sampling
    return sampling.model_copy(update={"seed_mode": handoff_mode})
