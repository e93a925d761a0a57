"""Suffix draft index benchmark: bubblespec's automaton index vs arctic-inference's C++ tree.

``bubblespec bench suffix`` (``make bench-suffix``; ``--quick`` or ``--groups N`` for a
smaller run). Everything runs in one process pinned to one core; the implementations are
interleaved group by group, so machine noise hits all of them alike.

Workload (seeded, RL-like): G prompt groups x 8 responses; each group has a base sequence of
1,000-4,000 tokens drawn from a Zipf-like distribution over a 32,000-token vocabulary; each
response is the base with independent edits (substitution, insertion or deletion of 1-3
tokens) every ~50 tokens on average. 7 responses per group are stored; the 8th is decoded:
at each step the implementation drafts (path drafts of <= 16 tokens, min_token_prob 0.1,
max_spec_factor 1, max_spec_offset 0, depth 64), the longest draft prefix equal to the true
continuation is accepted and one bonus token (the true next token) is appended.

Timed per step, with the draft's token ids in hand at the end of the timed region:
- bubblespec: ``Matcher.speculate(new_tokens)``: advance the match state by the tokens emitted
  since the last step, then draft from the group and the global group;
- arctic tree: ``SuffixTree.speculate_ndarray(context[-64:])`` on the group's C++ tree (one
  tree per group; it re-matches the context from the root at every call);
- arctic cache: ``SuffixDecodingCache.speculate`` as vLLM calls it (request-local tree plus
  the global tree holding every stored response).
Insert cost (process CPU time, robust on a shared machine): bubblespec ``add_sequence`` (list
input); arctic tree ``extend_ndarray``; arctic cache ``start_request`` +
``add_active_response`` + ``stop_request`` (extends the request's local tree and the global
tree, so it inserts each token twice). Speculate latency: wall clock per call (perf_counter),
median and p99 over all decode steps.
Memory per stored token: bubblespec by tracemalloc (Python allocations of a fresh build);
arctic by its own ``estimate_memory()``; the RSS growth of a fresh build is shown for all.
Live rows: the decoded response is also appended to the index at every step (timed with the
draft), as in deployment; see :class:`Live`.

The last line compares the static bubblespec row with the arctic per-group tree row.
"""

from __future__ import annotations

import ctypes
import gc
import os
import statistics
import time
import tracemalloc
from collections.abc import Callable

import numpy as np

from bubblespec.core import DraftParams, SuffixIndex

DEPTH = 64
MAX_SPEC = 16
PARAMS = DraftParams(max_spec_tokens=MAX_SPEC, max_spec_factor=1.0, max_spec_offset=0.0,
                     min_token_prob=0.1)
Work = list[list[np.ndarray]]


def make_workload(groups: int, responses: int = 8, vocab: int = 32_000,
                  min_len: int = 1_000, max_len: int = 4_000, edit_every: int = 50,
                  seed: int = 0) -> Work:
    """Seeded RL-like responses: ``groups`` lists of ``responses`` int32 arrays."""
    rng = np.random.default_rng(seed)
    p = 1.0 / (np.arange(1, vocab + 1, dtype=np.float64) + 10.0) ** 1.1
    p /= p.sum()
    perm = rng.permutation(vocab).astype(np.int32)
    out = []
    for _ in range(groups):
        n = int(rng.integers(min_len, max_len + 1))
        base = perm[rng.choice(vocab, size=n, p=p)]
        sibs = []
        for _ in range(responses):
            pieces, i = [], 0
            while i < n:
                gap = int(rng.geometric(1.0 / edit_every))
                pieces.append(base[i:i + gap])
                i += gap
                if i >= n:
                    break
                kind, k = int(rng.integers(3)), int(rng.integers(1, 4))
                if kind < 2:  # 0: substitution, 1: insertion
                    pieces.append(perm[rng.choice(vocab, size=k, p=p)])
                if kind != 1:  # 0: substitution, 2: deletion
                    i += k
            sibs.append(np.concatenate(pieces).astype(np.int32))
        out.append(sibs)
    return out


