"""The warm-start fine-tune (`bubblespec.train.sft`): its schedule and batching, and a real
fine-tune through `build_policy`, smaller than `make real-policy`'s so that `make test` can
afford it: a small Llama with the real model's tokenizer and config shape, in a cache root
laid out as `make real-model` leaves it, trained on a few problems. The written directory
loads, it is cached by configuration and base model, and it assigns the reference solutions
it was trained on a higher likelihood than the base did. (`make real-policy` runs the same
code on the 135M model: docs/results.md, "The warm-started policy".)"""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
from pathlib import Path

import pytest

from bubblespec.train.sft import (
    POLICY_NAME,
    SftConfig,
    _current,
    batches,
    build_policy,
    learning_rate,
    policy_dir,
    response_nll,
    training_pairs,
)


def test_learning_rate_warms_up_then_decays_to_a_tenth() -> None:
    cfg = SftConfig(lr=1e-4, warmup=4)
    lrs = [learning_rate(s, 40, cfg) for s in range(40)]
    assert lrs[0] == pytest.approx(2.5e-5) and lrs[3] == pytest.approx(1e-4)
    assert all(a >= b for a, b in itertools.pairwise(lrs[3:]))
    assert lrs[-1] == pytest.approx(1e-5, rel=0.02)  # the decay ends one step past the last
    assert learning_rate(40, 40, cfg) == pytest.approx(1e-5)


def test_batches_hold_every_pair_once_with_similar_lengths() -> None:
    pairs = [([1] * (i % 7 + 1), [2] * (i % 5 + 1)) for i in range(30)]
    got = batches(pairs, 8, seed=0)
    assert sorted(map(len, got)) == [6, 8, 8, 8]
    assert sorted(id(p) for b in got for p in b) == sorted(id(p) for p in pairs)
    assert got != batches(pairs, 8, seed=1)  # the order is shuffled by the seed


@pytest.fixture(scope="module")
def small_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache root holding a small Llama (the real model's tokenizer and vocabulary, 2
    layers of width 64, random weights) where `make real-model` puts the base model."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from bubblespec.models import real_model_dir
    from bubblespec.models.smollm2 import MODEL_NAME

    try:
        real = real_model_dir()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    base = tmp_path_factory.mktemp("cache") / MODEL_NAME
    base.mkdir()
    torch.manual_seed(0)
    cfg = json.loads((real / "config.json").read_text())
    cfg.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    LlamaForCausalLM(LlamaConfig(**cfg)).save_pretrained(str(base))
    for name in ("tokenizer.json", "tokenizer_config.json", "conversion.json"):
        shutil.copy2(real / name, base / name)
    return base


def test_a_small_fine_tune_raises_the_likelihood_of_the_solutions(small_base: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from bubblespec.tasks.wordproblems import WordProblemsTask

    root = small_base.parent
    cfg = SftConfig(examples=16, batch=4, lr=3e-3, warmup=1)
    logs: list[str] = []
    path = build_policy(root, cfg, log=logs.append)
    assert path == policy_dir(root) == root / POLICY_NAME
    stamp = json.loads((path / "sft.json").read_text())
    assert stamp["config"] == dataclasses.asdict(cfg) and stamp["steps"] == 4
    assert (path / "tokenizer.json").is_file() and not list(root.glob(f".{POLICY_NAME}-*"))

    pairs = training_pairs(WordProblemsTask(small_base), cfg)
    with torch.no_grad():
        nll = {name: float(response_nll(AutoModelForCausalLM.from_pretrained(
            str(d), dtype=torch.float32).eval(), pairs, 2)) for name, d in
            (("base", small_base), ("tuned", path))}
    assert nll["tuned"] < nll["base"] - 0.5, nll

    build_policy(root, cfg, log=logs.append)
    assert logs[-1].startswith("real policy: cached")
    assert not _current(path, dataclasses.replace(cfg, lr=2e-4), small_base)
