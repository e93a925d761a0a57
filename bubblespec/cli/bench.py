"""`bubblespec bench <name>`: the benchmarks, one subcommand each (code in bubblespec/bench/).

    bubblespec bench service [--modes nospec,ngram,...]  # make bench: GRPO through the service
    bubblespec bench paced [--ranks 8 --pace h100]  # make bench-paced: the same, paced ranks
    bubblespec bench engine                  # make bench-engine: one engine per speculation mode
    bubblespec bench suffix [--quick]        # make bench-suffix: draft index vs arctic-inference
    bubblespec bench draft-batch [--quick]   # make bench-draft-batch: per-step drafting cost
    bubblespec bench keyed-cost              # make bench-keyed-cost: keyed vs vLLM's sampler
    bubblespec bench per-request             # which response sets each step's critical path
    bubblespec bench flips [--lr 1e-4]       # where an update flips keyed responses; branches
    bubblespec bench sync [--n 2000]         # the synchronizer's own RPC cost
    bubblespec bench soak [--steps 200]      # make soak (1,000 steps): memory and budgets stay flat
    bubblespec bench workload-stats A.json B.json  # entropy, siblings, lengths side by side
    bubblespec bench policy [--model DIR]    # lengths, endings, reward of the real policy
    bubblespec bench weight-push [--model DIR]  # gloo, shared-memory tensors and disk pushes
    bubblespec bench control-plane [--ranks 64]  # one synchronizer under many ranks

Each benchmark's module is imported only when it runs (the engine bench imports vLLM).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence

from bubblespec.bench.modes import MODES
from bubblespec.tasks import TASKS


def _policy(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("policy", help="lengths, endings and reward of a wordproblems policy",
                       description="Sample a model on fresh wordproblems at T=1 (no "
                       "speculation): the share of responses that end inside the budget, "
                       "lengths per number of operations, the B0 reward and the share of "
                       "groups carrying a GRPO signal.")
    p.add_argument("--model", default=None,
                   help="HF model dir [the warm-started policy of `make real-policy`]")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--out", default="", help="write the figures and samples as JSON")


def _policy_model(args: argparse.Namespace) -> str | None:
    """`--model`, else the warm-started policy's directory; None (said why) when unbuilt."""
    from bubblespec.train.sft import policy_dir

    try:
        return args.model or str(policy_dir())
    except FileNotFoundError as e:
        print(f"bench {args.bench}: {e}", file=sys.stderr)
        return None


def _run_policy(args: argparse.Namespace) -> int:
    from bubblespec.bench.policy import PolicyBenchConfig, run

    if (model := _policy_model(args)) is None:
        return 2
    if args.prompts < 1 or args.n < 1 or not 0 < args.temperature:
        print("bench policy: --prompts and --n >= 1, --temperature > 0", file=sys.stderr)
        return 2
    asyncio.run(run(PolicyBenchConfig(model=model, prompts=args.prompts, n=args.n,
                                      seed=args.seed, temperature=args.temperature,
                                      out=args.out)))
    return 0


def _loss_agg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--loss-agg", choices=["seq-mean", "token-mean"], default="seq-mean",
                   help="the trainer's GRPO loss aggregation (token-mean for the real policy: "
                        "seq-mean favours shortening penalised answers)")


def _service(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("service", help="the same GRPO schedule under each rollout mode",
                       description="The same GRPO schedule through the service under each "
                       "rollout mode, each on its own fresh local cluster (about 13 min here); "
                       "writes bench.json, lengths.json and plots to --out.")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epoch-steps", type=int, default=3,
                   help="prompt batches repeat every K steps (epochs; history drafts need "
                        "repeats; 0: fresh prompts each step)")
    p.add_argument("--lr", type=float, default=1e-4,
                   help="AdamW learning rate (1e-3 made the reward collapse in a 20-step run)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--greedy-prompts", type=int, default=4)
    p.add_argument("--modes", default=",".join(m.name for m in MODES))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--extra-rank-args", default="",
                   help="appended to every mode's rank arguments, for ablations "
                        "(e.g. '--sources=pregen,siblings,self')")
    p.add_argument("--model", default=None, help="HF model dir [the task's model]")
    p.add_argument("--task", choices=TASKS, default="addchain",
                   help="addchain (tiny model) or wordproblems (`make real-model`)")
    p.add_argument("--out", default="out/bench")
    p.add_argument("--timeline-step", type=int, default=1,
                   help="schedule step drawn in timeline.png")
    _loss_agg(p)


