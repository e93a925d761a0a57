"""The vLLM boundary of sampling: the protocol's `SamplingParams` of one sample become a
`vllm.SamplingParams` here and nowhere else.

Keyed sampling (`seed_mode: keyed`, temperature > 0) does not seed vLLM's sampler: the seed
travels in `extra_args` to the keyed sampler (`engine/keyed.py`), which draws keyed Gumbel
noise per (seed, position), or per context key with `seed_mode: keyed_context`.
"""

from __future__ import annotations

from typing import Any

from bubblespec.protocol.errors import InvalidRequest
from bubblespec.protocol.sampling import SamplingParams

#: `extra_args` key carrying a keyed sample's seed to the keyed sampler (`engine/keyed.py`).
KEY_ARG = "bubblespec_keyed_seed"
#: `extra_args` key set (True) when the keys are context keys (`seed_mode: keyed_context`).
CONTEXT_ARG = "bubblespec_keyed_context"
#: `extra_args` key: output position of the first generated token (a margin branch).
START_ARG = "bubblespec_keyed_start"


def vllm_sampling(sp: SamplingParams, seed: int | None, start: int = 0,
                  top_logprobs: int = 0) -> Any:
    """The vLLM sampling parameters of one sample seeded `seed` (None: unseeded), streaming
    token-id deltas with the sampled token's log-prob (and the `top_logprobs` most likely
    tokens'); keyed samples start at output position `start` (GenRequest.keyed_start)."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.sampling_params import RequestOutputKind

    if sp.keyed and seed is None:
        raise InvalidRequest("seeds", "keyed sampling needs one seed per sample")
    return VllmSamplingParams(
        n=1, temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k,
        repetition_penalty=sp.repetition_penalty, presence_penalty=sp.presence_penalty,
        frequency_penalty=sp.frequency_penalty, min_tokens=sp.min_tokens,
        max_tokens=sp.max_new_tokens, stop_token_ids=list(sp.stop_token_ids),
        ignore_eos=sp.ignore_eos, seed=None if sp.keyed else seed, logprobs=top_logprobs,
        detokenize=False, output_kind=RequestOutputKind.DELTA,
        extra_args=_keyed_args(sp, seed, start))


def vllm_scoring() -> Any:
    """The vLLM sampling parameters of a scoring request (`GenRequest.score`): the log-prob
    of each prompt token (`prompt_logprobs=0`: the prompt token's own, raw, before any
    temperature), and one greedy output token, because vLLM 0.32 refuses `max_tokens` < 1
    (the engine drops that token). The prompt log-probs skip the prefix cache (vLLM sets
    `skip_reading_prefix_cache` for them), so every prompt position is computed."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VllmSamplingParams(n=1, temperature=0.0, max_tokens=1, prompt_logprobs=0,
                              detokenize=False, output_kind=RequestOutputKind.DELTA)


def _keyed_args(sp: SamplingParams, seed: int | None, start: int = 0) -> dict | None:
    if not sp.keyed:
        return None
    args: dict = {KEY_ARG: seed, CONTEXT_ARG: True} if sp.keyed_by_context else {KEY_ARG: seed}
    if start:
        args[START_ARG] = int(start)
    return args
