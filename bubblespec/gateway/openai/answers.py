"""The OpenAI shapes of a request's choices: log-probs, choices, and the Server-Sent Events
stream (`stream: true`)."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from bubblespec.gateway.fronts import FrontServices
from bubblespec.gateway.openai.choice import Choice
from bubblespec.protocol.openai import (
    ChatChoice,
    ChatCompletionIn,
    ChatCompletionOut,
    ChatLogprobs,
    ChatMessageOut,
    ChatTokenLogprob,
    CompletionChoice,
    CompletionIn,
    CompletionLogprobs,
    CompletionOut,
)

MIN_LOGPROB = -9999.0
"""Log-probs below this (-inf) are sent as this, as vLLM and OpenAI do (JSON has no inf)."""


def _lp(x: float) -> float:
    return MIN_LOGPROB if math.isnan(x) else max(float(x), MIN_LOGPROB)


def _tokens(f: FrontServices, ids: list[int]) -> tuple[list[str], list[int]]:
    """Each token's text and its offset in the concatenated text."""
    tokens = [f.decode([t], False) for t in ids]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return tokens, offsets


def completion_logprobs(f: FrontServices, ch: Choice) -> CompletionLogprobs:
    """The sampled tokens' log-probs in OpenAI's completion shape (`top_logprobs` holds the
    sampled token, what vLLM returns for `logprobs: 0`)."""
    tokens, offsets = _tokens(f, ch.ids)
    lps = [_lp(x) for x in ch.logprobs]
    return CompletionLogprobs(text_offset=offsets, token_logprobs=list(lps), tokens=tokens,
                              top_logprobs=[{t: lp} for t, lp in zip(tokens, lps)])


def echo_logprobs(f: FrontServices, ids: list[int],
                  logprobs: list[float | None]) -> CompletionLogprobs:
    """A scored prompt's log-probs in OpenAI's completion shape, as vLLM answers `echo`:
    the first token's null (it has no context), `top_logprobs` the prompt token's own."""
    tokens, offsets = _tokens(f, ids)
    vals = [None if x is None else _lp(x) for x in logprobs]
    return CompletionLogprobs(
        text_offset=offsets, token_logprobs=vals, tokens=tokens,
        top_logprobs=[None if v is None else {t: v} for t, v in zip(tokens, vals)])


def chat_logprobs(f: FrontServices, ch: Choice) -> ChatLogprobs:
    content = []
    for t, lp in zip(ch.ids, ch.logprobs):
        tok = f.decode([t], False)
        content.append(ChatTokenLogprob(token=tok, logprob=_lp(lp),
                                        bytes=list(tok.encode("utf-8", errors="replace"))))
    return ChatLogprobs(content=content)


def completion_choice(f: FrontServices, body: CompletionIn, ch: Choice) -> CompletionChoice:
    return CompletionChoice(
        index=ch.index, text=ch.text, finish_reason=ch.finish_reason,
        stop_reason=ch.stop_reason,
        logprobs=completion_logprobs(f, ch) if body.logprobs is not None else None,
        token_ids=ch.ids if body.return_token_ids else None,
        prompt_token_ids=ch.prompt_ids if body.return_token_ids else None, bubblespec=ch.meta)


def chat_choice(f: FrontServices, body: ChatCompletionIn, ch: Choice) -> ChatChoice:
    return ChatChoice(
        index=ch.index, message=ChatMessageOut(content=ch.text),
        finish_reason=ch.finish_reason, stop_reason=ch.stop_reason,
        logprobs=chat_logprobs(f, ch) if body.logprobs else None,
        token_ids=ch.ids if body.return_token_ids else None, bubblespec=ch.meta)


def _sse(chunks: list[dict[str, Any]]) -> StreamingResponse:
    async def events() -> AsyncIterator[bytes]:
        for c in chunks:
            yield f"data: {json.dumps(c)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


def completion_stream(out: CompletionOut, body: CompletionIn) -> StreamingResponse:
    """The answer as OpenAI's stream: one chunk per choice, the usage chunk if asked."""
    head = {"id": out.id, "object": "text_completion", "created": out.created,
            "model": out.model}
    chunks = [{**head, "choices": [c.model_dump(exclude_none=True) | {
        "logprobs": None if c.logprobs is None else c.logprobs.model_dump(),
        "finish_reason": c.finish_reason}]} for c in out.choices]
    if body.include_usage and out.usage is not None:
        chunks.append({**head, "choices": [], "usage": out.usage.model_dump()})
    return _sse(chunks)


def chat_stream(out: ChatCompletionOut, body: ChatCompletionIn) -> StreamingResponse:
    """The answer as OpenAI's chat stream: per choice a role chunk, then one content chunk
    with its log-probs and finish reason; the usage chunk if asked."""
    head = {"id": out.id, "object": "chat.completion.chunk", "created": out.created,
            "model": out.model}
    chunks: list[dict[str, Any]] = []
    for c in out.choices:
        first: dict[str, Any] = {**head, "choices": [{
            "index": c.index, "delta": {"role": "assistant", "content": ""},
            "logprobs": None, "finish_reason": None}]}
        if body.return_token_ids and not chunks:
            first["prompt_token_ids"] = out.prompt_token_ids
        last = {"index": c.index, "delta": {"content": c.message.content},
                "logprobs": None if c.logprobs is None else c.logprobs.model_dump(),
                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
        if c.token_ids is not None:
            last["token_ids"] = c.token_ids
        if c.bubblespec is not None:
            last["bubblespec"] = c.bubblespec
        chunks += [first, {**head, "choices": [last]}]
    if body.include_usage and out.usage is not None:
        chunks.append({**head, "choices": [], "usage": out.usage.model_dump()})
    return _sse(chunks)
