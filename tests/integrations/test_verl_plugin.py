"""The verl plugin's pieces against the real verl 0.9.1 (no engines, no Ray cluster):
registration through verl's own plugin loading, the settings in verl's config, the weight
push written from a trainer's named tensors and accepted by the ranks' checkpoint check,
and the next-batch twin dataloader against the loader verl's trainer builds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tomllib

verl = pytest.importorskip("verl")

from bubblespec.engine.checkpoint import CheckpointError, read_manifest, validate_checkpoint
from bubblespec.integrations.verl.adapter import collect, write_version
from bubblespec.integrations.verl.hook import NextBatchPeeker, distinct_in_order
from bubblespec.integrations.verl.settings import BubbleSpecSettings
from bubblespec.tasks import default_model_dir
from tests.cluster.helpers import REPO_ROOT
from tests.integrations.verl_helpers import (
    trainer_loader,
    trainer_weights,
    verl_config,
    write_dataset,
)


def test_verl_finds_the_backend_through_its_external_modules() -> None:
    """A fresh `import verl` with `VERL_USE_EXTERNAL_MODULES` (loaded at the same point of
    verl's `__init__` as the `verl.plugins` entry points) resolves both halves by name."""
    code = ("import verl\n"
            "from verl.workers.rollout.replica import get_rollout_replica_class\n"
            "from verl.workers.rollout.base import get_rollout_class\n"
            "print(get_rollout_replica_class('bubblespec').__name__,"
            " get_rollout_class('bubblespec').__name__)\n")
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": "bubblespec.integrations.verl.plugin",
           "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=240, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["BubbleSpecReplica", "BubbleSpecServerAdapter"]


def test_the_package_declares_the_verl_plugin_entry_point() -> None:
    meta = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    eps = meta["project"]["entry-points"]["verl.plugins"]
    assert eps == {"bubblespec": "bubblespec.integrations.verl.plugin"}


def test_settings_come_from_the_rollout_config(tmp_path: Path) -> None:
    from verl.utils.config import omega_conf_to_dataclass

    data = tmp_path / "train.parquet"
    write_dataset(data, 4, 1)
    cfg = verl_config(str(default_model_dir()), data, 2, 2, ranks=3, seed_mode="keyed",
                      rank_args=["--kv-cache-mib", "64"])
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    s = BubbleSpecSettings.from_rollout_config(rollout)
    assert s.ranks == 3 and s.seed_mode.value == "keyed" and s.rank_args == ("--kv-cache-mib", "64")
    cfg.actor_rollout_ref.rollout.engine_kwargs = {"bubblespec": {"rankz": 2}}
    with pytest.raises(ValueError, match="engine_kwargs.bubblespec: rankz"):
        BubbleSpecSettings.from_rollout_config(cfg.actor_rollout_ref.rollout)
    cfg.actor_rollout_ref.rollout.engine_kwargs = {}
    assert BubbleSpecSettings.from_rollout_config(cfg.actor_rollout_ref.rollout).ranks is None


def test_weight_push_is_written_as_the_ranks_model_and_passes_their_check(
        tmp_path: Path) -> None:
    import asyncio

    manifest = read_manifest(default_model_dir())
    tensors = asyncio.run(collect(iter(trainer_weights()), manifest, keep=True))
    out = write_version(tensors, str(tmp_path), 3)
    assert out == tmp_path / "v3" and not list(tmp_path.glob(".v3*"))
    validate_checkpoint(out, manifest)  # what a rank checks before its engine reloads
    # a non-leader drains the generator (FSDP gathers on every rank) and keeps nothing
    assert asyncio.run(collect(iter(trainer_weights()), manifest, keep=False)) == {}
    # a tensor the engine's model needs but the trainer did not send is named
    short = [(k, v) for k, v in trainer_weights() if k != next(iter(manifest))]
    with pytest.raises(ValueError, match="missing"):
        asyncio.run(collect(iter(short), manifest, keep=True))
    # and a checkpoint written without it is refused by the rank's check too
    partial = {k: v for k, v in tensors.items() if k != next(iter(manifest))}
    with pytest.raises(CheckpointError):
        validate_checkpoint(write_version(partial, str(tmp_path), 4), manifest)


def _objects(items: list[Any]) -> np.ndarray:
    """A 1-D object array of chat messages, as verl's `collate_fn` makes `raw_prompt`."""
    out = np.empty(len(items), dtype=object)
    for i, x in enumerate(items):
        out[i] = x
    return out


def test_twin_dataloader_peeks_the_trainers_next_batch_across_epochs(tmp_path: Path) -> None:
    from verl.utils.config import omega_conf_to_dataclass

    data = tmp_path / "train.parquet"
    prompts = write_dataset(data, 10, 3)
    by_text = {p.text: list(p.input_ids) for p in prompts}
    cfg = verl_config(str(default_model_dir()), data, batch_size=3, n=2)
    model = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    loader = trainer_loader(cfg, model)
    trainer = [list(b["raw_prompt"]) for _ in range(3) for b in loader]  # 3 epochs x 3 steps
    peeker = NextBatchPeeker(cfg, model)
    for g in range(1, len(trainer)):  # verl's global steps count from 1
        batch = np.repeat(_objects(trainer[g - 1]), 2)  # rollout.n, interleaved
        nxt = peeker.next_prompts(g, batch)
        assert nxt == [[by_text[m[0]["content"]] for m in trainer[g]]], g
    # two batches ahead: the next two training batches, across the epoch boundary too
    ahead = NextBatchPeeker(cfg, model, depth=2)
    for g in range(1, len(trainer) - 1):
        nxt = ahead.next_prompts(g, np.repeat(_objects(trainer[g - 1]), 2))
        assert nxt == [[by_text[m[0]["content"]] for m in trainer[j]] for j in (g, g + 1)], g
    assert trainer[0] != trainer[3]  # the epochs' orders differ: the twin followed them
    # a batch the twin does not hold: no next prompts (speed lost, nothing wrong)
    assert peeker.next_prompts(2, _objects(trainer[0])) is None
    # going back (a resumed run) replays from the start
    assert peeker.next_prompts(1, _objects(trainer[0])) is not None


def test_distinct_in_order_undoes_verls_interleaved_repeat() -> None:
    a, b = [{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]
    assert distinct_in_order([a, a, b, b, a]) == [a, b]


def _script_overrides(path: Path) -> list[str]:
    """The Hydra overrides of an example script's `python3 -m verl.trainer.main_ppo` call."""
    text = path.read_text().split("verl.trainer.main_ppo", 1)[1]
    out = []
    for line in text.splitlines():
        line = re.sub(r"`#[^`]*`", "", line).replace("\\", "").replace("$@", "").strip()
        if line:
            out.append(line.replace("$HOME", str(Path.home())))
    return out


def test_example_script_composes_with_verls_own_config() -> None:
    """The example's overrides against verl's Hydra config: it composes, the rollout config
    validates, and the backend, hook and settings it names resolve."""
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.import_utils import load_class_from_fqn
    from verl.workers.rollout.replica import get_rollout_replica_class

    import bubblespec.integrations.verl.plugin  # noqa: F401  (the entry point's module)
    from bubblespec.integrations.verl.hook import BubbleSpecAgentLoopManager

    overrides = _script_overrides(REPO_ROOT / "examples/verl/run_qwen2-7b_grpo_bubblespec.sh")
    conf_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=conf_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert rollout.name == "bubblespec" and rollout.tensor_model_parallel_size == 1
    assert get_rollout_replica_class(rollout.name).__name__ == "BubbleSpecReplica"
    fqn = cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class
    assert load_class_from_fqn(fqn, "AgentLoopManager") is BubbleSpecAgentLoopManager
    assert BubbleSpecSettings.from_rollout_config(rollout).ranks == 8
    assert cfg.trainer.use_v1 is False
