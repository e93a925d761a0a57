"""Rank registry: who is registered, what each rank last said, and who went silent.

Liveness uses the monotonic clock: a rank whose last registration or heartbeat is older than
`timeout_s` becomes LOST at the next `reap()`. LOST ranks stay listed (GetState shows them)
but are refused on rank-scoped calls with NOT_FOUND until they re-register.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from bubblespec.protocol.domain import RankInfo, RankState
from bubblespec.synchronizer.errors import not_found


@dataclass
class _Rank:
    rank_id: str
    address: str
    capacity: int | None
    weight_version: int
    last_seen: float
    state: RankState = RankState.IDLE
    step: int | None = None
    done_step: int | None = None
    drafts_address: str = ""
    """Where the rank serves the drafts it pushed (DraftPeer); empty: it does not."""


class RankRegistry:
    """Registered ranks and their liveness."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._ranks: dict[str, _Rank] = {}

    def __len__(self) -> int:
        return len(self._ranks)

    def __contains__(self, rank_id: object) -> bool:
        return rank_id in self._ranks

    def register(self, rank_id: str, address: str, capacity: int | None, weight_version: int,
                 drafts_address: str = "") -> bool:
        """Add or refresh a rank (state IDLE, alive); True if the rank_id was known."""
        known = rank_id in self._ranks
        self._ranks[rank_id] = _Rank(rank_id, address, capacity, weight_version,
                                     time.monotonic(), drafts_address=drafts_address)
        return known

    def draft_peers(self) -> dict[str, str]:
        """rank_id -> drafts address of the live ranks that serve their drafts."""
        return {r.rank_id: r.drafts_address for r in self._ranks.values()
                if r.drafts_address and r.state is not RankState.LOST}

    def require_live(self, rank_id: str) -> _Rank:
        """The rank, or NOT_FOUND (field rank_id) when it is unknown or LOST."""
        rank = self._ranks.get(rank_id)
        if rank is None:
            raise not_found("rank_id", f"rank {rank_id!r} is not registered: call RegisterRank")
        if rank.state is RankState.LOST:
            raise not_found(
                "rank_id", f"rank {rank_id!r} was marked LOST (no heartbeat for "
                f"{self.timeout_s:g} s): call RegisterRank again")
        return rank

    def heartbeat(self, rank_id: str, state: RankState, weight_version: int, step: int | None,
                  done_step: int | None) -> None:
        """Refresh a live rank; state UNSPECIFIED leaves the last reported state."""
        rank = self.require_live(rank_id)
        rank.last_seen = time.monotonic()
        if state is not RankState.UNSPECIFIED:
            rank.state = state
        rank.weight_version = weight_version
        rank.step = step
        if done_step is not None:
            rank.done_step = done_step

    def is_lost(self, rank_id: str) -> bool:
        """True if the rank is known and LOST."""
        rank = self._ranks.get(rank_id)
        return rank is not None and rank.state is RankState.LOST

    def reap(self) -> list[str]:
        """Mark silent ranks LOST; return the ones newly lost."""
        deadline = time.monotonic() - self.timeout_s
        lost = []
        for rank in self._ranks.values():
            if rank.state is not RankState.LOST and rank.last_seen < deadline:
                rank.state = RankState.LOST
                lost.append(rank.rank_id)
        return lost

    @staticmethod
    def _info(rank: _Rank, now: float) -> RankInfo:
        return RankInfo(rank.rank_id, rank.address, rank.capacity, rank.state,
                        rank.weight_version, rank.step, rank.done_step,
                        round(now - rank.last_seen, 6))

    def infos(self) -> list[RankInfo]:
        """All ranks (LOST included), sorted by rank_id."""
        now = time.monotonic()
        return [self._info(r, now) for _, r in sorted(self._ranks.items())]

    def count_by_state(self) -> dict[str, int]:
        """Number of ranks per state value (for the `bubblespec_sync_ranks` gauge)."""
        return dict(Counter(r.state.value for r in list(self._ranks.values())))