def accepted_prefix(draft: list[int], truth: list[int], pos: int) -> int:
    """Length of the longest prefix of ``draft`` equal to truth[pos:]."""
    k = 0
    for tok in draft:
        if pos + k >= len(truth) or truth[pos + k] != tok:
            break
        k += 1
    return k


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc), after returning free heap pages."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------------- implementations
# An implementation: insert(group, responses) stores a group's responses; start(group)
# returns step(new_tokens, context_tail) -> draft token ids for one decode step.
class Ours:
    name = "bubblespec Matcher.speculate"

    def __init__(self) -> None:
        self.idx = SuffixIndex(max_depth=DEPTH)

    @staticmethod
    def prepare(resps: list[np.ndarray]) -> list[list[int]]:
        return [r.tolist() for r in resps]

    def insert(self, gi: int, resps: list[list[int]]) -> None:
        for ri, r in enumerate(resps):
            self.idx.add_sequence((gi, ri), gi, r)

    def start(self, gi: int) -> Callable:
        spec = self.idx.matcher(gi).speculate
        return lambda new, ctx: spec(new, PARAMS).token_ids

    def memory(self) -> float:
        return float(self.idx.nbytes())


class ArcticTree:
    name = "arctic SuffixTree per group (C++)"

    def __init__(self) -> None:
        from arctic_inference.suffix_decoding._C import SuffixTree
        self.make = lambda: SuffixTree(DEPTH)
        self.trees: dict[int, object] = {}

    @staticmethod
    def prepare(resps: list[np.ndarray]) -> list[np.ndarray]:
        return resps

    def insert(self, gi: int, resps: list[np.ndarray]) -> None:
        tree = self.trees[gi] = self.make()
        for ri, r in enumerate(resps):
            tree.extend_ndarray(ri, r)

    def start(self, gi: int) -> Callable:
        p = PARAMS
        spec = self.trees[gi].speculate_ndarray
        return lambda new, ctx: spec(ctx, p.max_spec_tokens, p.max_spec_factor,
                                     p.max_spec_offset, p.min_token_prob, False).token_ids

    def memory(self) -> float:
        return float(sum(t.estimate_memory() for t in self.trees.values()))


class ArcticCache:
    name = "arctic SuffixDecodingCache (API)"

    def __init__(self) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
        self.cache = SuffixDecodingCache(max_tree_depth=DEPTH)
        self.empty = np.zeros(0, dtype=np.int32)

    @staticmethod
    def prepare(resps: list[np.ndarray]) -> list[np.ndarray]:
        return resps

    def insert(self, gi: int, resps: list[np.ndarray]) -> None:
        c = self.cache
        for ri, r in enumerate(resps):
            c.start_request((gi, ri), self.empty)
            c.add_active_response((gi, ri), r)
            c.stop_request((gi, ri))

    def start(self, gi: int) -> Callable:
        p, c, rid = PARAMS, self.cache, ("decode", gi)
        c.start_request(rid, self.empty)
        return lambda new, ctx: c.speculate(rid, ctx, p.max_spec_tokens, p.max_spec_factor,
                                            p.max_spec_offset, p.min_token_prob,
                                            False).token_ids

    def memory(self) -> float:  # its own estimate (private attribute: no public accessor)
        return float(self.cache._global_tree.estimate_memory())


