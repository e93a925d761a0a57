"""Per-engine-step drafting cost at GPU batch sizes: native vs pure Python vs arctic vs n-gram.

``bubblespec bench draft-batch`` (``make bench-draft-batch``; ``--quick`` for a smoke run).
One process; run it pinned to one core (``taskset -c 1``), the machine as idle as possible.

Workload: the suffix bench's seeded RL-like groups (:func:`bubblespec.bench.suffix.
make_workload`, responses of 1-4k tokens). A batch of B running requests is B/8 prompt
groups x 8 sibling requests; each group also holds 4 finished responses (pushed
pre-generated drafts, none aligned to a request: every request drafts from its matcher, the
costlier path). Each engine step every request emits its accepted draft prefix plus one token
of its own response; the step's drafting call for all B requests is timed in CPU time of the
process (``process_time_ns``: on a shared machine wall clock counts other processes' bursts;
numba's worker threads are counted too):

- ``proposer (native)``: the engine proposer's whole ``propose`` call
  (:class:`bubblespec.engine.proposer.BubbleSpecProposer` on a stand-in model runner that
  holds the batch's request ids): its bookkeeping plus the native step (needs vLLM);
- ``proposer, global pool + live``: the same with the global pool on and every live output
  mirrored into it (the ``global_live`` source): the cost of drafting across prompts from live
  responses, as vLLM's suffix decoding does (other drafts: not compared with Python);
- ``native step``: ``bubblespec_native.step``, the proposer's per-request loop in one call
  (counters and calibration, append to the request's live sequence, aligned-draft check,
  extend + draft, the choice among sources);
- ``python step``: the same loop in pure Python (:func:`bubblespec.core.batch.step`);
- ``native step, no live appends``: the same call without appending the emitted tokens to
  the requests' live sequences in their groups (``extend_index=False``; siblings then draft
  from the stored responses only): where the native step's time goes, not a mode;
- ``native step, appends deferred`` and ``proposer, appends deferred`` (also with the
  global pool + live): the proposer's ``--defer-appends``: the same calls without the
  appends, which follow in one
  ``extend_sequences`` call (the proposer runs that on a worker thread, without the GIL,
  beside the engine's next forward; here it is run and timed on its own before the next
  step, the ``...: its appends`` rows): the drafts wait only for the first row, and the
  appends must fit in a forward;
- ``native classes, Python loop``: the pure-Python loop over the native index and matchers;
- ``arctic tree``: arctic-inference's C++ ``SuffixTree`` per group, called per request from
  Python as vLLM's suffix proposer does (append the emitted tokens, speculate on the last 64);
- ``vLLM ngram``: vLLM's ``NgramProposer.propose`` (numba, one thread) on the batch's
  token table.

Implementations are interleaved step by step so machine noise hits all alike. Before the
table, the suffix bench's static rows are run with the native matcher added, ending with
its ``ratios vs arctic:`` line for the native matcher. The last line:
``draft_cost_per_step_us: b64=X b256=Y b1024=Z arctic_b256=A`` (medians of the proposer row,
or of the native step without vLLM).
"""

from __future__ import annotations

import os
import statistics
import time
import types
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from bubblespec.bench import suffix as sb
from bubblespec.core import batch as pybatch
from bubblespec.core import suffix_index as pyindex
from bubblespec.core.backend import load_native
from bubblespec.core.candidates import Calibration, DrafterStats

DEFERRED = ": its appends"  # the row of a deferred step's extend_sequences call
STORED = 4  # finished responses per group (pushed drafts)
SIBS = 8  # running requests per group
K = sb.MAX_SPEC
MAX_LEN = 8192
LOCAL_SOURCES = ("pregen", "siblings", "self")
"""The sources of the proposer rows without the global pool."""


class NativeOurs(sb.Ours):
    """The suffix bench's bubblespec row on the native index (memory: its nbytes())."""

    name = "bubblespec native Matcher.speculate"

    def __init__(self) -> None:
        self.idx = load_native().SuffixIndex(max_depth=sb.DEPTH)


