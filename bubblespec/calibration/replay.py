"""The simulator's inputs from a paced benchmark run, and its replay of that run.

`bubblespec bench paced` runs the rollout on paced ranks: each engine forward lasts the
simulator's own engine-time model (`bubblespec.core.engine_time`) x a scale, so its modelled seconds and the
simulator's are the same unit. This module reads the run's `paced.json` and derives every
simulator input from what was measured, with no free parameter:

- configuration: ranks, prompts, n, steps, GPU profile, scale, pre-gen lanes (the rank's
  default), the trainer's time between steps (measured per step; the TRAINING window of
  the *-window modes);
- prompt tokens: the prefill tokens the paced engines computed in a mode without
  speculation, per prompt (prefix caching shares a prompt's prefill among its n samples);
- lengths: each mode's own response lengths per step and prompt (`output_lengths`);
- the assignment of prompts to ranks: the gateway's LPT with its length estimator
  (`bubblespec.gateway.shard`, the same code), replayed over the modes in the order they
  ran on one cluster, since a later mode's estimates come from the earlier modes' lengths
  of the same prompts (checked against the per-rank decode steps of modes without
  speculation, which equal their longest response);
- acceptance per step: accepted and drafted tokens per forward of a request
  (A / (T - A) and D / (T - A) from the step's accepted A, drafted D and generated T
  tokens); for modes that pre-generate, the uncovered figures are the mode's own step 0
  (no pre-generated drafts exist then) and the covered ones are solved from the step's
  overall figure at the step's measured covered share (pre-generated draft tokens fetched
  / T) by `policy.solve_covered`. `pooled` sums the steps after step 0 into one spec per
  mode, the calibrated input of the projections.

`replay` simulates each mode on its own lengths and assignment and puts modelled beside
measured per step (`report` prints it). Every simulated figure is MODELLED.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from bubblespec.bench.paced_record import PacedDoc, PacedRun
from bubblespec.calibration.flips import Flips, flip_caps, lost_tokens
from bubblespec.calibration.tails import (
    caught,
    head_multipliers,
    head_rates,
    rate_spread,
    split_rates,
    tail_multipliers,
    whole_multipliers,
)
from bubblespec.core.engine_time import EngineTime
from bubblespec.gateway.shard import LengthEstimator, lpt, make_items
from bubblespec.sim.model import (
    SimConfig,
    StepResult,
    Summary,
    gamma_mult,
    relate,
    run_mode,
    summarise,
)
from bubblespec.sim.policy import (
    MAX_ACCEPTED,
    ModeSpec,
    solve_covered,
    with_head_rates,
    with_spread,
    with_tail_fill,
    with_tail_rates,
)
from bubblespec.sim.pregen import breadth_first
from bubblespec.sim.tails import Rates

PREGEN_INFLIGHT = 64
"""The rank's default `pregen_inflight` (the paced bench does not change it)."""


@dataclass(frozen=True)
class Counts:
    """Token counts of one step (or steps summed) of one mode, as measured."""

    tokens: float
    accepted: float
    drafted: float
    fetched: float
    """Pre-generated draft tokens the ranks fetched for the step."""
    lost: float = 0.0
    """Tokens of the responses after their flip (measured flips only): fetched drafts no
    longer cover them."""
    after_flip: float | None = None
    """Accepted per forward after a response left its draft (from the divergence
    counters: accepted at or after the first divergence over the tail's forwards)."""

    @classmethod
    def of(cls, steps: list[dict[str, Any]], lost: float = 0.0) -> Counts:
        acc = sum((s.get("divergence") or {}).get("accepted_after", 0) for s in steps)
        tail = sum((s.get("divergence") or {}).get("tail_tokens", 0) for s in steps)
        return cls(float(sum(s["completion_tokens"] for s in steps)),
                   float(sum(s["accepted_tokens"] for s in steps)),
                   float(sum(s["draft_tokens"] for s in steps)),
                   float(sum(s.get("drafts_fetched_tokens", 0) for s in steps)), lost,
                   acc / (tail - acc) if lost > 0 and tail > acc else None)

    @property
    def forwards(self) -> float:
        """Forwards of requests (each emits its accepted drafts plus one token)."""
        return max(self.tokens - self.accepted, 1.0)

    @property
    def coverage(self) -> float:
        return (min(1.0, max(0.0, self.fetched - self.lost) / self.tokens)
                if self.tokens else 0.0)


