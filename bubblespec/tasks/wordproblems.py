"""The "wordproblems" task: multi-step arithmetic word problems in English, for a chat model.

A problem tells a short story about one person and one kind of object, one sentence per
step (``Mia has 7 marbles. She finds 4 more marbles. Then she gives 3 marbles to her
friend. ...``) and asks how many are left; the user turn asks for step-by-step reasoning
ending in ``The answer is N.``. The number of steps is drawn from a clipped log-normal
(median 3, up to 12), so chain-of-thought responses are long-tailed, as in real RL
rollouts. Every running value stays in [0, 99].

Why this task (docs/design.md, "The real model"): it is the second workload, for
SmolLM2-135M-Instruct (``bubblespec.models.smollm2``), whose responses are natural text:
per-token entropy, repetition and sibling similarity are those of chain-of-thought, not of the
addchain countdown. The prompt is the model's own chat format (ChatML, with the default system
turn its template inserts), tokenized with the model directory's ``tokenizer.json``.

Reward: 1.0 when the final answer is right, else 0.0. The final answer is the number after
the last ``answer is`` in the response, or, when the model did not use that phrase, the last
number it wrote (a small instruct model often ignores the format; the reward still has to
vary within a group for GRPO to learn). Only the stdlib and ``tokenizers`` are needed.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

MAX_STEPS = 12
"""Most operations in one problem (after the starting amount)."""
MAX_VALUE = 99
MAX_NEW_TOKENS = 384
"""The generation budget: enough for a 12-step solution in this model's style."""
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
"""The system turn the model's chat template inserts when the conversation has none."""
INSTRUCTION = "Solve it step by step, then finish with \"The answer is N.\""

NAMES = (("Mia", "She"), ("Tom", "He"), ("Ava", "She"), ("Leo", "He"), ("Zoe", "She"),
         ("Sam", "He"), ("Ivy", "She"), ("Max", "He"))
THINGS = ("marbles", "apples", "stickers", "coins", "books", "shells", "pencils", "cookies")
GAINS = ("{p} finds {x} more {t}.", "{p} buys {x} more {t}.",
         "A friend gives {o} {x} {t}.", "{p} wins {x} {t} in a game.")
LOSSES = ("{p} gives {x} {t} to a friend.", "{p} loses {x} {t}.",
          "{p} sells {x} {t}.", "{p} puts {x} {t} in a box and leaves them there.")
_NUMBER = re.compile(r"-?\d+")
_ANSWER = re.compile(r"answer is\D{0,12}?(-?\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class WordProblem:
    """One problem: the story, its chat-formatted token ids and the checked answer."""

    story: str
    steps: int
    answer: int
    text: str
    """The full prompt (chat template applied, assistant turn opened)."""
    input_ids: tuple[int, ...]
    start: int = 0
    """The starting amount (the first sentence's number)."""
    events: tuple[tuple[str, int], ...] = ()
    """Each operation's sentence and signed change, in story order (what a reference
    solution walks through)."""

    @property
    def key(self) -> str:
        """A stable identifier of the problem (the story)."""
        return self.story


def chat_prompt(user: str) -> str:
    """The model's chat template for one user turn plus the opened assistant turn."""
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            "<|im_start|>assistant\n")


def sample_steps(rng: random.Random, median: float = 3.0, sigma: float = 0.7) -> int:
    """Number of operations: log-normal with median ``median``, clipped to [1, MAX_STEPS]."""
    return max(1, min(MAX_STEPS, round(median * math.exp(sigma * rng.gauss(0.0, 1.0)))))


def make_story(rng: random.Random, steps: int) -> tuple[str, int]:
    """(story text, answer) of a problem with ``steps`` operations after the start."""
    story, answer, _, _ = draw_story(rng, steps)
    return story, answer


def draw_story(rng: random.Random, steps: int
               ) -> tuple[str, int, int, tuple[tuple[str, int], ...]]:
    """(story text, answer, starting amount, (sentence, signed change) per operation)."""
    name, pron = rng.choice(NAMES)
    thing = rng.choice(THINGS)
    value = rng.randint(2, 20)
    sentences = [f"{name} has {value} {thing}."]
    start, events = value, []
    for i in range(steps):
        gain = value == 0 or (value + 1 <= MAX_VALUE and rng.random() < 0.55)
        room = MAX_VALUE - value if gain else value
        x = rng.randint(1, max(1, min(15, room)))
        subject = pron if i % 2 == 0 else name
        sentence = rng.choice(GAINS if gain else LOSSES).format(p=subject, x=x, t=thing,
                                                               o=name)
        if i > 0 and rng.random() < 0.5:
            if sentence.split()[0] in ("He", "She", "A"):
                sentence = sentence[0].lower() + sentence[1:]
            sentence = "Then " + sentence
        sentences.append(sentence)
        events.append((sentence, x if gain else -x))
        value += x if gain else -x
    sentences.append(f"How many {thing} does {name} have now?")
    return " ".join(sentences), value, start, tuple(events)


