"""Pure figures of `bubblespec bench paced` (no cluster; tested in tests/bench/test_paced.py).

Definitions (the paced bench's own; the rest are `bubblespec.bench.modes`'):

- **modelled rollout seconds** of a step: its rollout wall time (the `client.rollout` call,
  trainer excluded) / pace scale. Every engine forward of a paced rank lasts modelled GPU
  time x scale (`bubblespec.engine.pace`), so this is the step's time on the modelled GPUs
  (the service's own CPU work between forwards is divided by the scale too, hence small).
- **rollout throughput** of a mode: generated tokens / modelled rollout seconds, over the
  steps after step 0 of every seed.
- **speed-up** of a mode: its throughput / its baseline's (`modes.baseline_of`: keyed modes
  against keyed sampling without speculation, the others against nospec).
- **crit/longest** per step: critical-path decode steps / tokens of the step's longest
  response; with plain sampling, responses differ between modes, and this ratio is the
  comparison that survives the luck of the longest sample. Reported as the mean over the
  steps after step 0 of every seed with a 95% confidence interval (Student t).
- **peak memory**: the largest sum seen (sampled every 2 s) of the RSS of every process of
  the bench (cluster and trainer), and of the cluster's PSS (shared library pages counted
  once); a mode sharing a cluster reports the cluster's peak.
- **overruns**: paced forwards whose real CPU work exceeded their paced time, summed over
  the ranks; a mode's figures are valid only with under 1% overruns. "scale for <1%": the
  pace scale x the 99th percentile of real / paced time per forward (the largest over the
  seeds): the scale that would have made the run valid under the same load.
- **drafting %**: the proposer's measured CPU time in the ranks' paced forwards / the ranks'
  modelled time (summed over ranks, whole run). Ranks charge it on top of each forward
  (`--pace-charge-drafting`, on by default since 2026-12-03), as a GPU host pays it;
  "(absorbed)" marks a run whose ranks did not, so its modelled seconds leave it out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from bubblespec.bench.modes import ALL_MODES, BASELINE, KEYED_BASELINE, baseline_of
from bubblespec.bench.paced_record import run_scale
from bubblespec.train.positions import format_pooled, pooled

PACED_FINAL_KEYS = ("bubblespec", "suffix", "ngram", "history", "bubblespec-keyed",
                    "suffix-keyed", "bubblespec-keyed-window", "bubblespec-keyed-branch",
                    "bubblespec-keyed-window-branch", "bubblespec-keyed-stream",
                    "bubblespec-keyed-window-stream")
"""Modes of the last line, in its order (labels from `Mode.key`)."""

_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
        10: 2.23, 12: 2.18, 15: 2.13, 20: 2.09, 30: 2.04}


def t95(df: int) -> float:
    """Two-sided 95% Student t quantile (tabulated; 1.96 beyond 30 degrees of freedom)."""
    if df < 1:
        return math.inf
    for k in sorted(_T95):
        if df <= k:
            return _T95[k]
    return 1.96


def mean_ci(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (inf for fewer than 2)."""
    if not xs:
        return math.nan, math.inf
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, math.inf
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    return m, t95(len(xs) - 1) * sd / math.sqrt(len(xs))


