"""Prompt scoring on the gateway: the model's log-probability of each prompt token, without
generating (SGLang's `/generate` with `max_new_tokens: 0` and `return_logprob`, OpenAI's
`/v1/completions` with `echo` and `max_tokens: 0`).

Scoring is not a rollout step: a scoring call goes straight to one ready rank's
`POST /v1/score`, outside the step batcher. It takes no step number and so does not count in
the steps' figures (`steps_run`, step timelines, rollout counters); it starts no
pre-generation, fetches no drafts, and runs on the rank's engine beside whatever that engine
runs now (vLLM batches it with a running shard or pre-generation). Ranks that are not
decoding a step are tried first, in turn, so that scoring slows a step as little as it can;
a rank that fails is skipped for the next one, and a body a rank refuses (400) is the
caller's error, named by the caller's field.

A scoring call that kills an engine is a poison request as a rollout is (`quarantine.py`):
the death counts against the call's prompts, the call may go to one more rank, and a prompt
present at two engine deaths is quarantined: a 500 naming it, no further rank gets it, and
the same scoring call is refused with a 4xx while the quarantine lasts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import ValidationError

from bubblespec.gateway.config import GatewayConfig
from bubblespec.gateway.errors import RankCallError
from bubblespec.gateway.quarantine import Quarantine, scoring_fingerprint
from bubblespec.gateway.ranks import Discovery, RankPool
from bubblespec.metrics.gateway import GatewayMetrics
from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.rank import ScoreResult

log = logging.getLogger("bubblespec.gateway.scoring")


@dataclass
class PromptScore:
    """One scored prompt: per token its log-prob and rank (the first None) and, when asked
    for, [token id, log-prob] of the prompt token and the most likely ones (vLLM's order)."""

    logprobs: list[float | None]
    ranks: list[int | None] | None
    top: list[list[tuple[int, float]] | None] | None


@dataclass
class Scored:
    """The answer of one scoring call: per prompt, one log-prob per token (the first None),
    each token's rank, the top alternatives when asked for (`ScoredPrompt`), and the weight
    version of the rank that scored them."""

    logprobs: list[list[float | None]]
    weight_version: int
    rank_id: str
    ranks: list[list[int | None] | None]
    top: list[list[list[tuple[int, float]] | None] | None]

    def prompt(self, i: int) -> PromptScore:
        """Prompt i's scores."""
        return PromptScore(self.logprobs[i], self.ranks[i], self.top[i])


class ScoringRanks(Protocol):
    """What scoring needs of the gateway's rollouts (`rollout.Rollouts` is one): the ranks,
    their discovery, the quarantine and its counters, and the engine-death bookkeeping."""

    config: GatewayConfig
    pool: RankPool
    quarantine: Quarantine
    metrics: GatewayMetrics

    async def discover(self) -> Discovery: ...

    def engine_died(self, rank_id: str, reason: str,
                    reqs: dict[int, tuple[str, str]]) -> tuple[int, str] | None: ...


class Scorer:
    """Sends scoring calls to the ranks (see the module's docstring)."""

    def __init__(self, rollouts: ScoringRanks) -> None:
        self.rollouts = rollouts
        self._turn = 0
        self.calls = 0
        """Scoring calls answered (the status page and tests read it)."""

    async def score(self, prompts: Sequence[Sequence[int]],
                    field_of: Callable[[str], str] = lambda f: f, top: int = 0) -> Scored:
        """Score `prompts` (token ids) on one ready rank, with the `top` most likely tokens
        of each position. `field_of` spells a field of the rank's body (`input_ids[2][5]`)
        as the caller's request does. ApiError: 400 naming
        the field for too many prompts, a sequence longer than the gateway's
        `max_prompt_tokens + max_new_tokens` or a prompt a rank refuses (vocabulary, model
        length), 503 when no rank is ready or all failed."""
        rollouts = self.rollouts
        c = rollouts.config
        if len(prompts) > c.max_prompts:
            raise ApiError(400, f"at most {c.max_prompts} prompts per call", field_of("input_ids"))
        longest = c.max_prompt_tokens + c.max_new_tokens  # a prompt and its response
        for i, p in enumerate(prompts):
            if len(p) > longest:
                where = field_of(f"input_ids[{i}]")
                raise ApiError(400, f"{where}: {len(p)} tokens; a scored sequence has at most "
                                    f"max_prompt_tokens + max_new_tokens = {longest}", where)
        fps = [scoring_fingerprint(p) for p in prompts]
        try:
            rollouts.quarantine.check_fingerprints(fps, lambda i: field_of(f"input_ids[{i}]"))
        except ApiError:
            rollouts.metrics.quarantine_refused.inc()
            raise
        d = await rollouts.discover()
        ready = d.ready
        if not ready:
            raise ApiError(503, "no rank is ready to score prompts", "ranks")
        self._turn += 1
        k = self._turn % len(ready)
        turn = ready[k:] + ready[:k]
        order = sorted(turn, key=lambda r: r.state == "decoding")  # stable: in turn
        body = {"input_ids": [list(p) for p in prompts], "top_logprobs": top}
        errors = []
        for ep in order:
            try:
                reply = await rollouts.pool.post(ep, "/v1/score", body,
                                                 rollouts.config.rollout_timeout_s)
            except RankCallError as e:
                if e.bad_request:
                    raise _caller_error(e, field_of) from None
                log.warning("scoring on rank %s failed: %s", ep.rank_id, e.message)
                errors.append(str(e))
                if e.engine_died:
                    self._engine_died(ep.rank_id, e.message, prompts, fps, field_of)
                continue
            try:
                res = ScoreResult.model_validate(reply)
            except ValidationError as e:
                errors.append(f"rank {ep.rank_id}: malformed /v1/score reply: {e}")
                continue
            lps = [r.prompt_logprobs for r in res.results]
            if [len(x) for x in lps] != [len(p) for p in prompts] or (top and any(
                    r.prompt_top_logprobs is None for r in res.results)):
                errors.append(f"rank {ep.rank_id}: /v1/score reply does not match the prompts")
                continue
            self.calls += 1
            rollouts.quarantine.cleared(fps)
            return Scored(lps, res.weight_version, res.rank_id,
                          [r.prompt_ranks for r in res.results],
                          [r.prompt_top_logprobs for r in res.results])
        raise ApiError(503, "scoring failed on every ready rank: " + "; ".join(errors),
                       "ranks")


    def _engine_died(self, rank_id: str, reason: str, prompts: Sequence[Sequence[int]],
                     fps: list[str], field_of: Callable[[str], str]) -> None:
        """Count an engine death against the call's prompts; ApiError 500 naming the first
        prompt now quarantined (then no further rank gets the call)."""
        reqs = {i: (fp, f"scoring call {field_of(f'input_ids[{i}]')} ({len(p)} tokens)")
                for i, (fp, p) in enumerate(zip(fps, prompts, strict=True))}
        got = self.rollouts.engine_died(rank_id, reason, reqs)
        if got is not None:
            first, names = got
            raise ApiError(500, f"{names}: quarantined for "
                                f"{self.rollouts.quarantine.hold_s:g} s (refused until then) "
                                "and sent to no further rank", field_of(f"input_ids[{first}]"))


def _caller_error(e: RankCallError, field_of: Callable[[str], str]) -> ApiError:
    """A rank's 400 for a scoring body, as a 400 naming the caller's field."""
    detail = e.message.split(": ", 2)[-1]  # "POST /v1/score: HTTP 400: <detail>"
    where = field_of(e.field) if e.field else "input_ids"
    if e.field and detail.startswith(f"{e.field}: "):
        detail = detail.removeprefix(f"{e.field}: ")
    return ApiError(400, f"{where}: {detail}", where)


def rank_field_batched(batched: bool) -> Callable[[str], str]:
    """The caller's spelling of a rank field `input_ids[i]...` when the caller sent one
    prompt (`input_ids...`, the index dropped) or a batch (kept as it is)."""
    def field_of(f: str) -> str:
        if batched or not f.startswith("input_ids[0]"):
            return f
        return "input_ids" + f.removeprefix("input_ids[0]")
    return field_of
