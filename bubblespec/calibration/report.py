"""`bubblespec simulate --calibrate PACED_JSON`: the paced run beside its replay, and the
projections from the calibrated inputs.

Lines tagged "[calibration]" put measured (the paced run, modelled GPU seconds) beside
MODELLED (the simulator's replay of the same steps, `replay.replay`): per mode the
speed-up against its baseline with pooled acceptance (the calibrated input) and with each
step's own acceptance, then per step the rollout seconds, critical-path forwards, bubble
fraction, pre-generated tokens and covered share, then per rank the forwards of the steps
with pre-generated drafts. The last line is
`sim_vs_paced_gap: bubblespec=+x% suffix=... keyed=... suffix_keyed=... keyed_window=...`
(modelled speed-up / measured - 1, pooled acceptance). `scenario` is the projection:
every mode's pooled spec, the baselines' measured lengths per prompt, the run's prompts per
rank, n, prompt tokens and trainer time, at any rank counts.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from bubblespec.bench.modes import ALL_MODES
from bubblespec.bench.paced_record import PacedDoc, PacedRun
from bubblespec.calibration.flips import (
    NO_FLIP,
    Flips,
    flip_caps,
    flip_stats,
    lost_tokens,
)
from bubblespec.calibration.replay import (
    PREGEN_INFLIGHT,
    Counts,
    Replayed,
    assignment_check,
    assignments,
    pooled_spec,
    replay_all,
)
from bubblespec.calibration.tails import caught_share, head_rates, rate_spread, split_rates
from bubblespec.core.engine_time import EngineTime
from bubblespec.sim.model import SimConfig
from bubblespec.sim.policy import ModeSpec, with_head_rates, with_tail_rates
from bubblespec.sim.run import Scenario
from bubblespec.sim.workload import LengthSource

TAG = "[calibration]"
WITHIN = 0.10
"""The agreement asked of the replay: modelled speed-up within 10% of the measured one."""
GAP_KEYS = ("bubblespec", "suffix", "bubblespec-keyed", "suffix-keyed",
            "bubblespec-keyed-window", "ngram", "ngram-keyed", "bubblespec-keyed-branch",
            "bubblespec-keyed-window-branch")
"""Modes of the last line first, in this order (labels from `Mode.key`)."""


def load(path: str | Path) -> tuple[PacedRun, dict[str, Any], float]:
    """The run, its first seed's raw results and its train window (modelled s)."""
    doc = PacedDoc.read(path)
    run = PacedRun.of(doc, path)
    return run, doc.runs[doc.seeds()[0]], float(doc.config.get("train_window_s", 0.0))


