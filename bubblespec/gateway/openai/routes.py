"""OpenAI's HTTP routes on the gateway (the package's docstring says what they answer)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from bubblespec.gateway.fronts import for_caller, oai_error, parse
from bubblespec.gateway.openai.answers import chat_stream, completion_stream
from bubblespec.gateway.openai.serving import OpenAiServing
from bubblespec.http.edge import protected_router
from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.openai import ChatCompletionIn, CompletionIn, ModelCard, ModelList

public = APIRouter()
protected = protected_router()

def serving(request: Request) -> OpenAiServing:
    return request.app.state.openai


async def _answer(request: Request, model: type[Any],
                  run: Callable[[OpenAiServing, Any], Awaitable[Any]],
                  stream: Callable[[Any, Any], Response]) -> Response:
    """One route's shape: parse the body as `model`, run it, answer the errors in OpenAI's
    form (a 422 as 400, as vLLM does), stream it or answer it whole with `logprobs: null`
    kept on every choice (the openai client reads the key)."""
    try:
        body = await parse(request, model)
        if serving(request).fronts.config.return_token_ids and \
                "return_token_ids" not in body.model_fields_set:
            body = body.model_copy(update={"return_token_ids": True})
        out = await run(serving(request), body)
    except ApiError as e:
        e = for_caller(e)
        return oai_error(e.status, e.detail, e.field)
    if body.stream:
        return stream(out, body)
    return JSONResponse(out.model_dump(exclude_none=True) | {
        "choices": [c.model_dump(exclude_none=True) | {"logprobs": None if c.logprobs is None
                                                       else c.logprobs.model_dump()}
                    for c in out.choices]})


@protected.post("/v1/completions")
async def post_completions(request: Request) -> Response:
    return await _answer(request, CompletionIn, OpenAiServing.completions, completion_stream)


@protected.post("/v1/chat/completions")
async def post_chat_completions(request: Request) -> Response:
    return await _answer(request, ChatCompletionIn, OpenAiServing.chat_completions,
                         chat_stream)


@public.get("/v1/models")
async def models(request: Request) -> JSONResponse:
    f = serving(request).fronts
    name = await f.model_id()
    card = ModelCard(id=name, created=int(time.time()), root=name,
                     max_model_len=await f.context_len())
    return JSONResponse(ModelList(data=[card]).model_dump())
