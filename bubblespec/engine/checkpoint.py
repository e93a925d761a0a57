"""Checkpoint validation before a weight reload: refuse what would kill the engine.

vLLM reloads weights in place inside the engine-core process; a truncated file, a missing
tensor, a tensor of the wrong shape or garbage bytes raise there and leave the engine dead.
So the rank checks a new checkpoint directory first, in its own process (off the event
loop: `validate_checkpoint` is blocking), against the manifest of the model the engine was
started with (tensor names, dtypes and shapes read from the safetensors headers of that
directory):

- the directory exists and holds at least one `*.safetensors` file;
- every file has a well-formed header and as many data bytes as the header declares;
- every tensor of the manifest is present exactly once, with the same dtype and shape,
  and no tensor outside the manifest is present;
- every floating-point tensor holds finite values only.

Any failure raises `CheckpointError`, whose message names the file or tensor and what is
wrong. This module imports safetensors and torch, never vLLM.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

MAX_HEADER_BYTES = 100 * 1024 * 1024
"""Largest safetensors header accepted (the format's own limit)."""


class CheckpointError(ValueError):
    """A checkpoint directory the engine must not load; the message says why."""


@dataclass(frozen=True)
class TensorSpec:
    """What the running model expects of one tensor."""

    dtype: str
    shape: tuple[int, ...]


Manifest = dict[str, TensorSpec]
"""Tensor name -> expected dtype and shape (safetensors dtype names: F32, BF16, ...)."""


def safetensors_files(directory: Path) -> list[Path]:
    """The `*.safetensors` files of a checkpoint directory, sorted by name."""
    return sorted(p for p in directory.glob("*.safetensors") if p.is_file())


def read_header(path: Path) -> dict[str, TensorSpec]:
    """The tensors a safetensors file declares; raises CheckpointError when the header is
    malformed or the file holds fewer data bytes than the header says (truncated)."""
    name = path.name
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"file {name}: {size} bytes, too short for a "
                                      "safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > min(MAX_HEADER_BYTES, size - 8):
                raise CheckpointError(f"file {name}: not a safetensors file (header length "
                                      f"{n} does not fit in {size} bytes)")
            raw = f.read(n)
    except OSError as e:
        raise CheckpointError(f"file {name}: unreadable: {e}") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"file {name}: not a safetensors file (header: {e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"file {name}: not a safetensors file (header is not an object)")
    specs: dict[str, TensorSpec] = {}
    end = 0
    for tensor, entry in header.items():
        if tensor == "__metadata__":
            continue
        try:
            dtype, shape, (lo, hi) = entry["dtype"], entry["shape"], entry["data_offsets"]
            specs[tensor] = TensorSpec(str(dtype), tuple(int(d) for d in shape))
            end = max(end, int(hi))
            if not 0 <= int(lo) <= int(hi):
                raise ValueError(f"data offsets {lo}..{hi}")
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"file {name}: tensor {tensor}: malformed header entry "
                                  f"({e})") from None
    data = size - 8 - n
    if data < end:
        raise CheckpointError(f"file {name}: truncated: the header declares {end} bytes of "
                              f"tensor data, the file holds {data}")
    return specs


def read_manifest(model_dir: str | Path) -> Manifest:
    """The manifest of a (trusted) model directory: every tensor of its safetensors files."""
    files = safetensors_files(Path(model_dir))
    if not files:
        raise CheckpointError(f"no .safetensors file in {model_dir}")
    manifest: Manifest = {}
    for f in files:
        manifest.update(read_header(f))
    return manifest


