"""OpenAI's completion API on the gateway, so that agentic RL frameworks switch by address.

SkyRL, ART, rLLM and prime-rl drive vLLM through `POST /v1/completions` and
`POST /v1/chat/completions` and read token ids and log-probs back; these routes answer them
in OpenAI's shapes with vLLM's extensions (bodies in `bubblespec.protocol.openai`):

- POST /v1/completions  `prompt` as text, token ids, or a list of either; `n` choices per
  prompt, indexed prompt-major (choice `i * n + k` is sample k of prompt i); `echo` with
  `max_tokens: 0` scores the prompts instead (`OpenAiServing.scored_completion`,
  `scoring.py`: no step);
- POST /v1/chat/completions  `messages` rendered with the model's chat template
  (`chat_template.py`; a model without one is a 400 naming `messages`), then sampled as
  token ids;
- GET /v1/models  the one model the ranks serve.

Each choice is one `Ask` in the step batcher the fronts share (`gateway/fronts.py`), so
concurrent OpenAI and SGLang requests are batched into the same rollout steps, and the next-prompts hint (`next_prompts` in a body, or POST /v1/next_prompts) goes
with the next step that starts. `seed` gives choice k of each prompt the seed `seed + k`,
as the SGLang API does; without it the gateway derives seeds from its run seed (and a step
that mixes seeded and unseeded samples uses derived seeds for all: `Step.seeds`).

Stop strings (`stop`) are applied after sampling: a choice is sampled with the stop token
ids as given, then its text is decoded token by token and cut at the first stop string;
the token ids and log-probs returned are those up to and including the token that
completed the stop string, with finish_reason "stop" and `stop_reason` the string. This is
what vLLM returns (it checks the same decoded text after each token and stops there), and
it does not change the distribution of what is returned: the tokens before the cut were
sampled exactly as they would have been by a sampler that stopped there, and none after it
is returned (a string stop only costs the compute of the tokens sampled past it).

finish_reason: "stop" (a stop token, EOS or a stop string), "length", or "abort" (the
request was aborted, as vLLM reports it). Each choice also carries `bubblespec`: the step
that ran it, the weight version that sampled it and its speculation counters (clients
ignore unknown keys; an RL framework can read the policy version of each sample). With `stream: true` the answer is OpenAI's
Server-Sent Events chunks ending with `data: [DONE]`; a choice is known only when its
rollout step ends, so the chunks are sent then (each choice in one content chunk), not
token by token.

Errors are OpenAI's `{"error": {"message", "type", "param", "code"}}` (with the gateway's
`detail` and `field` beside it); anything the caller got wrong is a 400 whose `param`
names the field. The POST routes need the gateway's bearer token when one is configured,
like the SGLang API's mutating routes (OpenAI clients send it as their API key).

`routes.py` holds the routes and the error shape, `serving.py` what they do, `answers.py`
OpenAI's shapes of the choices (`choice.py`).
"""

from __future__ import annotations

from fastapi import FastAPI

from bubblespec.gateway.fronts import FrontServices
from bubblespec.gateway.openai.routes import protected, public
from bubblespec.gateway.openai.serving import OpenAiServing

__all__ = ["OpenAiServing", "install_openai"]


def install_openai(app: FastAPI, fronts: FrontServices) -> None:
    """Mount the OpenAI-compatible routes on the gateway's `app`."""
    app.state.openai = OpenAiServing(fronts)
    app.include_router(protected)
    app.include_router(public)
