"""Tool calls of chat choices, as vLLM's server answers them.

- tool_choice "required" and a named tool: the choice was constrained to vLLM's JSON schema
  of the calls (`protocol.openai.tool_calls_schema`, through structured outputs): a named
  tool's output is its arguments; "required"'s is a list of {name, parameters}. The message
  carries the calls and empty content; finish reason "tool_calls" for "required" (when the
  choice stopped), the choice's own for a named tool (OpenAI's and vLLM's rule). An output
  that does not parse (cut by max_tokens) carries no calls, as in vLLM.
- tool_choice "auto" (the default with `tools`), served when the gateway runs with
  `--enable-auto-tool-choice --tool-call-parser NAME`: vLLM's own parser runs on a rank
  (`rank/tool_calls.py`, `POST /v1/tool_calls`: the gateway runs no vLLM) over each choice's
  tokens; finish reason "tool_calls" when it found calls.
- "none" or no tools: plain content.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from bubblespec.gateway.errors import RankCallError
from bubblespec.gateway.fronts import FrontServices
from bubblespec.gateway.openai.choice import Choice
from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.openai import (
    AUTO_TOOLS_REFUSED,
    ChatCompletionIn,
    FunctionCallOut,
    ToolCallOut,
)
from bubblespec.protocol.rank import ParsedToolCalls

log = logging.getLogger("bubblespec.gateway.openai.tools")

PARSE_TIMEOUT_S = 60.0
"""Deadline of one rank's parse of a request's choices."""


@dataclass
class ToolAnswer:
    """A choice's message as tools shape it: its content, calls and finish reason."""

    content: str | None
    calls: list[ToolCallOut] = field(default_factory=list)
    finish_reason: str | None = None
    """None: the choice's own."""


def check_tools(f: FrontServices, body: ChatCompletionIn) -> None:
    """vLLM's refusal of tool_choice "auto" when no parser is configured."""
    c = f.config
    if body.tool_mode == "auto" and not (c.enable_auto_tool_choice and c.tool_call_parser):
        raise ApiError(400, AUTO_TOOLS_REFUSED, "tool_choice")


def _call(name: str, arguments: str) -> ToolCallOut:
    return ToolCallOut(id=f"chatcmpl-tool-{uuid.uuid4().hex}",
                       function=FunctionCallOut(name=name, arguments=arguments))


def _required(text: str) -> list[ToolCallOut]:
    """The calls of a "required" output: a JSON list of {name, parameters}; none when it
    does not parse (vLLM's rule)."""
    try:
        items = json.loads(text)
    except ValueError:
        return []
    if not isinstance(items, list) or not all(
            isinstance(x, dict) and isinstance(x.get("name"), str) for x in items):
        return []
    return [_call(x["name"], json.dumps(x.get("parameters"), ensure_ascii=False))
            for x in items]


async def tool_answers(f: FrontServices, body: ChatCompletionIn,
                       choices: list[Choice]) -> list[ToolAnswer]:
    """Each choice's message under the request's tool choice (see the module)."""
    mode = body.tool_mode
    if mode == "none":
        return [ToolAnswer(ch.text) for ch in choices]
    if mode == "named":
        name = body.named_tool or ""
        return [ToolAnswer("", [_call(name, ch.text)] if ch.text.strip() else [])
                for ch in choices]
    if mode == "required":
        out = []
        for ch in choices:
            calls = _required(ch.text)
            out.append(ToolAnswer("", calls, "tool_calls" if ch.finish_reason == "stop"
                                  else None))
        return out
    parsed = await _parse_on_a_rank(f, body, choices)
    return [ToolAnswer(p.content, [ToolCallOut(id=c.id, function=FunctionCallOut(
        name=c.name, arguments=c.arguments)) for c in p.tool_calls],
        "tool_calls" if p.tools_called else None) for p in parsed.results]


async def _parse_on_a_rank(f: FrontServices, body: ChatCompletionIn,
                           choices: list[Choice]) -> ParsedToolCalls:
    """vLLM's parser over the choices' tokens on one ready rank (others tried in turn)."""
    rollouts = f.rollouts
    d = await rollouts.discover()
    if not d.ready:
        raise ApiError(503, "no rank is ready to parse the tool calls", "ranks")
    req = {"parser": f.config.tool_call_parser,
           "request": body.model_dump(mode="json", by_alias=True, exclude_unset=True),
           "outputs": [ch.text_ids for ch in choices]}
    errors = []
    for ep in d.ready:
        try:
            reply = await rollouts.pool.post(ep, "/v1/tool_calls", req,
                                             min(PARSE_TIMEOUT_S, f.config.rollout_timeout_s))
            got = ParsedToolCalls.model_validate(reply)
        except RankCallError as e:
            if e.bad_request:  # the gateway's parser name, or a body vLLM's class refuses
                raise ApiError(500, f"the ranks cannot parse tool calls with "
                                    f"--tool-call-parser {f.config.tool_call_parser!r}: "
                                    f"{e.message}", "tool_call_parser") from None
            log.warning("tool-call parse on rank %s failed: %s", ep.rank_id, e.message)
            errors.append(str(e))
            continue
        except ValidationError as e:
            errors.append(f"rank {ep.rank_id}: malformed /v1/tool_calls reply: {e}")
            continue
        if len(got.results) == len(choices):
            return got
        errors.append(f"rank {ep.rank_id}: /v1/tool_calls answered {len(got.results)} of "
                      f"{len(choices)} outputs")
    raise ApiError(503, "parsing the tool calls failed on every ready rank: "
                        + "; ".join(errors), "ranks")


def tool_call_deltas(calls: list[ToolCallOut]) -> list[dict[str, Any]]:
    """The calls as a stream's delta spells them (each with its index)."""
    return [{"index": i, **c.model_dump()} for i, c in enumerate(calls)]
