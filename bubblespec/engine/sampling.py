"""The vLLM boundary of sampling: the protocol's `SamplingParams` of one sample become a
`vllm.SamplingParams` here and nowhere else.

Keyed sampling (`seed_mode: keyed`, temperature > 0) does not seed vLLM's sampler: the seed
travels in `extra_args` to the keyed sampler (`engine/keyed.py`), which draws keyed Gumbel
noise per (seed, position), or per context key with `seed_mode: keyed_context`. min_p and
logit_bias travel in `extra_args` too (vLLM refuses them in a speculating engine's requests).
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
#: `extra_args` keys of min_p and logit_bias ([token id, bias] pairs): vLLM refuses both
#: fields in a request to an engine that speculates, so they travel here to vLLM's own
#: processors, loaded from them (`vllm_glue.install_min_p_and_logit_bias`).
MIN_P_ARG = "bubblespec_min_p"
BIAS_ARG = "bubblespec_logit_bias"


def min_p_of(extra: dict | None) -> float:
    """A request's min_p, from its `extra_args` (0: off)."""
    return float((extra or {}).get(MIN_P_ARG, 0.0))


def logit_bias_of(extra: dict | None) -> dict[int, float] | None:
    """A request's logit bias, from its `extra_args` (None: none)."""
    pairs = (extra or {}).get(BIAS_ARG)
    return {int(t): float(b) for t, b in pairs} if pairs else None


def drafts_off(extra: dict | None) -> bool:
    """The request samples with min_p or logit_bias, which vLLM's sampler applies and its
    speculative verification does not: it must decode without drafts."""
    return bool(extra) and (MIN_P_ARG in extra or BIAS_ARG in extra)


def vllm_sampling(sp: SamplingParams, seed: int | None, start: int = 0,
                  top_logprobs: int = 0) -> Any:
    """The vLLM sampling parameters of one sample seeded `seed` (None: unseeded), streaming
    token-id deltas with the sampled token's log-prob (and the `top_logprobs` most likely
    tokens'); keyed samples start at output position `start` (GenRequest.keyed_start)."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    if sp.keyed and seed is None:
        raise InvalidRequest("seeds", "keyed sampling needs one seed per sample")
    return VllmSamplingParams(
        n=1, temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k,
        repetition_penalty=sp.repetition_penalty, presence_penalty=sp.presence_penalty,
        frequency_penalty=sp.frequency_penalty, min_tokens=sp.min_tokens,
        max_tokens=sp.max_new_tokens, stop_token_ids=list(sp.stop_token_ids),
        ignore_eos=sp.ignore_eos, seed=None if sp.keyed else seed, logprobs=top_logprobs,
        allowed_token_ids=list(sp.allowed_token_ids) or None,
        bad_words=list(sp.bad_words) or None,
        structured_outputs=None if sp.structured is None
        else StructuredOutputsParams(**sp.structured.vllm_kwargs()),
        detokenize=False, output_kind=RequestOutputKind.DELTA,
        extra_args=_extra_args(sp, seed, start))


def vllm_scoring(top_logprobs: int = 0) -> Any:
    """The vLLM sampling parameters of a scoring request (`GenRequest.score`): the log-prob
    and rank of each prompt token (`prompt_logprobs`: the prompt token's own, raw, before any
    temperature, and the `top_logprobs` most likely tokens'), and one greedy output token, because vLLM 0.32 refuses `max_tokens` < 1
    (the engine drops that token). The prompt log-probs skip the prefix cache (vLLM sets
    `skip_reading_prefix_cache` for them), so every prompt position is computed."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VllmSamplingParams(n=1, temperature=0.0, max_tokens=1,
                              prompt_logprobs=top_logprobs,
                              detokenize=False, output_kind=RequestOutputKind.DELTA)


def _extra_args(sp: SamplingParams, seed: int | None, start: int = 0) -> dict | None:
    args: dict = {}
    if sp.keyed:
        args[KEY_ARG] = seed
        if sp.keyed_by_context:
            args[CONTEXT_ARG] = True
        if start:
            args[START_ARG] = int(start)
    if sp.min_p > 0:
        args[MIN_P_ARG] = sp.min_p
    if sp.logit_bias:
        args[BIAS_ARG] = [[t, b] for t, b in sp.logit_bias]
    return args or None
