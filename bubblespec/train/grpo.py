"""GRPO on a HF causal LM in torch: group-normalised advantages, PPO-clipped ratio
against the rollout's own log-probs, one optimiser step per rollout batch.

The loss is aggregated per sequence (`seq-mean`: each response's token mean, then the mean
over responses, so every response weighs the same whatever its length) or per token
(`token-mean`: the mean over every token of the batch, as DAPO and verl's `token-mean` do,
so that a long response is not worth less per token than a short one; the sequence mean
rewards shortening what is penalised).

The same forward gives the policy's per-token entropy at the sampled positions (no
gradient), reported per position class and at the positions where responses left their
pre-generated drafts (`positions.entropy_by_position`).

The ratio is taken against the log-probs the rollout service returned for the emitted
tokens; with exact (on-policy) rollouts the first step's ratio is 1 up to float error,
which `Trainer.step` reports as `max_abs_logprob_gap` (a live exactness check).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from bubblespec.train.files import copy_tokenizer
from bubblespec.train.positions import entropy_by_position

LOSS_AGGS = ("seq-mean", "token-mean")
TRAINER_STATE = "trainer_state.pt"
"""The file `Trainer.save_state` writes beside a checkpoint's weights."""


@dataclass
class Rollout:
    """One prompt's group of samples, as the rollout service returned them."""

    prompt_ids: list[int]
    outputs: list[list[int]]
    logprobs: list[list[float]]
    rewards: list[float]
    first_divergence: list[int | None] = field(default_factory=list)
    """Per sample: where it left its aligned pre-generated draft at a flip (None: it did not,
    or its draft ran out there); only the trainer's entropy report reads it."""


def group_advantages(rewards: list[float], eps: float = 1e-6) -> list[float]:
    """(r - mean) / (std + eps) within one prompt's group (all zero if rewards are equal)."""
    n = len(rewards)
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
    return [(r - mean) / (std + eps) if std > 0 else 0.0 for r in rewards]


