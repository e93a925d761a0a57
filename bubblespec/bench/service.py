"""`bubblespec bench service` (`make bench`): the same GRPO schedule under each rollout mode.

    bubblespec bench service [--steps 6] [--prompts 8] [--n 8] [--modes nospec,ngram,...]
                             [--model DIR] [--out out/bench]

Each mode gets its own fresh 2-rank `LocalCluster` (one at a time) and runs, in order:
1. greedy check: `--greedy-prompts` prompts x 2 samples at temperature 0 with the initial
   weights (token ids must be identical across modes);
2. the GRPO schedule of `bubblespec train-demo` (same prompts, seeds, steps, learning rate;
   by default the prompt batches repeat every 3 steps, i.e. 2 epochs of 3 batches):
   rollout at temperature 1.0 -> reward -> `Trainer.step` -> save -> `update_weights`.
   Modes with pre-generation (bubblespec, bubblespec-keyed) pass the next step's prompts
   ahead; the baselines do not (no pre-gen work competes with them).

Modes: nospec; ngram (vLLM); suffix (vLLM + arctic-inference; skipped if not importable);
history (bubblespec drafts from the same prompt's earlier responses only); bubblespec
(pre-gen + siblings + self, no history); bubblespec-keyed (same, `seed_mode: keyed`).
Figures and definitions: `bubblespec.bench.modes`. Critical-path decode steps = max over
ranks of that rank's engine forward passes in the step (the ranks report them).

Writes `<out>/bench.json`, `<out>/lengths.json` (nospec response lengths by prompt, for
`bubblespec simulate --lengths`), `<out>/critical_path.png`, `<out>/timeline.png`. The last
line printed is `critical_path_decode_step_reduction: ...`.
"""

from __future__ import annotations

import importlib.util
import json
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bubblespec.bench.modes import (
    BASELINE,
    BenchDoc,
    Mode,
    format_table,
    greedy_agreement,
    lengths_doc,
    totals,
)


@dataclass(frozen=True)
class ServiceBenchConfig:
    """What `bubblespec bench service` runs (its flags; defaults and help in its `--help`)."""

    steps: int
    prompts: int
    n: int
    seed: int
    epoch_steps: int
    lr: float
    temperature: float
    greedy_prompts: int
    modes: str
    ranks: int
    extra_rank_args: str
    model: str | None
    out: str
    timeline_step: int
    task: str = "addchain"
    loss_agg: str = "seq-mean"


def run_mode(mode: Mode, args: ServiceBenchConfig, model_dir: str, task: Any
             ) -> dict[str, Any]:
    """One mode on its own fresh cluster: the greedy check, then the GRPO schedule."""
    from bubblespec.cluster import LocalCluster

    t0 = time.monotonic()
    log_dir = Path(args.out) / "logs" / mode.name
    log_dir.mkdir(parents=True, exist_ok=True)
    rank_args = [*mode.rank_args, *args.extra_rank_args.split()]
    with LocalCluster(ranks=args.ranks, model=model_dir, rank_args=rank_args,
                      sync_args=list(mode.sync_args), log_dir=log_dir) as cluster:
        start_s = time.monotonic() - t0
        print(f"[{mode.name}] cluster ready in {start_s:.0f} s ({' '.join(rank_args)})",
              flush=True)
        res = run_schedule(cluster.gateway_url, mode, args, model_dir, task)
    res.update(rank_args=rank_args, cluster_start_s=start_s,
               mode_wall_s=time.monotonic() - t0)
    return res


def run_schedule(gateway_url: str, mode: Mode, args: ServiceBenchConfig, model_dir: str,
                 task: Any, min_train_s: float = 0.0, reset_weights: bool = False
                 ) -> dict[str, Any]:
    """One mode's greedy check and GRPO schedule on a running cluster. `reset_weights`:
    first load `model_dir` back (version 0, forced), for a cluster a previous mode trained;
    `min_train_s`: each training window lasts at least this long (`run_grpo`)."""
    from bubblespec.client import BubbleSpecClient
    from bubblespec.train.schedule import HEADER, run_grpo

    with BubbleSpecClient(gateway_url) as client:
        client.wait_ready(timeout_s=300)
        if reset_weights:
            client.update_weights(model_dir, version=0, force=True)
        gp = task.make_prompts(args.greedy_prompts, 10_000 + args.seed)
        g = client.rollout(gp, n=2, sampling_params={
            "temperature": 0.0, "max_new_tokens": task.max_new_tokens,
            "seed_mode": mode.seed_mode}, pregen=False)
        greedy = g.output_ids()
        sampling = {"temperature": args.temperature, "max_new_tokens": task.max_new_tokens,
                    "seed_mode": mode.seed_mode}
        print(HEADER, flush=True)
        steps = run_grpo(client, task, model_dir, args.steps, args.prompts, args.n,
                         sampling, seed=args.seed, lr=args.lr, pregen=mode.pregen,
                         epoch_steps=args.epoch_steps, pregen_window=mode.pregen_window,
                         work_dir=str(Path(args.out) / "weights" / mode.name),
                         log=lambda s: print(f"[{mode.name}] {s}", flush=True),
                         min_train_s=min_train_s, lookahead=mode.lookahead,
                         loss_agg=args.loss_agg)
    return {"pregen": mode.pregen, "seed_mode": mode.seed_mode, "lookahead": mode.lookahead,
            "pregen_window": mode.pregen_window, "greedy_output_ids": greedy,
            "steps": steps, "totals": totals(steps)}


