"""`bubblespec run` (`make run`): a local cluster, rollout steps with pre-generation, a table.

    bubblespec run [--steps 4] [--prompts 8] [--n 4] [--ranks 2]
                   [--rank-arg=--spec-mode=none] [--gateway-url URL]

The driver and its table are `bubblespec.bench.run`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from bubblespec.cluster import ClusterError
from bubblespec.tasks import TASKS


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bubblespec run",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--n", type=int, default=4, help="samples per prompt")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=0, help="0: the task's budget")
    p.add_argument("--seed", type=int, default=0, help="prompt seed of the first step")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--model", default=None, help="HF model dir [the task's model]")
    p.add_argument("--task", choices=TASKS, default="addchain",
                   help="addchain (tiny model) or wordproblems (`make real-model`)")
    p.add_argument("--rank-arg", action="append", default=[], metavar="ARG")
    p.add_argument("--log-dir", default=None)
    p.add_argument("--gateway-url", default=None, help="use a running gateway")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the records")
    return p.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `bubblespec run`."""
    from bubblespec.bench.run import RunConfig, run_demo
    from bubblespec.client import BubbleSpecError

    args = RunConfig(**vars(parse_args(sys.argv[1:] if argv is None else argv)))
    try:
        run_demo(args)
        return 0
    except ClusterError as e:
        print(f"run: cluster failed: {e}", file=sys.stderr)
        return 1
    except (BubbleSpecError, FileNotFoundError) as e:
        print(f"run: {e}", file=sys.stderr)
        return 1
