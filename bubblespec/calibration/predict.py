"""`bubblespec predict`: will bubblespec help *my* run? The calibrated simulator on a user's
own per-step response lengths, with an interval per mode. Every figure is MODELLED.

Inputs (docs/predict.md has the formats):

- a trace, JSONL, one line per rollout step: either the lengths of every response
  (`{"step": s, "lengths": [...], "prompt_ids": [...]}`, or `"lengths"` as one list per
  prompt), or the per-step length statistics verl logs (`response_length/mean`, `/max`,
  `/min`, `/clip_ratio`), slime logs (`rollout/response_len/mean`, `/median`, `/max`,
  `/min`, `rollout/truncated_ratio`) or a generic `{"mean", "std", "median", "max", "min",
  "clip_ratio", "count"}`. From statistics a step's lengths are drawn from a log-normal
  matched to them (`fit_lognormal`: the assumption, stated with the figures);
- the run's rollout ranks, GPU preset and model size (the engine-time model), optionally a
  measured acceptance (`--accept-json`, as `bubblespec simulate` takes it);
- a paced record (`bubblespec bench paced`) that calibrates the simulator: every mode's
  pooled measured acceptance, measured flips and per-request spread where the record has
  them, and the replay's error per mode (`calibration_errors`).

How: each of `seeds` draws replays the trace's steps in order, a simulated step taking the
same trace step's prompts and drawing each prompt's n responses from its logged siblings
(another run of the same prompts: its responses vary, its prompts do not), and runs every
mode on the same draw (`bubblespec.sim.model.run_scenario`). The interval of a mode
(`Prediction`): the 10th-90th percentile of the speed-up that a measurement of two separate
runs would show (the mode's throughput in draw j over the baseline's in draw k, j != k:
separate runs do not share lengths), widened by the calibration's stated error of the
mode: max(10%, |replay gap|) as `bubblespec simulate --calibrate` reports the gap on the
calibrating paced run (lower end / (1 + e), upper end x (1 + e)). The point is the mean
over draws of the speed-up on common lengths.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from bubblespec.calibration.replay import PREGEN_INFLIGHT, replay_all
from bubblespec.calibration.report import WITHIN, load, scenario
from bubblespec.core.engine_time import EngineTime
from bubblespec.sim.model import SimConfig, run_scenario
from bubblespec.sim.policy import ModeSpec
from bubblespec.sim.workload import LengthSource

TAG = "[modelled]"
DEFAULT_CALIBRATION = Path(__file__).resolve().with_name("data") / "paced_small.json"
"""The paced record predict calibrates on by default, shipped with the package (cut from the
first valid paced 8-rank run; also the calibration tests' fixture)."""

VERL = {"mean": "response_length/mean", "max": "response_length/max",
        "min": "response_length/min", "clip_ratio": "response_length/clip_ratio"}
"""verl's per-step response-length metrics (its `compute_data_metrics`)."""
SLIME = {"mean": "rollout/response_len/mean", "median": "rollout/response_len/median",
         "max": "rollout/response_len/max", "min": "rollout/response_len/min",
         "clip_ratio": "rollout/truncated_ratio"}
"""slime's (`compute_metrics_from_samples` under the `rollout/` prefix)."""
GENERIC = ("mean", "std", "median", "max", "min", "clip_ratio", "count")
STEP_KEYS = ("step", "training/global_step", "rollout/step", "_step")


class TraceError(ValueError):
    """A bad trace: the message names the file, the line and the field."""


# ---------------------------------------------------------------------------- the trace


@dataclass(frozen=True)
class Lognormal:
    """A step's lengths drawn from statistics: log-normal (mu, sigma) clipped to [lo, cap]."""

    mu: float
    sigma: float
    lo: float
    cap: float
    basis: str
    """Which statistics fixed it (for the notes)."""


@dataclass
class TraceStep:
    """One rollout step of the trace: its responses by prompt, or its statistics."""

    step: int
    groups: list[np.ndarray] = field(default_factory=list)
    """Response lengths per prompt (siblings), when the trace has them."""
    flat: np.ndarray | None = None
    """Response lengths without prompt ids (drawn i.i.d.)."""
    dist: Lognormal | None = None
    count: int | None = None
    """Responses in the step (statistics: `count` when logged)."""
    prompt_len: float | None = None
    train_s: float | None = None
    stats: dict[str, float] | None = None
    """The logged statistics behind `dist` (refitted once the batch size is known)."""
    budget: float | None = None
    n: int | None = None
    """Samples per prompt the run drew, when the line says ("n"; its lengths may hold more
    samples of a prompt than that, all candidates for a draw)."""

    def draw(self, rng: np.random.Generator, prompts: int, n: int,
             sibling_corr: float) -> np.ndarray:
        """(prompts, n) lengths of another run of this step: the step's own prompts (drawn
        with replacement only when `prompts` differs from theirs), each prompt's n responses
        drawn with replacement from its logged siblings (a run's responses vary, its
        prompts do not)."""
        if self.groups:
            k = len(self.groups)
            pick = np.arange(k) if prompts == k else rng.integers(0, k, size=prompts)
            return np.stack([rng.choice(self.groups[gi], size=n) for gi in pick])
        if self.flat is not None:
            return rng.choice(self.flat, size=(prompts, n))
        d = self.dist
        assert d is not None
        sp, ss = d.sigma * math.sqrt(sibling_corr), d.sigma * math.sqrt(1 - sibling_corr)
        logs = (d.mu + sp * rng.standard_normal((prompts, 1))
                + ss * rng.standard_normal((prompts, n)))
        return np.clip(np.round(np.exp(logs)), max(1.0, d.lo), d.cap).astype(np.int64)


@dataclass
class Trace:
    """A user's run as per-step response lengths or their statistics."""

    path: str
    steps: list[TraceStep]
    kind: str
    """"per-sample" or the statistics' dialect ("verl", "slime", "generic")."""

    @property
    def n(self) -> int | None:
        """Samples per prompt: the lines' "n", else the commonest group size (None without
        prompt ids)."""
        ns = [s.n for s in self.steps if s.n]
        if ns:
            return int(np.bincount(ns).argmax())
        sizes = [len(g) for s in self.steps for g in s.groups]
        return int(np.bincount(sizes).argmax()) if sizes else None

    @property
    def prompts(self) -> int | None:
        """Prompts per step: the median over steps (None without prompt ids)."""
        counts = [len(s.groups) for s in self.steps if s.groups]
        return int(np.median(counts)) if counts else None

    @property
    def responses(self) -> int | None:
        """Responses per step: the median over steps (None if the trace does not say)."""
        counts = [len(s.flat) if s.flat is not None else s.count for s in self.steps]
        counts = [c for c in counts if c]
        return int(np.median(counts)) if counts else None

    def mean_of(self, attr: str) -> float | None:
        xs = [getattr(s, attr) for s in self.steps if getattr(s, attr) is not None]
        return float(np.mean(xs)) if xs else None


def _num(v: Any, where: str, lo: float = 0.0) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo:
        raise TraceError(f"{where}: expected a number >= {lo:g}, got {v!r}")
    return float(v)


def _lengths(v: Any, where: str) -> np.ndarray:
    if not isinstance(v, list) or not v:
        raise TraceError(f"{where}: expected a non-empty list of token counts")
    a = np.asarray([_num(x, f"{where}[{i}]") for i, x in enumerate(v)])
    if np.any(a != np.round(a)):
        raise TraceError(f"{where}: token counts must be integers")
    return np.maximum(1, a).astype(np.int64)


def _per_sample(d: dict, where: str) -> TraceStep:
    """A line with "lengths" (flat, with optional "prompt_ids"/"prompt_index", or one list
    per prompt)."""
    raw = d["lengths"]
    if isinstance(raw, list) and raw and all(isinstance(x, list) for x in raw):
        groups = [_lengths(g, f"{where}: lengths[{i}]") for i, g in enumerate(raw)]
        return TraceStep(0, groups=groups)
    flat = _lengths(raw, f"{where}: lengths")
    ids_key = next((k for k in ("prompt_ids", "prompt_index") if k in d), None)
    if ids_key is None:
        return TraceStep(0, flat=flat)
    ids = d[ids_key]
    if not isinstance(ids, list) or len(ids) != len(flat):
        raise TraceError(f"{where}: {ids_key}: expected one id per length ({len(flat)}), got "
                         f"{len(ids) if isinstance(ids, list) else type(ids).__name__}")
    by: dict[str, list[int]] = {}
    for i, (pid, length) in enumerate(zip(ids, flat)):
        if not isinstance(pid, (int, str)) or isinstance(pid, bool):
            raise TraceError(f"{where}: {ids_key}[{i}]: expected an int or a string")
        by.setdefault(str(pid), []).append(int(length))
    return TraceStep(0, groups=[np.asarray(g, dtype=np.int64) for g in by.values()])


def fit_lognormal(stats: dict[str, float], where: str, budget: float | None = None
                  ) -> Lognormal:
    """The log-normal a step's statistics fix, clipped to [min, cap]; cap = the logged max,
    or `budget` when given. In order of preference:

    - mean and std: moment match (sigma^2 = ln(1 + (std/mean)^2));
    - mean and median (slime): median = e^mu, mean = e^(mu + sigma^2/2);
    - mean, max and a clip ratio c > 0 (verl, slime): the max is the budget, P(L >= max) = c,
      and the clipped mean equals the logged mean (solved for sigma by bisection);
    - mean and max: the max of the step's `count` responses (`predict` passes the batch,
      prompts x n, when the line has no count) sits at the 1 - 1/(count + 1) quantile (the
      smaller sigma that fits).
    Lengths drawn from it are an assumption about the shape (a long right tail), not data."""
    mean = stats["mean"]
    lo = stats.get("min", 1.0)
    hi = stats.get("max")
    cap = budget or hi or math.inf
    if "std" in stats and stats["std"] > 0:
        s2 = math.log(1.0 + (stats["std"] / mean) ** 2)
        return Lognormal(math.log(mean) - s2 / 2, math.sqrt(s2), lo, cap, "mean and std")
    if "median" in stats and 0 < stats["median"] < mean:
        s2 = 2.0 * math.log(mean / stats["median"])
        return Lognormal(math.log(stats["median"]), math.sqrt(s2), lo, cap, "mean and median")
    if hi is None or hi <= mean:
        return Lognormal(math.log(mean), 0.0, lo, cap, "mean only (no spread logged)")
    c = stats.get("clip_ratio", 0.0)
    if 0 < c < 1:
        z = NormalDist().inv_cdf(1.0 - c)
        cap_t = budget or hi

        def clipped_mean(s: float) -> float:
            mu = math.log(cap_t) - s * z
            return (math.exp(mu + s * s / 2) * NormalDist().cdf(z - s) + cap_t * c)

        a, b = 1e-3, 6.0
        if not clipped_mean(a) <= mean <= clipped_mean(b) and not (
                clipped_mean(b) <= mean <= clipped_mean(a)):
            raise TraceError(f"{where}: mean {mean:g}, max {hi:g} and clip ratio {c:g} fit no "
                             "log-normal clipped at the max")
        fa = clipped_mean(a) - mean
        for _ in range(80):
            m = (a + b) / 2
            fm = clipped_mean(m) - mean
            if (fm > 0) == (fa > 0):
                a, fa = m, fm
            else:
                b = m
        s = (a + b) / 2
        return Lognormal(math.log(cap_t) - s * z, s, lo, cap_t,
                         "mean, max and clip ratio (max = the length budget)")
    k = stats.get("count") or 1000
    z = NormalDist().inv_cdf(1.0 - 1.0 / (k + 1))
    d = math.log(hi / mean)
    s = z - math.sqrt(z * z - 2 * d) if z * z > 2 * d else z
    return Lognormal(math.log(mean) - s * s / 2, s, lo, cap,
                     f"mean and max (max at the 1-1/{int(k) + 1} quantile)")


def _stats_step(d: dict, where: str, budget: float | None) -> tuple[TraceStep, str]:
    """A line of per-step statistics (verl, slime or generic keys)."""
    src = d.get("data") if isinstance(d.get("data"), dict) else d
    for dialect, keys in (("verl", VERL), ("slime", SLIME),
                          ("generic", {k: k for k in GENERIC})):
        if keys["mean"] in src:
            break
    stats = {}
    for name, key in keys.items():
        if key in src and src[key] is not None:
            stats[name] = _num(src[key], f"{where}: {key}")
    if stats["mean"] <= 0:
        raise TraceError(f"{where}: {keys['mean']}: the mean length must be > 0")
    if "max" in stats and stats["max"] < stats["mean"]:
        raise TraceError(f"{where}: {keys['max']}: below the mean")
    if "min" in stats and stats["min"] > stats["mean"]:
        raise TraceError(f"{where}: {keys['min']}: above the mean")
    if stats.get("clip_ratio", 0.0) > 1:
        raise TraceError(f"{where}: {keys['clip_ratio']}: a ratio in [0, 1]")
    step = TraceStep(0, dist=fit_lognormal(stats, where, budget),
                     count=int(stats["count"]) if "count" in stats else None, stats=stats,
                     budget=budget)
    if "prompt_length/mean" in src:
        step.prompt_len = _num(src["prompt_length/mean"], f"{where}: prompt_length/mean")
    if "timing_s/step" in src and "timing_s/gen" in src:
        step.train_s = max(0.0, _num(src["timing_s/step"], f"{where}: timing_s/step")
                           - _num(src["timing_s/gen"], f"{where}: timing_s/gen"))
    return step, dialect


def read_trace(path: str | Path, budget: float | None = None) -> Trace:
    """Read and check a trace (TraceError naming the line and the field)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None
    steps: list[TraceStep] = []
    kinds = set()
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path} line {no}"
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(d, dict):
            raise TraceError(f"{where}: expected a JSON object, got {type(d).__name__}")
        inner = d.get("data") if isinstance(d.get("data"), dict) else d
        if "lengths" in d:
            st, kind = _per_sample(d, where), "per-sample"
        elif any(k in inner for k in (VERL["mean"], SLIME["mean"], "mean")):
            st, kind = _stats_step(d, where, budget)
        else:
            raise TraceError(f"{where}: no \"lengths\" and no length statistics (want "
                             f"\"{VERL['mean']}\" (verl), \"{SLIME['mean']}\" (slime) or "
                             "\"mean\")")
        step = next((d[k] for k in STEP_KEYS if k in d), next(
            (inner[k] for k in STEP_KEYS if k in inner), len(steps)))
        st.step = int(_num(step, f"{where}: step"))
        for key in ("prompt_len", "train_s", "n"):
            if key in d:
                setattr(st, key, _num(d[key], f"{where}: {key}", 1.0 if key == "n" else 0.0))
        if st.n is not None:
            st.n = int(st.n)
        kinds.add(kind)
        steps.append(st)
    if not steps:
        raise TraceError(f"{path}: no steps (one JSON object per line)")
    if len(kinds) > 1:
        raise TraceError(f"{path}: mixes per-sample lines and statistics ({sorted(kinds)})")
    ordered = sorted(steps, key=lambda s: s.step)
    return Trace(str(path), ordered, kinds.pop())


def paced_trace(path: str | Path, mode: str = "all") -> list[dict[str, Any]]:
    """The trace lines of a paced run: per step, the lengths of one mode's responses (or,
    with "all", of every mode's: each mode sampled the same prompts of a step, so a prompt
    holds every response the bench drew for it) with prompt ids, the run's n, its prompt
    tokens (prefill counters) and the trainer time of the projection (the record's training
    window, modelled seconds)."""
    run, first, window = load(path)
    names = list(run.modes) if mode == "all" else [mode]
    if mode != "all" and mode not in run.modes:
        raise TraceError(f"{path}: no mode {mode!r} with steps (have: all, "
                         f"{', '.join(run.modes)})")
    plen = run.prompt_len(first)
    out = []
    for k in range(run.steps):
        lengths: list[int] = []
        ids: list[str] = []
        for name in names:
            s = run.modes[name].steps[k]
            for key, row in zip(s["prompt_keys"], s["output_lengths"]):
                lengths += [int(x) for x in row]
                ids += [str(key)] * len(row)
        out.append({"step": int(run.modes[names[0]].steps[k].get("step", k)),
                    "lengths": lengths, "prompt_ids": ids, "n": run.n,
                    "prompt_len": round(plen, 2), "train_s": window})
    return out


# ---------------------------------------------------------------------------- calibration


@dataclass
class Calibration:
    """What a paced record gives the prediction: modes, flips, spread and errors."""

    path: str
    modes: list[ModeSpec]
    cfg: SimConfig
    """The calibrated scenario's configuration (flips, spread; the workload is replaced)."""
    gaps: dict[str, float]
    """Per mode: the replay's modelled speed-up / measured - 1 on the paced run."""
    measured: dict[str, float]
    """Per mode: the paced run's measured speed-up (against its own baseline)."""
    spread: bool
    """The gaps are of the replay with the measured per-request spread drawn."""

    def error(self, mode: str) -> tuple[float, str]:
        """The stated error of a mode and where it comes from."""
        if mode in self.gaps:
            g = abs(self.gaps[mode])
            return max(WITHIN, g), (f"replay gap {self.gaps[mode]:+.1%} on {Path(self.path).name}"
                                    + (", floor 10%" if g < WITHIN else ""))
        worst = max((abs(g) for g in self.gaps.values()), default=0.0)
        return max(WITHIN, worst), "not calibrated: the largest replay gap of any mode"