def assignments(run: PacedRun) -> dict[str, np.ndarray]:
    """Per mode: (steps, prompts) rank of each prompt, by the gateway's LPT replayed over
    the modes of each cluster in the order they ran (see the module docstring)."""
    ranks = [f"r{i}" for i in range(run.ranks)]
    out: dict[str, np.ndarray] = {}
    cap = max(int(run.lengths(m).max()) for m in run.modes)
    clusters = dict.fromkeys(m.cluster for m in run.modes.values())
    for cluster in clusters:
        est = LengthEstimator()
        for name in cluster.split("+"):
            if name not in run.modes:
                continue
            rows = []
            for s in run.modes[name].steps:
                keys = list(s["prompt_keys"])
                items = make_items(keys, [[0]] * len(keys), run.n, None, est, cap, run.ranks)
                a = np.zeros(len(keys), dtype=np.int64)
                for rank, its in lpt(items, ranks).items():
                    for it in its:
                        a[it.index] = ranks.index(rank)
                rows.append(a)
                for k, L in zip(keys, s["output_lengths"]):
                    est.observe(k, sum(L) / len(L))
            out[name] = np.stack(rows)
    return out


def assignment_check(run: PacedRun, assign: dict[str, np.ndarray]) -> dict[str, bool]:
    """Modes without speculation: do the replayed assignments give the measured per-rank
    decode steps (the longest response of each rank)?"""
    out = {}
    for name, m in run.modes.items():
        if any(s["draft_tokens"] for s in m.steps) or name not in assign:
            continue
        ok = True
        for s, a in zip(m.steps, assign[name]):
            longest = np.asarray(s["output_lengths"]).max(axis=1)
            per_rank = [int(longest[a == r].max(initial=0)) for r in range(run.ranks)]
            ok &= per_rank == [int(s["rank_decode_steps"].get(f"r{r}", 0))
                               for r in range(run.ranks)]
        out[name] = bool(ok)
    return out


def spec_of(name: str, c: Counts, pregen: bool, window: bool, unc: Counts | None,
            source: str) -> ModeSpec:
    """The mode spec of measured counts `c` (uncovered figures from `unc` if pre-gen)."""
    a, d = c.accepted / c.forwards, c.drafted / c.forwards
    if not pregen:
        return ModeSpec(name, a, max(d, a), source=source)
    unc = unc or c
    a_u, d_u = unc.accepted / unc.forwards, unc.drafted / unc.forwards
    y = c.coverage
    a_c = math.inf
    if c.after_flip is not None and y > 0:  # tokens after flips at their own measured rate
        lost = min(c.lost, (1.0 - y) * c.tokens)
        f_u = lost / (1.0 + c.after_flip) + ((1.0 - y) * c.tokens - lost) / (1.0 + a_u)
        rest = c.forwards - f_u
        a_c = max(0.0, y * c.tokens / rest - 1.0) if rest > 0 else math.inf
    if a_c > MAX_ACCEPTED:  # the tails at that rate leave the covered tokens (almost) no
        # forwards: the split does not fit the counts, so take the one without flips
        # (else a covered forward would verify thousands of drafted tokens)
        a_c = solve_covered(a, y, a_u)
        f_u = (1.0 - y) * c.tokens / (1.0 + a_u)
    f_c = y * c.tokens / (1.0 + a_c)
    d_c = min(MAX_ACCEPTED, (c.drafted - f_u * d_u) / f_c) if f_c > 0 else d_u
    return ModeSpec(name, a_u, max(d_u, a_u), True, a_c, max(d_c, a_c), source=source,
                    pregen_window=window, accepted_after_flip=c.after_flip)


