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

__all__ = ["TASKS", "AddChainTask", "Prompt", "Slips", "default_model_dir", "default_task",
           "make_task", "task_model_dir"]

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


TASKS = ("addchain", "wordproblems")
"""Task names `make_task` knows (the `--task` of the benchmarks)."""


def make_task(name: str = "addchain", model_dir: str | Path | None = None):  # -> a task
    """The task called `name`. "addchain" is the embedded model's; "wordproblems" (English
    arithmetic word problems for the real chat model) encodes with `model_dir`'s tokenizer
    (default: the real model built by `make real-model`). ValueError for an unknown name."""
    if name == "addchain":
        return default_task()
    if name == "wordproblems":
        from bubblespec.models import real_model_dir
        from bubblespec.tasks.wordproblems import WordProblemsTask

        return WordProblemsTask(Path(model_dir) if model_dir else real_model_dir())
    raise ValueError(f"unknown task {name!r} (known: {', '.join(TASKS)})")


def task_model_dir(name: str = "addchain") -> Path:
    """The model a task runs on when no ``--model`` is given: the embedded tiny model for
    addchain, the real model built by `make real-model` for wordproblems
    (FileNotFoundError, saying how to build it, when it is missing)."""
    if name == "wordproblems":
        from bubblespec.models import real_model_dir

        return real_model_dir()
    if name != "addchain":
        raise ValueError(f"unknown task {name!r} (known: {', '.join(TASKS)})")
    return default_model_dir()
