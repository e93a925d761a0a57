"""`bubblespec train-demo`: the GRPO schedule once through a cluster, with its log and plot.

`run_demo` runs `run_grpo` against a gateway, prints a line per step (reward, wall time,
critical-path decode steps, tokens per forward, pre-generated tokens, and
`max_abs_logprob_gap`: trainer vs rollout log-probs of the same tokens under the same
weights, the on-policy check), then the reward per epoch when the prompts repeat
(`--epoch-steps`: the same problems each epoch, so the curve is not the luck of the draw
of a step's problems), and, pooled over the steps, where responses left their
pre-generated drafts by position class with the policy's entropy there (`positions.py`),
and writes `<out>/grpo_log.json` (after every step, so a long run that dies keeps its
steps) and `<out>/grpo_reward.png`. On a local cluster whose ranks
are paced (`--rank-arg=--pace=h100 --rank-arg=--pace-scale=S`), each step also carries its
modelled rollout seconds and overrunning forwards (`pacing.py`), printed per step, in all,
and plotted below the reward.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bubblespec.train.pacing import PaceProbe, format_run_pace, run_pace
from bubblespec.train.positions import format_pooled, pooled
from bubblespec.train.schedule import HEADER, run_grpo


@dataclass(frozen=True)
class DemoConfig:
    """What `bubblespec train-demo` runs (its flags; defaults and help in its `--help`)."""

    steps: int
    prompts: int
    n: int
    temperature: float
    seed_mode: str
    lr: float
    seed: int
    epoch_steps: int
    ranks: int
    model: str | None
    rank_arg: list[str]
    gateway: str | None
    out: str
    log_dir: str | None
    task: str = "addchain"
    """The task (`bubblespec.tasks.TASKS`) whose prompts and reward the loop uses."""
    lookahead: int = 1
    """Training batches handed ahead with each rollout (`run_grpo`)."""
    loss_agg: str = "seq-mean"
    """The trainer's loss aggregation (`bubblespec.train.grpo.LOSS_AGGS`)."""
    resume: bool = False
    """Go on with the stopped run whose log and checkpoint are in `out` (`resume_records`)."""
    weight_push: str = "disk"
    """How each step's weights reach the ranks: `disk` (a checkpoint `POST /v1/weights`
    reloads) or `group` (a gloo process-group push, `bubblespec.client.weights`)."""


RUN_FIELDS = ("task", "prompts", "n", "temperature", "seed_mode", "lr", "seed", "epoch_steps",
              "lookahead", "loss_agg")
"""The settings that decide a run's prompts, seeds and updates: a resumed run keeps them
(the cluster's settings, `--rank-arg`, `--ranks`, and `--steps` may change)."""


def resume_records(args: DemoConfig, model_dir: str) -> tuple[list[dict[str, Any]], list[int]]:
    """The steps a stopped run in `args.out` completed and the steps it was resumed at
    before, checked before any cluster starts: ValueError naming what does not fit (no log,
    another run's settings or model, no step left to run, no checkpoint of the last step)."""
    out = Path(args.out)
    path = out / "grpo_log.json"
    if not path.is_file():
        raise ValueError(f"{path}: no log to resume (run without --resume first)")
    doc = json.loads(path.read_text())
    done = list(doc.get("steps") or [])
    cfg = doc.get("config") or {}
    diff = [f"--{f.replace('_', '-')} {cfg.get(f)!r} in the log, {getattr(args, f)!r} now"
            for f in RUN_FIELDS if cfg.get(f) != getattr(args, f)]
    if doc.get("model") != model_dir:
        diff.append(f"model {doc.get('model')!r} in the log, {model_dir!r} now")
    if diff:
        raise ValueError(f"{path}: another run's settings: {'; '.join(diff)}")
    if len(done) >= args.steps:
        raise ValueError(f"{path}: the run has {len(done)} steps already; pass --steps "
                         f"above {len(done)} to go on")
    if done:
        from bubblespec.train.grpo import TRAINER_STATE

        ckpt = out / "weights" / f"v{len(done)}" / TRAINER_STATE
        if not ckpt.is_file():
            raise ValueError(f"{ckpt}: no checkpoint of step {len(done) - 1} to go on from")
    return done, [*doc.get("resumed_at", []), len(done)]


