"""The warm-started real policy: a short supervised fine-tune of SmolLM2-135M-Instruct on the
wordproblems task's own reference solutions (`make real-policy`, cached).

Why: the instruct model as released ignores the answer format and runs every response to the
generation budget, so a rollout step has no long tail and a GRPO group rarely carries a
reward signal. An RL run starts from a policy that has been through supervised warm-up: it
ends its answers, and its lengths follow the difficulty of the problem. The reference
solutions (``tasks.wordproblems.reference_solution``) walk through every operation in one of
several phrasings and end with ``The answer is N.`` and ``<|im_end|>``, so the fine-tuned
policy's responses grow with the number of operations and still sample varied text.

The loss is the mean negative log-likelihood of the response tokens (the prompt is context
only). Examples are fresh problems drawn from their own seed stream (``sft-<seed>``), never
from the integer seeds the benchmarks and the training loop draw with. The result is written
to a temporary directory and renamed into the cache next to the base model, with a stamp
(``sft.json``) recording the configuration, the loss curve and the time it took; a finished
build is reused, and a change of configuration or of the base model rebuilds it.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bubblespec.models.smollm2 import cache_root, publish
from bubblespec.models.smollm2 import model_dir as base_model_dir
from bubblespec.tasks.wordproblems import WordProblemsTask, reference_solution
from bubblespec.train.files import copy_tokenizer

POLICY_NAME = "smollm2-135m-wordproblems-sft"


@dataclass(frozen=True)
class SftConfig:
    """The fine-tune (the flags of `bubblespec real-policy`)."""

    examples: int = 384
    """Distinct problems, each seen once."""
    batch: int = 8
    lr: float = 5e-5
    warmup: int = 4
    """Optimiser steps of linear warm-up, then cosine decay to 10% of `lr`."""
    seed: int = 0
    threads: int = 0
    """torch threads (0: torch's default)."""


def training_pairs(task: WordProblemsTask, cfg: SftConfig) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids ending in ``<|im_end|>``) for each training problem."""
    rng = random.Random(f"sft-phrasing-{cfg.seed}")
    problems = task.make_prompts(cfg.examples, seed=f"sft-{cfg.seed}")
    return [(list(p.input_ids), task.encode(reference_solution(p, rng)) + [task.eos_id])
            for p in problems]


def batches(pairs: list[tuple[list[int], list[int]]], size: int, seed: int
            ) -> list[list[tuple[list[int], list[int]]]]:
    """Batches of similar total length (little padding), in a seeded random order."""
    ordered = sorted(pairs, key=lambda p: len(p[0]) + len(p[1]))
    out = [ordered[i:i + size] for i in range(0, len(ordered), size)]
    random.Random(seed).shuffle(out)
    return out


def learning_rate(step: int, total: int, cfg: SftConfig) -> float:
    """Linear warm-up over `cfg.warmup` steps, then cosine decay to 10% of `cfg.lr`."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, total - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def response_nll(model: Any, batch: list[tuple[list[int], list[int]]], pad_id: int) -> Any:
    """Mean negative log-likelihood of the response tokens of `batch` (prompts masked)."""
    import torch

    seqs = [p + r for p, r in batch]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    for i, ((p, r), s) in enumerate(zip(batch, seqs)):
        ids[i, :len(s)] = torch.tensor(s)
        attn[i, :len(s)] = 1
        labels[i, len(p):len(s)] = torch.tensor(r)
    return model(input_ids=ids, attention_mask=attn, labels=labels).loss


def fine_tune(base: Path, out: Path, cfg: SftConfig, log: Callable[[str], None] = print
              ) -> dict[str, Any]:
    """Fine-tune `base` on the reference solutions; write the model to `out` (a directory
    that exists); returns the stamp (configuration, losses, seconds)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    task = WordProblemsTask(base)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    plan = batches(training_pairs(task, cfg), cfg.batch, cfg.seed)
    losses, t0 = [], time.monotonic()
    for step, batch in enumerate(plan):
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, len(plan), cfg)
        loss = response_nll(model, batch, task.pad_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(round(loss.item(), 4))
        if step % 8 == 0 or step == len(plan) - 1:
            log(f"sft step {step + 1}/{len(plan)}: loss {losses[-1]:.3f} "
                f"({time.monotonic() - t0:.0f} s)")
    model.save_pretrained(str(out), safe_serialization=True)
    copy_tokenizer(base, out)
    return {"config": asdict(cfg), "base": str(base), "base_stamp": _stamp(base),
            "steps": len(plan), "losses": losses, "train_s": round(time.monotonic() - t0, 1)}


def _stamp(base: Path) -> dict[str, Any]:
    path = base / "conversion.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def policy_dir(root: Path | None = None, check: bool = True) -> Path:
    """The fine-tuned policy's directory; FileNotFoundError (saying how to build it) when
    `check` and it has not been built."""
    path = (root or cache_root()) / POLICY_NAME
    if check and not (path / "sft.json").is_file():
        raise FileNotFoundError(f"real policy not built at {path}; run `make real-policy` "
                                "(or `bubblespec real-policy`)")
    return path


def _current(path: Path, cfg: SftConfig, base: Path) -> bool:
    stamp = path / "sft.json"
    if not stamp.is_file():
        return False
    doc = json.loads(stamp.read_text())
    return doc.get("config") == asdict(cfg) and doc.get("base_stamp") == _stamp(base)


def build_policy(root: Path | None = None, cfg: SftConfig = SftConfig(), force: bool = False,
                 log: Callable[[str], None] = print) -> Path:
    """Build (or reuse) the fine-tuned policy next to the base model; returns its path."""
    root = root or cache_root()
    base = base_model_dir(root)
    dest = policy_dir(root, check=False)
    if not force and _current(dest, cfg, base):
        log(f"real policy: cached at {dest}")
        return dest
    tmp = Path(tempfile.mkdtemp(prefix=f".{POLICY_NAME}-", dir=root))
    try:
        stamp = fine_tune(base, tmp, cfg, log)
        (tmp / "sft.json").write_text(json.dumps(stamp, indent=2))
        publish(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"real policy: wrote {dest} ({stamp['steps']} steps, {stamp['train_s']:.0f} s, "
        f"loss {stamp['losses'][0]:.3f} -> {stamp['losses'][-1]:.3f})")
    return dest
