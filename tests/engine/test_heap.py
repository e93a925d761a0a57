"""The worker's memory probe (`engine/heap.py`): the figures come from this process's own
kernel and C library, and react to memory this process really allocates."""

from __future__ import annotations

import ctypes
import ctypes.util

from bubblespec.engine.heap import HeapProbe, mallinfo2, status_kib


def test_status_split_adds_up_to_the_rss() -> None:
    st = status_kib()
    assert st["rss_kib"] > 10_000
    assert st["rss_anon_kib"] + st["rss_file_kib"] + st["rss_shmem_kib"] == st["rss_kib"]
    assert status_kib("/nonexistent/status") == {}


def test_malloc_in_use_follows_a_real_allocation_and_its_free() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    before = mallinfo2()
    ptrs = [libc.malloc(4096) for _ in range(2048)]  # 8 MiB of small blocks, in the arena
    during = mallinfo2()
    for p in ptrs:
        libc.free(p)
    after = mallinfo2()
    assert during["malloc_in_use"] - before["malloc_in_use"] >= 2048 * 4096
    assert during["malloc_in_use"] - after["malloc_in_use"] >= 2048 * 4096 * 0.9
    big = libc.malloc(64 << 20)  # above the mmap threshold: a block mapped on its own
    try:
        assert mallinfo2()["malloc_mmapped"] - after["malloc_mmapped"] >= 64 << 20
    finally:
        libc.free(big)


def test_probe_counts_forwards_and_distinct_shapes() -> None:
    probe = HeapProbe()
    for tokens in (4, 4, 9, 4, 17):
        probe.seen(tokens)
    snap = probe.snapshot()
    assert snap["forwards"] == 5 and snap["shapes"] == 3
    assert snap["rss_kib"] > 0 and snap["malloc_arena"] > 0