def _paced(sub: argparse._SubParsersAction) -> None:
    from bubblespec.bench.paced import HEADLINE_MODES

    p = sub.add_parser("paced", help="the GRPO schedule on paced ranks (modelled GPU time)",
                       description="The bench service schedule on N ranks whose every engine "
                       "forward lasts the simulator's GPU engine-time model x --pace-scale; "
                       "prints rollout throughput per mode in modelled GPU seconds, "
                       "overruns and peak memory (make bench-paced: about 45 min here).")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--pace", choices=["h100", "h200"], default="h100")
    p.add_argument("--pace-scale", type=float, default=30.0,
                   help="wall seconds per modelled GPU second (large enough for < 1%% "
                        "overruns)")
    p.add_argument("--mode-scale", dest="mode_scales", default="", metavar="MODE=SCALE,...",
                   help="a pace scale of their own for the modes named (e.g. a mode that "
                        "verifies many draft tokens a forward and overran at --pace-scale); "
                        "the others run at --pace-scale")
    p.add_argument("--kv-cache-mib", type=int, default=256,
                   help="KV cache per rank, MiB (4 KiB per token on the embedded model)")
    p.add_argument("--train-window-s", type=float, default=2.0,
                   help="modelled seconds each training window lasts at least, for modes "
                        "that pre-generate through it")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--seeds", default="0",
                   help="comma-separated; plain-sampling modes run once per seed")
    p.add_argument("--epoch-steps", type=int, default=0,
                   help="prompt batches repeat every K steps (0: fresh prompts every step)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--greedy-prompts", type=int, default=1)
    p.add_argument("--modes", default=HEADLINE_MODES,
                   help="comma-separated (bubblespec.bench.paced.ALL_FRESH_MODES adds suffix, "
                        "ngram and ngram-keyed)")
    p.add_argument("--extra-rank-args", default="")
    p.add_argument("--model", default=None, help="HF model dir [the task's model]")
    p.add_argument("--task", choices=TASKS, default="addchain",
                   help="addchain (tiny model) or wordproblems (`make real-model`)")
    p.add_argument("--out", default="out/bench-paced")
    p.add_argument("--timeline-step", type=int, default=1)
    _loss_agg(p)
    p.add_argument("--resume", action="store_true",
                   help="keep the modes that --out's paced.json already measured (same "
                        "configuration apart from --modes) and run the rest")
    p.add_argument("--report", default="", metavar="PATH",
                   help="run nothing: print the figures of a saved paced.json (e.g. of a cut "
                        "run) with its own configuration, writing files to --out")


