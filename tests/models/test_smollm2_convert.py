"""The GGUF -> HF conversion of SmolLM2-135M-Instruct: tensor names, the query/key row
un-permutation, the config, and the built directory (files, tokenizer, chat template)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bubblespec.models import smollm2


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to q_proj / k_proj rows."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


@pytest.mark.parametrize("n_head", [1, 3, 9])
def test_unpermute_inverts_llama_cpp_permute(n_head: int) -> None:
    w = np.random.default_rng(n_head).standard_normal((n_head * 64, 40)).astype(np.float32)
    permuted = llama_cpp_permute(w, n_head)
    assert not np.array_equal(permuted, w)
    assert np.array_equal(smollm2.unpermute(permuted, n_head), w)


def test_hf_names() -> None:
    assert smollm2.hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert smollm2.hf_name("output_norm.weight") == "model.norm.weight"
    assert smollm2.hf_name("blk.12.attn_k.weight") == "model.layers.12.self_attn.k_proj.weight"
    assert smollm2.hf_name("blk.0.ffn_norm.weight") == \
        "model.layers.0.post_attention_layernorm.weight"
    with pytest.raises(ValueError, match="unexpected GGUF tensor"):
        smollm2.hf_name("blk.0.attn_qkv.weight")


def test_cache_root_follows_env(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("BUBBLESPEC_CACHE", str(tmp_path))
    assert smollm2.cache_root() == tmp_path
    with pytest.raises(FileNotFoundError, match="make real-model"):
        smollm2.model_dir()


def test_built_directory(real_dir) -> None:
    names = {p.name for p in real_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", "conversion.json"} <= names
    cfg = json.loads((real_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["vocab_size"]) == (30, 576, 9, 3, 49152)
    stamp = json.loads((real_dir / "conversion.json").read_text())
    assert stamp["gguf_sha256"] == smollm2.GGUF_SHA256
    assert stamp["parameters"] == 134_515_008


def test_tokenizer_and_chat_template_match_transformers(real_dir) -> None:
    from transformers import AutoTokenizer

    from bubblespec.tasks.wordproblems import WordProblemsTask

    tok = AutoTokenizer.from_pretrained(str(real_dir))
    assert (tok.convert_ids_to_tokens([1, 2]) == ["<|im_start|>", "<|im_end|>"])
    task = WordProblemsTask(real_dir)
    for p in task.make_prompts(5, seed=3):
        user = p.text.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
        ref = tok.apply_chat_template([{"role": "user", "content": user}],
                                      add_generation_prompt=True, tokenize=False)
        assert ref == p.text
        assert tok(ref, add_special_tokens=False).input_ids == list(p.input_ids)
