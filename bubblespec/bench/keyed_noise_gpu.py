"""The keyed sampler's noise alone, as plain torch ops, at batch sizes.

    python -m bubblespec.bench.keyed_noise_gpu --device cuda            # e.g. on an H200
    python -m bubblespec.bench.keyed_noise_gpu --device cpu --vocab 208,131072

Needs torch and a checkout of bubblespec, not vLLM (the engine's keyed kernels import only
torch and numpy). Per (rows, vocab) it times, on float32 logits of that shape, each as one
engine step would:

- ``vllm_unseeded``: vLLM's random sampling (softmax, exponential noise, probs / q, argmax:
  ``vllm.v1.sample.ops.topk_topp_sampler.random_sample``) with no per-request generator;
- ``vllm_seeded``: the same with one ``torch.Generator`` per row (vLLM then draws each
  seeded row's noise on its own, in a Python loop: what seeded requests cost);
- ``keyed_noise``: bubblespec's keyed argmax (``bubblespec.engine.keyed_kernels.keyed_argmax_eager``:
  SplitMix64 uniforms of one key per row over the vocabulary in int64, Gumbel in float64,
  argmax of logits + noise);
- ``keyed_extra``: what the engine's keyed sampler adds to a step of all-keyed rows on top of
  vLLM's sampler, which still runs (``engine/keyed.py`` ``_wrap_sample``): a copy of the
  logits, the row gather and ``keyed_noise``;
- ``keyed_verify_rows`` (``--drafts K`` > 0): the engine's keyed verification of a
  speculative step (``engine/keyed.py`` ``_verify``, which runs beside vLLM's rejection
  sampler): per row, ``keyed_argmax`` over its K drafted positions and a ``.tolist()`` (a
  device sync on a GPU), row after row;
- ``keyed_compiled`` (``--compile``): ``keyed_noise`` through ``torch.compile`` (one fused
  kernel on CUDA): what a fused keyed sampler would cost, not what the engine runs today.

Timing: ``--warmup`` calls, then ``--repeats`` calls, each synchronised (CUDA) and timed
on its own; the median and the interquartile range in ms per call are printed and, with
``--out``, written as JSON. ``--check`` verifies the torch noise against bubblespec's numpy
reference (``bubblespec.core.keyed_noise``).
``--count-bytes`` counts, instead of timing, the elementwise kernels and the bytes they read
and write per (row x vocab) element in eager mode (the memory traffic a GPU must move).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from bubblespec.engine import keyed_kernels

uniforms_of_keys = keyed_kernels.uniforms_of_keys
keyed_argmax = keyed_kernels.keyed_argmax_eager
"""The engine's own keyed noise and argmax (its eager twin): SplitMix64 has one home per
dtype (numpy: `core/keyed_noise`, torch: `engine/keyed_kernels`, Python ints:
`core/context_keys`)."""


def vllm_random_sample(logits: torch.Tensor, generators: dict[int, torch.Generator]
                       ) -> torch.Tensor:
    """vLLM's `random_sample` after its softmax (float32 noise, the default)."""
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs)
    if len(generators) != probs.shape[0]:
        q.exponential_()
    for i, gen in generators.items():
        q[i].exponential_(generator=gen)
    return probs.div_(q).argmax(dim=-1).view(-1)


