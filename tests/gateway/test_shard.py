"""Sharding: LPT balance, siblings together, request order restored, length estimates."""

from __future__ import annotations

import random

import pytest

from bubblespec.gateway.seeds import assign_keys
from bubblespec.gateway.shard import (
    AssemblyError,
    LengthEstimator,
    ReplySample,
    WorkItem,
    assemble,
    loads_of,
    lpt,
    make_items,
)
from bubblespec.protocol.rank import SampleOut


def _items(costs: list[float], n: int = 4) -> list[WorkItem]:
    return [WorkItem(i, f"k{i}", (1, i), 0, n, None, c) for i, c in enumerate(costs)]


def test_lpt_within_four_thirds_of_optimum_and_every_item_once() -> None:
    rng = random.Random(7)
    for trial in range(200):
        costs = [rng.lognormvariate(3, 1) for _ in range(rng.randint(1, 60))]
        ranks = [f"r{j}" for j in range(rng.randint(1, 6))]
        out = lpt(_items(costs), ranks)
        assert set(out) == set(ranks)
        placed = sorted(it.index for items in out.values() for it in items)
        assert placed == list(range(len(costs))), trial
        makespan = max(loads_of(out).values())
        lower = max(max(costs), sum(costs) / len(ranks))
        assert makespan <= lower * (4 / 3) + 1e-9, trial  # Graham's LPT bound


def test_lpt_balances_a_long_tail() -> None:
    costs = [600.0] + [30.0] * 20  # one long prompt, many short ones
    out = lpt(_items(costs), ["r0", "r1"])
    loads = loads_of(out)
    long_rank = next(r for r, its in out.items() if any(it.index == 0 for it in its))
    assert len(out[long_rank]) == 1  # the long prompt's rank gets nothing else
    assert loads[long_rank] == 600.0


def test_lpt_respects_starting_loads_and_keeps_request_order() -> None:
    out = lpt(_items([10, 10, 10, 10]), ["r0", "r1"], loads={"r0": 1000.0})
    assert [it.index for it in out["r1"]] == [0, 1, 2, 3]
    assert out["r0"] == []
    out = lpt(_items([5, 50, 7, 3, 40]), ["a", "b", "c"])
    for items in out.values():
        assert [it.uid for it in items] == sorted(it.uid for it in items)


def test_lpt_needs_ranks() -> None:
    with pytest.raises(ValueError):
        lpt(_items([1.0]), [])


def test_siblings_stay_together_unless_ranks_outnumber_prompts() -> None:
    prompts = [[1, 2, 3], [1, 2, 4], [1, 2, 5]]
    keys = assign_keys(prompts)
    est = LengthEstimator()
    items = make_items(keys, prompts, 8, None, est, 100, num_ranks=2, split=True)
    assert [(it.index, it.sample_offset, it.n) for it in items] == [(0, 0, 8), (1, 0, 8),
                                                                    (2, 0, 8)]
    # 1 prompt, 3 ranks: split 8 samples into 3 near-equal runs covering 0..7 with seeds
    seeds = [[100 + i for i in range(8)]]
    items = make_items(keys[:1], prompts[:1], 8, seeds, est, 100, num_ranks=3, split=True)
    assert [(it.sample_offset, it.n) for it in items] == [(0, 3), (3, 3), (6, 2)]
    assert [s for it in items for s in it.seeds] == seeds[0]
    # splitting off: one item
    items = make_items(keys[:1], prompts[:1], 8, None, est, 100, num_ranks=3, split=False)
    assert len(items) == 1 and items[0].n == 8


def test_length_estimator_learns_per_key_and_falls_back_to_running_mean() -> None:
    est = LengthEstimator(alpha=0.5, max_keys=2)
    assert est.estimate("a", 600) == 600  # nothing seen yet: max_new_tokens
    est.observe("a", 100)
    assert est.estimate("a", 600) == 100
    est.observe("a", 200)
    assert est.estimate("a", 600) == 150  # EMA
    assert est.estimate("a", 120) == 120  # capped by max_new_tokens
    assert est.estimate("unseen", 600) == pytest.approx(110)  # running mean, not 600
    est.observe("b~1", 50)  # repeats learn under the base key
    assert est.estimate("b", 600) == 50
    est.observe("c", 10)  # bounded: "a" (least recently observed) is forgotten
    assert len(est) == 2
    assert est.estimate("a", 600) != 150


def test_costs_follow_the_estimates() -> None:
    prompts = [[1, 9], [1, 8]]
    keys = assign_keys(prompts)
    est = LengthEstimator()
    est.observe(keys[0], 400)
    est.observe(keys[1], 20)
    items = make_items(keys, prompts, 4, None, est, 600)
    assert items[0].cost == 1600 and items[1].cost == 80


def test_assemble_restores_order_and_checks_every_sample() -> None:
    def sample(index: int, key: str) -> ReplySample:
        return ReplySample(SampleOut(sample_index=index, output_ids=[index], output_logprobs=[]),
                           "r0", key)

    got = {1: [sample(1, "b1"), sample(0, "b0")], 0: [sample(0, "a0"), sample(1, "a1")]}
    out = assemble(2, 2, got)
    assert [[s.prompt_key for s in p] for p in out] == [["a0", "a1"], ["b0", "b1"]]
    with pytest.raises(AssemblyError, match="prompt 1"):
        assemble(2, 2, {0: got[0], 1: got[1][:1]})
    with pytest.raises(AssemblyError):
        assemble(2, 2, {0: got[0] + got[0][:1], 1: got[1]})  # a sample twice
