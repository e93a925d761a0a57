"""Pure parts of `bubblespec bench service`: the rollout modes, per-step figures, totals, the
reduction formula and the JSON shape (no cluster, no torch; tested in tests/bench).

Definitions (documented once, used everywhere):

- **critical-path decode steps** of a step: max over ranks of the engine forward passes that
  rank ran for the step (`RankShard.decode_steps`, summed into the gateway's
  `counters.decode_steps_critical`). Ranks report it, so the fallback (max over requests of a
  request's `decode_steps`) is only used when every rank reports 0.
- **total decode steps**: forward passes summed over ranks (`counters.decode_steps_total`).
- **accepted tokens per forward**: completion tokens / per-request forward passes
  (`counters.tokens_per_forward`; 1.0 without speculation).
- **reduction** of a mode: 1 - sum(mode's critical-path steps) / sum(nospec's), over every
  step after step 0 (index >= 1 of the schedule).
- **crit/longest**: critical-path steps / tokens of the step's longest response (summed over
  steps after step 0). Without speculation it is ~1 (the critical path is the longest
  response); since sampled lengths differ between modes, 1 - crit/longest is a length-
  normalised view of the same saving.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bubblespec.core.sources import DEFAULT_SOURCES, parse_sources, sources_flag
from bubblespec.protocol.sampling import PregenWindow, SeedMode

SCHEMA = "bubblespec.bench/v1"

SPEC = "--spec-mode=bubblespec"
WITH_HISTORY = (*DEFAULT_SOURCES, "history")


@dataclass(frozen=True)
class Mode:
    """One rollout mode of the benchmark."""

    name: str
    rank_args: tuple[str, ...]
    """The rank's arguments; with `sources`, its `--sources` flag is appended."""
    sources: tuple[str, ...] | None = None
    """The draft sources of a bubblespec mode (`core.sources` names; the default ones when
    not given; None for a mode that does not draft with bubblespec's index). Recorded with the mode's figures, where the simulator
    reads them."""
    pregen: bool = False
    """Pass the next step's prompts ahead (pre-generation in the bubble)."""
    seed_mode: SeedMode = SeedMode.DEFAULT
    needs: str = ""
    """A module that must be importable, else the mode is skipped."""
    label: str = ""
    """Name in the final line (default: `name`)."""
    pregen_window: PregenWindow = PregenWindow.BUBBLE
    """TRAINING: pre-generation goes on through the training window (until the weight
    push), as on rollout ranks that idle while the trainer trains."""
    sync_args: tuple[str, ...] = ()
    """Arguments of the synchronizer (`bubblespec sync`), e.g. the pre-gen queue's order."""
    lookahead: int = 1
    """Future steps whose prompts each rollout hands ahead (1: the next step's only)."""

    def __post_init__(self) -> None:
        if self.sources is None and SPEC in self.rank_args:
            object.__setattr__(self, "sources", DEFAULT_SOURCES)
        if self.sources is not None:
            srcs = parse_sources(self.sources)
            object.__setattr__(self, "sources", srcs)
            object.__setattr__(self, "rank_args", (*self.rank_args, sources_flag(srcs)))

    @property
    def key(self) -> str:
        return self.label or self.name


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of the last `flag` in `args` (`--flag=V` or `--flag V`), None without one."""
    value = None
    for i, a in enumerate(args):
        if a.startswith(flag + "="):
            value = a.split("=", 1)[1]
        elif a == flag and i + 1 < len(args):
            value = args[i + 1]
    return value


def rank_sources(rank_args: Sequence[str]) -> tuple[str, ...] | None:
    """The draft sources a rank started with `rank_args` is given: its last `--sources`
    flag; without one the default if its speculation is bubblespec's, else None."""
    given = flag_value(rank_args, "--sources")
    if given is not None:
        return parse_sources(given)
    return DEFAULT_SOURCES if SPEC in rank_args else None


