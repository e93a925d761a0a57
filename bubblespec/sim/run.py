"""One `bubblespec simulate` run: a scenario, its simulation, and the report of it.

`Scenario` holds the inputs the command line resolved (workload and scheduling, rank counts,
modes, engine-time model, length source); `project` checks and simulates it; `report`
prints the labelled lines and writes `simulate.json` and `simulate.png`. Every figure is
MODELLED, never measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bubblespec.core.engine_time import EngineTime
from bubblespec.sim.model import SimConfig, Summary, simulate
from bubblespec.sim.policy import ModeSpec
from bubblespec.sim.report import TAG, lines_preamble, lines_table, plot, to_json
from bubblespec.sim.workload import LengthSource, length_stats


@dataclass
class Scenario:
    """What to simulate."""

    cfg: SimConfig
    ranks: list[int]
    modes: list[ModeSpec]
    engine: EngineTime
    lengths: LengthSource
    notes: list[str] = field(default_factory=list)
    """Caveats printed with the figures (e.g. from reading the acceptance file)."""
    acceptance: str = "assumed"
    """Where the acceptance figures come from, for the plot ("assumed", "from FILE")."""


@dataclass
class Projection:
    """A simulated scenario: the sampled lengths' statistics and one summary per (R, mode)."""

    scenario: Scenario
    length_stats: dict[str, float]
    results: list[Summary]


def project(s: Scenario) -> Projection:
    """Check the scenario (ValueError names the flag) and simulate it."""
    cfg = s.cfg
    if cfg.steps < 1 or cfg.pregen_inflight < 1 or cfg.max_num_seqs < 1 or cfg.train_s < 0:
        raise ValueError("--steps, --pregen-inflight and --max-num-seqs must be >= 1, "
                         "--train-s >= 0")
    if cfg.prompts is not None and cfg.prompts < max(s.ranks):
        s.notes.append(f"{cfg.prompts} prompts over up to {max(s.ranks)} ranks: some ranks "
                       "get no prompt (all bubble)")
    stats = length_stats(s.lengths.sample(np.random.default_rng(cfg.seed), 4096, cfg.n))
    return Projection(s, stats, simulate(cfg, s.ranks, s.modes, s.engine, s.lengths))


def report(p: Projection, out: Path | None,
           measured: dict[str, tuple[int, float]] | None = None) -> None:
    """Print the preamble and the table; with `out`, write simulate.json and the plot
    (with `measured` speed-ups of a paced run as points)."""
    s = p.scenario
    for line in (lines_preamble(s.cfg, s.engine, s.lengths, p.length_stats, s.modes, s.notes)
                 + lines_table(p.results)):
        print(line)
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / "simulate.json").write_text(json.dumps(
        to_json(s.cfg, s.ranks, s.engine, s.lengths, p.length_stats, s.modes, s.notes,
                p.results), indent=1))
    try:
        kind = "synthetic" if s.lengths.synthetic else "empirical"
        plot(p.results, out / "simulate.png",
             f"{s.engine.gpu} engine model; {kind} lengths; acceptance {s.acceptance}",
             measured)
        print(f"{TAG} wrote {out / 'simulate.json'} and {out / 'simulate.png'}")
    except ImportError:
        print(f"{TAG} wrote {out / 'simulate.json'}; no plot: matplotlib is not installed")
