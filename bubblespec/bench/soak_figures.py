"""The figures of `bubblespec bench soak`: the per-step record, the RSS slopes, the budgets,
the attribution of the vLLM workers' memory, the final lines, the table and the plot.

Pure functions of the records (`SoakStep`, one per step) that `bench/soak.py` collects from
a running cluster; matplotlib only for the plot, imported when plotting.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAT_PCT_PER_100 = 1.0
"""A process whose RSS grows by less than this (% per 100 steps, after warm-up) is flat."""



@dataclass
class SoakStep:
    """What one step left behind: latency, RSS per process (KiB), store and index levels."""

    step: int
    rollout_s: float
    weights_s: float
    weight_version: int
    completion_tokens: int
    rss_kib: dict[str, int]
    store: dict[str, int]
    index: dict[str, dict[str, int]] = field(default_factory=dict)
    """Each rank's draft index after the step (its groups released)."""
    index_peak: dict[str, dict[str, int]] = field(default_factory=dict)
    """Each rank's largest index figures seen while the step ran (polled every second)."""
    heap: dict[str, dict[str, int]] = field(default_factory=dict)
    """Each rank's vLLM worker memory split after the step (rank `GET /v1/heap`)."""



def growth_pct_per_100(values: list[float]) -> float:
    """Least-squares slope of `values` (one per step) in % of their mean per 100 steps."""
    if len(values) < 2:
        return 0.0
    xs = range(len(values))
    mx, my = (len(values) - 1) / 2, statistics.fmean(values)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, values)) / sxx
    return 100.0 * slope * 100 / my if my else 0.0