def calibrate(path: str | Path, draws: int = 20) -> Calibration:
    """Read a paced record and derive the calibrated inputs and the error per mode."""
    run, first, window = load(path)
    s = scenario(run, first, window, [run.ranks], run.steps, 0)
    spread = any(m.rate_spread for m in s.modes if m.uses_pregen)
    if spread:
        reps = [replay_all(run.path, seed=k, draw_spread=True) for k in range(draws)]
        mean = {n: float(np.mean([r[n].modelled_speedup for r in reps])) for n in reps[0]}
        rep = reps[0]
    else:
        rep = replay_all(run.path)
        mean = {n: r.modelled_speedup for n, r in rep.items()}
    gaps = {n: mean[n] / r.measured_speedup - 1.0 for n, r in rep.items()
            if r.baseline != n and r.baseline in rep and r.measured_speedup > 0}
    measured = {n: r.measured_speedup for n, r in rep.items()}
    return Calibration(str(path), s.modes, s.cfg, gaps, measured, spread)


# ---------------------------------------------------------------------------- prediction


class TraceLengths(LengthSource):
    """The trace as the simulator's length source: the k-th draw of a scenario comes from
    the trace's k-th chosen step (`draw_steps` draws every step once, in order)."""

    def __init__(self, trace: Trace, steps: list[int], sibling_corr: float) -> None:
        super().__init__(description=f"trace {trace.path}")
        self.trace, self.order, self.sibling_corr, self.k = trace, steps, sibling_corr, 0

    def sample(self, rng: np.random.Generator, prompts: int, n: int) -> np.ndarray:
        st = self.trace.steps[self.order[self.k % len(self.order)]]
        self.k += 1
        return st.draw(rng, prompts, n, self.sibling_corr)


