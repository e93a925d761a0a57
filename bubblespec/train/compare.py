"""Learning curves of saved `train-demo` runs side by side (`bubblespec train-demo --compare`).

Speculation must not change what a policy learns. With keyed sampling two runs that differ
only in speculation sample identical tokens, so their curves are identical (the steps'
`output_ids_sha256` say so). With plain sampling each run draws its own samples, so the
curves can only agree within noise: per epoch over the same problems (`--epoch-steps`), the
difference of the runs' mean rewards against the standard error of that difference, the
same pooled over every step, and paired by problem (both runs draw the same problems at the
same step and position, so the difference of each problem's group mean cancels how hard the
problem is: the sharper test of a shift). Alongside: each run's critical-path forwards and, for paced
ranks, modelled rollout seconds per step and in all (a / b: b's speed-up over a), with the
steps whose pacing overran marked. A log written while its run was still going
(`"complete": false`) compares over the steps it has, and is named partial.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bubblespec.train.demo import epoch_rewards

NOISE_Z = 2.0
"""Runs agree within noise where the difference of their means is within this many standard
errors of the difference (about a 95% interval)."""


def load_log(path: str | Path) -> dict[str, Any]:
    """A `grpo_log.json` written by `train-demo` (ValueError naming the file if it has no
    steps)."""
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or not doc.get("steps"):
        raise ValueError(f"{path}: not a train-demo log (no steps)")
    return doc


def _mean_se(xs: Sequence[float]) -> tuple[float, float | None]:
    return (statistics.fmean(xs),
            statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else None)


def difference(a: tuple[float, float | None], b: tuple[float, float | None]
               ) -> dict[str, float | None]:
    """b - a for two (mean, standard error) pairs, its standard error and z (None without
    both errors or when both are 0)."""
    diff = b[0] - a[0]
    se = math.hypot(a[1], b[1]) if a[1] is not None and b[1] is not None else None
    return {"diff": diff, "se": se, "z": diff / se if se else None}


def _rewards(steps: Sequence[Mapping[str, Any]]) -> list[float]:
    return [float(x) for r in steps for g in r.get("rewards", []) for x in g]


def compare(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Two runs' curves side by side (b against a): per epoch when both repeat their prompts
    every K steps (K from their configs; the same K needed), pooled over their common
    steps, paired by problem (each group's mean, b - a), steps with identical ids, and each run's critical-path forwards and modelled
    rollout seconds (None for unpaced runs) over those steps."""
    n = min(len(a["steps"]), len(b["steps"]))
    sa, sb = a["steps"][:n], b["steps"][:n]
    ka = int(a.get("config", {}).get("epoch_steps", 0) or 0)
    kb = int(b.get("config", {}).get("epoch_steps", 0) or 0)
    epochs = []
    if ka == kb and ka > 0:
        for ea, eb in zip(epoch_rewards(sa, ka), epoch_rewards(sb, kb)):
            epochs.append({"epoch": ea["epoch"], "steps": ea["steps"],
                           "a": (ea["mean"], ea["se"]), "b": (eb["mean"], eb["se"]),
                           **difference((ea["mean"], ea["se"]), (eb["mean"], eb["se"]))})
    ra, rb = _rewards(sa), _rewards(sb)
    pooled = None
    if ra and rb:
        ma, mb = _mean_se(ra), _mean_se(rb)
        pooled = {"a": ma, "b": mb, **difference(ma, mb)}
    pairs = [statistics.fmean(gb) - statistics.fmean(ga) for x, y in zip(sa, sb)
             for ga, gb in zip(x.get("rewards", []), y.get("rewards", [])) if ga and gb]
    paired = None
    if pairs:
        m, se = _mean_se(pairs)
        paired = {"problems": len(pairs), "diff": m, "se": se, "z": m / se if se else None}
    same = [x.get("output_ids_sha256") is not None
            and x.get("output_ids_sha256") == y.get("output_ids_sha256") for x, y in zip(sa, sb)]

    def modelled(steps: Sequence[Mapping[str, Any]]) -> float | None:
        ts = [(s.get("pace") or {}).get("modelled_s") for s in steps]
        return sum(ts) if ts and all(t is not None for t in ts) else None

    zs = [abs(e["z"]) for e in epochs if e["z"] is not None]
    ma, mb = modelled(sa), modelled(sb)
    return {"steps": n, "epochs": epochs, "pooled": pooled, "paired": paired,
            "complete": (a.get("complete", True) is not False, b.get("complete", True) is not False),
            "paced_steps": _paced_steps(sa, sb),
            "speedup": ma / mb if ma is not None and mb else None,
            "identical_steps": sum(same),
            "critical_forwards": (sum(s["decode_steps_critical"] for s in sa),
                                  sum(s["decode_steps_critical"] for s in sb)),
            "modelled_s": (ma, mb),
            "max_abs_epoch_z": max(zs) if zs else None,
            "within_noise": _within(paired if paired is not None else pooled)}


def _paced_steps(sa: Sequence[Mapping[str, Any]], sb: Sequence[Mapping[str, Any]]
                 ) -> list[dict[str, Any]]:
    """Per step, each run's modelled rollout seconds and whether its pacing was valid
    (None for an unpaced run or a step without paced figures); [] when neither run was
    paced."""
    def one(s: Mapping[str, Any]) -> tuple[float | None, bool | None]:
        p = s.get("pace") or {}
        return p.get("modelled_s"), p.get("valid")

    rows = []
    for x, y in zip(sa, sb):
        (ta, va), (tb, vb) = one(x), one(y)
        rows.append({"step": x["step"], "a": ta, "b": tb, "a_valid": va, "b_valid": vb})
    return rows if any(r["a"] is not None or r["b"] is not None for r in rows) else []


