"""The OpenAI-compatible bodies: what the `openai` client and the agentic RL frameworks send
is accepted and maps to bubblespec's sampling parameters; what bubblespec cannot serve
exactly is refused naming the field; the answers parse as the `openai` package's own types.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from bubblespec.http.errors import error_field
from bubblespec.protocol import limits as L
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
    ErrorDetail,
    ErrorOut,
    ModelCard,
    ModelList,
    Usage,
)
from bubblespec.protocol.sampling import SeedMode

openai = pytest.importorskip("openai")

CHAT = {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "2 + 2?"}]}


def field_of(model: Any, body: dict[str, Any]) -> str:
    """The field the gateway names for the first problem (union member tags left out)."""
    with pytest.raises(ValidationError) as e:
        model.model_validate(body)
    err = e.value.errors()[0]
    return error_field({**err, "loc": ("body", *err["loc"])}, body)


def test_prompt_shapes_and_defaults() -> None:
    assert CompletionIn.model_validate({"prompt": [1, 2, 3]}).prompts() == [[1, 2, 3]]
    assert CompletionIn.model_validate({"prompt": [[1, 2], [3]]}).prompts() == [[1, 2], [3]]
    assert CompletionIn.model_validate({"prompt": "a b"}).prompts() == ["a b"]
    assert CompletionIn.model_validate({"prompt": ["a", "b c"]}).prompts() == ["a", "b c"]
    body = CompletionIn.model_validate({"prompt": "x"})
    assert body.max_tokens == 16 and body.n == 1 and body.stops() == []
    sp = body.to_sampling(16)
    assert (sp.temperature, sp.top_p, sp.top_k, sp.repetition_penalty) == (1.0, 1.0, -1, 1.0)
    assert "seed_mode" not in sp.model_fields_set  # the gateway's hand-off default applies


def test_vllm_extensions_map_to_the_sampling_params() -> None:
    body = CompletionIn.model_validate({
        "model": "policy", "prompt": [5, 6], "n": 4, "max_tokens": 64, "temperature": 0.7,
        "top_p": 0.9, "top_k": 0, "repetition_penalty": 1.1, "stop": "###",
        "stop_token_ids": [2], "ignore_eos": True, "seed": 7, "logprobs": 0,
        "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "best_of": 4,
        "return_token_ids": True, "seed_mode": "keyed", "user": "u",
        "stream": True, "stream_options": {"include_usage": True},
        "next_prompts": [[1, 2], "some text"]})
    sp = body.to_sampling(64)
    assert (sp.max_new_tokens, sp.temperature, sp.top_p, sp.top_k) == (64, 0.7, 0.9, -1)
    assert sp.repetition_penalty == 1.1 and sp.stop_token_ids == (2,) and sp.ignore_eos
    assert sp.seed_mode is SeedMode.KEYED and body.stops() == ["###"] and body.include_usage
    assert sp.drafts_off == ()  # an empty logit_bias biases nothing


def test_min_p_and_logit_bias_reach_the_sampling_params_as_vllm_reads_them() -> None:
    """Keys as token ids, each bias clamped into [-100, 100] (vLLM's SamplingParams does the
    same); both make the request decode without drafts."""
    body = CompletionIn.model_validate({"prompt": [1], "min_p": 0.05,
                                        "logit_bias": {"7": 250, "3": -1.5, "9": -1e9}})
    sp = body.to_sampling(8)
    assert sp.min_p == 0.05 and sp.logit_bias == ((3, -1.5), (7, 100.0), (9, -100.0))
    assert sp.drafts_off == ("min_p", "logit_bias")


@pytest.mark.parametrize(("body", "field"), [
    ({}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[1], []]}, "prompt"),
    ({"prompt": "  "}, "prompt"),
    ({"prompt": [1, -1]}, "prompt[1]"),
    ({"prompt": [1], "presence_penalty": 2.1}, "presence_penalty"),
    ({"prompt": [1], "frequency_penalty": -2.5}, "frequency_penalty"),
    ({"prompt": [1], "logit_bias": {"three": 5}}, "logit_bias"),
    ({"prompt": [1], "logit_bias": {"-3": 5}}, "logit_bias"),
    ({"prompt": [1], "min_p": 1.5}, "min_p"),
    ({"prompt": [1], "min_tokens": -1}, "min_tokens"),
    ({"prompt": [1], "best_of": 3}, "best_of"),
    ({"prompt": [1], "n": 2, "best_of": 3}, "best_of"),
    ({"prompt": [1], "suffix": "end"}, "suffix"),
    ({"prompt": [1], "prompt_logprobs": -1}, "prompt_logprobs"),
    ({"prompt": [1], "logprobs": 21}, "logprobs"),
    ({"prompt": [1], "logprobs": -1}, "logprobs"),
    ({"prompt": [1], "prompt_logprobs": -2}, "prompt_logprobs"),
    ({"prompt": [1], "use_beam_search": True}, "use_beam_search"),
    ({"prompt": [1], "max_tokens": -1}, "max_tokens"),
    ({"prompt": [1], "n": 0}, "n"),
    ({"prompt": [1], "n": L.MAX_N + 1}, "n"),
    ({"prompt": [1], "temperature": 2.5}, "temperature"),
    ({"prompt": [1], "top_p": 0}, "top_p"),
    ({"prompt": [1], "top_k": -2}, "top_k"),
    ({"prompt": [1], "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": [1], "stop": ""}, "stop"),
    ({"prompt": [1], "stop": ["a"] * 65}, "stop"),
    ({"prompt": [1], "stop_token_ids": [-1]}, "stop_token_ids[0]"),
    ({"prompt": [1], "seed": -1}, "seed"),
    ({"prompt": [1], "n": 2, "seed": L.MAX_SEED}, "seed"),
    ({"prompt": [1], "seed_mode": "lucky"}, "seed_mode"),
    ({"prompt": [1], "next_prompts": [[]]}, "next_prompts"),
    ({"prompt": [1], "guided_json": {"type": "object"}}, "guided_json"),
    ({"prompt": [1], "allowed_token_ids": []}, "allowed_token_ids"),
    ({"prompt": [1], "bad_words": [""]}, "bad_words[0]"),
])
def test_completion_refusals_name_the_field(body: dict[str, Any], field: str) -> None:
    assert field_of(CompletionIn, body) == field


def test_chat_body_and_messages_for_the_template() -> None:
    body = ChatCompletionIn.model_validate({
        **CHAT, "max_completion_tokens": 32, "max_tokens": 8, "logprobs": True,
        "top_logprobs": 0, "tool_choice": "none", "response_format": {"type": "text"},
        "chat_template_kwargs": {"enable_thinking": False}, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"},
                                         {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None, "tool_calls": [],
             "reasoning_content": "hm"}]})
    assert body.budget == 32 and body.max_tokens_field == "max_completion_tokens"
    assert [m.template_dict() for m in body.messages] == [
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "", "tool_calls": [], "reasoning_content": "hm"}]
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    agent = ChatCompletionIn.model_validate({**CHAT, "tools": [tool], "tool_choice": "none",
                                             "messages": [
        {"role": "user", "content": "2 + 3?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"}]})
    assert agent.template_kwargs() == {"tools": [tool]} and agent.tool_mode == "none"
    auto = ChatCompletionIn.model_validate({**CHAT, "tools": [tool]})  # "auto" by default
    assert auto.tool_mode == "auto" and auto.structured is None
    turns = [m.template_dict() for m in agent.messages]
    assert turns[1]["tool_calls"][0]["function"]["arguments"] == {"a": 2, "b": 3}  # as vLLM
    assert turns[2] == {"role": "tool", "tool_call_id": "c1", "content": "5"}
    plain = ChatCompletionIn.model_validate(CHAT)
    assert plain.budget is None and plain.max_tokens_field == "max_tokens"
    assert plain.add_generation_prompt and not plain.logprobs


@pytest.mark.parametrize(("body", "field"), [
    ({"model": "m"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content"),
    ({**CHAT, "top_logprobs": 2}, "top_logprobs"),
    ({**CHAT, "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ({**CHAT, "tool_choice": "auto"}, "tool_choice"),  # no tools
    ({**CHAT, "response_format": {"type": "structural_tag"}}, "response_format"),
    ({**CHAT, "response_format": {"type": "json_schema"}}, "response_format"),
    ({**CHAT, "response_format": {"type": "json_object"},
      "structured_outputs": {"regex": "a"}}, "structured_outputs"),
    ({**CHAT, "structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({**CHAT, "structured_outputs": {"json": "{not json"}}, "structured_outputs"),
    ({**CHAT, "structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({**CHAT, "structured_outputs": {"regex": "a", "whitespace_pattern": " "}},
     "structured_outputs.whitespace_pattern"),
    ({**CHAT, "continue_final_message": True}, "continue_final_message"),
    ({**CHAT, "presence_penalty": 3}, "presence_penalty"),
    ({**CHAT, "max_completion_tokens": 0}, "max_completion_tokens"),
    ({**CHAT, "messages": [{"role": "assistant", "content": "x",
                            "tool_calls": [{"id": "1"}]}]},
     "messages[0].tool_calls[0].function"),
    ({**CHAT, "use_beam_search": True}, "use_beam_search"),
    ({**CHAT, "prompt_logprobs": 2, "stream": True}, "prompt_logprobs"),
])
def test_chat_refusals_name_the_field(body: dict[str, Any], field: str) -> None:
    assert field_of(ChatCompletionIn, body) == field


def test_answers_parse_as_the_openai_types() -> None:
    """What the gateway answers is what the `openai` client parses (its own pydantic types,
    validated strictly here, not constructed leniently as the client does)."""
    from openai.types import Completion
    from openai.types import Model as OaiModel
    from openai.types.chat import ChatCompletion

    usage = Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5)
    lp = CompletionLogprobs(text_offset=[0, 1], token_logprobs=[-0.5, -1.0],
                            tokens=["a", "b"], top_logprobs=[{"a": -0.5}, {"b": -1.0}])
    comp = CompletionOut(id="cmpl-1", created=1, model="m", usage=usage, choices=[
        CompletionChoice(index=0, text="ab", logprobs=lp, finish_reason="stop",
                         token_ids=[5, 6], prompt_token_ids=[1, 2, 3])])
    parsed = Completion.model_validate(comp.model_dump())
    assert parsed.choices[0].logprobs.token_logprobs == [-0.5, -1.0]
    assert parsed.choices[0].token_ids == [5, 6]  # vLLM's extension, kept as an extra
    chat = ChatCompletionOut(id="chatcmpl-1", created=1, model="m", usage=usage,
                             prompt_token_ids=[1, 2, 3], choices=[ChatChoice(
                                 index=0, message=ChatMessageOut(content="ab"),
                                 finish_reason="length", logprobs=ChatLogprobs(content=[
                                     ChatTokenLogprob(token="a", logprob=-0.5, bytes=[97])]),
                                 token_ids=[5, 6])])
    c = ChatCompletion.model_validate(chat.model_dump())
    assert c.choices[0].message.content == "ab" and c.choices[0].message.role == "assistant"
    assert c.choices[0].logprobs.content[0].top_logprobs == []
    OaiModel.model_validate(ModelList(data=[ModelCard(id="m", created=1)]).data[0].model_dump())
    err = ErrorOut(error=ErrorDetail(message="bad", type="BadRequestError", param="n", code=400))
    assert err.model_dump()["error"]["param"] == "n"


@pytest.mark.parametrize(("extra", "want"), [
    ({"response_format": {"type": "json_object"}}, {"json_object": True}),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "a", "schema": {"type": "object", "properties": {"b": {"type": "integer"},
                                                                  "a": {"type": "string"}}}}}},
     {"json_schema": '{"type":"object","properties":{"b":{"type":"integer"},'
                     '"a":{"type":"string"}}}'}),
    ({"structured_outputs": {"regex": "[0-9]+"}}, {"regex": "[0-9]+"}),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, {"choice": ("yes", "no")}),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, {"grammar": 'root ::= "a"'}),
    ({"structured_outputs": {"json": {"type": "array"}}}, {"json_schema": '{"type":"array"}'}),
    ({"structured_outputs": {"json_object": True}}, {"json_object": True}),
    ({"response_format": {"type": "text"}}, None),
])
def test_constraints_reach_the_sampling_params(extra: dict[str, Any], want: Any) -> None:
    """Each spelling becomes one `StructuredOutput`; a schema keeps its key order (it orders
    the output's properties)."""
    for model, body in ((CompletionIn, {"prompt": [1]}), (ChatCompletionIn, CHAT)):
        got = model.model_validate({**body, **extra}).to_sampling(8).structured
        assert (None if got is None else got.model_dump(exclude_defaults=True)) == want


TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"]}}},
         {"type": "function", "function": {"name": "now"}}]


