"""`bubblespec` console script: one subcommand per role.

Each service's subcommand lives in its role's module (`sync`, `gateway`, `rank`); every other
one in `bubblespec/cli/`, which only parses arguments and calls the library. Each exposes
`main(argv) -> int`; this dispatcher imports it lazily so that `bubblespec sync` never
imports vLLM.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "sync": ("bubblespec.synchronizer.server", "run the gRPC synchronizer daemon (+ draft store)"),
    "gateway": ("bubblespec.gateway.server", "run the HTTP gateway in front of the rank servers"),
    "rank": ("bubblespec.rank.server", "run a rank server (FastAPI + vLLM engine)"),
    "up": ("bubblespec.cli.up", "start a local cluster: synchronizer, N ranks and a gateway"),
    "ray": ("bubblespec.cli.ray", "run the cluster as Ray actors: ray up|status|down"),
    "health": ("bubblespec.cli.health", "probe a process: gRPC health or HTTP /health_generate"),
    "run": ("bubblespec.cli.run", "rollout steps with pre-generation on a local cluster"),
    "train-demo": ("bubblespec.cli.train_demo", "a real GRPO loop through a local cluster"),
    "bench": ("bubblespec.cli.bench", "benchmarks: service, engine, suffix, per-request, sync"),
    "replay": ("bubblespec.cli.replay", "re-run a recorded rollout step and compare digests"),
    "simulate": ("bubblespec.cli.simulate", "model rollout steps at scale (modelled figures)"),
    "predict": ("bubblespec.cli.predict", "will it help my run? speed-up from your trace (modelled)"),
    "train-tiny": ("bubblespec.cli.train_tiny", "train the embedded tiny model from scratch"),
    "real-model": ("bubblespec.cli.real_model", "build the real model's directory (SmolLM2-135M)"),
    "real-policy": ("bubblespec.cli.real_policy", "fine-tune the real model into a warm policy"),
    "proto": ("bubblespec.cli.proto", "regenerate (or --check) the checked-in gRPC code"),
}


def _usage() -> str:
    lines = ["usage: bubblespec <command> [options]", "", "commands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch `bubblespec <command> ...` to the command's module."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"bubblespec: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