def suffix_rows(groups: int, seed: int, arctic: bool) -> None:
    """The suffix bench's static rows (native, pure Python, arctic tree), its table and the
    ``ratios vs arctic:`` line for the native matcher."""
    work = sb.make_workload(groups, seed=seed)
    ntok = sum(len(r) for g in work for r in g[:-1])
    classes = [NativeOurs, sb.Ours] + ([sb.ArcticTree] if arctic else [])
    mems = {c.name: sb.memory_of(c, work, ntok) for c in classes}
    res = sb.run([c() for c in classes], work)
    notes = {NativeOurs.name: "nbytes() (C++ capacities)", sb.Ours.name: "tracemalloc",
             sb.ArcticTree.name: "estimate_memory()"}
    rows = [sb.row(c.name, res[c.name], ntok, mems[c.name], notes[c.name]) for c in classes]
    print(f"suffix bench rows: {groups} groups x 8 responses, {ntok} stored tokens")
    sb.print_table(rows)
    print(f"native / pure Python: {sb.ratios(rows[0], rows[1])}")
    if arctic:
        print(f"ratios vs arctic: {sb.ratios(rows[0], rows[2])}")


# ---------------------------------------------------------------------- batch drivers
class Batch:
    """B running requests over B/8 groups; ``drafts``/``pos`` track each request."""

    def __init__(self, work: sb.Work) -> None:
        self.truth = [r for g in work for r in g[STORED:STORED + SIBS]]
        self.lists = [t.tolist() for t in self.truth]
        self.group = [gi for gi, _ in enumerate(work) for _ in range(SIBS)]
        self.pos = [1] * len(self.truth)  # the first token is the prompt's last
        self.drafts: list[list[int]] = [[] for _ in self.truth]
        self.acc = 0

    def emitted(self) -> list[list[int]]:
        """Accepted prefix of each request's last draft plus one token."""
        out = []
        for i, tl in enumerate(self.lists):
            p, d, a = self.pos[i], self.drafts[i], 0
            while a < len(d) and p + a < len(tl) and d[a] == tl[p + a]:
                a += 1
            self.acc += a
            new = tl[p:p + a + 1]
            self.pos[i] = p + len(new)
            out.append(new)
        return out


def index_driver(index_cls: type, request_cls: type, step: Callable, work: sb.Work,
                 defer: list | None = None, extend: Callable | None = None,
                 ) -> Callable[[Batch, list[list[int]]], list[list[int]]]:
    """The step on a fresh index of `work`; with `defer` (a list), the step does not append,
    and `defer` receives a call that appends what it emitted (`extend`: the
    implementation's ``extend_requests``)."""
    idx = index_cls(max_depth=sb.DEPTH)
    for gi, g in enumerate(work):
        for ri, r in enumerate(g[:STORED]):
            idx.add_sequence(("pre", gi, ri), gi, r)
    reqs = []
    for i in range(len(work) * SIBS):
        gi, sid = i // SIBS, ("out", i)
        first = work[gi][STORED + i % SIBS][:1].tolist()
        idx.add_sequence(sid, gi, first, live=True)
        reqs.append(request_cls(gi, sid, idx.matcher(gi, first), aligned=None,
                                aligned_on=False, tail=first, n_out=1, out=[]))
    params, cal, src = sb.PARAMS, Calibration(), DrafterStats()
    if defer is None:
        return lambda b, new: step(idx, reqs, new, b.pos, K, MAX_LEN, params, cal, src)

    def deferred(b: Batch, new: list[list[int]]) -> list[list[int]]:
        out = step(idx, reqs, new, b.pos, K, MAX_LEN, params, cal, src, extend_index=False)
        defer.append(lambda: extend(idx, reqs, new))
        return out
    return deferred


