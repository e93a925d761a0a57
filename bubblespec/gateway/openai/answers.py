"""The OpenAI shapes of a request's choices: log-probs, choices, and the Server-Sent Events
stream (`stream: true`)."""

from __future__ import annotations

from typing import Any

from fastapi.responses import StreamingResponse

from bubblespec.gateway.fronts import FrontServices, chat_logprobs, position_entries, sse
from bubblespec.gateway.fronts import clamp_logprob as _lp
from bubblespec.gateway.openai.choice import Choice
from bubblespec.protocol.openai import (
    ChatChoice,
    ChatCompletionIn,
    ChatCompletionOut,
    ChatMessageOut,
    CompletionChoice,
    CompletionIn,
    CompletionLogprobs,
    CompletionOut,
)


def _token(f: FrontServices, token_id: int, as_id: bool) -> str:
    """A token as the answer spells it: its text, or `token_id:<id>` (vLLM's
    `return_tokens_as_token_ids`)."""
    return f"token_id:{token_id}" if as_id else f.decode([token_id], False)


def _offsets(tokens: list[str]) -> list[int]:
    """Each token's offset in the concatenated text."""
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return offsets


def completion_logprobs(f: FrontServices, ch: Choice, n: int,
                        as_id: bool = False) -> CompletionLogprobs:
    """The tokens' log-probs in OpenAI's completion shape, as vLLM answers `logprobs: n`:
    per position a dict of the sampled token and the n most likely ones (the first n + 1
    entries of vLLM's list: n + 1 when the sampled token is not among the top n)."""
    tokens = [_token(f, t, as_id) for t in ch.ids]
    lps = [_lp(x) for x in ch.logprobs]
    top = [{_token(f, t, as_id): _lp(lp)
            for t, lp in position_entries(ch.top, i, ch.ids[i], ch.logprobs[i])[:n + 1]}
           for i in range(len(ch.ids))]
    return CompletionLogprobs(text_offset=_offsets(tokens), token_logprobs=list(lps),
                              tokens=tokens, top_logprobs=list(top))


def echo_logprobs(f: FrontServices, ids: list[int], logprobs: list[float | None],
                  as_id: bool = False) -> CompletionLogprobs:
    """A scored prompt's log-probs in OpenAI's completion shape, as vLLM answers `echo`:
    the first token's null (it has no context), `top_logprobs` the prompt token's own."""
    tokens = [_token(f, t, as_id) for t in ids]
    vals = [None if x is None else _lp(x) for x in logprobs]
    return CompletionLogprobs(
        text_offset=_offsets(tokens), token_logprobs=vals, tokens=tokens,
        top_logprobs=[None if v is None else {t: v} for t, v in zip(tokens, vals)])


def completion_choice(f: FrontServices, body: CompletionIn, ch: Choice) -> CompletionChoice:
    return CompletionChoice(
        index=ch.index, text=ch.text, finish_reason=ch.finish_reason,
        stop_reason=ch.stop_reason,
        logprobs=completion_logprobs(f, ch, body.num_top_logprobs,
                                     body.return_tokens_as_token_ids)
        if body.logprobs is not None else None,
        token_ids=ch.ids if body.return_token_ids else None,
        prompt_token_ids=ch.prompt_ids if body.return_token_ids else None, bubblespec=ch.meta)


def chat_choice(f: FrontServices, body: ChatCompletionIn, ch: Choice) -> ChatChoice:
    return ChatChoice(
        index=ch.index, message=ChatMessageOut(content=ch.text),
        finish_reason=ch.finish_reason, stop_reason=ch.stop_reason,
        logprobs=chat_logprobs(f, ch.ids, ch.logprobs, ch.top, body.num_top_logprobs,
                               body.return_tokens_as_token_ids)
        if body.logprobs else None,
        token_ids=ch.ids if body.return_token_ids else None, bubblespec=ch.meta)


def completion_stream(out: CompletionOut, body: CompletionIn) -> StreamingResponse:
    """The answer as OpenAI's stream: one chunk per choice, the usage chunk if asked."""
    head = {"id": out.id, "object": "text_completion", "created": out.created,
            "model": out.model}
    chunks = [{**head, "choices": [c.model_dump(exclude_none=True) | {
        "logprobs": None if c.logprobs is None else c.logprobs.model_dump(),
        "finish_reason": c.finish_reason}]} for c in out.choices]
    if body.include_usage and out.usage is not None:
        chunks.append({**head, "choices": [], "usage": out.usage.model_dump()})
    return sse(chunks)


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
    return sse(chunks)