class Live:
    """Live variant of an implementation: the decoded response is appended to the index at
    every step before drafting (bubblespec: ``extend_sequence`` of the request's own live
    sequence in its group, as the rank proposer does; arctic tree: ``extend`` of the group
    tree; arctic cache: ``add_active_response``, as vLLM's suffix proposer does). Reuses the
    static implementation's index; its decode of a group runs after the static one."""

    def __init__(self, base: Ours | ArcticTree | ArcticCache) -> None:
        # arctic's cache keeps every response in one global tree, whose child order (its
        # tie-break) removal does not restore: the live variant gets its own cache
        self.base = ArcticCache() if isinstance(base, ArcticCache) else base
        self.own = isinstance(base, ArcticCache)
        self.name = base.name.split(" ", 1)[0] + " live: append + " + {
            Ours: "speculate", ArcticTree: "tree speculate",
            ArcticCache: "cache speculate"}[type(base)]

    @staticmethod
    def prepare(resps: list[np.ndarray]) -> list[np.ndarray]:
        return resps

    def insert(self, gi: int, resps: list[np.ndarray]) -> None:
        if self.own:
            self.base.insert(gi, resps)

    def start(self, gi: int) -> Callable:
        b, p = self.base, PARAMS
        if isinstance(b, Ours):
            sid = ("decoded", gi)
            b.idx.add_sequence(sid, gi, [], live=True)
            ext, spec = b.idx.extend_sequence, b.idx.matcher(gi).speculate

            def step(new: list[int], ctx: np.ndarray) -> list[int]:
                if new:
                    ext(sid, new)
                return spec(new, p).token_ids
            return step
        if isinstance(b, ArcticTree):
            tree = b.trees[gi]
            sid = 1_000_000
            spec = tree.speculate_ndarray

            def step(new: list[int], ctx: np.ndarray) -> list[int]:
                if new:
                    tree.extend(sid, new)
                return spec(ctx, p.max_spec_tokens, p.max_spec_factor, p.max_spec_offset,
                            p.min_token_prob, False).token_ids
            return step
        c, rid = b.cache, ("live", gi)
        c.start_request(rid, b.empty)

        def step(new: list[int], ctx: np.ndarray) -> list[int]:
            if new:
                c.add_active_response(rid, new)
            return c.speculate(rid, ctx, p.max_spec_tokens, p.max_spec_factor,
                               p.max_spec_offset, p.min_token_prob, False).token_ids
        return step

    def finish(self, gi: int) -> None:
        """Drop the decoded response from arctic's global tree: it would otherwise serve as
        a (foreign) draft source for the groups decoded after it."""
        if self.own:
            self.base.cache.stop_request(("live", gi))
            self.base.cache.evict_cached_response(("live", gi))


def arctic_available() -> bool:
    """True when arctic-inference's suffix decoding extension imports."""
    try:
        import arctic_inference.suffix_decoding  # noqa: F401
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------------- measurements
def memory_of(cls: type, work: Work, ntok: int) -> tuple[float, float]:
    """(own estimate or tracemalloc, RSS growth) per stored token for a fresh build."""
    data = [cls.prepare(g[:-1]) for g in work]
    rss0 = rss_bytes()
    if cls is Ours:
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
    impl = cls()
    for gi, resps in enumerate(data):
        impl.insert(gi, resps)
    if cls is Ours:
        own = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
    else:
        own = impl.memory()
    rss = rss_bytes() - rss0
    del impl
    return own / ntok, rss / ntok


def run(impls: list, work: Work) -> dict:
    """Insert then decode, interleaving the implementations group by group."""
    res = {im.name: {"insert_s": 0.0, "lat": [], "acc": 0} for im in impls}
    clock = time.perf_counter_ns
    for gi, g in enumerate(work):
        for im in impls:
            data = im.prepare(g[:-1])
            t0 = time.process_time()  # CPU time: other processes' bursts do not count
            im.insert(gi, data)
            res[im.name]["insert_s"] += time.process_time() - t0
    res["nbytes"] = impls[0].memory()  # before the live rows append decoded responses
    for gi, g in enumerate(work):
        truth = g[-1]
        tl = truth.tolist()
        for im in impls:
            step = im.start(gi)
            lat, acc, pos, new = res[im.name]["lat"], 0, 0, []
            while pos < len(tl):
                ctx = truth[max(0, pos - DEPTH):pos]  # zero-copy view, made untimed
                t0 = clock()
                toks = step(new, ctx)
                lat.append(clock() - t0)
                k = accepted_prefix(toks, tl, pos)
                acc += k
                new = tl[pos:pos + k + 1]
                pos += k + 1
            res[im.name]["acc"] += acc
            if hasattr(im, "finish"):
                im.finish(gi)
    return res


