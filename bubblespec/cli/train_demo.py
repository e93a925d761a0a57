"""`bubblespec train-demo` (and `examples/grpo.py`): a real GRPO loop through the service.

    bubblespec train-demo [--steps 20] [--prompts 8] [--n 8] [--model DIR]
                          [--gateway URL] [--out DIR] [--rank-arg=--spec-mode=...]
    bubblespec train-demo ... --out DIR --resume [--steps N]
    bubblespec train-demo --compare A/grpo_log.json B/grpo_log.json [--out DIR]

Starts a 2-rank `LocalCluster` (unless `--gateway` points at a running one), then per step:
rolls out `--prompts` prompts x `--n` samples at temperature 1.0 with the next step's prompts
passed ahead (pre-generation in the bubble), scores them with the task's reward, takes one
`Trainer.step` (group-normalised advantages, PPO-clipped ratio against the rollout's
log-probs), saves the weights and pushes them with `update_weights`. Prints per step: reward,
wall time, critical-path decode steps (slowest rank's forward passes), accepted tokens per
forward, pre-generated tokens, and `max_abs_logprob_gap` (trainer vs rollout log-probs of the
same tokens under the same weights: the on-policy check). Writes `<out>/grpo_log.json` and
`<out>/grpo_reward.png`. The loop is `bubblespec.train.schedule.run_grpo`, shared with
`bubblespec bench service`, which runs the same schedule per mode. With paced ranks
(`--rank-arg=--pace=h100 --rank-arg=--pace-scale=S`) each step also prints its modelled
rollout seconds and overrunning forwards.

The log is written and the trainer checkpointed (weights, optimiser and random state, the
newest step's only) after every step, so a stopped run goes on with `--resume` (same
`--out` and settings): under keyed sampling it samples the tokens the uninterrupted run
would have. Ctrl-C or SIGTERM stops the run between any two of its instructions: the
local cluster stops in order, the command names the steps its log kept and exits with 130.

`--compare` runs nothing: it prints two saved runs' curves side by side (per epoch and pooled,
the difference in standard errors; steps with identical ids; critical-path forwards) and,
with `--out`, writes `grpo_compare.json` and `grpo_compare.png` there
(`bubblespec.train.compare`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from bubblespec.cli.signals import stop_on_sigterm
from bubblespec.cluster import ClusterError
from bubblespec.protocol.sampling import SeedMode
from bubblespec.tasks import TASKS


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
    p.add_argument("--lookahead", type=int, default=1,
                   help="training batches handed ahead with each rollout (1: the next one)")
    p.add_argument("--loss-agg", choices=["seq-mean", "token-mean"], default="seq-mean",
                   help="GRPO loss per response then over responses (seq-mean: each response "
                        "weighs the same, which favours shortening penalised answers) or "
                        "over every token of the batch (token-mean, as DAPO and verl's "
                        "token-mean)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--model", default=None, help="HF model dir [the task's model]")
    p.add_argument("--task", choices=TASKS, default="addchain",
                   help="addchain (tiny model) or wordproblems (`make real-model`; use a small "
                        "--lr such as 1e-5 on a pretrained model)")
    p.add_argument("--rank-arg", action="append", default=[], metavar="ARG")
    p.add_argument("--gateway", default=None, metavar="URL", help="use a running gateway "
                   "(its ranks must be able to read --out)")
    p.add_argument("--out", default=None,
                   help="log, plot and weights directory [out/grpo]; with --compare: where "
                        "the comparison is written (none: printed only)")
    p.add_argument("--compare", nargs=2, default=None, metavar="LOG",
                   help="run nothing: compare two saved grpo_log.json files")
    p.add_argument("--resume", action="store_true",
                   help="go on with the stopped run in --out (its log is written and its "
                        "trainer checkpointed after every step) with the same settings; "
                        "--steps may grow")
    p.add_argument("--log-dir", default=None, help="cluster logs")
    p.add_argument("--weight-push", choices=["disk", "group"], default="disk",
                   help="how each step's weights reach the ranks: a checkpoint reloaded "
                   "from disk, or a gloo process-group push")
    return p.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `bubblespec train-demo`."""
    from bubblespec.client import BubbleSpecError
    from bubblespec.train.demo import DemoConfig, resolve_model, train_demo

    ns = vars(parse_args(sys.argv[1:] if argv is None else argv))
    if (logs := ns.pop("compare")) is not None:
        return _compare(logs, ns["out"])
    cfg = DemoConfig(**{**ns, "out": ns["out"] or "out/grpo"})
    try:
        model_dir = resolve_model(cfg.model, cfg.task)
    except FileNotFoundError as e:
        print(f"train-demo: {e}; pass --model DIR", file=sys.stderr)
        return 1
    stop_on_sigterm()
    try:
        train_demo(cfg, model_dir)
        return 0
    except KeyboardInterrupt:
        print(f"train-demo: stopped; {_kept(cfg.out)}", file=sys.stderr, flush=True)
        return 130
    except ClusterError as e:
        print(f"train-demo: cluster failed: {e}", file=sys.stderr)
        return 1
    except (BubbleSpecError, ValueError) as e:
        print(f"train-demo: {e}", file=sys.stderr)
        return 1


def _kept(out: str) -> str:
    """What a stopped run left in `out` for `--resume`."""
    from bubblespec.train.compare import load_log

    log = Path(out) / "grpo_log.json"
    try:
        steps = len(load_log(log)["steps"])
    except (OSError, ValueError):  # none, or no step in it
        return f"no log in {out}: nothing to resume"
    return f"{log} holds {steps} step(s); the same command with --resume goes on"


def _compare(logs: Sequence[str], out: str | None) -> int:
    from bubblespec.train.compare import run_compare

    try:
        run_compare(logs, out)
        return 0
    except (OSError, ValueError) as e:
        print(f"train-demo --compare: {e}", file=sys.stderr)
        return 1
