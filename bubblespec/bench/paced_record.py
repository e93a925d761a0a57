"""The record of a paced benchmark run (`paced.json`): one type for its writer and its readers.

`bubblespec bench paced` builds a `PacedDoc` while it runs (its configuration, then each
seed's per-mode results as they come in, then the report's summaries) and serialises it
with `PacedDoc.write`; the calibration of the simulator (`bubblespec.calibration`) reads
the file back with `PacedDoc.read` and views one seed of it as a `PacedRun`, its modes as
`PacedMode`s. The schema tag, the configuration keys a reader needs and the checks that
name a bad field are all here, so that the writer and the reader cannot drift apart.

Why in `bench/`: the bench writes the record and must not import the calibration, which
sits above both the bench and the simulator; the calibration may import the bench. The
module needs only the bench's mode table (`modes.baseline_of`) and numpy.

A mode's result (`runs[seed][mode]`) and its steps stay the dictionaries the service bench's
schedule returns (`bench.service.run_schedule`, its fields documented there and in
`bench.modes`); this module types the document around them and the fields of a mode the
readers rely on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bubblespec.bench.modes import baseline_of, flag_value

SCHEMA = "bubblespec.bench.paced/v1"
CONFIG_KEYS = ("ranks", "prompts", "n", "steps", "pace", "pace_scale")
"""Configuration keys every reader needs (the rest of `PacedBenchConfig` is optional)."""

Results = dict[str, dict[str, Any]]
"""One seed's results: mode name -> what the schedule returned for it (or `{"skipped": ...}`)."""


@dataclass
class PacedDoc:
    """The whole `paced.json`: configuration, per-seed results, and the report's figures."""

    config: dict[str, Any]
    """`PacedBenchConfig` as a dict (older records carry fewer keys; `CONFIG_KEYS` always)."""
    runs: dict[str, Results] = field(default_factory=dict)
    """Seed (decimal string) -> its results per mode."""
    report: dict[str, Any] = field(default_factory=dict)
    """What `bench paced` adds once the modes ran (summaries, speed-ups, checks, final lines);
    written after `runs`, read by nobody but people."""

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "config": self.config, "runs": self.runs, **self.report}

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1))

    @classmethod
    def parse(cls, doc: Any, path: str | Path) -> PacedDoc:
        """A document read from `path` (ValueError naming the field when it is not one)."""
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise ValueError(f"{path}: schema: expected {SCHEMA!r}")
        cfg, runs = doc.get("config") or {}, doc.get("runs") or {}
        for key in CONFIG_KEYS:
            if key not in cfg:
                raise ValueError(f"{path}: config.{key} missing")
        rest = {k: v for k, v in doc.items() if k not in ("schema", "config", "runs")}
        return cls(dict(cfg), {str(k): v for k, v in runs.items()}, rest)

    @classmethod
    def read(cls, path: str | Path) -> PacedDoc:
        return cls.parse(json.loads(Path(path).read_text()), path)

    def seeds(self) -> list[str]:
        """The seeds that ran, ascending."""
        return sorted(self.runs, key=int)

    def seeds_with_steps(self) -> list[str]:
        """The seeds in which at least one mode recorded steps, ascending."""
        return [k for k in self.seeds()
                if any((r or {}).get("steps") for r in self.runs[k].values())]


def run_scale(run: Mapping[str, Any], scale: float) -> float:
    """The pace scale a mode's result ran at: its own (`pace_scale`), else the record's
    `scale` (records from before per-mode scales)."""
    return float(run.get("pace_scale") or scale)


def tail_fill_budget(rank_args: list[str]) -> float:
    """The `--tail-fill-budget` a mode's ranks ran with (0: the default, off)."""
    value = flag_value(rank_args, "--tail-fill-budget")
    return 0.0 if value is None else float(value)


def host_charges(run: Mapping[str, Any]) -> tuple[float | None, bool]:
    """(host seconds per forward charged in series, host overlapped) of a mode's result,
    from its cluster's pace counters ((None, False) without them: unknown)."""
    pace = (run.get("cluster") or {}).get("pace") or {}
    forwards = int(pace.get("forwards") or 0)
    if not forwards:
        return None, False
    host = float(pace.get("charged_s", 0.0)) + float(pace.get("product_host_s", 0.0))
    async_host = float(pace.get("async_hidden_s", 0.0)) > 1e-9
    return (0.0 if async_host else host / forwards), async_host