def row(name: str, r: dict, ntok: int, mem: tuple[float, float] | None, note: str) -> dict:
    lat_us = sorted(x / 1000.0 for x in r["lat"])
    return {"name": name, "median": statistics.median(lat_us),
            "p99": lat_us[min(len(lat_us) - 1, int(0.99 * len(lat_us)))],
            "insert": r["insert_s"] * 1e6 / ntok if mem else None,
            "bytes": mem[0] if mem else None, "rss": mem[1] if mem else None,
            "accepted": r["acc"] / len(lat_us), "steps": len(lat_us), "note": note}


def _f(x: float | None, width: int, prec: int) -> str:
    return f"{'-':>{width}}" if x is None else f"{x:>{width}.{prec}f}"


def print_table(rows: list[dict]) -> None:
    hdr = (f"{'implementation':<40}{'spec med us':>12}{'spec p99 us':>12}{'insert us/tok':>14}"
           f"{'B/tok':>8}{'RSS B/tok':>10}{'acc/step':>9}{'steps':>7}  B/tok source")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['name']:<40}{r['median']:>12.2f}{r['p99']:>12.2f}{_f(r['insert'], 14, 2)}"
              f"{_f(r['bytes'], 8, 1)}{_f(r['rss'], 10, 1)}{r['accepted']:>9.3f}{r['steps']:>7}"
              f"  {r['note']}")


def ratios(ours: dict, other: dict) -> str:
    def q(key: str) -> str:
        a, b = ours[key], other[key]
        return "n/a" if a is None or b is None else f"{a / b:.3f}"
    return (f"speculate_median={q('median')} insert_per_token={q('insert')} "
            f"bytes_per_token={q('bytes')} accepted_per_step={q('accepted')}")


def run_bench(groups: int = 64, seed: int = 0, arctic: bool = True, live: bool = True
              ) -> None:
    """Build the workload, measure every implementation, print the table and the ratios
    (the last line: static bubblespec row vs arctic's per-group tree). `arctic=False` skips
    arctic-inference even when it is installed; `live=False` skips the live-append rows."""
    if groups < 1:
        raise ValueError("--groups must be >= 1")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    work = make_workload(groups, seed=seed)
    ntok = sum(len(r) for g in work for r in g[:-1])
    print(f"workload: {groups} groups x 8 responses, {ntok} stored tokens, "
          f"{sum(len(g[-1]) for g in work)} decoded tokens; depth {DEPTH}, path drafts <= "
          f"{MAX_SPEC} tokens, min_token_prob {PARAMS.min_token_prob}; pinned to core 0")
    have_arctic = arctic_available() and arctic
    classes = [Ours] + ([ArcticTree, ArcticCache] if have_arctic else [])
    mems = {cls.name: memory_of(cls, work, ntok) for cls in classes}
    impls = [cls() for cls in classes]
    lives = [Live(im) for im in impls] if live else []
    res = run(impls + lives, work)
    notes = {Ours.name: f"tracemalloc (nbytes() {res['nbytes'] / ntok:.1f})",
             ArcticTree.name: "estimate_memory()",
             ArcticCache.name: "estimate_memory() of its global tree"}
    rows = [row(c.name, res[c.name], ntok, mems[c.name], notes[c.name]) for c in classes]
    live_rows = [row(lv.name, res[lv.name], ntok, None, "") for lv in lives]
    print_table(rows + live_rows)
    if not have_arctic:
        print("arctic-inference not installed: run make bench-deps" if arctic
              else "arctic-inference skipped (--no-arctic)")
        print("ratios vs arctic: speculate_median=n/a insert_per_token=n/a "
              "bytes_per_token=n/a accepted_per_step=n/a")
        return
    for other in rows[1:]:
        print(f"ratios vs {other['name']}: {ratios(rows[0], other)}")
    for other in live_rows[1:]:
        print(f"ratios vs {other['name']}: {ratios(live_rows[0], other)}")
    print(f"(last line: static rows, bubblespec / {rows[1]['name']}, the direct analogue of "
          f"a per-group index)")
    print(f"ratios vs arctic: {ratios(rows[0], rows[1])}")

