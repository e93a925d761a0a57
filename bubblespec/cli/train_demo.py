"""`bubblespec train-demo` (and `examples/grpo.py`): a real GRPO loop through the service.

    bubblespec train-demo [--steps 20] [--prompts 8] [--n 8] [--model DIR]
                          [--gateway URL] [--out DIR] [--rank-arg=--spec-mode=...]

Starts a 2-rank `LocalCluster` (unless `--gateway` points at a running one), then per step:
rolls out `--prompts` prompts x `--n` samples at temperature 1.0 with the next step's prompts
passed ahead (pre-generation in the bubble), scores them with the task's reward, takes one
`Trainer.step` (group-normalised advantages, PPO-clipped ratio against the rollout's
log-probs), saves the weights and pushes them with `update_weights`. Prints per step: reward,
wall time, critical-path decode steps (slowest rank's forward passes), accepted tokens per
forward, pre-generated tokens, and `max_abs_logprob_gap` (trainer vs rollout log-probs of the
same tokens under the same weights: the on-policy check). Writes `<out>/grpo_log.json` and
`<out>/grpo_reward.png`.

`run_grpo` is shared with `bubblespec bench`, which runs the same schedule per mode.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bubblespec.bench_modes import step_figures
from bubblespec.protocol.sampling import PregenWindow, SeedMode


def resolve_model(model: str | None) -> str:
    if model:
        return model
    from bubblespec.tasks import default_model_dir

    return str(default_model_dir())


def run_grpo(client: Any, task: Any, model_dir: str, steps: int, prompts_per_step: int, n: int,
             sampling: dict[str, Any], seed: int = 0, lr: float = 1e-4, pregen: bool = True,
             work_dir: str | None = None, log: Callable[[str], None] = print,
             train: bool = True, timeline_settle_s: float = 0.3,
             epoch_steps: int = 0, pregen_window: PregenWindow | None = None
             ) -> list[dict[str, Any]]:
    """Run the GRPO schedule: step k uses `task.make_prompts(prompts_per_step, seed + j)`
    with j = k, or k % epoch_steps when `epoch_steps` > 0 (the prompt set repeats every
    `epoch_steps` steps, as epochs over a dataset do; history drafts need that).
    Returns one dict per step (figures of `step_figures` plus trainer stats)."""
    from bubblespec.train.grpo import Rollout, Trainer

    trainer = Trainer(model_dir, lr=lr, seed=seed) if train else None
    own_tmp = work_dir is None
    wdir = Path(tempfile.mkdtemp(prefix="bubblespec-grpo-") if own_tmp else work_dir)
    batches = [task.make_prompts(prompts_per_step, seed + (k % epoch_steps if epoch_steps else k))
               for k in range(steps + 1)]
    records: list[dict[str, Any]] = []
    prev_dir: Path | None = None
    try:
        for k in range(steps):
            nxt = batches[k + 1] if (pregen and k + 1 < steps) else None
            t0 = time.monotonic()
            res = client.rollout(batches[k], n=n, sampling_params=sampling, next_prompts=nxt,
                                 pregen=pregen, pregen_window=pregen_window)
            wall = time.monotonic() - t0
            groups = []
            for p, pr in zip(batches[k], res.prompts):
                outs = [s.output_ids for s in pr.samples]
                groups.append(Rollout(list(p.input_ids), outs,
                                      [list(s.output_logprobs or []) for s in pr.samples],
                                      [task.reward(p, o) for o in outs]))
            rewards = [r for g in groups for r in g.rewards]
            mean_reward = sum(rewards) / max(1, len(rewards))
            t1 = time.monotonic()
            stats: dict[str, Any] = {}
            if trainer is not None:
                stats = trainer.step(groups)
                vdir = wdir / f"v{k + 1}"
                trainer.save(str(vdir))
                client.update_weights(str(vdir), version=k + 1)
                if prev_dir is not None:
                    shutil.rmtree(prev_dir, ignore_errors=True)
                prev_dir = vdir
            train_s = time.monotonic() - t1
            report = None
            try:
                time.sleep(timeline_settle_s)
                report = asdict(client.step_timeline(res.step))
            except Exception as e:  # noqa: BLE001 (a missing timeline must not stop training)
                log(f"step {k}: no timeline ({e})")
            fig = step_figures(asdict(res), report, wall, mean_reward)
            fig.update(step=k, service_step=res.step, train_s=train_s,
                       max_abs_logprob_gap=float(stats.get("max_abs_logprob_gap", 0.0)),
                       loss=float(stats.get("loss", 0.0)), trained_samples=stats.get("samples"),
                       prompt_keys=[pr.prompt_key for pr in res.prompts],
                       output_lengths=[[len(s.output_ids) for s in pr.samples]
                                       for pr in res.prompts],
                       output_ids_sha256=hashlib.sha256(json.dumps(
                           [[s.output_ids for s in pr.samples] for pr in res.prompts]
                       ).encode()).hexdigest(),
                       warnings=list(res.warnings))
            records.append(fig)
            log(format_row(fig))
    finally:
        if own_tmp:
            shutil.rmtree(wdir, ignore_errors=True)
    return records


HEADER = (f"{'step':>4} {'reward':>7} {'wall s':>7} {'crit dec':>8} {'tok/fwd':>7} "
          f"{'pregen':>6} {'pg acc':>6} {'lp gap':>8}")


def format_row(f: dict[str, Any]) -> str:
    return (f"{f['step']:>4} {f['mean_reward']:>7.3f} {f['wall_s']:>7.2f} "
            f"{f['decode_steps_critical']:>8} {f['tokens_per_forward']:>7.2f} "
            f"{f['pregen_tokens']:>6} {f['accepted_pregen_tokens']:>6} "
            f"{f['max_abs_logprob_gap']:>8.2e}")


def plot_rewards(records: Sequence[dict[str, Any]], path: str | Path, title: str) -> bool:
    """Reward per step (and a 3-step moving average); False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    xs = [r["step"] for r in records]
    ys = [r["mean_reward"] for r in records]
    ma = [sum(ys[max(0, i - 2): i + 1]) / len(ys[max(0, i - 2): i + 1]) for i in range(len(ys))]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(xs, ys, "o-", alpha=0.5, label="mean reward")
    ax.plot(xs, ma, "-", lw=2, label="3-step moving average")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bubblespec train-demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed-mode", choices=[m.value for m in SeedMode],
                   default=SeedMode.DEFAULT.value)
    p.add_argument("--lr", type=float, default=1e-4,
                   help="AdamW learning rate (1e-3 made the reward collapse in a 20-step run)")
    p.add_argument("--seed", type=int, default=0, help="prompt seed of the first step")
    p.add_argument("--epoch-steps", type=int, default=0,
                   help="repeat the prompt batches every K steps (0: fresh prompts each step)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--model", default=None, help="HF model dir [embedded tiny model]")
    p.add_argument("--rank-arg", action="append", default=[], metavar="ARG")
    p.add_argument("--gateway", default=None, metavar="URL", help="use a running gateway "
                   "(its ranks must be able to read --out)")
    p.add_argument("--out", default="out/grpo", help="log, plot and weights directory")
    p.add_argument("--log-dir", default=None, help="cluster logs")
    return p.parse_args(list(argv))