def _engine(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engine", help="decode steps of one batch under each speculation mode",
                       description="vLLM engines on the embedded model under each speculation "
                       "mode: a batch rolled out with new weights, drafts pre-generated by the "
                       "old ones (the suffix row needs `make bench-deps`).")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--model", default="", help="model dir (default: the task's model)")
    p.add_argument("--task", choices=TASKS, default="addchain",
                   help="addchain (tiny model) or wordproblems (`make real-model`)")
    p.add_argument("--out", default="", metavar="PATH",
                   help="also write the rows and every sampled response (token ids, "
                        "log-probs) to this JSON, the input of `bench workload-stats`")


def _suffix(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("suffix", help="bubblespec suffix index vs arctic-inference",
                       description="bubblespec suffix index vs arctic-inference (one core, "
                       "seeded RL-like workload; arctic rows need `make bench-deps`).")
    p.add_argument("--groups", type=int, default=64, help="prompt groups (default 64)")
    p.add_argument("--quick", action="store_true", help="8 groups (smoke run)")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument("--no-arctic", action="store_true", help="skip arctic even if installed")
    p.add_argument("--no-live", action="store_true", help="skip the live-append rows")


def _draft_batch(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("draft-batch", help="per-engine-step drafting cost at batch sizes",
                       description="Per-engine-step drafting cost for 64/256/1024 running "
                       "requests: native vs pure Python vs arctic's C++ tree vs vLLM's n-gram "
                       "proposer (run it under `taskset -c 1`; arctic needs `make bench-deps`).")
    p.add_argument("--sizes", default="64,256,1024", help="batch sizes (multiples of 8)")
    p.add_argument("--steps", type=int, default=40, help="engine steps per size")
    p.add_argument("--suffix-groups", type=int, default=64,
                   help="groups of the suffix-bench rows (0: skip them)")
    p.add_argument("--quick", action="store_true", help="sizes 64,256, 10 steps, 8 groups")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-arctic", action="store_true")
    p.add_argument("--no-ngram", action="store_true")


def _keyed_cost(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keyed-cost", help="keyed sampling vs vLLM's sampler per engine step",
                       description="Whole-engine cost of keyed sampling against vLLM's sampler "
                       "(seeded and unseeded) at --sizes concurrent requests, speculation off "
                       "and on, interleaved repeats; ms per engine step, tokens/s, and the "
                       "extra as a share of the MODELLED H100 8B decode step. Run it alone "
                       "on the machine (wall clock).")
    p.add_argument("--sizes", default="64,256", help="concurrent requests (multiples of --n)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=128,
                   help="tokens every sample generates (ignore_eos)")
    p.add_argument("--repeats", type=int, default=5, help="runs per (size, arm), after a warm-up")
    p.add_argument("--spec-modes", default="none,bubblespec",
                   help="comma-separated engine speculation modes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="", help="HF model dir [the embedded model]")
    p.add_argument("--out", default="out/keyed-cost.json", help="JSON of every run and the "
                   "summary ('': none)")


def _per_request(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("per-request", help="per-request view of the keyed GRPO schedule",
                       description="Per-request view of the keyed GRPO schedule: which "
                       "response sets each step's critical path, and how far it followed its "
                       "pre-generated draft.")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--window", choices=["bubble", "training"], default="training")
    p.add_argument("--top", type=int, default=4, help="requests shown per step")
    p.add_argument("--out", default="", help="also write every request's figures (JSON)")
    p.add_argument("--seed-mode", choices=["keyed", "keyed_context"], default="keyed",
                   help="position keys (keyed) or context keys (keyed_context)")


def _flips(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("flips", help="where a policy update flips keyed responses, and what "
                       "runner-up branches would predict",
                       description="The GRPO schedule without a service (HF forward, keyed "
                       "reference sampler, real updates): per response of each step after "
                       "the first, where it left the draft pre-generated by the previous "
                       "weights, the margin rank of that position, whether the runner-up was "
                       "the flip, and the tail share a branch budget would predict.")
    p.add_argument("--steps", type=int, default=2, help="updates (steps compared: --steps)")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=None, help="[the task's]")
    p.add_argument("--model", default=None, help="HF model dir [the task's model]")
    p.add_argument("--task", choices=TASKS, default="addchain")
    p.add_argument("--out", default="", help="also write every response's row (JSON)")
    p.add_argument("--seed-mode", choices=["keyed", "keyed_context"], default="keyed",
                   help="position keys (keyed; branches measured) or context keys "
                   "(keyed_context; re-alignment by context measured, no branches)")


def _sync(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sync", help="the synchronizer's RPC round trips on loopback",
                       description="Cost of the synchronizer itself: RPC round trips on "
                       "loopback as a rank sees them, and in-daemon handler time (JSON).")
    p.add_argument("--n", type=int, default=2000, help="calls per RPC (default 2000)")


def _soak(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("soak", help="a long run: RSS, draft store and index stay flat",
                       description="A local 2-rank cluster doing rollout steps with "
                       "pre-generation and a weight push every step; records the RSS of every "
                       "process, the draft store and index against their budgets and the step "
                       "latency; ends with the RSS slopes after the warm-up (about 15 min for "
                       "200 steps here).")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--n", type=int, default=4, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="default: the embedded task's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=20, help="steps left out of the slopes")
    p.add_argument("--every", type=int, default=10, help="print the table every N steps")
    p.add_argument("--model", default=None, help="HF model dir [the task's model]")
    p.add_argument("--task", choices=TASKS, default="addchain",
                   help="addchain (tiny model) or wordproblems (`make real-model`)")
    p.add_argument("--out", default="out/soak", help="soak.json, logs (and the plot)")
    p.add_argument("--plot", default=None, help="plot path [<out>/soak.png]")


def _workload_stats(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("workload-stats", help="entropy, sibling similarity, lengths, "
                       "acceptance per source, side by side",
                       description="Per workload (a JSON of `bench engine --out`): entropy per "
                       "token, response lengths, sibling similarity, replayed sibling drafts, "
                       "acceptance per draft source and every mode's step cut, side by side.")
    p.add_argument("paths", nargs="+", metavar="ENGINE_JSON")
    p.add_argument("--out", default="", help="also write the figures (JSON)")


def _control_plane(sub: argparse._SubParsersAction) -> None:
    from bubblespec.bench.control_plane import ControlPlaneConfig

    d = ControlPlaneConfig()
    p = sub.add_parser("control-plane", help="one synchronizer daemon under many ranks' calls",
                       description="Simulated ranks (asyncio gRPC clients in worker "
                       "processes, no engines) replay a rank's calls against one daemon: "
                       "fetch burst, decode, report, claims, draft pushes, stop polls, "
                       "heartbeats (bubblespec/bench/control_plane.py).")
    for name in ("ranks", "procs", "steps", "prompts_per_rank", "samples", "draft_tokens",
                 "lanes", "chunk", "seed"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name))
    for name in ("step_s", "chunk_ms", "poll_ms", "lane_tokens_per_s", "heartbeat_s"):
        p.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(d, name))
    p.add_argument("--stop-by", choices=("poll", "stream"), default=d.stop_by,
                   help="how a rank in its bubble learns of the stop")
    p.add_argument("--restart-at-step", type=int, default=d.restart_at_step,
                   help="the restart drill: SIGKILL the daemon in this step's bubble and "
                   "start it again on the same port and journal (-1: never)")
    p.add_argument("--no-journal", dest="journal", action="store_false",
                   help="run the daemon without a journal (a restart then starts empty)")
    p.add_argument("--drafts-from", choices=("synchronizer", "peers"), default=d.drafts_from,
                   help="where the fetch burst reads draft bytes: the daemon, or the ranks "
                   "that pushed them (each worker process serves its ranks' drafts, the "
                   "daemon says where: a rank's --drafts-port)")
    p.add_argument("--out", default="", help="JSON of the figures")


def _weight_push(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("weight-push", help="a gloo process-group weight push vs a disk reload",
                       description="Push the same weights to the ranks of a LocalCluster "
                       "over a gloo process group and through a checkpoint on disk, "
                       "alternating, and print both side by side (plus a modelled 8B row).")
    p.add_argument("--model", default=None,
                   help="HF model dir [the warm-started policy of `make real-policy`]")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bucket-mib", type=int, default=512)
    p.add_argument("--out", default="", help="also write the figures (JSON)")


def _run_weight_push(args: argparse.Namespace) -> int:
    from bubblespec.bench.weight_push import WeightPushConfig, run

    if (model := _policy_model(args)) is None:
        return 2
    if args.ranks < 1 or args.repeats < 1 or args.bucket_mib < 1:
        print("bench weight-push: --ranks, --repeats and --bucket-mib >= 1", file=sys.stderr)
        return 2
    run(WeightPushConfig(model=model, ranks=args.ranks, repeats=args.repeats,
                         bucket_mib=args.bucket_mib, out=args.out))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bubblespec bench", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for add in (_service, _paced, _engine, _suffix, _draft_batch, _keyed_cost, _per_request,
                _flips, _sync, _soak, _workload_stats, _policy, _weight_push,
                _control_plane):
        add(sub)
    return p


def _run_service(args: argparse.Namespace) -> int:
    from bubblespec.bench.modes import mode_by_name
    from bubblespec.bench.service import ServiceBenchConfig, run_bench
    from bubblespec.train.demo import resolve_model

    cfg = ServiceBenchConfig(**{k: v for k, v in vars(args).items() if k != "bench"})
    try:
        model_dir = resolve_model(cfg.model, cfg.task)
        modes = mode_by_name([m for m in cfg.modes.split(",") if m])
    except (FileNotFoundError, ValueError) as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    run_bench(cfg, model_dir, modes)
    return 0


def _run_paced(args: argparse.Namespace) -> int:
    from bubblespec.bench.modes import mode_by_name
    from bubblespec.bench.paced import PacedBenchConfig, run_paced
    from bubblespec.train.demo import resolve_model

    if args.report:
        from bubblespec.bench.paced import report
        from bubblespec.bench.paced_record import PacedDoc

        doc = PacedDoc.read(args.report)
        report(doc, PacedBenchConfig(**{**doc.config, "out": args.out}), 0.0)
        return 0
    cfg = PacedBenchConfig(**{k: v for k, v in vars(args).items()
                              if k not in ("bench", "report")})
    try:
        model_dir = resolve_model(cfg.model, cfg.task)
        names = [m.name for m in mode_by_name([m for m in cfg.modes.split(",") if m])]
        scales = cfg.scales()
        try:  # a misspelt mode is refused; a known one outside --modes is a default unused
            mode_by_name(scales)
        except ValueError as e:
            raise ValueError(f"--mode-scale: {e}") from e
        if idle := [m for m in scales if m not in names]:
            print(f"bench paced: --mode-scale for {', '.join(idle)}: not in --modes",
                  file=sys.stderr)
        if not cfg.seed_list() or cfg.steps < 2 or cfg.ranks < 1 or cfg.pace_scale <= 0:
            raise ValueError("--seeds needs a seed, --steps >= 2, --ranks >= 1, "
                             "--pace-scale > 0")
    except (FileNotFoundError, ValueError) as e:
        print(f"bench paced: {e}", file=sys.stderr)
        return 2
    run_paced(cfg, model_dir)
    return 0


def _run_flips(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bubblespec.bench.flips import EmptyUpdate, format_report, run_flips
    from bubblespec.tasks import make_task
    from bubblespec.train.demo import resolve_model

    if args.steps < 1 or args.prompts < 1 or args.n < 1 or args.temperature <= 0:
        print("bench flips: --steps, --prompts, --n >= 1 and --temperature > 0",
              file=sys.stderr)
        return 2
    try:
        model_dir = resolve_model(args.model, args.task)
        task = make_task(args.task, model_dir if args.task == "wordproblems" else None)
    except (FileNotFoundError, ValueError) as e:
        print(f"bench flips: {e}", file=sys.stderr)
        return 2
    try:
        doc = run_flips(task, str(model_dir), args.steps, args.prompts, args.n, args.lr,
                        args.seed, args.temperature, args.max_new_tokens,
                        by_context=args.seed_mode == "keyed_context")
    except EmptyUpdate as e:
        print(f"bench flips: {e}", file=sys.stderr)
        return 2
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))
    print("\n".join(format_report(doc)))
    return 0


def _run_keyed_cost(args: argparse.Namespace) -> int:
    from bubblespec.bench.keyed_cost import KeyedCostConfig
    from bubblespec.bench.keyed_cost import run as run_keyed

    try:
        sizes = tuple(int(x) for x in args.sizes.split(",") if x)
    except ValueError:
        sizes = ()
    specs = tuple(m for m in args.spec_modes.split(",") if m)
    if (not sizes or args.n < 1 or any(s < args.n or s % args.n for s in sizes)
            or args.max_new_tokens < 2 or args.repeats < 1
            or not set(specs) <= {"none", "ngram", "suffix", "bubblespec"} or not specs):
        print("bench keyed-cost: --sizes multiples of --n, --max-new-tokens >= 2, "
              "--repeats >= 1, --spec-modes of none,ngram,suffix,bubblespec", file=sys.stderr)
        return 2
    asyncio.run(run_keyed(KeyedCostConfig(sizes, args.n, args.max_new_tokens, args.repeats,
                                          specs, args.seed, args.model, args.out)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `bubblespec bench`."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.bench == "service":
        return _run_service(args)
    if args.bench == "paced":
        return _run_paced(args)
    if args.bench == "engine":
        from bubblespec.bench.engine import EngineBenchConfig, run
        from bubblespec.train.demo import resolve_model

        try:
            model = resolve_model(args.model, args.task)
        except FileNotFoundError as e:
            print(f"bench: {e}", file=sys.stderr)
            return 2
        asyncio.run(run(EngineBenchConfig(args.prompts, args.n, args.seed, args.lr,
                                          model, args.task, args.out)))
    elif args.bench == "suffix":
        from bubblespec.bench.suffix import run_bench as run_suffix

        groups = 8 if args.quick else args.groups
        if groups < 1:
            print("--groups must be >= 1", file=sys.stderr)
            return 1
        run_suffix(groups, args.seed, arctic=not args.no_arctic, live=not args.no_live)
    elif args.bench == "draft-batch":
        from bubblespec.bench.draft_batch import run_bench as run_batch

        try:
            sizes = tuple(int(x) for x in args.sizes.split(",") if x)
        except ValueError:
            sizes = ()
        if args.quick:
            sizes, args.steps, args.suffix_groups = (64, 256), 10, 8
        if not sizes or any(s < 8 or s % 8 for s in sizes) or args.steps < 4:
            print("bench draft-batch: --sizes multiples of 8, --steps >= 4", file=sys.stderr)
            return 2
        run_batch(sizes, args.steps, args.seed, max(args.suffix_groups, 0),
                  arctic=not args.no_arctic, ngram=not args.no_ngram)
    elif args.bench == "keyed-cost":
        return _run_keyed_cost(args)
    elif args.bench == "soak":
        from bubblespec.bench.soak import SoakConfig, run_soak

        if args.steps < 2 or args.prompts < 1 or args.n < 1 or args.every < 1:
            print("bench soak: --steps >= 2, --prompts, --n and --every >= 1", file=sys.stderr)
            return 2
        cfg = SoakConfig(**{k: v for k, v in vars(args).items() if k != "bench"})
        try:
            return 0 if run_soak(cfg)["flat"] else 1
        except FileNotFoundError as e:
            print(f"bench soak: {e}", file=sys.stderr)
            return 2
    elif args.bench == "workload-stats":
        from bubblespec.bench.workload_stats import run as run_stats

        try:
            run_stats(args.paths, args.out)
        except (OSError, ValueError, KeyError) as e:
            print(f"bench workload-stats: {e}", file=sys.stderr)
            return 2
    elif args.bench == "per-request":
        from bubblespec.bench.per_request import run_per_request

        run_per_request(args.steps, args.window, args.top, args.out, args.seed_mode)
    elif args.bench == "flips":
        return _run_flips(args)
    elif args.bench == "policy":
        return _run_policy(args)
    elif args.bench == "weight-push":
        return _run_weight_push(args)
    elif args.bench == "control-plane":
        from bubblespec.bench.control_plane import ControlPlaneConfig
        from bubblespec.bench.control_plane import run as run_cp

        fields = ControlPlaneConfig.__dataclass_fields__
        run_cp(ControlPlaneConfig(**{k: getattr(args, k) for k in fields}))
    else:
        from bubblespec.bench import sync_latency

        print(json.dumps(sync_latency.run(args.n), indent=2))
    return 0