def mode_summary(runs: Sequence[Mapping[str, Any]], scale: float) -> dict[str, Any]:
    """One mode's paced figures over its runs (one per seed; `service.run_schedule` results
    with a "cluster" entry holding "pace" and "memory"), steps after step 0; each run's wall
    seconds over the scale it ran at (`run_scale`, default `scale`)."""
    steps = [s for r in runs for s in (r.get("steps") or [])[1:]]
    tokens = sum(s["completion_tokens"] for s in steps)
    modelled = sum(s["wall_s"] / run_scale(r, scale)
                   for r in runs for s in (r.get("steps") or [])[1:])
    ratios = [s["decode_steps_critical"] / s["max_len"] for s in steps if s["max_len"] > 0]
    ratio_mean, ratio_ci = mean_ci(ratios)
    pace = [(r.get("cluster") or {}).get("pace") or {} for r in runs]
    forwards = sum(p.get("forwards", 0) for p in pace)
    overruns = sum(p.get("overruns", 0) for p in pace)
    ranks_modelled = sum(p.get("modelled_s", 0.0) for p in pace)
    drafting = sum(p.get("drafting_s", 0.0) for p in pace)
    bubbles = [s["bubble_fraction"] for s in steps if s.get("bubble_fraction") is not None]
    draft = sum(s["draft_tokens"] for s in steps)
    mem = [(r.get("cluster") or {}).get("memory") or {} for r in runs]
    return {
        "runs": len(runs), "steps": len(steps), "completion_tokens": tokens,
        "pace_scale": max((run_scale(r, scale) for r in runs), default=scale),
        "modelled_rollout_s": modelled,
        "throughput_tok_s": tokens / modelled if modelled > 0 else 0.0,
        "decode_steps_critical": sum(s["decode_steps_critical"] for s in steps),
        "longest_response_tokens": sum(s["max_len"] for s in steps),
        "crit_per_longest_steps": ratios,
        "crit_per_longest_mean": ratio_mean, "crit_per_longest_ci95": ratio_ci,
        "bubble_fraction": sum(bubbles) / len(bubbles) if bubbles else None,
        "pregen_tokens": sum(s["pregen_tokens"] + s.get("window_pregen_tokens", 0)
                             + s.get("tail_pregen_tokens", 0) for s in steps),
        "tail_pregen_tokens": sum(s.get("tail_pregen_tokens", 0) for s in steps),
        "accepted_pregen_tokens": sum(s["accepted_pregen_tokens"] for s in steps),
        "acceptance": sum(s["accepted_tokens"] for s in steps) / draft if draft else None,
        "forwards": forwards, "overruns": overruns,
        "overrun_share": overruns / forwards if forwards else 0.0,
        "valid": forwards > 0 and overruns < 0.01 * forwards,
        "drafting_share": drafting / ranks_modelled if ranks_modelled > 0 else None,
        "drafting_charged": any(p.get("charged_s", 0.0) > 0 for p in pace),
        "cost_split": cost_split(pace),
        "worst_ratio": max((p.get("worst_ratio", 0.0) for p in pace), default=0.0),
        "scale_for_valid": max((p.get("scale_for_valid", 0.0) for p in pace), default=0.0),
        "peak_rss_mib": max((m.get("peak_total_mib", 0.0) for m in mem), default=0.0),
        "peak_rank_rss_mib": max((m.get("peak_per_rank_mib", 0.0) for m in mem), default=0.0),
        "peak_cluster_pss_mib": max((m.get("peak_cluster_pss_mib", 0.0) for m in mem),
                                    default=0.0),
        "divergence": divergence_summary(steps),
    }


COST_PARTS = ("forward_s", "charged_s", "product_host_s", "keyed_device_s", "async_hidden_s",
              "between_s")


def cost_split(pace: Sequence[Mapping[str, Any]]) -> dict[str, float] | None:
    """The ranks' modelled seconds split (summed over the ranks): the forwards alone, what
    the product added on top (drafting charged, the keyed sampler's and verifier's host
    work, their modelled device kernels; of the host work, the calls into the engine
    between steps), what async scheduling hid, and the product's host work left uncharged
    (drafting not charged), each also as a share of the modelled total.
    None for records of ranks that predate the split (no `forward_s`)."""
    if not pace or not any("forward_s" in p for p in pace):
        return None
    out = {k: sum(float(p.get(k, 0.0)) for p in pace) for k in COST_PARTS}
    out["modelled_s"] = sum(float(p.get("modelled_s", 0.0)) for p in pace)
    out["uncharged_host_s"] = sum(float(p.get("drafting_s", 0.0)) - float(p.get("charged_s", 0.0))
                                  for p in pace)
    total = out["modelled_s"]
    for k in (*COST_PARTS, "uncharged_host_s"):
        out[k.replace("_s", "_share")] = out[k] / total if total > 0 else 0.0
    return out


def format_cost_table(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """Per mode, where the ranks' modelled seconds went: the forward (engine-time model),
    the product's charged costs, async scheduling's credit and the uncharged share."""
    head = ["mode", "modelled s", "forward %", "drafting %", "keyed host %",
            "of it between steps %", "keyed device % (MODELLED)", "async hidden %",
            "uncharged host %"]
    rows = []
    for name, s in summaries.items():
        c = s.get("cost_split")
        if not c:
            continue
        rows.append([name, f"{c['modelled_s']:.1f}"] + [
            f"{100 * c.get(k, 0.0):.2f}" for k in ("forward_share", "charged_share",
                                                   "product_host_share", "between_share",
                                                   "keyed_device_share",
                                          "async_hidden_share", "uncharged_host_share")])
    if not rows:
        return ""
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(head), fmt(["-" * w for w in widths]), *map(fmt, rows)])


