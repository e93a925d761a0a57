"""Turning a rollout request into checked token ids, prompt keys and seeds.

Everything the trainer can get wrong is caught here with a 4xx naming the field (the ranks
check again, but a trainer should hear about `prompts[3].input_ids[7]`, not about a rank's
shard). Text prompts are tokenized with the configured tokenizer (a `tokenizer.json`, or a
model directory holding one) or the embedded task's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bubblespec.gateway.config import GatewayConfig
from bubblespec.gateway.seeds import assign_keys
from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.gateway import PromptIn, RolloutRequest


class PromptTokenizer:
    """Text -> token ids (with BOS) and back, and the vocabulary size ids are checked against."""

    def __init__(self, spec: str = "") -> None:
        self.spec = spec
        self._tok = None
        self._task = None
        self._vocab: int | None = None

    def _load(self) -> None:
        if self._vocab is not None:
            return
        if self.spec:
            from tokenizers import Tokenizer

            path = Path(self.spec)
            if path.is_dir():
                path = path / "tokenizer.json"
            self._tok = Tokenizer.from_file(str(path))
            self._vocab = self._tok.get_vocab_size(with_added_tokens=True)
        else:
            from bubblespec.tasks import default_task

            self._task = default_task()
            self._vocab = self._task.vocab_size

    @property
    def vocab_size(self) -> int:
        self._load()
        assert self._vocab is not None
        return self._vocab

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; `add_special_tokens=False` for text that writes its own
        (a rendered chat template)."""
        self._load()
        if self._tok is not None:
            return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)
        assert self._task is not None
        return self._task.encode(text, add_bos=add_special_tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of token ids (the SGLang-compatible routes answer with it)."""
        self._load()
        if self._tok is not None:
            return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))
        assert self._task is not None
        return self._task.decode(ids, skip_special=skip_special_tokens)


@dataclass
class Prepared:
    """A checked rollout request."""

    prompts: list[list[int]]
    keys: list[str]
    seeds: list[list[int]] | None
    next_batches: list[list[list[int]]]
    """The future steps' prompts handed ahead, the next step's first."""
    next_seeds: list[list[list[int]]] | None
    """Their seeds, per batch (None: derived)."""

    @property
    def hands_ahead(self) -> bool:
        """Some future step's prompts were handed ahead."""
        return any(self.next_batches)

    @property
    def next_prompts(self) -> list[list[int]]:
        """The next step's prompts (empty when none were handed ahead)."""
        return self.next_batches[0] if self.next_batches else []


class Preparer:
    """Checks requests against the config's limits and tokenizes text prompts."""

    def __init__(self, config: GatewayConfig, tokenizer: PromptTokenizer | None = None) -> None:
        self.config = config
        self.tokenizer = tokenizer or PromptTokenizer(config.tokenizer)

    def vocab_limit(self) -> int | None:
        v = self.config.vocab_size
        if v < 0:
            return None
        return v or self.tokenizer.vocab_size

    def _ids(self, prompts: Sequence[PromptIn], name: str, vocab: int | None) -> list[list[int]]:
        c = self.config
        if len(prompts) > c.max_prompts:
            raise ApiError(422, f"{len(prompts)} prompts; at most {c.max_prompts}", name)
        out = []
        for i, p in enumerate(prompts):
            if p.input_ids is not None:
                ids, what = list(p.input_ids), "input_ids"
            else:
                assert p.text is not None
                if len(p.text) > 16 * c.max_prompt_tokens:
                    raise ApiError(422, "text too long", f"{name}[{i}].text")
                try:
                    ids, what = self.tokenizer.encode(p.text), "text"
                except Exception as e:  # noqa: BLE001 (a broken tokenizer must not be a 500)
                    raise ApiError(422, f"cannot tokenize: {e}", f"{name}[{i}].text") from None
            if len(ids) > c.max_prompt_tokens:
                raise ApiError(422, f"{len(ids)} tokens; at most {c.max_prompt_tokens}",
                               f"{name}[{i}].{what}")
            if vocab is not None:
                for j, t in enumerate(ids):
                    if t >= vocab:
                        raise ApiError(422, f"token id {t} outside [0, {vocab})",
                                           f"{name}[{i}].input_ids[{j}]")
            out.append(ids)
        return out

    @staticmethod
    def _seeds(seeds: list[list[int]] | None, num_prompts: int, n: int, name: str
               ) -> list[list[int]] | None:
        if seeds is None:
            return None
        if len(seeds) != num_prompts:
            raise ApiError(422, f"needs one list per prompt ({num_prompts}), got "
                                    f"{len(seeds)}", name)
        for i, s in enumerate(seeds):
            if len(s) != n:
                raise ApiError(422, f"needs one seed per sample ({n}), got {len(s)}",
                               f"{name}[{i}]")
        return [list(s) for s in seeds]

    def prepare(self, req: RolloutRequest) -> Prepared:
        """Check `req` (ApiError 422 naming the field) and tokenize its prompts."""
        c = self.config
        sp = req.sampling_params
        if req.n > c.max_n:
            raise ApiError(422, f"at most {c.max_n} samples per prompt", "n")
        if sp.max_new_tokens > c.max_new_tokens:
            raise ApiError(422, f"at most {c.max_new_tokens}", "sampling_params.max_new_tokens")
        vocab = self.vocab_limit()
        for j, t in enumerate(sp.stop_token_ids):
            if t < 0 or (vocab is not None and t >= vocab):
                raise ApiError(422, f"token id {t} outside [0, {vocab})",
                                   f"sampling_params.stop_token_ids[{j}]")
        for j, t in enumerate(sp.allowed_token_ids):
            if vocab is not None and t >= vocab:
                raise ApiError(422, f"token id {t} outside [0, {vocab})",
                                   f"sampling_params.allowed_token_ids[{j}]")
        for t, _ in sp.logit_bias:
            if vocab is not None and t >= vocab:
                raise ApiError(422, f"token id {t} outside [0, {vocab})",
                                   "sampling_params.logit_bias")
        prompts = self._ids(req.prompts, "prompts", vocab)
        seeds = self._seeds(req.seeds, len(prompts), req.n, "seeds")
        given = req.next_batches()
        if len(given) > c.max_lookahead_steps:
            raise ApiError(422, f"prompts for {len(given)} future steps; at most "
                                f"{c.max_lookahead_steps} (max_lookahead_steps)", "next_prompts")
        one = len(given) == 1 and req.next_prompts is not None and not (
            req.next_prompts and isinstance(req.next_prompts[0], list))
        name = (lambda j: "next_prompts") if one else (lambda j: f"next_prompts[{j}]")
        batches = [self._ids(b, name(j), vocab) for j, b in enumerate(given)]
        if req.next_seeds is not None and req.next_prompts is None:
            raise ApiError(422, "next_seeds needs next_prompts", "next_seeds")
        seed_batches = req.next_seed_batches()
        next_seeds = None
        if seed_batches is not None:
            if len(seed_batches) != len(batches):
                raise ApiError(422, f"seeds for {len(seed_batches)} future steps, prompts for "
                                    f"{len(batches)}", "next_seeds")
            sname = (lambda j: "next_seeds") if one else (lambda j: f"next_seeds[{j}]")
            next_seeds = [self._seeds(s, len(b), req.n, sname(j))
                          for j, (s, b) in enumerate(zip(seed_batches, batches))]
        return Prepared(prompts, assign_keys(prompts), seeds, batches, next_seeds)
