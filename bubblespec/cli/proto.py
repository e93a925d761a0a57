"""`bubblespec proto` (`make proto`, `make proto-check`): regenerate or check the gRPC code.

    bubblespec proto [--out DIR]    # write *_pb2.py, *_pb2.pyi, *_pb2_grpc.py from proto/
    bubblespec proto --check        # exit 1 when the checked-in files are stale

The generator is `bubblespec.rpc.gen` (needs grpcio-tools, a dev dependency).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    from bubblespec.rpc.gen import REPO_ROOT

    p = argparse.ArgumentParser(prog="bubblespec proto", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO_ROOT, help="output root (default: repo)")
    p.add_argument("--check", action="store_true", help="only check the checked-in files")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `bubblespec proto`: generate into the repository (default) or
    `--out`, or `--check` freshness."""
    from bubblespec.rpc.gen import generate, stale_files

    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.check:
        problems = stale_files()
        for p in problems:
            print(f"stale: {p}", file=sys.stderr)
        if problems:
            print("run `make proto` (bubblespec proto)", file=sys.stderr)
        return 1 if problems else 0
    for path in generate(args.out):
        print(path)
    return 0
