"""The OpenAI shapes of a request's choices: log-probs, choices, and the Server-Sent Events
stream (`stream: true`)."""

from __future__ import annotations

from typing import Any

from fastapi.responses import StreamingResponse

from bubblespec.gateway.fronts import FrontServices, chat_logprobs, position_entries, sse
from bubblespec.gateway.openai.choice import Choice
from bubblespec.gateway.openai.tools import ToolAnswer, tool_call_deltas
from bubblespec.gateway.scoring import PromptScore
from bubblespec.protocol.limits import clamp_logprob as _lp
from bubblespec.protocol.openai import (
    ChatChoice,
    ChatCompletionIn,
    ChatCompletionOut,
    ChatMessageOut,
    CompletionChoice,
    CompletionIn,
    CompletionLogprobs,
    CompletionOut,
    PromptLogprob,
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


Position = tuple[int, float | None, list[tuple[int, float]] | None]
"""A token of a completion's log-probs: its id, its log-prob (None: the first prompt token,
which has none) and its [token id, log-prob] entries in vLLM's order (the token first)."""


def completion_logprobs(f: FrontServices, positions: list[Position], n: int,
                        as_id: bool = False) -> CompletionLogprobs:
    """Log-probs in OpenAI's completion shape, as vLLM answers `logprobs: n`: per position
    a dict of the token and the n most likely ones (the first n + 1 entries of vLLM's list:
    n + 1 when the token is not among the top n); null for the first prompt token."""
    tokens = [_token(f, t, as_id) for t, _, _ in positions]
    top: list[dict[str, float] | None] = []
    for t, lp, entries in positions:
        if lp is None:
            top.append(None)
            continue
        top.append({_token(f, a, as_id): _lp(alp)
                    for a, alp in (entries or [(t, lp)])[:n + 1]})
    return CompletionLogprobs(text_offset=_offsets(tokens),
                              token_logprobs=[None if lp is None else _lp(lp)
                                              for _, lp, _ in positions],
                              tokens=tokens, top_logprobs=top)


def prompt_positions(ids: list[int], scored: PromptScore) -> list[Position]:
    """A scored prompt's positions (the first has no log-prob)."""
    return [(t, lp, None if scored.top is None else scored.top[i])
            for i, (t, lp) in enumerate(zip(ids, scored.logprobs))]


def choice_positions(ch: Choice) -> list[Position]:
    """A choice's generated positions."""
    return [(t, lp, position_entries(ch.top, i, t, lp))
            for i, (t, lp) in enumerate(zip(ch.ids, ch.logprobs))]


def vllm_prompt_logprobs(f: FrontServices, ids: list[int], scored: PromptScore,
                         ) -> list[dict[str, PromptLogprob] | None]:
    """A scored prompt as vLLM's `prompt_logprobs` of a choice: per position (the first
    null) the prompt token's and the most likely tokens' log-prob, rank and text, keyed by
    token id. Ranks: the prompt token's own, the alternatives' 1, 2, ... (vLLM's)."""
    out: list[dict[str, PromptLogprob] | None] = []
    for i, (t, lp) in enumerate(zip(ids, scored.logprobs)):
        if lp is None:
            out.append(None)
            continue
        own = None if scored.ranks is None else scored.ranks[i]
        entries = (scored.top[i] if scored.top is not None else None) or [(t, lp)]
        pos: dict[str, PromptLogprob] = {}
        for j, (a, alp) in enumerate(entries):
            # the alternatives come in rank order without the prompt token, which holds
            # its own rank among them when it is one of the most likely
            rank = own if j == 0 else j + int(own is not None and own <= j)
            pos.setdefault(str(a), PromptLogprob(logprob=_lp(alp), rank=rank,
                                                 decoded_token=f.decode([a], False)))
        out.append(pos)
    return out


def completion_choice(f: FrontServices, body: CompletionIn, ch: Choice, echo: str | None,
                      scored: PromptScore | None) -> CompletionChoice:
    """One choice as vLLM answers it: with `echo`, the prompt's text (`echo`) before the
    choice's and its tokens' log-probs before the choice's; the scored prompt's
    `prompt_logprobs` whenever it was scored."""
    logprobs = None
    if body.logprobs is not None:
        positions = choice_positions(ch)
        if echo is not None and scored is not None:
            positions = prompt_positions(ch.prompt_ids, scored) + positions
        logprobs = completion_logprobs(f, positions, body.num_top_logprobs,
                                       body.return_tokens_as_token_ids)
    return CompletionChoice(
        index=ch.index, text=ch.text if echo is None else echo + ch.text,
        finish_reason=ch.finish_reason, stop_reason=ch.stop_reason, logprobs=logprobs,
        token_ids=ch.ids if body.return_token_ids else None,
        prompt_token_ids=ch.prompt_ids if body.return_token_ids else None,
        prompt_logprobs=None if scored is None else vllm_prompt_logprobs(f, ch.prompt_ids,
                                                                         scored),
        bubblespec=ch.meta)


def chat_choice(f: FrontServices, body: ChatCompletionIn, ch: Choice,
                tools: ToolAnswer) -> ChatChoice:
    """One choice as vLLM answers it; its message's content and tool calls as the request's
    tool choice shapes them (`tools.py`)."""
    return ChatChoice(
        index=ch.index, message=ChatMessageOut(content=tools.content, tool_calls=tools.calls),
        finish_reason=tools.finish_reason or ch.finish_reason, stop_reason=ch.stop_reason,
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
        delta: dict[str, Any] = {"content": c.message.content}
        if c.message.tool_calls:
            delta["tool_calls"] = tool_call_deltas(c.message.tool_calls)
        last = {"index": c.index, "delta": delta,
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
