"""`bubblespec replay STEP --record PATH --gateway URL`: re-run a recorded rollout step and
compare every sample's digests with the record.

The record is what `BubbleSpecClient(record=PATH)` appended for the step (prompts, n,
sampling parameters with the seed mode used, one seed per sample, weight versions, and a
digest of each sample's ids and log-probs; `bubblespec.client.record`). The replay sends the
step again as a new gateway step, with explicit seeds, log-probs on, no pre-generation and
no hand-off, then prints one line per sample and a summary.

Before it sends anything it reads the ranks' weight versions (GET /v1/ranks): a replay on
other weights proves nothing, so it refuses (exit 3) unless `--force`. Under keyed sampling
(`seed_mode: keyed` / `keyed_context`) a response is a function of (weights, prompt, seed);
docs/api.md ("Reproducible rollouts") says what is guaranteed and the measured exception on
CPU. A step sampled with vLLM's own sampler (`seed_mode: default`) is replayed too, with a
warning: its seeded samples are not guaranteed across batch compositions or speculation.

Exit status: 0 every sample matches, 1 a sample differs, 2 bad usage or record, 3 refused
(weight versions differ), 4 the gateway failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from bubblespec.client import BubbleSpecClient, BubbleSpecError
from bubblespec.client.record import KEYED_MODES, RecordError, compare, find_record, replay_body

MATCH, MISMATCH, USAGE, REFUSED, FAILED = 0, 1, 2, 3, 4


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bubblespec replay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", help="the recorded gateway step to replay ('last': the file's last)")
    p.add_argument("--record", required=True, help="the JSONL record file")
    p.add_argument("--gateway", default="http://127.0.0.1:8000", help="gateway URL")
    p.add_argument("--token", default=None, help="bearer token of the gateway's POST routes")
    p.add_argument("--force", action="store_true",
                   help="replay even when the ranks' weight versions differ from the record's")
    p.add_argument("--timeout-s", type=float, default=3700.0, help="rollout timeout")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--out", default=None,
                   help="also write the replayed step's full answer (JSON) to this file, to "
                   "look at the tokens where a sample differs")
    return p


def live_versions(client: BubbleSpecClient) -> list[int]:
    """The distinct weight versions of the ready ranks."""
    return sorted({r.weight_version for r in client.ranks()
                   if r.ready and r.weight_version is not None})


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        step = None if args.step == "last" else int(args.step)
    except ValueError:
        print(f"bubblespec replay: STEP must be an integer or 'last', not {args.step!r}",
              file=sys.stderr)
        return USAGE
    try:
        rec = find_record(args.record, step)
        body = replay_body(rec)
    except RecordError as e:
        print(f"bubblespec replay: {e}", file=sys.stderr)
        return USAGE
    if rec["seed_mode"] not in KEYED_MODES:
        print(f"warning: step {rec['step']} sampled with seed_mode {rec['seed_mode']!r}: "
              "only keyed sampling is guaranteed to reproduce (docs/api.md)", file=sys.stderr)
    with BubbleSpecClient(args.gateway, token=args.token, timeout_s=args.timeout_s) as c:
        try:
            versions = live_versions(c)
            if versions != sorted(set(rec["weight_versions"])) and not args.force:
                print(f"bubblespec replay: refused: step {rec['step']} ran on weight versions "
                      f"{rec['weight_versions']}, the ready ranks now have {versions} "
                      "(--force to replay anyway)", file=sys.stderr)
                return REFUSED
            res = c.rollout([p["input_ids"] for p in body["prompts"]], n=body["n"],
                            sampling_params=body["sampling_params"], seeds=body["seeds"],
                            return_logprobs=True, pregen=False)
        except BubbleSpecError as e:
            print(f"bubblespec replay: {e}", file=sys.stderr)
            return FAILED
    if args.out:
        Path(args.out).write_text(res.model_dump_json(), encoding="utf-8")
    report = compare(rec, res)
    if args.json:
        print(json.dumps({"step": report.step, "replayed_step": report.replayed_step,
                          "ok": report.ok, "mismatches": report.mismatches,
                          "recorded_versions": report.recorded_versions,
                          "replayed_versions": report.replayed_versions,
                          "samples": [{**vars(s), "match": s.match}
                                      for s in report.samples]}))
    else:
        for s in report.samples:
            print(s.line())
        print(report.summary())
    if not report.versions_match:
        print("the replay ran on other weight versions than the record", file=sys.stderr)
    return MATCH if report.ok else MISMATCH


if __name__ == "__main__":
    sys.exit(main())