MODES: tuple[Mode, ...] = (
    Mode("nospec", ("--spec-mode=none",)),
    Mode("nospec-keyed", ("--spec-mode=none",), seed_mode=SeedMode.KEYED, label="nospec_keyed"),
    Mode("ngram", ("--spec-mode=ngram",)),
    Mode("suffix", ("--spec-mode=suffix",), needs="arctic_inference"),
    Mode("history", (SPEC,), sources=("history",)),
    Mode("bubblespec", (SPEC,), pregen=True),
    Mode("bubblespec-keyed", (SPEC,), pregen=True,
         seed_mode=SeedMode.KEYED, label="keyed"),
    Mode("bubblespec-history", (SPEC,), sources=WITH_HISTORY, pregen=True,
         label="bubblespec_history"),
    Mode("bubblespec-keyed-history", (SPEC,), sources=WITH_HISTORY, pregen=True,
         seed_mode=SeedMode.KEYED, label="keyed_history"),
    Mode("bubblespec-keyed-window", (SPEC,),
         pregen=True, seed_mode=SeedMode.KEYED, label="keyed_window",
         pregen_window=PregenWindow.TRAINING),
)
STREAM_MARGIN = 0.1
"""Keyed-margin threshold of the streamed modes: on the embedded model's schedule it covers
the most flips with one branch per draft (`bubblespec bench flips`, README)."""
BRANCH_MODES: tuple[Mode, ...] = (
    Mode("bubblespec-keyed-nobranch", (SPEC, "--pregen-branches=0"), pregen=True,
         seed_mode=SeedMode.KEYED, label="keyed_nobranch"),
    Mode("bubblespec-keyed-window-nobranch", (SPEC, "--pregen-branches=0"), pregen=True,
         seed_mode=SeedMode.KEYED, label="keyed_window_nobranch",
         pregen_window=PregenWindow.TRAINING),
    Mode("bubblespec-keyed-branch", (SPEC, "--pregen-branches=1", "--pregen-branch-margin=0"),
         pregen=True, seed_mode=SeedMode.KEYED, label="keyed_branch"),
    Mode("bubblespec-keyed-window-branch", (SPEC, "--pregen-branches=1",
                                            "--pregen-branch-margin=0"), pregen=True,
         seed_mode=SeedMode.KEYED, label="keyed_window_branch",
         pregen_window=PregenWindow.TRAINING),
    Mode("bubblespec-keyed-stream", (SPEC, "--pregen-branches=1",
                                     f"--pregen-branch-margin={STREAM_MARGIN}"), pregen=True,
         seed_mode=SeedMode.KEYED, label="keyed_stream"),
    Mode("bubblespec-keyed-window-stream", (SPEC, "--pregen-branches=1",
                                            f"--pregen-branch-margin={STREAM_MARGIN}"),
         pregen=True, seed_mode=SeedMode.KEYED, label="keyed_window_stream",
         pregen_window=PregenWindow.TRAINING),
)
"""Ablations of margin branching (`bubblespec rank --pregen-branches`, docs/design.md section
5). The default keyed modes above branch once per keyed draft, streamed at the threshold the
synchronizer calibrates from reported flips (`--pregen-branch-margin auto`); here: no
branches (`-nobranch`, the default before), offered with the complete draft only
(`-branch`), or streamed at the fixed `STREAM_MARGIN` (`-stream`)."""
KEYED_BASELINE_MODES: tuple[Mode, ...] = (
    Mode("ngram-keyed", ("--spec-mode=ngram",), seed_mode=SeedMode.KEYED, label="ngram_keyed"),
    Mode("suffix-keyed", ("--spec-mode=suffix",), seed_mode=SeedMode.KEYED,
         needs="arctic_inference", label="suffix_keyed"),
    Mode("history-keyed", (SPEC,), sources=("history",), seed_mode=SeedMode.KEYED,
         label="history_keyed"),
)
"""The baselines under keyed sampling: their tokens are those of keyed sampling without
speculation, so their rows compare with bubblespec-keyed on identical outputs (run by
`bench paced`; `bench service` runs them when named in --modes)."""
SPREAD_INFLIGHT = 16
"""Pre-generation lanes per rank of the spread modes (the rank's default is 64)."""
ORDER_MODES: tuple[Mode, ...] = (
    Mode("bubblespec-keyed-spread", (SPEC, f"--pregen-inflight={SPREAD_INFLIGHT}"), pregen=True,
         seed_mode=SeedMode.KEYED, label="keyed_spread"),
    Mode("bubblespec-keyed-spread-deep", (SPEC, f"--pregen-inflight={SPREAD_INFLIGHT}"),
         pregen=True, seed_mode=SeedMode.KEYED, label="keyed_spread_deep",
         sync_args=("--pregen-depth=8",)),
)
"""Pre-generation order at 8 ranks (the issue's ordering choices, docs/design.md section 6).
With the rank's default 64 lanes the first two idle ranks claim a 16 x 8 queue whole, so
its order decides only which of them decodes a task. With 16 lanes (`-spread`) the queue is
handed out as lanes free up, so its order (rounds of `--pregen-depth` samples per prompt,
prompts by predicted length, predictions updated as pre-generated samples complete) decides
which responses get drafts first and longest: breadth-first over prompts (depth 1), or all
8 samples of the prompt predicted longest first (`-deep`, depth 8)."""
LOOKAHEAD_MODES: tuple[Mode, ...] = (
    Mode("bubblespec-keyed-ahead2", (SPEC,),
         pregen=True, seed_mode=SeedMode.KEYED, label="keyed_ahead2", lookahead=2),
    Mode("bubblespec-keyed-ahead3", (SPEC,),
         pregen=True, seed_mode=SeedMode.KEYED, label="keyed_ahead3", lookahead=3),
    Mode("bubblespec-ahead2", (SPEC,), pregen=True,
         label="bubblespec_ahead2", lookahead=2),
    Mode("bubblespec-keyed-window-ahead3", (SPEC,),
         pregen=True, seed_mode=SeedMode.KEYED, label="keyed_window_ahead3",
         pregen_window=PregenWindow.TRAINING, lookahead=3),
)
"""Prompts handed several steps ahead (`next_prompts` as a list of batches,
docs/design.md section 6): a bubble that covered the next step goes on to the one after,
and a draft made under older weights is refreshed when the step before it hands it again;
`-window-ahead3` also through the training window."""
TAIL_FILL_MODES: tuple[Mode, ...] = (
    Mode("bubblespec-keyed-tail5", (SPEC, "--tail-fill-budget=0.05"),
         pregen=True, seed_mode=SeedMode.KEYED, label="keyed_tail5"),
    Mode("bubblespec-keyed-tail20", (SPEC, "--tail-fill-budget=0.2"),
         pregen=True, seed_mode=SeedMode.KEYED, label="keyed_tail20"),
    Mode("bubblespec-tail5", (SPEC, "--tail-fill-budget=0.05"),
         pregen=True, label="bubblespec_tail5"),
    Mode("bubblespec-keyed-ahead3-tail5", (SPEC, "--tail-fill-budget=0.05"),
         pregen=True, seed_mode=SeedMode.KEYED, label="keyed_ahead3_tail5", lookahead=3),
)
"""Tail-fill (`--tail-fill-budget`, rank/tail_fill.py): pre-generation starts beside each
rank's own last requests, with as many lanes as keep a modelled forward within 5% (20%) of
its own; `-ahead3-tail5` with prompts handed three steps ahead, so that the queue outlasts
a long step's bubble."""
GLOBAL_LIVE = DEFAULT_SOURCES
FALLBACK_MODES: tuple[Mode, ...] = (
    Mode("bubblespec-glive", (SPEC,), sources=GLOBAL_LIVE,
         pregen=True, label="bubblespec_glive"),
    Mode("bubblespec-keyed-glive", (SPEC,), sources=GLOBAL_LIVE, pregen=True,
         seed_mode=SeedMode.KEYED, label="keyed_glive"),
)
"""The fallback of a response that left its draft, as suffix decoding's: the global pool
holds every prompt's responses while they are generated (the `global` and `global_live`
sources; the rank's default since they were measured, so these modes equal `bubblespec` and
`bubblespec-keyed` and stay for the records that name them)."""
ALL_MODES = (MODES + KEYED_BASELINE_MODES + BRANCH_MODES + ORDER_MODES + LOOKAHEAD_MODES
             + TAIL_FILL_MODES + FALLBACK_MODES)