def keyed_extra(logits: torch.Tensor, keys: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """The engine's keyed additions to a sampler step whose rows are all keyed."""
    keep = logits.clone()
    return keyed_argmax(keep[idx], keys)


def keyed_verify_rows(target_logits: torch.Tensor, keys: torch.Tensor, rows: int,
                      drafts: int) -> list[list[int]]:
    """The keyed verifier's per-row loop: K drafted positions per row, one call each."""
    return [keyed_argmax(target_logits[r * drafts:(r + 1) * drafts],
                         keys[r * drafts:(r + 1) * drafts]).tolist() for r in range(rows)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int
            ) -> dict[str, float]:
    """Median and quartiles of `repeats` synchronised calls, ms."""
    for _ in range(warmup):
        fn()
    _sync(device)
    ms = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        _sync(device)
        ms.append((time.perf_counter() - t) * 1e3)
    q = statistics.quantiles(ms, n=4) if len(ms) > 1 else [ms[0]] * 3
    return {"median_ms": statistics.median(ms), "q1_ms": q[0], "q3_ms": q[2], "n": len(ms)}


def bench_shape(rows: int, vocab: int, device: torch.device, warmup: int, repeats: int,
                compiled: Callable | None = None, drafts: int = 0) -> dict[str, object]:
    """Every arm at one (rows, vocab)."""
    gen = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(rows, vocab, generator=gen, device=device) * 3
    keys = torch.randint(-(1 << 62), 1 << 62, (rows,), generator=gen, device=device)
    idx = torch.arange(rows, device=device)
    gens = {i: torch.Generator(device=device).manual_seed(i) for i in range(rows)}
    arms: dict[str, Callable[[], object]] = {
        "vllm_unseeded": lambda: vllm_random_sample(logits, {}),
        "vllm_seeded": lambda: vllm_random_sample(logits, gens),
        "keyed_noise": lambda: keyed_argmax(logits, keys),
        "keyed_extra": lambda: keyed_extra(logits, keys, idx),
    }
    if drafts > 0:
        spec = torch.randn(rows * drafts, vocab, generator=gen, device=device)
        spec_keys = torch.randint(-(1 << 62), 1 << 62, (rows * drafts,), generator=gen,
                                  device=device)
        arms["keyed_verify_rows"] = lambda: keyed_verify_rows(spec, spec_keys, rows, drafts)
    if compiled is not None:
        arms["keyed_compiled"] = lambda: compiled(logits, keys)
    out: dict[str, object] = {"rows": rows, "vocab": vocab}
    for name, fn in arms.items():  # interleaving would mix caches on CPU: arm by arm
        out[name] = time_fn(fn, device, warmup, repeats)
    return out


def count_bytes(vocab: int = 131072, rows: int = 4) -> dict[str, float]:
    """Kernels and bytes read + written per (row x vocab) element by `keyed_argmax` and by
    vLLM's unseeded `random_sample` in eager mode (CPU tensors; the same ops run on CUDA)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.kernels, self.bytes = 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            big = [t for t in (*args, *(kwargs or {}).values(), out)
                   if isinstance(t, torch.Tensor) and t.numel() >= rows * vocab // 2]
            if big:
                self.kernels += 1
                self.bytes += sum(t.numel() * t.element_size() for t in big)
            return out

    logits = torch.randn(rows, vocab)
    keys = torch.arange(rows, dtype=torch.long)
    res = {}
    for name, fn in (("keyed_noise", lambda: keyed_argmax(logits, keys)),
                     ("keyed_extra", lambda: keyed_extra(logits, keys, torch.arange(rows))),
                     ("vllm_unseeded", lambda: vllm_random_sample(logits, {}))):
        with Count() as c:
            fn()
        res[f"{name}_kernels"] = c.kernels
        res[f"{name}_bytes_per_element"] = c.bytes / (rows * vocab)
    return res


def check_reference(vocab: int = 4096) -> bool:
    """The torch noise against bubblespec's numpy reference, bit for bit."""
    import numpy as np

    from bubblespec.core import keyed_noise as ref

    keys = [int(ref.position_key(s, t)) for s, t in ((1, 0), (2**40 + 7, 5), (3, 99))]
    got = uniforms_of_keys(torch.tensor([keyed_kernels.i64(k) for k in keys]), vocab).numpy()
    return all(np.array_equal(got[i], ref.uniforms_of_key(k, vocab)) for i, k in enumerate(keys))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rows", default="64,256", help="batch rows (running requests)")
    p.add_argument("--vocab", default="131072", help="vocabulary sizes (e.g. 208,131072)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--drafts", type=int, default=4,
                   help="drafted tokens per row of the verifier arm (0: skip it)")
    p.add_argument("--compile", action="store_true", help="also time torch.compile(keyed)")
    p.add_argument("--check", action="store_true", help="check against the numpy reference")
    p.add_argument("--count-bytes", action="store_true", help="count bytes, time nothing")
    p.add_argument("--out", default="", help="also write the figures (JSON)")
    a = p.parse_args(argv)
    if a.check:
        ok = check_reference()
        print("check against bubblespec.core.keyed_noise: " + ("ok" if ok else "MISMATCH"))
        if not ok:
            return 1
    if a.count_bytes:
        res = count_bytes(int(a.vocab.split(",")[0]))
        print(json.dumps(res, indent=1))
        if a.out:
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1)
        return 0
    device = torch.device(a.device)
    compiled = torch.compile(keyed_argmax) if a.compile else None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    doc: dict[str, object] = {"device": name, "torch": torch.__version__,
                              "threads": torch.get_num_threads(), "shapes": []}
    print(f"device {name}, torch {torch.__version__}; ms per call: median [q1, q3]")
    for vocab in (int(v) for v in a.vocab.split(",") if v):
        for rows in (int(r) for r in a.rows.split(",") if r):
            res = bench_shape(rows, vocab, device, a.warmup, a.repeats, compiled, a.drafts)
            doc["shapes"].append(res)  # type: ignore[union-attr]
            cells = "  ".join(f"{k}={v['median_ms']:.3f} [{v['q1_ms']:.3f}, {v['q3_ms']:.3f}]"
                              for k, v in res.items() if isinstance(v, dict))
            print(f"rows={rows} vocab={vocab}: {cells}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