def _fmt(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _compare(found: dict[str, tuple[str, TensorSpec]], manifest: Manifest) -> None:
    """Names, dtypes and shapes of the tensors `found` (name -> (file, spec)) against the
    manifest; raises CheckpointError for the first problems found."""
    missing = sorted(set(manifest) - set(found))
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise CheckpointError(f"{len(missing)} tensor(s) of the model missing: "
                              f"{', '.join(missing[:5])}{more}")
    extra = sorted(set(found) - set(manifest))
    if extra:
        more = f" (and {len(extra) - 5} more)" if len(extra) > 5 else ""
        raise CheckpointError(f"file {found[extra[0]][0]}: tensor(s) the model does not have: "
                              f"{', '.join(extra[:5])}{more}")
    for tensor, (fname, spec) in sorted(found.items()):
        want = manifest[tensor]
        if spec.shape != want.shape:
            raise CheckpointError(f"file {fname}: tensor {tensor}: shape {_fmt(spec.shape)}, "
                                  f"the model has {_fmt(want.shape)}")
        if spec.dtype != want.dtype:
            raise CheckpointError(f"file {fname}: tensor {tensor}: dtype {spec.dtype}, "
                                  f"the model has {want.dtype}")


def _check_values(path: Path, tensors: list[str]) -> None:
    """Load each tensor of one file (one at a time) and refuse non-finite values."""
    try:
        with safe_open(str(path), framework="pt") as f:
            for tensor in tensors:
                t = f.get_tensor(tensor)
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    bad = int((~torch.isfinite(t)).sum())
                    raise CheckpointError(f"file {path.name}: tensor {tensor}: {bad} "
                                          "non-finite value(s) (NaN or inf)")
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 (safetensors' errors have no common base class)
        raise CheckpointError(f"file {path.name}: unreadable: {type(e).__name__}: {e}") from None


def validate_checkpoint(path: str | Path, manifest: Manifest) -> None:
    """Check a checkpoint directory against the running model's manifest (blocking: reads
    every tensor once); raises CheckpointError naming the file/tensor and the problem."""
    directory = Path(path)
    if not directory.is_dir():
        raise CheckpointError(f"not a directory: {path}")
    files = safetensors_files(directory)
    if not files:
        raise CheckpointError(f"no .safetensors file in {path}")
    found: dict[str, tuple[str, TensorSpec]] = {}
    per_file: dict[Path, list[str]] = {}
    for f in files:
        specs = read_header(f)
        for tensor, spec in specs.items():
            if tensor in found:
                raise CheckpointError(f"tensor {tensor} is in both {found[tensor][0]} and "
                                      f"{f.name}")
            found[tensor] = (f.name, spec)
        per_file[f] = sorted(specs)
    _compare(found, manifest)
    for f, tensors in per_file.items():
        _check_values(f, tensors)


SAFETENSORS_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
                      "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
                      "uint8": "U8", "bool": "BOOL", "float8_e4m3fn": "F8_E4M3",
                      "float8_e5m2": "F8_E5M2"}
"""Torch dtype names (as trainers send them, `str(dtype)` without `torch.`) -> safetensors'."""


def check_bucket(names: list[str], dtypes: list[str], shapes: list[list[int]],
                 manifest: Manifest) -> tuple[str, str] | None:
    """A pushed bucket's tensors against the running model's manifest: (field, why) for the
    first problem (a name the model does not have, a repeated name, a wrong dtype or shape),
    None when every tensor fits."""
    seen: set[str] = set()
    for name, dtype, shape in zip(names, dtypes, shapes):
        want = manifest.get(name)
        if want is None:
            return "names", f"tensor {name}: the model has no such tensor"
        if name in seen:
            return "names", f"tensor {name}: sent twice in one bucket"
        seen.add(name)
        if SAFETENSORS_DTYPES.get(dtype) != want.dtype:
            return "dtypes", f"tensor {name}: dtype {dtype}, the model has {want.dtype}"
        if tuple(shape) != want.shape:
            return "shapes", (f"tensor {name}: shape {_fmt(tuple(shape))}, the model has "
                              f"{_fmt(want.shape)}")
    return None


def missing_tensors(staged: list[str], manifest: Manifest) -> str | None:
    """What a push leaves out of the model ('N tensor(s) ...: a, b'), None when whole."""
    missing = sorted(set(manifest) - set(staged))
    if not missing:
        return None
    more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
    return f"{len(missing)} tensor(s) of the model not sent: {', '.join(missing[:5])}{more}"
