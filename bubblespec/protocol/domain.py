"""Domain types the synchronizer, the ranks and the gateway exchange (plain dataclasses).

Callers of the synchronizer's client see only these (never protobuf objects); the daemon's
state keeps the same types, and `synchronizer/convert.py` is the one place that maps them to
and from `bubblespec.rpc.v1`. A pre-generated response is a `PregenDraft` (the draft index's
proposals are `bubblespec.core.Draft`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from bubblespec.protocol.sampling import SamplingParams


class RankState(str, enum.Enum):
    """What a rank is doing: its own state (`RankWorker`, GET /v1/state, its metrics) and what
    it reports in heartbeats (LOST is set by the daemon only; ENGINE_DEAD: the rank's engine
    died and the rank is restarting it, so it is not ready; RELEASED: a colocated trainer
    released the engine's memory; STARTING: the engine is not up yet, never in a heartbeat)."""

    UNSPECIFIED = "unspecified"
    IDLE = "idle"
    DECODING = "decoding"
    PREGEN = "pregen"
    UPDATING_WEIGHTS = "updating_weights"
    LOST = "lost"
    ENGINE_DEAD = "engine_dead"
    RELEASED = "released"
    STARTING = "starting"


RANK_OWN_STATES = tuple(s for s in RankState if s not in (RankState.UNSPECIFIED,
                                                          RankState.LOST))
"""The states a rank can be in by its own account (the rank's metrics label them)."""


class SpanKind(str, enum.Enum):
    """Timeline span kinds."""

    DECODE = "decode"
    PREGEN = "pregen"
    IDLE = "idle"
    PREGEN_WINDOW = "pregen_window"
    """Pre-generation after the step's stop signal, in the training window."""
    PREGEN_TAIL = "pregen_tail"
    """Pre-generation beside the rank's own requests before it was done (tail-fill)."""


class StepEventKind(str, enum.Enum):
    """Events of the WatchStep stream."""

    OPENED = "opened"
    STOP = "stop"
    CLOSED = "closed"


class DraftStatus(str, enum.Enum):
    """Outcome of one pushed draft."""

    STORED = "stored"
    REJECTED_FULL = "rejected_full"
    REJECTED_STEP = "rejected_step"
    REJECTED_GAP = "rejected_gap"
    #: Client-side only: the push did not reach the store (synchronizer unreachable, or the
    #: whole push refused, e.g. over the message size limit); nothing was stored.
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class PregenTask:
    """Generate one response (sample `sample_index`, seeded `seed`) for a next-step prompt."""

    prompt_key: str
    prompt_token_ids: Sequence[int]
    sample_index: int
    seed: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prefix: Sequence[int] = ()
    """A margin branch task: the stored draft's tokens before `branch_at`, then its
    runner-up token there, and, for a branch an earlier bubble cut short, what that bubble
    decoded after it (the response continues after them)."""
    branch_at: int | None = None
    """The output position where the branch takes the runner-up; None: a plain task."""
    step: int | None = None
    """The step whose rollout the draft is for; None: the step after the one opened (a
    trainer may hand prompts several steps ahead)."""
    hint: Sequence[int] = ()
    """A refresh: the draft stored for this sample under older weights, handed to the
    engine as the sample's draft so that decoding under the new weights verifies it rather
    than generating from nothing (exact either way)."""

    @property
    def max_new_tokens(self) -> int:
        """The task's response budget (its sampling's max_new_tokens)."""
        return self.sampling.max_new_tokens

    @property
    def can_branch(self) -> bool:
        """Its draft may offer margin branches: keyed by position, sampled (temperature >
        0), and not itself a branch."""
        sp = self.sampling
        return (self.branch_at is None and sp.keyed and not sp.keyed_by_context
                and sp.temperature > 0)


@dataclass(frozen=True)
class ShardAssignment:
    """How many requests of a step a rank runs."""

    rank_id: str
    num_requests: int


@dataclass(frozen=True)
class PregenDraft:
    """A (partial) pre-generated response, keyed by (step, prompt_key, sample_index).

    On push, `offset` > 0 appends: the stored draft is cut at `offset` and extended.
    """

    prompt_key: str
    sample_index: int
    token_ids: Sequence[int]
    complete: bool = False
    weight_version: int = 0
    offset: int = 0
    branch_at: int | None = None
    """A margin branch: the output position where it takes the draft's runner-up token
    (its tokens before that equal the draft's); None: the draft itself."""
    branch_offers: Sequence[tuple[int, int]] = ()
    """(position, runner-up token) where a draft offers margin branches: a complete draft at
    its smallest keyed margins, a partial one (streamed, while it decodes) where a margin
    fell below the rank's threshold; the synchronizer queues each as a branch task for any
    rank."""
    margin_records: Sequence[tuple[int, float]] = ()
    """A keyed draft of a branching rank: the running minima of its keyed margins,
    (position, margin); where a response flips, they say which streaming thresholds would
    have branched there (`core/branch_margin.py`)."""


@dataclass(frozen=True)
class DraftLocation:
    """Where a stored draft's bytes are: the rank whose push stored its current version and
    serves its drafts (`RegisterRankRequest.drafts_address`), with what the synchronizer
    stored of it, so the reader takes that rank's copy only at this length and version."""

    prompt_key: str
    sample_index: int
    length: int
    complete: bool
    weight_version: int
    owner: str
    branch_at: int | None = None


@dataclass(frozen=True)
class Flip:
    """A response that left its pre-generated draft where a token flipped, at output
    position `at` (reported with the rank's ReportDone)."""

    prompt_key: str
    sample_index: int
    at: int


@dataclass(frozen=True)
class Span:
    """A stretch of time a rank spent decoding, pre-generating or idle."""

    kind: SpanKind
    start_unix_s: float
    end_unix_s: float
    tokens: int = 0


@dataclass(frozen=True)
class StepEvent:
    """A step opened, its stop signal fired, or it closed."""

    kind: StepEventKind
    step: int
    unix_s: float


@dataclass(frozen=True)
class Registration:
    """What a rank learns when it registers."""

    heartbeat_interval_s: float
    rank_timeout_s: float
    poll_every_decode_steps: int
    current_step: int | None
    instance_id: str
    max_message_bytes: int
    reregistered: bool


@dataclass(frozen=True)
class HeartbeatReply:
    """Current step and its stop signal, as seen by the synchronizer instance `instance_id`."""

    current_step: int | None
    stop: bool
    instance_id: str


@dataclass(frozen=True)
class OpenStepResult:
    """Outcome of OpenStep."""

    step: int
    num_tasks: int
    already_open: bool
    opened_unix_s: float


@dataclass(frozen=True)
class Claim:
    """Tasks handed to a rank; `stop` says the step's stop signal fired (no more will come)."""

    tasks: list[PregenTask]
    target_step: int
    stop: bool
    remaining: int
    in_progress: int = 0
    """Tasks claimed by ranks and not complete (their drafts may still offer branches)."""
    branch_margin: float = 0.0
    """The calibrated streamed-branch threshold (0: offers at complete drafts only)."""


@dataclass(frozen=True)
class RankStatus:
    """What a rank's heartbeat reports (see `SyncClient.run_heartbeats`)."""

    state: RankState = RankState.IDLE
    weight_version: int = 0
    step: int | None = None
    done_step: int | None = None


@dataclass(frozen=True)
class PushResult:
    """Per-draft statuses of a push, and the store's fill level after it."""

    statuses: list[DraftStatus]
    stored: int
    rejected: int
    message: str = ""
    store_bytes: int = 0
    budget_bytes: int = 0


@dataclass(frozen=True)
class RankInfo:
    """A rank as the synchronizer knows it."""

    rank_id: str
    address: str
    capacity: int | None
    state: RankState
    weight_version: int
    step: int | None
    done_step: int | None
    last_heartbeat_age_s: float


@dataclass(frozen=True)
class StoreStats:
    """Draft store fill level."""

    sequences: int
    tokens: int
    bytes: int
    budget_bytes: int


@dataclass(frozen=True)
class SyncSnapshot:
    """GetState: ranks, current step and queue/store levels."""

    instance_id: str
    current_step: int | None
    step_open: bool
    stopped: bool
    ranks: list[RankInfo]
    done_rank_ids: list[str]
    pending_rank_ids: list[str]
    queued_tasks: int
    claimed_tasks: int
    store: StoreStats


@dataclass
class StepTimeline:
    """One step: open/stop/close times, shards, and per-rank spans and done times."""

    step: int
    opened_unix_s: float
    stop_unix_s: float | None = None
    closed_unix_s: float | None = None
    shards: list[ShardAssignment] = field(default_factory=list)
    spans: dict[str, list[Span]] = field(default_factory=dict)
    done_unix_s: dict[str, float] = field(default_factory=dict)
