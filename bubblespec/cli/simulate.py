"""`bubblespec simulate`: MODELLED projection of synchronous rollout steps at scale.

A discrete-event model (bubblespec/sim) of one rollout step after another over R ranks, with
per-rank continuous batching, a decode-step time model of a GPU engine, pre-generation in the
bubble (a continuous batch of lanes, stopped by the step stream), and acceptance figures per
mode. Every figure it prints or writes is modelled, not measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from bubblespec.core.engine_time import (
    COMPUTE_EFFICIENCY,
    ENGINE_OVERHEAD_S,
    GPUS,
    HBM_EFFICIENCY,
    PER_TOKEN_EXTRA_S,
    EngineTime,
)
from bubblespec.sim.model import SPEC_HOST_S, ControlPlane, SimConfig
from bubblespec.sim.policy import (
    default_modes,
    load_accept_json,
    merge_modes,
    parse_mode_flag,
    tail_fill_copies,
)
from bubblespec.sim.report import TAG
from bubblespec.sim.run import Scenario, project, report
from bubblespec.sim.workload import LengthSource

EPILOG = f"""\
All output is MODELLED. Engine time per forward = t_fixed + t_token*W + t_flop*max(0, W-ridge)
+ t_kv*C (W: forward tokens = running x (1 + drafted); C: context tokens read). Presets derive
them for --params-b billion bf16 parameters from NVIDIA datasheets ({', '.join(
    f'{k}: {bw / 1e12:g} TB/s, {fl / 1e12:g} TFLOP/s' for k, (bw, fl) in GPUS.items())}) at
{HBM_EFFICIENCY:.0%} of HBM bandwidth and {COMPUTE_EFFICIENCY:.0%} of FLOP/s, plus
{ENGINE_OVERHEAD_S * 1e3:g} ms engine overhead and {PER_TOKEN_EXTRA_S * 1e6:g} us per token
(assumptions; see bubblespec/core/engine_time.py). H100 defaults: t_fixed 7.99 ms, t_flop
32.5 us, ridge 184 tokens, t_kv 48.9 ns (Llama-3.1-8B: 16.06 GB weights, 128 KiB KV/token).

