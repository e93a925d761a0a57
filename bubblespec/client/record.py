"""Recorded rollouts and their replay: what `BubbleSpecClient(record=PATH)` writes and what
`bubblespec replay STEP` checks.

A recorded step is one JSON line holding everything that determines its responses under
keyed sampling (docs/api.md, "Reproducible rollouts"): the prompts as token ids (as the
gateway tokenized them), `n`, the sampling parameters with the seed mode the step actually
used, **one explicit seed per sample**, and the weight version(s) the engines sampled with;
plus, per sample, a digest of its output ids and one of its log-probs. The seeds are the
caller's when it gave them; otherwise the gateway derived them as
`protocol.keys.derive_seeds(run_seed, step, prompt_key, n)` (`gateway/seeds.py`), and the
recorder derives the very same seeds after the fact from the gateway's run seed (GET
/config), the step and the prompt keys in the answer. A replay that matches proves that
derivation right, so no product change is needed to record a step.

Digests, not tokens: a record stays small (two sha256 per sample), and a replay still says
per sample whether the ids, the log-probs, or both differ. Log-probs are hashed bit for bit
(IEEE-754 doubles, as JSON carries a float32 widened to a double exactly).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bubblespec.protocol.gateway import RolloutResponse
from bubblespec.protocol.keys import derive_seeds
from bubblespec.protocol.sampling import SamplingParams, SeedMode

FORMAT = "bubblespec.rollout_record/1"
"""The `format` of a record line (a reader refuses others)."""

KEYED_MODES = (SeedMode.KEYED.value, SeedMode.KEYED_CONTEXT.value)


def ids_digest(ids: Sequence[int]) -> str:
    """sha256 of a response's output ids (comma-joined decimal)."""
    return hashlib.sha256(",".join(str(int(t)) for t in ids).encode()).hexdigest()


def logprobs_digest(logprobs: Sequence[float] | None) -> str | None:
    """sha256 of a response's log-probs, bit for bit (little-endian doubles); None when the
    step did not return them."""
    if logprobs is None:
        return None
    return hashlib.sha256(struct.pack(f"<{len(logprobs)}d", *logprobs)).hexdigest()


def sample_digests(res: RolloutResponse) -> list[dict[str, Any]]:
    """One entry per sample of a step (prompt-major): where it ran and its digests."""
    out = []
    for p in res.prompts:
        for s in p.samples:
            out.append({"prompt": p.index, "sample_index": s.sample_index,
                        "rank_id": p.rank_id, "weight_version": s.weight_version,
                        "tokens": len(s.output_ids), "ids": ids_digest(s.output_ids),
                        "logprobs": logprobs_digest(s.output_logprobs)})
    return out


def step_record(res: RolloutResponse, request: dict[str, Any], seeds: list[list[int]] | None,
                seeds_from: str, gateway: str) -> dict[str, Any]:
    """The record line of one rollout: `request` is the body the client sent, `seeds` the
    per-sample seeds the step used (None: unknown, the step cannot be replayed)."""
    sp = dict(request.get("sampling_params") or {})
    sp["seed_mode"] = res.seed_mode.value  # what the step used (hand-off default included)
    replay = {"prompts": [{"input_ids": list(p.input_ids)} for p in res.prompts],
              "n": int(request.get("n", 1)),
              "sampling_params": SamplingParams.model_validate(sp).model_dump(mode="json"),
              "seeds": seeds}
    return {"format": FORMAT, "step": res.step, "time": time.time(), "gateway": gateway,
            "seed_mode": res.seed_mode.value, "seeds_from": seeds_from,
            "weight_versions": list(res.weight_versions), "request": replay,
            "prompt_keys": [p.prompt_key for p in res.prompts],
            "samples": sample_digests(res)}


def derived_seeds(run_seed: int, res: RolloutResponse, n: int) -> list[list[int]]:
    """The seeds the gateway derived for a step the caller gave none (its own rule)."""
    return [derive_seeds(run_seed, res.step, p.prompt_key, n) for p in res.prompts]


