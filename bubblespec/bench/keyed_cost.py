"""`bubblespec bench keyed-cost` (`make bench-keyed-cost`): keyed sampling vs vLLM's sampler.

What the keyed sampler (`seed_mode: keyed`, `bubblespec.engine.keyed`) costs a vLLM engine,
measured whole-engine: one engine per speculation mode (`--spec-modes`, default none and
bubblespec with its live sources: siblings and the request's own context; no pre-generated
drafts), and on it, at each batch size (`--sizes` concurrent requests = size / n prompts x
`--n` samples), the very same requests under three arms:

- ``default_seeded``: vLLM's sampler, one seed per sample (what a gateway rollout runs today
  outside hand-off steps: the gateway derives seeds when the trainer gives none);
- ``default_unseeded``: vLLM's sampler without seeds (a batched noise draw, no generators);
- ``keyed``: keyed Gumbel noise per (seed, position), the same seeds.

Every sample generates exactly `--max-new-tokens` tokens (``ignore_eos``, temperature 1), so
every arm decodes the same number of tokens. Arms are interleaved (their order rotates every
repeat) and each (size, arm) runs `--repeats` times after one warm-up run per arm; figures
are medians with their spread (min..max). Per run: wall time, decode steps (the engine
forwards that emitted tokens, per sample; the batch's engine steps are taken as the longest
sample's, all samples running together), ms per engine step, generated tokens per second.
The keyed arm's keyed outputs must be the same in every repeat and under every speculation
mode (bit-reproducible): the run records whether they were.

Wall clock on a CPU engine whose forward (tiny model, vocabulary 208) is cheap, so the
sampler's share is larger here than on a GPU host with an 8B model; the summary also relates
the measured extra ms per step to the engine-time model's MODELLED H100 8B decode step at the
same batch sizes (`bubblespec.core.engine_time`). The keyed noise itself at a 128k vocabulary
is timed apart, as plain torch ops, by `python -m bubblespec.bench.keyed_noise_gpu`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bubblespec.core.engine_time import MODEL_VOCAB, EngineTime
from bubblespec.engine import EngineConfig, GenRequest, SpecMode
from bubblespec.protocol.sampling import SamplingParams, SeedMode
from bubblespec.tasks import default_model_dir, default_task

ARMS = ("default_seeded", "default_unseeded", "keyed")
BASELINE = "default_seeded"
"""The arm keyed replaces (seeded vLLM sampling: gateway rollouts derive seeds)."""
MODEL_CONTEXTS = (1024, 4096)
"""Context tokens per sequence at which the MODELLED GPU step is given."""


@dataclass(frozen=True)
class KeyedCostConfig:
    """What `bubblespec bench keyed-cost` runs (its flags; help in its `--help`)."""

    sizes: tuple[int, ...] = (64, 256)
    n: int = 8
    max_new_tokens: int = 128
    repeats: int = 5
    spec_modes: tuple[str, ...] = ("none", "bubblespec")
    seed: int = 0
    model: str = ""
    out: str = ""
    arms: tuple[str, ...] = field(default=ARMS)


def make_requests(cfg: KeyedCostConfig, size: int, arm: str) -> list[GenRequest]:
    """`size` concurrent requests (size / n prompts x n samples) of one arm: the prompts,
    lengths and seeds are the same for every arm (the unseeded arm drops the seeds)."""
    task = default_task()
    prompts = task.make_prompts(size // cfg.n, seed=cfg.seed + size)
    mode = SeedMode.KEYED if arm == "keyed" else SeedMode.DEFAULT
    sp = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=1.0, ignore_eos=True,
                        seed_mode=mode)
    return [GenRequest(input_ids=list(p.input_ids), n=cfg.n, sampling=sp,
                       seeds=(None if arm == "default_unseeded" else
                              [cfg.seed * 1_000_003 + i * 1_009 + j for j in range(cfg.n)]),
                       group=f"kc-{size}-{i}")
            for i, p in enumerate(prompts)]


def workload_id(reqs: list[GenRequest]) -> str:
    """What every arm must share: prompts, samples per prompt, lengths (not the seeds)."""
    h = hashlib.sha256()
    for r in reqs:
        h.update(json.dumps([r.input_ids, r.n, r.sampling.max_new_tokens]).encode())
    return h.hexdigest()[:16]


def outputs_id(results: list) -> str:
    h = hashlib.sha256()
    for r in results:
        for s in r.samples:
            h.update(json.dumps(list(s.output_ids)).encode())
    return h.hexdigest()[:16]


def summarise_run(spec: str, size: int, arm: str, rep: int, reqs: list[GenRequest],
                  results: list, secs: float) -> dict:
    samples = [s for r in results for s in r.samples]
    steps = [s.decode_steps for s in samples]
    toks = sum(len(s.output_ids) for s in samples)
    engine_steps = max(steps) if steps else 0
    return {"spec": spec, "size": size, "arm": arm, "repeat": rep,
            "workload": workload_id(reqs), "outputs": outputs_id(results),
            "requests": len(samples), "tokens": toks, "decode_steps": sum(steps),
            "engine_steps": engine_steps,
            "accepted": sum(s.num_accepted_tokens for s in samples),
            "draft_tokens": sum(s.num_draft_tokens for s in samples), "wall_s": secs,
            "ms_per_step": 1e3 * secs / max(engine_steps, 1), "tokens_per_s": toks / secs}


def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def modelled_step_ms(size: int, context: int, gpu: str = "h100") -> float:
    """MODELLED decode step (one token per sequence, no drafts) of an 8B model, ms."""
    return 1e3 * EngineTime.preset(gpu).forward(tokens=size, context=size * context)


def modelled_keyed_device_ms(size: int, drafted_per_step: float, gpu: str = "h100") -> float:
    """MODELLED device time of the keyed kernels of one engine step on `gpu` (fused kernel,
    `EngineTime.keyed_kernel_s`): `size` sampled rows plus the drafted positions verified,
    each row of logits as wide as the modelled model's vocabulary; one sampler call and,
    with drafts, one verifier call."""
    from bubblespec.engine.keyed_kernels import FUSED_STEP_LAUNCHES

    calls = 1 + (drafted_per_step > 0)
    return 1e3 * EngineTime.preset(gpu).keyed_kernel_s(
        (size + drafted_per_step) * MODEL_VOCAB, calls * FUSED_STEP_LAUNCHES)


def summarise(runs: list[dict], cfg: KeyedCostConfig) -> dict:
    """Per (spec mode, size, arm): medians and spreads; keyed's extra per step vs the
    baseline arm, and that extra as a share of the MODELLED GPU step."""
    rows = []
    for spec in cfg.spec_modes:
        for size in cfg.sizes:
            cell = {a: [r for r in runs if (r["spec"], r["size"], r["arm"]) == (spec, size, a)]
                    for a in cfg.arms}
            if not all(cell.values()):
                continue
            row: dict = {"spec": spec, "size": size,
                         "same_workload": len({r["workload"] for a in cell.values()
                                               for r in a}) == 1,
                         "same_tokens": len({r["tokens"] for a in cell.values()
                                             for r in a}) == 1}
            for a, rs in cell.items():
                row[a] = {k: _spread([r[k] for r in rs])
                          for k in ("ms_per_step", "tokens_per_s", "wall_s", "engine_steps")}
            if "keyed" in cell:
                row["keyed_reproducible"] = len({r["outputs"] for r in cell["keyed"]}) == 1
            if "keyed" in cell and BASELINE in cell:
                k, b = row["keyed"], row[BASELINE]
                extra = k["ms_per_step"]["median"] - b["ms_per_step"]["median"]
                row["keyed_extra_ms_per_step"] = extra
                row["keyed_step_ratio"] = k["ms_per_step"]["median"] / b["ms_per_step"]["median"]
                row["keyed_throughput_ratio"] = (k["tokens_per_s"]["median"]
                                                 / b["tokens_per_s"]["median"])
                row["modelled_h100_step_ms"] = {c: modelled_step_ms(size, c)
                                                for c in MODEL_CONTEXTS}
                row["keyed_extra_share_of_modelled_step"] = {
                    c: extra / row["modelled_h100_step_ms"][c] for c in MODEL_CONTEXTS}
                # what a GPU rank is charged: the measured host extra here (it also holds
                # this CPU's run of the small-vocabulary kernels: an over-charge) plus the
                # fused kernels' modelled device time at the modelled model's vocabulary
                ks = cell["keyed"]
                drafted = statistics.median(r.get("draft_tokens", 0) / max(r["engine_steps"], 1)
                                            for r in ks)
                device = modelled_keyed_device_ms(size, drafted)
                row["keyed_drafted_per_step"] = drafted
                row["keyed_device_modelled_ms"] = device
                row["keyed_charged_ms"] = max(extra, 0.0) + device
                row["keyed_charged_share_of_modelled_step"] = {
                    c: row["keyed_charged_ms"] / row["modelled_h100_step_ms"][c]
                    for c in MODEL_CONTEXTS}
            rows.append(row)
    keyed_ids = {}
    for r in runs:
        if r["arm"] == "keyed":
            keyed_ids.setdefault(r["size"], set()).add(r["outputs"])
    return {"rows": rows,
            "keyed_same_across_spec_modes": all(len(v) == 1 for v in keyed_ids.values())}


def format_table(summary: dict) -> list[str]:
    lines = [(f"{'spec':<11}{'size':>5}  {'arm':<17}{'ms/step':>9} {'(min..max)':<16}"
              f"{'tok/s':>8} {'steps':>6}")]
    for row in summary["rows"]:
        for a in ARMS:
            if a not in row:
                continue
            m, t, s = row[a]["ms_per_step"], row[a]["tokens_per_s"], row[a]["engine_steps"]
            lines.append(f"{row['spec']:<11}{row['size']:>5}  {a:<17}{m['median']:>9.2f} "
                         f"({m['min']:.2f}..{m['max']:.2f}){'':<2}{t['median']:>8.0f} "
                         f"{s['median']:>6.0f}")
        if "keyed_extra_ms_per_step" in row:
            shares = " ".join(f"ctx{c}={100 * v:.1f}%" for c, v in
                              row["keyed_extra_share_of_modelled_step"].items())
            model = " ".join(f"ctx{c}={v:.1f}ms" for c, v in
                             row["modelled_h100_step_ms"].items())
            lines.append(f"  keyed vs {BASELINE}: {row['keyed_extra_ms_per_step']:+.2f} ms/step "
                         f"(x{row['keyed_step_ratio']:.3f} per step, throughput "
                         f"x{row['keyed_throughput_ratio']:.3f}); MODELLED H100 8B step "
                         f"{model}: extra = {shares}; same workload "
                         f"{row['same_workload']}, keyed reproducible "
                         f"{row.get('keyed_reproducible')}")
            charged = " ".join(f"ctx{c}={100 * v:.1f}%" for c, v in
                               row["keyed_charged_share_of_modelled_step"].items())
            lines.append(f"  charged on a GPU rank: host {max(row['keyed_extra_ms_per_step'], 0):.2f}"
                         f" ms + MODELLED fused kernels {row['keyed_device_modelled_ms']:.2f} ms "
                         f"({row['keyed_drafted_per_step']:.0f} drafted positions/step, vocab "
                         f"{MODEL_VOCAB}) = {row['keyed_charged_ms']:.2f} ms/step = {charged} "
                         f"of the MODELLED step (target <= 3%)")
    lines.append(f"keyed outputs identical across spec modes: "
                 f"{summary['keyed_same_across_spec_modes']}")
    return lines


def machine() -> dict:
    import torch

    return {"platform": platform.platform(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}


async def run(cfg: KeyedCostConfig) -> dict:
    """Every spec mode's engine, every size and arm `repeats` times, interleaved; prints the
    table and returns (and with `out` writes) the document."""
    from bubblespec.engine.engine import RolloutEngine

    model = cfg.model or str(default_model_dir())
    runs: list[dict] = []
    doc = {"config": asdict(cfg), "model": model, "machine": machine(), "runs": runs}
    for spec in cfg.spec_modes:
        ecfg = EngineConfig(model=model, spec_mode=spec, max_num_seqs=max(cfg.sizes),
                            sources="siblings,self")
        eng = await RolloutEngine.start(ecfg)
        try:
            for rep in range(-1, cfg.repeats):  # -1: warm-up, not recorded
                order = list(cfg.arms[rep % len(cfg.arms):] + cfg.arms[:rep % len(cfg.arms)])
                for size in cfg.sizes:
                    for arm in order:
                        reqs = make_requests(cfg, size, arm)
                        t = time.monotonic()
                        res = await eng.generate(reqs)
                        secs = time.monotonic() - t
                        if ecfg.spec_mode != SpecMode.NONE:
                            await eng.release_groups([r.group_key() for r in reqs])
                        if rep < 0:
                            continue
                        runs.append(summarise_run(spec, size, arm, rep, reqs, res, secs))
                        r = runs[-1]
                        print(f"{spec} size={size} {arm} rep={rep}: {r['wall_s']:.2f} s, "
                              f"{r['engine_steps']} steps, {r['ms_per_step']:.2f} ms/step, "
                              f"{r['tokens_per_s']:.0f} tok/s", flush=True)
        finally:
            await eng.shutdown()
    doc["summary"] = summarise(runs, cfg)
    print("\n" + "\n".join(format_table(doc["summary"])))
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(json.dumps(doc, indent=1))
        print(f"wrote {cfg.out}")
    return doc