BASELINE = "nospec"
KEYED_BASELINE = "nospec-keyed"
FINAL_ORDER = ("bubblespec", "suffix", "ngram", "history", "bubblespec-keyed",
               "bubblespec-history", "bubblespec-keyed-history", "bubblespec-keyed-window")


def mode_by_name(names: Iterable[str]) -> list[Mode]:
    known = {m.name: m for m in ALL_MODES}
    out = []
    for n in names:
        if n not in known:
            raise ValueError(f"unknown mode {n!r} (known: {', '.join(known)})")
        out.append(known[n])
    return out


def totals(steps: Sequence[Mapping[str, Any]], skip_first: bool = True) -> dict[str, Any]:
    """Totals of a mode over its steps (`skip_first`: steps after step 0 only, as the
    reduction; the `all_` figures include step 0)."""
    use = list(steps[1:] if skip_first else steps)
    tok = sum(s["completion_tokens"] for s in use)
    fwd_req = sum(s["completion_tokens"] / s["tokens_per_forward"] for s in use
                  if s["tokens_per_forward"] > 0)
    rewards = [s["mean_reward"] for s in steps]
    fr = [s["bubble_fraction"] for s in use if s.get("bubble_fraction") is not None]
    return {
        "steps": len(use),
        "decode_steps_critical": sum(s["decode_steps_critical"] for s in use),
        "decode_steps_total": sum(s["decode_steps_total"] for s in use),
        "completion_tokens": tok,
        "tokens_per_forward": tok / fwd_req if fwd_req else 0.0,
        "pregen_tokens": sum(s["pregen_tokens"] for s in use),
        "window_pregen_tokens": sum(s.get("window_pregen_tokens", 0) for s in use),
        "accepted_pregen_tokens": sum(s["accepted_pregen_tokens"] for s in use),
        "accepted_tokens": sum(s["accepted_tokens"] for s in use),
        "draft_tokens": sum(s["draft_tokens"] for s in use),
        "wall_s": sum(s["wall_s"] for s in use),
        "mean_bubble_fraction": sum(fr) / len(fr) if fr else None,
        "longest_response_tokens": sum(s["max_len"] for s in use),
        "critical_per_longest": (sum(s["decode_steps_critical"] for s in use)
                                 / max(1, sum(s["max_len"] for s in use))),
        "all_decode_steps_critical": sum(s["decode_steps_critical"] for s in steps),
        "mean_reward": sum(rewards) / len(rewards) if rewards else 0.0,
        "reward_sem": _sem(rewards),
    }