def divergence_summary(steps: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The steps' `divergence` figures (schedule.divergence_figures) summed: accepted tokens
    before / at-or-after the first divergence, re-couplings, the share of the diverged tails
    that drafts covered, and the critical-path responses' tail share (pooled over steps);
    None when no step carries them (runs saved before the counters existed)."""
    ds = [s["divergence"] for s in steps if s.get("divergence")]
    if not ds:
        return None
    crit = [d["critical"] for d in ds if d.get("critical")]
    crit_tail = sum(c["tokens"] - c["first_divergence"] for c in crit
                    if c["first_divergence"] is not None)
    tail = sum(d["tail_tokens"] for d in ds)
    out = {k: sum(d[k] for d in ds) for k in ("responses", "diverged", "accepted_before",
                                              "accepted_after", "recouplings", "tail_tokens")}
    out["tail_accepted_share"] = out["accepted_after"] / tail if tail else None
    out["crit_diverged"] = sum(c["first_divergence"] is not None for c in crit)
    out["crit_first_divergence"] = [c["first_divergence"] for c in crit]
    known = all("ran_out" in d for d in ds)  # None: records from before the counter
    out["ran_out"] = sum(d["ran_out"] for d in ds) if known else None
    out["crit_ran_out"] = sum(bool(c.get("draft_ran_out")) for c in crit) if known else None
    out["crit_tail_accepted_share"] = (
        sum(c["accepted_after"] for c in crit if c["first_divergence"] is not None)
        / crit_tail if crit_tail else None)
    return out


def divergence_lines(summaries: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Per mode that drafted from aligned pre-generated responses: how far responses followed
    them, and how much of the tail after the first divergence drafts still covered."""
    lines = []
    for name, s in summaries.items():
        d = s.get("divergence")
        if not d or not (d["diverged"] or d["accepted_before"]):
            continue
        lines.append(
            f"{name}: {d['diverged']}/{d['responses']} responses left their pre-generated "
            f"response ({_f(d['ran_out'], 'd')} where it ended: cut short by the stop); "
            f"accepted {d['accepted_before']} before / {d['accepted_after']} at or after the "
            f"first divergence ({_f(_pct(d['tail_accepted_share']), '.0f')}% of "
            f"{d['tail_tokens']} tail tokens); {d['recouplings']} re-couplings; critical "
            f"path: {d['crit_diverged']} diverged ({_f(d['crit_ran_out'], 'd')} at the draft's "
            f"end), first divergence at {d['crit_first_divergence']}, tail accepted "
            f"{_f(_pct(d['crit_tail_accepted_share']), '.0f')}%")
    return lines


def position_lines(results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Per pre-generating mode, where its responses left their drafts by output position
    class, pooled over the steps after step 0 (`train.positions`: tokens on a draft, flips,
    draft ends, survival per token and the policy's entropy there): the split between the
    model (flips) and the workload (drafts that ended) behind a mode's acceptance."""
    out: list[str] = []
    for name, r in results.items():
        steps = r.get("steps") or []
        if not r.get("pregen") or not any(s.get("positions") for s in steps):
            continue
        out += [f"{name}:", *("  " + line for line in format_pooled(pooled(steps))
                              .splitlines())]
    return out


def _pct(v: float | None) -> float | None:
    return None if v is None else 100 * v


def speedups(summaries: Mapping[str, Mapping[str, Any]],
             results: Mapping[str, Mapping[str, Any]]) -> dict[str, float | None]:
    """Per mode: throughput / its baseline's throughput (None without one). `results`:
    one run per mode with its "seed_mode" (to pick the keyed baseline)."""
    out: dict[str, float | None] = {}
    for name, s in summaries.items():
        base = summaries.get(baseline_of(name, results)) or {}
        bt = base.get("throughput_tok_s") or 0.0
        out[name] = s["throughput_tok_s"] / bt if bt > 0 and s.get("steps") else None
    return out


def paced_final_line(sp: Mapping[str, float | None]) -> str:
    """`paced_rollout_speedup_vs_nospec: bubblespec=X suffix=Y ... keyed_window=W`, then any
    other mode the run measured (e.g. the pre-gen order modes), in `ALL_MODES` order."""
    labels = {m.name: m.key for m in ALL_MODES}
    cells = []
    for name in PACED_FINAL_KEYS:
        v = sp.get(name)
        cells.append(f"{labels[name]}={'n/a' if v is None else f'{v:.2f}'}")
    for m in ALL_MODES:
        v = sp.get(m.name)
        if m.name not in (*PACED_FINAL_KEYS, BASELINE, KEYED_BASELINE) and v is not None:
            cells.append(f"{m.key}={v:.2f}")
    return "paced_rollout_speedup_vs_nospec: " + " ".join(cells)


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def _drafting(s: Mapping[str, Any]) -> str:
    """Drafting's share of the ranks' modelled time; "(absorbed)" when it was not charged."""
    share = s.get("drafting_share")
    if share is None:
        return "-"
    return f"{100 * share:.1f}" + ("" if s.get("drafting_charged") or share == 0 else " (absorbed)")


def format_paced_table(summaries: Mapping[str, Mapping[str, Any]],
                       sp: Mapping[str, float | None]) -> str:
    """Per-mode rows of the paced bench."""
    head = ["mode", "tok/s (modelled)", "speed-up", "crit steps", "crit/longest (95% CI)",
            "bubble %", "pregen tok", "pregen acc", "accept %", "drafting %", "overruns",
            "scale", "scale for <1%", "peak GiB rss/pss"]
    rows = []
    for name, s in summaries.items():
        ci = s["crit_per_longest_ci95"]
        rows.append([
            name, f"{s['throughput_tok_s']:.0f}", _f(sp.get(name), ".2f") + "x",
            str(s["decode_steps_critical"]),
            f"{_f(s['crit_per_longest_mean'], '.3f')} +- {_f(ci if math.isfinite(ci) else None, '.3f')}",
            _f(None if s["bubble_fraction"] is None else 100 * s["bubble_fraction"], ".0f"),
            str(s["pregen_tokens"]), str(s["accepted_pregen_tokens"]),
            _f(None if s["acceptance"] is None else 100 * s["acceptance"], ".0f"),
            _drafting(s),
            f"{s['overruns']}/{s['forwards']}" + ("" if s["valid"] else " INVALID"),
            _f(s.get("pace_scale"), "g"), _f(s.get("scale_for_valid"), ".0f"),
            f"{s['peak_rss_mib'] / 1024:.1f}/{s['peak_cluster_pss_mib'] / 1024:.1f}"])
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(head), fmt(["-" * w for w in widths]), *map(fmt, rows)])


def per_step_lines(results_by_seed: Mapping[int, Mapping[str, Mapping[str, Any]]],
                   scale: float) -> list[str]:
    """Per seed and step: critical path, longest response and modelled seconds per mode
    (wall seconds over the scale each mode ran at, `run_scale`)."""
    lines = []
    for seed, results in results_by_seed.items():
        names = [n for n, r in results.items() if r.get("steps")]
        if not names:
            continue
        lines.append(f"seed {seed}: per step crit/longest, modelled rollout s")
        lines.append("step  " + "  ".join(f"{n:>24}" for n in names))
        k = max(len(results[n]["steps"]) for n in names)
        for i in range(k):
            cells = []
            for n in names:
                st = results[n]["steps"]
                if i < len(st):
                    s = st[i]
                    modelled = s["wall_s"] / run_scale(results[n], scale)
                    cells.append(f"{s['decode_steps_critical']:>5}/{s['max_len']:<5} "
                                 f"{modelled:>8.2f} s".rjust(24))
                else:
                    cells.append(" " * 24)
            lines.append(f"{i:>4}  " + "  ".join(cells))
    return lines


def accept_doc(results: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """What `bubblespec simulate --accept-json` reads, from the measured modes (steps after
    step 0): accepted and drafted tokens per forward pass of a request, and for modes that
    pre-generate the share of generated tokens that were accepted pre-generated draft tokens
    (`pregen_coverage`, a lower bound of the covered share: covered positions whose draft
    was rejected are not counted). Keyed sampling without speculation is the simulator's
    baseline "nospec" when plain nospec did not run."""
    out: dict[str, dict[str, float]] = {}
    for name, r in results.items():
        if name == "nospec-keyed" and "nospec" in results:
            continue
        name = "nospec" if name == "nospec-keyed" else name
        steps = (r.get("steps") or [])[1:]
        tok = sum(s["completion_tokens"] for s in steps)
        fwd = sum(s["completion_tokens"] / s["tokens_per_forward"] for s in steps
                  if s["tokens_per_forward"] > 0)
        if not tok or not fwd:
            continue
        # pre-generates: hands prompts ahead, and drafts from them (runs recorded before
        # the modes' sources were: the former says it)
        pre = bool(r.get("pregen")) and (r.get("sources") is None or "pregen" in r["sources"])
        row = {"accepted_per_forward": max(0.0, tok / fwd - 1.0),
               "drafted_per_forward": sum(s["draft_tokens"] for s in steps) / fwd,
               "uses_pregen": pre}
        if r.get("sources") is not None:
            row["sources"] = list(r["sources"])
        if pre:
            row["pregen_coverage"] = sum(s["accepted_pregen_tokens"] for s in steps) / tok
        out[name] = row
    return out
