"""The wordproblems task: stories whose stated answer is right (checked by an independent
reading of the sentences), long-tailed step counts, deterministic prompts in the model's chat
format, and an answer parser that takes the marked answer, else the last number."""

from __future__ import annotations

import itertools
import random
import re

import pytest

from bubblespec.tasks import TASKS, make_task
from bubblespec.tasks.wordproblems import (
    MAX_STEPS,
    MAX_VALUE,
    WordProblem,
    WordProblemsTask,
    chat_prompt,
    make_story,
    reference_solution,
    sample_steps,
)

GAIN = re.compile(r"(?:finds|buys|wins|friend gives \w+) (\d+)")
LOSS = re.compile(r"(?:gives|loses|sells|puts) (\d+)")


def read_story(story: str) -> int:
    """The answer, by reading the story sentence by sentence (not the generator's sum)."""
    sentences = [s for s in story.split(". ") if s]
    value = int(re.search(r"has (\d+)", sentences[0]).group(1))
    for s in sentences[1:]:
        if "How many" in s:
            break
        gain, loss = GAIN.search(s), LOSS.search(s)
        assert (gain is None) != (loss is None), s
        value += int(gain.group(1)) if gain else -int(loss.group(1))
    return value


def test_stories_state_the_right_answer() -> None:
    rng = random.Random(0)
    for _ in range(500):
        steps = sample_steps(rng)
        story, answer = make_story(rng, steps)
        assert read_story(story) == answer, story
        assert 0 <= answer <= MAX_VALUE
        assert story.count(".") == steps + 1 and story.endswith("have now?")


def test_step_counts_are_long_tailed() -> None:
    rng = random.Random(1)
    counts = sorted(sample_steps(rng) for _ in range(4000))
    median, p99 = counts[len(counts) // 2], counts[int(0.99 * len(counts))]
    assert median == 3 and p99 >= 2 * median and max(counts) <= MAX_STEPS
    assert min(counts) == 1


@pytest.mark.parametrize(("text", "want"), [
    ("3 + 4 = 7, then 7 - 2 = 5. The answer is 5.", 5),
    ("The answer is 4. Wait, 4 + 1 = 5. So the answer is: 12", 12),
    ("She has 7 + 8 = 15 apples", 15),
    ("We get 1,204 coins.", 1204),
    ("I cannot solve this.", None),
    ("", None),
])
def test_parse_answer(text: str, want: int | None) -> None:
    assert WordProblemsTask(model_dir=".").parse_answer(text) == want


def test_reward_checks_only_the_final_answer() -> None:
    task = WordProblemsTask(model_dir=".")
    p = WordProblem("Mia has 2 coins.", 0, 9, "", ())
    assert task.reward(p, "2 + 7 = 9. The answer is 9.") == 1.0
    assert task.reward(p, "The answer is 9, no wait, the answer is 8.") == 0.0


def test_chat_prompt_format() -> None:
    text = chat_prompt("Hi?")
    assert text.startswith("<|im_start|>system\n") and text.endswith(
        "<|im_end|>\n<|im_start|>assistant\n")
    assert "<|im_start|>user\nHi?<|im_end|>" in text


def test_unknown_task_named() -> None:
    assert TASKS == ("addchain", "wordproblems")
    assert make_task("addchain").name == "addchain"
    with pytest.raises(ValueError, match="unknown task 'chess'"):
        make_task("chess")


def test_prompts_deterministic_and_tokenized(real_model) -> None:
    task = make_task("wordproblems", real_model)
    a, b = task.make_prompts(8, seed=4), task.make_prompts(8, seed=4)
    assert a == b and a != task.make_prompts(8, seed=5)
    for p in a:
        assert p.input_ids[0] == task.bos_id and p.input_ids[-1] == 198  # "\n"
        assert task.decode(p.input_ids, skip_special=False) == p.text
        assert len({p.key for p in a}) == len(a)
    ids = task.encode("The answer is 12.") + [task.eos_id, 5, 6]
    assert task.reward(WordProblem("", 1, 12, "", ()), ids) == 1.0


@pytest.fixture(scope="module")
def real_model():
    from bubblespec.models import real_model_dir

    return real_model_dir()


def test_reference_solutions_are_right_and_walk_every_operation() -> None:
    """What the warm-start fine-tune learns from: every line's arithmetic is right (checked
    by re-doing it), the lines follow the story's operations, the answer is the marked one,
    and the length grows with the number of operations."""
    task = make_task("wordproblems")
    rng = random.Random(3)
    by_steps: dict[int, list[int]] = {}
    for p in task.make_prompts(300, seed="ref"):
        text = reference_solution(p, rng)
        assert task.reward(p, text) == 1.0 and text.endswith(f"The answer is {p.answer}.")
        sums = re.findall(r"(\d+) ([+-]) (\d+) = (\d+)", text)
        assert len(sums) == p.steps == len(p.events)
        value = p.start
        for (a, op, x, b), (_, change) in zip(sums, p.events):
            assert int(a) == value and (1 if op == "+" else -1) * int(x) == change
            value = int(a) + change
            assert int(b) == value
        by_steps.setdefault(p.steps, []).append(len(task.encode(text)))
    med = {k: sorted(v)[len(v) // 2] for k, v in by_steps.items()}
    ks = sorted(med)
    assert all(med[a] < med[b] for a, b in itertools.pairwise(ks)), med
    assert max(max(v) for v in by_steps.values()) + 1 < task.max_new_tokens


def test_reference_solutions_vary_in_wording() -> None:
    task = make_task("wordproblems")
    (p,) = task.make_prompts(1, seed=4)
    texts = {reference_solution(p, random.Random(i)) for i in range(20)}
    assert len(texts) >= 10  # a policy fine-tuned on them samples varied text


def test_make_prompts_keeps_the_stories_of_make_story() -> None:
    """The events a solution needs ride along without changing any drawn story."""
    task = make_task("wordproblems")
    rng = random.Random("wordproblems-7")
    for p in task.make_prompts(20, seed=7):
        steps = sample_steps(rng)
        assert steps == p.steps
        assert make_story(rng, steps) == (p.story, p.answer)