def plot_critical(results: dict[str, Any], path: Path) -> None:
    """Critical-path decode steps per step, one line per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in results.items():
        if r.get("steps"):
            ax.plot([s["step"] for s in r["steps"]],
                    [s["decode_steps_critical"] for s in r["steps"]], "o-", label=name)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("critical-path decode steps\n(slowest rank's forward passes)")
    ax.set_ylim(bottom=0)
    ax.set_title("Critical-path decode steps per step, by rollout mode (measured)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_timeline(results: dict[str, Any], step: int, path: Path) -> None:
    """Per-rank bars of one step: decode (busy), pre-gen and idle seconds, per mode. Drawn
    from the synchronizer's per-rank totals (decode first, then the bubble: pre-gen, idle)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    for name, r in results.items():
        st = r.get("steps") or []
        if step < len(st):
            for rank, b in sorted(st[step]["bubble"].items()):
                rows.append((f"{name}/{rank}", b))
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    colors = {"decode": "tab:blue", "pre-gen": "tab:orange", "idle": "lightgray"}
    for i, (label, b) in enumerate(rows):
        busy, pg, idle = (b.get("busy_s") or 0), (b.get("pregen_s") or 0), (b.get("idle_s") or 0)
        left = 0.0
        for kind, w in (("decode", busy), ("pre-gen", pg), ("idle", idle)):
            ax.barh(i, w, left=left, color=colors[kind], label=kind if i == 0 else None)
            left += w
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since step open")
    ax.set_title(f"Per-rank time in GRPO step {step} (measured; decode, then bubble)")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_bench(args: ServiceBenchConfig, model_dir: str, modes: Sequence[Mode]
              ) -> dict[str, Any]:
    """Every mode in turn (a failed or skipped mode is recorded, not fatal); writes the
    files, prints the summary and returns the bench document."""
    from bubblespec.tasks import make_task

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    task = make_task(args.task, model_dir)
    config: dict[str, Any] = asdict(args)
    config["model"] = model_dir
    doc = BenchDoc(config=config)
    t_all = time.monotonic()
    for mode in modes:
        if mode.needs and importlib.util.find_spec(mode.needs) is None:
            print(f"[{mode.name}] skipped: {mode.needs} not importable", flush=True)
            doc.modes[mode.name] = {"skipped": f"{mode.needs} not importable"}
            continue
        try:
            doc.modes[mode.name] = run_mode(mode, args, model_dir, task)
        except Exception as e:  # noqa: BLE001 (one failed mode must not lose the others)
            traceback.print_exc()
            doc.modes[mode.name] = {"skipped": f"failed: {type(e).__name__}: {e}"}
        (out / "bench.json").write_text(json.dumps(doc.as_dict(), indent=1))
    doc.greedy = greedy_agreement({k: v.get("greedy_output_ids") for k, v in doc.modes.items()})
    base = doc.modes.get(BASELINE, {})
    if base.get("steps"):
        (out / "lengths.json").write_text(json.dumps(lengths_doc(
            base["steps"], "bubblespec bench service, nospec mode, all steps, response tokens")))
    d = doc.as_dict()
    (out / "bench.json").write_text(json.dumps(d, indent=1))
    try:
        plot_critical(doc.modes, out / "critical_path.png")
        plot_timeline(doc.modes, args.timeline_step, out / "timeline.png")
        plots = "critical_path.png, timeline.png"
    except ImportError:
        plots = "no plots (matplotlib missing)"
    print()
    print(format_table(doc.modes))
    g = d["greedy_check"]
    print(f"\ngreedy check (temperature 0, initial weights, reference {g.get('reference')}): "
          + ", ".join(f"{k}: {'identical' if v['identical'] else str(v['differing_sequences']) + '/' + str(v['sequences']) + ' differ'}"
                      for k, v in g.get("modes", {}).items()))
    print("sampled check (mean reward over all steps +- sem, vs nospec within 3 sem): "
          + ", ".join(f"{k}: {v['mean_reward']:.3f}+-{v['sem']:.3f}"
                      + ("" if "within_noise" not in v else
                         (" ok" if v["within_noise"] else " DIFFERS"))
                      for k, v in d["reward_check"].items()))
    if d["keyed_check"]:
        print("keyed check (sampled token ids at T=1.0 vs keyed sampling without speculation, "
              "every step): " + ", ".join(
                  f"{k}: {v['identical_steps']}/{v['steps']} steps identical"
                  for k, v in d["keyed_check"].items()))
    print(f"wrote {out}/bench.json, lengths.json, {plots} in {time.monotonic() - t_all:.0f} s")
    print(d["final_line"], flush=True)
    return d
