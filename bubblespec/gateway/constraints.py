"""Structured-output constraints (and bad words) checked on a rank before a step takes them.

Whether a constraint (a JSON schema, a regex, a grammar) can be built is the ranks' vLLM
backend's to say, and the gateway runs no vLLM. A step shard the rank refuses fails the
whole step, every caller batched into it, so a request with a constraint is first checked on
one ready rank (`POST /v1/check_sampling`, nothing runs there): a constraint the backend
cannot build is that caller's 400, naming the caller's field, and never reaches a step. The
answer is kept per constraint (every rank serves the same model with the same backend), so
a constraint sent again costs nothing. Bad words are the same case: the ranks' tokenizer
decides whether each one tokenizes.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Protocol

from bubblespec.gateway.config import GatewayConfig
from bubblespec.gateway.errors import RankCallError
from bubblespec.gateway.ranks import Discovery, RankPool
from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.sampling import SamplingParams, StructuredOutput

log = logging.getLogger("bubblespec.gateway.constraints")

KEPT = 1024
"""Constraints whose answer is kept (least recently asked dropped first)."""
CHECK_TIMEOUT_S = 60.0
"""Deadline of one rank's check (a large JSON schema compiles for seconds on a CPU)."""


class ConstraintRanks(Protocol):
    """What the check needs of the gateway's rollouts (`rollout.Rollouts` is one)."""

    config: GatewayConfig
    pool: RankPool

    async def discover(self) -> Discovery: ...


class ConstraintCheck:
    """Checks constraints on a ready rank and keeps the answers (see the module)."""

    def __init__(self, ranks: ConstraintRanks) -> None:
        self.ranks = ranks
        self.kept: OrderedDict[tuple[StructuredOutput | None, tuple[str, ...]],
                              tuple[str, str] | None] = OrderedDict()
        self.asked = 0
        """Checks that went to a rank."""

    async def check(self, sp: SamplingParams, field: str,
                    bad_words_field: str = "bad_words") -> None:
        """ApiError 400 naming `field` when the ranks' backend cannot build `sp`'s
        constraint, `bad_words_field` when a bad word does not tokenize; 503 when no rank
        is ready or none answered."""
        if sp.structured is None and not sp.bad_words:
            return
        c = (sp.structured, sp.bad_words)
        if c not in self.kept:
            self.kept[c] = await self._ask(sp)
            while len(self.kept) > KEPT:
                self.kept.popitem(last=False)
        self.kept.move_to_end(c)
        refused = self.kept[c]
        if refused is not None:
            which, why = refused
            where = bad_words_field if which.endswith("bad_words") else field
            raise ApiError(400, f"{where}: {why}", where)

    async def _ask(self, sp: SamplingParams) -> tuple[str, str] | None:
        """(the rank's field, its refusal) of `sp` (None: taken)."""
        ranks = self.ranks
        d = await ranks.discover()
        if not d.ready:
            raise ApiError(503, "no rank is ready to check the structured-output constraint",
                           "ranks")
        body = {"sampling_params": sp.model_copy(update={"max_new_tokens": 1, "min_tokens": 0})
                .model_dump(mode="json")}
        errors = []
        for ep in d.ready:
            try:
                await ranks.pool.post(ep, "/v1/check_sampling", body,
                                      min(CHECK_TIMEOUT_S, ranks.config.rollout_timeout_s))
            except RankCallError as e:
                if e.bad_request:
                    self.asked += 1
                    return e.field, e.message.split(": ", 2)[-1].removeprefix(f"{e.field}: ")
                log.warning("constraint check on rank %s failed: %s", ep.rank_id, e.message)
                errors.append(str(e))
                continue
            self.asked += 1
            return None
        raise ApiError(503, "the constraint check failed on every ready rank: "
                            + "; ".join(errors), "ranks")
