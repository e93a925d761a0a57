"""`bubblespec bench policy`: does a model behave like an RL policy on the wordproblems task?

    bubblespec bench policy                      # the warm-started policy (`make real-policy`)
    bubblespec bench policy --model BASE_DIR     # any HF directory, e.g. the base instruct model

Samples `--n` responses to each of `--prompts` fresh problems (seed `--seed`) at temperature
1.0 on a real engine without speculation, and prints what decides whether a rollout step has
a bubble and a GRPO group has a signal:

- the share of responses that end with ``<|im_end|>`` inside the budget (the rest ran out);
- response lengths overall and per number of operations: median, p90, max and the
  coefficient of variation (std / mean), so a reader sees lengths grow with difficulty;
- the B0 reward (mean over every sample) and the share of groups whose rewards differ
  (only those carry a GRPO signal).

`--out PATH` writes the figures and every response's length, step count and reward as JSON.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bubblespec.engine import EngineConfig, GenRequest
from bubblespec.engine.engine import RolloutEngine
from bubblespec.protocol.sampling import SamplingParams
from bubblespec.tasks.wordproblems import WordProblemsTask


@dataclass(frozen=True)
class PolicyBenchConfig:
    """What `bubblespec bench policy` runs (its flags; defaults and help in its `--help`)."""

    model: str
    prompts: int = 64
    n: int = 4
    seed: int = 1000
    temperature: float = 1.0
    out: str = ""


def length_row(lengths: list[int]) -> dict[str, float]:
    """count, median, p90, max, mean and coefficient of variation of `lengths`."""
    xs = sorted(lengths)
    mean = statistics.fmean(xs)
    sd = statistics.pstdev(xs) if len(xs) > 1 else 0.0
    return {"count": len(xs), "median": float(statistics.median(xs)),
            "p90": float(xs[min(len(xs) - 1, int(0.9 * len(xs)))]), "max": float(xs[-1]),
            "mean": mean, "cv": sd / mean if mean else 0.0}


def summarise(samples: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    """The figures of one run from its samples (`steps`, `length`, `ended`, `reward`,
    `group`)."""
    groups: dict[int, list[float]] = defaultdict(list)
    for s in samples:
        groups[s["group"]].append(s["reward"])
    by_steps: dict[int, list[int]] = defaultdict(list)
    for s in samples:
        by_steps[s["steps"]].append(s["length"])
    return {
        "samples": len(samples), "budget": budget,
        "ended_share": sum(s["ended"] for s in samples) / len(samples),
        "lengths": length_row([s["length"] for s in samples]),
        "by_steps": {k: length_row(v) for k, v in sorted(by_steps.items())},
        "reward": statistics.fmean(s["reward"] for s in samples),
        "groups_with_signal": sum(len(set(r)) > 1 for r in groups.values()) / len(groups),
    }


def table(fig: dict[str, Any]) -> str:
    """The printed report of `summarise`'s figures."""
    ln = fig["lengths"]
    lines = [(f"{fig['samples']} samples: {100 * fig['ended_share']:.1f}% end with <|im_end|> "
              f"inside {fig['budget']} tokens; B0 reward {fig['reward']:.3f}; "
              f"{100 * fig['groups_with_signal']:.0f}% of groups carry a GRPO signal"),
             (f"lengths: median {ln['median']:.0f}, p90 {ln['p90']:.0f}, max {ln['max']:.0f}, "
              f"cv {ln['cv']:.2f}"),
             f"{'operations':>10} {'count':>6} {'median':>7} {'p90':>5} {'max':>5} {'cv':>5}"]
    for k, r in fig["by_steps"].items():
        lines.append(f"{k:>10} {r['count']:>6} {r['median']:>7.0f} {r['p90']:>5.0f} "
                     f"{r['max']:>5.0f} {r['cv']:>5.2f}")
    return "\n".join(lines)


async def run(cfg: PolicyBenchConfig) -> dict[str, Any]:
    """Sample, summarise, print; returns the figures (and writes `cfg.out`)."""
    task = WordProblemsTask(Path(cfg.model))
    problems = task.make_prompts(cfg.prompts, seed=cfg.seed)
    reqs = [GenRequest(input_ids=list(p.input_ids), n=cfg.n,
                       seeds=[cfg.seed * 7919 + 16 * i + j for j in range(cfg.n)],
                       sampling=SamplingParams(max_new_tokens=task.max_new_tokens,
                                               temperature=cfg.temperature,
                                               stop_token_ids=[task.eos_id]))
            for i, p in enumerate(problems)]
    eng = await RolloutEngine.start(EngineConfig(model=cfg.model, spec_mode="none"))
    try:
        t0 = time.monotonic()
        results = await eng.generate(reqs)
        secs = time.monotonic() - t0
    finally:
        await eng.shutdown()
    samples = [{"group": i, "steps": p.steps, "length": len(s.output_ids),
                "ended": bool(s.output_ids) and s.output_ids[-1] == task.eos_id,
                "reward": task.reward(p, s.output_ids)}
               for i, (p, r) in enumerate(zip(problems, results)) for s in r.samples]
    fig = summarise(samples, task.max_new_tokens)
    print(f"model {cfg.model} ({secs:.0f} s to sample)")
    print(table(fig))
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(json.dumps({"config": asdict(cfg), "figures": fig,
                                             "samples": samples, "sample_s": secs}, indent=1))
    return fig