def resolve_model(model: str | None, task: str = "addchain") -> str:
    """`model`, or the task's own model directory (`bubblespec.tasks.task_model_dir`:
    the embedded model for addchain; FileNotFoundError when it is missing)."""
    if model:
        return model
    from bubblespec.tasks import task_model_dir

    return str(task_model_dir(task))


def epoch_rewards(records: Sequence[dict[str, Any]], epoch_steps: int) -> list[dict[str, Any]]:
    """Mean reward per epoch of a run whose prompt batches repeat every `epoch_steps` steps
    (`--epoch-steps`): epoch e is steps e*K .. e*K+K-1, the same problems each epoch, so
    epochs compare the same problems under newer weights, where single steps compare
    different problems. Each row: epoch, its steps, mean, standard error of the mean over
    its samples (None with fewer than 2), samples. Epochs cut short by the run's end are
    left out; [] when `epoch_steps` < 1 or a step has no per-sample rewards."""
    if epoch_steps < 1 or any("rewards" not in r for r in records):
        return []
    rows = []
    for e in range(len(records) // epoch_steps):
        steps = records[e * epoch_steps:(e + 1) * epoch_steps]
        xs = [float(x) for r in steps for g in r["rewards"] for x in g]
        rows.append({"epoch": e, "steps": [r["step"] for r in steps],
                     "mean": statistics.fmean(xs) if xs else 0.0,
                     "se": statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else None,
                     "samples": len(xs)})
    return rows


def format_epochs(rows: Sequence[dict[str, Any]]) -> str:
    """`epoch_rewards` as lines: epoch, steps, mean +- standard error, samples."""
    lines = ["epoch  steps    reward (+- s.e.)  samples"]
    for r in rows:
        se = f"{r['se']:.3f}" if r["se"] is not None else "-"
        lines.append(f"{r['epoch']:>5}  {r['steps'][0]:>2}-{r['steps'][-1]:<3}  "
                     f"{r['mean']:.3f} +- {se:<6} {r['samples']:>7}")
    return "\n".join(lines)


def plot_rewards(records: Sequence[dict[str, Any]], path: str | Path, title: str,
                 epochs: Sequence[dict[str, Any]] = ()) -> bool:
    """Reward per step (and a 3-step moving average), and with `epochs` (`epoch_rewards`)
    each epoch's mean with the standard error over its samples, spanning its steps; below
    it, when the ranks were paced, each step's modelled rollout seconds. False if
    matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    xs = [r["step"] for r in records]
    ys = [r["mean_reward"] for r in records]
    ma = [sum(ys[max(0, i - 2): i + 1]) / len(ys[max(0, i - 2): i + 1]) for i in range(len(ys))]
    paced = [(r["step"], r["pace"]["modelled_s"]) for r in records if r.get("pace")]
    if paced:
        fig, (ax, ax_t) = plt.subplots(2, 1, figsize=(6, 5.5), sharex=True,
                                       height_ratios=(3, 2))
        ax_t.bar([s for s, _ in paced], [t for _, t in paced], color="tab:gray")
        ax_t.set_ylabel("rollout, modelled s")
        ax_t.set_xlabel("GRPO step")
    else:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.set_xlabel("GRPO step")
    ax.plot(xs, ys, "o-", alpha=0.5, label="mean reward")
    ax.plot(xs, ma, "-", lw=2, label="3-step moving average")
    if epochs:
        ax.errorbar([(e["steps"][0] + e["steps"][-1]) / 2 for e in epochs],
                    [e["mean"] for e in epochs], yerr=[e["se"] or 0.0 for e in epochs],
                    xerr=[(e["steps"][-1] - e["steps"][0]) / 2 for e in epochs], fmt="s",
                    color="black", capsize=3, label="epoch mean (same problems) +- s.e.")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_log(out: Path, args: DemoConfig, model_dir: str, records: Sequence[dict[str, Any]],
              complete: bool, resumed_at: Sequence[int] = ()) -> dict[str, Any] | None:
    """Write `<out>/grpo_log.json` (config, model, steps, the run's paced summary,
    `complete`: False while the run goes on, so a run that dies at step 19 of 20 keeps its
    19 steps and can be resumed, and `resumed_at`: the steps it was resumed at) by
    replacing the file whole, so a reader never sees half of one. Returns the paced
    summary (`pacing.run_pace`)."""
    paced = run_pace(records)
    doc = {"config": asdict(args), "model": model_dir, "complete": complete,
           "resumed_at": list(resumed_at), "steps": list(records), "pace": paced}
    tmp = out / "grpo_log.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(out / "grpo_log.json")
    return paced


def run_demo(args: DemoConfig, url: str, model_dir: str,
             pace_probe: PaceProbe | None = None,
             done: Sequence[dict[str, Any]] = (), resumed_at: Sequence[int] = ()
             ) -> list[dict[str, Any]]:
    """Run the schedule against the gateway at `url`; print, log and plot it. `pace_probe`:
    the ranks' paced counters (a local cluster's ranks), read around each rollout. `done`,
    `resumed_at`: a resumed run's completed steps and resume points (`resume_records`)."""
    from bubblespec.client import BubbleSpecClient
    from bubblespec.tasks import make_task

    task = make_task(args.task, model_dir)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sampling = {"temperature": args.temperature, "max_new_tokens": task.max_new_tokens,
                "seed_mode": args.seed_mode}
    with BubbleSpecClient(url) as client:
        client.wait_ready(timeout_s=300)
        print(HEADER, flush=True)
        records = run_grpo(client, task, model_dir, args.steps, args.prompts, args.n, sampling,
                           seed=args.seed, lr=args.lr, work_dir=str(out / "weights"),
                           epoch_steps=args.epoch_steps, lookahead=args.lookahead,
                           loss_agg=args.loss_agg, pace_probe=pace_probe,
                           log=lambda s: print(s, flush=True), checkpoint=True, done=done,
                           weight_push=args.weight_push,
                           on_step=lambda rs: write_log(out, args, model_dir, rs, False,
                                                        resumed_at))
    paced = write_log(out, args, model_dir, records, True, resumed_at)
    ys = [r["mean_reward"] for r in records]
    q = max(1, len(ys) // 4)
    print(f"\nreward: first {q} steps {sum(ys[:q]) / q:.3f} -> last {q} steps "
          f"{sum(ys[-q:]) / q:.3f}; max |logprob gap| "
          f"{max((r['max_abs_logprob_gap'] for r in records), default=0):.2e}")
    pushes = [r["push_s"] for r in records if r.get("push_s") is not None]
    if pushes:
        steps_s = [r["wall_s"] + r["train_s"] for r in records]
        print(f"weights by {args.weight_push}: push median {statistics.median(pushes):.2f} s; "
              f"step (rollout + train + push) median {statistics.median(steps_s):.2f} s")
    if paced:
        print(format_run_pace(paced))
    epochs = epoch_rewards(records, args.epoch_steps)
    if epochs:
        print(f"\nreward per epoch (the same {args.epoch_steps * args.prompts} problems "
              f"each epoch):\n{format_epochs(epochs)}")
    print("\nwhere responses left their pre-generated drafts (steps >= 1; entropy: the "
          "policy's at the trained samples' positions, nats):")
    print(format_pooled(pooled(records)))
    if plot_rewards(records, out / "grpo_reward.png", f"GRPO on the {args.task} task "
                    f"({args.prompts}x{args.n}/step)", epochs):
        print(f"wrote {out / 'grpo_log.json'} and {out / 'grpo_reward.png'}")
    else:
        print(f"wrote {out / 'grpo_log.json'} (matplotlib missing: no plot)")
    return records


def train_demo(cfg: DemoConfig, model_dir: str) -> list[dict[str, Any]]:
    """`run_demo` against `cfg.gateway`, or against a fresh `LocalCluster` of `cfg.ranks`
    ranks (ClusterError if it does not start); with `cfg.resume`, going on with the run in
    `cfg.out` (ValueError, before anything starts, when it cannot)."""
    from bubblespec.cluster import LocalCluster

    done, resumed_at = resume_records(cfg, model_dir) if cfg.resume else ([], [])
    if cfg.resume:
        print(f"resuming at step {len(done)} of {cfg.steps}", flush=True)
    if cfg.gateway:
        return run_demo(cfg, cfg.gateway, model_dir, done=done, resumed_at=resumed_at)
    print(f"starting a local cluster with {cfg.ranks} rank(s)...", flush=True)
    with LocalCluster(ranks=cfg.ranks, model=model_dir, rank_args=cfg.rank_arg,
                      log_dir=cfg.log_dir) as cluster:
        print(f"cluster ready: gateway {cluster.gateway_url}", flush=True)
        return run_demo(cfg, cluster.gateway_url, model_dir, PaceProbe(cluster.rank_urls),
                        done, resumed_at)