def test_required_and_named_tool_choice_constrain_to_vllms_schema() -> None:
    """"required": an array of at least one {name, parameters} of the given tools (at most
    one without parallel calls); a named tool: its parameters (an empty object schema for a
    tool without parameters), as vLLM's `get_json_schema_from_tools` builds them."""
    import json

    req = ChatCompletionIn.model_validate({**CHAT, "tools": TOOLS, "tool_choice": "required",
                                          "parallel_tool_calls": False})
    schema = json.loads(req.to_sampling(8).structured.json_schema)
    assert schema["type"] == "array" and schema["minItems"] == 1 and schema["maxItems"] == 1
    names = [i["properties"]["name"]["enum"] for i in schema["items"]["anyOf"]]
    assert names == [["add"], ["now"]]
    assert schema["items"]["anyOf"][1]["properties"]["parameters"] == {
        "type": "object", "properties": {}}
    named = ChatCompletionIn.model_validate({**CHAT, "tools": TOOLS, "tool_choice": {
        "type": "function", "function": {"name": "add"}}})
    assert named.tool_mode == "named" and named.named_tool == "add"
    assert json.loads(named.to_sampling(8).structured.json_schema) == \
        TOOLS[0]["function"]["parameters"]


@pytest.mark.parametrize(("extra", "field"), [
    ({"tool_choice": "required"}, "tool_choice"),  # no tools
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "sub"}}},
     "tool_choice"),
    ({"tools": []}, "tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "now"}},
      "response_format": {"type": "json_object"}}, "tool_choice"),
])
def test_tool_choice_refusals(extra: dict[str, Any], field: str) -> None:
    assert field_of(ChatCompletionIn, {**CHAT, **extra}) == field
