"""`bubblespec run` (`make run`): a local cluster, rollout steps with pre-generation, a table.

Starts `LocalCluster(ranks=2)` (unless `--gateway-url` points at a running gateway), rolls out
`--steps` steps of the embedded task through the blocking client, each step passing the next
step's prompts so that ranks that finish early pre-generate them, and prints per step: wall
time, per-rank busy / bubble / pre-gen seconds (from the synchronizer's timeline), tokens
pre-generated in the bubble, draft tokens fetched at step start, decode steps (target
forward passes: slowest rank, and summed over ranks), tokens per forward, draft acceptance
and mean reward. `run_steps` is the loop to grow into GRPO (an `on_step` hook gets each
step's prompts and results). `--task wordproblems` runs the real model on its task instead.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bubblespec.client import BubbleSpecClient, BubbleSpecError, RolloutResponse, StepReport
from bubblespec.cluster import LocalCluster


@dataclass(frozen=True)
class RunConfig:
    """What `bubblespec run` runs (its flags; defaults and help in `bubblespec run --help`)."""

    steps: int
    prompts: int
    n: int
    temperature: float
    max_new_tokens: int
    seed: int
    ranks: int
    model: str | None
    rank_arg: list[str]
    log_dir: str | None
    gateway_url: str | None
    json: str | None
    task: str = "addchain"
    """The prompts' task (`bubblespec.tasks.TASKS`); without `model`, the task's model."""

    def model_dir(self) -> str:
        """`model`, or the task's own model (FileNotFoundError when it is not built)."""
        from bubblespec.tasks import task_model_dir

        return self.model or str(task_model_dir(self.task))


@dataclass
class StepRecord:
    """One rollout step as the demo saw it."""

    step: int
    wall_s: float
    mean_reward: float
    num_samples: int
    result: RolloutResponse = field(repr=False)
    report: StepReport | None = field(default=None, repr=False)


OnStep = Callable[[int, Sequence[Any], RolloutResponse], None]


def run_steps(client: BubbleSpecClient, task: Any, steps: int, prompts_per_step: int, n: int,
              sampling: dict[str, Any], seed: int = 0, on_step: OnStep | None = None,
              log: Callable[[str], None] = print) -> list[StepRecord]:
    """Roll out `steps` steps; step k uses `task.make_prompts(prompts, seed + k)` and passes
    step k+1's prompts ahead for pre-generation (the last step passes none)."""
    batches = [task.make_prompts(prompts_per_step, seed + k) for k in range(steps + 1)]
    records = []
    for k in range(steps):
        nxt = batches[k + 1] if k + 1 < steps else None
        t0 = time.monotonic()
        res = client.rollout(batches[k], n=n, sampling_params=sampling, next_prompts=nxt)
        wall = time.monotonic() - t0
        rewards = [task.reward(p, s.output_ids) for p, pr in zip(batches[k], res.prompts)
                   for s in pr.samples]
        rec = StepRecord(res.step, wall, sum(rewards) / max(1, len(rewards)), len(rewards), res)
        records.append(rec)
        c = res.counters
        log(f"step {res.step}: {wall:.2f} s, {c.completion_tokens} tokens, reward "
            f"{rec.mean_reward:.3f}" + (f", warnings: {res.warnings}" if res.warnings else ""))
        if on_step is not None:
            on_step(res.step, batches[k], res)
    return records


def attach_reports(client: BubbleSpecClient, records: list[StepRecord],
                   settle_s: float = 1.0) -> None:
    """Fetch each step's timeline (after `settle_s`, so late pre-gen spans are filed)."""
    time.sleep(settle_s)
    for rec in records:
        try:
            rec.report = client.step_timeline(rec.step)
        except BubbleSpecError as e:
            print(f"step {rec.step}: no timeline ({e})", file=sys.stderr)


