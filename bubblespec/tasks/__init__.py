"""The embedded default: a tiny Llama and the synthetic RL task it was trained on.

``default_task()`` gives the prompt generator, verifiable reward and tokenizer helpers;
``default_model_dir()`` the shipped Hugging Face model directory (a ~0.9M-parameter
``LlamaForCausalLM``, float32 safetensors, WordLevel ``tokenizer.json``) that vLLM and
transformers load offline. Together they let one command run the whole system with real
engines and a real GRPO loop (docs/design.md section 8). Importing this package needs neither
torch nor vLLM.
"""

from __future__ import annotations

from pathlib import Path

from bubblespec.tasks.addchain import AddChainTask, Prompt, Slips

__all__ = ["AddChainTask", "Prompt", "Slips", "default_model_dir", "default_task"]

_ASSET = "tiny-llama"


def default_task() -> AddChainTask:
    """The task the default model was trained on (addchain: repeated addition mod 100)."""
    return AddChainTask()


def default_model_dir() -> Path:
    """Path of the shipped model directory (``bubblespec/assets/tiny-llama``).

    Raises FileNotFoundError if the package was installed without its assets.
    """
    path = Path(__file__).resolve().parent.parent / "assets" / _ASSET
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"default model not found at {path}; rebuild it with "
            "`bubblespec train-tiny --out bubblespec/assets/tiny-llama`"
        )
    return path
