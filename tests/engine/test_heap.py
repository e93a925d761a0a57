"""The worker's memory probe (`engine/heap.py`): the figures come from this process's own
kernel and C library, and react to memory this process really allocates."""

from __future__ import annotations

import ctypes
import ctypes.util

from bubblespec.engine.heap import HeapProbe, mallinfo2, status_kib, trim


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


def test_trim_returns_the_free_pages_between_live_blocks() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    size, count = 32 << 10, 2048  # 64 MiB of arena blocks below the mmap threshold
    ptrs = [libc.malloc(size) for _ in range(count)]
    for p in ptrs:
        libc.memset(p, 1, size)  # resident
    try:
        for p in ptrs[::2]:  # every other block freed: fragmented, nothing at the top
            libc.free(p)
        before = status_kib()["rss_anon_kib"]
        assert trim()
        after = status_kib()["rss_anon_kib"]
        # half of the 64 MiB is free; whole pages inside each freed block go back
        assert before - after > 16 << 10
    finally:
        for p in ptrs[1::2]:
            libc.free(p)
