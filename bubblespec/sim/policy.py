"""Rollout modes (speculation policies) and their acceptance figures, for the simulator.

A mode is described by draft tokens ACCEPTED per forward pass (excluding the bonus token; a
forward emits 1 + accepted tokens, as `bench/engine_bench.py` reports `accepted_per_forward`)
and draft tokens VERIFIED per forward (what the extra forward tokens cost). Modes that use
pre-generation (bubblespec) have two pairs: one for positions covered by the aligned
pre-generated draft, one for the other positions (siblings only).

Sources, in order of precedence: `--mode` flags > `--accept-json` (from
`bubblespec bench service`) > the built-in ASSUMED defaults below (not measured; replace
them with bench figures):

- ngram: 0.3 accepted / 1.2 drafted. vLLM prompt-lookup n-gram rarely finds the prompt
  repeated in reasoning outputs; mean acceptance length ~1.3 tokens per forward.
- suffix: 0.7 / 2.5. ArcticInference suffix tree over the live siblings' outputs (adaptive
  draft length, so drafted stays low).
- bubblespec: uncovered 0.7 / 2.5 (= siblings only, as suffix); covered 1.5 / 4.0: a
  same-seed pre-generated response with per-token acceptance ~0.6 under weight drift and
  k = 8 gives 0.6 (1 - 0.6^8) / 0.4 = 1.47 accepted per forward (docs/design.md section 3 puts the
  per-token figure at 0.75-0.99 for a one-token numpy model; 0.6 is deliberately lower).

accept-json format: {"MODE": {...}, ...} or {"modes": {...}} or a list of {"mode": MODE, ...}
rows; per mode: `accepted_per_forward` (or `tokens_per_forward` = 1 + accepted),
`drafted_per_forward` (optional; default accepted / 0.5, a 50% draft acceptance rate; for a
pre-generating mode the covered figure is solved from it like the accepted one, the uncovered
one taken with the uncovered acceptance),
`pregen_coverage` (share of the mode's generated tokens whose position was covered by an
aligned pre-generated draft; optional, 1.0 when missing), optional explicit
`accepted_per_forward_covered`, `accepted_per_forward_uncovered`,
`drafted_per_forward_covered`, `drafted_per_forward_uncovered`, `uses_pregen`, `sources`
(the mode's draft sources, `core.sources` names, as the benches record them),
`pregen_window` (pre-generates in the training window too; default: the name mentions
"window").
A mode uses pre-generation if `uses_pregen` says so, else if its `sources` hold "pregen",
else (figures recorded without either) if its name starts with "bubblespec" and does not
mention "sibling". For such a mode without explicit split figures,
the uncovered figure is taken from the "bubblespec_siblings" mode, else "suffix", else
"suffix-keyed" (as `bench paced` names suffix decoding under keyed sampling), else the
default; the covered figure is solved from the overall figure x at coverage y by harmonic
mixing of forwards per token: 1/(1+x) = y/(1+a_cov) + (1-y)/(1+a_unc).
Modes named none / nospec / no_spec / baseline are the no-speculation baseline (forced to 0).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from bubblespec.core.sources import parse_sources
from bubblespec.sim.tails import Rates, class_rate

BASELINE_NAMES = ("none", "nospec", "no_spec", "baseline")
DRAFT_ACCEPT_RATE = 0.5
"""Assumed accepted/drafted ratio when a source gives no drafted figure."""


@dataclass(frozen=True)
class ModeSpec:
    """One rollout mode as the simulator sees it."""

    name: str
    accepted: float
    """Draft tokens accepted per forward where no pre-generated draft covers the position."""
    drafted: float
    """Draft tokens verified per forward at those positions."""
    uses_pregen: bool = False
    """Whether idle ranks pre-generate the next step and covered positions use the figures
    below."""
    accepted_covered: float = 0.0
    """Draft tokens accepted per forward at positions covered by a pre-generated draft."""
    drafted_covered: float = 0.0
    """Draft tokens verified per forward at covered positions."""
    source: str = "assumed default"
    pregen_window: bool = False
    """Pre-generation goes on while the trainer trains (the TRAINING window, for
    `SimConfig.train_s` after the slowest rank finished), not only in the bubble."""
    accepted_after_flip: float | None = None
    """Draft tokens accepted per forward after a response left its pre-generated draft (a
    flip, `SimConfig.flip_share`); None: the uncovered figure."""
    after_flip_by_tail: tuple[tuple[float, float], ...] = ()
    """The same per class of tail length (tokens after the flip): ((upper edge, accepted per
    forward), ...) ascending, the last edge infinite (measured by
    `bubblespec.calibration.tails.tail_rates`); when given it replaces `accepted_after_flip`
    per response."""
    after_caught_by_tail: tuple[tuple[float, float], ...] = ()
    """Accepted per forward after a flip that a margin branch caught (`SimConfig.caught_share`,
    or the replay's measured ones), per class of tail length (measured by
    `bubblespec.calibration.tails.tail_rates`); none: such tails as the others."""
    covered_by_head: tuple[tuple[float, float], ...] = ()
    """Accepted per forward at covered positions per class of covered length (the tokens a
    response's draft covers: up to its flip, or the whole response), as `after_flip_by_tail`
    (measured by `bubblespec.calibration.tails.head_rates`); when given it replaces
    `accepted_covered` per response."""

    host_s: float | None = None
    """Host seconds the mode adds to each forward, in series (drafting, the keyed host path;
    measured per mode by the paced runs, `PacedMode.host_s`); None: the simulator's default
    (`SimConfig.spec_host_s`). Not charged to the baseline."""

    tail_fill: float = 0.0
    """Tail-fill budget (`--tail-fill-budget`): a pre-generating rank decodes lanes beside its
    own requests while the forward grows by at most this share (`sim.tail_fill`); 0: off."""

    rate_spread: tuple[float, ...] = ()
    """Measured per-request multipliers of tokens per forward (by
    `bubblespec.calibration.tails.rate_spread`): of the tails after a flip relative to their
    class for a pre-generating mode, of whole responses
    relative to the mode's pooled figure for the others; drawn with `SimConfig.rate_spread`."""

    def spread_at(self, q: np.ndarray) -> np.ndarray | None:
        """The multipliers at quantiles `q` of the measured spread (None: no spread)."""
        if not self.rate_spread:
            return None
        return np.quantile(np.asarray(self.rate_spread), q, method="inverted_cdf")

    def after_flip(self, tail: np.ndarray, caught: np.ndarray | None = None
                   ) -> np.ndarray | None:
        """Accepted per forward after the flip of responses with `tail` tokens after it
        (None: no after-flip figure, the uncovered one applies); where `caught`, at the
        caught-tail rates if the mode has them."""
        if self.after_flip_by_tail:
            out = class_rate(self.after_flip_by_tail, tail)
        elif self.accepted_after_flip is None:
            return None
        else:
            out = np.full(np.shape(tail), self.accepted_after_flip)
        if caught is not None and self.after_caught_by_tail:
            out = np.where(caught, class_rate(self.after_caught_by_tail, tail), out)
        return out

    def covered_rate(self, head: np.ndarray) -> np.ndarray:
        """Accepted per forward at the covered positions of responses whose drafts cover
        `head` tokens."""
        if self.covered_by_head:
            return class_rate(self.covered_by_head, head)
        return np.full(np.shape(head), self.accepted_covered)

    @property
    def is_baseline(self) -> bool:
        return self.accepted == 0 and self.drafted == 0 and not self.uses_pregen

    def describe(self) -> str:
        s = f"{self.name}: accepted/drafted per forward {self.accepted:.2f}/{self.drafted:.2f}"
        if self.uses_pregen:
            s += (f" uncovered, {self.accepted_covered:.2f}/{self.drafted_covered:.2f} covered "
                  "by pre-generation" + (" (bubble + training window)" if self.pregen_window
                                         else ""))
            if self.tail_fill:
                s += f", tail-fill budget {self.tail_fill:g}"
            if self.covered_by_head:
                s += ", covered by head length " + " ".join(
                    f"<={e:g}:{r:.2f}" for e, r in self.covered_by_head)
            if self.after_flip_by_tail:
                s += ", accepted after a flip by tail length " + " ".join(
                    f"<={e:g}:{r:.2f}" for e, r in self.after_flip_by_tail)
            if self.after_caught_by_tail:
                s += ", after a caught flip " + " ".join(
                    f"<={e:g}:{r:.2f}" for e, r in self.after_caught_by_tail)
            elif self.accepted_after_flip is not None:
                s += f", {self.accepted_after_flip:.2f} accepted after a flip"
        return f"{s} ({self.source})"


def with_tail_rates(spec: ModeSpec | list[ModeSpec], rates: Rates, caught: Rates = ()
                    ) -> ModeSpec | list[ModeSpec]:
    """`spec` (or each step's) with the after-flip rates per tail-length class, if any, and
    those of the flips a branch caught (pre-generating modes only: the others have no
    flips)."""
    if not rates:
        return spec
    return _each(spec, lambda x: replace(x, after_flip_by_tail=rates,
                                         after_caught_by_tail=caught)
                 if x.uses_pregen else x)


def with_head_rates(spec: ModeSpec | list[ModeSpec], rates: Rates
                    ) -> ModeSpec | list[ModeSpec]:
    """`spec` (or each step's) with the covered rates per head-length class, if any
    (pre-generating modes only)."""
    if not rates:
        return spec
    return _each(spec, lambda x: replace(x, covered_by_head=rates) if x.uses_pregen else x)


def with_spread(spec: ModeSpec | list[ModeSpec], spread: tuple[float, ...]
                ) -> ModeSpec | list[ModeSpec]:
    """`spec` (or each step's) with its measured per-request spread."""
    return _each(spec, lambda x: replace(x, rate_spread=spread))


def with_tail_fill(spec: ModeSpec | list[ModeSpec], budget: float
                   ) -> ModeSpec | list[ModeSpec]:
    """`spec` (or each step's) with tail-fill budget `budget` (pre-generating modes only)."""
    if budget <= 0:
        return spec
    return _each(spec, lambda x: replace(x, tail_fill=budget) if x.uses_pregen else x)


def tail_fill_copies(modes: list[ModeSpec], budget: float) -> list[ModeSpec]:
    """`modes` and, after them, a copy of each pre-generating mode without tail-fill named
    `NAME+tailB` with tail-fill budget `budget` (none for `budget` <= 0): both side by side
    on the same draws."""
    if budget <= 0:
        return list(modes)
    return [*modes, *(replace(m, name=f"{m.name}+tail{budget:g}", tail_fill=budget)
                      for m in modes if m.uses_pregen and not m.tail_fill)]


def _each(spec: ModeSpec | list[ModeSpec], fn: Callable[[ModeSpec], ModeSpec]
          ) -> ModeSpec | list[ModeSpec]:
    return [fn(x) for x in spec] if isinstance(spec, list) else fn(spec)


def default_modes() -> list[ModeSpec]:
    """The ASSUMED defaults (module docstring)."""
    return [ModeSpec("none", 0.0, 0.0),
            ModeSpec("ngram", 0.3, 1.2),
            ModeSpec("suffix", 0.7, 2.5),
            ModeSpec("bubblespec", 0.7, 2.5, True, 1.5, 4.0)]


def _accepted(d: dict, key: str = "accepted_per_forward") -> float | None:
    if key in d:
        return float(d[key])
    tk = key.replace("accepted_per_forward", "tokens_per_forward")
    if tk in d:
        return max(0.0, float(d[tk]) - 1.0)
    return None


def _drafted(d: dict, accepted: float, key: str = "drafted_per_forward") -> float:
    if key in d:
        return max(float(d[key]), accepted)
    return accepted / DRAFT_ACCEPT_RATE


MAX_ACCEPTED = 64.0
"""The most draft tokens a forward verifies per request (the engine's largest
`num_speculative_tokens`): no per-forward figure can exceed it."""


def solve_covered(overall: float, coverage: float, uncovered: float) -> float:
    """Accepted per forward at covered positions such that harmonic mixing with `uncovered`
    at token share `coverage` gives `overall` (clamped to [0, MAX_ACCEPTED])."""
    if coverage <= 0:
        return overall
    inv = (1.0 / (1.0 + overall) - (1.0 - coverage) / (1.0 + uncovered)) / coverage
    if inv <= 1.0 / (1.0 + MAX_ACCEPTED):
        return MAX_ACCEPTED
    return float(min(MAX_ACCEPTED, max(0.0, 1.0 / inv - 1.0)))


def load_accept_json(path: str | Path) -> tuple[list[ModeSpec], list[str]]:
    """Modes from a bench JSON (format in the module docstring) and notes on fallbacks."""
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict) and isinstance(data.get("modes"), (dict, list)):
        data = data["modes"]
    if isinstance(data, list):
        data = {str(row["mode"]): row for row in data if isinstance(row, dict) and "mode" in row}
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path}: expected {{mode: {{accepted_per_forward: ...}}}}")
    notes: list[str] = []
    raw = {str(k): v for k, v in data.items() if isinstance(v, dict)}
    defaults = {m.name: m for m in default_modes()}
    src = f"from {path}"

    def uniform(name: str) -> float | None:
        return _accepted(raw[name]) if name in raw else None

    out: list[ModeSpec] = []
    for name, d in raw.items():
        if name.lower() in BASELINE_NAMES:
            out.append(ModeSpec(name, 0.0, 0.0, source=src))
            continue
        uses = d.get("uses_pregen")
        if uses is None and d.get("sources") is not None:
            uses = "pregen" in parse_sources(d["sources"])
        uses = bool(uses) if uses is not None else (name.lower().startswith("bubblespec")
                                                    and "sibling" not in name.lower())
        x = _accepted(d)
        if not uses:
            if x is None:
                raise ValueError(f"{path}: mode {name!r} has no accepted_per_forward")
            out.append(ModeSpec(name, x, _drafted(d, x), source=src))
            continue
        a_u = _accepted(d, "accepted_per_forward_uncovered")
        d_u_proxy = None
        if a_u is None:
            for proxy in ("bubblespec_siblings", "suffix", "suffix-keyed"):
                if uniform(proxy) is not None:
                    a_u = uniform(proxy)
                    d_u_proxy = _drafted(raw[proxy], a_u)
                    notes.append(f"{name}: uncovered acceptance {a_u:.2f} (drafted "
                                 f"{d_u_proxy:.2f}) taken from {proxy!r}")
                    break
        if a_u is None:
            a_u = defaults["bubblespec"].accepted
            d_u_proxy = defaults["bubblespec"].drafted
            notes.append(f"{name}: uncovered acceptance {a_u:.2f} is the assumed default")
        a_c = _accepted(d, "accepted_per_forward_covered")
        if a_c is None:
            if x is None:
                raise ValueError(f"{path}: mode {name!r} has no accepted_per_forward")
            y = d.get("pregen_coverage")
            if y is None:
                notes.append(f"{name}: no pregen_coverage given; taken as 1.0")
                y = 1.0
            y = min(1.0, max(0.0, float(y)))
            a_c = solve_covered(x, y, a_u) if y > 0 else defaults["bubblespec"].accepted_covered
            notes.append(f"{name}: covered acceptance {a_c:.2f} solved from overall {x:.2f} "
                         f"at coverage {y:.2f}")
        d_u = d.get("drafted_per_forward_uncovered", d_u_proxy)
        d_u = max(float(d_u), a_u) if d_u is not None else a_u / DRAFT_ACCEPT_RATE
        d_c = d.get("drafted_per_forward_covered")
        if d_c is None and d.get("drafted_per_forward") is not None and x is not None:
            # overall drafted = forward-weighted mix of covered and uncovered drafted
            y = min(1.0, max(0.0, float(d.get("pregen_coverage", 1.0))))
            phi = y / (1.0 + a_c) * (1.0 + x) if y > 0 else 0.0
            if phi > 1e-9:
                d_c = (float(d["drafted_per_forward"]) - (1.0 - phi) * d_u) / phi
        d_c = min(64.0, max(float(d_c), a_c)) if d_c is not None else a_c / DRAFT_ACCEPT_RATE
        win = d.get("pregen_window")
        win = bool(win) if win is not None else "window" in name.lower()
        out.append(ModeSpec(name, a_u, d_u, True, a_c, d_c, source=src, pregen_window=win))
    if not any(m.is_baseline for m in out):
        out.insert(0, ModeSpec("none", 0.0, 0.0, source="implicit baseline"))
    out.sort(key=lambda m: not m.is_baseline)
    return out, notes


