"""Checkpoint validation (no engine): every bad kind refused with a reason naming the file or
tensor, good checkpoints (the model itself, perturbed weights, sharded files) accepted."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bubblespec.engine.checkpoint import (
    CheckpointError,
    read_manifest,
    validate_checkpoint,
)
from bubblespec.tasks import default_model_dir
from tests.engine.bad_checkpoints import BAD_KINDS, WEIGHTS, make_bad_checkpoint


@pytest.fixture(scope="module")
def model() -> Path:
    return Path(default_model_dir())


def test_manifest_lists_every_tensor_of_the_model(model: Path) -> None:
    manifest = read_manifest(model)
    tensors = load_file(str(model / WEIGHTS))
    assert set(manifest) == set(tensors)
    for name, t in tensors.items():
        assert manifest[name].shape == tuple(t.shape)
        assert manifest[name].dtype == "F32"


def test_the_model_and_perturbed_weights_pass(model: Path, tmp_path: Path) -> None:
    manifest = read_manifest(model)
    validate_checkpoint(model, manifest)
    new = tmp_path / "perturbed"
    shutil.copytree(model, new)
    tensors = {k: v + 0.01 for k, v in load_file(str(model / WEIGHTS)).items()}
    save_file(tensors, str(new / WEIGHTS), metadata={"format": "pt"})
    validate_checkpoint(new, manifest)


def test_sharded_checkpoint_passes_and_duplicates_are_refused(model: Path,
                                                              tmp_path: Path) -> None:
    manifest = read_manifest(model)
    tensors = load_file(str(model / WEIGHTS))
    names = sorted(tensors)
    shard = tmp_path / "sharded"
    shard.mkdir()
    save_file({n: tensors[n] for n in names[::2]}, str(shard / "a.safetensors"))
    save_file({n: tensors[n] for n in names[1::2]}, str(shard / "b.safetensors"))
    validate_checkpoint(shard, manifest)
    save_file({names[0]: tensors[names[0]]}, str(shard / "c.safetensors"))
    with pytest.raises(CheckpointError, match=f"tensor {names[0]} is in both"):
        validate_checkpoint(shard, manifest)


@pytest.mark.parametrize("kind", sorted(BAD_KINDS))
def test_bad_checkpoint_is_refused_with_the_reason(kind: str, model: Path,
                                                   tmp_path: Path) -> None:
    bad = make_bad_checkpoint(kind, model, tmp_path / kind)
    with pytest.raises(CheckpointError) as e:
        validate_checkpoint(bad, read_manifest(model))
    assert BAD_KINDS[kind] in str(e.value)
    if kind not in ("empty_dir", "missing_tensor"):
        assert WEIGHTS in str(e.value)


def test_not_a_directory(model: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a directory"):
        validate_checkpoint(tmp_path / "missing", read_manifest(model))
    with pytest.raises(CheckpointError, match="not a directory"):
        validate_checkpoint(model / WEIGHTS, read_manifest(model))


def test_header_lies_about_its_length(model: Path, tmp_path: Path) -> None:
    bad = tmp_path / "huge-header"
    bad.mkdir()
    (bad / WEIGHTS).write_bytes((2**62).to_bytes(8, "little") + b"{}")
    with pytest.raises(CheckpointError, match="header length"):
        validate_checkpoint(bad, read_manifest(model))


def test_non_float_tensors_are_not_checked_for_finiteness(tmp_path: Path) -> None:
    d = tmp_path / "ints"
    d.mkdir()
    save_file({"steps": torch.arange(4)}, str(d / WEIGHTS))
    validate_checkpoint(d, read_manifest(d))


def test_a_pushed_bucket_is_checked_against_the_manifest() -> None:
    from bubblespec.engine.checkpoint import TensorSpec, check_bucket, missing_tensors

    manifest = {"a.weight": TensorSpec("BF16", (4, 8)), "b.bias": TensorSpec("F32", (8,))}
    assert check_bucket(["a.weight"], ["bfloat16"], [[4, 8]], manifest) is None
    assert check_bucket(["c"], ["float32"], [[8]], manifest)[0] == "names"
    assert check_bucket(["b.bias", "b.bias"], ["float32"] * 2, [[8]] * 2, manifest)[0] == "names"
    assert check_bucket(["b.bias"], ["float16"], [[8]], manifest)[0] == "dtypes"
    assert check_bucket(["a.weight"], ["bfloat16"], [[8, 4]], manifest)[0] == "shapes"
    assert missing_tensors(["a.weight", "b.bias"], manifest) is None
    assert "1 tensor(s) of the model not sent: b.bias" in missing_tensors(["a.weight"], manifest)