--accept-json takes what `bubblespec bench service` measured: {{"MODE": {{"accepted_per_forward": x,
"pregen_coverage": y, "drafted_per_forward": d}}, ...}} (accepted excludes the bonus token);
bubblespec* modes (not *siblings*) pre-generate; their covered-position acceptance is solved
from x at coverage y, the uncovered one taken from bubblespec_siblings or suffix (details in
bubblespec/sim/policy.py). Without it the modes are ASSUMED defaults: ngram 0.3/1.2, suffix
0.7/2.5, bubblespec 1.5/4.0 covered and 0.7/2.5 uncovered (accepted/drafted per forward).
"""


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The GPU and model of the engine-time preset (`EngineTime.preset`)."""
    a = p.add_argument
    a("--gpu", choices=sorted(GPUS), default="h100", help="engine-time preset (default h100)")
    a("--params-b", type=float, default=8.03,
      help="model parameters in billions, bf16 (default 8.03, Llama-3.1-8B)")
    a("--kv-bytes-per-token", type=float, default=131072.0,
      help="KV bytes per context token (default 131072: 2 x 32 layers x 8 KV heads x 128 x 2 B)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bubblespec simulate", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    a = p.add_argument
    a("--ranks", default="8,16,32,64,128,256,512,1024",
      help="comma-separated rank counts R (default 8..1024, powers of two)")
    a("--lengths", help="response lengths JSON: a list of ints, or {'lengths': [...], "
      "'by_prompt': [[...], ...]} (by_prompt keeps sibling correlation), e.g. dumped by "
      "`bubblespec bench service`. Default: SYNTHETIC log-normal (see --median-len)")
    a("--length-scale", type=float, default=1.0,
      help="multiply file lengths (map a small model's task onto longer responses; default 1)")
    a("--median-len", type=float, default=2000.0,
      help="synthetic default: median response tokens (default 2000, assumed long-CoT RL)")
    a("--tail-ratio", type=float, default=6.0,
      help="synthetic default: p99/median (default 6, the long tail of RL rollouts)")
    a("--sibling-corr", type=float, default=0.5,
      help="synthetic default: share of log-length variance shared by a prompt's samples "
      "(default 0.5, assumed)")
    a("--max-new-tokens", type=int, default=16384,
      help="synthetic default: length cap (default 16384, a common RL max response length)")
    a("--prompts-per-rank", type=int, default=8,
      help="prompts per rank per step, batch grows with R (default 8: x n=16 = 128 "
      "sequences per GPU, a typical GRPO load)")
    a("--prompts", type=int, help="fixed prompts per step for every R (strong scaling)")
    a("--n", type=int, default=16, help="samples per prompt (default 16, GRPO/DAPO group)")
    a("--max-num-seqs", type=int, default=256,
      help="concurrent sequences per rank (default 256, vLLM's max_num_seqs default)")
    a("--assign", choices=("round_robin", "lpt"), default="round_robin",
      help="prompt-to-rank assignment (default round_robin = the gateway's LPT on fresh "
      "prompts, which balances counts)")
    a("--lpt-noise", type=float, default=0.5,
      help="log-sd of the work estimate's error for --assign lpt and --pregen-order "
      "longest_first (default 0.5, assumed; 0 = oracle)")
    a("--prompt-len", type=int, default=256,
      help="prompt tokens (KV context and prefill; default 256, assumed math prompts)")
    a("--steps", type=int, default=4, help="rollout steps per mode (default 4)")
    a("--warmup-steps", type=int, default=1,
      help="leading steps left out of the summary (default 1: step 0 has no pre-generated "
      "drafts, as the bench reports steps after step 0)")
    a("--pregen-inflight", type=int, default=64,
      help="tasks a rank keeps decoding while pre-generating, refilled as lanes finish "
      "(default 64: bubblespec/rank/config.py pregen_inflight)")
    a("--train-s", type=float, default=0.0,
      help="trainer seconds between steps: the training window of *window modes, and what "
      "hides the pre-gen stop lag (default 0: every lag counts)")
    a("--lookahead", type=int, default=1,
      help="future steps whose prompts each step hands ahead (default 1: the next step's; "
      "more: a bubble that covered the next step goes on to the ones after, and older "
      "drafts are refreshed)")
    a("--tail-fill-budget", type=float, default=0.0, metavar="B",
      help="also run each pre-generating mode with tail-fill budget B (as NAME+tailB, side "
      "by side on the same draws): lanes beside a rank's own requests while the forward "
      "grows by at most B (bubblespec/sim/tail_fill.py; default 0: none)")
    a("--pregen-order", choices=("breadth_first", "longest_first", "predicted", "predicted_deep"),
      default="breadth_first",
      help="pre-gen queue order (default breadth_first, the synchronizer's; longest_first "
      "is beyond the design; predicted(_deep): per-prompt predictions, bubblespec/sim/pregen_order.py)")
    a("--pregen-accept", default="mode",
      help="ACC/DRAFTED per forward while pre-generating (default 'mode': each mode's "
      "uncovered figures, as the rank's proposer drafts for pre-gen lanes; 0/0: plain "
      "decoding)")
    a("--control-plane-json", metavar="PATH",
      help="charge one synchronizer daemon's cost (the fetch burst at each step's start, the "
      "stop's latency), from `bubblespec bench control-plane --out` figures; default: free")
    a("--spec-host-ms", type=float, default=SPEC_HOST_S * 1e3,
      help="host ms a speculative mode adds to each forward, in series (drafting, the keyed "
      f"host path; default {SPEC_HOST_S * 1e3:g}: measured in the paced runs that charge "
      "every cost)")
    a("--spec-async", action="store_true",
      help="what-if (MODELLED): speculative modes async-scheduled too, their host work "
      "overlapped with the forward (drafting without a host sync; not what the product "
      "does today)")
    a("--no-async-baseline", action="store_true",
      help="charge the baseline's engine host overhead in series (default: hidden under the "
      "forward, vLLM's async scheduling without speculation)")
    a("--rpc-ms", type=float, default=0.5,
      help="synchronizer RPC latency in ms (default 0.5, assumed in-cluster gRPC; measure "
      "with bubblespec bench sync)")
    a("--accept-json",
      help="acceptance figures per mode from `bubblespec bench service` (see below)")
    a("--mode", action="append", default=[], metavar="SPEC",
      help="add or replace a mode: NAME=ACC/DRAFTED or "
      "NAME=pregen:ACC_COV/DRAFTED_COV,ACC_UNC/DRAFTED_UNC (repeatable)")
    a("--only-modes", help="comma-separated mode names to keep (the baseline is always kept)")
    a("--accept-cv", type=float, default=0.0,
      help="coefficient of variation of per-request acceptance (gamma; default 0 = means)")
    a("--cover-cv", type=float, default=0.0,
      help="coefficient of variation of per-request acceptance at covered positions only "
      "(gamma; default 0; with --calibrate: the replay's sensitivity to it, over --draws)")
    a("--draws", type=int, default=20,
      help="with --calibrate and --cover-cv: replays drawn (default 20)")
    add_model_args(p)
    a("--t-fixed-ms", type=float, help="override t_fixed (ms per forward)")
    a("--t-token-us", type=float, help="override t_token (us per forward token)")
    a("--t-flop-us", type=float, help="override t_flop (us per token above the ridge)")
    a("--ridge-tokens", type=float, help="override the roofline ridge (tokens per forward)")
    a("--t-kv-ns", type=float, help="override t_kv (ns per context token read)")
    a("--seed", type=int, default=0, help="random seed; same seed, same output (default 0)")
    a("--calibrate", metavar="PACED_JSON",
      help="paced.json of `bubblespec bench paced`: replay that run (its ranks, lengths, "
      "assignment and measured acceptance) and print measured beside modelled per mode "
      "and step, last line sim_vs_paced_gap; the projection at --ranks then uses its "
      "calibrated inputs (--ranks, --steps, --seed, --cover-cv apply; workload, "
      "acceptance and engine flags are the run's)")
    a("--flips", metavar="FLIPS_JSON",
      help="with --calibrate: the rows of `bubblespec bench flips --out` for the same "
      "schedule (task, prompts, n, seed, lr): measured flip positions, when the paced "
      "records predate their own (request_first_divergence)")
    a("--branches", type=int, default=0, metavar="B",
      help="with --flips: the what-if of margin branching, B branches per draft at its "
      "lowest-margin positions (flips a branch covers move to where the response left the "
      "branch, as bench flips measured; branch pre-generation assumed to fit the bubble)")
    a("--out", help="directory for simulate.json and simulate.png (modelled; with "
      "--calibrate also calibrate.json)")
    return p


def _f(x: float | None, scale: float) -> float | None:
    return None if x is None else x * scale


def _ranks(args: argparse.Namespace) -> list[int]:
    ranks = [int(x) for x in args.ranks.split(",") if x.strip()]
    if not ranks or min(ranks) < 1:
        raise ValueError("--ranks needs positive integers")
    return ranks


def calibrated(args: argparse.Namespace, out: Path | None) -> None:
    """`--calibrate`: the projection from the paced run's inputs, then the comparison."""
    from bubblespec.calibration import report as calreport
    from bubblespec.calibration.flips import load_flips

    run, first, window = calreport.load(args.calibrate)
    flips = load_flips(args.flips) if args.flips else None
    lines, doc = calreport.compare(run, first, args.cover_cv, args.draws, flips,
                                   f"bench flips: {args.flips}" if args.flips else "")
    if args.flips and args.branches > 0:
        lines[-1:-1] = calreport.whatif_lines(run, load_flips(args.flips, args.branches),
                                              flips, args.branches)
    measured = {n: (run.ranks, m["measured_speedup"]) for n, m in doc["modes"].items()}
    s = calreport.scenario(run, first, window, _ranks(args), args.steps, args.seed,
                           args.cover_cv, flips, max(1, args.lookahead))
    s.modes = tail_fill_copies(s.modes, args.tail_fill_budget)
    if args.spec_async:  # a what-if of the projection; the replay stays as paced
        s.cfg = replace(s.cfg, spec_async=True)
        s.notes.append("what-if --spec-async: speculative modes async-scheduled (MODELLED)")
    report(project(s), out, measured)
    if out is not None:
        (out / "calibrate.json").write_text(json.dumps(doc, indent=1))
    print("\n".join(lines))


def scenario(args: argparse.Namespace) -> Scenario:
    """The scenario the flags describe (ValueError, OSError or KeyError on bad input)."""
    ranks = _ranks(args)
    pa = pd = None
    if args.pregen_accept != "mode":
        pa, pd = (float(x) for x in args.pregen_accept.split("/"))
    et = EngineTime.preset(args.gpu, args.params_b, 2.0, args.kv_bytes_per_token)
    et = et.with_overrides(t_fixed=_f(args.t_fixed_ms, 1e-3), t_token=_f(args.t_token_us, 1e-6),
                           t_flop=_f(args.t_flop_us, 1e-6), ridge=args.ridge_tokens,
                           t_kv=_f(args.t_kv_ns, 1e-9))
    if args.lengths:
        lengths = LengthSource.from_json(args.lengths, args.length_scale)
    else:
        lengths = LengthSource.default(args.median_len, args.tail_ratio, args.sibling_corr,
                                       args.max_new_tokens)
    notes: list[str] = []
    modes = default_modes()
    if args.accept_json:
        modes, notes = load_accept_json(args.accept_json)
    modes = merge_modes(modes, [parse_mode_flag(m) for m in args.mode])
    if args.only_modes:
        keep = {x.strip() for x in args.only_modes.split(",")}
        modes = [m for m in modes if m.is_baseline or m.name in keep]
    modes = tail_fill_copies(modes, args.tail_fill_budget)
    cfg = SimConfig(prompts_per_rank=args.prompts_per_rank, prompts=args.prompts, n=args.n,
                    max_num_seqs=args.max_num_seqs, assign=args.assign,
                    lpt_noise=args.lpt_noise, prompt_len=args.prompt_len,
                    steps=args.steps, warmup_steps=args.warmup_steps,
                    pregen_inflight=args.pregen_inflight, train_s=args.train_s,
                    pregen_accepted=pa, pregen_drafted=pd, pregen_order=args.pregen_order,
                    rpc_s=args.rpc_ms * 1e-3, accept_cv=args.accept_cv,
                    cover_cv=args.cover_cv, lookahead=max(1, args.lookahead), seed=args.seed,
                    spec_host_s=args.spec_host_ms * 1e-3,
                    async_baseline=not args.no_async_baseline, spec_async=args.spec_async,
                    control_plane=(ControlPlane.from_bench(
                        json.loads(Path(args.control_plane_json).read_text()))
                        if args.control_plane_json else None))
    acceptance = "from " + Path(args.accept_json).name if args.accept_json else "assumed"
    return Scenario(cfg, ranks, modes, et, lengths, notes, acceptance)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `bubblespec simulate`."""
    args = build_parser().parse_args(argv)
    t0 = time.monotonic()
    if args.calibrate:
        try:
            calibrated(args, Path(args.out) if args.out else None)
        except (ValueError, OSError, KeyError) as e:
            print(f"{TAG} bubblespec simulate: error: {e}", file=sys.stderr)
            return 2
        return 0
    try:
        projection = project(scenario(args))
    except (ValueError, OSError, KeyError) as e:
        print(f"{TAG} bubblespec simulate: error: {e}", file=sys.stderr)
        return 2
    report(projection, Path(args.out) if args.out else None)
    s = projection.scenario
    print(f"{TAG} simulated {len(s.ranks)} rank counts x {len(s.modes)} modes in "
          f"{time.monotonic() - t0:.1f} s (wall time of the simulator, not of a rollout)")
    return 0
