"""vLLM's token routes on the gateway, so that frameworks on vLLM's token-in/token-out API
(SkyRL's remote inference client, prime-rl's token client) switch by address.

- POST /inference/v1/generate  vLLM 0.32's token-in/token-out route: `token_ids`,
  `sampling_params` (vLLM's keys: `n`, `max_tokens`, `logprobs`, `seed`, penalties,
  `min_tokens`, `stop_token_ids`, ...), `output_mode` "tokens" or "text", `stream`; answers
  `choices` with `token_ids`, `finish_reason`, `stop_reason` and `logprobs.content` (per
  token its id and log-prob, `top_logprobs` the sampled token first, then by rank), `usage`,
  `prompt_token_ids` with `return_token_ids`. Each sample is one ask in the step batcher
  the fronts share (`gateway/fronts.py`), so these requests share rollout steps with the
  OpenAI and SGLang requests, hand prompts ahead (`next_prompts`, bubblespec's) and get
  drafts. `max_tokens` left out: what the context leaves the prompt, as vLLM's server sets
  it; a prompt that fills the context gets vLLM's message.
- POST /tokenize  `prompt` (with `add_special_tokens`, default true) or `messages` rendered
  with the chat template; answers `count`, `max_model_len`, `tokens`, `token_strs`.
- POST /detokenize  `tokens` -> `prompt` (the text, special tokens kept).

Errors are vLLM's (OpenAI's shape) with `param` naming the field; the routes need the
gateway's bearer token when one is configured (vLLM guards `/inference` with `--api-key`).
`routes.py` holds the routes, `serving.py` what they do; bodies in
`bubblespec/protocol/tokens.py`.
"""

from __future__ import annotations

from fastapi import FastAPI

from bubblespec.gateway.fronts import FrontServices
from bubblespec.gateway.tokens.routes import protected, public
from bubblespec.gateway.tokens.serving import TokensServing

__all__ = ["TokensServing", "install_tokens"]


def install_tokens(app: FastAPI, fronts: FrontServices) -> None:
    """Mount vLLM's token routes on the gateway's `app`."""
    app.state.tokens = TokensServing(fronts)
    app.include_router(protected)
    app.include_router(public)
