"""Tensors handed over by a colocated trainer (SGLang's `/update_weights_from_tensor`).

The trainer pickles its tensors with torch's multiprocessing reductions (SGLang's
`MultiprocessingSerializer`: a `ForkingPickler` dump, base64 text over HTTP), so what
crosses the wire is a handle, not the data: a CPU tensor's shared-memory file (torch's
`file_system` sharing strategy) or a CUDA tensor's IPC handle; the engine worker maps it.
Two layouts, as SGLang names them (`load_format`): None, a list of (name, tensor) pairs;
"flattened_bucket", one flat tensor and per-tensor metadata (name, shape, dtype, start and
end index), SGLang's `FlattenedTensorBucket`.

The pickle comes from the network, so it is read with an allow-list: torch's tensor and
storage rebuilders, torch dtypes and sizes, SGLang's metadata class (read into a class of
ours with the same fields) and nothing else; anything outside it is refused naming the
global it asked for, and nothing of the request is applied (`HandleError`, a 400 naming
`serialized_named_tensors`). A CPU tensor shared with torch's default `file_descriptor`
strategy cannot be mapped by an unrelated process (its descriptor is passed over the
trainer's own connection); it is refused naming the strategy to use.
"""

from __future__ import annotations

import base64
import binascii
import collections
import io
import pickle
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing import reductions

LOAD_FORMATS = (None, "flattened_bucket")


class HandleError(ValueError):
    """The handed-over tensors cannot be read; nothing of them is applied."""


@dataclass
class FlatMeta:
    """One tensor of a flattened bucket (SGLang's `FlattenedTensorMetadata`, same fields)."""

    name: str = ""
    shape: Any = ()
    dtype: Any = None
    start_idx: int = 0
    end_idx: int = 0
    numel: int = 0


def _fd_refused(*_: Any) -> Any:
    raise HandleError("a CPU tensor shared by file descriptor cannot be mapped outside the "
                      "trainer's process tree: share it by file name (torch.multiprocessing."
                      "set_sharing_strategy('file_system') before serializing)")


class _FdShared:
    """Stands for `multiprocessing.resource_sharer.DupFd` (built with NEWOBJ): refused."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return _fd_refused()


_REBUILDERS = ("rebuild_tensor", "rebuild_typed_storage", "rebuild_typed_storage_child",
               "rebuild_storage_filename", "rebuild_storage_empty", "rebuild_cuda_tensor",
               "rebuild_nested_tensor", "rebuild_event")
_ALLOWED: dict[tuple[str, str], Any] = {
    **{("torch.multiprocessing.reductions", n): getattr(reductions, n)
       for n in _REBUILDERS if hasattr(reductions, n)},
    ("torch.multiprocessing.reductions", "rebuild_storage_fd"): _fd_refused,
    ("multiprocessing.resource_sharer", "DupFd"): _FdShared,
    ("torch", "Tensor"): torch.Tensor,
    ("torch.nn.parameter", "Parameter"): torch.nn.Parameter,
    ("torch", "Size"): torch.Size,
    ("torch.storage", "UntypedStorage"): torch.UntypedStorage,
    ("torch", "UntypedStorage"): torch.UntypedStorage,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata"): FlatMeta,
    ("sglang.srt.model_executor.model_runner", "FlattenedTensorMetadata"): FlatMeta,
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name))
        if found is None and module == "torch" and isinstance(getattr(torch, name, None),
                                                               torch.dtype):
            found = getattr(torch, name)
        if found is None:
            raise HandleError(f"the pickle asks for {module}.{name}, which is not a tensor, "
                              "a storage or a bucket's metadata")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise HandleError("the pickle holds a persistent id (torch.save's format?): send "
                          "SGLang's MultiprocessingSerializer text")


def decode(text: str, load_format: str | None) -> list[tuple[str, torch.Tensor]]:
    """The named tensors of one `serialized_named_tensors` entry (module doc); raises
    HandleError naming what is wrong."""
    if load_format not in LOAD_FORMATS:
        raise HandleError(f"load_format {load_format!r} is not served (None or "
                          "'flattened_bucket')")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise HandleError(f"not base64 text: {e}") from None
    try:
        obj = _Unpickler(io.BytesIO(raw)).load()
    except HandleError:
        raise
    except Exception as e:  # noqa: BLE001 (a broken pickle or a handle that cannot be mapped)
        raise HandleError(f"cannot read the tensors: {type(e).__name__}: {e}") from None
    return _flattened(obj) if load_format == "flattened_bucket" else _pairs(obj)


def _pairs(obj: Any) -> list[tuple[str, torch.Tensor]]:
    if not isinstance(obj, list | tuple):
        raise HandleError(f"expected a list of (name, tensor) pairs, got {type(obj).__name__} "
                          "(a flattened bucket needs load_format 'flattened_bucket')")
    out = []
    for i, item in enumerate(obj):
        if not (isinstance(item, list | tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise HandleError(f"item {i} is not a (name, tensor) pair")
        out.append((item[0], item[1]))
    return out


def _flattened(obj: Any) -> list[tuple[str, torch.Tensor]]:
    if not (isinstance(obj, dict) and isinstance(obj.get("flattened_tensor"), torch.Tensor)
            and isinstance(obj.get("metadata"), list)):
        raise HandleError("expected a flattened bucket: {'flattened_tensor': tensor, "
                          "'metadata': [...]}")
    flat = obj["flattened_tensor"]
    if flat.dim() != 1:
        raise HandleError(f"the flattened tensor has {flat.dim()} dimensions, not 1")
    out = []
    for i, m in enumerate(obj["metadata"]):
        if not isinstance(m, FlatMeta) or not isinstance(m.dtype, torch.dtype):
            raise HandleError(f"metadata {i} is not a tensor's metadata")
        lo, hi, shape = int(m.start_idx), int(m.end_idx), torch.Size(m.shape)
        if not 0 <= lo <= hi <= flat.numel() or hi - lo != shape.numel():
            raise HandleError(f"tensor {m.name}: elements {lo}..{hi} do not fit the "
                              f"flattened tensor ({flat.numel()}) or its shape {list(shape)}")
        t = flat[lo:hi].reshape(shape)
        out.append((str(m.name), t if t.dtype == m.dtype else t.to(m.dtype)))
    return out


def dtype_name(t: torch.Tensor) -> str:
    """A tensor's dtype as trainers name it (`str(dtype)` without `torch.`)."""
    return str(t.dtype).removeprefix("torch.")