def per_step_specs(run: PacedRun, name: str, lost: np.ndarray | None = None
                   ) -> list[ModeSpec]:
    """One spec per step of a mode, from that step's counts (`lost`: per step, tokens after
    measured flips, which the fetched drafts do not cover)."""
    m = run.modes[name]
    lost = np.zeros(len(m.steps)) if lost is None else lost
    unc = Counts.of(m.steps[:1])
    pooled = pooled_spec(run, name, lost)
    out = []
    for i, s in enumerate(m.steps):
        c = Counts.of([s], float(lost[i]))
        if m.pregen and (i == 0 or c.coverage == 0):  # nothing pre-generated for it
            out.append(pooled)
            continue
        out.append(replace(spec_of(name, c, m.pregen, m.window, unc,
                                   f"measured, {run.path} step {s.get('step', i)}"),
                           host_s=m.host_s))
    return out


def pooled_spec(run: PacedRun, name: str, lost: np.ndarray | None = None) -> ModeSpec:
    """One spec for a mode from its steps after step 0 summed (uncovered: step 0)."""
    m = run.modes[name]
    if not any(s["draft_tokens"] for s in m.steps) and not m.pregen:
        return ModeSpec(name, 0.0, 0.0, source=f"measured, {run.path}")
    gone = 0.0 if lost is None else float(lost[1:].sum() if len(m.steps) > 1 else lost.sum())
    return replace(spec_of(name, Counts.of(m.steps[1:] or m.steps, gone), m.pregen, m.window,
                           Counts.of(m.steps[:1]), f"measured, {run.path} (steps after 0)"),
                   host_s=m.host_s)


@dataclass
class Replayed:
    """One mode of the paced run, modelled (on its own lengths and assignment) and measured:
    generated tokens and (modelled) seconds of the steps after step 0, summed over seeds."""

    name: str
    baseline: str
    summary: Summary
    """The simulated steps (of the first seed)."""
    measured: tuple[float, float]
    modelled: tuple[float, float]
    measured_speedup: float = 1.0
    modelled_speedup: float = 1.0

    @property
    def steps(self) -> list[StepResult]:
        return self.summary.steps


def replay_config(run: PacedRun, name: str, prompt_len: float) -> SimConfig:
    """The simulator's configuration of one mode of the paced run, charged as the run was
    paced (`PacedMode.async_host`, `PacedMode.host_s`; nothing where its record has no
    pace counters)."""
    return SimConfig(prompts=run.prompts, n=run.n, prompt_len=round(prompt_len),
                     steps=run.steps, warmup_steps=1, pregen_inflight=PREGEN_INFLIGHT,
                     train_s=run.train_s(name), lookahead=run.modes[name].lookahead,
                     async_baseline=run.modes[name].async_host,
                     spec_host_s=0.0)  # a record without pace counters charged none


def replay(run: PacedRun, first: dict[str, Any], per_step: bool = False,
           cover_cv: float = 0.0, seed: int = 0, prompt_len: float | None = None,
           flips: Flips | None = None, use_flips: bool = True, tail_classes: bool = True,
           own_rates: bool = False, draw_spread: bool = False) -> dict[str, Replayed]:
    """Every mode of one seed simulated on its own measured lengths and replayed
    assignment, with its pooled measured acceptance (or each step's own, `per_step`);
    `cover_cv` > 0 draws a per-request spread of the covered acceptance (an assumption,
    `SimConfig.cover_cv`). With measured flips (`flips`, else the records' own; off with
    `use_flips=False`) a response's draft covers it only up to its flip, and the covered
    acceptance is solved on the tokens before the flips, the covered tokens decode at the
    measured rate of their head-length class (`tails.head_rates`) and the tokens after a
    flip at that of their tail-length class, of the flips a margin branch caught or of
    the others (`tails.split_rates`, `tails.caught`; one pooled rate and no head classes
    with `tail_classes=False`); with `own_rates` every response decodes at its own measured
    rate: a pre-generating mode's tails and the heads its drafts covered, the other modes'
    whole responses (a replay of the measured rates, which checks the rest of the model:
    batching, assignment, pre-generation and its coverage); `draw_spread` draws each
    request's rate from its mode's measured per-request spread (`tails.rate_spread`, one
    quantile per request shared by the modes, from `seed`)."""
    et = EngineTime.preset(run.pace)
    assign = assignments(run)
    plen = run.prompt_len(first) if prompt_len is None else prompt_len
    out: dict[str, Replayed] = {}
    for name in run.modes:
        cfg = replay_config(run, name, plen)
        L = run.lengths(name)
        rng = np.random.default_rng([seed, 1 + list(run.modes).index(name)])
        drawn = {"lengths": L, "assign": assign[name], "mult": np.ones(L.shape),
                 "mult_cov": gamma_mult(rng, cover_cv, L.shape),
                 "pregen_order": np.stack([breadth_first(run.prompts, run.n)] * run.steps)}
        caps = flip_caps(run, name, flips) if use_flips else None
        lost = lost_tokens(run, name, caps)
        if caps is not None:
            drawn["flip"] = caps.reshape(run.steps, -1)
        spec = (per_step_specs(run, name, lost) if per_step
                else pooled_spec(run, name, lost))
        rates, held = split_rates(run, name, caps) if tail_classes else ((), ())
        heads = head_rates(run, name, caps) if tail_classes else ()
        spec = with_tail_fill(with_head_rates(with_tail_rates(spec, rates, held), heads),
                              run.modes[name].tail_fill)
        hit = caught(run, name, caps) if held else None
        if hit is not None:
            drawn["caught"] = hit.reshape(run.steps, -1)
        if own_rates:
            _own_rates(run, name, caps, (rates, held), heads, drawn)
        if draw_spread:
            spec = with_spread(spec, rate_spread(run, name, caps))
            drawn["rate_q"] = np.random.default_rng([seed, 0]).random((run.steps, L[0].size))
        summ = summarise(run.ranks, name, run_mode(cfg, run.ranks, spec, et, drawn), 1)
        use = summ.steps[1:] or summ.steps[-1:]
        out[name] = Replayed(name, run.modes[name].baseline, summ, run.measured(name),
                             (float(sum(x.tokens for x in use)),
                              sum(x.step_time_s for x in use)))
    _speedups(out)
    return out


