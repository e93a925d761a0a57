"""The GRPO schedule's own seeds (`schedule_seeds`): what makes every mode of a benchmark
sample with the same seeds whatever step number the gateway is at."""

from __future__ import annotations

from bubblespec.protocol.keys import SEED_LIMIT, derive_seeds
from bubblespec.train.schedule import schedule_seeds


def test_seeds_are_a_pure_function_of_run_step_position_and_sample() -> None:
    a = schedule_seeds(7, 3, 4, 8)
    assert a == schedule_seeds(7, 3, 4, 8)
    assert len(a) == 4 and all(len(row) == 8 for row in a)
    assert all(0 <= s < SEED_LIMIT for row in a for s in row)
    assert a[2] == derive_seeds(7, 3, "p2", 8)


def test_seeds_differ_between_steps_positions_samples_and_runs() -> None:
    a = schedule_seeds(7, 3, 4, 8)
    flat = [s for row in a for s in row]
    assert len(set(flat)) == len(flat)
    assert not set(flat) & {s for row in schedule_seeds(7, 4, 4, 8) for s in row}
    assert not set(flat) & {s for row in schedule_seeds(8, 3, 4, 8) for s in row}


def test_a_prefix_of_the_batch_keeps_its_seeds() -> None:
    """Seeds follow the prompt's position and sample index, not the batch size or n."""
    big, small = schedule_seeds(1, 0, 6, 8), schedule_seeds(1, 0, 2, 4)
    assert [row[:4] for row in big[:2]] == small
