"""`bubblespec train-tiny`: train the embedded default model (a tiny Llama on addchain) on a CPU.

    bubblespec train-tiny --out bubblespec/assets/tiny-llama

Supervised training from scratch (seeded), a short evaluation at temperature 1.0, then a
Hugging Face model directory with `training_report.json`; the code is
`bubblespec.tasks.train_tiny`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    from bubblespec.tasks.addchain import Slips

    ap = argparse.ArgumentParser(prog="bubblespec train-tiny",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bubblespec/assets/tiny-llama"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=3_000_000, help="training tokens (padded)")
    ap.add_argument("--batch-tokens", type=int, default=1024,
                    help="padded tokens per optimizer step (small batches learn faster here)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--uniform-fraction", type=float, default=0.1)
    ap.add_argument("--slip-value", type=float, default=Slips.value)
    ap.add_argument("--slip-skip", type=float, default=Slips.skip)
    ap.add_argument("--slip-repeat", type=float, default=Slips.repeat)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1 is robust on a shared 2-core machine)")
    ap.add_argument("--eval-prompts", type=int, default=64)
    ap.add_argument("--eval-samples", type=int, default=4)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `bubblespec train-tiny`."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    from bubblespec.tasks.train_tiny import TinyTrainConfig, run

    run(TinyTrainConfig(**vars(args)))
    return 0
