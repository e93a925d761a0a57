"""The addchain task: generator determinism, reward on correct/incorrect/malformed responses,
tokenizer round trips and the shape of the prompt distribution."""

from __future__ import annotations

import random

import pytest

from bubblespec.tasks import AddChainTask, Slips, default_task
from bubblespec.tasks.addchain import BOS_ID, EOS_ID, MAX_STEPS, VOCAB, sample_count
from bubblespec.tasks.stats import edit_distance, length_stats, rollout_report, sibling_stats


@pytest.fixture(scope="module")
def task() -> AddChainTask:
    return default_task()


def test_prompts_are_deterministic_and_seed_dependent(task: AddChainTask) -> None:
    a = task.make_prompts(50, seed=3)
    assert a == task.make_prompts(50, seed=3)
    assert a != task.make_prompts(50, seed=4)
    assert task.make_prompts(10, seed=3) == a[:10]


def test_prompt_fields_agree(task: AddChainTask) -> None:
    for p in task.make_prompts(200, seed=1):
        assert p.input_ids[0] == BOS_ID
        assert list(p.input_ids) == task.encode(p.text, add_bos=True)
        assert p.text == f"{p.start // 10} {p.start % 10} + {p.step} x {p.count} ="
        assert p.answer == (p.start + p.step * p.count) % 100
        assert 1 <= p.count <= MAX_STEPS and 1 <= p.step <= 9 and 0 <= p.start < 100
        assert p.key == p.text


def test_reference_response(task: AddChainTask) -> None:
    p = task.make_prompt(12, 7, 3)
    assert p.answer == 33
    assert p.text == "1 2 + 7 x 3 ="
    assert task.solve(p) == "3 1 2 ; 2 1 9 ; 1 2 6 ; 0 3 3 ; = 3 3"
    p = task.make_prompt(95, 9, 1)
    assert p.answer == 4 and task.solve(p) == "1 9 5 ; 0 0 4 ; = 0 4"
    with pytest.raises(ValueError):
        task.make_prompt(100, 1, 1)
    with pytest.raises(ValueError):
        task.make_prompt(5, 0, 1)
    with pytest.raises(ValueError):
        task.make_prompt(5, 1, MAX_STEPS + 1)


def test_reward_correct(task: AddChainTask) -> None:
    for p in task.make_prompts(100, seed=2):
        text = task.solve(p)
        ids = task.encode(text)
        assert task.reward(p, text) == 1.0
        assert task.reward(p, ids) == 1.0
        assert task.reward(p, ids + [EOS_ID]) == 1.0
        assert task.reward(p, ids + [EOS_ID, 8, 9]) == 1.0  # tokens after <eos> are ignored
        assert task.reward(p, text + " <eos>") == 1.0
        assert task.step_accuracy(p, text) == 1.0


def test_reward_incorrect(task: AddChainTask) -> None:
    p = task.make_prompt(12, 7, 3)
    assert task.reward(p, "3 1 2 ; 2 1 9 ; 1 2 6 ; 0 3 3 ; = 3 4") == 0.0
    wrong = "3 1 2 ; 2 1 9 ; 1 2 7 ; 0 3 4 ; = 3 4"
    assert task.reward(p, wrong) == 0.0
    assert task.step_accuracy(p, wrong) == pytest.approx(2 / 4)
    assert task.reward(p, "= 3 2") == 0.0
    assert task.reward(p, "= 3 3") == 1.0  # only the final answer is checked


@pytest.mark.parametrize("bad", [
    "", "1 2 6 ; 0 3 3 ;", "1 2 6 ; 0 3 3 ; =", "1 2 6 ; 0 3 3 ; = 3", "0 3 3 ; = 33",
    "1 2 6 ; = 2 6 ; = 3 3", "0 3 3 ; = 3 3 ;", "0 3 3 ; = 3 foo", "<bos> 0 3 3 ; = 3 3",
    "0 3 3 ; = 3 3 3", "0 3 3 ; = 3 <eos> 3",
])
def test_reward_malformed(task: AddChainTask, bad: str) -> None:
    p = task.make_prompt(12, 7, 3)
    assert task.parse_answer(bad) is None
    assert task.reward(p, bad) == 0.0
    assert task.reward(p, task.encode(bad)) == 0.0


def test_truncated_ids_get_no_reward(task: AddChainTask) -> None:
    p = task.make_prompt(12, 7, 3)
    ids = task.encode(task.solve(p))
    assert task.reward(p, ids[:-1]) == 0.0
    assert task.reward(p, ids[:-2] + [EOS_ID] + ids[-2:]) == 0.0


def test_tokenizer_round_trip(task: AddChainTask) -> None:
    tok = task.tokenizer
    assert tok.get_vocab_size() == task.vocab_size == len(VOCAB)
    for p in task.make_prompts(20, seed=5):
        text = p.text + " " + task.solve(p)
        enc = tok.encode(text)
        assert enc.ids[0] == BOS_ID and enc.ids[1:] == task.encode(text)
        assert tok.decode(enc.ids) == text
        assert task.decode(enc.ids) == text
        assert task.decode(enc.ids + [EOS_ID], skip_special=False) == "<bos> " + text + " <eos>"


def test_slips_change_some_responses(task: AddChainTask) -> None:
    rng = random.Random(0)
    prompts = task.make_prompts(300, seed=7)
    noisy = [task.solve(p, rng, Slips()) for p in prompts]
    rewards = [task.reward(p, r) for p, r in zip(prompts, noisy)]
    assert 0.3 < sum(rewards) / len(rewards) < 0.9
    clean = [task.solve(p, rng, Slips(0.0, 0.0, 0.0)) for p in prompts]
    assert all(task.reward(p, r) == 1.0 for p, r in zip(prompts, clean))


def test_count_distribution_is_long_tailed() -> None:
    rng = random.Random(0)
    lengths = [4 * sample_count(rng) + 8 for _ in range(5000)]
    st = length_stats(lengths)
    assert st["p99_over_median"] >= 3.0
    assert st["max"] <= 600


def test_stats_helpers(task: AddChainTask) -> None:
    assert edit_distance([1, 2, 3], [1, 3]) == 1
    assert edit_distance([], [4, 5]) == 2
    assert edit_distance([1, 2, 3], [1, 2, 3]) == 0
    sib = sibling_stats([[[1, 2, 3], [1, 2, 3]], [[1, 2, 3, 4], [1, 2, 9, 4]]])
    assert sib["identical"] == 0.5 and sib["similarity"] == pytest.approx((1 + 0.75) / 2)
    p = task.make_prompt(12, 7, 3)
    good = task.encode(task.solve(p)) + [EOS_ID]
    rep = rollout_report([p], [[good, good[:3]]], task.reward)
    assert rep["mean_reward"] == 0.5 and rep["prompts_with_mixed_reward"] == 1.0
