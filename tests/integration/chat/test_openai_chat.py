"""Chat completions through the gateway's OpenAI-compatible route with the real `openai`
client, on a real 2-rank LocalCluster serving the real model (SmolLM2-135M-Instruct, whose
tokenizer carries a chat template; the embedded tiny model has none). Skipped when the real
model is not built (`make real-model`).

A multi-turn conversation the way an agentic framework keeps one: the second turn appends
the first reply and a new user message, and its prompt extends the first turn's prompt with
the reply's text. The rendered prompts are checked against transformers'
`apply_chat_template` on the same tokenizer, and the chat route's samples against
/v1/completions on the rendered prompt with the same keyed seeds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bubblespec.cluster import LocalCluster

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.engine

KEYED = {"seed_mode": "keyed", "return_token_ids": True}


@pytest.fixture(scope="module")
def cluster(chat_cluster: LocalCluster) -> LocalCluster:
    return chat_cluster  # shared with test_agentic_frameworks.py (conftest.py)


@pytest.fixture(scope="module")
def client(chat_client: Any) -> Any:
    return chat_client


@pytest.fixture(scope="module")
def hf_tok(real_dir: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(real_dir))


def hf_prompt(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    """The prompt ids vLLM would sample from: transformers' rendering, tokenized without
    adding special tokens."""
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def test_multi_turn_chat_extends_the_first_turn(client: Any, hf_tok: Any) -> None:
    model = client.models.list().data[0].id
    turn1 = [{"role": "user", "content": "What is 2 + 3? Answer in one sentence."}]
    r1 = client.chat.completions.create(model=model, messages=turn1, max_tokens=40, n=2,
                                        temperature=0.8, seed=3, logprobs=True,
                                        extra_body=KEYED)
    assert r1.object == "chat.completion" and len(r1.choices) == 2
    p1 = r1.prompt_token_ids
    assert p1 == hf_prompt(hf_tok, turn1)
    eos = hf_tok.convert_tokens_to_ids("<|im_end|>")
    for c in r1.choices:
        ids = c.token_ids
        assert c.message.role == "assistant" and ids
        assert [t.logprob for t in c.logprobs.content] and len(c.logprobs.content) == len(ids)
        assert all(t.logprob <= 0 and t.top_logprobs == [] for t in c.logprobs.content)
        body = ids[:-1] if c.finish_reason == "stop" else ids
        if c.finish_reason == "stop":
            assert ids[-1] == eos
        assert c.message.content == hf_tok.decode(body, skip_special_tokens=True)
    assert r1.usage.prompt_tokens == len(p1)
    assert r1.usage.completion_tokens == sum(len(c.token_ids) for c in r1.choices)

    first = r1.choices[0]
    turn2 = turn1 + [{"role": "assistant", "content": first.message.content},
                     {"role": "user", "content": "And 4 + 4?"}]
    r2 = client.chat.completions.create(model=model, messages=turn2, max_tokens=40,
                                        temperature=0.8, seed=4, extra_body=KEYED)
    p2 = r2.prompt_token_ids
    assert p2 == hf_prompt(hf_tok, turn2)
    assert p2[:len(p1)] == p1  # the second turn extends the first
    # ... by the reply's text: the template re-tokenizes the reply, which need not give the
    # sampled ids back (BPE has several spellings of one text), the reason frameworks that
    # train on the sampled ids keep them (return_token_ids) instead of re-rendering
    tail = hf_tok.decode(p2[len(p1):], skip_special_tokens=False)
    assert tail.startswith(first.message.content + "<|im_end|>"), tail

    # the chat route samples the rendered prompt as /v1/completions does (same keyed seeds)
    comp = client.completions.create(model=model, prompt=p2, max_tokens=40, temperature=0.8,
                                     seed=4, extra_body=KEYED)
    assert comp.choices[0].token_ids == r2.choices[0].token_ids


def test_chat_stream_and_stop_string(client: Any) -> None:
    msgs = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
    full = client.chat.completions.create(model="m", messages=msgs, max_tokens=48,
                                          temperature=0, extra_body={"return_token_ids": True})
    text = full.choices[0].message.content
    chunks = list(client.chat.completions.create(
        model="m", messages=msgs, max_tokens=48, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    step = full.choices[0].bubblespec["step"]
    assert [ch.choices[0].bubblespec["step"] for ch in chunks
            if ch.choices and ch.choices[0].finish_reason] == [step + 1]
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == text
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == \
        full.choices[0].finish_reason
    if "5" in text:  # a stop string inside the reply cuts it there
        cut = client.chat.completions.create(model="m", messages=msgs, max_tokens=48,
                                             temperature=0, stop=["5"],
                                             extra_body={"return_token_ids": True})
        c = cut.choices[0]
        assert c.finish_reason == "stop" and c.stop_reason == "5"
        assert c.message.content == text[:text.index("5")]
        assert c.token_ids == full.choices[0].token_ids[:len(c.token_ids)]