@dataclass
class ModePrediction:
    """One mode's MODELLED speed-up over no speculation."""

    mode: str
    speedup: float
    """Mean over draws, common lengths."""
    low: float
    high: float
    """The interval (module docstring)."""
    run_low: float
    run_high: float
    """Its run-to-run part (10th-90th percentile of separate-run ratios)."""
    error: float
    error_source: str
    per_draw: list[float]


@dataclass
class Prediction:
    """A trace's prediction: inputs, per-mode figures and the notes behind them."""

    trace: Trace
    ranks: int
    prompts: int
    n: int
    steps: list[int]
    cfg: SimConfig
    engine: EngineTime
    modes: list[ModeSpec]
    baseline: str
    results: list[ModePrediction]
    seeds: int
    notes: list[str]
    calibration: Calibration

    def to_json(self) -> dict[str, Any]:
        return {
            "label": "MODELLED: calibrated simulator, not a measurement",
            "trace": self.trace.path, "trace_kind": self.trace.kind,
            "trace_steps_used": [self.trace.steps[i].step for i in self.steps],
            "ranks": self.ranks, "prompts": self.prompts, "n": self.n,
            "prompt_len": self.cfg.prompt_len, "train_s": self.cfg.train_s,
            "engine": self.engine.describe(), "seeds": self.seeds,
            "calibration": self.calibration.path, "baseline": self.baseline,
            "interval": INTERVAL,
            "modes": {r.mode: {"speedup": r.speedup, "low": r.low, "high": r.high,
                               "run_to_run_p10": r.run_low, "run_to_run_p90": r.run_high,
                               "calibration_error": r.error,
                               "calibration_error_source": r.error_source,
                               "speedup_per_draw": r.per_draw} for r in self.results},
            "mode_specs": [m.describe() for m in self.modes],
            "notes": self.notes,
        }