def run(args: argparse.Namespace, url: str, model_dir: str) -> list[dict[str, Any]]:
    from bubblespec.client import BubbleSpecClient
    from bubblespec.tasks import default_task

    task = default_task()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sampling = {"temperature": args.temperature, "max_new_tokens": task.max_new_tokens,
                "seed_mode": args.seed_mode}
    with BubbleSpecClient(url) as client:
        client.wait_ready(timeout_s=300)
        print(HEADER, flush=True)
        records = run_grpo(client, task, model_dir, args.steps, args.prompts, args.n, sampling,
                           seed=args.seed, lr=args.lr, work_dir=str(out / "weights"),
                           epoch_steps=args.epoch_steps,
                           log=lambda s: print(s, flush=True))
    doc = {"config": {k: v for k, v in vars(args).items()}, "model": model_dir,
           "steps": records}
    (out / "grpo_log.json").write_text(json.dumps(doc, indent=1))
    ys = [r["mean_reward"] for r in records]
    q = max(1, len(ys) // 4)
    print(f"\nreward: first {q} steps {sum(ys[:q]) / q:.3f} -> last {q} steps "
          f"{sum(ys[-q:]) / q:.3f}; max |logprob gap| "
          f"{max((r['max_abs_logprob_gap'] for r in records), default=0):.2e}")
    if plot_rewards(records, out / "grpo_reward.png", f"GRPO on the embedded task "
                    f"({args.prompts}x{args.n}/step)"):
        print(f"wrote {out / 'grpo_log.json'} and {out / 'grpo_reward.png'}")
    else:
        print(f"wrote {out / 'grpo_log.json'} (matplotlib missing: no plot)")
    return records


def main(argv: Sequence[str] | None = None) -> int:
    from bubblespec.cli.up import ClusterError, LocalCluster
    from bubblespec.client import BubbleSpecError

    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        model_dir = resolve_model(args.model)
    except FileNotFoundError as e:
        print(f"train-demo: {e}; pass --model DIR", file=sys.stderr)
        return 1
    try:
        if args.gateway:
            run(args, args.gateway, model_dir)
            return 0
        print(f"starting a local cluster with {args.ranks} rank(s)...", flush=True)
        with LocalCluster(ranks=args.ranks, model=model_dir, rank_args=args.rank_arg,
                          log_dir=args.log_dir) as cluster:
            print(f"cluster ready: gateway {cluster.gateway_url}", flush=True)
            run(args, cluster.gateway_url, model_dir)
        return 0
    except ClusterError as e:
        print(f"train-demo: cluster failed: {e}", file=sys.stderr)
        return 1
    except BubbleSpecError as e:
        print(f"train-demo: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