def summarize(records: list[SoakStep], warmup: int) -> dict[str, Any]:
    """Slopes after `warmup` steps, store/index maxima against budgets, latency figures."""
    tail = records[warmup:] if len(records) > warmup + 1 else records
    names = sorted({n for r in tail for n in r.rss_kib}, key=_order)
    slopes = {n: growth_pct_per_100([r.rss_kib[n] for r in tail if n in r.rss_kib])
              for n in names}
    half = records[len(records) // 2:]
    late = {n: growth_pct_per_100([r.rss_kib[n] for r in half if n in r.rss_kib])
            for n in names}
    store_max = max((r.store.get("bytes", 0) for r in records), default=0)
    store_budget = max((r.store.get("budget_bytes", 0) for r in records), default=0)
    index = {}
    for rank in sorted({k for r in records for k in r.index}):
        rows = [r.index_peak.get(rank) or r.index[rank] for r in records if rank in r.index]
        index[rank] = {"max_tokens": max(x.get("tokens", 0) for x in rows),
                       "token_budget": max(x.get("token_budget", 0) for x in rows),
                       "max_global_tokens": max(x.get("global_tokens", 0) for x in rows),
                       "global_token_budget": max(x.get("global_token_budget", 0) for x in rows),
                       "max_groups": max(x.get("groups", 0) for x in rows),
                       "max_aligned": max(x.get("aligned", 0) for x in rows),
                       "max_finished_stats": max(x.get("finished_stats", 0) for x in rows),
                       "after_step_max_tokens": max(r.index[rank].get("tokens", 0)
                                                    for r in records if rank in r.index)}
    lat = [r.rollout_s for r in tail]
    heap = {rank: heap_attribution(records, rank, warmup)
            for rank in sorted({k for r in records for k in r.heap})}
    within = store_max <= store_budget and all(
        v["max_tokens"] <= v["token_budget"] and v["max_global_tokens"]
        <= v["global_token_budget"] for v in index.values())
    return {"steps": len(records), "warmup": warmup,
            "rss_growth_pct_per_100_steps": slopes,
            "rss_growth_pct_per_100_steps_last_half": late,
            "rss_mib_last": {n: round(records[-1].rss_kib.get(n, 0) / 1024, 1) for n in names},
            "store": {"max_bytes": store_max, "budget_bytes": store_budget},
            "index": index,
            "heap": heap,
            "latency_s": {"median": statistics.median(lat) if lat else 0.0,
                          "growth_pct_per_100_steps": growth_pct_per_100(lat)},
            "flat": all(abs(s) < FLAT_PCT_PER_100 for s in slopes.values()) and within}


HEAP_PARTS = ("rss_kib", "rss_anon_kib", "rss_file_kib", "malloc_in_use", "malloc_free",
              "malloc_mmapped", "malloc_arena")
"""The parts of a worker's memory whose change the attribution reports (MiB)."""


def _mib(part: str, value: int) -> float:
    return value / 1024 if part.endswith("_kib") else value / 2**20


def heap_attribution(records: list[SoakStep], rank: str, warmup: int) -> dict[str, Any]:
    """How `rank`'s worker memory changed after `warmup` steps and over the last half, part
    by part (MiB), with the forward shapes seen at those points and the last step that
    brought a new one."""
    rows = [(r.step, r.heap[rank]) for r in records if r.heap.get(rank)]
    if not rows:
        return {}
    first = rows[min(warmup, len(rows) - 1)][1]
    mid, last = rows[len(rows) // 2][1], rows[-1][1]
    shapes = [h.get("shapes", 0) for _, h in rows]
    new_at = [step for (step, _), a, b in zip(rows[1:], shapes, shapes[1:]) if b > a]

    def change(a: dict[str, int], b: dict[str, int]) -> dict[str, float]:
        return {p: round(_mib(p, b.get(p, 0) - a.get(p, 0)), 2) for p in HEAP_PARTS}

    return {"after_warmup_mib": change(first, last), "last_half_mib": change(mid, last),
            "last_mib": {p: round(_mib(p, last.get(p, 0)), 1) for p in HEAP_PARTS},
            "shapes": {"after_warmup": first.get("shapes", 0), "half": mid.get("shapes", 0),
                       "last": last.get("shapes", 0)},
            "last_new_shape_step": new_at[-1] if new_at else None,
            "in_use_growth_pct_per_100_steps_last_half": growth_pct_per_100(
                [h.get("malloc_in_use", 0) for _, h in rows[len(rows) // 2:]])}


def final_lines(summary: dict[str, Any]) -> list[str]:
    """The last lines of a soak run (machine-greppable `key: values`)."""
    slopes = " ".join(f"{n}={v:+.2f}" for n, v in summary["rss_growth_pct_per_100_steps"].items())
    st = summary["store"]
    idx = " ".join(f"{r}={v['max_tokens']}/{v['token_budget']}tok "
                   f"global={v['max_global_tokens']}/{v['global_token_budget']}tok"
                   for r, v in summary["index"].items())
    lat = summary["latency_s"]
    late = " ".join(f"{n}={v:+.2f}"
                    for n, v in summary["rss_growth_pct_per_100_steps_last_half"].items())
    heap = " | ".join(
        f"{r} after warm-up: rss {h['after_warmup_mib']['rss_kib']:+.1f} MiB (anon "
        f"{h['after_warmup_mib']['rss_anon_kib']:+.1f}, file "
        f"{h['after_warmup_mib']['rss_file_kib']:+.1f}); malloc in use "
        f"{h['after_warmup_mib']['malloc_in_use']:+.1f}, free "
        f"{h['after_warmup_mib']['malloc_free']:+.1f}, mmapped "
        f"{h['after_warmup_mib']['malloc_mmapped']:+.1f}; last half rss "
        f"{h['last_half_mib']['rss_kib']:+.1f}, in use {h['last_half_mib']['malloc_in_use']:+.1f}"
        f"; shapes {h['shapes']['after_warmup']}->{h['shapes']['half']}->"
        f"{h['shapes']['last']} (last new at step {h['last_new_shape_step']})"
        for r, h in summary.get("heap", {}).items() if h)
    return [f"soak_rss_growth_pct_per_100_steps: {slopes}",
            f"soak_rss_growth_pct_per_100_steps_last_half: {late}",
            f"soak_store_max_vs_budget: {st['max_bytes']}/{st['budget_bytes']} bytes",
            f"soak_index_max_vs_budget: {idx}",
            f"soak_worker_heap_mib: {heap or '-'}",
            (f"soak_step_latency_s: median={lat['median']:.2f} "
            f"growth_pct_per_100_steps={lat['growth_pct_per_100_steps']:+.2f}"),
            (f"soak_flat: {'yes' if summary['flat'] else 'NO'} (after {summary['warmup']} "
            f"warm-up steps of {summary['steps']}; flat = |RSS slope| < {FLAT_PCT_PER_100:g}% "
            "per 100 steps, store and index within budget)")]


def _order(name: str) -> tuple[int, str]:
    return ({"sync": 0, "gateway": 1}.get(name, 2), name)


def format_rows(records: list[SoakStep], header: bool) -> str:
    """Table rows (RSS in MiB) for `records`, with the header line when `header`."""
    names = sorted(records[0].rss_kib, key=_order) if records else []
    ranks = sorted(records[0].index) if records else []
    head = ["step", "rollout s", "weights s", "store KiB"] + [f"{r} idx peak" for r in ranks] + [
        f"{n} MiB" for n in names]
    rows = [[str(r.step), f"{r.rollout_s:.2f}", f"{r.weights_s:.2f}",
             f"{r.store.get('bytes', 0) / 1024:.0f}"]
            + [str(r.index_peak.get(k, {}).get("tokens", "-")) for k in ranks]
            + [f"{r.rss_kib.get(n, 0) / 1024:.1f}" for n in names] for r in records]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    lines = ([" ".join(h.rjust(w) for h, w in zip(head, widths))] if header else []) + [
        " ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def plot(records: list[SoakStep], summary: dict[str, Any], path: Path) -> None:
    """RSS per process, store/index fill in % of budget, and step latency against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r.step for r in records]
    fig, (a, d, b, c) = plt.subplots(4, 1, figsize=(8, 12), sharex=True)
    ref = records[min(summary["warmup"], len(records) - 1)].rss_kib
    for n in summary["rss_growth_pct_per_100_steps"]:
        slope = summary["rss_growth_pct_per_100_steps"][n]
        if not ref.get(n):
            continue
        a.plot(steps, [100 * (r.rss_kib.get(n, 0) / ref[n] - 1) for r in records],
               label=f"{n} {ref[n] / 1024:.0f} MiB ({slope:+.2f}%/100 steps)")
    a.set_ylabel("RSS change vs end of warm-up, %")
    a.axvline(summary["warmup"], color="grey", ls=":")
    a.legend(fontsize=6, ncol=2)
    _plot_heap(d, records, summary["warmup"])
    b.plot(steps, [100 * r.store.get("bytes", 0) / max(1, r.store.get("budget_bytes", 1))
                   for r in records], label="draft store (bytes)")
    for rank in sorted({k for r in records for k in r.index}):
        peaks = [r.index_peak.get(rank) or r.index.get(rank, {}) for r in records]
        b.plot(steps, [100 * x.get("tokens", 0) / max(1, x.get("token_budget", 1))
                       for x in peaks], label=f"{rank} draft index peak (tokens)")
    b.set_ylabel("% of budget")
    b.legend(fontsize=7)
    c.plot(steps, [r.rollout_s for r in records], label="rollout")
    c.plot(steps, [r.weights_s for r in records], label="weight push")
    c.set_ylabel("seconds")
    c.set_xlabel("step")
    c.legend(fontsize=7)
    fig.suptitle(f"soak: {len(records)} steps, weight push every step")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _plot_heap(ax: Any, records: list[SoakStep], warmup: int) -> None:
    """The first rank's worker: each part's change since the end of warm-up (MiB), and the
    forward shapes seen (right axis)."""
    rank = min((k for r in records for k in r.heap), default=None)
    rows = [(r.step, r.heap[rank]) for r in records if rank and r.heap.get(rank)]
    if not rows:
        return
    ref = rows[min(warmup, len(rows) - 1)][1]
    steps = [s for s, _ in rows]
    for part in ("rss_kib", "rss_anon_kib", "malloc_in_use", "malloc_free", "malloc_mmapped"):
        ax.plot(steps, [_mib(part, h.get(part, 0) - ref.get(part, 0)) for _, h in rows],
                label=part.removesuffix("_kib"))
    ax.set_ylabel(f"{rank} worker: MiB vs warm-up")
    ax.legend(fontsize=6, loc="upper left")
    twin = ax.twinx()
    twin.plot(steps, [h.get("shapes", 0) for _, h in rows], color="grey", ls="--")
    twin.set_ylabel("forward shapes seen", color="grey")
