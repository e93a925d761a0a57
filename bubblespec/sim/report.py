"""Table, JSON and plot of simulator results. Every line and title says "modelled"."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from bubblespec.core.engine_time import EngineTime
from bubblespec.sim.model import SimConfig, Summary
from bubblespec.sim.policy import ModeSpec
from bubblespec.sim.workload import LengthSource

TAG = "[modelled]"
COLUMNS = ("R", "mode", "step_s", "tok/s", "cp_steps", "cp_cut", "bubble", "pregen",
           "cover", "lag_s", "speedup")


def lines_preamble(cfg: SimConfig, et: EngineTime, lengths: LengthSource,
                   length_stats: dict[str, float], modes: list[ModeSpec],
                   notes: list[str]) -> list[str]:
    """What the figures rest on, one modelled line each."""
    d = et.describe()
    prompts = (f"{cfg.prompts} prompts" if cfg.prompts is not None
               else f"{cfg.prompts_per_rank} prompts per rank")
    out = [f"{TAG} bubblespec simulate: MODELLED projections, not measurements",
           (f"{TAG} engine time ({d['gpu']}): t_fixed {d['t_fixed_ms']:.2f} ms + "
            f"{d['t_token_us']:.1f} us/token + {d['t_flop_us']:.1f} us/token above "
            f"{d['ridge_tokens']:.0f} tokens + {d['t_kv_ns']:.1f} ns per context token"),
           (f"{TAG} workload: {prompts} x n={cfg.n}, max_num_seqs {cfg.max_num_seqs}, "
            f"{cfg.assign} assignment, prompt {cfg.prompt_len} tokens, {cfg.steps} steps "
            f"(first {cfg.warmup_steps} left out), {cfg.pregen_inflight} pre-gen lanes per "
            f"rank, {cfg.pregen_order} pre-gen queue, trainer {cfg.train_s:g} s, seed "
            f"{cfg.seed}"),
           f"{TAG} lengths: {lengths.description}",
           (f"{TAG} lengths drawn: median {length_stats['median']:.0f}, mean "
            f"{length_stats['mean']:.0f}, p99 {length_stats['p99']:.0f}, max "
            f"{length_stats['max']:.0f}, p99/median {length_stats['p99_over_median']:.2f}")]
    out += [f"{TAG} mode {m.describe()}" for m in modes]
    out += [f"{TAG} note: {n}" for n in notes]
    return out


def lines_table(results: list[Summary]) -> list[str]:
    """The results table; every line tagged modelled."""
    fmt = "{:>5} {:<20} {:>8} {:>11} {:>9} {:>7} {:>7} {:>7} {:>6} {:>6} {:>8}"
    out = [f"{TAG} " + fmt.format(*COLUMNS)]
    for s in results:
        out.append(f"{TAG} " + fmt.format(
            s.ranks, s.mode[:20], f"{s.step_time_s:.1f}", f"{s.throughput_tok_s:,.0f}",
            f"{s.cp_decode_steps:.0f}", f"{s.cp_reduction:.1%}", f"{s.bubble_fraction:.1%}",
            f"{s.pregen_bubble_share:.1%}", f"{s.coverage:.2f}", f"{s.stop_lag_s:.2f}",
            f"{s.speedup:.2f}x"))
    charged = [s for s in results if s.control_plane_s > 0]
    for s in charged:
        out.append(f"{TAG} control plane (R={s.ranks}, {s.mode}): {s.control_plane_s:.3f} s "
                   f"a step, {s.control_plane_s / max(s.step_time_s, 1e-12):.2%} of it "
                   "(fetch burst + stop past the train window; `--control-plane-json`)")
    out.append(f"{TAG} columns: step_s = rollout step time (until every rank is free); "
               "tok/s = response tokens/s over all ranks; cp_steps = decode steps (forwards) "
               "of the slowest rank; cp_cut = their reduction vs no speculation; bubble = "
               "idle share of rank-time before the slowest rank finished; pregen = share of "
               "that bubble spent pre-generating; cover = share of the step's tokens covered "
               "by pre-generated drafts; lag_s = worst pre-gen stop lag; speedup = step time "
               "of no speculation / this mode")
    return out


def to_json(cfg: SimConfig, ranks: list[int], et: EngineTime, lengths: LengthSource,
            length_stats: dict[str, float], modes: list[ModeSpec], notes: list[str],
            results: list[Summary]) -> dict:
    """Everything needed to reproduce and read the run."""
    return {
        "label": "modelled: bubblespec simulate projections, not measurements",
        "config": asdict(cfg), "ranks": ranks, "engine_time": et.describe(),
        "lengths": {"description": lengths.description, "drawn": length_stats},
        "modes": [asdict(m) for m in modes], "notes": notes,
        "results": [s.row() for s in results],
        "per_step": [{"ranks": s.ranks, "mode": s.mode, **asdict(x)}
                     for s in results for x in s.steps],
    }


def plot(results: list[Summary], path: str | Path, subtitle: str = "",
         measured: dict[str, tuple[int, float]] | None = None) -> None:
    """Speedup vs R per mode (left) and bubble share recovered by pre-generation (right);
    `measured` (mode -> (ranks, speed-up) of a paced run) adds those points as stars."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(dict.fromkeys(s.mode for s in results))
    starred = False
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for m in modes:
        rows = [s for s in results if s.mode == m]
        xs = [s.ranks for s in rows]
        (line,) = a1.plot(xs, [s.speedup for s in rows], marker="o", label=m)
        if measured and m in measured:
            r, v = measured[m]
            a1.plot([r], [v], marker="*", markersize=12, linestyle="none",
                    color=line.get_color(), label="_" if starred else "stars: measured (paced)")
            starred = True
        a2.plot(xs, [s.bubble_fraction for s in rows], marker="o", label=f"{m}: bubble")
        if any(s.pregen_bubble_share > 0 for s in rows):
            a2.plot(xs, [s.pregen_bubble_share for s in rows], marker="s", linestyle="--",
                    label=f"{m}: bubble share pre-generating")
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks R (modelled)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    a1.set_ylabel("rollout-step speedup vs no speculation (modelled)")
    a2.set_ylabel("fraction (modelled)")
    a1.set_title("speedup vs R (modelled)", fontsize=10)
    a2.set_title("bubble and its pre-generation share (modelled)", fontsize=10)
    title = "bubblespec simulate: MODELLED projection, not measured"
    fig.suptitle(title + (f"\n{subtitle}" if subtitle else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