def _within(d: Mapping[str, Any] | None) -> bool:
    """The verdict's one test (paired by problem, else pooled): |b - a| within `NOISE_Z`
    standard errors. One test, not one per epoch: with five epochs and the pooled figures
    judged each at 2 s.e., two runs of one policy would be called different about a
    quarter of the time."""
    return d is None or d["z"] is None or abs(d["z"]) <= NOISE_Z


def _secs(t: float | None, valid: bool | None) -> str:
    return "-" if t is None else f"{t:.2f}" + ("*" if valid is False else "")


def _ms(x: tuple[float, float | None]) -> str:
    return f"{x[0]:.3f} +- {x[1]:.3f}" if x[1] is not None else f"{x[0]:.3f}"


def _z(d: Mapping[str, Any]) -> str:
    return f"{d['diff']:+.3f} ({d['z']:+.2f} s.e.)" if d["z"] is not None else f"{d['diff']:+.3f}"


def format_compare(c: Mapping[str, Any], names: tuple[str, str]) -> str:
    """`compare` as lines: per epoch and pooled, a's and b's mean reward +- s.e. and b - a
    in standard errors of the difference; paired by problem; identical steps; critical-path forwards and
    modelled rollout seconds; the verdict."""
    a, b = names
    lines = [f"a: {a}", f"b: {b}", "epoch  steps   a reward (+- s.e.)  b reward (+- s.e.)  b - a"]
    for e in c["epochs"]:
        lines.append(f"{e['epoch']:>5}  {e['steps'][0]:>2}-{e['steps'][-1]:<3}  "
                     f"{_ms(e['a']):>18}  {_ms(e['b']):>18}  {_z(e)}")
    if c["pooled"]:
        p = c["pooled"]
        lines.append(f"  all  0-{c['steps'] - 1:<3}  {_ms(p['a']):>18}  {_ms(p['b']):>18}  "
                     f"{_z(p)}")
    if c["paired"]:
        p = c["paired"]
        lines.append(f"paired by problem ({p['problems']} groups): b - a {_z(p)}")
    fa, fb = c["critical_forwards"]
    lines.append(f"identical ids at {c['identical_steps']} of {c['steps']} steps; "
                 f"critical-path forwards a {fa:,} b {fb:,}")
    if c["paced_steps"]:
        lines.append("step  a modelled s  b modelled s  a / b   (*: over 1% of its forwards "
                     "overran: not valid)")
        for r in c["paced_steps"]:
            ratio = f"{r['a'] / r['b']:.2f}x" if r["a"] is not None and r["b"] else "-"
            lines.append(f"{r['step']:>4}  {_secs(r['a'], r['a_valid']):>12}  "
                         f"{_secs(r['b'], r['b_valid']):>12}  {ratio:>6}")
    ma, mb = c["modelled_s"]
    if ma is not None or mb is not None:
        lines.append("modelled rollout seconds (paced): a "
                     + (f"{ma:.2f}" if ma is not None else "-") + " b "
                     + (f"{mb:.2f}" if mb is not None else "-")
                     + (f"; a / b {c['speedup']:.2f}x" if c["speedup"] else ""))
    for name, done in zip(("a", "b"), c["complete"]):
        if not done:
            lines.append(f"note: {name} is a partial log (its run had not finished when "
                         "it was written)")
    verdict = ("identical" if c["identical_steps"] == c["steps"] else
               f"within noise (paired |b - a| <= {NOISE_Z:g} s.e.)" if c["within_noise"] else
               f"NOT within noise (paired |b - a| > {NOISE_Z:g} s.e.)")
    lines.append(f"curves: {verdict}")
    return "\n".join(lines)


def plot_compare(a: Mapping[str, Any], b: Mapping[str, Any], c: Mapping[str, Any],
                 names: tuple[str, str], path: str | Path) -> bool:
    """Both runs' reward per step (faint) and epoch means +- s.e. in one plot, labelled
    `names` (the runs' directories); False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for doc, name, key, color, dx in ((a, names[0], "a", "tab:blue", -0.15),
                                      (b, names[1], "b", "tab:orange", 0.15)):
        steps = doc["steps"][:c["steps"]]
        ax.plot([s["step"] for s in steps], [s["mean_reward"] for s in steps], "o-",
                color=color, alpha=0.3, ms=3)
        if c["epochs"]:
            ax.errorbar([(e["steps"][0] + e["steps"][-1]) / 2 + dx for e in c["epochs"]],
                        [e[key][0] for e in c["epochs"]],
                        yerr=[e[key][1] or 0.0 for e in c["epochs"]], fmt="s", color=color,
                        capsize=3, label=f"{name}: epoch mean +- s.e.")
        else:
            ax.plot([], [], "o-", color=color, label=f"{name}: reward per step")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward")
    ax.set_title("learning curves side by side")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def run_compare(paths: Sequence[str], out: str | None) -> dict[str, Any]:
    """`bubblespec train-demo --compare A B [--out DIR]`: print the comparison of the two
    logs and, with `out`, write `<out>/grpo_compare.json` and `<out>/grpo_compare.png`."""
    if len(paths) != 2:
        raise ValueError(f"--compare takes two grpo_log.json files, got {len(paths)}")
    a, b = (load_log(p) for p in paths)
    names = (str(paths[0]), str(paths[1]))
    c = compare(a, b)
    print(format_compare(c, names))
    if out:
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        (d / "grpo_compare.json").write_text(json.dumps({"runs": names, **c}, indent=1))
        labels = (Path(paths[0]).parent.name or names[0], Path(paths[1]).parent.name or names[1])
        if plot_compare(a, b, c, labels, d / "grpo_compare.png"):
            print(f"wrote {d / 'grpo_compare.json'} and {d / 'grpo_compare.png'}")
    return c
