"""`bubblespec bench paced` (`make bench-paced`): the GRPO schedule on paced ranks.

    bubblespec bench paced [--ranks 8] [--pace h100] [--pace-scale 30] [--steps 3]
                           [--prompts 16] [--n 8] [--seeds 0] [--modes ...] [--out ...]

Every rank runs a paced engine (`bubblespec.engine.pace`): each forward lasts the simulator's
engine-time model of an 8B model on the named GPU x scale, so wall seconds / scale are
modelled GPU seconds whatever the contention on this machine's CPU cores. Each mode runs the
`bench service` schedule (`service.run_schedule`: greedy check, then rollout -> reward ->
train -> push weights per step). A cluster start takes minutes at 8 ranks, so modes with the
same rank arguments whose engines keep nothing across steps share one cluster
(`cluster_groups`; the weights are loaded back between them); suffix decoding, history and
bubblespec's global pool (on by default) keep responses across steps, so those modes get
their own. Each mode's paced-forward counters (GET /v1/pace of every rank, before
and after) and the peak RSS of every process of the bench (ranks, engines, synchronizer,
gateway; the trainer separately) are recorded.

Plain-sampling modes run once per seed of `--seeds` (their responses differ between modes,
so their crit/longest gets a confidence interval over steps and seeds); keyed modes run on
the first seed only (their tokens are those of keyed sampling without speculation, bit for
bit, so one run compares them on identical outputs). Figures: `paced_figures`. Writes
`<out>/paced.json` (a `paced_record.PacedDoc`, the record the calibration reads back),
`<out>/lengths.json` and `<out>/accept.json` (the measured lengths and
acceptance, for `bubblespec simulate`), `<out>/speedup.png`, `<out>/timeline.png`; prints
the per-mode table and per-step data, then the critical-path line, then last
`paced_rollout_speedup_vs_nospec: ...`.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from typing_extensions import Self

from bubblespec.bench.departures import departure_lines
from bubblespec.bench.modes import (
    BASELINE,
    KEYED_BASELINE,
    Mode,
    final_line,
    greedy_agreement,
    keyed_agreement,
    lengths_doc,
    mode_by_name,
    rank_sources,
    reductions,
)
from bubblespec.bench.paced_figures import (
    accept_doc,
    divergence_lines,
    format_cost_table,
    format_paced_table,
    mode_summary,
    paced_final_line,
    per_step_lines,
    position_lines,
    speedups,
)
from bubblespec.bench.paced_record import PacedDoc, run_scale
from bubblespec.bench.service import ServiceBenchConfig, plot_timeline, run_schedule
from bubblespec.bench.soak import descendants, read_rss_kib
from bubblespec.engine.pace import merge_stats, stats_delta
from bubblespec.protocol.sampling import PregenWindow, SeedMode
from bubblespec.train.pacing import rank_pace

HEADLINE_MODES = ("nospec,nospec-keyed,bubblespec,bubblespec-keyed,bubblespec-keyed-window,"
                  "suffix-keyed")
"""Modes of `make bench-paced` (fresh prompts): three cluster starts (their run time: docs/results.md)."""
ALL_FRESH_MODES = HEADLINE_MODES + ",suffix,ngram,ngram-keyed"
"""Every mode that fresh prompts can exercise (two more cluster starts; history modes need
epoch repeats)."""
REPEATS_MODES = ("nospec,nospec-keyed,history,history-keyed,bubblespec-history,"
                 "bubblespec-keyed-history")
"""Modes of the second run, with epoch repeats (`--epoch-steps`)."""


@dataclass(frozen=True)
class PacedBenchConfig:
    """What `bubblespec bench paced` runs (its flags; help in `bubblespec bench paced -h`)."""

    steps: int
    prompts: int
    n: int
    seeds: str
    epoch_steps: int
    lr: float
    temperature: float
    greedy_prompts: int
    modes: str
    ranks: int
    pace: str
    pace_scale: float
    kv_cache_mib: int
    train_window_s: float
    extra_rank_args: str
    model: str | None
    out: str
    timeline_step: int
    task: str = "addchain"
    loss_agg: str = "seq-mean"
    resume: bool = False
    mode_scales: str = ""
    """Per-mode pace scales, "mode=scale,..." (`--mode-scale`); the other modes run at
    `pace_scale`. A paced figure is wall seconds / the scale its mode ran at, so modes of one
    record may run at different scales: each mode needs a scale that keeps its own forwards
    from overrunning, and a mode that verifies many draft tokens a forward needs a larger one
    than the baseline, whose wall time grows with the scale."""

    def seed_list(self) -> list[int]:
        return [int(s) for s in self.seeds.split(",") if s.strip()]

    def scales(self) -> dict[str, float]:
        """`mode_scales` as a map (ValueError naming --mode-scale when malformed)."""
        out: dict[str, float] = {}
        for item in filter(None, (x.strip() for x in self.mode_scales.split(","))):
            name, eq, value = item.partition("=")
            try:
                scale = float(value) if eq and name else math.nan
            except ValueError:
                scale = math.nan
            if not scale > 0:
                raise ValueError(f"--mode-scale: expected MODE=SCALE with SCALE > 0, "
                                 f"got {item!r}")
            out[name.strip()] = scale
        return out

    def scale_of(self, mode: str) -> float:
        """The pace scale `mode` runs at."""
        return self.scales().get(mode, self.pace_scale)

    def service_config(self, seed: int, scale: float | None = None) -> ServiceBenchConfig:
        """The schedule's configuration for one seed, its ranks paced at `scale` (default
        `pace_scale`)."""
        scale = self.pace_scale if scale is None else scale
        pace = (f"--pace={self.pace} --pace-scale={scale} "
                f"--kv-cache-mib={self.kv_cache_mib} --engine-in-one-process --cpu-threads=1 "
                f"{self.extra_rank_args}")
        return ServiceBenchConfig(
            steps=self.steps, prompts=self.prompts, n=self.n, seed=seed,
            epoch_steps=self.epoch_steps, lr=self.lr, temperature=self.temperature,
            greedy_prompts=self.greedy_prompts, modes=self.modes, ranks=self.ranks,
            extra_rank_args=pace.strip(), model=self.model, task=self.task, out=self.out,
            timeline_step=self.timeline_step, loss_agg=self.loss_agg)


def read_pss_kib(pid: int) -> int:
    """Proportional set size of `pid` in KiB (shared pages split between their users, so
    the sum over processes is the memory they hold together; 0 once gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return 0
    return 0


class MemoryWatch:
    """Samples the RSS and PSS of this process's descendants (the cluster) and of this process
    (the trainer) every `every_s` seconds on a thread; keeps the peaks. RSS sums count the
    pages the processes share (torch, vLLM libraries) once per process; PSS sums do not."""

    def __init__(self, every_s: float = 2.0) -> None:
        self.every_s = every_s
        self.peak_cluster_kib = 0
        self.peak_cluster_pss_kib = 0
        self.peak_self_kib = 0
        self.peak_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            kids = descendants(me)
            total = sum(read_rss_kib(p) or 0 for p in kids)
            self.peak_cluster_kib = max(self.peak_cluster_kib, total)
            self.peak_cluster_pss_kib = max(self.peak_cluster_pss_kib,
                                            sum(read_pss_kib(p) for p in kids))
            self.peak_self_kib = max(self.peak_self_kib, read_rss_kib(me) or 0)
            self.peak_processes = max(self.peak_processes, len(kids))
            self._stop.wait(self.every_s)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def figures(self, ranks: int) -> dict[str, float]:
        cluster = self.peak_cluster_kib / 1024
        return {"peak_cluster_mib": cluster, "peak_trainer_mib": self.peak_self_kib / 1024,
                "peak_total_mib": cluster + self.peak_self_kib / 1024,
                "peak_per_rank_mib": cluster / max(1, ranks),
                "peak_cluster_pss_mib": self.peak_cluster_pss_kib / 1024,
                "peak_processes": self.peak_processes}


BRANCH_COUNTERS = {"bubblespec_pregen_branches_total": "made",
                   "bubblespec_pregen_branch_tokens_total": "tokens",
                   "bubblespec_pregen_branch_offers_streamed_total": "streamed"}


def branch_counters(metrics_text: str) -> dict[str, float]:
    """One rank's margin-branch counters from its /metrics text: branches decoded, the
    tokens they decoded (what branches cost the bubble) and offers streamed while their
    draft decoded."""
    sums = dict.fromkeys(BRANCH_COUNTERS.values(), 0.0)
    for line in metrics_text.splitlines():
        if (key := BRANCH_COUNTERS.get(line.split("{", 1)[0])) is not None:
            sums[key] += float(line.rsplit(" ", 1)[1])
    return sums


def rank_branches(cluster: Any) -> dict[str, int]:
    """Margin branches over all ranks (`branch_counters`) and those taken by a proposer
    because the output left its draft where a branch did (draft index `branches_taken`);
    counters since each rank started."""
    sums = dict.fromkeys([*BRANCH_COUNTERS.values(), "taken"], 0.0)
    for url in cluster.rank_urls.values():
        for k, v in branch_counters(httpx.get(url + "/metrics", timeout=10.0).text).items():
            sums[k] += v
        idx = httpx.get(url + "/v1/draft_index", timeout=10.0)  # not 200 without spec
        sums["taken"] += idx.json().get("branches_taken", 0) if idx.status_code == 200 else 0
    return {k: int(v) for k, v in sums.items()}


def shareable(mode: Mode, extra_rank_args: str = "") -> bool:
    """Whether a mode may run on a cluster a previous mode used: its engines keep nothing
    across steps (no speculation, vLLM's n-gram, bubblespec without history or global
    pool). vLLM's suffix decoding keeps a global tree of past responses, bubblespec's global
    pool (on by default) recent responses and history earlier steps' responses: those would
    draft from the previous mode's outputs."""
    sources = rank_sources([*mode.rank_args, *extra_rank_args.split()]) or ()
    return mode.needs == "" and "history" not in sources and "global" not in sources


def cluster_groups(modes: Sequence[Mode], extra_rank_args: str = "") -> list[list[Mode]]:
    """Modes in groups that share one cluster (same rank and synchronizer arguments,
    `shareable`), in the order of their first mode; a cluster start costs minutes at 8
    ranks."""
    groups: list[list[Mode]] = []
    by_args: dict[tuple[str, ...], list[Mode]] = {}  # rank args | synchronizer args
    for m in modes:
        share = shareable(m, extra_rank_args)
        key = (*m.rank_args, "|", *m.sync_args)
        if share and key in by_args:
            by_args[key].append(m)
            continue
        groups.append([m])
        if share:
            by_args[key] = groups[-1]
    return groups


def scaled_groups(modes: Sequence[Mode], cfg: PacedBenchConfig) -> list[list[Mode]]:
    """`cluster_groups` of the modes that run at one pace scale, scale by scale in the order
    of their first mode: a cluster's ranks are paced at one scale."""
    groups: list[list[Mode]] = []
    for scale in dict.fromkeys(cfg.scale_of(m.name) for m in modes):
        groups += cluster_groups([m for m in modes if cfg.scale_of(m.name) == scale],
                                 cfg.extra_rank_args)
    return groups


def run_group(group: Sequence[Mode], cfg: PacedBenchConfig, seed: int, model_dir: str,
              task: Any, out: dict[str, dict[str, Any]], save: Callable[[], None]) -> None:
    """The modes of one group on one fresh cluster, one after the other (weights loaded back
    between modes), its ranks paced at the group's scale; into `out` per mode its schedule's
    result plus its scale, paced counters and the cluster's peak memory so far, calling
    `save` after each mode."""
    from bubblespec.cluster import LocalCluster

    scale = cfg.scale_of(group[0].name)
    args = cfg.service_config(seed, scale)
    name = "+".join(m.name for m in group)
    log_dir = Path(cfg.out) / "logs" / f"seed{seed}" / name
    log_dir.mkdir(parents=True, exist_ok=True)
    rank_args = [*group[0].rank_args, *args.extra_rank_args.split()]
    t0 = time.monotonic()
    sync_args = list(group[0].sync_args)
    with MemoryWatch() as mem, LocalCluster(ranks=cfg.ranks, model=model_dir,
                                            rank_args=rank_args, sync_args=sync_args,
                                            log_dir=log_dir) as cluster:
        start_s = time.monotonic() - t0
        print(f"[{name}] cluster ready in {start_s:.0f} s ({' '.join(rank_args + sync_args)})",
              flush=True)
        for i, mode in enumerate(group):
            t1 = time.monotonic()
            window = cfg.train_window_s * scale if (
                mode.pregen_window == PregenWindow.TRAINING) else 0.0
            before, b_before = rank_pace(cluster.rank_urls), rank_branches(cluster)
            try:
                res = run_schedule(cluster.gateway_url, mode, args, model_dir, task,
                                   min_train_s=window, reset_weights=i > 0)
            except Exception as e:  # noqa: BLE001 (one failed mode must not lose the others)
                traceback.print_exc()
                out[mode.name] = {"skipped": f"failed: {type(e).__name__}: {e}"}
                save()
                continue
            after, b_after = rank_pace(cluster.rank_urls), rank_branches(cluster)
            per_rank = {r: stats_delta(after[r], before[r]) for r in after}
            sources = rank_sources(rank_args)
            res.update(rank_args=rank_args, sync_args=sync_args, cluster_start_s=start_s,
                       sources=None if sources is None else list(sources),
                       pace_scale=scale,
                       branches={k: b_after[k] - b_before[k] for k in b_after},
                       mode_wall_s=time.monotonic() - t1, shared_cluster=name,
                       cluster={"pace": merge_stats(per_rank.values()),
                                "pace_per_rank": per_rank, "memory": mem.figures(cfg.ranks)})
            out[mode.name] = res
            save()


def plot_speedups(sp: dict[str, float | None], path: Path, title: str) -> None:
    """Bar chart of each mode's paced rollout speed-up."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, v in sp.items() if v is not None]
    fig, ax = plt.subplots(figsize=(8, 4))
    bars = ax.bar(range(len(names)), [sp[n] for n in names],
                  color=["tab:orange" if n.startswith("bubblespec") else "tab:blue"
                         for n in names])
    ax.bar_label(bars, fmt="%.2fx", fontsize=8)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("rollout throughput vs no speculation")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


RESUME_FREE = ("modes", "out", "resume", "timeline_step", "mode_scales")
"""Configuration keys a resumed run may change; every other one must equal the record's.
A mode measured at another scale than this run gives it is measured again (`resumed`)."""


def resumed(old: PacedDoc, cfg: PacedBenchConfig) -> dict[int, dict[str, dict[str, Any]]]:
    """The modes a saved record measured (steps recorded, not skipped or failed), per seed,
    for a run that goes on where it stopped (`--resume`): a paced run of the real model takes
    hours, longer than one sitting. A mode this run names at another pace scale than it was
    measured at is left out, to run again at the new one (a record from before per-mode
    scales: every mode ran at its `pace_scale`); each kept mode names its scale. ValueError
    naming the first key in which the record's configuration differs from `cfg` (its results
    would not compare)."""
    mine = asdict(cfg)
    for key, value in mine.items():
        if key not in RESUME_FREE and old.config.get(key, value) != value:
            raise ValueError(f"--resume: the record's config.{key} is "
                             f"{old.config.get(key)!r}, this run's {value!r}")
    names = {m for m in cfg.modes.split(",") if m}
    kept: dict[int, dict[str, dict[str, Any]]] = {}
    for seed, runs in old.runs.items():
        kept[int(seed)] = {}
        for name, res in runs.items():
            if not (res or {}).get("steps"):
                continue
            scale = run_scale(res, old.config["pace_scale"])
            if name not in names or scale == cfg.scale_of(name):
                kept[int(seed)][name] = {**res, "pace_scale": scale}
    return kept


def run_paced(cfg: PacedBenchConfig, model_dir: str) -> PacedDoc:
    """Every mode (plain ones once per seed), then the figures, files and final lines."""
    from bubblespec.tasks import make_task

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    task = make_task(cfg.task, model_dir)
    modes = mode_by_name([m for m in cfg.modes.split(",") if m])
    seeds = cfg.seed_list()
    by_seed: dict[int, dict[str, dict[str, Any]]] = {s: {} for s in seeds}
    if cfg.resume and (out / "paced.json").is_file():
        for seed, done in resumed(PacedDoc.read(out / "paced.json"), cfg).items():
            by_seed.setdefault(seed, {}).update(done)
            print(f"resumed seed {seed}: {', '.join(done) or 'nothing'} measured before",
                  flush=True)
    doc = PacedDoc(config=asdict(cfg))
    t_all = time.monotonic()

    def save() -> None:  # after every mode: a cut run keeps what it measured (--report)
        doc.runs = {str(k): v for k, v in by_seed.items()}
        doc.write(out / "paced.json")

    for seed in seeds:
        todo = [m for m in modes if seed == seeds[0] or m.seed_mode != SeedMode.KEYED]
        for m in todo:
            if m.needs and importlib.util.find_spec(m.needs) is None:
                by_seed[seed][m.name] = {"skipped": f"{m.needs} not importable"}
                print(f"[{m.name}] skipped: {m.needs} not importable (make bench-deps)",
                      flush=True)
        for group in scaled_groups([m for m in todo if m.name not in by_seed[seed]], cfg):
            try:
                run_group(group, cfg, seed, model_dir, task, by_seed[seed], save)
            except Exception as e:  # noqa: BLE001 (a failed cluster must not lose the others)
                traceback.print_exc()
                for m in group:
                    by_seed[seed].setdefault(
                        m.name, {"skipped": f"failed: {type(e).__name__}: {e}"})
            save()
    report(doc, cfg, time.monotonic() - t_all)
    return doc


def scale_text(cfg: PacedBenchConfig) -> str:
    """The run's pace scale, with the modes that ran at another ("150 (bubblespec x400)")."""
    other = ", ".join(f"{k} x{v:g}" for k, v in cfg.scales().items() if v != cfg.pace_scale)
    return f"{cfg.pace_scale:g}" + (f" ({other})" if other else "")