_FLAG = re.compile(r"^([A-Za-z0-9_.+-]+)=(pregen:)?([0-9.]+)/([0-9.]+)(?:,([0-9.]+)/([0-9.]+))?$")


def parse_mode_flag(text: str) -> ModeSpec:
    """`NAME=ACC/DRAFTED` (uniform) or `NAME=pregen:ACC_COV/DRAFTED_COV,ACC_UNC/DRAFTED_UNC`."""
    m = _FLAG.match(text.strip())
    if not m or (m.group(2) and m.group(5) is None):
        raise ValueError(f"bad --mode {text!r}: want NAME=ACC/DRAFTED or "
                         "NAME=pregen:ACC_COV/DRAFTED_COV,ACC_UNC/DRAFTED_UNC")
    name, pre = m.group(1), bool(m.group(2))
    a, d = float(m.group(3)), float(m.group(4))
    if d < a:
        raise ValueError(f"--mode {text!r}: drafted must be >= accepted")
    if not pre:
        return ModeSpec(name, a, d, source="--mode flag")
    a_u, d_u = float(m.group(5)), float(m.group(6))
    if d_u < a_u:
        raise ValueError(f"--mode {text!r}: drafted must be >= accepted")
    return ModeSpec(name, a_u, d_u, True, a, d, source="--mode flag")


def merge_modes(base: list[ModeSpec], overrides: list[ModeSpec]) -> list[ModeSpec]:
    """`base` with same-named modes replaced by `overrides` (new names appended); the
    baseline first. A baseline is added when none is present."""
    by = {m.name: m for m in base}
    for m in overrides:
        by[m.name] = m
    out = list(by.values())
    if not any(m.is_baseline for m in out):
        out.insert(0, ModeSpec("none", 0.0, 0.0, source="implicit baseline"))
    out.sort(key=lambda m: not m.is_baseline)
    return out
