"""The "addchain" task: repeated addition mod 100, written out step by step.

A prompt ``a + d x k =`` asks for ``a + k*d (mod 100)``; ``a`` and every running value
are written as two digit tokens, ``d`` is one digit, ``k`` one number token. The response
copies the start, then writes one step per addition, each step as ``<steps left> <tens>
<units> ;``, then ``= <tens> <units>``::

    prompt:   1 2 + 7 x 3 =
    response: 3 1 2 ; 2 1 9 ; 1 2 6 ; 0 3 3 ; = 3 3 <eos>

Why this task (docs/design.md section 8): every step is a local computation a ~1M-parameter Llama
learns in minutes on a CPU (decrement a number token, add a digit with carry), the amount of
work ``k`` is drawn from a clipped log-normal, so response lengths are long-tailed (4 tokens
per step, p99 several times the median), and the reward is a pure-Python check of the final
answer. The training data contains occasional slips (a value off by one, a skipped or
repeated countdown), so the supervised model reproduces them at temperature 1.0: sibling
samples agree on most tokens but not all, long responses fail more often than short ones, and
GRPO raises the reward by sharpening the policy. Only the stdlib and ``tokenizers`` are
needed; no torch.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

MOD = 100
"""Running values are reduced mod 100 (written as two digit tokens)."""
MAX_STEPS = 145
"""Largest ``k``: responses stay under 600 tokens (4 per step, k + 1 steps, ``= t u <eos>``)."""
MAX_NUMBER = 199
"""Number tokens "0".."199": digits of values, and countdown numbers up to MAX_STEPS."""
MAX_NEW_TOKENS = 600
"""A generation budget that no well-formed response exceeds."""

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
SYMBOLS = ("+", "x", "=", ";")


def build_vocab() -> dict[str, int]:
    """The fixed WordLevel vocabulary: 4 specials, 4 symbols, numbers 0..MAX_NUMBER."""
    words = list(SPECIALS) + list(SYMBOLS) + [str(i) for i in range(MAX_NUMBER + 1)]
    return {w: i for i, w in enumerate(words)}


VOCAB = build_vocab()
PAD_ID, BOS_ID, EOS_ID, UNK_ID = (VOCAB[s] for s in SPECIALS)
DIGITS = frozenset(str(i) for i in range(10))


def _digits(value: int) -> str:
    """``value`` in [0, 100) as two digit tokens: 7 -> "0 7"."""
    return f"{value // 10} {value % 10}"


def build_tokenizer():  # -> tokenizers.Tokenizer (imported lazily)
    """A HF ``tokenizers`` WordLevel tokenizer: whitespace split, ``<bos>`` prepended.

    Decoding joins tokens with single spaces, so ``decode(encode(t)) == t`` for normalised
    text (tokens separated by one space).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    tok = Tokenizer(models.WordLevel(vocab=dict(VOCAB), unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, BOS_ID)]
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with " "
    tok.add_special_tokens(list(SPECIALS))
    return tok


def hf_tokenizer_files() -> dict[str, str]:
    """Contents of tokenizer.json, tokenizer_config.json and special_tokens_map.json."""
    specials = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1024,
        "add_bos_token": False,  # the post-processor already prepends <bos>
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        **specials,
    }
    return {
        "tokenizer.json": build_tokenizer().to_str(pretty=True),
        "tokenizer_config.json": json.dumps(config, indent=2),
        "special_tokens_map.json": json.dumps(specials, indent=2),
    }


@dataclass(frozen=True)
class Prompt:
    """One problem: ``start + step x count =``, as text and as token ids (with ``<bos>``).

    ``start`` and ``answer`` are integers in [0, 100), written as two digit tokens."""

    start: int
    step: int
    count: int
    text: str
    input_ids: tuple[int, ...]
    answer: int

    @property
    def key(self) -> str:
        """A stable identifier of the problem (the prompt text)."""
        return self.text


@dataclass(frozen=True)
class Slips:
    """Per-step error rates injected into training responses (what GRPO later removes)."""

    value: float = 0.03
    """A running value off by one; later steps continue from the wrong value."""
    skip: float = 0.005
    """The countdown skips a number (one step too few)."""
    repeat: float = 0.005
    """The countdown repeats a number (one step too many)."""


def sample_count(rng: random.Random, median: float = 12.0, sigma: float = 0.9) -> int:
    """Draw ``k`` from a log-normal (median ``median``) clipped to [1, MAX_STEPS]."""
    k = round(median * math.exp(sigma * rng.gauss(0.0, 1.0)))
    return max(1, min(MAX_STEPS, k))


