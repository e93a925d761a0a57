"""Bad checkpoint directories built from a real model directory, one per failure kind.

Shared by the checkpoint validation tests (no engine) and the fault drills against real
ranks: each kind is what a crashed trainer, a full disk or a wrong export leaves behind.
`make_bad_checkpoint(kind, model_dir, dest)` copies the model directory to `dest` and
breaks it; `BAD_KINDS` maps each kind to words its refusal must contain.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

BAD_KINDS: dict[str, str] = {
    "truncated": "truncated",
    "empty_dir": "no .safetensors file",
    "wrong_shape": "shape",
    "random_bytes": "not a safetensors file",
    "nan_values": "non-finite",
    "inf_values": "non-finite",
    "missing_tensor": "missing",
    "extra_tensor": "does not have",
    "wrong_dtype": "dtype",
}
"""Kind of bad checkpoint -> a phrase the refusal's reason contains."""

WEIGHTS = "model.safetensors"


def _rewrite(dest: Path, edit: dict[str, torch.Tensor | None]) -> None:
    """Rewrite dest's weights file with some tensors replaced (None: removed) or added."""
    tensors = load_file(str(dest / WEIGHTS))
    for name, t in edit.items():
        if t is None:
            tensors.pop(name)
        else:
            tensors[name] = t
    save_file(tensors, str(dest / WEIGHTS), metadata={"format": "pt"})


def make_bad_checkpoint(kind: str, model_dir: str | Path, dest: Path) -> Path:
    """A copy of `model_dir` at `dest`, broken the `kind` way; returns `dest`."""
    shutil.copytree(model_dir, dest)
    weights = dest / WEIGHTS
    tensors = load_file(str(weights))
    name = next(n for n, t in sorted(tensors.items()) if t.ndim == 2)
    t = tensors[name]
    if kind == "truncated":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) * 2 // 3])
    elif kind == "empty_dir":
        shutil.rmtree(dest)
        dest.mkdir()
    elif kind == "wrong_shape":
        _rewrite(dest, {name: torch.zeros(t.shape[0] + 1, t.shape[1], dtype=t.dtype)})
    elif kind == "random_bytes":
        weights.write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8,
                                          generator=torch.Generator().manual_seed(1))
                            .numpy().tobytes())
    elif kind in ("nan_values", "inf_values"):
        bad = t.clone()
        bad[0, 0] = float("nan") if kind == "nan_values" else float("inf")
        _rewrite(dest, {name: bad})
    elif kind == "missing_tensor":
        _rewrite(dest, {name: None})
    elif kind == "extra_tensor":
        _rewrite(dest, {"model.surprise.weight": torch.zeros(2, 2, dtype=t.dtype)})
    elif kind == "wrong_dtype":
        _rewrite(dest, {name: t.to(torch.float16)})
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return dest