def scenario(run: PacedRun, first: dict[str, Any], window_s: float, ranks: list[int],
             steps: int, seed: int, cover_cv: float = 0.0, flips: Flips | None = None,
             lookahead: int = 1) -> Scenario:
    """The projection of the paced run's workload at `ranks` with calibrated inputs (and
    an assumed per-request spread `cover_cv` of the covered acceptance); with measured
    flips (`flips`, or the records' own) each response with a draft leaves it with the
    measured share, at a measured relative position; `lookahead`: steps whose prompts each
    step hands ahead (a what-if when the paced run handed fewer)."""
    groups = [np.asarray(g) for name in ("nospec", "nospec-keyed") if name in run.modes
              for step in run.lengths(name) for g in step]
    if not groups:
        raise ValueError(f"{run.path}: no nospec or nospec-keyed lengths")
    lengths = LengthSource(description=(
        f"measured lengths from {run.path} (the baselines' steps: {len(groups)} prompt "
        "groups)"), groups=groups)
    names = [n for n in run.modes if n != "nospec-keyed" or "nospec" not in run.modes]
    share, where = flip_stats(run, flips)
    held = caught_share(run, flips)
    modes = [replace(_flipped_spec(run, n, flips) if share else pooled_spec(run, n),
                     rate_spread=rate_spread(run, n, flip_caps(run, n, flips)))
             for n in names]
    cfg = SimConfig(prompts_per_rank=max(1, run.prompts // run.ranks), n=run.n,
                    prompt_len=round(run.prompt_len(first)), steps=steps,
                    pregen_inflight=PREGEN_INFLIGHT, train_s=window_s, cover_cv=cover_cv,
                    flip_share=share, flip_positions=where, caught_share=held, seed=seed,
                    lookahead=lookahead,
                    rate_spread=any(m.rate_spread for m in modes),
                    async_baseline=any(m.async_host for m in run.modes.values()),
                    spec_host_s=0.0)  # modes without measured host time: none was charged
    notes = [(f"calibrated from {run.path}: per-rank workload, lengths and pooled acceptance "
             f"of its {run.ranks}-rank run; trainer {window_s:g} s (its training window); "
             "the keyed baseline equals nospec in the model (same lengths)")]
    if all(m.host_s is None for m in run.modes.values()):
        notes.append("no pace counters in the record: projected as it was paced, without "
                     "the async-scheduled baseline and the product's host work (the charges "
                     "of docs/results.md 'Every cost charged in the simulator')")
    if share:
        notes.append(f"measured flips: {share:.1%} of the responses with a draft leave it, "
                     f"at median {np.median(where):.2f} of their length; a margin branch (or "
                     f"the draft again) caught {held:.0%} of them")
    for m in modes:
        if m.rate_spread:
            x = np.asarray(m.rate_spread)
            what = "after a flip, over its tail class's" if m.uses_pregen else "over the mode's"
            notes.append(f"measured per-request spread {m.name}: tokens per forward {what} "
                         f"x one of {x.size} measured multipliers (CV "
                         f"{x.std() / x.mean():.2f}, 10th percentile {np.percentile(x, 10):.2f})")
    return Scenario(cfg, ranks, modes, EngineTime.preset(run.pace), lengths, notes,
                    f"calibrated from {Path(run.path).name}")


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def mode_lines(run: PacedRun, pooled: dict[str, Replayed], stepwise: dict[str, Replayed]
               ) -> list[str]:
    """Per mode: measured and modelled speed-ups and the gaps."""
    fmt = "{:<24} {:<13} {:>8} {:>8} {:>7} {:>6} {:>9} {:>7}"
    out = [f"{TAG} " + fmt.format("mode", "vs", "measured", "modelled", "gap", "<=10%",
                                  "per-step", "gap")]
    for name, r in pooled.items():
        if r.baseline == name:
            continue
        gap = r.modelled_speedup / r.measured_speedup - 1.0
        s2 = stepwise[name].modelled_speedup
        out.append(f"{TAG} " + fmt.format(
            name, r.baseline, f"{r.measured_speedup:.2f}x", f"{r.modelled_speedup:.2f}x",
            _pct(gap), "yes" if abs(gap) <= WITHIN else "NO", f"{s2:.2f}x",
            _pct(s2 / r.measured_speedup - 1.0)))
    return out


def step_lines(run: PacedRun, pooled: dict[str, Replayed]) -> list[str]:
    """Per mode and step: measured / modelled figures."""
    out = [(f"{TAG} per step, measured/modelled: rollout s | critical-path forwards | bubble "
           "| pre-gen tokens made for the next step | covered share (fetched/T)")]
    for name, r in pooled.items():
        for raw, sim in zip(run.modes[name].steps, r.steps):
            c = Counts.of([raw])
            made = raw.get("pregen_tokens", 0) + raw.get("window_pregen_tokens", 0)
            out.append(
                f"{TAG} {name:<24} step {sim.step}: {raw['wall_s'] / run.scale_of(name):6.2f}/"
                f"{sim.rollout_time_s:<6.2f} | {raw['decode_steps_critical']:>4}/"
                f"{sim.cp_forwards:<4} | {raw['bubble_fraction']:.2f}/"
                f"{sim.bubble_s / max(run.ranks * sim.rollout_time_s, 1e-12):.2f} | "
                f"{made:>5}/{sim.pregen_tokens:<5} | {c.coverage:.2f}/{sim.coverage:.2f}")
    return out


def rank_lines(run: PacedRun, pooled: dict[str, Replayed]) -> list[str]:
    """Per rank forwards of the steps that had pre-generated drafts (measured/modelled)."""
    out = []
    for name, r in pooled.items():
        for raw, sim in zip(run.modes[name].steps, r.steps):
            if not raw.get("drafts_fetched_tokens"):
                continue
            meas = [raw["rank_decode_steps"].get(f"r{k}", 0) for k in range(run.ranks)]
            cells = " ".join(f"{a}/{b}" for a, b in zip(meas, sim.rank_forwards))
            out.append(f"{TAG} {name:<24} step {sim.step} forwards per rank: {cells}")
    return out


def _draw_lines(reps: list[dict[str, Replayed]], head: str) -> list[str]:
    """Per mode over replays drawn with a spread: modelled mean (p10-p90) against measured,
    and the gap of the mean."""
    out = [head]
    for name, r in reps[0].items():
        if r.baseline == name:
            continue
        sp = np.array([rep[name].modelled_speedup for rep in reps])
        out.append(f"{TAG} {name:<24} measured {r.measured_speedup:.2f}x, modelled "
                   f"{sp.mean():.2f}x ({np.percentile(sp, 10):.2f}-{np.percentile(sp, 90):.2f}),"
                   f" gap {_pct(sp.mean() / r.measured_speedup - 1.0)}")
    return out


def spread_lines(run: PacedRun, cover_cv: float, draws: int) -> list[str]:
    """The replay's speed-ups with an ASSUMED per-request spread of the covered acceptance
    (`cover_cv`), over `draws` draws: mean and 10th-90th percentiles against measured."""
    reps = [replay_all(run.path, cover_cv=cover_cv, seed=k) for k in range(draws)]
    return _draw_lines(reps, f"{TAG} sensitivity (assumed, not measured): covered acceptance "
                             f"spread per request, gamma CV {cover_cv:g}, {draws} draws: "
                             "modelled mean (p10-p90), gap")


def tail_spread_lines(run: PacedRun, flips: Flips | None, draws: int) -> list[str]:
    """The replay's speed-ups with each request's rate drawn from its mode's MEASURED
    per-request spread (`tails.rate_spread`), over `draws` draws: mean (p10-p90), gap, and
    `sim_vs_paced_gap_spread: ...` of the means."""
    reps = [replay_all(run.path, seed=k, flips=flips, draw_spread=True) for k in range(draws)]
    out = _draw_lines(reps, f"{TAG} with the measured per-request spread (tails of the "
                            "pre-generating modes, whole responses of the others), "
                            f"{draws} draws: modelled mean (p10-p90), gap")
    mean = {name: replace(r, modelled_speedup=float(np.mean(
        [rep[name].modelled_speedup for rep in reps]))) for name, r in reps[0].items()}
    return [*out, gap_line(mean).replace("sim_vs_paced_gap:", "sim_vs_paced_gap_spread:")]


def gap_line(pooled: dict[str, Replayed]) -> str:
    """`sim_vs_paced_gap: ...` over the modes that ran (pooled acceptance): those of
    `GAP_KEYS` in its order, then any other mode with its baseline in the run."""
    labels = {m.name: m.key for m in ALL_MODES}
    cells, ok, n = [], 0, 0
    for name in [*GAP_KEYS, *(k for k in pooled if k not in GAP_KEYS)]:
        r = pooled.get(name)
        if r is None or r.baseline not in pooled or r.baseline == name:
            continue
        gap = r.modelled_speedup / r.measured_speedup - 1.0
        n += 1
        ok += abs(gap) <= WITHIN
        cells.append(f"{labels.get(name, name)}={_pct(gap)}")
    return f"sim_vs_paced_gap: {' '.join(cells)} (within 10%: {ok}/{n})"


def _flipped_spec(run: PacedRun, name: str, flips: Flips | None) -> ModeSpec:
    """A mode's pooled spec with measured flips: covered acceptance solved on the tokens
    before them, covered rates per head-length class, after-flip rates per tail-length
    class (of the flips a branch caught and of the others)."""
    caps = flip_caps(run, name, flips)
    spec = with_head_rates(with_tail_rates(pooled_spec(run, name, lost_tokens(run, name, caps)),
                                           *split_rates(run, name, caps)),
                           head_rates(run, name, caps))
    assert isinstance(spec, ModeSpec)
    return spec


def flip_lines(run: PacedRun, flips: Flips | None, src: str) -> tuple[list[str], bool]:
    """How many responses of each pre-generating mode left their drafts where (measured),
    and whether any flip is known."""
    out, any_caps = [], False
    for name in run.modes:
        caps = flip_caps(run, name, flips)
        if caps is None:
            continue
        any_caps = True
        hit = caps[1:] < NO_FLIP
        out.append(f"{TAG} flips {name}: {int(hit.sum())} of {hit.size} responses after step "
                   f"0 left their draft ({src}); tokens after the flips: "
                   f"{int(lost_tokens(run, name, caps)[1:].sum())}")
        rates, held = split_rates(run, name, caps)
        for what, r in (("", rates), (" of the flips a branch caught", held)):
            if r:
                out.append(f"{TAG} after-flip acceptance{what} {name} by tail length "
                           "(per-request records; tail tokens <= edge: accepted per "
                           "forward): " + " ".join(f"{e:g}:{x:.2f}" for e, x in r))
        heads = head_rates(run, name, caps)
        if heads:
            out.append(f"{TAG} covered acceptance {name} by head length (per-request "
                       "records; tokens up to the flip <= edge: accepted per forward): "
                       + " ".join(f"{e:g}:{x:.2f}" for e, x in heads))
    return out, any_caps


def whatif(run: PacedRun, flips: Flips, plain: Flips) -> dict[str, tuple[float, float, float]]:
    """Per pre-generating mode: (modelled speed-up with the flips branches leave, modelled
    with all measured flips `plain`, measured), MODELLED but the last."""
    rep, base = replay_all(run.path, flips=flips), replay_all(run.path, flips=plain)
    return {name: (r.modelled_speedup, base[name].modelled_speedup, r.measured_speedup)
            for name, r in rep.items() if run.modes[name].pregen and r.baseline in rep}


def whatif_lines(run: PacedRun, flips: Flips, plain: Flips, branches: int) -> list[str]:
    """`whatif` as a line: the replay with the flips that `branches` branches per draft
    leave (`flips`) beside the replay with all measured flips (`plain`)."""
    cells = [f"{name} {b:.2f}x (replay without branches {p:.2f}x, measured {m:.2f}x)"
             for name, (b, p, m) in whatif(run, flips, plain).items()]
    left = sum(1 for k in flips)
    return [f"{TAG} what-if, MODELLED: margin branching, {branches} branch(es) per draft at "
            f"its lowest margins ({left} flips left uncovered; branch pre-generation assumed "
            f"to fit the bubble): " + ", ".join(cells)]


def compare(run: PacedRun, first: dict[str, Any], cover_cv: float = 0.0, draws: int = 20,
            flips: Flips | None = None, flips_src: str = ""
            ) -> tuple[list[str], dict[str, Any]]:
    """The comparison's lines (the gap line last) and its JSON document; with `cover_cv`
    also the sensitivity to a per-request spread of the covered acceptance. With measured
    flips (`flips`, or the records' own) the replay caps each response's coverage at its
    flip, and the replay without them is printed beside it."""
    fl, has_flips = flip_lines(run, flips, flips_src or "the paced records")
    pooled = replay_all(run.path, flips=flips)
    stepwise = replay_all(run.path, per_step=True, flips=flips)
    if has_flips:
        fl.append(f"{TAG} without the flips: " + gap_line(replay_all(run.path,
                                                                     use_flips=False)))
        fl.append(f"{TAG} flips, one pooled after-flip rate: " + gap_line(
            replay_all(run.path, flips=flips, tail_classes=False)))
        fl.append(f"{TAG} flips, each response at its own measured rate (tails, covered "
                  "heads, whole responses; replays the rates, checks the rest): "
                  + gap_line(replay_all(run.path, flips=flips, own_rates=True)))
    checks = assignment_check(run, assignments(run))
    own = ", ".join(f"{k} x{m.scale:g}" for k, m in run.modes.items()
                    if m.scale and m.scale != run.scale)
    head = [(f"{TAG} paced run {run.path}: {run.ranks} ranks, {run.pace} x {run.scale:g}"
             + (f" ({own})" if own else "") + ", "
            f"{run.prompts} prompts x n={run.n}, {run.steps} steps; replayed on each mode's "
            f"own lengths and assignment, prompt {run.prompt_len(first):.0f} tokens (prefill "
            f"counters), {PREGEN_INFLIGHT} pre-gen lanes per rank; figures after step 0; "
            "measured = paced wall s / scale, modelled = simulator"
            + (f"; {run.seeds} seeds: speed-ups over all of them (as the bench), steps "
               "and ranks of the first" if run.seeds > 1 else "")),
            f"{TAG} assignment replay (gateway LPT over each cluster's modes) reproduces the "
            "per-rank decode steps of " + (", ".join(
                f"{k}: {'yes' if v else 'NO'}" for k, v in checks.items()) or "no mode")]
    head += [f"{TAG} input {pooled_spec(run, n).describe()}" for n in run.modes]
    spread = spread_lines(run, cover_cv, draws) if cover_cv > 0 and draws > 0 else []
    if has_flips and draws > 0 and any(rate_spread(run, n, flip_caps(run, n, flips))
                                       for n in run.modes if run.modes[n].pregen):
        spread += tail_spread_lines(run, flips, draws)
    lines = (head + fl + mode_lines(run, pooled, stepwise) + step_lines(run, pooled)
             + rank_lines(run, pooled) + spread + [gap_line(pooled)])
    doc = {"label": "measured (paced) beside modelled (simulator replay)", "path": run.path,
           "assignment_check": checks,
           "modes": {n: {"baseline": r.baseline, "measured_speedup": r.measured_speedup,
                         "modelled_speedup": r.modelled_speedup,
                         "modelled_speedup_per_step_acceptance":
                             stepwise[n].modelled_speedup,
                         "spec": asdict(pooled_spec(run, n)),
                         "steps": [asdict(s) for s in r.steps]}
                     for n, r in pooled.items()},
           "gap_line": lines[-1]}
    return lines, doc
