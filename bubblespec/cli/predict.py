"""`bubblespec predict TRACE --ranks R`: the expected rollout speed-up of each mode for your
own run, from its per-step response lengths (or their statistics), by the simulator
calibrated on a paced benchmark run. MODELLED, with an interval per mode.

`bubblespec predict --export PACED_JSON:MODE TRACE` writes one mode's lengths of a paced
run as a trace (the bench's own trace, to check the prediction against its measurement).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bubblespec.calibration.predict import (
    DEFAULT_CALIBRATION,
    INTERVAL,
    TraceError,
    calibrate,
    lines,
    paced_trace,
    predict,
    read_trace,
    write,
)
from bubblespec.cli.simulate import add_model_args
from bubblespec.core.engine_time import EngineTime
from bubblespec.sim.policy import load_accept_json

PROG = "bubblespec predict"

EPILOG = f"""\
Trace formats (docs/predict.md): JSONL, one line per rollout step, either
  {{"step": 3, "lengths": [812, 95, ...], "prompt_ids": ["p17", "p17", ...]}}
  ("lengths" may instead be one list per prompt; without prompt ids give --n), or the
per-step statistics verl logs (response_length/mean, /max, /min, /clip_ratio; optional
prompt_length/mean, timing_s/step and timing_s/gen), slime logs (rollout/response_len/mean,
/median, /max, /min, rollout/truncated_ratio) or generic {{"mean", "std", "median", "max",
"min", "clip_ratio", "count"}}; statistics need --prompts and --n (the batch), and lengths
are drawn from a log-normal fitted to them (an assumed shape, printed).

Interval: {INTERVAL}.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("trace", help="the trace JSONL (with --export: the file to write)")
    a("--ranks", type=int, help="rollout ranks (data-parallel engines) of the run")
    add_model_args(p)
    a("--prompts", type=int, help="prompts per step (default: from the trace's prompt ids)")
    a("--n", type=int, help="samples per prompt (default: from the trace's prompt ids)")
    a("--prompt-len", type=float,
      help="prompt tokens (default: the trace's prompt_len / prompt_length/mean, else 256)")
    a("--train-s", type=float,
      help="trainer seconds between steps, the training window (default: the trace's "
      "train_s / timing_s/step - timing_s/gen, else 0)")
    a("--max-response-length", type=float,
      help="statistics: the length budget (default: the logged max)")
    a("--sibling-corr", type=float, default=0.5,
      help="statistics: share of log-length variance shared by a prompt's samples "
      "(default 0.5, assumed)")
    a("--accept-json", help="measured acceptance per mode (as `bubblespec simulate` takes "
      "it); default: the calibration's measured figures")
    a("--calibration", metavar="PACED_JSON", default=str(DEFAULT_CALIBRATION),
      help="paced.json of `bubblespec bench paced` that calibrates the simulator (default: "
      "the record shipped in bubblespec/calibration/data/paced_small.json)")
    a("--seeds", type=int, default=8, help="draws of the trace (default 8)")
    a("--steps", type=int, default=16,
      help="trace steps simulated, evenly spaced when the trace has more (default 16)")
    a("--assign", choices=("round_robin", "lpt"), default="round_robin",
      help="prompt-to-rank assignment (default round_robin, the gateway on fresh prompts)")
    a("--seed", type=int, default=0, help="first draw's seed (default 0)")
    a("--export", metavar="PACED_JSON:MODE",
      help="write that mode's lengths of a paced run to TRACE and exit")
    a("--out", help="directory for predict.json and predict.png")
    return p


def _export(spec: str, dest: str) -> int:
    path, _, mode = spec.rpartition(":")
    if not path or not mode:
        raise ValueError(f"--export {spec!r}: want PACED_JSON:MODE")
    rows = paced_trace(path, mode)
    Path(dest).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {dest}: {len(rows)} steps of {mode} from {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `bubblespec predict` (exit 2 with one line on bad input)."""
    args = build_parser().parse_args(argv)
    try:
        if args.export:
            return _export(args.export, args.trace)
        if args.ranks is None:
            raise ValueError("--ranks is required (rollout ranks of the run)")
        trace = read_trace(args.trace, args.max_response_length)
        if not Path(args.calibration).exists():
            raise ValueError(f"--calibration {args.calibration}: no such file (give a "
                             "paced.json of `bubblespec bench paced`)")
        cal = calibrate(args.calibration)
        modes, notes = (load_accept_json(args.accept_json) if args.accept_json
                        else (None, []))
        engine = EngineTime.preset(args.gpu, args.params_b, 2.0, args.kv_bytes_per_token)
        pred = predict(trace, args.ranks, engine, cal, prompts=args.prompts, n=args.n,
                       prompt_len=args.prompt_len, train_s=args.train_s, modes=modes,
                       accept_notes=notes, seeds=args.seeds, max_steps=args.steps,
                       sibling_corr=args.sibling_corr, assign=args.assign, seed=args.seed)
    except (TraceError, ValueError, OSError, KeyError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"{PROG}: error: {msg}", file=sys.stderr)
        return 2
    out = lines(pred)
    if args.out:
        out[-1:-1] = write(pred, Path(args.out))
    print("\n".join(out))
    return 0
