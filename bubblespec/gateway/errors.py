"""The error of a call to a rank, as the gateway's callers of the ranks see it (the pool
raises it, dispatch, rollouts and scoring read it)."""

from __future__ import annotations


class RankCallError(Exception):
    """A call to a rank failed. `bad_request`: the rank refused the body (400/422), which
    re-running elsewhere would not fix; `engine_died`: the rank's engine died while it ran
    the call (the rank says so with `ENGINE_DIED_HEADER`); anything else counts as a rank
    failure."""

    def __init__(self, rank_id: str, message: str, status: int | None = None,
                 field_: str = "", bad_request: bool = False, engine_died: bool = False
                 ) -> None:
        super().__init__(f"rank {rank_id}: {message}")
        self.rank_id = rank_id
        self.message = message
        self.status = status
        self.field = field_
        self.bad_request = bad_request
        self.engine_died = engine_died
