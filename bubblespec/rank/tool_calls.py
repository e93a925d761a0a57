"""vLLM's tool parsers on a rank: the tool calls of chat outputs for tool_choice "auto".

The gateway runs no vLLM, and a tool parser is vLLM's (`--tool-call-parser`: hermes,
llama3_json, pythonic, mistral, ... or a plugin registered with vLLM's `ToolParserManager`),
so the gateway hands each output of such a request to a rank (`POST /v1/tool_calls`). Here
it runs as vLLM's server runs it for a non-streamed answer: vLLM's own request object is
built from the body the caller sent, the parser (made with the model's tokenizer and the
request's tools) adjusts it (hermes keeps special tokens, for one), the output's tokens are
decoded as the adjusted request says, and the parser extracts the calls and the content
around them.
"""

from __future__ import annotations

from typing import Any

from bubblespec.protocol.errors import ApiError
from bubblespec.protocol.rank import ParsedOutput, ParsedToolCall, ParsedToolCalls, ParseToolCalls


def parse_tool_calls(body: ParseToolCalls, tokenizer: Any) -> ParsedToolCalls:
    """Each output of `body` through vLLM's tool parser `body.parser`. ApiError 400 naming
    `parser` for a name vLLM does not know, `request` for a body vLLM's chat request class
    refuses."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers import ToolParserManager

    try:
        cls = ToolParserManager.get_tool_parser(body.parser)
    except KeyError as e:
        raise ApiError(400, f"parser: vLLM has no tool parser {body.parser!r} "
                            f"({', '.join(sorted(ToolParserManager.list_registered()))})",
                       "parser") from e
    try:
        request = ChatCompletionRequest.model_validate(body.request)
    except ValueError as e:
        raise ApiError(400, f"request: vLLM's chat request refuses it: {e}", "request") from e
    results = []
    for ids in body.outputs:
        parser = cls(tokenizer, request.tools)  # parsers hold state: one per output
        adjusted = parser.adjust_request(request.model_copy(deep=True))
        text = tokenizer.decode(list(ids), skip_special_tokens=adjusted.skip_special_tokens)
        info = parser.extract_tool_calls(text, adjusted)
        calls = [ParsedToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments)
                 for c in info.tool_calls] if info.tools_called else []
        results.append(ParsedOutput(tools_called=bool(calls), tool_calls=calls,
                                    content=info.content))
    return ParsedToolCalls(results=results)
