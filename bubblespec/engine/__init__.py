"""Rank engine: vLLM with bubblespec drafts. The only package that imports vllm/torch
(lazily: importing the types does not load vLLM)."""

from bubblespec.engine.config import EngineConfig
from bubblespec.engine.types import GenRequest, GenResult, SampleResult, SpecMode

__all__ = ["EngineConfig", "GenRequest", "GenResult", "SampleResult", "SpecMode"]
