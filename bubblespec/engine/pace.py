"""Paced engine forwards: each forward of a CPU engine lasts what a GPU would take, x scale.

A local cluster on a few shared CPU cores distorts every time figure of a rollout: a decode
forward there costs in proportion to the batch (on a GPU it is memory-bound, nearly flat up
to the roofline ridge), and one rank's pre-generation slows its neighbours (on a GPU node
each rank has its own device). A paced engine makes every forward (decode, verification of
drafts, pre-generation, prefill) last

    paced = scale x EngineTime.forward(decode tokens incl. drafts, context tokens, prefill)

of wall time, with `EngineTime` the one engine-time model that the simulator charges too
(`bubblespec.core.engine_time`, GPU presets h100 / h200 serving an 8B model). The engine
sleeps the rest of the paced time after its real work. When the real work took longer (an
**overrun**, the CPU was too slow for the scale), the forward lasts its real time and is
counted: a paced run is valid only with under 1% overruns (`PaceStats.valid`). Then a
cluster's wall time is modelled GPU time x scale whatever the CPU contention and the number
of ranks on the machine, and wall seconds / scale are modelled GPU seconds.

The engine's own step overhead between two forwards (scheduling, output processing) is
real CPU time too: a gap up to the previous forward's paced time is counted inside the next
forward's paced time (the model's `t_fixed` holds the engine's per-step overhead); a longer
gap means the engine was idle and the next forward is paced from its own start.

Drafting is not in the model: on a GPU host the proposer's CPU time between two forwards
is real time on top of the forward (the GPU waits for the drafts to verify). With
`charge_drafting` the pacer adds each step's measured proposer time (`drafted`) to the
forward it ends, unscaled in modelled time (this machine's CPU stands for the host's), so
x scale in wall time; `drafting_s` sums it either way, so a run can say drafting's share
of its modelled time.

Everything else the product adds inside a step is charged too (`product`): the keyed
sampler's and verifier's host work at its measured time, and the product's calls into the
engine between steps (`between`: drafts added, groups released, counters read; charged to
the next forward) (this CPU standing for the GPU
host's, as for drafting), and their device kernels at the modelled time of
`EngineTime.keyed_kernel_s` (fused, or eager: `keyed_kernel`) over their positions x the
modelled model's vocabulary. The real CPU time those kernels take here is not charged: it
stands for the device work the model charges instead. A paced engine without speculation
overlaps its host side with the forward (`overlap_host`: vLLM's async scheduling, on by
default on a GPU for decoding without speculation, off for the `custom_class` and `suffix`
drafters), so its step takes max(GPU, host) rather than their sum
(`EngineTime.step`); `async_hidden_s` sums what that overlap hid.

This module is pure arithmetic and bookkeeping (no vLLM, no torch): `vllm_glue.install_pace`
wraps the worker's forward with a `Pacer` and reads each forward's shape from vLLM's
scheduler output.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bubblespec.core.engine_time import GPUS, MODEL_VOCAB, EngineTime

PACE_PROFILES = tuple(sorted(GPUS))
"""GPU profiles a rank can be paced to (`--pace`)."""
MAX_OVERRUN_SHARE = 0.01
"""A paced run is valid only if fewer than this share of its forwards overran."""


@dataclass(frozen=True)
class ForwardShape:
    """What one engine forward computes (the engine-time model's inputs)."""

    tokens: int
    """Decode tokens: 1 + drafted tokens verified, summed over decoding sequences."""
    context: int
    """KV tokens read in attention: computed tokens of the decoding sequences."""
    prefill: int
    """Prompt tokens computed (prefill) in this forward."""
    drafts: int = 0
    """Drafted tokens verified (part of `tokens`)."""


def forward_shape(new_reqs: Iterable[tuple[str, int]], cached: Iterable[tuple[str, int]],
                  num_scheduled: Mapping[str, int], spec: Mapping[str, Sequence[int]]
                  ) -> ForwardShape:
    """The shape of one forward from the scheduler's view of it.

    `new_reqs`: (request id, tokens already computed: prefix-cache hits) of requests
    admitted in this forward, whose scheduled tokens are prefill; `cached`: (request id,
    computed tokens) of running requests, each decoding 1 + its drafted tokens (scheduled
    tokens beyond that are a chunked prefill's continuation); `num_scheduled`: tokens
    scheduled per request; `spec`: drafted tokens per request."""
    tokens = context = prefill = drafts = 0
    for rid, _computed in new_reqs:
        prefill += int(num_scheduled.get(rid, 0))
    for rid, computed in cached:
        n = int(num_scheduled.get(rid, 0))
        if n <= 0:
            continue
        d = len(spec.get(rid, ()))
        step = min(n, 1 + d)
        tokens += step
        drafts += step - 1
        prefill += n - step
        context += int(computed)
    return ForwardShape(tokens, context, prefill, drafts)


def engine_time(profile: str) -> EngineTime:
    """The engine-time model of a pace profile (ValueError naming the known ones)."""
    if profile not in GPUS:
        raise ValueError(f"unknown pace profile {profile!r}; known: {', '.join(PACE_PROFILES)}")
    return EngineTime.preset(profile)


RATIO_EDGES = tuple(2.0 ** (k / 4) for k in range(-24, 25))
"""Upper edges of the real / paced histogram buckets (1/64 ... 64, four per doubling; a
last bucket holds what is above)."""


def ratio_bucket(ratio: float) -> int:
    """The histogram bucket of a real / paced ratio."""
    for i, edge in enumerate(RATIO_EDGES):
        if ratio <= edge:
            return i
    return len(RATIO_EDGES)


def ratio_quantile(hist: Sequence[int], q: float) -> float:
    """Upper bucket edge below which a share `q` of the forwards' ratios lie (inf if in the
    last bucket, 0 without forwards)."""
    total = sum(hist)
    if total == 0:
        return 0.0
    seen = 0
    for i, c in enumerate(hist):
        seen += c
        if seen >= q * total:
            return RATIO_EDGES[i] if i < len(RATIO_EDGES) else float("inf")
    return float("inf")


@dataclass
class PaceStats:
    """Counters of one paced engine since it started (seconds are wall seconds)."""

    profile: str
    scale: float
    forwards: int = 0
    overruns: int = 0
    paced_s: float = 0.0
    """Sum of paced times (modelled GPU seconds x scale)."""
    real_s: float = 0.0
    """Sum of the real times of the forwards' work (incl. absorbed step overhead)."""
    overrun_s: float = 0.0
    """Wall seconds by which overrunning forwards exceeded their paced time."""
    worst_ratio: float = 0.0
    """Largest real / paced ratio seen."""
    decode_tokens: int = 0
    draft_tokens: int = 0
    prefill_tokens: int = 0
    context_tokens: int = 0
    drafting_s: float = 0.0
    """Proposer CPU seconds measured in paced forwards (modelled seconds: unscaled)."""
    charged_s: float = 0.0
    """Of those, the seconds charged on top of the forwards (x scale in `paced_s`)."""
    forward_s: float = 0.0
    """Modelled seconds of the forwards alone (`EngineTime.forward`, engine host included)."""
    product_host_s: float = 0.0
    """Measured host seconds of the keyed sampler and verifier, and of the product's calls
    into the engine between steps (modelled seconds)."""
    between_s: float = 0.0
    """Of `product_host_s`, the calls between steps (`Pacer.between`)."""
    keyed_device_s: float = 0.0
    """Modelled device seconds of the keyed kernels (`EngineTime.keyed_kernel_s`)."""
    keyed_elements: int = 0
    """Position x vocabulary elements of those kernels (the modelled model's vocabulary)."""
    keyed_launches: int = 0
    """Kernel launches of those kernels."""
    async_hidden_s: float = 0.0
    """Modelled seconds hidden by overlapping host and GPU (async scheduling)."""
    ratio_hist: list[int] = field(default_factory=lambda: [0] * (len(RATIO_EDGES) + 1))
    """Forwards per bucket of real / paced time (`RATIO_EDGES`)."""

    @property
    def overrun_share(self) -> float:
        return self.overruns / self.forwards if self.forwards else 0.0

    @property
    def valid(self) -> bool:
        """Under `MAX_OVERRUN_SHARE` of the forwards overran."""
        return self.overrun_share < MAX_OVERRUN_SHARE

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(modelled_s=self.paced_s / self.scale if self.scale else 0.0)
        return _shares(d)


_COUNTERS = ("forwards", "overruns", "paced_s", "real_s", "overrun_s", "decode_tokens",
             "draft_tokens", "prefill_tokens", "context_tokens", "modelled_s", "drafting_s",
             "charged_s", "forward_s", "product_host_s", "keyed_device_s", "keyed_elements",
             "keyed_launches", "async_hidden_s", "between_s")


def _shares(out: dict[str, Any]) -> dict[str, Any]:
    """Add the derived figures: overrun share, validity, ratio quantiles and the scale that
    would have kept the overruns under 1% (this scale x the ratios' 99th percentile)."""
    out["overrun_share"] = out["overruns"] / out["forwards"] if out["forwards"] else 0.0
    out["valid"] = out["overrun_share"] < MAX_OVERRUN_SHARE
    hist = out.get("ratio_hist") or []
    out["ratio_p50"] = ratio_quantile(hist, 0.5)
    out["ratio_p99"] = ratio_quantile(hist, 1.0 - MAX_OVERRUN_SHARE)
    out["scale_for_valid"] = out.get("scale", 0.0) * out["ratio_p99"]
    return out


def _hist_sum(hists: Iterable[Sequence[int]], sign: Iterable[int]) -> list[int]:
    out = [0] * (len(RATIO_EDGES) + 1)
    for h, sg in zip(hists, sign):
        for i, c in enumerate(h or []):
            out[i] += sg * c
    return out


def merge_stats(stats: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Counters of several paced engines (their `as_dict`) added up."""
    stats = list(stats)
    out: dict[str, Any] = {k: 0 for k in _COUNTERS}
    out["worst_ratio"] = 0.0
    for s in stats:
        for k in _COUNTERS:
            out[k] += s.get(k, 0)
        out["worst_ratio"] = max(out["worst_ratio"], float(s.get("worst_ratio", 0.0)))
    out["scale"] = max((float(s.get("scale", 0.0)) for s in stats), default=0.0)
    out["ratio_hist"] = _hist_sum((s.get("ratio_hist") for s in stats), [1] * len(stats))
    return _shares(out)


def stats_delta(after: Mapping[str, Any], before: Mapping[str, Any]) -> dict[str, Any]:
    """Counters between two readings of the same engines (`worst_ratio`: the later reading's,
    a bound over both periods)."""
    out: dict[str, Any] = {k: after.get(k, 0) - before.get(k, 0) for k in _COUNTERS}
    out["worst_ratio"] = float(after.get("worst_ratio", 0.0))
    out["scale"] = float(after.get("scale", 0.0))
    out["ratio_hist"] = _hist_sum((after.get("ratio_hist"), before.get("ratio_hist")), (1, -1))
    return _shares(out)


@dataclass
class Pacer:
    """Makes each forward last its paced time: `begin(shape)` when it starts, `end()` when
    its results are ready (sleeps the rest, or counts an overrun)."""

    model: EngineTime
    scale: float
    charge_drafting: bool = False
    overlap_host: bool = False
    """Host and GPU overlap (async scheduling): a step takes the longer, not the sum."""
    keyed_kernel: str = "fused"
    """How the keyed kernels are modelled: "fused" or "eager" (`EngineTime.keyed_kernel_s`)."""
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    stats: PaceStats = field(init=False)
    _start: float | None = field(default=None, init=False)
    _shape: ForwardShape | None = field(default=None, init=False)
    _last_end: float | None = field(default=None, init=False)
    _last_paced: float = field(default=0.0, init=False)
    _drafting: float = field(default=0.0, init=False)
    _host: float = field(default=0.0, init=False)
    _elements: int = field(default=0, init=False)
    _launches: int = field(default=0, init=False)
    _pending: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        if not self.scale > 0:
            raise ValueError(f"pace scale must be > 0, got {self.scale}")
        if self.keyed_kernel not in ("fused", "eager"):
            raise ValueError(f"keyed_kernel must be fused or eager, got {self.keyed_kernel!r}")
        self.stats = PaceStats(profile=self.model.gpu, scale=self.scale)

    @property
    def active(self) -> bool:
        """A forward has begun and not ended."""
        return self._start is not None

    def paced_seconds(self, shape: ForwardShape) -> float:
        """Paced seconds of a forward of `shape` with nothing charged on top."""
        return self.scale * self.model.step(shape.tokens, shape.context, shape.prefill,
                                            overlap_host=self.overlap_host)

    def drafted(self, seconds: float) -> None:
        """The proposer ran for `seconds` within the current forward (ignored outside one)."""
        if self._start is not None and seconds > 0:
            self._drafting += seconds

    def product(self, host_s: float, positions: int, launches: int) -> None:
        """The keyed sampler or verifier ran within the current forward: `host_s` measured
        host seconds, and kernels over `positions` rows of logits (each `MODEL_VOCAB` wide)
        in `launches` launches (ignored outside a forward)."""
        if self._start is not None:
            self._host += max(0.0, host_s)
            self._elements += int(positions) * MODEL_VOCAB
            self._launches += int(launches)

    def between(self, host_s: float) -> None:
        """The product's own call into the engine between two steps (drafts added, groups
        released, counters read) took `host_s`: charged to the next forward's host side."""
        self._pending += max(0.0, host_s)

    def begin(self, shape: ForwardShape) -> None:
        now = self.clock()
        gap = None if self._last_end is None else now - self._last_end
        # the engine's step overhead since the last forward counts inside this one's time
        self._start = self._last_end if gap is not None and gap <= self._last_paced else now
        self._shape = shape
        self._host += self._pending
        self.stats.between_s += self._pending
        self._pending = 0.0
        s = self.stats
        s.decode_tokens += shape.tokens
        s.draft_tokens += shape.drafts
        s.prefill_tokens += shape.prefill
        s.context_tokens += shape.context

    def _modelled(self, shape: ForwardShape) -> float:
        """Modelled seconds of the step that just ended, with every charge; books them."""
        s, m = self.stats, self.model
        drafting = self._drafting if self.charge_drafting else 0.0
        device = (m.keyed_kernel_s(self._elements, self._launches, self.keyed_kernel == "fused")
                  if self._launches else 0.0)
        host = drafting + self._host
        step = m.step(shape.tokens, shape.context, shape.prefill, device_s=device,
                      host_s=host, overlap_host=self.overlap_host)
        forward = m.forward(shape.tokens, shape.context, shape.prefill)
        s.drafting_s += self._drafting
        s.charged_s += drafting
        s.forward_s += forward
        s.product_host_s += self._host
        s.keyed_device_s += device
        s.keyed_elements += self._elements
        s.keyed_launches += self._launches
        s.async_hidden_s += forward + device + host - step
        self._drafting = self._host = 0.0
        self._elements = self._launches = 0
        return step

    def end(self) -> None:
        if self._start is None or self._shape is None:
            return
        real = self.clock() - self._start
        s = self.stats
        s.forwards += 1
        paced = self.scale * self._modelled(self._shape)
        s.paced_s += paced
        s.real_s += real
        ratio = real / paced if paced > 0 else 0.0
        s.worst_ratio = max(s.worst_ratio, ratio)
        s.ratio_hist[ratio_bucket(ratio)] += 1
        if real > paced:
            s.overruns += 1
            s.overrun_s += real - paced
        else:
            self.sleep(paced - real)
        self._last_end = self.clock()
        self._last_paced = paced
        self._start = self._shape = None