class _Handover:
    """In place of the proposer's appender thread: keeps the submitted call in `calls` for
    the bench to run and time on its own (a worker thread's CPU time would land in
    whichever row the process was timing)."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def submit(self, fn: Callable, *args: object) -> Future:
        self.calls.append(lambda: fn(*args))
        done: Future = Future()
        done.set_result(None)
        return done


class ProposerDriver:
    """The engine proposer on a stand-in model runner: request ids carry the group and a
    sample index; the stored responses are pushed as pre-generated drafts of other sample
    indices (none aligned); prompts are empty and the first token of each response was
    emitted before the first step (the index then holds what the other drivers' hold)."""

    def __init__(self, work: sb.Work, sources: tuple[str, ...] = LOCAL_SOURCES,
                 deferred: list | None = None, defer_appends: bool = False) -> None:
        from bubblespec.engine.proposer import BubbleSpecProposer
        ns = types.SimpleNamespace
        cfg = ns(speculative_config=ns(num_speculative_tokens=K),
                 model_config=ns(max_model_len=MAX_LEN, get_vocab_size=lambda: 1 << 30))
        self.prop = BubbleSpecProposer(cfg)
        p = sb.PARAMS
        self.prop.bubblespec_configure({"max_depth": sb.DEPTH, "sources": list(sources),
                                        "defer_appends": defer_appends,
                                        "draft": {
            "max_spec_tokens": p.max_spec_tokens, "max_spec_factor": p.max_spec_factor,
            "max_spec_offset": p.max_spec_offset, "min_token_prob": p.min_token_prob}})
        self.prop.add_drafts([(f"g{gi}", 100 + ri, r.tolist()) for gi, g in enumerate(work)
                              for ri, r in enumerate(g[:STORED])])
        n = len(work) * SIBS
        first = [work[i // SIBS][STORED + i % SIBS][0] for i in range(n)]
        self.batch = ns(
            req_ids=[f"bs.g{i // SIBS}.{i % SIBS}.u{i}" for i in range(n)],
            num_prompt_tokens=np.zeros(n, dtype=np.int32),
            num_tokens_no_spec=np.ones(n, dtype=np.int32),
            token_ids_cpu=np.array(first, dtype=np.int32).reshape(n, 1))
        """The stand-in runner's input batch (what `vllm_glue.batch_view` reads)."""
        self.prop.runner = ns(input_batch=self.batch, requests={})  # no request's state
        if deferred is not None:  # the appends come back to the bench, to be timed apart
            self.prop._appender = _Handover(deferred)

    def prepare(self, b: Batch) -> None:
        self.batch.num_tokens_no_spec[:] = b.pos

    def __call__(self, b: Batch, new: list[list[int]]) -> list[list[int]]:
        ib = self.batch
        return self.prop.propose(new, ib.num_tokens_no_spec, ib.token_ids_cpu)


def arctic_driver(work: sb.Work) -> Callable[[Batch, list[list[int]]], list[list[int]]]:
    from arctic_inference.suffix_decoding._C import SuffixTree
    trees = []
    for g in work:
        t = SuffixTree(sb.DEPTH)
        for ri, r in enumerate(g[:STORED]):
            t.extend_ndarray(ri, r)
        trees.append(t)
    p = sb.PARAMS

    def step(b: Batch, new: list[list[int]]) -> list[list[int]]:
        out = []
        for i, toks in enumerate(new):
            t, pos = trees[b.group[i]], b.pos[i]
            t.extend(1000 + i, toks)
            ctx = b.truth[i][max(0, pos - sb.DEPTH):pos]
            out.append(t.speculate_ndarray(ctx, p.max_spec_tokens, p.max_spec_factor,
                                           p.max_spec_offset, p.min_token_prob,
                                           False).token_ids)
        return out
    return step


class NgramDriver:
    """vLLM's n-gram proposer on the batch's token table (updated untimed, as the runner
    does before calling the proposer)."""

    def __init__(self, n: int) -> None:
        from bubblespec.engine.vllm_glue import VllmProposer
        ns = types.SimpleNamespace
        cfg = ns(speculative_config=ns(prompt_lookup_min=2, prompt_lookup_max=5,
                                       num_speculative_tokens=K),
                 model_config=ns(max_model_len=MAX_LEN),
                 scheduler_config=ns(max_num_seqs=max(n, 1024)),
                 parallel_config=ns(tensor_parallel_size=1))
        self.impl = VllmProposer(cfg, "ngram", 2, 5)
        self.table = np.zeros((n, MAX_LEN), dtype=np.int32)
        self.ntok = np.zeros(n, dtype=np.int32)

    def prepare(self, b: Batch) -> None:
        for i, t in enumerate(b.truth):
            self.table[i, :b.pos[i]] = t[:b.pos[i]]
            self.ntok[i] = b.pos[i]

    def __call__(self, b: Batch, new: list[list[int]]) -> list[list[int]]:
        return self.impl.propose(K, new, self.ntok, self.table, None)


def measure(size: int, steps: int, seed: int, arctic: bool, ngram: bool,
            proposer: bool) -> dict[str, dict]:
    """Median/p99 per-step cost (us) and accepted tokens per request-step of each driver."""
    work = sb.make_workload(size // SIBS, responses=STORED + SIBS, seed=seed)
    nat = load_native()
    drivers: dict[str, tuple[Callable, Batch]] = {}
    pending: list = []  # the appends a deferred row left, run and timed on their own
    if nat is not None and proposer:
        drivers["proposer (native)"] = (ProposerDriver(work), Batch(work))
        # the cost of the global_live source: every live output also in the global pool
        drivers["proposer, global pool + live"] = (ProposerDriver(
            work, (*LOCAL_SOURCES, "global", "global_live")), Batch(work))
        drivers["proposer, appends deferred"] = (ProposerDriver(
            work, LOCAL_SOURCES, pending, defer_appends=True), Batch(work))
        drivers["proposer, global + live, appends deferred"] = (ProposerDriver(
            work, (*LOCAL_SOURCES, "global", "global_live"), pending, defer_appends=True),
            Batch(work))
    if nat is not None:
        drivers["native step"] = (
            index_driver(nat.SuffixIndex, nat.Request, nat.step, work), Batch(work))
        drivers["native step, no live appends"] = (index_driver(
            nat.SuffixIndex, nat.Request,
            lambda *a: nat.step(*a, extend_index=False), work), Batch(work))
        drivers["native step, appends deferred"] = (index_driver(
            nat.SuffixIndex, nat.Request, nat.step, work, pending, nat.extend_requests),
            Batch(work))
        drivers["native classes, Python loop"] = (
            index_driver(nat.SuffixIndex, pybatch.Request, pybatch.step, work), Batch(work))
    drivers["python step"] = (
        index_driver(pyindex.SuffixIndex, pybatch.Request, pybatch.step, work), Batch(work))
    if arctic:
        drivers["arctic tree (Python loop)"] = (arctic_driver(work), Batch(work))
    ng = NgramDriver(size) if ngram else None
    if ng is not None:
        drivers["vLLM ngram (numba)"] = (ng, Batch(work))
    lat: dict[str, list[int]] = {}
    for name in drivers:
        lat[name] = []
        if "appends deferred" in name:
            lat[name + DEFERRED] = []
    clock = time.process_time_ns
    for _ in range(steps):
        for name, (fn, b) in drivers.items():
            new = b.emitted()
            if isinstance(fn, (NgramDriver, ProposerDriver)):
                fn.prepare(b)  # the runner's tables, updated before the drafter runs
            t0 = clock()
            b.drafts = fn(b, new)
            lat[name].append(clock() - t0)
            if pending:
                t0 = clock()
                pending.pop()()
                lat[name + DEFERRED].append(clock() - t0)
    out = {}
    for name in lat:
        b = drivers[name][1] if name in drivers else None
        xs = sorted(x / 1000.0 for x in lat[name][2:])  # the first steps warm caches up
        out[name] = {"median": statistics.median(xs), "p99": xs[int(0.99 * (len(xs) - 1))],
                     "acc": b.acc / (size * steps) if b is not None else float("nan")}
    if nat is not None:  # identical drafts: same accepted tokens, step by step
        for name in ("native step", "proposer (native)"):
            if name in out:
                same = drivers[name][1].acc == drivers["python step"][1].acc
                out[name]["same_as_python"] = same
    return out


MODEL_CONTEXT = 2048
"""KV tokens per running sequence assumed for the modelled forward beside the drafting cost
(the workload's responses are 1-4k tokens long)."""


def forward_lines(sizes: tuple[int, ...], draft_us: dict[int, float | None]) -> list[str]:
    """Per batch size, the engine-time model's decode forward (H100 and H200, 8B model, B
    sequences of `MODEL_CONTEXT` KV tokens) without drafts (1 token each) and verifying k
    drafted tokens each, beside the measured drafting cost and its share of the step with
    the draft-free forward (the larger share): what a GPU host adds to every engine step
    (MODELLED forwards, measured drafting)."""
    from bubblespec.core.engine_time import EngineTime

    head = (f"modelled decode forward (8B model, {MODEL_CONTEXT} KV tokens per sequence; 1 / "
            f"1 + {K} tokens per sequence) beside the measured drafting:")
    out = [head]
    for size in sizes:
        cells = []
        d = draft_us.get(size)
        for gpu in ("h100", "h200"):
            et = EngineTime.preset(gpu)
            one = et.forward(size, size * MODEL_CONTEXT) * 1e6
            full = et.forward(size * (1 + K), size * MODEL_CONTEXT) * 1e6
            share = "" if d is None else f" (drafting {100 * d / (one + d):.1f}% of the step)"
            cells.append(f"{gpu} {one / 1e3:.2f} / {full / 1e3:.2f} ms{share}")
        out.append(f"  B={size}: " + "; ".join(cells))
    return out


def run_bench(sizes: tuple[int, ...] = (64, 256, 1024), steps: int = 40, seed: int = 0,
              suffix_groups: int = 64, arctic: bool = True, ngram: bool = True) -> None:
    """Print the suffix rows with the native matcher, the per-step table and the last line."""
    if load_native() is None:
        print("bubblespec_native is not installed (make install builds it): native rows "
              "missing")
    arctic = arctic and sb.arctic_available()
    try:
        import vllm  # noqa: F401
        have_vllm = True
    except ImportError:
        have_vllm = False
    ngram = ngram and have_vllm
    print(f"affinity: cores {sorted(os.sched_getaffinity(0))}; load average "
          f"{os.getloadavg()[0]:.2f}")
    if suffix_groups and load_native() is not None:
        suffix_rows(suffix_groups, seed, arctic)
    print(f"\nper-engine-step drafting cost (process CPU time), {steps} steps (first 2 left out), "
          f"{STORED} finished + {SIBS} running responses per group, k={K}, depth {sb.DEPTH}")
    hdr = f"{'batch':>6}  {'implementation':<52}{'median us':>11}{'p99 us':>11}{'acc/req-step':>13}"
    print(hdr)
    print("-" * len(hdr))
    res = {}
    for size in sizes:
        res[size] = measure(size, steps, seed, arctic, ngram, have_vllm)
        for name, r in res[size].items():
            same = {True: "  drafts = python", False: "  DRAFTS DIFFER"}.get(
                r.get("same_as_python"), "")
            print(f"{size:>6}  {name:<52}{r['median']:>11.1f}{r['p99']:>11.1f}"
                  + (f"{r['acc']:>13.3f}" if r["acc"] == r["acc"] else f"{'-':>13}")
                  + same)
    print(f"load average after: {os.getloadavg()[0]:.2f}")

    def fig(size: int, name: str) -> str:
        r = res.get(size, {}).get(name)
        return "n/a" if r is None else f"{r['median']:.1f}"
    main = next((n for n in ("proposer (native)", "native step", "python step")
                 if n in res.get(sizes[0], {})), "python step")
    print(f"draft cost per step: {main}")
    for line in forward_lines(sizes, {s: r.get(main, {}).get("median") for s, r in res.items()}):
        print(line)
    print("draft_cost_per_step_us: " + " ".join(f"b{s}={fig(s, main)}" for s in sizes)
          + f" arctic_b256={fig(256, 'arctic tree (Python loop)')}")