def _sem(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def reduction(mode_crit: float, base_crit: float) -> float | None:
    """Fraction of critical-path decode steps saved against the baseline (None: no base)."""
    if base_crit <= 0:
        return None
    return 1.0 - mode_crit / base_crit


def baseline_of(name: str, results: Mapping[str, Mapping[str, Any]]) -> str:
    """The baseline a mode is compared with: keyed modes against keyed sampling without
    speculation when that ran (same seeds, so bit-identical outputs and lengths), else
    nospec."""
    keyed = (results.get(name) or {}).get("seed_mode") == "keyed"
    if keyed and (results.get(KEYED_BASELINE) or {}).get("totals"):
        return KEYED_BASELINE
    return BASELINE


def reductions(results: Mapping[str, Mapping[str, Any]]) -> dict[str, float | None]:
    """Per mode name: the reduction of its after-step-0 critical path against its baseline
    (`baseline_of`; None for skipped or failed modes, or without a baseline)."""
    out: dict[str, float | None] = {}
    for name, r in results.items():
        t = r.get("totals")
        base = (results.get(baseline_of(name, results)) or {}).get("totals") or {}
        base_crit = base.get("decode_steps_critical", 0)
        out[name] = reduction(t["decode_steps_critical"], base_crit) if t else None
    return out


def final_line(red: Mapping[str, float | None]) -> str:
    labels = {m.name: m.key for m in MODES}
    parts = []
    for name in FINAL_ORDER:
        v = red.get(name)
        parts.append(f"{labels.get(name, name)}={'n/a' if v is None else f'{v:.3f}'}")
    return "critical_path_decode_step_reduction: " + " ".join(parts)


def greedy_agreement(outputs: Mapping[str, list[list[list[int]]] | None]
                     ) -> dict[str, Any]:
    """Compare each mode's greedy token ids with the baseline's (first mode if no nospec):
    per mode, identical (bool) and the share of sequences that differ."""
    have = {k: v for k, v in outputs.items() if v is not None}
    if not have:
        return {"reference": None, "modes": {}}
    ref_name = BASELINE if BASELINE in have else next(iter(have))
    ref = [seq for p in have[ref_name] for seq in p]
    modes = {}
    for k, v in have.items():
        seqs = [seq for p in v for seq in p]
        diff = sum(1 for a, b in zip(ref, seqs) if a != b) + abs(len(ref) - len(seqs))
        modes[k] = {"identical": diff == 0, "differing_sequences": diff,
                    "sequences": len(seqs)}
    return {"reference": ref_name, "all_identical": all(m["identical"] for m in modes.values()),
            "modes": modes}


def keyed_agreement(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Keyed modes against keyed sampling without speculation: per mode, the steps whose
    sampled token ids (all prompts and samples, hashed) are bit-identical. With keyed noise
    every step must match: same seeds, same outputs, hence the same training updates."""
    ref = [s.get("output_ids_sha256") for s in
           (results.get(KEYED_BASELINE) or {}).get("steps") or []]
    out: dict[str, Any] = {}
    if not ref:
        return out
    for name, r in results.items():
        if name == KEYED_BASELINE or r.get("seed_mode") != "keyed" or not r.get("steps"):
            continue
        got = [s.get("output_ids_sha256") for s in r["steps"]]
        same = sum(1 for a, b in zip(ref, got) if a is not None and a == b)
        out[name] = {"identical_steps": same, "steps": min(len(ref), len(got)),
                     "identical": same == len(ref) == len(got)}
    return out


def reward_agreement(results: Mapping[str, Mapping[str, Any]], z: float = 3.0
                     ) -> dict[str, Any]:
    """Sampled check: each mode's mean reward (over all steps) against nospec's, within
    z * combined standard error of the per-step means."""
    base = (results.get(BASELINE) or {}).get("totals")
    out: dict[str, Any] = {}
    for name, r in results.items():
        t = r.get("totals")
        if not t:
            continue
        entry = {"mean_reward": t["mean_reward"], "sem": t["reward_sem"]}
        if base:
            se = math.hypot(t["reward_sem"], base["reward_sem"])
            d = t["mean_reward"] - base["mean_reward"]
            entry["diff_vs_nospec"] = d
            entry["within_noise"] = abs(d) <= z * se if se > 0 else abs(d) < 1e-9
        out[name] = entry
    return out


def lengths_by_prompt(prompt_keys: Sequence[str], lengths: Sequence[Sequence[int]],
                      into: dict[str, list[int]] | None = None) -> dict[str, list[int]]:
    """Response lengths grouped by prompt key (accumulates into `into`)."""
    into = {} if into is None else into
    for key, ls in zip(prompt_keys, lengths):
        into.setdefault(key, []).extend(int(x) for x in ls)
    return into


def lengths_doc(steps: Sequence[Mapping[str, Any]], source: str) -> dict[str, Any]:
    """The lengths file `bubblespec simulate --lengths` reads: flat `lengths` and one
    `by_prompt` group per (step, prompt) (keys in `prompt_keys`)."""
    groups: dict[str, list[int]] = {}
    for s in steps:
        lengths_by_prompt([f"s{s['step']}:{k}" for k in s["prompt_keys"]],
                          s["output_lengths"], groups)
    return {"source": source, "lengths": [x for g in groups.values() for x in g],
            "by_prompt": list(groups.values()), "prompt_keys": list(groups)}


@dataclass
class BenchDoc:
    """The bench JSON document."""

    config: dict[str, Any]
    modes: dict[str, dict[str, Any]] = field(default_factory=dict)
    greedy: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        red = reductions(self.modes)
        return {"schema": SCHEMA, "config": self.config, "definitions": DEFINITIONS,
                "modes": self.modes, "reductions": red, "greedy_check": self.greedy,
                "reward_check": reward_agreement(self.modes),
                "keyed_check": keyed_agreement(self.modes), "final_line": final_line(red)}


DEFINITIONS = {
    "decode_steps_critical": "max over ranks of the engine forward passes of that rank in "
                             "the step (fallback: max per-request decode_steps)",
    "decode_steps_total": "engine forward passes summed over ranks",
    "tokens_per_forward": "completion tokens / per-request forward passes",
    "reduction": "1 - sum(mode critical) / sum(baseline critical) over steps after step 0; "
                 "baseline: nospec-keyed for keyed modes when it ran (bit-identical "
                 "outputs), else nospec",
    "critical_per_longest": "sum(critical) / sum(longest response tokens), steps after 0",
    "bubble_fraction": "per rank: (step wall - decode busy) / step wall, synchronizer timeline",
}


def _pregen_cell(t: Mapping[str, Any]) -> str:
    """Pre-generated tokens: bubble, plus training window when there was any."""
    w = t.get("window_pregen_tokens", 0)
    return f"{t['pregen_tokens']}+{w}" if w else str(t["pregen_tokens"])


def format_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """Per-mode summary (after step 0) and per-step critical-path decode steps."""
    red = reductions(results)
    head = ["mode", "crit steps", "total steps", "tok/fwd", "accept %", "pregen tok",
            "pregen acc", "bubble %", "wall s", "reward", "crit/longest", "reduction"]
    rows, skipped = [], []
    for name, r in results.items():
        t = r.get("totals")
        if not t:
            rows.append([name, "skipped"] + ["-"] * 10)
            skipped.append(f"{name} skipped: {r.get('skipped', '')}")
            continue
        acc = t["accepted_tokens"] / t["draft_tokens"] if t["draft_tokens"] else None
        bf = t["mean_bubble_fraction"]
        rd = red.get(name)
        rows.append([name, str(t["decode_steps_critical"]), str(t["decode_steps_total"]),
                     f"{t['tokens_per_forward']:.2f}",
                     "-" if acc is None else f"{100 * acc:.0f}", _pregen_cell(t),
                     str(t["accepted_pregen_tokens"]), "-" if bf is None else f"{100 * bf:.0f}",
                     f"{t['wall_s']:.1f}", f"{t['mean_reward']:.3f}",
                     f"{t['critical_per_longest']:.2f}",
                     "-" if rd is None else f"{100 * rd:.1f}%"])
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    lines = [fmt(head), fmt(["-" * w for w in widths]), *map(fmt, rows), *skipped]
    per_step = [n for n, r in results.items() if r.get("steps")]
    if per_step:
        lines += ["", "critical-path decode steps per step:",
                  "step  " + "  ".join(f"{n:>16}" for n in per_step)]
        k = max(len(results[n]["steps"]) for n in per_step)
        for i in range(k):
            cells = []
            for n in per_step:
                s = results[n]["steps"]
                cells.append(f"{s[i]['decode_steps_critical']:>16}" if i < len(s) else " " * 16)
            lines.append(f"{i:>4}  " + "  ".join(cells))
    lines += ["", ("figures after step 0 (reward: mean over all steps); crit = slowest rank's "
              "engine forward passes; pregen acc = accepted draft tokens from pre-generation")]
    return "\n".join(lines)