class Trainer:
    """Holds the policy and its optimiser; `step` takes one GRPO update."""

    def __init__(self, model_dir: str, lr: float = 3e-4, clip: float = 0.2,
                 max_grad_norm: float = 1.0, seed: int = 0, threads: int | None = None,
                 loss_agg: str = "seq-mean") -> None:
        from transformers import AutoModelForCausalLM

        if loss_agg not in LOSS_AGGS:
            raise ValueError(f"loss_agg must be one of {LOSS_AGGS}, not {loss_agg!r}")
        self.loss_agg = loss_agg
        self.model_dir = model_dir

        torch.manual_seed(seed)
        if threads:
            torch.set_num_threads(threads)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        if (self.model.base_model is self.model
                or getattr(self.model.config, "final_logit_softcapping", None)):
            raise ValueError(f"{type(self.model).__name__}: the trainer needs a causal LM "
                             "whose head is a plain projection of its decoder's output")
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        self.clip = clip
        self.max_grad_norm = max_grad_norm
        self.pad_id = int(self.model.config.pad_token_id or 0)

    def _token_logprobs(self, seqs: list[list[int]], starts: list[int]
                        ) -> tuple[list[torch.Tensor], list[list[float]]]:
        """Log-probs of tokens seqs[i][starts[i]:] under the current policy, and the
        policy's entropy (nats, no gradient) at each of those positions. The output head
        runs on the response positions only: the prompt's and the padding's logits (a
        positions x vocabulary tensor each, with its log-softmax and gradient) are never
        formed."""
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        hidden = self._hidden(ids, mask)
        spans = [(starts[i] - 1, len(s) - 1) for i, s in enumerate(seqs)]
        rows = torch.cat([hidden[i, a:b] for i, (a, b) in enumerate(spans)])
        targets = torch.cat([ids[i, a + 1 : b + 1] for i, (a, b) in enumerate(spans)])
        logp = torch.log_softmax(self.model.get_output_embeddings()(rows).float(), dim=-1)
        tok = torch.gather(logp, 1, targets.unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            ent = -(logp.exp() * logp).sum(-1)
        sizes = [b - a for a, b in spans]
        return (list(torch.split(tok, sizes)),
                [e.tolist() for e in torch.split(ent, sizes)])

    def _hidden(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The last hidden state before the output head (the decoder's, final norm
        included), so that the head can be applied to chosen positions only."""
        return self.model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state

    def step(self, batch: list[Rollout], micro_batch: int = 2) -> dict[str, Any]:
        """One optimiser step over all samples of `batch` (the GRPO loss aggregated by
        `loss_agg`), its gradient accumulated over chunks of `micro_batch` samples: the
        logits, log-softmax and their gradients of a chunk hold its response tokens x
        vocabulary floats each (about 0.16 GB per tensor for 2 responses of 400 tokens of a
        49k-token vocabulary), and the trainer shares the machine with the ranks' engines;
        statistics include the entropy of the samples trained on."""
        items, flips = [], []
        for r in batch:
            divs = r.first_divergence or [None] * len(r.outputs)
            for out, lp, adv, div in zip(r.outputs, r.logprobs, group_advantages(r.rewards),
                                         divs):
                if out and adv != 0.0:
                    items.append((r.prompt_ids + out, len(r.prompt_ids), lp, adv))
                    flips.append(div)
        stats: dict[str, Any] = {"samples": float(len(items)), "loss": 0.0, "max_abs_logprob_gap": 0.0,
                 "mean_reward": sum(sum(r.rewards) for r in batch)
                 / max(1, sum(len(r.rewards) for r in batch))}
        if not items:
            return stats
        self.opt.zero_grad()
        total = 0.0
        tokens = sum(len(c[0]) - c[1] for c in items)
        entropies: list[list[float]] = []
        for i in range(0, len(items), micro_batch):
            chunk = items[i : i + micro_batch]
            new, ent = self._token_logprobs([c[0] for c in chunk], [c[1] for c in chunk])
            entropies += ent
            loss = torch.zeros(())
            for (_, _, old, adv), lp in zip(chunk, new):
                old_t = torch.tensor(old[: lp.shape[0]], dtype=torch.float32)
                gap = float((lp.detach() - old_t).abs().max())
                stats["max_abs_logprob_gap"] = max(stats["max_abs_logprob_gap"], gap)
                ratio = torch.exp(lp - old_t)
                clipped = torch.clamp(ratio, 1 - self.clip, 1 + self.clip)
                per_tok = -torch.minimum(ratio * adv, clipped * adv)
                loss = loss + (per_tok.mean() if self.loss_agg == "seq-mean"
                               else per_tok.sum())
            loss = loss / (len(items) if self.loss_agg == "seq-mean" else tokens)
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.opt.step()
        stats["loss"] = total
        stats["entropy"] = entropy_by_position(entropies, flips)
        return stats

    def save_state(self, out_dir: str) -> str:
        """Write what `load_state` needs beyond the saved weights to go on exactly where
        this trainer stands: the optimiser's moments and step counts, and the random
        state (`TRAINER_STATE` in `out_dir`, beside the weights of `save`)."""
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, TRAINER_STATE)
        torch.save({"optimizer": self.opt.state_dict(), "rng": torch.get_rng_state()},
                   path + ".tmp")
        os.replace(path + ".tmp", path)  # never a half-written state under the name
        return path

    def load_state(self, model_dir: str) -> None:
        """Continue from a checkpoint of `save` + `save_state` (`model_dir`): its weights
        into this trainer's policy (in place, so the optimiser keeps its parameters), its
        optimiser state and random state. FileNotFoundError naming the file when the
        directory holds no trainer state."""
        from transformers import AutoModelForCausalLM

        path = os.path.join(model_dir, TRAINER_STATE)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no trainer state (a checkpoint of save_state)")
        state = torch.load(path, weights_only=True)
        saved = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        with torch.no_grad():
            self.model.load_state_dict(saved.state_dict())
        self.opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])

    def named_tensors(self, names: set[str]) -> list[tuple[str, torch.Tensor]]:
        """The policy's tensors the ranks' model has (by checkpoint name; a tied head the
        checkpoint leaves out is left out), detached, for a process-group push."""
        return [(n, t.detach()) for n, t in self.model.state_dict().items() if n in names]

    def save(self, out_dir: str) -> str:
        """Write the policy as safetensors (what `POST /v1/weights` reloads), with the base
        model's tokenizer files beside them (a model directory of its own: `train/files.py`)."""
        os.makedirs(out_dir, exist_ok=True)
        self.model.save_pretrained(out_dir, safe_serialization=True)
        copy_tokenizer(self.model_dir, out_dir)
        return out_dir
