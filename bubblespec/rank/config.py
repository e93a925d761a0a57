"""Configuration of a rank server (`bubblespec rank --help` shows these fields)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr

from bubblespec.config import BaseConfig
from bubblespec.engine.config import EngineConfig
from bubblespec.engine.types import SpecMode

ENV_PREFIX = "BUBBLESPEC_RANK_"


class RankConfig(BaseConfig):
    """bubblespec rank server: one vLLM engine, its shard of each step, pre-generation."""

    rank_id: str = Field("", max_length=128)
    """Rank name (default: r<ordinal> from a StatefulSet hostname, else rank-<port>)."""
    host: str = "127.0.0.1"
    """Interface the HTTP server binds (0.0.0.0 for all)."""
    port: int = Field(8100, ge=0, le=65535)
    """HTTP port."""
    advertise_address: str = ""
    """host:port the synchronizer and gateway reach this rank at (default host:port)."""
    sync_address: str = ""
    """host:port of the synchronizer (empty: run alone, no pre-generation or shared drafts)."""
    sync_token: SecretStr | None = None
    """Bearer token for the synchronizer's mutating RPCs."""
    token: SecretStr | None = None
    """Bearer token required on this server's mutating routes."""
    sync_timeout_s: float = Field(2.0, gt=0)
    """Deadline of each synchronizer RPC, seconds."""
    poll_every: int = Field(8, ge=1)
    """T: decode steps between stop polls while pre-generating."""
    pregen_inflight: int = Field(64, ge=1)
    """Most pre-generation tasks decoding at once (refilled as each finishes)."""
    model: str = ""
    """HF-format model directory (empty: the embedded tiny model)."""
    spec_mode: SpecMode = SpecMode.BUBBLESPEC
    """Speculation: none, ngram, suffix or bubblespec."""
    num_speculative_tokens: int = Field(8, ge=1, le=64)
    """Most tokens drafted per decode step."""
    src_pregen: bool = True
    """Draft from pre-generated responses."""
    src_siblings: bool = True
    """Draft from sibling responses of the same prompt."""
    src_self: bool = True
    """Draft from the request's own prompt and output."""
    src_history: bool = False
    """Keep finished responses across steps as drafts."""
    src_global: bool = False
    """Draft from a global pool of recent finished responses to any prompt."""
    max_model_len: int = Field(0, ge=0)
    """Longest prompt + response, tokens (0: the model's own limit)."""
    max_num_seqs: int = Field(256, ge=1)
    """Most sequences the engine decodes at once."""
    dtype: str = "float32"
    """Model dtype."""
    kv_cache_gib: int = Field(1, ge=1)
    """CPU KV-cache size in GiB."""
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    """GPU memory share (GPU engines only)."""
    enforce_eager: bool = True
    """Skip compilation for a fast start."""
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    """Largest accepted HTTP request body, bytes."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Log level."""

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            model=self.model, spec_mode=self.spec_mode,
            num_speculative_tokens=self.num_speculative_tokens, src_pregen=self.src_pregen,
            src_siblings=self.src_siblings, src_self=self.src_self,
            src_history=self.src_history, src_global=self.src_global,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs, dtype=self.dtype, kv_cache_gib=self.kv_cache_gib,
            gpu_memory_utilization=self.gpu_memory_utilization,
            enforce_eager=self.enforce_eager)
