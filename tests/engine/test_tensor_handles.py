"""Tensors a colocated trainer hands over (`engine/tensor_handles.py`): SGLang's
`MultiprocessingSerializer` text, read in another process from shared memory, in both
layouts SGLang names (pairs, flattened bucket with SGLang's own metadata class); anything
outside the allow-list, tensors shared by file descriptor and malformed buckets are refused
naming what is wrong, before anything is built."""

from __future__ import annotations

import base64
import io
import os
import pickle
import subprocess
import sys
import textwrap
from multiprocessing.reduction import ForkingPickler

import pytest
import torch

from bubblespec.client.weights import _shared_by_file_name, serialize_tensors
from bubblespec.engine.tensor_handles import HandleError, decode
from tests.sglang_shapes import SGLANG_TRAINER_PREAMBLE

READER = textwrap.dedent("""
    import sys, torch
    from bubblespec.engine.tensor_handles import HandleError, decode
    fmt = sys.argv[1] if sys.argv[1] != "none" else None
    try:
        out = decode(sys.stdin.read(), fmt)
    except HandleError as e:
        print("REFUSED", e)
    else:
        for n, t in out:
            print(n, str(t.dtype), list(t.shape), repr(t.double().sum().item()))
""")

SGLANG_TRAINER = SGLANG_TRAINER_PREAMBLE + textwrap.dedent("""
    # a trainer as SGLang's colocated callers write one (tests/sglang_shapes.py)
    named = [("a", torch.arange(6, dtype=torch.float32).reshape(2, 3)),
             ("b", torch.full((4,), 0.5, dtype=torch.float32))]
    flats, meta, at = [], [], 0
    for n, t in named:
        flats.append(t.flatten())
        meta.append(FlattenedTensorMetadata(n, t.shape, t.dtype, at, at + t.numel(), t.numel()))
        at += t.numel()
    flat = torch.cat(flats)  # kept until the reader is done: its memory is what it maps
    buf = io.BytesIO()
    ForkingPickler(buf).dump({"flattened_tensor": flat, "metadata": meta})
    sys.stdout.write(base64.b64encode(buf.getvalue()).decode() + "\\n")
    sys.stdout.flush()
    sys.stdin.read()  # keep the shared memory alive until the reader is done
""")


def read_elsewhere(text: str, load_format: str | None = None) -> list[str]:
    out = subprocess.run([sys.executable, "-c", READER, load_format or "none"], input=text,
                         capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.strip().splitlines()


def test_pairs_are_read_from_shared_memory_in_another_process() -> None:
    with _shared_by_file_name():
        w = torch.empty(3, 4).share_memory_().copy_(torch.arange(12.0).reshape(3, 4))
    text = serialize_tensors([("w", w), ("b", torch.ones(2, dtype=torch.bfloat16))])
    assert read_elsewhere(text) == ["w torch.float32 [3, 4] 66.0", "b torch.bfloat16 [2] 2.0"]


def test_sglangs_flattened_bucket_is_read_with_its_own_metadata_class() -> None:
    trainer = subprocess.Popen([sys.executable, "-c", SGLANG_TRAINER], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        text = trainer.stdout.readline().strip()
        lines = read_elsewhere(text, "flattened_bucket")
    finally:
        trainer.communicate("", timeout=60)
    assert lines == ["a torch.float32 [2, 3] 15.0", "b torch.float32 [4] 2.0"]


def test_a_tensor_shared_by_file_descriptor_is_refused_naming_the_strategy() -> None:
    buf = io.BytesIO()
    ForkingPickler(buf).dump([("w", torch.ones(3))])  # torch's default strategy
    (line,) = read_elsewhere(base64.b64encode(buf.getvalue()).decode())
    assert line.startswith("REFUSED") and "set_sharing_strategy('file_system')" in line


@pytest.mark.parametrize("obj, why", [
    ([("w", os.system)], "posix.system"),
    ({"x": 1}, "list of (name, tensor) pairs"),
    ([("w", 3)], "item 0 is not a (name, tensor) pair"),
])
def test_anything_but_tensors_is_refused_before_it_is_built(obj, why) -> None:
    text = base64.b64encode(pickle.dumps(obj)).decode()
    with pytest.raises(HandleError, match=why.replace("(", r"\(").replace(")", r"\)")):
        decode(text, None)


def test_malformed_buckets_and_formats_are_refused() -> None:
    with pytest.raises(HandleError, match="not base64"):
        decode("&&&", None)
    with pytest.raises(HandleError, match="load_format 'direct'"):
        decode("AAAA", "direct")
    pairs = serialize_tensors([("w", torch.ones(2))])
    with pytest.raises(HandleError, match="expected a flattened bucket"):
        decode(pairs, "flattened_bucket")
    buf = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buf)
    with pytest.raises(HandleError):
        decode(base64.b64encode(buf.getvalue()).decode(), None)
