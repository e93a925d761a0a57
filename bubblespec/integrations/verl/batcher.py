"""verl's side of step batching (`bubblespec/batching.py` batches the calls).

verl's agent loop sends one `generate(prompt_ids, sampling_params)` per trajectory, all at
once; the next-batch hook announces each batch (`StepBatcher.expect`: how many calls, the
next batch's prompt ids). What is verl's own: its sampling dict (`verl_sampling`), the
`gcd_of_counts` rule for `n` with the `linger_s` / `idle_s` cut (`verl_batcher`), and the
sample order of verl's `full_determinism` request ids (`verl_ask`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bubblespec.batching import Ask, RunFn, StepBatcher, gcd_of_counts
from bubblespec.protocol.gateway import RolloutSample
from bubblespec.protocol.sampling import SamplingParams, SeedMode

_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty", "ignore_eos",
                  "stop_token_ids")


def verl_sampling(params: Mapping[str, Any], default_max_new_tokens: int,
                  seed_mode: SeedMode | None = None) -> tuple[SamplingParams, bool]:
    """verl's sampling dict (what `AgentLoopWorker` sends: temperature, top_p, top_k,
    repetition_penalty, logprobs; optionally max_tokens / max_new_tokens) as bubblespec's
    `SamplingParams`, and whether log-probs were asked for. An unknown key is a ValueError
    naming it, rather than a setting silently dropped."""
    p = dict(params)
    logprobs = bool(p.pop("logprobs", False))
    max_new = p.pop("max_tokens", None)
    if max_new is None:
        max_new = p.pop("max_new_tokens", None)
    unknown = sorted(set(p) - set(_SAMPLING_KEYS))
    if unknown:
        raise ValueError(f"sampling_params: bubblespec does not support {', '.join(unknown)}")
    if "stop_token_ids" in p:
        p["stop_token_ids"] = tuple(int(t) for t in p["stop_token_ids"] or ())
    if seed_mode is not None:  # unset: the gateway's choice
        p["seed_mode"] = seed_mode
    sp = SamplingParams(max_new_tokens=max(1, int(max_new or default_max_new_tokens)), **p)
    return sp, logprobs


def sample_order(request_id: str) -> int:
    """Where a call goes among its prompt's samples: verl's `full_determinism` request ids
    (`det-<index in the batch>`) in batch order, others as they arrived (a stable sort), so
    that with keyed sampling each trajectory gets the same seed in every run."""
    rid = request_id
    return int(rid[4:]) if rid.startswith("det-") and rid[4:].isdigit() else -1


def verl_ask(prompt_ids: Sequence[int], sampling: SamplingParams, request_id: str = "") -> Ask:
    """One trajectory's `generate` call as an asked sample."""
    return Ask(tuple(int(t) for t in prompt_ids), sampling, rid=request_id,
               order=sample_order(request_id))


def verl_batcher(run: RunFn, linger_s: float = 0.05, idle_s: float = 10.0) -> StepBatcher:
    """The step batcher of verl's calls: `linger_s` closes an unannounced batch (a
    multi-turn agent's later turns, a plain `AgentLoopManager`), `idle_s` an announced one
    short of its count."""
    return StepBatcher(run, gcd_of_counts, quiet_s=linger_s, idle_s=idle_s)


async def submit(batcher: StepBatcher, prompt_ids: Sequence[int], sampling: SamplingParams,
                 request_id: str = "") -> tuple[int, RolloutSample]:
    """Queue one call; its (step, sample) once its step ran."""
    (ans,) = await batcher.generate([verl_ask(prompt_ids, sampling, request_id)])
    if ans.sample is None or ans.step is None:  # aborted: verl's adapter never aborts
        raise RuntimeError(f"generate {request_id!r}: {ans.message or 'no sample'}")
    return ans.step, ans.sample
