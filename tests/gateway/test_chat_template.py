"""The gateway's chat template rendering: equal to transformers' `apply_chat_template` (what
vLLM renders with) on the real model's template, found where checkpoints keep it, and
sandboxed (a template is untrusted code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bubblespec.gateway.chat_template import ChatTemplate, ChatTemplateError

CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}],
    [{"role": "user", "content": "A"}, {"role": "assistant", "content": "B"},
     {"role": "user", "content": "C \u00e9\u4e2d"}],
]


@pytest.fixture(scope="module")
def real_dir() -> Path:
    from bubblespec.models import real_model_dir

    try:
        return real_model_dir()
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_real_template_renders_as_transformers_does(real_dir: Path,
                                                    generation_prompt: bool) -> None:
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(real_dir))
    template = ChatTemplate.load(str(real_dir))
    assert template is not None
    for conv in CONVERSATIONS:
        want = tok.apply_chat_template(conv, add_generation_prompt=generation_prompt,
                                       tokenize=False)
        assert template.render(conv, generation_prompt) == want


def test_where_the_template_is_found(tmp_path: Path) -> None:
    from bubblespec.tasks import default_model_dir

    assert ChatTemplate.load(str(default_model_dir())) is None  # the tiny model has none
    assert ChatTemplate.load("") is None
    (tmp_path / "chat_template.jinja").write_text("file:{{ messages[0]['content'] }}")
    assert ChatTemplate.load(str(tmp_path)).render([{"role": "user", "content": "x"}]) == \
        "file:x"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<s>"}, "eos_token": "</s>",
        "chat_template": [{"name": "tool_use", "template": "tools"},
                          {"name": "default", "template": "{{ bos_token }}cfg{{ eos_token }}"
                                                          "{% if add_generation_prompt %}>"
                                                          "{% endif %}"}]}))
    t = ChatTemplate.load(str(tmp_path / "tokenizer.json"))  # a tokenizer.json's folder
    assert t is not None and t.render([], True) == "<s>cfg</s>>"
    assert t.render([], False) == "<s>cfg</s>"


def test_the_template_is_sandboxed_and_its_refusals_are_errors() -> None:
    with pytest.raises(ChatTemplateError, match="SecurityError"):
        ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}", {}).render([])
    with pytest.raises(ChatTemplateError, match="SecurityError"):
        ChatTemplate("{{ messages.append(1) }}", {}).render([])  # immutable
    refuse = ChatTemplate("{% if messages[0]['role'] == 'system' %}"
                          "{{ raise_exception('no system role') }}{% endif %}ok", {})
    with pytest.raises(ChatTemplateError, match="no system role"):
        refuse.render([{"role": "system", "content": ""}])
    assert refuse.render([{"role": "user", "content": ""}]) == "ok"
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages[5]['content'] }}", {}).render([])
    js = ChatTemplate("{{ messages | tojson }}", {})
    assert js.render([{"role": "user", "content": "<é>"}]) == \
        '[{"role": "user", "content": "<é>"}]'


TOOL_TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }}:"
    "{{ t.function.parameters | tojson }};{% endfor %}</tools>\n{% endif %}"
    "{% for m in messages %}<{{ m.role }}>"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<call {{ c.function.name }}>"
    "{% for k, v in c.function.arguments.items() %}{{ k }}={{ v }},{% endfor %}</call>"
    "{% endfor %}{% else %}{{ m.content }}{% endif %}"
    "{% if m.tool_call_id %}[{{ m.tool_call_id }}]{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}")


def test_tools_and_tool_turns_render_as_transformers_does(real_dir: Path,
                                                          tmp_path: Path) -> None:
    """An agent's history (`tools`, an assistant turn's `tool_calls` with JSON-text
    arguments, the tool's answer) rendered as transformers renders it, which is what vLLM
    samples from (vLLM parses the arguments into a dict for templates that iterate them)."""
    transformers = pytest.importorskip("transformers")
    from bubblespec.protocol.openai import ChatCompletionIn

    tool = {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}}}}
    body = ChatCompletionIn.model_validate({"tools": [tool], "tool_choice": "none", "messages": [
        {"role": "user", "content": "2 + 3?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"}]})
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TOOL_TEMPLATE}))
    template = ChatTemplate.load(str(tmp_path))
    assert template is not None
    turns = [m.template_dict() for m in body.messages]
    got = template.render(turns, True, body.template_kwargs())
    tok = transformers.AutoTokenizer.from_pretrained(str(real_dir))
    want = tok.apply_chat_template(turns, tools=[tool], chat_template=TOOL_TEMPLATE,
                                   add_generation_prompt=True, tokenize=False)
    assert got == want
    assert "<call add>a=2,b=3,</call>" in got and "[c1]" in got and "add:{" in got


@pytest.mark.parametrize("final", ["The answer is", "The answer is ", "  Spaced   "])
def test_continue_final_message_cuts_as_transformers_does(real_dir: Path, final: str) -> None:
    """vLLM's `continue_final_message` (transformers' rule): the prompt ends where the final
    assistant message's text ends, its turn left open."""
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(real_dir))
    template = ChatTemplate.load(str(real_dir))
    assert template is not None
    conv = [{"role": "user", "content": "2 + 3?"}, {"role": "assistant", "content": final}]
    want = tok.apply_chat_template(conv, add_generation_prompt=False, tokenize=False,
                                   continue_final_message=True)
    assert template.render(conv, False, continue_final=True) == want
    assert template.render(conv, False).startswith(want)  # the closed turn goes on