def format_table(records: list[StepRecord]) -> str:
    """The per-step table (one row per step, per-rank columns busy/bubble/pregen seconds)."""
    rank_ids = sorted({r.rank_id for rec in records if rec.report for r in rec.report.ranks}
                      | {r.rank_id for rec in records for r in rec.result.ranks})
    head = ["step", "wall s"] + [f"{r} busy/bubl/pgen s" for r in rank_ids] + [
        "bubble %", "stop lag ms", "pregen tok", "fetched tok", "dec steps crit", "dec steps tot",
        "tok/fwd", "accept %", "reward"]
    rows = []
    for rec in records:
        c = rec.result.counters
        by = {r.rank_id: r for r in rec.report.ranks} if rec.report else {}
        cells = [str(rec.step), f"{rec.wall_s:.2f}"]
        for r in rank_ids:
            b = by.get(r)
            cells.append(f"{b.busy_s:.2f}/{b.bubble_s:.2f}/{b.pregen_s:.2f}" if b else "-")
        rep = rec.report
        bubble = rep.bubble_fraction if rep and rep.bubble_fraction is not None else None
        acc = c.num_accepted_tokens / c.num_draft_tokens if c.num_draft_tokens else None
        lag = rep.stop_lag_s if rep else None
        cells += [f"{100 * bubble:.0f}" if bubble is not None else "-",
                  f"{1000 * lag:.0f}" if lag is not None else "-",
                  str(rep.pregen_tokens) if rep else "-", str(c.drafts_fetched_tokens),
                  str(c.decode_steps_critical), str(c.decode_steps_total),
                  f"{c.tokens_per_forward:.2f}", f"{100 * acc:.0f}" if acc is not None else "-",
                  f"{rec.mean_reward:.3f}"]
        rows.append(cells)
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))
    notes = ("busy = decode spans; bubble = step wall - busy; pgen = pre-generation inside "
             "the bubble;\npregen tok = generated in this step's bubble for the next step; "
             "fetched tok = drafts\nthe ranks fetched at this step's start; dec steps = target "
             "forward passes (crit = slowest rank,\ntot = summed over ranks); tok/fwd = "
             "completion tokens / per-request forward passes; stop lag = stop signal -> end "
             "of\nthe last pre-generation span (pre-gen stops within T decode steps + one "
             "RPC).")
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, rows), "",
                      notes])


def sync_rpc_seconds(metrics_url: str | None) -> float | None:
    """Total seconds the synchronizer spent handling RPCs so far (its own histogram)."""
    if not metrics_url:
        return None
    import httpx

    try:
        text = httpx.get(metrics_url, timeout=5).text
    except httpx.HTTPError:
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("bubblespec_sync_rpc_duration_seconds_sum"))


def run_and_report(args: RunConfig, url: str, sync_metrics: str | None = None
                   ) -> list[StepRecord]:
    """Roll out `args.steps` steps through the gateway at `url`, print the per-step table and
    the synchronizer's share of step wall time (from `sync_metrics`, its /metrics URL)."""
    from bubblespec.tasks import make_task

    task = make_task(args.task, args.model_dir())
    sampling = {"temperature": args.temperature,
                "max_new_tokens": args.max_new_tokens or task.max_new_tokens}
    with BubbleSpecClient(url) as client:
        client.wait_ready(timeout_s=120)
        rpc0 = sync_rpc_seconds(sync_metrics)
        records = run_steps(client, task, args.steps, args.prompts, args.n, sampling,
                            seed=args.seed)
        rpc1 = sync_rpc_seconds(sync_metrics)
        attach_reports(client, records)
    print()
    print(format_table(records))
    if rpc0 is not None and rpc1 is not None:
        wall = sum(r.wall_s for r in records)
        print(f"\nsynchronizer cost: {1000 * (rpc1 - rpc0):.1f} ms handling RPCs over "
              f"{wall:.1f} s of steps = {100 * (rpc1 - rpc0) / wall:.3f}% of step wall time")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"step": r.step, "wall_s": r.wall_s, "mean_reward": r.mean_reward,
                        "counters": r.result.counters.model_dump(),
                        "ranks": [x.model_dump() for x in r.result.ranks],
                        "bubbles": [x.model_dump() for x in r.report.ranks] if r.report else None}
                       for r in records], f, indent=1)
    return records


def run_demo(args: RunConfig) -> list[StepRecord]:
    """`run_and_report` against `args.gateway_url`, or against a fresh `LocalCluster` of
    `args.ranks` ranks (ClusterError if it does not start)."""
    if args.gateway_url:
        return run_and_report(args, args.gateway_url)
    print(f"starting a local cluster with {args.ranks} rank(s) (engines take ~20 s)...",
          flush=True)
    with LocalCluster(ranks=args.ranks, model=args.model_dir(), rank_args=args.rank_arg,
                      log_dir=args.log_dir) as cluster:
        print(f"cluster ready: gateway {cluster.gateway_url}, logs {cluster.log_dir}",
              flush=True)
        return run_and_report(args, cluster.gateway_url, cluster.addresses()["sync_metrics"])