def report(doc: PacedDoc, cfg: PacedBenchConfig, took_s: float) -> None:
    """Figures, files and printed lines of a paced run's `doc` (its `runs` per seed; also
    for the record a cut run left behind: `bubblespec bench paced --report PATH`)."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    by_seed = {int(k): v for k, v in doc.runs.items()}
    first = by_seed[min(by_seed)] if by_seed else {}
    names = [m.name for m in mode_by_name([m for m in cfg.modes.split(",") if m])]
    summaries = {n: mode_summary([r[n] for r in by_seed.values()
                                  if (r.get(n) or {}).get("steps")], cfg.pace_scale)
                 for n in names if (first.get(n) or {}).get("steps")}
    sp = speedups(summaries, first)
    doc.report.update(summaries=summaries, speedups=sp, final_line=paced_final_line(sp),
                      keyed_check=keyed_agreement(first),
                      greedy_check=greedy_agreement({k: v.get("greedy_output_ids")
                                                     for k, v in first.items()}),
                      critical_path_line=final_line(reductions(first)))
    doc.write(out / "paced.json")
    (out / "accept.json").write_text(json.dumps(accept_doc(first), indent=1))
    base = next((b for b in (BASELINE, KEYED_BASELINE) if (first.get(b) or {}).get("steps")),
                None)
    if base is not None:
        (out / "lengths.json").write_text(json.dumps(lengths_doc(
            first[base]["steps"], f"bubblespec bench paced, {base} mode, response tokens")))
    title = (f"Paced rollout speed-up, {cfg.ranks} ranks, {cfg.pace} x {scale_text(cfg)} "
             f"(modelled GPU time), {cfg.prompts} prompts x n={cfg.n}, "
             f"{'epoch repeats' if cfg.epoch_steps else 'fresh prompts'}")
    try:
        plot_speedups(sp, out / "speedup.png", title)
        shown = {k: v for k, v in first.items()
                 if k in ("nospec", "suffix", "bubblespec", "bubblespec-keyed")}
        plot_timeline(shown, cfg.timeline_step, out / "timeline.png")
    except ImportError:
        print("no plots (matplotlib missing)")
    print()
    print(format_paced_table(summaries, sp))
    costs = format_cost_table(summaries)
    if costs:
        print("\nwhere the ranks' modelled seconds went (every cost charged; docs/results.md):")
        print(costs)
    print()
    if div := divergence_lines(summaries):
        print("first divergence from the pre-generated response (steps after step 0):")
        print("\n".join(div) + "\n")
    if dep := departure_lines(first):
        print("after leaving the pre-generated response (steps after step 0; tail tokens per "
              "forward vs suffix-keyed's on the same responses; tails at or above it):")
        print("\n".join(dep) + "\n")
    if pos := position_lines(first):
        print("where responses left their pre-generated drafts, by output position (steps "
              "after step 0; entropy: the policy's at the trained samples' positions, nats):")
        print("\n".join(pos) + "\n")
    print("\n".join(per_step_lines(by_seed, cfg.pace_scale)))
    if branched := {k: v["branches"] for k, v in first.items()
                    if (v.get("branches") or {}).get("made")}:
        print("margin branches (decoded / taken by a proposer; offers streamed; tokens they "
              "decoded): " + ", ".join(
                  f"{k}: {b['made']} / {b['taken']}; {b.get('streamed', 0)}; "
                  f"{b.get('tokens', '-')}" for k, b in branched.items()))
    print(f"\nwrote {out}/paced.json in {took_s:.0f} s; figures after step 0, "
          f"rollout phases only (trainer excluded), modelled s = wall s / {scale_text(cfg)}")
    g = doc.report["greedy_check"]
    print(f"greedy check (T=0, vs {g.get('reference')}): " + ", ".join(
        f"{k}: {'identical' if v['identical'] else 'DIFFERS'}"
        for k, v in g.get("modes", {}).items()))
    print("keyed check (T=1 token ids vs keyed without speculation): " + ", ".join(
        f"{k}: {v['identical_steps']}/{v['steps']} steps identical"
        for k, v in doc.report["keyed_check"].items()))
    print(doc.report["critical_path_line"])
    print(doc.report["final_line"], flush=True)
