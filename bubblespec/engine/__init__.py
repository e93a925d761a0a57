"""Rank engine: vLLM with bubblespec drafts. The only package that imports vllm/torch
(lazily: importing the types does not load vLLM)."""

from bubblespec.engine.config import EngineConfig
from bubblespec.engine.types import (DraftSources, GenRequest, GenResult, InvalidRequest,
                                     SampleResult, SamplingSpec, SpecMode, prompt_key)

__all__ = ["DraftSources", "EngineConfig", "GenRequest", "GenResult", "InvalidRequest",
           "SampleResult", "SamplingSpec", "SpecMode", "prompt_key"]
