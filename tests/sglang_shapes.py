"""SGLang's shapes for a trainer script written as SGLang's callers write one, without
SGLang installed: the preamble that puts `FlattenedTensorMetadata` (the same fields as
`sglang.srt.weight_sync.tensor_bucket`'s) under SGLang's module path, so that a
`ForkingPickler` dump names SGLang's class, and shares CPU tensors by file name
(`MultiprocessingSerializer`'s text from a CPU trainer)."""

SGLANG_TRAINER_PREAMBLE = """\
import base64, dataclasses, io, os, sys, types, torch
import torch.multiprocessing as mp
from multiprocessing.reduction import ForkingPickler
for name in ("sglang", "sglang.srt", "sglang.srt.weight_sync"):
    sys.modules[name] = types.ModuleType(name)
mod = types.ModuleType("sglang.srt.weight_sync.tensor_bucket")
@dataclasses.dataclass
class FlattenedTensorMetadata:
    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int
FlattenedTensorMetadata.__module__ = mod.__name__
mod.FlattenedTensorMetadata = FlattenedTensorMetadata
sys.modules[mod.__name__] = mod
mp.set_sharing_strategy("file_system")
"""