_OPENINGS = ("{N} starts with {v} {t}.", "At the start, {n} has {v} {t}.",
             "First, {n} has {v} {t}.", "{N} begins with {v} {t}.")
_STEPS = ("{e} {a} {op} {x} = {b}.", "{e} So {n} has {a} {op} {x} = {b} {t}.",
          "{e} That makes {a} {op} {x} = {b}.", "{e} Now {a} {op} {x} = {b} {t}.")
_CLOSINGS = ("{N} has {v} {t} now.", "So {n} ends with {v} {t}.", "In the end there are {v} {t}.")


def reference_solution(problem: WordProblem, rng: random.Random) -> str:
    """A correct step-by-step solution in the format the prompt asks for: one line per
    operation (its sentence, then the arithmetic), a closing line, and ``The answer is N.``.
    The phrasing of each line is drawn from ``rng``, so a policy fine-tuned on these
    solutions writes varied text (natural per-token entropy), not one template; its length
    grows with the number of operations."""
    words = problem.story.split()
    name, thing = words[0], words[3].rstrip(".")
    fill = {"N": name, "n": name, "t": thing}
    lines = [rng.choice(_OPENINGS).format(v=problem.start, **fill)]
    numbered = rng.random() < 0.3  # "Step i: ..." on every line, or on none
    value = problem.start
    for i, (sentence, change) in enumerate(problem.events, 1):
        event = sentence[5].upper() + sentence[6:] if sentence.startswith("Then ") else sentence
        event = event[0].upper() + event[1:]
        after = value + change
        line = rng.choice(_STEPS).format(e=event, a=value, op="+" if change > 0 else "-",
                                         x=abs(change), b=after, **fill)
        lines.append(f"Step {i}: {line}" if numbered else line)
        value = after
    lines.append(rng.choice(_CLOSINGS).format(v=value, **fill))
    lines.append(f"The answer is {value}.")
    return "\n".join(lines)


@dataclass
class WordProblemsTask:
    """Prompt generator, verifier and tokenizer helpers of the wordproblems task."""

    model_dir: Path
    """The model directory whose ``tokenizer.json`` encodes the prompts."""
    name: str = "wordproblems"
    max_new_tokens: int = MAX_NEW_TOKENS
    bos_id: int = 1
    eos_id: int = 2
    pad_id: int = 2
    _tokenizer: object = field(default=None, repr=False)

    @property
    def tokenizer(self):  # -> tokenizers.Tokenizer (imported lazily)
        """The model's byte-level BPE tokenizer (``tokenizer.json``)."""
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(str(Path(self.model_dir) / "tokenizer.json"))
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """Number of token ids (added tokens included)."""
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Token ids of ``text`` (chat markers are special tokens; ``add_bos`` is ignored:
        the chat template carries its own ``<|im_start|>``)."""
        del add_bos
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Text of ``ids``."""
        return str(self.tokenizer.decode([int(i) for i in ids],
                                         skip_special_tokens=skip_special))

    def make_prompt(self, story: str, steps: int, answer: int, start: int = 0,
                    events: tuple[tuple[str, int], ...] = ()) -> WordProblem:
        """The chat prompt for ``story`` (its ``answer`` is what the reward checks)."""
        text = chat_prompt(f"{story} {INSTRUCTION}")
        return WordProblem(story, steps, answer, text, tuple(self.encode(text)), start,
                           events)

    def make_prompts(self, n: int, seed: int | str) -> list[WordProblem]:
        """``n`` problems drawn deterministically from ``seed`` (long-tailed step counts)."""
        rng = random.Random(f"wordproblems-{seed}")
        out = []
        for _ in range(n):
            steps = sample_steps(rng)
            story, answer, start, events = draw_story(rng, steps)
            out.append(self.make_prompt(story, steps, answer, start, events))
        return out

    def parse_answer(self, response: str | Sequence[int]) -> int | None:
        """The final answer of a response (text, or token ids cut at the first
        ``<|im_end|>``): the number after the last "answer is", else the last number;
        None when the response has no number."""
        if not isinstance(response, str):
            ids = [int(i) for i in response]
            if self.eos_id in ids:
                ids = ids[: ids.index(self.eos_id)]
            response = self.decode(ids)
        text = response.replace(",", "")
        marked = _ANSWER.findall(text)
        if marked:
            return int(marked[-1])
        numbers = _NUMBER.findall(text)
        return int(numbers[-1]) if numbers else None

    def reward(self, prompt: WordProblem, response: str | Sequence[int]) -> float:
        """1.0 if the response's final answer equals the problem's, else 0.0."""
        return 1.0 if self.parse_answer(response) == prompt.answer else 0.0