def _own_rates(run: PacedRun, name: str, caps: np.ndarray | None, rates: tuple[Rates, Rates],
               heads: Rates, drawn: dict[str, Any]) -> None:
    """Put each response's own measured rate into `drawn` (see `replay`'s `own_rates`)."""
    for m in (tail_multipliers(run, name, caps, *rates), whole_multipliers(run, name)):
        if m is not None:
            drawn["flip_mult"] = m.reshape(run.steps, -1)
    head = head_multipliers(run, name, caps, heads)
    if head is not None:
        drawn["mult_cov"] = head


def replay_all(path: str | Path, per_step: bool = False, cover_cv: float = 0.0,
               seed: int = 0, flips: Flips | None = None, use_flips: bool = True,
               tail_classes: bool = True, own_rates: bool = False, draw_spread: bool = False
               ) -> dict[str, Replayed]:
    """`replay` of every seed of a paced run, tokens and seconds summed per mode over the
    seeds (as the bench sums them); steps shown are the first seed's."""
    doc = PacedDoc.read(path)
    keys = doc.seeds_with_steps()
    if not keys:
        raise ValueError(f"{path}: runs: no mode has steps")
    first = PacedRun.of(doc, path, keys[0])
    plen = first.prompt_len(doc.runs[keys[0]])
    reps = [replay(PacedRun.of(doc, path, k), doc.runs[k], per_step, cover_cv, seed, plen,
                   flips if k == keys[0] else None, use_flips, tail_classes, own_rates,
                   draw_spread) for k in keys]
    out = reps[0]
    for rep in reps[1:]:
        for name, r in rep.items():
            if name in out:
                o = out[name]
                o.measured = (o.measured[0] + r.measured[0], o.measured[1] + r.measured[1])
                o.modelled = (o.modelled[0] + r.modelled[0], o.modelled[1] + r.modelled[1])
    _speedups(out)
    return out


def _rate(x: tuple[float, float]) -> float:
    return x[0] / x[1] if x[1] > 0 else 0.0


def _speedups(out: dict[str, Replayed]) -> None:
    """Each mode's measured and modelled speed-up against its baseline's throughput."""
    for r in out.values():
        base = out.get(r.baseline)
        if base is not None and _rate(base.measured) > 0 and _rate(base.modelled) > 0:
            relate(r.summary, base.summary)
            r.measured_speedup = _rate(r.measured) / _rate(base.measured)
            r.modelled_speedup = _rate(r.modelled) / _rate(base.modelled)