INTERVAL = ("10th-90th percentile over draws of the speed-up two separate runs would "
            "measure (mode throughput in draw j / baseline's in draw k, j != k), lower end "
            "/ (1 + e), upper end x (1 + e), e = max(10%, |replay gap of the mode on the "
            "calibrating paced run|)")


def choose_steps(total: int, limit: int) -> list[int]:
    """Trace steps to simulate: all of them, or `limit` evenly spaced (first and last in)."""
    if total <= limit:
        return list(range(total))
    return sorted({round(i * (total - 1) / (limit - 1)) for i in range(limit)})


def predict(trace: Trace, ranks: int, engine: EngineTime, cal: Calibration, *,
            prompts: int | None = None, n: int | None = None,
            prompt_len: float | None = None, train_s: float | None = None,
            modes: list[ModeSpec] | None = None, accept_notes: list[str] | None = None,
            seeds: int = 8, max_steps: int = 16, sibling_corr: float = 0.5,
            assign: str = "round_robin", seed: int = 0) -> Prediction:
    """Simulate the trace `seeds` times per mode; ValueError names the flag or field."""
    if ranks < 1 or seeds < 1 or max_steps < 2:
        raise ValueError("--ranks and --seeds must be >= 1, --steps >= 2")
    if not 0 <= sibling_corr <= 1:
        raise ValueError("--sibling-corr must be in [0, 1]")
    notes = list(accept_notes or [])
    n = n or trace.n
    if n is None:
        raise ValueError(f"{trace.path}: no prompt ids, so the samples per prompt are unknown: "
                         "give --n")
    if prompts is None:
        prompts = trace.prompts
        if prompts is None and trace.responses:
            prompts = max(1, trace.responses // n)
        if prompts is None:
            raise ValueError(f"{trace.path}: the statistics give no batch size: give --prompts "
                             "(prompts per step)")
    if prompts < 1 or n < 1:
        raise ValueError("--prompts and --n must be >= 1")
    if prompts < ranks:
        notes.append(f"{prompts} prompts over {ranks} ranks: some ranks get no prompt")
    for st in trace.steps:  # a logged max is the max of the step's batch: refit with it
        if st.stats is not None and "count" not in st.stats:
            st.dist = fit_lognormal({**st.stats, "count": prompts * n},
                                    f"{trace.path} step {st.step}", st.budget)
    steps = choose_steps(len(trace.steps), max_steps)
    if len(steps) < 2:
        notes.append("the trace has one step: it is drawn twice (a step to pre-generate in, "
                     "one to use the drafts)")
        steps = [0, 0]
    plen = prompt_len if prompt_len is not None else trace.mean_of("prompt_len")
    if plen is None:
        plen = 256.0
        notes.append("prompt tokens 256 (assumed; --prompt-len, or prompt_length/mean in "
                     "the trace)")
    tr = train_s if train_s is not None else trace.mean_of("train_s")
    if tr is None:
        tr = 0.0
        notes.append("trainer time between steps 0 s (assumed: no training window, every "
                     "pre-gen stop lag counts; --train-s, or timing_s/step - timing_s/gen in "
                     "a verl trace)")
    elif train_s is None:
        notes.append(f"trainer time between steps {tr:.3g} s, the trace's mean (its seconds "
                     "are taken as the engine model's)")
    if trace.kind != "per-sample":
        d = trace.steps[steps[-1]].dist
        assert d is not None
        notes.append(f"lengths drawn from per-step {trace.kind} statistics: log-normal fitted "
                     f"to {d.basis}, clipped to [min, max] (ASSUMED shape), sibling "
                     f"correlation {sibling_corr:g} in log length (assumed)")
    elif not trace.steps[0].groups:
        notes.append("no prompt ids: siblings drawn i.i.d. (no sibling correlation)")
    if modes is None:
        modes = cal.modes
        base_cfg = cal.cfg
        notes.append(f"acceptance per mode: measured on {cal.path} (pooled over its steps "
                     "after step 0); it transfers to another model and task only as an "
                     "assumption: --accept-json with your own")
        if not base_cfg.async_baseline and all(m.host_s is None for m in modes):
            notes.append(f"{Path(cal.path).name} was paced before every cost was charged: "
                         "predicted as it was paced, without the async-scheduled baseline "
                         "and the product's host work per forward (a GPU user's speed-up is "
                         "lower; docs/results.md 'Every cost charged in the simulator')")
    else:
        base_cfg = SimConfig()
        notes.append("acceptance from --accept-json; the calibration's measured flips and "
                     "per-request spread are not applied to it")
    cfg = replace(base_cfg, prompts=prompts, prompts_per_rank=max(1, prompts // ranks), n=n,
                  prompt_len=round(plen), steps=len(steps), warmup_steps=1,
                  pregen_inflight=PREGEN_INFLIGHT, train_s=tr, assign=assign)
    baseline = next((m.name for m in modes if m.is_baseline), modes[0].name)
    src = TraceLengths(trace, steps, sibling_corr)
    runs = []
    for k in range(seeds):
        src.k = 0
        rows = run_scenario(replace(cfg, seed=seed + k), ranks, modes, engine, src)
        runs.append({r.mode: r for r in rows})
    results = []
    for m in modes:
        if m.name == baseline:
            continue
        common = np.array([r[m.name].speedup for r in runs])
        cross = np.array([runs[j][m.name].throughput_tok_s / runs[i][baseline].throughput_tok_s
                          for j in range(seeds) for i in range(seeds)
                          if i != j and runs[i][baseline].throughput_tok_s > 0])
        pool = cross if cross.size else common
        lo, hi = float(np.percentile(pool, 10)), float(np.percentile(pool, 90))
        e, why = cal.error(m.name)
        results.append(ModePrediction(m.name, float(common.mean()), lo / (1 + e), hi * (1 + e),
                                      lo, hi, e, why, [float(x) for x in common]))
    return Prediction(trace, ranks, prompts, n, steps, cfg, engine, modes, baseline, results,
                      seeds, notes, cal)


# ---------------------------------------------------------------------------- output


def lines(p: Prediction) -> list[str]:
    """The labelled report: inputs, one line per mode, the interval's definition."""
    d = p.engine.describe()
    t = p.trace
    out = [f"{TAG} bubblespec predict: MODELLED by the calibrated simulator, not measured",
           (f"{TAG} trace {t.path}: {len(t.steps)} steps ({t.kind}), simulated "
            f"{len(p.steps)} in order x {p.seeds} draws ("
            + ("each step's own prompts, their n responses drawn from the logged siblings"
               if t.kind == "per-sample" else "each step's lengths drawn from its fitted "
               "log-normal") + ")"),
           (f"{TAG} run: {p.ranks} ranks, {p.prompts} prompts x n={p.n} per step, prompt "
            f"{p.cfg.prompt_len} tokens, trainer {p.cfg.train_s:.3g} s between steps; engine "
            f"{d['gpu']}: t_fixed {d['t_fixed_ms']:.2f} ms, t_kv {d['t_kv_ns']:.1f} ns/token"),
           f"{TAG} calibration: {p.calibration.path}"]
    out += [f"{TAG} mode {m.describe()}" for m in p.modes]
    out += [f"{TAG} note: {x}" for x in p.notes]
    out.append(f"{TAG} {'mode':<26} {'speed-up':>9} {'interval':>15} {'run-to-run':>13} "
               f"{'calib. error':>12}")
    for r in p.results:
        out.append(f"{TAG} {r.mode:<26} {r.speedup:>8.2f}x {r.low:>6.2f}-{r.high:<6.2f}x "
                   f"{r.run_low:>5.2f}-{r.run_high:<5.2f}x {r.error:>11.0%}  "
                   f"({r.error_source})")
    out.append(f"{TAG} speed-up: rollout throughput over {p.baseline} (no speculation), "
               f"mean over draws; interval: {INTERVAL}")
    out.append("predicted_speedup_vs_nospec (MODELLED): " + " ".join(
        f"{r.mode}={r.speedup:.2f}x[{r.low:.2f}-{r.high:.2f}]" for r in p.results))
    return out


def plot(p: Prediction, path: Path) -> None:
    """Speed-up per mode with its interval (matplotlib; ImportError without it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(p.results), 3.6))
    x = np.arange(len(p.results))
    ys = np.array([r.speedup for r in p.results])
    err = np.array([[r.speedup - r.low for r in p.results],
                    [r.high - r.speedup for r in p.results]])
    ax.errorbar(x, ys, yerr=err, fmt="o", capsize=5, label="interval (calibration x runs)")
    run = np.array([[r.speedup - r.run_low for r in p.results],
                    [r.run_high - r.speedup for r in p.results]])
    ax.errorbar(x, ys, yerr=np.maximum(run, 0), fmt="none", capsize=0, lw=5, alpha=0.35,
                label="run-to-run part")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(x, [r.mode for r in p.results], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(f"rollout speed-up vs {p.baseline}")
    ax.set_title(f"MODELLED: {Path(p.trace.path).name}, {p.ranks} ranks, {p.engine.gpu}",
                 fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(p: Prediction, out: Path) -> list[str]:
    """predict.json and predict.png under `out`; the lines saying what was written."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "predict.json").write_text(json.dumps(p.to_json(), indent=1))
    try:
        plot(p, out / "predict.png")
        return [f"{TAG} wrote {out / 'predict.json'} and {out / 'predict.png'}"]
    except ImportError:
        return [f"{TAG} wrote {out / 'predict.json'}; no plot: matplotlib is not installed"]
