"""Engine configuration (pydantic; every field documented).

The one declaration of the engine settings: `bubblespec.rank.config.RankConfig` inherits
these fields, so each is also a `bubblespec rank` flag, env var and config-file key. Imports
neither vLLM nor torch (the rank parses its configuration before the engine starts).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bubblespec.core.sources import DEFAULT_SOURCES, SourceName, parse_sources
from bubblespec.engine.types import SpecMode


class _Settings(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)


class DraftingSettings(_Settings):
    """How the proposer drafts: the speculation mode, the draft length and its caps, the
    index's budgets."""

    spec_mode: SpecMode = SpecMode.BUBBLESPEC
    """Speculation: none, ngram, suffix or bubblespec."""
    num_speculative_tokens: int = Field(8, ge=1, le=64)
    """Most tokens drafted per decode step."""
    max_spec_factor: float = Field(1.0, ge=0)
    """Draft tokens allowed per matched context token."""
    max_spec_offset: float = 0.0
    """Draft tokens allowed on top of factor x match length."""
    min_token_prob: float = Field(0.1, ge=0, le=1)
    """Minimum empirical path probability of a drafted token."""
    draft_budget: Literal["auto", "off", "h100", "h200"] = "auto"
    """Cap each engine step's drafts by batch size and measured acceptance, for the
    engine-time model of this GPU (`core.draft_budget`; auto: the pace profile when paced,
    else h100; off: every step may draft `num_speculative_tokens`)."""
    global_token_budget: int = Field(200_000, ge=1000)
    """Token budget of the global pool (oldest dropped first)."""
    index_token_budget: int = Field(4_000_000, ge=1000)
    """Token budget of the draft index (LRU eviction)."""


class DraftSourceSettings(_Settings):
    """Which draft sources the proposer uses, and how the index takes each step's tokens."""

    sources: tuple[SourceName, ...] = DEFAULT_SOURCES
    """Draft sources, comma-separated (`core.sources`; none: no source): pregen
    (pre-generated responses), siblings (sibling responses of the same prompt), self (the
    request's own prompt and output), history (finished responses kept across batches),
    global (a global pool of recent responses to any prompt), global_live (with global: the
    responses still being generated are in the pool too, as vLLM's suffix decoding does; on
    by default since the paced plain-sampling run, docs/results.md "The live global pool by
    default")."""
    defer_appends: bool = False
    """Append each step's emitted tokens to the draft index after the step's drafts are
    sent, on a worker thread beside the next forward (native index: without the GIL),
    instead of before drafting. The appends leave the critical path, but a match without
    the batch's latest tokens costs more, so the saving is small, and with the global pool +
    live outputs it costs more than it saves (docs/results.md, "Native draft path")."""

    @field_validator("sources", mode="before")
    @classmethod
    def _named_sources(cls, v: Any) -> tuple[str, ...]:
        return parse_sources(v)


class SizingSettings(_Settings):
    """The engine's size on its machine: lengths, batch, dtype, KV cache, threads and
    processes (CPU), memory share and compilation (GPU)."""

    max_model_len: int = Field(0, ge=0)
    """Longest prompt + response, tokens (0: the model's own limit)."""
    max_num_seqs: int = Field(256, ge=1)
    """Most sequences decoded at once."""
    dtype: str = "float32"
    """Model dtype (float32 or bfloat16 on CPU)."""
    kv_cache_gib: int = Field(1, ge=1)
    """CPU KV-cache size in GiB (VLLM_CPU_KVCACHE_SPACE)."""
    kv_cache_mib: int = Field(0, ge=0)
    """CPU KV-cache size in MiB, sized to the workload (0: `kv_cache_gib`); overrides
    VLLM_CPU_KVCACHE_SPACE (4 KiB per token for the embedded model)."""
    cpu_threads: int = Field(0, ge=0, le=1024)
    """OpenMP threads of the CPU engine, unbound (0: vLLM's default, one bound thread per
    core). Set 1 when several ranks share a machine's cores (the paced bench does)."""
    engine_in_one_process: bool = False
    """Run vLLM's worker inside its engine-core process (VLLM_ENABLE_V1_MULTIPROCESSING=0:
    two processes per rank instead of three, less memory: docs/design.md section 7); the
    engine still has its own process, so liveness checks and restarts work the same."""
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    """GPU memory share for the engine (GPU only)."""
    enforce_eager: bool = True
    """Skip torch.compile/CUDA graphs (fast start)."""


class PacingSettings(_Settings):
    """Pacing: forwards slept to the engine-time model of a GPU, and what is charged on
    top (the paced bench; off in production)."""

    pace: Literal["off", "h100", "h200"] = "off"
    """Pace every forward to the simulator's engine-time model of this GPU (8B model)."""
    pace_scale: float = Field(20.0, gt=0)
    """Paced forwards last modelled GPU time x this (large enough that CPU work fits)."""
    pace_charge_drafting: bool = True
    """Charge the proposer's measured CPU time of each engine step on top of the paced
    forward (as modelled seconds, x pace_scale in wall time), as a GPU host pays it; off:
    it is absorbed in the forward's paced time (the paced runs before 2026-12-03)."""
    pace_async_baseline: bool = True
    """A paced engine without speculation overlaps its host work with the forward (vLLM's
    async scheduling, its default on a GPU for decoding without speculation); off: every
    mode pays its host overhead in series (the paced runs before 2026-12-06)."""
    pace_keyed_kernel: Literal["fused", "eager"] = "fused"
    """How a paced engine models the keyed kernels' device time: the fused (compiled) kernel
    or the eager torch ops (`EngineTime.keyed_kernel_s`)."""


class FaultSettings(_Settings):
    """Fault injection, for tests only (all off by default)."""

    fault_biased_verifier: float = Field(0.0, ge=0)
    """Fault injection for tests only: accept drafts with probability boost*p (0: off)."""
    fault_context_only_keys: bool = False
    """Fault injection for tests only: context keys without the occurrence index (reuses
    noise on repeated contexts; the negative control of the context-keyed exactness tests)."""
    fault_poison_token: int = Field(-1, ge=-1)
    """Fault injection for tests only: the engine core dies when it schedules a request whose
    prompt holds this token id (-1: off); the poison-request drills' engine-killing request."""


class ModelSettings(_Settings):
    """Which model the engine serves, and its default seed."""

    model: str = ""
    """HF-format model directory (empty: the embedded tiny model)."""
    seed: int = 0
    """Engine seed for requests without their own seed."""




class EngineConfig(FaultSettings, PacingSettings, SizingSettings, DraftSourceSettings,
                   DraftingSettings, ModelSettings):
    """How one rank's vLLM engine is started and how its proposer drafts, declared by
    concern in the settings classes above (bases listed last to first: pydantic takes the
    fields of the last base first). One flat set of fields all the same, so every one is a
    `bubblespec rank` flag, env var and config-file key."""

    @property
    def draft_budget_profile(self) -> str:
        """The GPU profile of the draft cap ("" when off)."""
        if self.draft_budget == "off":
            return ""
        if self.draft_budget == "auto":
            return self.pace if self.pace != "off" else "h100"
        return self.draft_budget
