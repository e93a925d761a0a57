"""What a vLLM worker's resident memory is made of, read from inside the worker.

A long soak shows the worker processes' RSS creeping up early and flattening; to tell a
cache filling to its high-water mark from a per-step leak it needs the parts, step by step:

- the kernel's split of the RSS (`/proc/self/status`: anonymous, file-backed, shared);
- glibc's heap (`mallinfo2`): bytes in use by malloc's callers (`malloc_in_use`, where
  torch's CPU tensors, oneDNN's primitives and every Python object live), bytes free inside
  the arenas (`malloc_free`: fragmentation, kept resident), bytes in separately mapped large
  blocks (`malloc_mmapped`) and the arenas' size (`malloc_arena`). torch's default CPU
  allocator has no cache of its own: a freed tensor goes back to malloc, so these figures
  are torch's too;
- the forward shapes the worker has run (`shapes`: distinct numbers of scheduled tokens).
  vLLM's CPU linear layers go through oneDNN handlers that cache one compiled primitive per
  batch shape up to a fixed count per layer, so a cache filling shows as memory that grows
  with new shapes and stops when they stop.

`HeapProbe` counts the shapes (its `seen` is called before every forward) and `snapshot`
returns everything as one flat dict of integers (bytes, KiB for the `/proc` fields).

`trim` hands the arenas' free pages back to the kernel (glibc `malloc_trim(0)`, every
arena): the worker calls it after each weight reload, the one moment per RL step when
megabytes of tensors have just been freed. Without it the free space inside the arenas,
left by caches that evict and refill in chunks of other sizes, stays resident and the RSS
creeps up although the memory in use does not grow (docs/results.md, "Soak").
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass, field

_MALLINFO2_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")
_STATUS_FIELDS = {"VmRSS": "rss_kib", "RssAnon": "rss_anon_kib", "RssFile": "rss_file_kib",
                  "RssShmem": "rss_shmem_kib", "VmData": "vm_data_kib"}


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library this process already runs on, loaded once (no `find_library`: that
    runs `ldconfig` in a subprocess, and these are called every step)."""
    return ctypes.CDLL(None)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO2_FIELDS]


def mallinfo2() -> dict[str, int]:
    """glibc's heap figures in bytes (empty where the C library has no `mallinfo2`)."""
    try:
        fn = _libc().mallinfo2
    except (OSError, AttributeError, TypeError):
        return {}
    fn.restype = _Mallinfo2
    info = fn()
    return {"malloc_arena": info.arena, "malloc_mmapped": info.hblkhd,
            "malloc_in_use": info.uordblks, "malloc_free": info.fordblks,
            "malloc_top_pad": info.keepcost}


def status_kib(path: str = "/proc/self/status") -> dict[str, int]:
    """The RSS split of this process in KiB (empty where /proc is not there)."""
    out: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in _STATUS_FIELDS:
                    out[_STATUS_FIELDS[key]] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        return {}
    return out


def trim() -> bool:
    """Return the free pages of every malloc arena to the kernel; True if any were (False
    where the C library has no `malloc_trim`)."""
    try:
        fn = _libc().malloc_trim
    except (OSError, AttributeError, TypeError):
        return False
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(fn(0))


@dataclass
class HeapProbe:
    """Forward shapes seen since install, and a snapshot of the process's memory."""

    shapes: set[int] = field(default_factory=set)
    forwards: int = 0

    def seen(self, tokens: int) -> None:
        """One forward of `tokens` scheduled tokens."""
        self.forwards += 1
        self.shapes.add(tokens)

    def snapshot(self) -> dict[str, int]:
        return {**status_kib(), **mallinfo2(), "forwards": self.forwards,
                "shapes": len(self.shapes)}
