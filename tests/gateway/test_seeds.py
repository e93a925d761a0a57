"""Seeds: deterministic, distinct, and the next step's pre-generation uses the next step's."""

from __future__ import annotations

from bubblespec.gateway.seeds import assign_keys, lookahead_tasks, pregen_tasks, step_seeds
from bubblespec.gateway.shard import LengthEstimator, make_items
from bubblespec.protocol.keys import SEED_LIMIT, derive_seed, derive_seeds, prompt_key
from bubblespec.protocol.sampling import SamplingParams


def test_derive_seed_is_deterministic_in_range_and_sensitive_to_every_input() -> None:
    base = derive_seed(7, 3, "abc", 1)
    assert base == derive_seed(7, 3, "abc", 1)
    assert 0 <= base < SEED_LIMIT
    others = {derive_seed(8, 3, "abc", 1), derive_seed(7, 4, "abc", 1),
              derive_seed(7, 3, "abd", 1), derive_seed(7, 3, "abc", 2)}
    assert base not in others and len(others) == 4
    seeds = derive_seeds(0, 0, "k", 1000)
    assert len(set(seeds)) == 1000
    assert all(0 <= s < SEED_LIMIT for s in seeds)


def test_known_value_is_stable_across_releases() -> None:
    # pinned: changing the derivation would decouple pre-generation from running trainers
    assert derive_seed(1, 2, "0011223344556677", 3) == 3001109231418083399


def test_repeated_prompts_get_their_own_keys() -> None:
    keys = assign_keys([[1, 2], [3], [1, 2], [1, 2]])
    k = prompt_key([1, 2])
    assert keys == [k, prompt_key([3]), f"{k}~1", f"{k}~2"]
    seeds = step_seeds(0, 5, keys, 2)
    assert seeds[0] != seeds[2] != seeds[3]


def test_given_seeds_win() -> None:
    assert step_seeds(0, 1, ["a", "b"], 2, [[1, 2], [3, 4]]) == [[1, 2], [3, 4]]


def test_next_step_pregen_seeds_equal_the_next_rollouts_seeds() -> None:
    run_seed, step, n = 1234, 9, 4
    next_prompts = [[1, 5, 6], [1, 7], [1, 5, 6]]  # with a repeat
    sp = SamplingParams(max_new_tokens=64, temperature=0.8, top_k=-1)
    tasks = pregen_tasks(run_seed, step + 1, next_prompts, n, sp)
    assert len(tasks) == len(next_prompts) * n
    # what the rollout of step+1 will send to the ranks for the same prompts
    keys = assign_keys(next_prompts)
    seeds = step_seeds(run_seed, step + 1, keys, n)
    items = make_items(keys, next_prompts, n, seeds, LengthEstimator(), 64)
    sent = {(it.key, it.sample_offset + j): it.seeds[j] for it in items for j in range(it.n)}
    pregen = {(t.prompt_key, t.sample_index): t.seed for t in tasks}
    assert pregen == sent
    t = tasks[0]
    assert list(t.prompt_token_ids) == next_prompts[0]
    assert t.max_new_tokens == 64 and t.sampling.temperature == 0.8 and t.sampling.top_k == -1
    # and they differ from this step's seeds for the same prompts
    assert step_seeds(run_seed, step, keys, n) != seeds


def test_pregen_tasks_take_the_trainers_next_seeds() -> None:
    tasks = pregen_tasks(0, 1, [[1, 2]], 2, SamplingParams(), [[11, 12]])
    assert [(t.sample_index, t.seed) for t in tasks] == [(0, 11), (1, 12)]


def test_handoff_steps_sample_keyed_unless_the_request_names_its_seed_mode() -> None:
    from bubblespec.gateway.seeds import resolve_seed_mode
    from bubblespec.protocol.sampling import SeedMode

    unset = SamplingParams(temperature=1.0)
    assert resolve_seed_mode(unset, True, SeedMode.KEYED).seed_mode is SeedMode.KEYED
    assert (resolve_seed_mode(unset, True, SeedMode.KEYED_CONTEXT).seed_mode
            is SeedMode.KEYED_CONTEXT)
    # no hand-off, the gateway set to vLLM's sampler, greedy, or a named mode: unchanged
    assert resolve_seed_mode(unset, False, SeedMode.KEYED) == unset
    assert resolve_seed_mode(unset, True, SeedMode.DEFAULT) == unset
    greedy = SamplingParams(temperature=0.0)
    assert resolve_seed_mode(greedy, True, SeedMode.KEYED) == greedy
    named = SamplingParams.model_validate({"temperature": 1.0, "seed_mode": "default"})
    assert resolve_seed_mode(named, True, SeedMode.KEYED).seed_mode is SeedMode.DEFAULT
    # everything else of the request is kept
    rich = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=33, stop_token_ids=(5,))
    out = resolve_seed_mode(rich, True, SeedMode.KEYED)
    assert out.model_dump(exclude={"seed_mode"}) == rich.model_dump(exclude={"seed_mode"})


def test_prompts_handed_several_steps_ahead_get_each_steps_own_seeds() -> None:
    """Batch j of a list handed at step s is step s+1+j's: its tasks name that step and
    carry the seeds that step's rollout derives (or the trainer's, per batch)."""
    run_seed, step, n = 5, 3, 2
    batches = [[[1, 2]], [[1, 2], [1, 9]]]  # the same prompt in both future steps
    sp = SamplingParams(max_new_tokens=8)
    tasks = lookahead_tasks(run_seed, step, batches, n, sp)
    assert [(t.step, t.sample_index) for t in tasks] == [(4, 0), (4, 1), (5, 0), (5, 1),
                                                         (5, 0), (5, 1)]
    for j, batch in enumerate(batches):
        want = step_seeds(run_seed, step + 1 + j, assign_keys(batch), n)
        got = [t.seed for t in tasks if t.step == step + 1 + j]
        assert got == [s for ss in want for s in ss]
    assert tasks[0].seed != tasks[2].seed  # same prompt, other step: other seeds
    given = lookahead_tasks(0, 0, [[[1]], [[2]]], 1, sp, [[[11]], [[22]]])
    assert [(t.step, t.seed) for t in given] == [(1, 11), (2, 22)]
