"""Poison requests: a request that kills the engine of every rank it is sent to.

One legal request may hit a bug in an engine (a sampler path, a kernel, the model) that kills
the engine core. The gateway's failover would carry such a request from rank to rank, and
every rank would die of it. The policy (docs/design.md, "Poison requests"):

- A request is known by its fingerprint: its prompt token ids and its sampling parameters
  (`fingerprint`). The seeds are left out: a retry of the same request draws new ones.
- When a rank's engine dies while it runs a shard (the rank says so), every request of that
  shard becomes a suspect, remembered for `suspect_s`. The shard is re-run once elsewhere,
  since one death is not attributable: engines also die of their own faults, and a shard
  shares its engine with other shards.
- A suspect present at a second engine death is quarantined (another rank's engine, or the
  same rank's restarted engine when the request came back after a failed step): the
  step fails at once with a 500 that names the request (its prompt index, length, key and
  the sampling parameters that differ from the defaults), no further rank receives it, and
  for `hold_s` seconds the same request is refused before it reaches a rank, with a 422
  naming the prompt. Requests that shared both dead batches with it are quarantined with it
  (the two deaths cannot tell them apart); a request quarantined wrongly is refused for
  `hold_s` only.

Bounded: at most `max_entries` fingerprints of each kind, oldest dropped first.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.sampling import SamplingParams


def fingerprint(input_ids: Sequence[int], sampling: SamplingParams) -> str:
    """A request's identity for the quarantine: prompt ids and sampling parameters."""
    h = hashlib.blake2b(digest_size=12)
    h.update(sampling.model_dump_json().encode())
    h.update(b"|")
    h.update(",".join(map(str, input_ids)).encode())
    return h.hexdigest()


def scoring_fingerprint(input_ids: Sequence[int]) -> str:
    """A scoring call's identity for the quarantine: its prompt ids (scoring samples nothing,
    so it has no sampling parameters; the tag keeps it apart from any rollout)."""
    h = hashlib.blake2b(digest_size=12)
    h.update(b"score|")
    h.update(",".join(map(str, input_ids)).encode())
    return h.hexdigest()


def describe(sampling: SamplingParams) -> str:
    """The sampling parameters that differ from the defaults, as `name=value` pairs."""
    changed = sampling.model_dump(mode="json", exclude_defaults=True)
    return ", ".join(f"{k}={v}" for k, v in sorted(changed.items())) or "defaults"


@dataclass
class Suspect:
    """A request that was in a batch whose engine died."""

    deaths: list[tuple[str, str]] = field(default_factory=list)
    """(rank id, why its engine died) per death."""
    since: float = 0.0


@dataclass(frozen=True)
class Held:
    """A quarantined request: what it is and which engines it killed."""

    fingerprint: str
    what: str
    deaths: tuple[tuple[str, str], ...]
    until: float

    def reason(self) -> str:
        ranks = " and ".join(f"{r} ({why})" for r, why in self.deaths)
        return f"{self.what} killed the engines of ranks {ranks}"


class Quarantine:
    """Suspects and quarantined requests, by fingerprint (see the module docstring)."""

    def __init__(self, hold_s: float = 600.0, suspect_s: float = 600.0,
                 max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.hold_s = hold_s
        self.suspect_s = suspect_s
        self.max_entries = max_entries
        self.clock = clock
        self._suspects: OrderedDict[str, Suspect] = OrderedDict()
        self._held: OrderedDict[str, Held] = OrderedDict()

    def held(self, fp: str) -> Held | None:
        """The quarantine entry of `fp` while it lasts."""
        h = self._held.get(fp)
        if h is not None and h.until <= self.clock():
            del self._held[fp]
            return None
        return h

    def check(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams,
              field_of: Callable[[int], str] = lambda i: f"prompts[{i}]") -> None:
        """ApiError 422 naming the first prompt whose request is quarantined."""
        self.check_fingerprints([fingerprint(ids, sampling) for ids in prompts], field_of)

    def check_fingerprints(self, fps: Sequence[str],
                           field_of: Callable[[int], str] = lambda i: f"prompts[{i}]") -> None:
        """ApiError 422 naming the first request of `fps` that is quarantined."""
        for i, fp in enumerate(fps):
            h = self.held(fp)
            if h is not None:
                left = max(0.0, h.until - self.clock())
                raise ApiError(422, f"{field_of(i)}: request quarantined for another "
                                    f"{left:.0f} s: {h.reason()}; it is not sent to any rank",
                               field_of(i))

    def engine_died(self, rank_id: str, reason: str,
                    requests: Sequence[tuple[str, str]]) -> list[Held]:
        """Record that `rank_id`'s engine died running `requests` ((fingerprint, what) each);
        returns the requests now quarantined (suspects of an earlier death)."""
        now = self.clock()
        out = []
        for fp, what in requests:
            s = self._suspects.get(fp)
            if s is None or now - s.since > self.suspect_s:
                s = Suspect(since=now)
            s.deaths.append((rank_id, reason))
            self._suspects[fp] = s
            self._suspects.move_to_end(fp)
            if len(s.deaths) >= 2:
                h = Held(fp, what, tuple(s.deaths), now + self.hold_s)
                self._held[fp] = h
                self._held.move_to_end(fp)
                del self._suspects[fp]
                out.append(h)
        for d in (self._suspects, self._held):
            while len(d) > self.max_entries:
                d.popitem(last=False)
        return out

    def cleared(self, fps: Sequence[str]) -> None:
        """Requests that completed: no longer suspects."""
        for fp in fps:
            self._suspects.pop(fp, None)

    @property
    def held_count(self) -> int:
        now = self.clock()
        return sum(1 for h in self._held.values() if h.until > now)
