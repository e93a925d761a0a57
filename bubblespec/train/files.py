"""The files besides the weights that make a saved policy a model directory of its own.

A trainer writes only weights (safetensors and config: what a weight push reloads); a
directory with the tokenizer and chat template as well can be loaded, evaluated
(`bubblespec bench policy --model DIR`) or served without its base model beside it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json", "chat_template.jinja")


def copy_tokenizer(src: str | Path, dst: str | Path) -> list[str]:
    """Copy the tokenizer files `src` has into `dst`; the names copied."""
    out = []
    for name in TOKENIZER_FILES:
        if (Path(src) / name).is_file():
            shutil.copy2(Path(src) / name, Path(dst) / name)
            out.append(name)
    return out