@dataclass
class AddChainTask:
    """Prompt generator, reference solver, verifier and tokenizer of the addchain task."""

    name: str = "addchain"
    max_new_tokens: int = MAX_NEW_TOKENS
    _tokenizer: object = field(default=None, repr=False)

    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    pad_id: int = PAD_ID

    @property
    def tokenizer(self):  # -> tokenizers.Tokenizer
        """The task's ``tokenizers.Tokenizer`` (same vocabulary as the shipped tokenizer.json)."""
        if self._tokenizer is None:
            self._tokenizer = build_tokenizer()
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """Number of token ids."""
        return len(VOCAB)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Token ids of ``text`` (whitespace-separated words; unknown words -> ``<unk>``)."""
        ids = [VOCAB.get(w, UNK_ID) for w in text.split()]
        return [BOS_ID, *ids] if add_bos else ids

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Text of ``ids``, tokens joined by single spaces."""
        words = self.tokenizer.id_to_token
        out = [words(int(i)) for i in ids]
        if skip_special:
            out = [w for w in out if w not in SPECIALS]
        return " ".join(w if w is not None else UNK for w in out)

    # -- problems -------------------------------------------------------------------------

    def make_prompt(self, start: int, step: int, count: int) -> Prompt:
        """The prompt for ``start + step x count`` (0<=start<100, 1<=step<=9, 1<=count<=145)."""
        if not (0 <= start < MOD and 1 <= step <= 9 and 1 <= count <= MAX_STEPS):
            raise ValueError(f"bad problem: start={start} step={step} count={count}")
        text = f"{_digits(start)} + {step} x {count} ="
        return Prompt(start, step, count, text, tuple(self.encode(text, add_bos=True)),
                      (start + step * count) % MOD)

    def make_prompts(self, n: int, seed: int) -> list[Prompt]:
        """``n`` problems drawn deterministically from ``seed`` (long-tailed ``count``)."""
        rng = random.Random(f"addchain-prompts-{seed}")
        return [self._draw(rng) for _ in range(n)]

    def _draw(self, rng: random.Random, uniform_count: bool = False) -> Prompt:
        start, step = rng.randrange(MOD), rng.randint(1, 9)
        count = rng.randint(1, MAX_STEPS) if uniform_count else sample_count(rng)
        return self.make_prompt(start, step, count)

    def solve(self, prompt: Prompt, rng: random.Random | None = None,
              slips: Slips | None = None) -> str:
        """The response text: correct, or with random slips when ``rng`` and ``slips`` given."""
        noisy = slips is not None and rng is not None
        value, left = prompt.start, prompt.count
        words = [str(left), _digits(value), ";"]
        while left > 0 and len(words) < 4 * (MAX_STEPS + 2):
            if noisy and left > 1 and rng.random() < slips.skip:
                left -= 2
            elif not (noisy and rng.random() < slips.repeat):
                left -= 1
            value = (value + prompt.step) % MOD
            if noisy and rng.random() < slips.value:
                value = (value + rng.choice((-1, 1))) % MOD
            words += [str(left), _digits(value), ";"]
        words += ["=", _digits(value)]
        return " ".join(words)

    def training_example(self, rng: random.Random, slips: Slips = Slips(),
                         uniform_count: bool = False) -> tuple[list[int], int]:
        """(prompt + response + ``<eos>`` ids, prompt length) of one noisy training example."""
        prompt = self._draw(rng, uniform_count)
        resp = self.encode(self.solve(prompt, rng, slips)) + [EOS_ID]
        return list(prompt.input_ids) + resp, len(prompt.input_ids)

    # -- verification ---------------------------------------------------------------------

    def parse_answer(self, response: str | Sequence[int]) -> int | None:
        """The answer of a well-formed response (``... = T U``, optional ``<eos>``), else None.

        Token ids are cut at the first ``<eos>``; text is split on whitespace. The response
        must end in ``= T U`` (two digit tokens) with exactly one ``=``; anything else
        (truncated, empty, several answers, special or unknown words) is malformed. The steps
        before ``=`` are not checked: like most verifiable RL rewards, only the answer counts.
        """
        if isinstance(response, str):
            words = response.split()
            if words and words[-1] == EOS:
                words = words[:-1]
        else:
            ids = [int(i) for i in response]
            if EOS_ID in ids:
                ids = ids[: ids.index(EOS_ID)]
            words = [self.tokenizer.id_to_token(i) or UNK for i in ids]
        if len(words) < 3 or words[-3] != "=" or words.count("=") != 1:
            return None
        if any(w not in DIGITS for w in words[-2:]) or any(w in SPECIALS for w in words):
            return None
        return 10 * int(words[-2]) + int(words[-1])

    def reward(self, prompt: Prompt, response: str | Sequence[int]) -> float:
        """1.0 if the response is well-formed and its final answer is right, else 0.0."""
        return 1.0 if self.parse_answer(response) == prompt.answer else 0.0

    def step_accuracy(self, prompt: Prompt, response: str | Sequence[int]) -> float:
        """Fraction of the ``k + 1`` reference steps written correctly (a diagnostic)."""
        text = response if isinstance(response, str) else self.decode(response)
        ref = self.solve(prompt).split()
        got = text.split()
        ok = sum(1 for i in range(0, len(ref) - 3, 4) if got[i:i + 4] == ref[i:i + 4])
        return ok / (prompt.count + 1)
