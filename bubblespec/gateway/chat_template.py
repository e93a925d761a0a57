"""The model's chat template, rendered the way vLLM's /v1/chat/completions renders it.

vLLM renders a conversation with the Hugging Face tokenizer's `apply_chat_template`: the
Jinja template of the model directory (the `chat_template` of tokenizer_config.json, or the
`chat_template.jinja` file newer checkpoints ship beside it), with `messages`,
`add_generation_prompt` and the tokenizer's special tokens as variables, in a sandboxed
Jinja environment with `trim_blocks` and `lstrip_blocks` and the loop-controls extension,
and `raise_exception` / `strftime_now` as globals; the rendered text is then tokenized
without adding special tokens (the template writes them).

The gateway renders with Jinja's `ImmutableSandboxedEnvironment` itself instead of importing
transformers: the gateway is a light HTTP process (transformers pulls in torch and takes
seconds to import), and a template is untrusted code, which only the sandbox keeps from
reaching Python internals. The test suite checks the rendering against transformers'
`apply_chat_template` on the real model's template.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token",
                  "cls_token", "mask_token")
"""Special tokens of tokenizer_config.json a template may refer to."""


class ChatTemplateError(ValueError):
    """The conversation cannot be rendered (the template refused it, or none exists)."""


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _pick(template: Any) -> str | None:
    """A template string from tokenizer_config.json's `chat_template` (a string, or a list
    of named templates whose "default" one is used)."""
    if isinstance(template, str):
        return template
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        chosen = named.get("default")
        return chosen if isinstance(chosen, str) else None
    return None


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    """JSON without HTML escaping (Jinja's own `tojson` escapes <, >, &, ')."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class ChatTemplate:
    """A compiled chat template and the special tokens it is rendered with."""

    def __init__(self, source: str, special_tokens: dict[str, str]) -> None:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = _strftime_now
        self.source = source
        self.special_tokens = dict(special_tokens)
        self._template = env.from_string(source)

    @classmethod
    def load(cls, spec: str) -> ChatTemplate | None:
        """The chat template of the model directory `spec` (or of the directory holding the
        tokenizer.json `spec`); None when it has none (the embedded tiny model)."""
        if not spec:
            return None
        path = Path(spec)
        folder = path if path.is_dir() else path.parent
        config: dict[str, Any] = {}
        cfg_path = folder / "tokenizer_config.json"
        if cfg_path.is_file():
            config = json.loads(cfg_path.read_text())
        source = _pick(config.get("chat_template"))
        jinja_file = folder / "chat_template.jinja"
        if source is None and jinja_file.is_file():
            source = jinja_file.read_text()
        if not source:
            return None
        tokens = {k: t for k in SPECIAL_TOKENS if (t := _token_text(config.get(k))) is not None}
        return cls(source, tokens)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               extra: dict[str, Any] | None = None, continue_final: bool = False) -> str:
        """The conversation as the prompt text; ChatTemplateError when the template refuses
        it or fails on it. `continue_final`: the text ends where the final message's content
        ends (what closes its turn cut off), as transformers' `continue_final_message` cuts
        it, so that the model continues that message."""
        if not continue_final:
            return self._render(messages, add_generation_prompt, extra)
        return _cut_at_tag(self._render(_tagged(messages), add_generation_prompt, extra))

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
                extra: dict[str, Any] | None) -> str:
        from jinja2 import TemplateError

        variables = {**self.special_tokens, **(extra or {}), "messages": messages,
                     "add_generation_prompt": add_generation_prompt}
        try:
            return self._template.render(**variables)
        except ChatTemplateError:
            raise
        except (TemplateError, TypeError, ValueError, KeyError, AttributeError,
                IndexError, RecursionError) as e:
            raise ChatTemplateError(f"the chat template failed: {type(e).__name__}: {e}"
                                    ) from None



CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
"""Appended to the final message's text to find where it ends (transformers' tag)."""


def _tagged(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages, the final one's (last) text with `CONTINUE_TAG` appended."""
    final = dict(messages[-1]) if messages else {}
    content = final.get("content")
    if isinstance(content, list):
        blocks = [dict(b) if isinstance(b, dict) else b for b in content]
        for b in reversed(blocks):
            if isinstance(b, dict) and "text" in b:
                b["text"] = str(b["text"]) + CONTINUE_TAG
                break
        else:
            raise ChatTemplateError("continue_final_message is set but we could not find any "
                                    "text to continue in the final message!")
        final["content"] = blocks
    elif isinstance(content, str):
        final["content"] = content + CONTINUE_TAG
    else:
        raise ChatTemplateError('continue_final_message is set but the final message has no '
                                '"content" to continue!')
    return [*messages[:-1], final]


def _cut_at_tag(text: str) -> str:
    """`text` cut where the tag begins, as transformers' `continue_final_message` cuts it
    (trailing spaces dropped when the template trimmed the tag's)."""
    if CONTINUE_TAG.strip() not in text:
        raise ChatTemplateError("continue_final_message is set but the final message does "
                                "not appear in the chat after applying the chat template")
    at = text.rindex(CONTINUE_TAG.strip())
    if text[at:at + len(CONTINUE_TAG)] == CONTINUE_TAG:
        return text[:at]
    return text[:at].rstrip()
