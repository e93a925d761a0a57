"""`bubblespec real-policy` (`make real-policy`): the warm-started real policy, cached.

    bubblespec real-policy            # prints the directory (fine-tunes it on first use)
    bubblespec real-policy --force    # fine-tune again

A short supervised fine-tune of the real model (`make real-model`, built first if missing)
on the wordproblems task's reference solutions (`bubblespec.train.sft`). Progress goes to
stderr, the directory to stdout, so `$(bubblespec real-policy)` is usable as a `--model`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `bubblespec real-policy`."""
    from bubblespec.train.sft import SftConfig

    d = SftConfig()
    ap = argparse.ArgumentParser(prog="bubblespec real-policy",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=None,
                    help="cache root [$BUBBLESPEC_CACHE or ~/.cache/bubblespec]")
    ap.add_argument("--force", action="store_true", help="fine-tune again even if cached")
    ap.add_argument("--examples", type=int, default=d.examples,
                    help=f"distinct training problems, each seen once [{d.examples}]")
    ap.add_argument("--batch", type=int, default=d.batch, help=f"[{d.batch}]")
    ap.add_argument("--lr", type=float, default=d.lr, help=f"peak learning rate [{d.lr}]")
    ap.add_argument("--seed", type=int, default=d.seed, help=f"[{d.seed}]")
    ap.add_argument("--threads", type=int, default=d.threads, help="torch threads [default]")
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.examples < args.batch or args.batch < 1 or args.lr <= 0:
        print("real-policy: --batch >= 1, --examples >= --batch, --lr > 0", file=sys.stderr)
        return 2
    from bubblespec.models.smollm2 import build
    from bubblespec.train.sft import build_policy

    def log(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    build(args.cache, log=log)
    cfg = SftConfig(examples=args.examples, batch=args.batch, lr=args.lr, seed=args.seed,
                    threads=args.threads)
    print(build_policy(args.cache, cfg, force=args.force, log=log))
    return 0