class Recorder:
    """Appends one record line per rollout to a JSONL file (thread-safe; one write per line,
    flushed, so that a crash loses at most the step in flight)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as f:
            f.write(line)
            f.flush()


class RecordError(ValueError):
    """A record file or line that cannot be replayed (and why)."""


def read_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The record lines of a file, in order; RecordError naming the line of a bad one."""
    p = Path(path)
    if not p.is_file():
        raise RecordError(f"no record file at {p}")
    with p.open(encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise RecordError(f"{p}:{no}: not JSON ({e})") from None
            if not isinstance(rec, dict) or rec.get("format") != FORMAT:
                raise RecordError(f"{p}:{no}: not a {FORMAT} line")
            yield rec


def find_record(path: str | os.PathLike[str], step: int | None) -> dict[str, Any]:
    """The record of `step` (the last one if the file holds several, e.g. from two runs of
    the gateway), or the file's last record for None."""
    found = None
    for rec in read_records(path):
        if step is None or rec.get("step") == step:
            found = rec
    if found is None:
        raise RecordError(f"{path}: no record of step {step}")
    return found


def replay_body(rec: dict[str, Any]) -> dict[str, Any]:
    """The rollout body that re-runs a recorded step: its prompts, n, sampling parameters
    (seed mode named) and explicit seeds, log-probs on, no pre-generation and no hand-off
    (the replay must not change what the next real step drafts from)."""
    req = rec["request"]
    if req.get("seeds") is None:
        raise RecordError(f"step {rec.get('step')}: its seeds are unknown "
                          f"({rec.get('seeds_from')}); it cannot be replayed")
    return {"prompts": req["prompts"], "n": req["n"], "sampling_params": req["sampling_params"],
            "seeds": req["seeds"], "return_logprobs": True, "pregen": False}


@dataclass
class SampleCheck:
    """One sample of a replay: its recorded and replayed digests."""

    prompt: int
    sample_index: int
    recorded_rank: str
    replayed_rank: str
    ids_match: bool
    logprobs_match: bool | None  # None: the record has no log-probs
    recorded_tokens: int
    replayed_tokens: int

    @property
    def match(self) -> bool:
        return self.ids_match and self.logprobs_match is not False

    def line(self) -> str:
        where = f"rank {self.recorded_rank} -> {self.replayed_rank}"
        head = f"prompt {self.prompt} sample {self.sample_index} ({where}):"
        if self.match:
            lp = "" if self.logprobs_match else " (ids only: no log-probs recorded)"
            return f"{head} match{lp}"
        what = []
        if not self.ids_match:
            what.append(f"ids differ ({self.recorded_tokens} -> {self.replayed_tokens} tokens)")
        if self.logprobs_match is False:
            what.append("log-probs differ" + (" (ids equal)" if self.ids_match else ""))
        return f"{head} MISMATCH: " + ", ".join(what)


@dataclass
class ReplayReport:
    """A replay's outcome: every sample's check, and the weight versions on both sides."""

    step: int
    replayed_step: int
    recorded_versions: list[int]
    replayed_versions: list[int]
    samples: list[SampleCheck] = field(default_factory=list)

    @property
    def mismatches(self) -> int:
        return sum(not s.match for s in self.samples)

    @property
    def versions_match(self) -> bool:
        return self.recorded_versions == self.replayed_versions

    @property
    def ok(self) -> bool:
        return self.versions_match and self.mismatches == 0

    def summary(self) -> str:
        n = len(self.samples)
        ids = sum(s.ids_match for s in self.samples)
        lps = sum(s.logprobs_match is True for s in self.samples)
        return (f"step {self.step} replayed as step {self.replayed_step}: "
                f"{n - self.mismatches}/{n} samples match (ids {ids}/{n}, log-probs {lps}/{n}); "
                f"weight versions {self.recorded_versions} -> {self.replayed_versions}")


def compare(rec: dict[str, Any], res: RolloutResponse) -> ReplayReport:
    """Check a replayed step against its record, sample by sample."""
    now = {(d["prompt"], d["sample_index"]): d for d in sample_digests(res)}
    rep = ReplayReport(rec["step"], res.step, list(rec["weight_versions"]),
                       list(res.weight_versions))
    for d in rec["samples"]:
        r = now.get((d["prompt"], d["sample_index"]))
        if r is None:
            rep.samples.append(SampleCheck(d["prompt"], d["sample_index"], d["rank_id"], "-",
                                           False, None, d["tokens"], 0))
            continue
        lp = None if d["logprobs"] is None else d["logprobs"] == r["logprobs"]
        rep.samples.append(SampleCheck(d["prompt"], d["sample_index"], d["rank_id"],
                                       r["rank_id"], d["ids"] == r["ids"], lp, d["tokens"],
                                       r["tokens"]))
    return rep