@dataclass
class PacedMode:
    """One mode of the paced run, as measured."""

    name: str
    steps: list[dict[str, Any]]
    pregen: bool
    window: bool
    cluster: str
    baseline: str
    lookahead: int = 1
    """Future steps whose prompts each rollout handed ahead."""
    tail_fill: float = 0.0
    """The ranks' tail-fill budget (`--tail-fill-budget` in the mode's rank arguments)."""
    scale: float = 0.0
    """The pace scale its ranks ran at (the run's `pace_scale` unless the mode had its own)."""
    host_s: float | None = None
    """Host seconds per forward its paced engines charged in series on top of the modelled
    forward (drafting and the product's keyed host work; `PaceStats.charged_s` and
    `product_host_s` over its forwards); None: the record has no pace counters."""
    async_host: bool = False
    """Its engines overlapped host and GPU (async scheduling: `PaceStats.async_hidden_s`)."""


@dataclass
class PacedRun:
    """One seed of a paced run: the configuration and the modes that recorded steps."""

    path: str
    ranks: int
    prompts: int
    n: int
    steps: int
    pace: str
    scale: float
    """The run's pace scale (`scale_of` gives a mode's own)."""
    greedy_prompts: int
    modes: dict[str, PacedMode]
    seeds: int = 1
    """Seeds the run holds (plain modes ran once per seed, keyed ones on the first)."""

    @classmethod
    def load(cls, path: str | Path, seed: str | None = None) -> PacedRun:
        """Read and check one seed of a paced.json (default the first; ValueError naming
        the field)."""
        return cls.of(PacedDoc.read(path), path, seed)

    @classmethod
    def of(cls, doc: PacedDoc, path: str | Path, seed: str | None = None) -> PacedRun:
        """One seed of a parsed document (default the first; ValueError naming the field)."""
        cfg = doc.config
        if not doc.runs:
            raise ValueError(f"{path}: runs: no seed ran")
        key = doc.seeds()[0] if seed is None else str(seed)
        if key not in doc.runs:
            raise ValueError(f"{path}: runs.{key} missing")
        first = doc.runs[key]
        modes: dict[str, PacedMode] = {}
        for name, r in first.items():
            steps = r.get("steps") or []
            if not steps:
                continue
            for i, s in enumerate(steps):
                L = np.asarray(s.get("output_lengths"), dtype=float)
                if L.shape != (cfg["prompts"], cfg["n"]):
                    raise ValueError(f"{path}: runs.{name}.steps[{i}].output_lengths: shape "
                                     f"{L.shape}, expected ({cfg['prompts']}, {cfg['n']})")
            modes[name] = PacedMode(name, steps, bool(r.get("pregen")),
                                    r.get("pregen_window") == "training",
                                    str(r.get("shared_cluster") or name),
                                    baseline_of(name, first), int(r.get("lookahead") or 1),
                                    tail_fill_budget(r.get("rank_args") or []),
                                    run_scale(r, cfg["pace_scale"]), *host_charges(r))
        if not modes:
            raise ValueError(f"{path}: runs: no mode has steps")
        return cls(str(path), int(cfg["ranks"]), int(cfg["prompts"]), int(cfg["n"]),
                   int(cfg["steps"]), str(cfg["pace"]), float(cfg["pace_scale"]),
                   int(cfg.get("greedy_prompts", 0)), modes, len(doc.runs))

    def prompt_len(self, first: Results) -> float:
        """Prefill tokens per prompt of a mode without speculation (pace counters)."""
        for name in ("nospec", "nospec-keyed"):
            pace = (((first.get(name) or {}).get("cluster") or {}).get("pace") or {})
            if pace.get("prefill_tokens"):
                return pace["prefill_tokens"] / (self.steps * self.prompts
                                                 + self.greedy_prompts)
        return 0.0

    def lengths(self, name: str) -> np.ndarray:
        """(steps, prompts, n) response lengths of a mode."""
        return np.stack([np.asarray(s["output_lengths"], dtype=np.int64)
                         for s in self.modes[name].steps])

    def scale_of(self, name: str) -> float:
        """The pace scale mode `name` ran at."""
        return self.modes[name].scale or self.scale

    def train_s(self, name: str) -> float:
        """Mean trainer time between steps of a mode, modelled seconds."""
        st = self.modes[name].steps
        return float(np.mean([s.get("train_s", 0.0) for s in st])) / self.scale_of(name)

    def measured(self, name: str) -> tuple[float, float]:
        """(generated tokens, modelled rollout seconds) over the steps after step 0."""
        st = self.modes[name].steps[1:]
        return (float(sum(s["completion_tokens"] for s in st)),
                sum(s["wall_s"] for s in st) / self.scale_of(name))
