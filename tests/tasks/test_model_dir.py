"""The shipped default model: small, Llama, tokenizer consistent with the task, loadable by
transformers, and (greedily) good at the task it was trained on."""

from __future__ import annotations

import json

import pytest

from bubblespec.tasks import default_model_dir, default_task
from bubblespec.tasks.addchain import BOS_ID, EOS_ID, PAD_ID, VOCAB, hf_tokenizer_files

MAX_BYTES = 8 * 1024 * 1024


@pytest.fixture(scope="module")
def model_dir():
    return default_model_dir()


def test_files_and_size(model_dir) -> None:
    names = {p.name for p in model_dir.iterdir()}
    for need in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        assert need in names
    assert sum(p.stat().st_size for p in model_dir.rglob("*") if p.is_file()) <= MAX_BYTES


def test_config_is_llama_with_task_ids(model_dir) -> None:
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert cfg["vocab_size"] == len(VOCAB)
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (BOS_ID, EOS_ID,
                                                                               PAD_ID)
    assert 512 <= cfg["max_position_embeddings"] <= 4096
    gen = json.loads((model_dir / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"]) == (BOS_ID, EOS_ID)


def test_shipped_tokenizer_matches_task(model_dir) -> None:
    from tokenizers import Tokenizer

    shipped = json.loads((model_dir / "tokenizer.json").read_text())
    built = json.loads(hf_tokenizer_files()["tokenizer.json"])
    assert shipped["model"]["vocab"] == built["model"]["vocab"] == VOCAB
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    p = default_task().make_prompts(1, seed=0)[0]
    assert tok.encode(p.text).ids == list(p.input_ids)


def test_safetensors_header(model_dir) -> None:
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), framework="numpy") as f:
        keys = set(f.keys())
        assert "model.embed_tokens.weight" in keys and "lm_head.weight" in keys
        assert f.get_slice("model.embed_tokens.weight").get_shape()[0] == len(VOCAB)


def test_transformers_loads_and_solves_short_problems(model_dir) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.set_num_threads(1)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir))
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    task = default_task()
    prompts = [task.make_prompt(s, d, k) for s, d, k in ((12, 7, 3), (95, 9, 5), (40, 3, 8))]
    assert tok(prompts[0].text)["input_ids"] == list(prompts[0].input_ids)
    inp = torch.tensor([list(p.input_ids) for p in prompts])
    with torch.no_grad():
        out = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp),
                             do_sample=False, max_new_tokens=40, eos_token_id=EOS_ID,
                             pad_token_id=PAD_ID)
    rewards = [task.reward(p, row) for p, row in zip(prompts, out[:, inp.shape[1]:].tolist())]
    assert sum(rewards) >= 2, rewards  # greedy decoding of a trained model is nearly exact
