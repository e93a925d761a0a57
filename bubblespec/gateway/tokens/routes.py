"""vLLM's token routes on the gateway (the package's docstring says what they answer)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from bubblespec.gateway.fronts import answer_json, for_caller, oai_error, parse, sse
from bubblespec.gateway.tokens.serving import TokensServing
from bubblespec.http.edge import protected_router
from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.tokens import DetokenizeIn, GenerateTokensIn, TokenizeIn

public = APIRouter()
protected = protected_router()


def serving(request: Request) -> TokensServing:
    return request.app.state.tokens


def _error(e: ApiError) -> JSONResponse:
    e = for_caller(e)
    return oai_error(e.status, e.detail, e.field)


def _stream(out: dict[str, Any], body: GenerateTokensIn) -> Response:
    """vLLM's generate stream, built from the whole answer (a choice is known when its step
    ends): per choice one chunk with its tokens, log-probs and finish reason, then the usage
    chunk if asked."""
    head = {"request_id": out["request_id"], "output_mode": out["output_mode"]}
    chunks: list[dict[str, Any]] = []
    for c in out["choices"]:
        chunk: dict[str, Any] = {**head, "choices": [c]}
        if not chunks and body.return_token_ids:
            chunk["prompt_token_ids"] = out["prompt_token_ids"]
        chunks.append(chunk)
    if body.stream_options is not None and body.stream_options.include_usage:
        chunks.append({**head, "choices": [], "usage": out["usage"]})
    return sse(chunks)


@protected.post("/inference/v1/generate")
async def generate(request: Request) -> Response:
    try:
        body = await parse(request, GenerateTokensIn)
        out = await serving(request).generate(body)
    except ApiError as e:
        return _error(e)
    return _stream(out, body) if body.stream else JSONResponse(out)


@protected.post("/tokenize")
async def tokenize(request: Request) -> JSONResponse:
    return await answer_json(request, TokenizeIn, serving(request).tokenize, _error)


@protected.post("/detokenize")
async def detokenize(request: Request) -> JSONResponse:
    return await answer_json(request, DetokenizeIn, serving(request).detokenize, _error)
