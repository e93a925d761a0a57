"""The trainer-API fronts' side of step batching (`bubblespec/batching.py` batches the calls).

Concurrent per-sample requests (SGLang's /generate from slime and AReaL, OpenAI's
completions from agentic frameworks) are batched by one `StepBatcher` with the
`equal_counts` rule for `n` and the gateway's quiet and max-wait cut. What is the fronts'
own: a planned step becomes a `RolloutRequest` (token ids or text, the callers' seeds when
every call brought one, log-probs always returned, since the clients read them), and a
failure reaches each caller as an `ApiError` (400 for a body the rollout refuses, 502 for
anything unexpected, an `ApiError` of the rollout as it is).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from bubblespec.batching import RunFn, Step, StepBatcher, equal_counts
from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.gateway import PromptIn, RolloutRequest, RolloutResponse

log = logging.getLogger("bubblespec.gateway.steps")

RolloutFn = Callable[[RolloutRequest], Awaitable[RolloutResponse]]
"""What a rollout step is run with (`Rollouts.rollout`)."""


def _prompt_in(p: Sequence[int] | str) -> PromptIn:
    return PromptIn(text=p) if isinstance(p, str) else PromptIn(input_ids=list(p))


def step_request(step: Step) -> RolloutRequest:
    """The rollout body of one planned step (a pydantic ValueError if a limit is broken)."""
    return RolloutRequest(
        prompts=[_prompt_in(p) for p in step.prompts], n=step.n,
        sampling_params=step.sampling, seeds=step.seeds,
        next_prompts=[[_prompt_in(p) for p in b] for b in step.next_prompts]
        if step.next_prompts else None,
        return_logprobs=True, top_logprobs=step.top_logprobs,
        pregen_window=step.pregen_window)


def run_steps(run: RolloutFn) -> RunFn:
    """`run` as the batcher's step function, its failures as the callers' `ApiError`."""

    async def run_step(step: Step) -> RolloutResponse:
        try:
            request = step_request(step)
        except ValueError as e:  # a pydantic limit of the rollout body
            raise ApiError(400, str(e), "input_ids") from e
        try:
            return await run(request)
        except ApiError:
            raise
        except Exception as e:  # each caller must hear of it, not the loop
            log.exception("rollout step of the step batcher failed")
            raise ApiError(502, f"rollout failed: {type(e).__name__}: {e}") from e

    return run_step


def step_batcher(run: RolloutFn, quiet_s: float = 0.05, max_wait_s: float = 1.0,
                 max_n: int = 1024) -> StepBatcher:
    """The step batcher the trainer-API fronts share."""
    return StepBatcher(run_steps(run), equal_counts(max_n), quiet_s=quiet_s,
                       max_wait_s=max_wait_s)
